package manifest

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// states collects what Run hands to apply.
type states struct {
	mu  sync.Mutex
	got []*model.State
	ch  chan struct{}
}

func newStates() *states { return &states{ch: make(chan struct{}, 100)} }

func (s *states) apply(st *model.State) {
	s.mu.Lock()
	s.got = append(s.got, st)
	s.mu.Unlock()
	s.ch <- struct{}{}
}

// waitFor waits until the latest state renders as want.
func (s *states) waitFor(t *testing.T, want string) {
	t.Helper()
	s.waitUntil(t, "the state:\n"+want+"\n", func(last string) bool { return last == want })
}

// waitUntil waits until ok takes the latest state's rendering, and
// returns it; what says what is awaited when it times out.
func (s *states) waitUntil(t *testing.T, what string, ok func(string) bool) string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		s.mu.Lock()
		var last string
		if n := len(s.got); n > 0 {
			last = render(s.got[n-1])
		}
		s.mu.Unlock()
		if ok(last) {
			return last
		}
		select {
		case <-s.ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %s; last state:\n%s", what, last)
		}
	}
}

func runSource(t *testing.T, path string, st *states) *Source {
	t.Helper()
	src := NewSource(path, translate.Options{}, slog.New(slog.DiscardHandler))
	src.debounce = 20 * time.Millisecond
	testutil.RunUntilCleanup(t, "Run", func(ctx context.Context) error { return src.Run(ctx, st.apply) })
	return src
}

// An edit of one file of a directory reads that file again, not the
// others: each load after the first reads one file.
func TestSourceReadsOnlyTheChangedFile(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "a.yaml", svcA)
	writeFile(t, dir, "slice.yaml", sliceA)
	writeFile(t, dir, "other.yaml", strings.NewReplacer("name: a,", "name: b,", "10.96.0.1", "10.96.0.2").Replace(svcA))
	st := newStates()
	l := runSource(t, dir, st).loader
	st.waitFor(t, "10.96.0.1:80/TCP ns/a:http -> 10.0.0.1:8080/TCP\n10.96.0.2:80/TCP ns/b:http ->")
	reads, loads := l.reads.Load(), l.loads.Load()
	if reads != 3 || loads != 1 {
		t.Fatalf("first load: %d files read in %d loads, want 3 in 1", reads, loads)
	}

	writeFile(t, dir, "slice.yaml", strings.Replace(sliceA, "10.0.0.1", "10.0.0.2", 1))
	st.waitFor(t, "10.96.0.1:80/TCP ns/a:http -> 10.0.0.2:8080/TCP\n10.96.0.2:80/TCP ns/b:http ->")
	if r, n := l.reads.Load()-reads, l.loads.Load()-loads; n == 0 || r != n {
		t.Errorf("after one file's edit: %d files read in %d loads, want one per load", r, n)
	}

	// A file the watch cannot name (a ConfigMap's ..data swap) reads all.
	reads = l.reads.Load()
	writeFile(t, dir, "..data", "")
	writeFile(t, dir, "other.yaml", strings.NewReplacer("name: a,", "name: b,", "10.96.0.1", "10.96.0.3").Replace(svcA))
	st.waitFor(t, "10.96.0.1:80/TCP ns/a:http -> 10.0.0.2:8080/TCP\n10.96.0.3:80/TCP ns/b:http ->")
	if r := l.reads.Load() - reads; r < 3 {
		t.Errorf("after a ..data event: %d files read, want all 3", r)
	}
}

func TestSourceWatchesDirectory(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "a.yaml", svcA)
	st := newStates()
	runSource(t, dir, st)
	st.waitFor(t, "10.96.0.1:80/TCP ns/a:http ->")

	// A new file.
	writeFile(t, dir, "slice.yaml", sliceA)
	st.waitFor(t, "10.96.0.1:80/TCP ns/a:http -> 10.0.0.1:8080/TCP")

	// An editor's atomic save: write a temporary file, rename it over.
	tmp := writeFile(t, dir, ".slice.yaml.swp", strings.Replace(sliceA, "10.0.0.1", "10.0.0.2", 1))
	if err := os.Rename(tmp, filepath.Join(dir, "slice.yaml")); err != nil {
		t.Fatal(err)
	}
	st.waitFor(t, "10.96.0.1:80/TCP ns/a:http -> 10.0.0.2:8080/TCP")

	// A bad edit keeps the last good slice.
	writeFile(t, dir, "slice.yaml", strings.Replace(sliceA, "10.0.0.1", "nope", 1))
	time.Sleep(200 * time.Millisecond)
	st.waitFor(t, "10.96.0.1:80/TCP ns/a:http -> 10.0.0.2:8080/TCP")

	// Deleting the file deletes its objects.
	if err := os.Remove(filepath.Join(dir, "slice.yaml")); err != nil {
		t.Fatal(err)
	}
	st.waitFor(t, "10.96.0.1:80/TCP ns/a:http ->")
}

func TestSourceWatchesFile(t *testing.T) {
	dir := t.TempDir()
	p := writeFile(t, dir, "one.yaml", svcA+"---\n"+sliceA)
	writeFile(t, dir, "other.yaml", strings.NewReplacer("name: a,", "name: b,", "10.96.0.1", "10.96.0.2").Replace(svcA))
	st := newStates()
	runSource(t, p, st)
	st.waitFor(t, "10.96.0.1:80/TCP ns/a:http -> 10.0.0.1:8080/TCP")

	tmp := writeFile(t, dir, "one.yaml.tmp", svcA)
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	st.waitFor(t, "10.96.0.1:80/TCP ns/a:http ->")
}

func TestSourceMissingPath(t *testing.T) {
	src := NewSource(filepath.Join(t.TempDir(), "nope"), translate.Options{}, nil)
	if err := src.Run(context.Background(), func(*model.State) {}); err == nil {
		t.Fatal("no error for a missing path")
	}
}

// records collects log records' messages and attributes.
type records struct {
	mu   sync.Mutex
	msgs []string
}

func (h *records) Enabled(context.Context, slog.Level) bool { return true }
func (h *records) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	line := r.Message
	r.Attrs(func(a slog.Attr) bool {
		line += " " + a.String()
		return true
	})
	h.msgs = append(h.msgs, line)
	return nil
}
func (h *records) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *records) WithGroup(string) slog.Handler      { return h }

func (h *records) count(substr string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.msgs {
		if strings.HasPrefix(m, "Bad manifest") && strings.Contains(m, substr) {
			n++
		}
	}
	return n
}

func TestSourceLogsEachErrorOnce(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, "bad.yaml", strings.Replace(svcA, "port: 80", "port: 70000", 1))
	writeFile(t, dir, "b.yaml", strings.NewReplacer("name: a,", "name: b,", "10.96.0.1", "10.96.0.2").Replace(svcA))
	h := &records{}
	src := NewSource(dir, translate.Options{}, slog.New(h))
	applied := 0
	for range 3 { // three reloads, as three unrelated changes would cause
		if err := src.reload(func(*model.State) { applied++ }, nil); err != nil {
			t.Fatal(err)
		}
	}
	if applied != 3 {
		t.Errorf("applied %d times", applied)
	}
	if n := h.count("port 70000 out of range"); n != 1 {
		t.Errorf("error logged %d times, want once:\n%s", n, strings.Join(h.msgs, "\n"))
	}
	// Fixed, then broken again: logged again.
	for _, content := range []string{svcA, strings.Replace(svcA, "port: 80", "port: 70000", 1)} {
		writeFile(t, dir, "bad.yaml", content)
		if err := src.reload(func(*model.State) {}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if n := h.count("port 70000 out of range"); n != 2 {
		t.Errorf("error logged %d times, want twice", n)
	}
}
