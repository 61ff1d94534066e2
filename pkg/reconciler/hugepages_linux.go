package reconciler

// The address-to-id table's arrays on huge pages (issue 14).
//
// At 30,000 Services x 10 the backends' table (packedMap, presized to
// 450,000 slots) is 5.4 MB of keys and values, and a first program
// inserts 300,000 new addresses into it at random slots: with 4 KiB
// pages, about 1,350 pages, more than the TLB holds beside everything
// else the apply touches, so an insert's miss is a page walk and a cache
// miss. The Go heap is not given huge pages where the kernel's
// transparent huge pages are "madvise" (the default of many
// distributions), so a table of at least 2 MiB a array asks for them
// itself: each array starts on a 2 MiB boundary, in a Go allocation
// larger by the slack that takes, its whole 2 MiB pages marked
// MADV_HUGEPAGE. Nothing of it is resident when it is made (the slack
// is dropped with MADV_DONTNEED, as are the pages before the first
// write, so a reused part of the heap is faulted anew, as huge pages
// where the kernel has them): what the table holds resident is its
// arrays rounded up to 2 MiB, 6 MiB at 30,000 x 10 where it was 5.4.
// Where the kernel has no huge pages to give, or THP is off, the pages
// are ordinary ones, as before.

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// hugePage is the size of an x86-64 or arm64 (4 KiB granule) transparent
// huge page.
const hugePage = 2 << 20

// makeHuge returns a zeroed []T of n elements (cap n) whose bytes start
// on a 2 MiB boundary, its 2 MiB pages (n's bytes rounded up) marked
// for huge pages; the allocation's bytes beyond them are dropped
// (MADV_DONTNEED: read again as zeros, never written). The madvise
// calls are hints: one that fails leaves ordinary pages.
func makeHuge[T any](n int) []T {
	var zero T
	sz := int(unsafe.Sizeof(zero))
	if sz == 0 || n == 0 {
		return make([]T, n)
	}
	span := (n*sz + hugePage - 1) &^ (hugePage - 1) // the huge pages' bytes
	buf := make([]T, (span+hugePage+sz-1)/sz)
	base := unsafe.Pointer(unsafe.SliceData(buf))
	p := uintptr(base)
	start := (p + hugePage - 1) &^ (hugePage - 1)
	if (start-p)%uintptr(sz) != 0 {
		// An element size that does not divide the distance (none of the
		// tables'): ordinary pages.
		return buf[:n:n]
	}
	page := uintptr(unix.Getpagesize())
	all := unsafe.Slice((*byte)(base), len(buf)*sz)
	if lo, hi := (p+page-1)&^(page-1), (p+uintptr(len(all)))&^(page-1); hi > lo {
		_ = unix.Madvise(all[lo-p:hi-p], unix.MADV_DONTNEED)
	}
	_ = unix.Madvise(all[start-p:start-p+uintptr(span)], unix.MADV_HUGEPAGE)
	off := int(start-p) / sz
	return buf[off : off+n : off+n]
}
