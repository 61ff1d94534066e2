// Command sluicectl inspects what the Sluice datapath holds on this node,
// read straight from the pinned maps (no agent needs to run). It opens them
// read-only (datapath.OpenPinned), whatever sizes the agent gave them:
//
//	sluicectl services        service frontends, their Service and the
//	                          backends in their slots
//	sluicectl services --raw  every entry of the service, backend, rev_nat and
//	                          source-range maps, in the reconciler's dump
//	                          format (that of its golden tests)
//	sluicectl backends        backends and the frontends whose slots name them
//	sluicectl conntrack       per-packet conntrack entries, filtered by
//	                          --addr, --port, --proto, --service, --src, --dst
//	sluicectl conntrack delete  the flows of those entries, both directions
//	                          and their SNAT port reservation (the one
//	                          command that writes)
//	sluicectl counters        datapath outcome counters, by reason
//	sluicectl status          the agent's readiness and last sync (from its
//	                          health and metrics endpoints), the maps' fill
//	sluicectl explain         what a device's tc program would do with one
//	                          packet: its own dry run (datapath.Explain)
//
// Every command takes -o json: the same rows, as a JSON array (status: an
// object), and -o wide: the table with more columns where there are more
// to show (services: kind and flags; backends: how many frontends use one;
// conntrack: the service and backend ids). Tables are sorted and aligned,
// like kubectl get. Service names
// come from the file the agent writes beside its work (--names-file,
// internal/namesfile); without it the SERVICE column is empty.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/sluice-lb/sluice/internal/namesfile"
	"github.com/sluice-lb/sluice/pkg/datapath"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `Usage: sluicectl [--bpffs DIR] [--names-file PATH] COMMAND [-o table|wide|json] [flags]

Commands:
  services [--raw]   service frontends -> backends, from the pinned maps
                     (--raw: every map entry, as the reconciler dumps them)
  backends           backends and the frontends whose slots name them
  conntrack [--addr IP] [--port N] [--proto tcp|udp] [--service NS/NAME[:PORT]]
            [--src IP:PORT] [--dst IP:PORT]
                     per-packet conntrack entries whose tuple, translation
                     or source NAT has the address and port
  conntrack delete [the same filters] [--yes]
                     delete the flows those entries belong to: both
                     directions, and their SNAT port reservation (--yes
                     when more than one flow matches)
  counters           datapath outcome counters, summed over CPUs
  status [--health-addr ADDR] [--metrics-addr ADDR]
                     the agent's readiness and last sync, and the maps' fill
  explain --device DEV --from IP[:PORT] --to IP:PORT [--proto tcp|udp] [--egress]
                     what the device's tc program would do with that packet
                     (its own dry run, against the live maps; changes nothing)

Flags:
`

// command is one subcommand: flags declares its flags and returns what
// it runs on the pins.
type command struct {
	flags func(fs *flag.FlagSet) runner
}

// runner is a command with its flags parsed: check validates them before
// anything is opened (nil: nothing to check), run does the work.
type runner struct {
	check func(c *ctx) error
	run   func(c *ctx) error
}

// ctx is what a command runs with.
type ctx struct {
	bpffs, namesFile string
	output           string // table or json
	stdout, stderr   io.Writer
	pins             *datapath.Pinned
}

var commands = map[string]command{
	"services":  {flags: servicesCmd},
	"backends":  {flags: backendsCmd},
	"conntrack": {flags: conntrackCmd},
	"counters":  {flags: countersCmd},
	"status":    {flags: statusCmd},
	"explain":   {flags: explainCmd},

	// conntrack delete writes: it opens the two conntrack maps for
	// writing, and nothing else.
	"conntrack delete": {flags: conntrackDeleteCmd},
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sluicectl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	bpffs := fs.String("bpffs", datapath.DefaultBPFFS, "bpffs mount the agent pinned under")
	names := fs.String("names-file", namesfile.Default, "file the agent writes the frontends' Service names to (sluice --names-file)")
	fs.Usage = func() {
		warn(fs.Output(), "%s", usage)
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
	name, rest := fs.Arg(0), fs.Args()[1:]
	if name == "conntrack" && len(rest) > 0 && rest[0] == "delete" {
		name, rest = "conntrack delete", rest[1:]
	}
	cmd, ok := commands[name]
	if !ok {
		warn(stderr, "sluicectl: unknown command %q\n", name)
		fs.Usage()
		return 2
	}
	cfs := flag.NewFlagSet("sluicectl "+name, flag.ContinueOnError)
	cfs.SetOutput(stderr)
	cfs.Usage = fs.Usage
	c := &ctx{bpffs: *bpffs, namesFile: *names, stdout: stdout, stderr: stderr}
	cfs.StringVar(&c.output, "o", "table", "output format: table, wide (more columns: services, backends, conntrack) or json")
	cfs.StringVar(&c.output, "output", "table", "output format: table, wide or json")
	r := cmd.flags(cfs)
	if err := cfs.Parse(rest); err != nil {
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
	if c.output != "table" && c.output != "json" && c.output != "wide" {
		warn(stderr, "sluicectl: -o %q: want table, wide or json\n", c.output)
		return 2
	}
	if r.check != nil {
		if err := r.check(c); err != nil {
			warn(stderr, "sluicectl %s: %v\n", name, err)
			return 2
		}
	}
	// Read-only: loads no programs, creates nothing, and reads pins of
	// whatever sizes the agent was configured with.
	dp, err := datapath.OpenPinned(*bpffs)
	switch {
	case errors.Is(err, os.ErrNotExist) && name == "status":
		// status still asks the agent.
	case errors.Is(err, os.ErrNotExist):
		warn(stderr, "sluicectl: no Sluice datapath pinned under %s: %v\n", *bpffs, err)
		return 1
	case err != nil:
		warn(stderr, "sluicectl: %v\n", err)
		return 1
	default:
		defer dp.Close()
		c.pins = dp
	}
	if err := r.run(c); err != nil {
		warn(stderr, "sluicectl %s: %v\n", name, err)
		return 1
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

// writeJSON writes v as indented JSON, followed by a newline.
func writeJSON(w io.Writer, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// table builds a tab-separated table from a header and rows of cells.
func table(header []string, rows [][]string) string {
	var b strings.Builder
	b.WriteString(strings.Join(header, "\t") + "\n")
	for _, r := range rows {
		b.WriteString(strings.Join(r, "\t") + "\n")
	}
	return b.String()
}

// or returns s, or "-" for an empty cell (so that columns stay aligned and
// an absent value reads as one).
func or(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
