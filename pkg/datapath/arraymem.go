package datapath

// The arrays the agent writes as memory (the slots arrays, slots.go; the
// backends arrays, bemem.go), mapped a window at a time.
//
// A mapping of a BPF array puts every page of it in the agent's RSS at
// once, touched or not: the kernel maps the array's pages when the
// mapping is made (remap_vmalloc_range), and they count as the process's
// file pages while it is mapped. Mapping the four arrays whole made the
// agent's RSS at 30,000 Services x 10 go from 134 to 180 MiB (VmHWM,
// RssFile 27 -> 63 MiB): the IPv6 arrays of an IPv4 cluster, the slots
// arrays sized twice the service entries, all of it counted though
// little of it is written. The pages are the kernel's memory either way
// (the maps' memlock, charged once); what grew is only the count.
//
// So lazyArray reserves address space for the whole array (no memory:
// PROT_NONE, MAP_NORESERVE) and maps the array's windows of lazyWindow
// bytes into it, each the first time something reads or writes there,
// and release unmaps them again when the operation that needed them
// ends (the slot table's lock released, a batch of backends written):
// the array stays one slice of words, at the same offsets, and only
// while the agent writes does any of it count in the RSS, a chunk's
// windows at a time (a first program writes 1,024 frontends a call).
// Mapping a window and unmapping it are a system call each, a few
// microseconds for 64 pages; a first apply of 30,000 x 10 maps about
// 130 (issue 14).

import (
	"fmt"
	"os"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// lazyWindow is the bytes of a window: what an operation maps of an
// array is the windows its entries fall in, each whole (a chunk of a
// first program, 1,024 frontends x 10, maps one or two of each array).
const lazyWindow = 256 << 10

// lazyArray is a BPF array (BPF_F_MMAPABLE) mapped read-write window by
// window into a reserved range of address space. Not safe for concurrent
// use: its table's lock, or its one writer, orders the calls.
type lazyArray struct {
	arr    *ebpf.Map // nil for memory that is all mapped (tests)
	mem    []byte    // the reserved range: the array's bytes where mapped
	mapped []bool    // per window
	count  int       // windows mapped
}

// mapLazy reserves the address space of the array arr's first size
// bytes; nothing of it is mapped yet.
func mapLazy(arr *ebpf.Map, size int) (*lazyArray, error) {
	page := os.Getpagesize()
	size = (size + page - 1) &^ (page - 1)
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		return nil, fmt.Errorf("reserve %d bytes for %s: %w", size, arr, err)
	}
	return &lazyArray{arr: arr, mem: mem, mapped: make([]bool, (size+lazyWindow-1)/lazyWindow)}, nil
}

// mappedMemory is a lazyArray over mem, all of it readable and writable
// already (a test's table).
func mappedMemory(mem []byte) *lazyArray {
	return &lazyArray{mem: mem}
}

// words is the array as 32-bit words; only those in windows ensure has
// mapped may be read or written.
func (a *lazyArray) words() []uint32 {
	if len(a.mem) == 0 {
		return nil
	}
	return unsafe.Slice((*uint32)(unsafe.Pointer(&a.mem[0])), len(a.mem)/4)
}

// ensure maps the windows that words first..last (inclusive) fall in.
func (a *lazyArray) ensure(first, last int) error {
	if a.arr == nil {
		return nil
	}
	for w := first * 4 / lazyWindow; w <= last*4/lazyWindow; w++ {
		if a.mapped[w] {
			continue
		}
		off := w * lazyWindow
		n := min(lazyWindow, len(a.mem)-off)
		_, err := unix.MmapPtr(a.arr.FD(), int64(off), unsafe.Pointer(&a.mem[off]), uintptr(n),
			unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED)
		if err != nil {
			return fmt.Errorf("map %s bytes %d-%d: %w", a.arr, off, off+n-1, err)
		}
		a.mapped[w] = true
		a.count++
	}
	return nil
}

// mappedBytes is the bytes of the windows mapped (the last window may be
// short).
func (a *lazyArray) mappedBytes() int {
	n := 0
	for w, ok := range a.mapped {
		if ok {
			n += min(lazyWindow, len(a.mem)-w*lazyWindow)
		}
	}
	return n
}

// release unmaps the windows mapped, the range kept reserved: each is
// replaced by address space without access, as before its ensure.
func (a *lazyArray) release() error {
	if a == nil || a.arr == nil || a.count == 0 {
		return nil
	}
	var first error
	for w, ok := range a.mapped {
		if !ok {
			continue
		}
		off := w * lazyWindow
		n := min(lazyWindow, len(a.mem)-off)
		_, err := unix.MmapPtr(-1, 0, unsafe.Pointer(&a.mem[off]), uintptr(n), unix.PROT_NONE,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED|unix.MAP_NORESERVE)
		if err != nil {
			// Left mapped (and counted): a later release tries again.
			if first == nil {
				first = fmt.Errorf("unmap %s bytes %d-%d: %w", a.arr, off, off+n-1, err)
			}
			continue
		}
		a.mapped[w] = false
		a.count--
	}
	return first
}

// close unmaps the range, windows and all; a nil array has nothing.
func (a *lazyArray) close() error {
	if a == nil || a.mem == nil || a.arr == nil {
		return nil
	}
	err := unix.Munmap(a.mem)
	a.mem, a.mapped = nil, nil
	return err
}

// closeWords closes a (close) and forgets *words, its words: a table's
// close.
func closeWords(a *lazyArray, words *[]uint32) error {
	*words = nil
	return a.close()
}
