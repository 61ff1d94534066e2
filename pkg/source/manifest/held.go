package manifest

import (
	"bytes"
	"errors"
	"io"
	"os"
)

// The held file: the loader reads every file into one buffer (loader.buf),
// and after a load that buffer holds the content of one file exactly as
// that file's cached result reflects it (loader.held). A single-file
// source always holds its file. The next load of the held file compares
// the file with the buffer instead of reading it into the buffer and
// hashing it from both ends (patch.go), which, at 30,000 Services in one
// 34 MiB file, was most of an edit's cost.
//
// Nothing is skipped unread: metadata (size, mtime, inode) cannot prove
// that a byte did not change (a rewrite within the clock's granularity, a
// `touch -r`, a rename of a file written earlier), so every byte of the
// file is read and compared, exactly, not by hash. The file is read in
// blocks that stay in the CPU's cache and each is compared with the buffer
// at once: the common prefix forward, then, from the end, the common
// suffix; only the bytes between are read into the buffer, and the suffix
// moves if the length changed. What is left is memory bandwidth: the
// file's pages copied out of the page cache, the buffer read to compare,
// the suffix moved. Comparing the blocks with chunk hashes of the held
// content instead (the held content read only in the chunk that differs)
// was tried: no faster, as moving the suffix then paid the cache misses
// that reading it to compare had paid.

// compareBlock is how much of the file readHeld reads at a time.
const compareBlock = 128 << 10

// errChangedWhileRead says the file's size changed while readHeld read it:
// the caller reads it in full instead.
var errChangedWhileRead = errors.New("changed size while read")

// readHeld reads file, the held file, comparing it with its content in
// l.buf. same reports that it did not change; else data, which is l.buf,
// is the new content, whose first prefix bytes and last suffix bytes are
// those of the old content (prefix+suffix is at most the shorter length),
// and l.held is cleared (the caller sets it again once the file's result
// reflects data). On an error, l.buf is the old content if l.held is
// still file, and was overwritten if not.
func (l *loader) readHeld(file string) (data []byte, prefix, suffix int, same bool, err error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, 0, 0, false, err
	}
	defer func() { _ = f.Close() }() // read only: nothing to lose
	fi, err := f.Stat()
	if err != nil {
		return nil, 0, 0, false, err
	}
	if !fi.Mode().IsRegular() {
		// Its size says nothing of its content: read it to the end.
		return nil, 0, 0, false, errors.New("not a regular file")
	}
	old, m := l.buf, int(fi.Size())
	n := len(old)
	if cap(l.scratch) < compareBlock {
		l.scratch = make([]byte, compareBlock)
	}
	sc, lim := l.scratch, min(n, m)
	// read reads the k bytes at off into the scratch block.
	read := func(k, off int) ([]byte, error) {
		got, err := f.ReadAt(sc[:k], int64(off))
		if got == k {
			return sc[:k], nil
		}
		if err == io.EOF {
			err = errChangedWhileRead // shorter than it was at the stat
		}
		return nil, err
	}
	for prefix < lim {
		b, err := read(min(len(sc), lim-prefix), prefix)
		if err != nil {
			return nil, 0, 0, false, err
		}
		d := commonPrefix(b, old[prefix:])
		prefix += d
		if d < len(b) {
			break
		}
	}
	// The new content goes where the old one is, or, if it does not
	// fit, to a new buffer; the prefix stays where it is. The suffix is
	// found from the end; if the file grew, each block of it is written
	// to its new place as it is compared (after the old bytes it lands
	// on were compared), else it is moved there after.
	buf := old[:min(m, cap(old))]
	if m > n {
		l.held = ""
		if m > cap(old) {
			buf = make([]byte, m, m+m/64+readSlack) // room to grow, as readFile
			copy(buf, old[:prefix])
		}
		l.buf = buf
	}
	for prefix+suffix < lim {
		k := min(len(sc), lim-prefix-suffix)
		b, err := read(k, m-suffix-k)
		if err != nil {
			return nil, 0, 0, false, err
		}
		d := commonSuffix(b, old[:n-suffix])
		if m > n {
			copy(buf[m-suffix-d:m-suffix], b[k-d:])
		}
		suffix += d
		if d < k {
			break
		}
	}
	if prefix != n || n != m {
		l.held = ""
		if m < n {
			copy(buf[m-suffix:], old[n-suffix:n])
		}
		l.buf = buf
		// The bytes between are read in place.
		if _, err := f.ReadAt(buf[prefix:m-suffix], int64(prefix)); err != nil {
			if err == io.EOF {
				err = errChangedWhileRead
			}
			return nil, 0, 0, false, err
		}
		if cap(buf) > 2*m+2*readSlack {
			// Much shorter than it was: as readFile, not twice its size.
			l.buf = append(make([]byte, 0, m+m/64+readSlack), buf...)
		}
	}
	// All of it: a file that grew since the stat is read in full.
	if k, _ := f.ReadAt(sc[:1], int64(m)); k != 0 {
		l.held = ""
		return nil, 0, 0, false, errChangedWhileRead
	}
	return l.buf, prefix, suffix, prefix == n && n == m, nil
}

// evict is called before l.buf is read into for another file than the
// held one: the held file's sum and chunk hashes, stale if readHeld found
// it changed and it was patched, are computed from its content while that
// is still there, so that its next load can find what changed.
func (l *loader) evict() {
	if fr := l.cache[l.held]; fr != nil && fr.stale {
		var fwd []uint64
		fr.sum, fwd = l.fileSum(l.buf)
		if fr.layout != nil {
			fr.layout.withHashes(l.buf, fwd)
		}
		fr.stale = false
	}
	l.held = ""
}

// cmpStep is how many bytes commonPrefix and commonSuffix compare at once
// before they look for the byte that differs.
const cmpStep = 4096

// commonPrefix returns the length of the longest common prefix of a and b.
func commonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i += cmpStep {
		j := min(n, i+cmpStep)
		if bytes.Equal(a[i:j], b[i:j]) {
			continue
		}
		for a[i] == b[i] {
			i++
		}
		return i
	}
	return n
}

// commonSuffix returns the length of the longest common suffix of a and b.
func commonSuffix(a, b []byte) int {
	a, b = a[len(a)-min(len(a), len(b)):], b[len(b)-min(len(a), len(b)):]
	n := len(a)
	for i := n; i > 0; i -= cmpStep {
		j := max(0, i-cmpStep)
		if bytes.Equal(a[j:i], b[j:i]) {
			continue
		}
		for a[i-1] == b[i-1] {
			i--
		}
		return n - i
	}
	return n
}
