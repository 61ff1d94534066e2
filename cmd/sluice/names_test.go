package main

import (
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/namesfile"
	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/model/modeltest"
)

// The agent writes the names of what it programmed for sluicectl, only
// when they change, and sluicectl reads them for its own pins only.
func TestNamesWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "names.json")
	w := &namesWriter{path: path, bpffs: "/sys/fs/bpf/", log: slog.New(slog.DiscardHandler)}
	fe := model.L4Addr{Addr: netip.MustParseAddr("10.96.0.10"), Port: 80, Proto: model.TCP}
	np := model.L4Addr{Addr: netip.MustParseAddr("192.168.0.2"), Port: 30080, Proto: model.TCP}
	st := model.NewState()
	web := model.ServicePortName{Namespace: "default", Name: "web", Port: "http"}
	st.Services.Set(fe, &model.Service{Name: web, Kind: model.ClusterIP, Frontend: fe})
	st.Services.Set(np, &model.Service{Name: web, Kind: model.NodePort, Frontend: np})
	w.SetProgrammed(st)

	got, err := namesfile.Read(path, "/sys/fs/bpf")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["10.96.0.10:80/TCP"].Service != "default/web:http" || got["192.168.0.2:30080/TCP"].Kind != "NodePort" {
		t.Errorf("names read back: %+v", got)
	}
	if other, err := namesfile.Read(path, "/tmp/other-bpffs"); err != nil || len(other) != 0 {
		t.Errorf("names for another bpffs: %v %v, want none", other, err)
	}

	// The same names again: the file is not rewritten.
	old := time.Unix(1, 0)
	if err := os.Chtimes(path, old, old); err != nil {
		t.Fatal(err)
	}
	w.SetProgrammed(st)
	if fi, err := os.Stat(path); err != nil || !fi.ModTime().Equal(old) {
		t.Errorf("unchanged names rewrote the file (%v)", err)
	}
	st.Services.Delete(np)
	w.SetProgrammed(st)
	if got, err := namesfile.Read(path, "/sys/fs/bpf"); err != nil || len(got) != 1 {
		t.Errorf("after a frontend went: %v %v, want one name", got, err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Errorf("the directory holds %d files, want the names file alone (no temporary left)", len(ents))
	}
}

// Along a chain of states each made from the one before, which the writer
// compares by their changed frontends only, the file always names what
// the state does.
func TestNamesWriterFollowsChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "names.json")
	w := &namesWriter{path: path, bpffs: "/sys/fs/bpf/", log: slog.New(slog.DiscardHandler)}
	rng := rand.New(rand.NewPCG(3, 4))
	next := modeltest.Chain(rng, 64, func(rng *rand.Rand, s *model.Service) {
		s.Kind = model.FrontendKind(rng.IntN(2))
	})
	for i := range 200 {
		st := next()
		w.SetProgrammed(st)
		want, err := namesfile.Of("/sys/fs/bpf/", st)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := os.ReadFile(path); err != nil || string(got) != string(want) {
			t.Fatalf("state %d (BaseGen %v): the file names\n%s\nwant\n%s", i, st.BaseGen != 0, got, want)
		}
	}
}

// The writer keeps what it wrote as the state's own persistent Services,
// not a copy of the names: writing 3,000 new names allocates less than
// the file is long (a map of them was more than the file again).
func TestNamesWriterKeepsNoCopy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "names.json")
	w := &namesWriter{path: path, bpffs: "/sys/fs/bpf/", log: slog.New(slog.DiscardHandler)}
	st, _ := modeltest.Scale(3000)
	alloc := testutil.Allocated(func() { w.SetProgrammed(st) })
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if alloc >= uint64(fi.Size()) {
		t.Errorf("writing %d names (%d bytes) allocated %d bytes, want less than the file", st.Services.Len(), fi.Size(), alloc)
	}
	// And it knows them: the same state again is not written.
	if allocs := testing.AllocsPerRun(10, func() { w.SetProgrammed(st) }); allocs != 0 {
		t.Errorf("the same names again: %v allocations, want none (no write)", allocs)
	}
}
