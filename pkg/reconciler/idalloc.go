package reconciler

// idAllocator hands out ids >= 1 from a free list.
//
// A freed id is not handed out again at once: it waits in a FIFO queue
// until quarantine other ids have been freed after it, and until then new
// ids come from the top of the range. The datapath keeps backend and
// service ids in places the reconciler does not clean up (conntrack
// entries, per-socket affinity), so an id reused within seconds for
// another address could steer a live flow to the wrong backend; the
// quarantine makes that need many changes in between, while keeping ids
// dense (at most quarantine above the number in use). Ids restored from
// the kernel are marked used and never handed out twice; the holes between
// them are free.
type idAllocator struct {
	next       uint32 // every id >= next is free
	free       []uint32
	head       int // free[head:] is the queue, oldest first
	used       idSet
	quarantine int
}

func newIDAllocator(quarantine int) *idAllocator {
	return &idAllocator{next: 1, quarantine: quarantine}
}

// idSet is a set of ids: a bitmap for the dense low range the allocator
// hands out, a map for the rare large ids found in the kernel.
type idSet struct {
	bits []uint64
	high map[uint32]bool
}

const idSetDense = 1 << 24 // ids below this go in the bitmap (at most 2 MiB)

func (s *idSet) has(id uint32) bool {
	if id < idSetDense {
		w := id / 64
		return int(w) < len(s.bits) && s.bits[w]&(1<<(id%64)) != 0
	}
	return s.high[id]
}

func (s *idSet) add(id uint32) {
	if id < idSetDense {
		w := int(id / 64)
		if w >= len(s.bits) {
			s.bits = append(s.bits, make([]uint64, max(w+1-len(s.bits), len(s.bits)))...)
		}
		s.bits[w] |= 1 << (id % 64)
		return
	}
	if s.high == nil {
		s.high = map[uint32]bool{}
	}
	s.high[id] = true
}

func (s *idSet) remove(id uint32) {
	if id < idSetDense {
		if w := int(id / 64); w < len(s.bits) {
			s.bits[w] &^= 1 << (id % 64)
		}
		return
	}
	delete(s.high, id)
}

func (a *idAllocator) alloc() uint32 {
	for len(a.free)-a.head > a.quarantine {
		id := a.free[a.head]
		a.head++
		if a.head > 1024 && a.head*2 > len(a.free) {
			a.free = append([]uint32(nil), a.free[a.head:]...)
			a.head = 0
		}
		if !a.used.has(id) {
			a.used.add(id)
			return id
		}
	}
	for a.used.has(a.next) || a.next == 0 {
		a.next++
	}
	id := a.next
	a.next++
	a.used.add(id)
	return id
}

// markUsed records an id found in the kernel.
func (a *idAllocator) markUsed(id uint32) {
	if id == 0 || a.used.has(id) {
		return
	}
	a.used.add(id)
	if id >= a.next {
		// The ids between next and id become holes to reuse. Only track
		// them when that is cheap; otherwise they are skipped.
		if id-a.next <= 1<<16 {
			for h := a.next; h < id; h++ {
				a.free = append(a.free, h)
			}
		}
		a.next = id + 1
	}
}

func (a *idAllocator) release(id uint32) {
	if !a.used.has(id) {
		return
	}
	a.used.remove(id)
	a.free = append(a.free, id)
}
