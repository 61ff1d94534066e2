package harness

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// What Sluice's programs cost in the load runs themselves (issue 14), as
// opposed to BPF_PROG_TEST_RUN, which reruns one skb against entries its
// first run left in the cache. With BENCH_BPF_STATS=1 the kernel's BPF
// run-time statistics are on while the connection figures are taken
// (BPF_ENABLE_STATS: on for as long as the run holds the fd it returns,
// so a killed run leaves them off), and each of the sluice mode's client
// runs records, per program the agent holds, how often it ran per
// connection and for how long. The statistics add two clock reads to
// every program run (about 0.1 us per run on this VM), which the floor
// does not pay: leave them off for the ratios.

// ProgCost is one program's cost in one client run, or the median over
// rounds.
type ProgCost struct {
	Prog        string  `json:"prog"`
	RunsPerConn float64 `json:"runs_per_conn"`
	NsPerRun    float64 `json:"ns_per_run"`
	NsPerConn   float64 `json:"ns_per_conn"`
}

// progCounters are the run count and run time (ns) of each program the
// agent holds, by name.
type progCounters map[string][2]uint64

// enableBPFStats turns the kernel's BPF run-time statistics on until the
// returned closer is closed.
func enableBPFStats() (io.Closer, error) {
	return ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
}

// agentProgCounters reads the counters of the programs process pid holds
// open (the prog_id lines of its fdinfo).
func agentProgCounters(pid int) (progCounters, error) {
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fdinfo")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	seen := map[uint64]bool{}
	out := progCounters{}
	for _, e := range ents {
		id, ok := fdinfoProgID(filepath.Join(dir, e.Name()))
		if !ok || seen[id] {
			continue
		}
		seen[id] = true
		p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
		if err != nil {
			continue // unloaded meanwhile
		}
		info, ierr := p.Info()
		st, serr := p.Stats()
		_ = p.Close()
		if ierr != nil || serr != nil {
			continue
		}
		c := out[info.Name]
		out[info.Name] = [2]uint64{c[0] + st.RunCount, c[1] + uint64(st.Runtime.Nanoseconds())}
	}
	return out, nil
}

// fdinfoProgID is the prog_id of an fdinfo file, if it describes a BPF
// program.
func fdinfoProgID(path string) (uint64, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "prog_id:"); ok {
			id, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return id, err == nil
		}
	}
	return 0, false
}

// progCosts is what ran between before and after, over conns connections:
// the programs that ran, by name.
func progCosts(before, after progCounters, conns int) []ProgCost {
	var out []ProgCost
	if conns <= 0 {
		return nil
	}
	for name, a := range after {
		b := before[name]
		runs, ns := a[0]-b[0], a[1]-b[1]
		if a[0] < b[0] || runs == 0 {
			continue
		}
		out = append(out, ProgCost{
			Prog:        name,
			RunsPerConn: float64(runs) / float64(conns),
			NsPerRun:    float64(ns) / float64(runs),
			NsPerConn:   float64(ns) / float64(conns),
		})
	}
	slices.SortFunc(out, func(x, y ProgCost) int { return strings.Compare(x.Prog, y.Prog) })
	return out
}

// medianProgCosts is, per program, the median over rounds of each figure
// (a round where the program did not run counts as zero).
func medianProgCosts(rounds [][]ProgCost) []ProgCost {
	names := map[string]bool{}
	for _, r := range rounds {
		for _, c := range r {
			names[c.Prog] = true
		}
	}
	var out []ProgCost
	for name := range names {
		var runs, perRun, perConn []float64
		for _, r := range rounds {
			i := slices.IndexFunc(r, func(c ProgCost) bool { return c.Prog == name })
			if i < 0 {
				runs, perConn = append(runs, 0), append(perConn, 0)
				continue
			}
			runs, perRun, perConn = append(runs, r[i].RunsPerConn), append(perRun, r[i].NsPerRun), append(perConn, r[i].NsPerConn)
		}
		out = append(out, ProgCost{Prog: name, RunsPerConn: testutil.Median(runs), NsPerRun: testutil.Median(perRun), NsPerConn: testutil.Median(perConn)})
	}
	slices.SortFunc(out, func(x, y ProgCost) int { return strings.Compare(x.Prog, y.Prog) })
	return out
}
