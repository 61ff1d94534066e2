// Command sluicectl inspects what the Sluice datapath holds on this node,
// read straight from the pinned maps (no agent needs to run). It opens them
// read-only (datapath.OpenPinned), whatever sizes the agent gave them:
//
//	sluicectl services        service frontends and the backends in their slots
//	sluicectl services --raw  every entry of the service, backend, rev_nat and
//	                          source-range maps, in the reconciler's dump
//	                          format (that of its golden tests)
//	sluicectl counters        datapath outcome counters, by reason
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sluicectl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bpffs := fs.String("bpffs", datapath.DefaultBPFFS, "bpffs mount the agent pinned under")
	fs.Usage = func() {
		warn(fs.Output(), "Usage: sluicectl [--bpffs DIR] services [--raw] | counters\n\n"+
			"  services        service frontends -> backends, from the pinned maps\n"+
			"  services --raw  every map entry, as the reconciler dumps them\n"+
			"  counters        datapath outcome counters, summed over CPUs\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() < 1 {
		fs.Usage()
		return 2
	}
	cmd := fs.Arg(0)
	if cmd != "services" && cmd != "counters" {
		warn(stderr, "sluicectl: unknown command %q\n", cmd)
		fs.Usage()
		return 2
	}
	cfs := flag.NewFlagSet("sluicectl "+cmd, flag.ContinueOnError)
	cfs.SetOutput(stderr)
	cfs.Usage = fs.Usage
	var raw *bool
	if cmd == "services" {
		raw = cfs.Bool("raw", false, "print every map entry in the reconciler's dump format")
	}
	if err := cfs.Parse(fs.Args()[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if cfs.NArg() > 0 {
		warn(stderr, "sluicectl: unexpected arguments %q\n", cfs.Args())
		fs.Usage()
		return 2
	}
	// Read-only: loads no programs, creates nothing, and reads pins of
	// whatever sizes the agent was configured with.
	dp, err := datapath.OpenPinned(*bpffs)
	if errors.Is(err, os.ErrNotExist) {
		warn(stderr, "sluicectl: no Sluice datapath pinned under %s: %v\n", *bpffs, err)
		return 1
	}
	if err != nil {
		warn(stderr, "sluicectl: %v\n", err)
		return 1
	}
	defer dp.Close()

	switch cmd {
	case "services":
		ks, err := dp.Dump()
		if err != nil {
			warn(stderr, "sluicectl: read maps: %v\n", err)
			return 1
		}
		if *raw {
			_, err = io.WriteString(stdout, ks.String())
		} else {
			err = writeServices(stdout, ks)
		}
		if err != nil {
			warn(stderr, "sluicectl: write output: %v\n", err)
			return 1
		}
	case "counters":
		c, err := dp.Counters()
		if err != nil {
			warn(stderr, "sluicectl: read counters: %v\n", err)
			return 1
		}
		if err := writeCounters(stdout, c); err != nil {
			warn(stderr, "sluicectl: write output: %v\n", err)
			return 1
		}
	}
	return 0
}

// warn writes a message for the user to stderr. A write to stderr that
// fails has nowhere to be reported; the exit code still says what happened.
func warn(stderr io.Writer, format string, a ...any) {
	_, _ = fmt.Fprintf(stderr, format, a...)
}

// tabulate writes the tab-separated lines of table to w in aligned columns.
// The table is built in memory first, so the one write to w here is the
// only one that can fail, and its error is what the output's reader needs
// to know (a full disk, a closed pipe).
func tabulate(w io.Writer, table string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if _, err := io.WriteString(tw, table); err != nil {
		return err
	}
	return tw.Flush()
}

// writeServices prints one line per frontend (and scope: a two-scope
// frontend's internal scope is the line marked "internal"), its backends
// in slot order.
func writeServices(w io.Writer, ks *reconciler.KernelState) error {
	fes := make([]reconciler.Frontend, 0, len(ks.Masters))
	for fe := range ks.Masters {
		fes = append(fes, fe)
	}
	sort.Slice(fes, func(i, j int) bool { return fes[i].Compare(fes[j]) < 0 })
	var table strings.Builder
	table.WriteString("FRONTEND\tID\tCOUNT\tBACKENDS\n")
	for _, fe := range fes {
		m := ks.Masters[fe]
		slots := ks.Slots[fe]
		nums := make([]uint32, 0, len(slots))
		for s := range slots {
			nums = append(nums, s)
		}
		slices.Sort(nums)
		var bs []string
		for _, s := range nums {
			id := slots[s]
			if b, ok := ks.Backends[id]; ok {
				bs = append(bs, fmt.Sprintf("%s:%d", b.Addr, b.Port))
			} else {
				bs = append(bs, fmt.Sprintf("<missing backend %d>", id))
			}
		}
		if len(bs) == 0 {
			bs = []string{"(none: connections refused)"}
			if m.Flags&reconciler.FlagDropEmpty != 0 {
				bs = []string{"(none: connections dropped)"}
			}
		}
		fmt.Fprintf(&table, "%s\t%d\t%d\t%s\n", fe, m.ID, m.Count, strings.Join(bs, " "))
	}
	return tabulate(w, table.String())
}

func writeCounters(w io.Writer, c map[string]uint64) error {
	names := make([]string, 0, len(c))
	for n := range c {
		names = append(names, n)
	}
	slices.Sort(names)
	var table strings.Builder
	table.WriteString("REASON\tCOUNT\n")
	for _, n := range names {
		fmt.Fprintf(&table, "%s\t%d\n", n, c[n])
	}
	return tabulate(w, table.String())
}
