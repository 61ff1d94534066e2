package main

import (
	"flag"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-lb/sluice/pkg/datapath"
)

func TestMemTotal(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(good, []byte("MemTotal:       24554104 kB\nMemFree:         1000 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := memTotal(good); err != nil || got != 24554104<<10 {
		t.Errorf("memTotal = %d, %v; want %d", got, err, uint64(24554104)<<10)
	}
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("MemFree: 1000 kB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := memTotal(bad); err == nil {
		t.Error("memTotal of a file without MemTotal: no error")
	}
	if _, err := memTotal("/proc/meminfo"); err != nil {
		t.Errorf("this machine's /proc/meminfo: %v", err)
	}
}

// TestSizeFlowTables: with --map-dynamic-size-ratio the flow tables are
// scaled from the node's memory, but for those whose --max-* flag was
// given, which keep it.
func TestSizeFlowTables(t *testing.T) {
	eb, err := datapath.FlowTableEntryBytes()
	if err != nil {
		t.Fatal(err)
	}
	// A node whose 0.0025 is twice what the defaults cost.
	mem := datapath.DefaultFlowTables.Bytes(eb) * 800
	fs := flag.NewFlagSet("sluice", flag.ContinueOnError)
	var cfg datapath.Config
	fs.IntVar(&cfg.MaxConntrack, "max-conntrack", datapath.DefaultMaxConntrack, "")
	fs.IntVar(&cfg.MaxConntrackNew, "max-conntrack-new", datapath.DefaultMaxConntrackNew, "")
	fs.IntVar(&cfg.MaxSockRev, "max-sock-rev", datapath.DefaultMaxSockRev, "")
	fs.IntVar(&cfg.MaxAffinity, "max-affinity", datapath.DefaultMaxAffinity, "")
	if err := fs.Parse([]string{"--max-conntrack=1000"}); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := sizeFlowTables(fs, &cfg, 0.0025, mem, log); err != nil {
		t.Fatal(err)
	}
	want := datapath.FlowTables{Conntrack: 1000, ConntrackNew: 2 * datapath.DefaultMaxConntrackNew,
		SockRev: 2 * datapath.DefaultMaxSockRev, Affinity: 2 * datapath.DefaultMaxAffinity}
	got := datapath.FlowTables{Conntrack: cfg.MaxConntrack, ConntrackNew: cfg.MaxConntrackNew, SockRev: cfg.MaxSockRev, Affinity: cfg.MaxAffinity}
	if got != want {
		t.Errorf("sized %+v, want %+v", got, want)
	}
	if err := sizeFlowTables(fs, &cfg, 2, mem, log); err == nil {
		t.Error("a ratio of 2 was taken")
	}
}
