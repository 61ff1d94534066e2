package manifest

import (
	"bytes"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// heldCluster is the content of a manifest file the held-file tests edit:
// Services in file order, each with one EndpointSlice.
type heldCluster struct {
	format string // "json" (one List) or "yaml" (a stream of documents)
	order  []int  // the Services, by number, in file order
	eps    map[int][]string
}

func newHeldCluster(format string, n int) *heldCluster {
	c := &heldCluster{format: format, eps: map[int][]string{}}
	for i := range n {
		c.add(len(c.order), i)
	}
	return c
}

// add inserts Service i at position at, with 1 to 3 endpoints.
func (c *heldCluster) add(at, i int) {
	c.order = slices.Insert(c.order, at, i)
	c.eps[i] = nil
	for j := range 1 + i%3 {
		c.eps[i] = append(c.eps[i], fmt.Sprintf("10.%d.%d.%d", 1+j, i%250, 1+i%9))
	}
}

func (c *heldCluster) render() []byte {
	var b bytes.Buffer
	if c.format == "json" {
		b.WriteString(`{"apiVersion":"v1","kind":"List","items":[`)
	}
	for k, i := range c.order {
		vip := fmt.Sprintf("10.96.%d.%d", i>>8, i&0xff)
		if c.format == "json" {
			if k > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"apiVersion":"v1","kind":"Service","metadata":{"name":"svc-%d","namespace":"held"},"spec":{"clusterIP":"%s","ports":[{"name":"http","port":80,"protocol":"TCP"}]}},`, i, vip)
			fmt.Fprintf(&b, `{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"svc-%d-1","namespace":"held","labels":{"kubernetes.io/service-name":"svc-%d"}},"addressType":"IPv4","ports":[{"name":"http","port":8080,"protocol":"TCP"}],"endpoints":[`, i, i)
			for j, a := range c.eps[i] {
				if j > 0 {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, `{"addresses":["%s"],"conditions":{"ready":true}}`, a)
			}
			b.WriteString(`]}`)
			continue
		}
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: svc-%d\n  namespace: held\nspec:\n  clusterIP: %s\n  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n", i, vip)
		fmt.Fprintf(&b, "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: svc-%d-1\n  namespace: held\n  labels:\n    kubernetes.io/service-name: svc-%d\naddressType: IPv4\nports:\n- name: http\n  port: 8080\n  protocol: TCP\nendpoints:\n", i, i)
		for _, a := range c.eps[i] {
			fmt.Fprintf(&b, "- addresses:\n  - %s\n  conditions:\n    ready: true\n", a)
		}
	}
	if c.format == "json" {
		b.WriteString(`]}`)
	}
	return b.Bytes()
}

// writeReplacing writes data to p as an editor does: to a new file
// renamed over p (a new inode).
func writeReplacing(t *testing.T, p string, data []byte) {
	t.Helper()
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
}

// checkFresh fails the test if got is not what a new loader finds in p:
// the held file's content is the file's.
func checkFresh(t *testing.T, what string, got *Result, p string) {
	t.Helper()
	want, err := Load(p, translate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sameResult(t, what, got, want)
	if len(got.Errors) > 0 {
		t.Fatalf("%s: %v", what, got.Errors)
	}
}

// TestHeldFileEquivalence: after each of a run of random edits of one
// file (an endpoint moved anywhere in it, one byte changed in the middle,
// Services inserted and removed, many at once so that the file outgrows
// its buffer, the file replaced by a rename, truncated to nothing,
// rewritten with the same bytes), a loader that holds the file and
// compares it with what it holds (held.go) finds what a new loader finds
// in the file, and one that never patches, given the same edits, agrees;
// and what the loader keeps of the file, the hashes of its blocks
// (blocks.go), is of the file's content.
func TestHeldFileEquivalence(t *testing.T) {
	for _, format := range []string{"json", "yaml"} {
		t.Run(format, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(14, uint64(len(format))))
			c := newHeldCluster(format, 300)
			p := filepath.Join(t.TempDir(), "services."+format)
			cur := c.render()
			if len(cur) < 32*blockSize {
				t.Fatalf("file of %d bytes: want many blocks", len(cur))
			}
			if err := os.WriteFile(p, cur, 0o644); err != nil {
				t.Fatal(err)
			}
			l, parse := loaders()
			loadBoth(t, "the first load", l, parse, p)
			last, err := l.load(p)
			if err != nil {
				t.Fatal(err)
			}
			next := 1000 // the next new Service
			ops := map[string]int{}
			for k := range 80 {
				op := []string{"endpoint", "endpoint", "endpoint", "one byte", "insert", "remove", "insert many", "same", "empty"}[rng.IntN(9)]
				switch op {
				case "endpoint":
					// At the start, the end or anywhere: the address
					// changes length half of the time.
					at := []int{0, len(c.order) - 1, rng.IntN(len(c.order))}[rng.IntN(3)]
					i := c.order[at]
					c.eps[i][rng.IntN(len(c.eps[i]))] = fmt.Sprintf("10.200.%d.%d", rng.IntN(250), k)
				case "one byte":
					// The last digit of an address of the middle
					// Service: one byte of the file.
					i := c.order[len(c.order)/2]
					a := c.eps[i][0]
					c.eps[i][0] = a[:len(a)-1] + string('1'+byte((int(a[len(a)-1]-'0')%9)))
				case "insert":
					c.add(rng.IntN(len(c.order)+1), next)
					next++
				case "remove":
					at := rng.IntN(len(c.order))
					c.order = slices.Delete(c.order, at, at+1)
				case "insert many":
					at := rng.IntN(len(c.order) + 1)
					for range 40 { // more than the buffer's room to grow
						c.add(at, next)
						next++
					}
				}
				ops[op]++
				data := c.render()
				what := fmt.Sprintf("edit %d (%s)", k, op)
				if op == "one byte" {
					if d := diffBytes(cur, data); len(cur) != len(data) || d != 1 {
						t.Fatalf("%s: %d bytes differ, lengths %d and %d", what, d, len(cur), len(data))
					}
				}
				if op == "empty" {
					// A shell's `>` truncates before it writes: the
					// objects stay, the file is unknown; then the
					// content is back.
					if err := os.WriteFile(p, nil, 0o644); err != nil {
						t.Fatal(err)
					}
					got, err := l.load(p)
					if err != nil || !slices.Equal(got.Unknown, []string{p}) || render(got.State) != render(last.State) {
						t.Fatalf("%s: unknown %q (err %v), state changed: %v", what, got.Unknown, err, render(got.State) != render(last.State))
					}
					if _, err := parse.load(p); err != nil {
						t.Fatal(err)
					}
				}
				if rng.IntN(3) == 0 {
					writeReplacing(t, p, data)
				} else if err := os.WriteFile(p, data, 0o644); err != nil {
					t.Fatal(err)
				}
				cur = data
				patches, parsed, decoded, translated := l.patches, l.parsed.Load(), l.decoded.Load(), l.translated
				got, err := l.load(p)
				if err != nil {
					t.Fatal(err)
				}
				last = got
				checkFresh(t, what, got, p)
				if want, err := parse.load(p); err != nil {
					t.Fatal(err)
				} else {
					sameResult(t, what+" against a loader that parses", got, want)
				}
				checkBlocks(t, what, l.seed, l.cache[p].blocks, data)
				if op == "same" && (l.parsed.Load() != parsed || l.decoded.Load() != decoded || l.translated != translated) {
					t.Errorf("%s: the same bytes were parsed (%d), decoded (%d) or translated (%d) again", what,
						l.parsed.Load()-parsed, l.decoded.Load()-decoded, l.translated-translated)
				}
				if (op == "endpoint" || op == "one byte") && l.patches != patches+1 {
					t.Errorf("%s: not patched", what)
				}
			}
			t.Logf("%d patches of %d loads; edits %v", l.patches, l.loads.Load(), ops)
		})
	}
}

// diffBytes counts the positions at which a and b differ (as far as the
// shorter goes).
func diffBytes(a, b []byte) int {
	d := 0
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			d++
		}
	}
	return d
}

// checkBlocks fails the test if bh, the blocks a loader keeps of a file,
// are not those of data: they cover it, none is empty or much longer than
// blockSize, and each has the hash of its bytes.
func checkBlocks(t *testing.T, what string, seed maphash.Seed, bh *blockHashes, data []byte) {
	t.Helper()
	if bh == nil || bh.size() != len(data) || len(bh.ends) != len(bh.sums) {
		t.Fatalf("%s: blocks %v of %d bytes, the file %d", what, bh != nil, bh.size(), len(data))
	}
	for k, end := range bh.ends {
		start := bh.start(k)
		if end <= start || end-start > 2*blockSize {
			t.Fatalf("%s: block %d is %d..%d", what, k, start, end)
		}
		if maphash.Comparable(seed, string(data[start:end])) != bh.sums[k] {
			t.Fatalf("%s: block %d (%d..%d) is not the file's", what, k, start, end)
		}
	}
}

// TestHeldEditsEverywhere: one byte changed, inserted or deleted at every
// offset class of a file the loader has hashed (the first and last byte,
// block boundaries, the middle) is found: the region scanFile reports
// changed holds the edit and is at most a few blocks more, the new blocks
// are the file's, the window it copies is the file's, and the next load
// finds what a loader that never patches finds.
func TestHeldEditsEverywhere(t *testing.T) {
	orig := newHeldCluster("yaml", 600).render()
	p := filepath.Join(t.TempDir(), "services.yaml")
	n := len(orig)
	if n < 8*blockSize {
		t.Fatalf("file of %d bytes: want many blocks", n)
	}
	for _, off := range []int{0, 1, blockSize - 1, blockSize, blockSize + 1, 2*blockSize - 1, n / 2, n - 2*blockSize, n - blockSize, n - blockSize/2, n - 2, n - 1} {
		for _, kind := range []string{"change", "insert", "delete"} {
			var data []byte
			switch kind {
			case "change":
				data = bytes.Clone(orig)
				data[off] ^= 0x20
			case "insert":
				data = slices.Insert(bytes.Clone(orig), off, '#')
			case "delete":
				data = slices.Delete(bytes.Clone(orig), off, off+1)
			}
			l, parse := loaders()
			if err := os.WriteFile(p, orig, 0o644); err != nil {
				t.Fatal(err)
			}
			loadBoth(t, "the first load", l, parse, p)
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
			c := l.cache[p]
			ch, err := l.scanFile(p, c.blocks, c.layout)
			what := fmt.Sprintf("%s at %d", kind, off)
			if err != nil || ch.same {
				t.Fatalf("%s: same %v, err %v", what, ch.same, err)
			}
			checkBlocks(t, what, l.seed, ch.blocks, data)
			wantPrefix := commonPrefixNaive(orig, data)
			wantSuffix := min(commonPrefixNaive(reversed(orig), reversed(data)), min(len(orig), len(data))-ch.prefix)
			if ch.size != len(data) || ch.prefix > wantPrefix || ch.suffix > wantSuffix || ch.prefix < wantPrefix-3*blockSize || ch.suffix < wantSuffix-3*blockSize {
				t.Errorf("%s: size %d, prefix %d suffix %d, want %d, at most %d and %d", what, ch.size, ch.prefix, ch.suffix, len(data), wantPrefix, wantSuffix)
			}
			if ch.win != nil && (ch.base > ch.prefix || ch.base+len(ch.win) < len(data)-ch.suffix || !bytes.Equal(ch.win, data[ch.base:ch.base+len(ch.win)])) {
				t.Errorf("%s: window %d..%d is not the file's changed region", what, ch.base, ch.base+len(ch.win))
			}
			// Some edits break the file: what was good is kept, as by a
			// loader that parses.
			loadBoth(t, what, l, parse, p)
			checkBlocks(t, what+", loaded", l.seed, l.cache[p].blocks, data)
		}
	}
}

func commonPrefixNaive(a, b []byte) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

func reversed(b []byte) []byte {
	r := bytes.Clone(b)
	slices.Reverse(r)
	return r
}

// randomHashed is n random bytes (the same for the same seeds) and their
// blocks hashed by a new loader: the old content a changeOf test edits.
func randomHashed(seed1, seed2 uint64, n int) ([]byte, *loader, *blockHashes) {
	rng := rand.New(rand.NewPCG(seed1, seed2))
	a := make([]byte, n)
	for i := range a {
		a[i] = byte(rng.IntN(256))
	}
	l := &loader{seed: maphash.MakeSeed()}
	return a, l, l.hashBlocks(a)
}

// TestCommonPrefixSuffix: the block comparison scanFile relies on
// (changeOf) finds, in memory, a difference anywhere (and none): the
// prefix and suffix it reports are common to both contents and at most a
// few blocks short of the longest, and the new blocks are the content's.
func TestCommonPrefixSuffix(t *testing.T) {
	a, l, bh := randomHashed(1, 2, 9*blockSize+17)
	for _, at := range []int{-1, 0, 1, blockSize - 1, blockSize, 4*blockSize + 5, len(a) - blockSize, len(a) - 1} {
		for _, cut := range []int{0, 1, blockSize + 3} {
			b := bytes.Clone(a)
			if at >= 0 {
				b[at] ^= 1
			}
			for _, b := range [][]byte{b, b[cut:], b[:len(b)-cut], append(bytes.Clone(b[:len(b)/2]), append(make([]byte, cut), b[len(b)/2:]...)...)} {
				what := fmt.Sprintf("difference at %d, cut %d, %d bytes", at, cut, len(b))
				ch := l.changeOf(b, bh, nil)
				if ch.same != bytes.Equal(a, b) {
					t.Fatalf("%s: same %v", what, ch.same)
				}
				if ch.same {
					continue
				}
				checkBlocks(t, what, l.seed, ch.blocks, b)
				p, s := commonPrefixNaive(a, b), commonPrefixNaive(reversed(a), reversed(b))
				if ch.prefix > p || ch.suffix > s || ch.prefix+ch.suffix > min(len(a), len(b)) || ch.prefix < p-3*blockSize || ch.suffix < min(s, min(len(a), len(b))-ch.prefix)-3*blockSize {
					t.Errorf("%s: prefix %d suffix %d, longest %d and %d", what, ch.prefix, ch.suffix, p, s)
				}
			}
		}
	}
}

// TestHeldPassesBetweenFiles: in a directory, editing one file and then
// another, and the first again, patches each (by the hashes of its
// blocks, kept for every file) and finds what a new loader finds.
func TestHeldPassesBetweenFiles(t *testing.T) {
	dir := t.TempDir()
	cs := map[string]*heldCluster{"a.yaml": newHeldCluster("yaml", 50), "b.json": newHeldCluster("json", 50)}
	// Distinct Services in the two files.
	for i := range 50 {
		cs["b.json"].order[i] += 500
		cs["b.json"].eps[i+500] = cs["b.json"].eps[i]
	}
	for name, c := range cs {
		if err := os.WriteFile(filepath.Join(dir, name), c.render(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	l := newLoader(translate.Options{})
	got, err := l.load(dir)
	if err != nil {
		t.Fatal(err)
	}
	checkFresh(t, "the first load", got, dir)
	for k, name := range []string{"a.yaml", "a.yaml", "b.json", "a.yaml", "b.json", "b.json", "a.yaml"} {
		c := cs[name]
		i := c.order[k*7%len(c.order)]
		c.eps[i][0] = fmt.Sprintf("10.201.%d.%d", k, 100+k)
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, c.render(), 0o644); err != nil {
			t.Fatal(err)
		}
		patches := l.patches
		got, err := l.loadChanged(dir, map[string]bool{name: true})
		if err != nil {
			t.Fatal(err)
		}
		what := fmt.Sprintf("edit %d of %s", k, name)
		checkFresh(t, what, got, dir)
		if l.patches != patches+1 {
			t.Errorf("%s: not patched", what)
		}
		checkBlocks(t, what, l.seed, l.cache[p].blocks, c.render())
	}
}

// TestMappedFileTruncated: a file truncated while it is mapped faults
// when its lost pages are read (SIGBUS); readMapped turns that into an
// error (the loader then reads the file in full) instead of a crash.
func TestMappedFileTruncated(t *testing.T) {
	p := filepath.Join(t.TempDir(), "services.json")
	if err := os.WriteFile(p, bytes.Repeat([]byte{' '}, 4*os.Getpagesize()), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	data, err := syscall.Mmap(int(f.Fd()), 0, 4*os.Getpagesize(), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = syscall.Munmap(data) }()
	var sum int
	if err := readMapped(func() { sum += int(data[3*os.Getpagesize()]) }); err != nil || sum != ' ' {
		t.Fatalf("before truncating: read %d, err %v", sum, err)
	}
	if err := os.Truncate(p, 0); err != nil {
		t.Fatal(err)
	}
	if err := readMapped(func() { sum += int(data[3*os.Getpagesize()]) }); err != errChangedWhileRead {
		t.Fatalf("after truncating: err %v, want %v", err, errChangedWhileRead)
	}
	// Other panics are not swallowed.
	defer func() {
		if r := recover(); r != "other" {
			t.Errorf("recovered %v, want the panic", r)
		}
	}()
	_ = readMapped(func() { panic("other") })
}

// TestChangesApartFound: two edits far apart (changed, inserted or
// deleted bytes, in blocks from the first to the last, with many
// unchanged blocks between) are both in the changed region changeOf
// reports: the blocks after the first that differs are hashed to the end,
// and the suffix begins after the last that differs, not the first.
func TestChangesApartFound(t *testing.T) {
	a, l, bh := randomHashed(3, 4, 40*blockSize+123)
	offs := []int{0, blockSize - 1, 3*blockSize + 7, 20 * blockSize, len(a) - 2*blockSize, len(a) - 1}
	edit := func(b []byte, at int, kind string) []byte {
		switch kind {
		case "insert":
			return slices.Insert(b, at, 'x')
		case "delete":
			return slices.Delete(b, at, at+1)
		}
		b[at] ^= 0x40
		return b
	}
	for x, first := range offs {
		for _, second := range offs[x+1:] {
			for _, kind := range []string{"change", "insert", "delete"} {
				// The second edit first, so that the first's offset
				// holds.
				b := edit(edit(bytes.Clone(a), second, kind), first, "change")
				what := fmt.Sprintf("changed at %d and %s at %d", first, kind, second)
				ch := l.changeOf(b, bh, nil)
				if ch.same {
					t.Fatalf("%s: same", what)
				}
				checkBlocks(t, what, l.seed, ch.blocks, b)
				// Both edits are between the prefix and the suffix.
				last := second + 1 // where the second edit ends in b
				if kind == "delete" {
					last = second
				}
				if ch.prefix > first || len(b)-ch.suffix < last {
					t.Errorf("%s: prefix %d, suffix from %d: not both edits", what, ch.prefix, len(b)-ch.suffix)
				}
				if ch.prefix < first-3*blockSize || len(b)-ch.suffix > last+3*blockSize {
					t.Errorf("%s: prefix %d, suffix from %d: more than a few blocks around the edits", what, ch.prefix, len(b)-ch.suffix)
				}
			}
		}
	}
}

// TestRepeatedBlocksPrefixSuffixApart: in a content whose blocks are all
// alike (a long run of spaces), a block cut from it leaves old blocks
// that match the new content at places inside the common prefix: the
// suffix changeOf reports does not take them, so that the prefix and
// the suffix do not overlap.
func TestRepeatedBlocksPrefixSuffixApart(t *testing.T) {
	a := bytes.Repeat([]byte{' '}, 12*blockSize)
	l := &loader{seed: maphash.MakeSeed()}
	bh := l.hashBlocks(a)
	for _, cut := range []int{1, blockSize - 1, blockSize, 3*blockSize + 5} {
		b := a[:len(a)-cut]
		ch := l.changeOf(b, bh, nil)
		if ch.same || ch.prefix+ch.suffix > len(b) {
			t.Errorf("%d bytes cut: same %v, prefix %d and suffix %d of %d bytes", cut, ch.same, ch.prefix, ch.suffix, len(b))
			continue
		}
		checkBlocks(t, fmt.Sprintf("%d bytes cut", cut), l.seed, ch.blocks, b)
	}
}

// TestPatchReusesBlockList: a patched edit's block list is the one the
// edit before it replaced (the loader's spare), not a new one, and it is
// the file's blocks after each edit, the endpoint moved back and forth.
func TestPatchReusesBlockList(t *testing.T) {
	p := filepath.Join(t.TempDir(), "services.yaml")
	orig, changed := scaleFile(t, "yaml", 300, 150)
	l := newLoader(translate.Options{})
	var replaced *blockHashes
	for k, data := range [][]byte{orig, changed, orig, changed, orig} {
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		var before *blockHashes
		if c := l.cache[p]; c != nil {
			before = c.blocks
		}
		patches := l.patches
		got, err := l.load(p)
		if err != nil {
			t.Fatal(err)
		}
		what := fmt.Sprintf("load %d", k)
		checkFresh(t, what, got, p)
		now := l.cache[p].blocks
		checkBlocks(t, what, l.seed, now, data)
		if k == 0 {
			continue
		}
		if l.patches != patches+1 {
			t.Fatalf("%s: not patched", what)
		}
		if now == before || l.spareBlocks != before {
			t.Errorf("%s: the list replaced is not the spare", what)
		}
		if k >= 2 && now != replaced {
			t.Errorf("%s: a new block list, not the one the edit before replaced", what)
		}
		replaced = before
	}
}
