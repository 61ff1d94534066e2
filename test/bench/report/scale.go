package report

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/test/bench/harness"
)

// agentMemTable renders the agent's memory over a point: RSS right after
// the initial load, at the end (after the load runs and the endpoint
// changes), its peak (VmHWM), and the BPF maps at the end. Runs from
// before mem_end was recorded have no such table.
func agentMemTable(b *bytes.Buffer, res *harness.Results) {
	var rows []string
	for _, p := range res.Points {
		for _, end := range p.MemEnd {
			var start harness.MemStat
			for _, ms := range p.Mem {
				if ms.Mode == end.Mode {
					start = ms
				}
			}
			rows = append(rows, fmt.Sprintf("| %d | %s | %s | %s | %s | %s |", p.Services, end.Mode,
				mib(start.AgentRSS), mib(end.AgentRSS), mib(max(start.AgentPeakRSS, end.AgentPeakRSS)), mib(end.KernelBytes)))
		}
	}
	if len(rows) == 0 {
		return
	}
	b.WriteString("\nOver the whole point: `after load` = the Memory table's RSS; `end` = after the load runs and the endpoint changes; `peak` = the agent's VmHWM (the largest RSS of that agent process; an agent restarted for a repeated initial programming starts again); BPF maps at the end.\n\n")
	b.WriteString("| N | mode | RSS after load MiB | RSS end MiB | RSS peak MiB | BPF maps end MiB |\n|---:|---|---:|---:|---:|---:|\n")
	b.WriteString(strings.Join(rows, "\n") + "\n")
}

func mib(v int64) string {
	if v == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", float64(v)/(1<<20))
}

// loadRunErrors lists the errors of every client run, in round order,
// per N, layer, target and mode, so that a run with errors is seen even
// where the medians hide it.
func loadRunErrors(b *bytes.Buffer, res *harness.Results) {
	var rows []string
	runs, bad := 0, 0
	for _, p := range res.Points {
		for _, cs := range p.Conn {
			var errs []string
			for _, rr := range cs.Rounds {
				runs++
				if rr.Errors > 0 {
					bad++
				}
				errs = append(errs, fmt.Sprint(rr.Errors))
			}
			first := ""
			for _, rr := range cs.Rounds {
				if rr.FirstError != "" {
					first = rr.FirstError
					break
				}
			}
			rows = append(rows, fmt.Sprintf("| %d | %s | %s | %s | %s | %s |", p.Services, cs.Layer, cs.Target, cs.Mode, strings.Join(errs, " "), first))
		}
	}
	if runs == 0 {
		return
	}
	fmt.Fprintf(b, "\n## Errors of every load run\n\n%d client runs, %d with errors. Per run, in round order (connections that failed: connect, request, reply):\n\n", runs, bad)
	b.WriteString("| N | layer | target | mode | errors per run | first error |\n|---:|---|---|---|---|---|\n")
	b.WriteString(strings.Join(rows, "\n") + "\n")
}

// fromStartTable renders Sluice's programming times without the
// benchmark's own writing of the manifest file (a JSON List of N Services
// and N EndpointSlices: seconds at 100,000): the initial programming from
// the agent's start, and an update from the file's rename into place.
func fromStartTable(b *bytes.Buffer, res *harness.Results) {
	rows := progRows(res, func(ps harness.ProgStat) bool { return len(ps.InitialFromStartS)+len(ps.UpdateFromWriteS) > 0 },
		func(ps harness.ProgStat) []string {
			return []string{medianOr(ps.InitialS, 1, "%.3f"), spreadOr(ps.InitialFromStartS, 1, "%.3f"),
				medianOr(ps.UpdateS, 1e3, "%.1f"), spreadOr(ps.UpdateFromWriteS, 1e3, "%.1f")}
		})
	if len(rows) == 0 {
		return
	}
	b.WriteString("\nWithout the benchmark's own rendering and writing of the manifest file (a JSON List of N Services and N EndpointSlices): the initial programming from the agent's start, and an update from the file's rename into place, each until a client sees it.\n\n")
	b.WriteString("| N | mode | initial s (total) | initial from the agent's start s median (min-max) | update ms (total) | update from the rename ms median (min-max) |\n|---:|---|---:|---:|---:|---:|\n")
	b.WriteString(strings.Join(rows, "\n") + "\n")
}

// spreadOr formats the median and min-max of v times scale, with the
// count, or "-" for no samples.
func spreadOr(v []float64, scale float64, format string) string {
	if len(v) == 0 {
		return "-"
	}
	st := testutil.SpreadOf(v)
	f := format + " (" + format + "-" + format + ") n=%d"
	return fmt.Sprintf(f, st.Median*scale, st.Min*scale, st.Max*scale, len(v))
}

// progRows renders a programming table's rows: one per N and mode whose
// ProgStat has what the table shows (has), its cells after N and mode.
func progRows(res *harness.Results, has func(harness.ProgStat) bool, cells func(harness.ProgStat) []string) []string {
	var rows []string
	for _, p := range res.Points {
		for _, ps := range p.Prog {
			if has(ps) {
				rows = append(rows, fmt.Sprintf("| %d | %s | %s |", p.Services, ps.Mode, strings.Join(cells(ps), " | ")))
			}
		}
	}
	return rows
}
