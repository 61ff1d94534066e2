package main

import (
	"bufio"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/sluice-lb/sluice/pkg/datapath"
)

// sizeFlowTables sizes the flow tables of cfg from the node's memory
// (memTotal bytes) with --map-dynamic-size-ratio (datapath/sizing.go),
// leaving alone each whose --max-* flag fs was given (on the command line
// or by --config): a flag overrides the ratio, as in Cilium.
func sizeFlowTables(fs *flag.FlagSet, cfg *datapath.Config, ratio float64, memTotal uint64, log *slog.Logger) error {
	eb, err := datapath.FlowTableEntryBytes()
	if err != nil {
		return err
	}
	ft, err := datapath.DynamicFlowTables(memTotal, ratio, eb)
	if err != nil {
		return fmt.Errorf("--map-dynamic-size-ratio: %w", err)
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, t := range []struct {
		flag string
		size int
		dst  *int
	}{
		{"max-conntrack", ft.Conntrack, &cfg.MaxConntrack},
		{"max-conntrack-new", ft.ConntrackNew, &cfg.MaxConntrackNew},
		{"max-sock-rev", ft.SockRev, &cfg.MaxSockRev},
		{"max-affinity", ft.Affinity, &cfg.MaxAffinity},
	} {
		if !given[t.flag] {
			*t.dst = t.size
		}
	}
	sized := datapath.FlowTables{Conntrack: cfg.MaxConntrack, ConntrackNew: cfg.MaxConntrackNew,
		SockRev: cfg.MaxSockRev, Affinity: cfg.MaxAffinity}
	log.Info("flow tables sized from the node's memory", "memory_mib", memTotal>>20, "ratio", ratio,
		"max_conntrack", sized.Conntrack, "max_conntrack_new", sized.ConntrackNew, "max_sock_rev", sized.SockRev,
		"max_affinity", sized.Affinity, "estimated_mib", sized.Bytes(eb)>>20)
	return nil
}

// memTotal reads MemTotal from a /proc/meminfo-formatted file, in bytes.
func memTotal(path string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }() // read only
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 3 && fields[0] == "MemTotal:" && fields[2] == "kB" {
			kb, err := strconv.ParseUint(fields[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: MemTotal %q: %w", path, fields[1], err)
			}
			return kb << 10, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s: no MemTotal in kB", path)
}
