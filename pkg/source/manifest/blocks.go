package manifest

import (
	"bytes"
	"errors"
	"fmt"
	"hash/maphash"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"syscall"
	"unsafe"
)

// What a load keeps of a file's content is not the content but a hash of
// each of its blocks (about blockSize bytes each), with where the blocks
// end: 0.14 MiB at 30,000 Services in one 34 MiB file, where holding the
// content took 34 MiB of heap. The next load of the file maps it
// read-only and hashes it block by block, from the start for the common
// prefix, then on from the first block that differs, at the old blocks'
// places moved by how much the file's length changed, to the end: the
// blocks after the last that differs are the common suffix. The file is
// read once, forward (suffixBlocks says why not from the end). Only the
// bytes between prefix and suffix are copied out of the mapping (with
// the pieces they touch, patch.go) and hashed into new blocks. Mapping
// the file instead of reading it spares copying it out of the page
// cache: the file's bytes are read once, from memory, by the hash;
// nothing is held or compared with.
//
// Nothing is skipped unread: metadata (size, mtime, inode) cannot prove
// that a byte did not change (a rewrite within the clock's granularity, a
// `touch -r`, a rename of a file written earlier), so every byte of the
// file is hashed every time. The hash is maphash's, keyed with the
// loader's random seed (the unit cache's): a changed block goes unseen
// only if its new bytes hash as its old ones by accident, 2^-64 for each
// changed block (the node's administrator, who writes the file, cannot
// aim at a seed that is random per process and never leaves it; and an
// object's decoding is found by the same hash already).
//
// A file truncated while it is mapped makes reading its lost pages fault
// (SIGBUS): the mapping is only read with the runtime's panic on fault
// on (debug.SetPanicOnFault, which is there for mapped files), and such a
// fault is an error: the file is then read in full.

// blockSize is about how long the blocks hashed are: the region found
// changed is a block or two, and the pieces in it are split again (their
// decoding still skipped if their bytes did not change).
const blockSize = 4096

// blockHashes says what a file's content was: where its blocks end, in
// order, and the hash of each.
type blockHashes struct {
	ends []int
	sums []uint64
}

// size is the length of the content.
func (bh *blockHashes) size() int {
	if len(bh.ends) == 0 {
		return 0
	}
	return bh.ends[len(bh.ends)-1]
}

// start returns where block k starts.
func (bh *blockHashes) start(k int) int {
	if k == 0 {
		return 0
	}
	return bh.ends[k-1]
}

// appendBlocks appends to bh the blocks of a content from from to to,
// about blockSize long each, hashed with seed; data is the content from
// base on.
func appendBlocks(bh *blockHashes, seed maphash.Seed, data []byte, base, from, to int) {
	appendBlocksDropping(bh, seed, data, base, from, to, nil)
}

// appendBlocksDropping is appendBlocks over a mapping whose pages it
// drops behind it (data is the whole mapping, base 0).
func appendBlocksDropping(bh *blockHashes, seed maphash.Seed, data []byte, base, from, to int, pages *mappedPages) {
	if to <= from {
		return
	}
	k := max(1, (to-from+blockSize/2)/blockSize)
	start := from
	for i := range k {
		end := from + (to-from)*(i+1)/k
		bh.ends = append(bh.ends, end)
		bh.sums = append(bh.sums, blockSum(seed, data[start-base:end-base]))
		start = end
		pages.upTo(end)
	}
}

// blockSum hashes a block: as maphash.Bytes, but in one pass of the
// runtime's hash over it (4 times as fast: maphash.Bytes hashes 128
// bytes at a time). The string is b's bytes, not a copy, and does not
// outlive the call.
func blockSum(seed maphash.Seed, b []byte) uint64 {
	return maphash.Comparable(seed, unsafe.String(unsafe.SliceData(b), len(b)))
}

// hashBlocks returns the blocks of data, a file's whole content.
func (l *loader) hashBlocks(data []byte) *blockHashes { return l.hashMapped(data, nil) }

// hashMapped is hashBlocks of a mapping whose pages it drops behind it
// (nil: data is not a mapping).
func (l *loader) hashMapped(data []byte, pages *mappedPages) *blockHashes {
	k := (len(data) + blockSize/2) / blockSize
	bh := &blockHashes{ends: make([]int, 0, k+1), sums: make([]uint64, 0, k+1)}
	appendBlocksDropping(bh, l.seed, data, 0, 0, len(data), pages)
	pages.dropAll()
	return bh
}

// fileChange is what scanFile found of a file's new content.
type fileChange struct {
	same bool
	size int // of the new content
	// prefix and suffix are how much of the new content is the old one
	// at the start and at the end (prefix+suffix at most the shorter
	// length), as far as the blocks and the layout's head and tail say.
	prefix, suffix int
	// win is a copy of the new content from base on: the region
	// between prefix and suffix, and the pieces of the layout that the
	// change touches (layout.region), if it has one and the change is
	// in its pieces.
	win  []byte
	base int
	// blocks are the new content's blocks: the old ones outside the
	// changed region (those after it moved), new ones in it.
	blocks *blockHashes
}

// errChangedWhileRead says the file's size changed while it was read:
// the caller reads it in full instead.
var errChangedWhileRead = errors.New("changed size while read")

// scanFile finds how the content of file changed since it was hashed in
// bh, with lo its layout (nil if none). An error says the caller should
// read the file in full (it is not a regular file, is empty, or changed
// size while mapped; or it could not be read at all, which reading it in
// full reports).
func (l *loader) scanFile(file string, bh *blockHashes, lo *layout) (ch fileChange, err error) {
	if err := readFileMapped(file, func(data []byte, pages *mappedPages) bool {
		ch = l.changeOfMapped(data, bh, lo, pages)
		return true
	}); err != nil {
		return fileChange{}, err
	}
	return ch, nil
}

// readFile parses file in full (parseFile), with the hashes of the
// content parsed (hashBlocks); a file that cannot be read keeps what it
// contributed last time (e.g. one removed between listing and reading).
//
// The content is parsed from a read-only mapping of the file
// (parseMapped), not from a copy in the heap: parseFile keeps nothing of
// the content (decoded strings are copies, a layout keeps offsets and
// copies of its head and tail), so the content is never garbage for the
// collector. Read into the heap, the 44 MB List of 30,000 Services was
// live through the whole parse, while the compact forms grew beside it,
// and the collector's goal is twice the live heap: the agent's heap
// reached 141-162 MB during its first load (83-88 mapped), its peak
// once the first apply's batches reused their room. Mapped, the file's
// pages are in the agent's RSS only while they are mapped (page cache,
// not heap), and not twice; and each pass drops those it has read
// (mappedPages), so that about a MiB of them is in the RSS at a time. The price is the collector's: the copy was
// a large object without pointers, which raised its goal at no cost to
// its marking, so that it runs more often while the load's live heap
// grows (a load's CPU 1.00-1.08 times what it was, in three sets of
// rounds). What cannot be mapped (empty, not a regular file) or changes
// while parsed is read in full, as before.
func (l *loader) readFile(file string) *fileResult {
	if fr, err := l.parseMapped(file); err == nil {
		return fr
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return &fileResult{objs: l.byFile[file], errs: []error{fmt.Errorf("%s: %w", file, err)}, unknown: true}
	}
	fr := l.parseFile(file, data)
	fr.blocks = l.hashBlocks(data)
	return fr
}

// parseMapped is readFile's parse of file from a mapping. An error says
// to read it in full: it could not be mapped, or it changed while it was
// parsed. The content is hashed before the parse and after: the hashes
// kept are of exactly the bytes parsed (as scanFile's of the bytes it
// copied), or the parse is not kept, so that the next load finds whatever
// changed.
func (l *loader) parseMapped(file string) (fr *fileResult, err error) {
	if err := readFileMapped(file, func(data []byte, pages *mappedPages) bool {
		bh := l.hashMapped(data, pages)
		fr = l.parseFileMapped(file, data, pages)
		fr.blocks = l.hashMapped(data, pages)
		return slices.Equal(bh.sums, fr.blocks.sums)
	}); err != nil {
		return nil, err
	}
	return fr, nil
}

// readFileMapped maps file read-only and runs read on its content, which
// nothing may keep after read returns (it is unmapped then). An error
// says to read the file in full: it is not a regular file or is empty
// (its size says nothing of its content, or there is nothing to map), it
// could not be mapped, it was truncated under the mapping (a fault,
// which readMapped makes an error), it grew since it was mapped, or read
// found it changed (returned false).
func readFileMapped(file string, read func(data []byte, pages *mappedPages) bool) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }() // read only: nothing to lose
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	m := fi.Size()
	if !fi.Mode().IsRegular() || m == 0 || m != int64(int(m)) {
		return errors.New("not a regular file with content")
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(m), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return err
	}
	defer func() { _ = syscall.Munmap(data) }() // nothing reads it after
	var same bool
	if err := readMapped(func() { same = read(data, &mappedPages{data: data}) }); err != nil {
		return err
	}
	// All of it: a file that grew since the stat is read in full.
	var one [1]byte
	if k, _ := f.ReadAt(one[:], m); k != 0 || !same {
		return errChangedWhileRead
	}
	return nil
}

// readMapped runs read, which reads a mapped file, and returns
// errChangedWhileRead if it faulted (the file was truncated under the
// mapping) instead of crashing.
func readMapped(read func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if re, ok := r.(runtime.Error); ok {
			if _, fault := re.(interface{ Addr() uintptr }); fault {
				err = errChangedWhileRead
				return
			}
		}
		panic(r)
	}()
	read()
	return nil
}

// suffixBlocks returns j such that the blocks of bh after j, at their
// places moved by how much data, the new content, is longer than bh's,
// are data's bytes and start at or after prefix, the common prefix (the
// first i blocks): the common suffix is the old content from block j+1
// on (j is i-1 if that is every block from i on).
//
// The blocks from i on are hashed forward, in the file's order, and the
// last that differs is j, rather than from the end backward until one
// differs. Both hash what follows the prefix to the end; this also
// hashes the changed region, which the load then copies and decodes
// anyway (a file changed everywhere: one more pass of the hash before a
// full parse). Hashed from the end backward, 4
// KiB after the 4 KiB before it, the second half of the 34 MiB file of
// BenchmarkScale took 2.5 times as long as the first half hashed forward
// (the CPU's prefetcher follows a stream forward, not blocks that each
// step backward); in groups of 16 blocks hashed forward, the groups from
// the end, still 1.4 times.
func (l *loader) suffixBlocks(data []byte, bh *blockHashes, i, prefix int, pages *mappedPages) int {
	delta := len(data) - bh.size()
	j := i - 1
	for k := i; k < len(bh.ends); k++ {
		// A block that would start in the prefix is not in the suffix:
		// the prefix and the suffix do not overlap.
		s := bh.start(k) + delta
		if s < prefix || blockSum(l.seed, data[s:bh.ends[k]+delta]) != bh.sums[k] {
			j = k
		}
		pages.upTo(bh.ends[k] + delta)
	}
	return j
}

// changeOf compares data, a file's new content, with bh, the blocks of
// its old content, and copies what changed (see fileChange).
func (l *loader) changeOf(data []byte, bh *blockHashes, lo *layout) fileChange {
	return l.changeOfMapped(data, bh, lo, nil)
}

// changeOfMapped is changeOf of data, a mapping whose pages the scan
// drops behind it (pages; nil: data is not mapped).
func (l *loader) changeOfMapped(data []byte, bh *blockHashes, lo *layout, pages *mappedPages) fileChange {
	m, n := len(data), bh.size()
	delta := m - n
	// The blocks before block i are unchanged: the prefix.
	i, prefix := 0, 0
	for i < len(bh.ends) && bh.ends[i] <= m && blockSum(l.seed, data[prefix:bh.ends[i]]) == bh.sums[i] {
		prefix = bh.ends[i]
		i++
		pages.upTo(prefix)
	}
	if i == len(bh.ends) && m == n {
		return fileChange{same: true, size: m}
	}
	// The blocks after block j, at their places moved by delta, are
	// unchanged: the suffix. They start after the prefix, in the old
	// content and in the new.
	j := l.suffixBlocks(data, bh, i, prefix, pages)
	suffix := 0
	if j+1 < len(bh.ends) {
		suffix = n - bh.start(j+1)
	}
	ch := fileChange{size: m, prefix: prefix, suffix: suffix}
	// The window copied out is the changed region, and the pieces it
	// touches if there is a layout. The new blocks are hashed from the
	// copy, not the mapping: if the file is being written, the blocks
	// kept are still of exactly the bytes decoded (and the unchanged
	// ones of the old bytes, which the result reflects), so that the
	// next load finds whatever else changed.
	from, to := prefix, m-suffix
	if lo != nil {
		// The layout's head and tail, if the change is next to them,
		// make the prefix or suffix more exact than a block: a change
		// in the first item of a List is no change of its header.
		if lo.head != nil && len(lo.head) > ch.prefix && bytes.HasPrefix(data, lo.head) {
			ch.prefix = len(lo.head)
		}
		if lo.tail != nil && len(lo.tail) > ch.suffix && bytes.HasSuffix(data, lo.tail) {
			ch.suffix = len(lo.tail)
		}
		ch.suffix = min(ch.suffix, min(m, n)-ch.prefix)
		if r, ok := lo.region(ch.prefix, ch.suffix, m); ok {
			from, to = min(from, r.from), max(to, r.to)
		}
	}
	ch.win, ch.base = append([]byte(nil), data[from:to]...), from
	nb := l.takeSpareBlocks(len(bh.ends))
	nb.ends, nb.sums = append(nb.ends, bh.ends[:i]...), append(nb.sums, bh.sums[:i]...)
	appendBlocks(nb, l.seed, ch.win, from, prefix, m-suffix)
	for k := j + 1; k < len(bh.ends); k++ {
		nb.ends, nb.sums = append(nb.ends, bh.ends[k]+delta), append(nb.sums, bh.sums[k])
	}
	ch.blocks = nb
	return ch
}

// takeSpareBlocks returns an empty block list with room for n blocks
// (the old content's count, which a change rarely exceeds): the loader's
// spare one, the list the last patch replaced (loadChanged), if it has
// the room, else a new one with room for 2 more. A change of the 34 MiB file allocated 0.14 MiB
// for its new list, 9 in 10 of what it allocated: with the spare reused,
// the collector, which marks the whole heap (130 MiB at 30,000
// Services), runs 9 times less often for the same edits. The spare is
// taken, not shared: if the patch then fails, the file is parsed and the
// list dropped.
func (l *loader) takeSpareBlocks(n int) *blockHashes {
	bh := l.spareBlocks
	l.spareBlocks = nil
	if bh == nil || cap(bh.ends) < n || cap(bh.sums) < n {
		return &blockHashes{ends: make([]int, 0, n+2), sums: make([]uint64, 0, n+2)}
	}
	bh.ends, bh.sums = bh.ends[:0], bh.sums[:0]
	return bh
}

// dropStep is how much of a mapped file a pass reads between two drops of
// the pages it read.
const dropStep = 1 << 20

var pageSize = os.Getpagesize()

// mappedPages drops from the agent's RSS the pages of a file's read-only
// mapping that a pass over it has read (madvise MADV_DONTNEED: the page
// cache keeps them, and a later read of them maps them again from it).
// Every page of the mapping that a pass reads counts in the RSS
// (RssFile) until it is unmapped: the 44 MB List of 30,000 Services x 10
// was all of it in the RSS while it was parsed, on top of the heap the
// parse grows, the first load's peak; and again at each change, whose
// scan reads the whole file, on top of the agent's heap at its largest
// (issue 14). The passes over a file (the hash of its blocks before its
// parse and after, the split of a List into items or of a stream into
// documents, the decoding of each, a change's scan) drop what they have
// read every dropStep bytes, or all of it when they end. nil drops
// nothing (data not mapped).
type mappedPages struct {
	data []byte
	done int // the pages before it are dropped, in this pass
}

// upTo drops the pages wholly before off, if dropStep bytes or more are
// left to drop.
func (m *mappedPages) upTo(off int) {
	if m == nil || off-m.done < dropStep {
		return
	}
	end := min(off, len(m.data)) / pageSize * pageSize
	if end <= m.done {
		return
	}
	// Dropping is only a saving: on an error the pages stay mapped.
	_ = syscall.Madvise(m.data[m.done:end], syscall.MADV_DONTNEED)
	m.done = end
}

// passed drops the pages before the end of b, which a pass has read, if b
// is in the mapping (a YAML document converted to JSON is not).
func (m *mappedPages) passed(b []byte) {
	if m == nil || len(b) == 0 {
		return
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(m.data)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if p < base || p-base >= uintptr(len(m.data)) {
		return
	}
	m.upTo(int(p-base) + len(b))
}

// dropAll drops every page, at the end of a pass: the next starts from
// the beginning.
func (m *mappedPages) dropAll() {
	if m == nil {
		return
	}
	_ = syscall.Madvise(m.data, syscall.MADV_DONTNEED)
	m.done = 0
}
