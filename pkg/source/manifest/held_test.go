package manifest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
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
// in the file, and one that never patches, given the same edits, agrees.
func TestHeldFileEquivalence(t *testing.T) {
	for _, format := range []string{"json", "yaml"} {
		t.Run(format, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(14, uint64(len(format))))
			c := newHeldCluster(format, 300)
			p := filepath.Join(t.TempDir(), "services."+format)
			cur := c.render()
			if len(cur) < compareBlock {
				t.Fatalf("file of %d bytes: want more than one block", len(cur))
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
				if l.held != p || !bytes.Equal(l.buf, data) {
					t.Fatalf("%s: held %q, %d bytes, equal to the file: %v", what, l.held, len(l.buf), bytes.Equal(l.buf, data))
				}
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

// TestHeldEditsEverywhere: one byte changed, inserted or deleted at every
// offset class of a file the loader holds (the first and last byte, block
// and step boundaries, the middle) is found: the held content becomes the
// file's, and the prefix and suffix readHeld reports are the longest
// common ones.
func TestHeldEditsEverywhere(t *testing.T) {
	orig := newHeldCluster("yaml", 600).render()
	p := filepath.Join(t.TempDir(), "services.yaml")
	n := len(orig)
	if n < 2*compareBlock {
		t.Fatalf("file of %d bytes: want at least two blocks", n)
	}
	for _, off := range []int{0, 1, cmpStep - 1, cmpStep, compareBlock - 1, compareBlock, compareBlock + 1, n / 2, n - compareBlock, n - cmpStep, n - 2, n - 1} {
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
			l := newLoader(translate.Options{})
			if err := os.WriteFile(p, orig, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := l.load(p); err != nil || l.held != p {
				t.Fatalf("held %q: %v", l.held, err)
			}
			if err := os.WriteFile(p, data, 0o644); err != nil {
				t.Fatal(err)
			}
			got, prefix, suffix, same, err := l.readHeld(p)
			what := fmt.Sprintf("%s at %d", kind, off)
			if err != nil || same {
				t.Fatalf("%s: same %v, err %v", what, same, err)
			}
			if !bytes.Equal(got, data) {
				t.Fatalf("%s: held content is not the file's", what)
			}
			wantPrefix := commonPrefixNaive(orig, data)
			wantSuffix := min(commonPrefixNaive(reversed(orig), reversed(data)), min(len(orig), len(data))-wantPrefix)
			if prefix != wantPrefix || suffix != wantSuffix {
				t.Errorf("%s: prefix %d suffix %d, want %d and %d", what, prefix, suffix, wantPrefix, wantSuffix)
			}
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

// TestCommonPrefixSuffix: the block comparisons readHeld relies on give
// the naive answer, for a difference anywhere (and none).
func TestCommonPrefixSuffix(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	a := make([]byte, 3*cmpStep+17)
	for i := range a {
		a[i] = byte(rng.IntN(256))
	}
	for _, at := range []int{-1, 0, 1, cmpStep - 1, cmpStep, 2*cmpStep + 5, len(a) - 1} {
		for _, cut := range []int{0, 1, cmpStep + 3} {
			b := bytes.Clone(a)
			if at >= 0 {
				b[at] ^= 1
			}
			b = b[cut:]
			if got, want := commonPrefix(a[cut:], b), commonPrefixNaive(a[cut:], b); got != want {
				t.Errorf("prefix, difference at %d, cut %d: %d, want %d", at, cut, got, want)
			}
			b = b[:len(b)-cut]
			if got, want := commonSuffix(a, b), commonPrefixNaive(reversed(a), reversed(b)); got != want {
				t.Errorf("suffix, difference at %d, cut %d: %d, want %d", at, cut, got, want)
			}
		}
	}
}

// TestHeldPassesBetweenFiles: in a directory, the buffer holds the file
// read last; editing another file reads that one in full, after the one
// held had its hashes computed (evict), so that editing it again patches
// (by its hashes) and finds what a new loader finds.
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
		patches, wasHeld := l.patches, l.held == p
		got, err := l.loadChanged(dir, map[string]bool{name: true})
		if err != nil {
			t.Fatal(err)
		}
		what := fmt.Sprintf("edit %d of %s", k, name)
		checkFresh(t, what, got, dir)
		if l.patches != patches+1 {
			t.Errorf("%s: not patched", what)
		}
		if l.held != p {
			t.Errorf("%s: held %q", what, l.held)
		}
		// Compared with what it held, or read in full and hashed.
		if fr := l.cache[p]; fr.stale != wasHeld {
			t.Errorf("%s: held before %v, stale after %v", what, wasHeld, fr.stale)
		}
	}
}
