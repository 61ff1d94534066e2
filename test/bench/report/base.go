package report

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/test/bench/harness"
)

// Mode sluice-base (BENCH_SLUICE_BASE) is another build of the agent run
// exactly as sluice and interleaved with it, to measure a change against
// its base. The tables to the floor show both; this one holds them against
// each other: per round, the base's figure over sluice's of the same round
// (the two ran minutes apart at most, under the same load), then the median
// and the range over rounds. Memory is read once per N, so its ratio is one
// figure.

// baseTable renders sluice-base over sluice, where a point ran both.
func baseTable(b *bytes.Buffer, res *harness.Results) {
	var conn, other []string
	for _, p := range res.Points {
		find := func(layer, target, mode string) *harness.ConnStat {
			for i, cs := range p.Conn {
				if cs.Layer == layer && cs.Target == target && cs.Mode == mode {
					return &p.Conn[i]
				}
			}
			return nil
		}
		for _, fig := range []struct {
			name string
			get  func(cs *harness.ConnStat, i int) float64
		}{
			{"conns/s", func(cs *harness.ConnStat, i int) float64 { return cs.Rounds[i].ConnsPerS }},
			{"p50 us", func(cs *harness.ConnStat, i int) float64 { return cs.Rounds[i].P50us }},
			{"p99 us", func(cs *harness.ConnStat, i int) float64 { return cs.Rounds[i].P99us }},
			{"CPU us/conn", func(cs *harness.ConnStat, i int) float64 {
				if i >= len(cs.CPURounds) || cs.CPURounds[i] == nil {
					return 0
				}
				return cs.CPURounds[i].TotalUs
			}},
		} {
			var cells []string
			any := false
			for _, layer := range []string{"packet", "socket"} {
				for _, target := range []string{"random", "last"} {
					s, bs := find(layer, target, harness.ModeSluice), find(layer, target, harness.ModeSluiceBase)
					var r []float64
					for i := 0; s != nil && bs != nil && i < min(len(s.Rounds), len(bs.Rounds)); i++ {
						if s.Rounds[i].Conns == 0 || bs.Rounds[i].Conns == 0 {
							continue // a failed run has no figure to hold against
						}
						if x, y := fig.get(bs, i), fig.get(s, i); x > 0 && y > 0 {
							r = append(r, x/y)
						}
					}
					cells = append(cells, spreadCell(r))
					any = any || len(r) > 0
				}
			}
			if any {
				conn = append(conn, fmt.Sprintf("| %d | %s | %s |", p.Services, fig.name, strings.Join(cells, " | ")))
			}
		}
		other = append(other, progMemRatios(p)...)
	}
	if len(conn)+len(other) == 0 {
		return
	}
	b.WriteString("\n## sluice-base against sluice (BENCH_SLUICE_BASE)\n\n")
	b.WriteString("Per round, mode `sluice-base`'s figure over `sluice`'s in the same round, then the median [min-max] over rounds, n = rounds with both. Above 1: the base makes more connections per second, or takes more latency, CPU, time or memory, than `sluice`.\n\n")
	if len(conn) > 0 {
		b.WriteString("| N | sluice-base / sluice | packet, random VIP | packet, last VIP | socket, random VIP | socket, last VIP |\n|---:|---|---:|---:|---:|---:|\n")
		b.WriteString(strings.Join(conn, "\n") + "\n")
	}
	if len(other) > 0 {
		if len(conn) > 0 {
			b.WriteString("\n")
		}
		b.WriteString("| N | sluice-base / sluice | ratio |\n|---:|---|---:|\n")
		b.WriteString(strings.Join(other, "\n") + "\n")
	}
}

// progMemRatios are the programming times' per-round ratios and the
// memory's of point p, as table rows.
func progMemRatios(p harness.Point) []string {
	var s, bs *harness.ProgStat
	for i := range p.Prog {
		switch p.Prog[i].Mode {
		case harness.ModeSluice:
			s = &p.Prog[i]
		case harness.ModeSluiceBase:
			bs = &p.Prog[i]
		}
	}
	var rows []string
	row := func(name string, r []float64) {
		if len(r) > 0 {
			rows = append(rows, fmt.Sprintf("| %d | %s | %s |", p.Services, name, spreadCell(r)))
		}
	}
	if s != nil && bs != nil {
		row("initial programming", pairRatios(bs.InitialS, s.InitialS))
		row("initial, from the agent's start", pairRatios(bs.InitialFromStartS, s.InitialFromStartS))
		row("endpoint update", pairRatios(bs.UpdateS, s.UpdateS))
		row("endpoint update, from the rename", pairRatios(bs.UpdateFromWriteS, s.UpdateFromWriteS))
	}
	mem := func(ms []harness.MemStat, name string, get func(harness.MemStat) int64) {
		var x, y int64
		for _, m := range ms {
			switch m.Mode {
			case harness.ModeSluice:
				y = get(m)
			case harness.ModeSluiceBase:
				x = get(m)
			}
		}
		if x > 0 && y > 0 {
			row(name, []float64{float64(x) / float64(y)})
		}
	}
	mem(p.Mem, "BPF map memory", func(m harness.MemStat) int64 { return m.KernelBytes })
	mem(p.Mem, "agent RSS after the initial load", func(m harness.MemStat) int64 { return m.AgentRSS })
	mem(p.MemEnd, "agent peak RSS at the end", func(m harness.MemStat) int64 { return m.AgentPeakRSS })
	return rows
}

// pairRatios is x[i]/y[i] for the rounds both have.
func pairRatios(x, y []float64) []float64 {
	var r []float64
	for i := 0; i < min(len(x), len(y)); i++ {
		if x[i] > 0 && y[i] > 0 {
			r = append(r, x[i]/y[i])
		}
	}
	return r
}

// spreadCell formats ratios as median [min-max] n=rounds, or "-".
func spreadCell(r []float64) string {
	if len(r) == 0 {
		return "-"
	}
	s := testutil.SpreadOf(r)
	return fmt.Sprintf("%.2f [%.2f-%.2f] n=%d", s.Median, s.Min, s.Max, len(r))
}
