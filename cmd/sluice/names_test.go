package main

import (
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/namesfile"
	"github.com/sluice-lb/sluice/pkg/model"
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
