package reconciler

import "container/heap"

// idAllocator hands out ids >= 1, lowest free id first, so ids stay dense
// and an id freed by a removed service is the next one reused. Ids restored
// from the kernel are marked used and never handed out twice.
type idAllocator struct {
	next uint32 // every id >= next is free
	free idHeap // ids < next that are free (may hold stale entries; see alloc)
	used map[uint32]bool
}

func newIDAllocator() *idAllocator {
	return &idAllocator{next: 1, used: map[uint32]bool{}}
}

func (a *idAllocator) alloc() uint32 {
	for a.free.Len() > 0 {
		id := heap.Pop(&a.free).(uint32)
		if !a.used[id] {
			a.used[id] = true
			return id
		}
	}
	for a.used[a.next] {
		a.next++
	}
	id := a.next
	a.next++
	a.used[id] = true
	return id
}

// markUsed records an id found in the kernel.
func (a *idAllocator) markUsed(id uint32) {
	if id == 0 || a.used[id] {
		return
	}
	a.used[id] = true
	if id >= a.next {
		// The ids between next and id become holes to fill first. Only
		// track them when that is cheap; otherwise they are skipped.
		if id-a.next <= 1<<16 {
			for h := a.next; h < id; h++ {
				heap.Push(&a.free, h)
			}
		}
		a.next = id + 1
	}
}

func (a *idAllocator) release(id uint32) {
	if !a.used[id] {
		return
	}
	delete(a.used, id)
	heap.Push(&a.free, id)
}

func (a *idAllocator) inUse(id uint32) bool { return a.used[id] }

type idHeap []uint32

func (h idHeap) Len() int           { return len(h) }
func (h idHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h idHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *idHeap) Push(x any)        { *h = append(*h, x.(uint32)) }
func (h *idHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
