package report

import (
	"bytes"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/test/bench/harness"
)

// Markdown renders the run as a report with tables and ratios.
func Markdown(res *harness.Results, stamp string) []byte {
	var b bytes.Buffer
	c := res.Config
	fmt.Fprintf(&b, "# Sluice benchmark %s\n\n", stamp)
	fmt.Fprintf(&b, "%s.\n\n", res.Times())
	b.WriteString("## Machine\n\n")
	m := res.Machine
	fmt.Fprintf(&b, "- kernel %s, %d CPUs (%s), %.1f GiB memory, %s\n", m.Kernel, m.CPUs, m.CPU, float64(m.MemBytes)/(1<<30), m.Go)
	fmt.Fprintf(&b, "- load average at start: %s (the machine is shared: figures are medians of interleaved rounds, compare ratios rather than absolutes)\n", m.Load)
	var tools []string
	for k, v := range m.Tools {
		tools = append(tools, k+": "+v)
	}
	sort.Strings(tools)
	fmt.Fprintf(&b, "- tools: %s\n\n", strings.Join(tools, "; "))
	b.WriteString("## Method\n\n")
	fam := c.Family
	if fam == "" {
		fam = "IPv4" // results from before BENCH_FAMILY
	}
	fmt.Fprintf(&b, "- services N = %v, %d endpoints each, port 80 -> 8080/TCP, over %s; %d rounds; within a round the modes take turns (A B C, next round C B A)\n", c.Services, c.Endpoints, fam, c.Rounds)
	fmt.Fprintf(&b, "- one client run: %s or %d connections, %d concurrent workers; a connection is connect, 1-byte request, 1-byte reply, close (latency covers all of it)\n", c.RunTime, c.MaxConns, c.Workers)
	b.WriteString("- per-packet layer: client netns -> node netns (the rules, or Sluice's tc program on the node's client-facing veth) -> backend netns; socket layer: the client runs in the node netns itself (iptables/nftables OUTPUT hooks, Sluice's cgroup connect4 or connect6)\n")
	b.WriteString("- targets: `random` = a VIP picked at random per connection among all N; `last` = the VIP whose rule is last in KUBE-SERVICES. `direct` (the floor) connects to a backend of the same service(s) with no rules at all\n")
	b.WriteString("- ratios are per round against `direct` of the same round, then the median: conns/s ratio < 1 and p99 ratio > 1 mean slower than the floor\n")
	fmt.Fprintf(&b, "- programming: `initial` = from an empty datapath to %d sampled services (first, last, random) all answering; `update` = one endpoint of one service moved to a new address in the source until a client connection lands on it; each step bounded by %s\n", c.ProbeSample, c.ProgTimeout)
	b.WriteString("- iptables: kube-proxy-shaped ruleset (KUBE-SERVICES -> KUBE-SVC-* with statistic random 1/(n-i) -> KUBE-SEP-* DNAT, KUBE-MARK-MASQ, KUBE-POSTROUTING, filter KUBE-FORWARD etc.), loaded with `iptables-restore --noflush` (`ip6tables-restore` over IPv6); an update rewrites the full table as kube-proxy's full sync does\n")
	b.WriteString("- nftables: kube-proxy-shaped (service-ips verdict map keyed by daddr . l4proto . dport, per-service numgen vmap, per-endpoint DNAT chains); initial load is one `nft -f` transaction, an update is the small transaction kube-proxy sends\n")
	b.WriteString("- the real kube-proxy is not run: kube-proxy-shaped rules stand in for it\n\n")
	b.WriteString("### What the run set\n\n")
	for _, s := range res.Settings {
		fmt.Fprintf(&b, "- %s\n", s)
	}
	for _, s := range res.Notes {
		fmt.Fprintf(&b, "- %s\n", s)
	}
	for _, p := range res.Points {
		if len(p.ConntrackPeak) == 0 {
			continue
		}
		var parts []string
		for _, m := range p.Modes {
			if v, ok := p.ConntrackPeak[m]; ok {
				parts = append(parts, fmt.Sprintf("%s %d", m, v))
			}
		}
		fmt.Fprintf(&b, "- N=%d: peak nf_conntrack_count in the node netns after a client run: %s\n", p.Services, strings.Join(parts, ", "))
	}
	b.WriteString("\n")

	b.WriteString("## Summary: new connections vs direct\n\n")
	b.WriteString("Each cell: conns/s as a fraction of `direct` (median of per-round ratios, with their min-max where recorded) / p99 latency as a multiple of `direct` (median of per-round ratios). Below 1 / above 1 = slower than the floor.\n\n")
	b.WriteString("| N | mode | packet, random VIP | packet, last VIP | socket, random VIP | socket, last VIP |\n|---:|---|---:|---:|---:|---:|\n")
	for _, p := range res.Points {
		for _, mode := range p.Modes {
			if mode == harness.ModeFloor {
				continue
			}
			cells := []string{}
			any := false
			for _, layer := range []string{"packet", "socket"} {
				for _, target := range []string{"random", "last"} {
					cell := "-"
					for _, cs := range p.Conn {
						if cs.Layer == layer && cs.Target == target && cs.Mode == mode && cs.RatioConnsPerS > 0 {
							cell = fmt.Sprintf("%.2f / %.2f", cs.RatioConnsPerS, cs.RatioP99)
							if r := cs.RatioSpread; r.Max > 0 {
								cell = fmt.Sprintf("%.2f (%.2f-%.2f) / %.2f", cs.RatioConnsPerS, r.Min, r.Max, cs.RatioP99)
							}
							any = true
						}
					}
					cells = append(cells, cell)
				}
			}
			if any {
				fmt.Fprintf(&b, "| %d | %s | %s |\n", p.Services, mode, strings.Join(cells, " | "))
			}
		}
	}
	b.WriteString("\n")

	for _, layer := range []string{"packet", "socket"} {
		for _, target := range []string{"random", "last"} {
			fmt.Fprintf(&b, "## New connections, %s layer, %s VIP\n\n", layer, target)
			b.WriteString("| N | mode | conns/s median (min-max) | x direct | p50 us | p99 us median (min-max) | p99 x direct | errors |\n")
			b.WriteString("|---:|---|---:|---:|---:|---:|---:|---:|\n")
			for _, p := range res.Points {
				for _, cs := range p.Conn {
					if cs.Layer != layer || cs.Target != target {
						continue
					}
					ratio, rp99 := "1", "1"
					if cs.Mode != harness.ModeFloor {
						ratio, rp99 = fmt.Sprintf("%.2f", cs.RatioConnsPerS), fmt.Sprintf("%.2f", cs.RatioP99)
					}
					fmt.Fprintf(&b, "| %d | %s | %.0f (%.0f-%.0f) | %s | %.0f | %.0f (%.0f-%.0f) | %s | %d |\n",
						p.Services, cs.Mode, cs.ConnsPerS.Median, cs.ConnsPerS.Min, cs.ConnsPerS.Max, ratio,
						cs.P50us.Median, cs.P99us.Median, cs.P99us.Min, cs.P99us.Max, rp99, cs.Errors)
				}
			}
			b.WriteString("\n")
		}
	}

	b.WriteString("## Programming time\n\n")
	b.WriteString("| N | mode | initial s median (min-max) | initial | update ms median (min-max) | update |\n")
	b.WriteString("|---:|---|---:|---|---:|---|\n")
	for _, p := range res.Points {
		for _, ps := range p.Prog {
			ini, upd := "-", "-"
			if len(ps.InitialS) > 0 {
				ini = fmt.Sprintf("%.3f (%.3f-%.3f) n=%d", ps.Initial.Median, ps.Initial.Min, ps.Initial.Max, len(ps.InitialS))
			}
			if ps.LoadedAfterS > 0 {
				ini = fmt.Sprintf("(loaded after %.0f s)", ps.LoadedAfterS)
			}
			if len(ps.UpdateS) > 0 {
				upd = fmt.Sprintf("%.1f (%.1f-%.1f) n=%d", ps.Update.Median*1e3, ps.Update.Min*1e3, ps.Update.Max*1e3, len(ps.UpdateS))
			}
			fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %s |\n", p.Services, ps.Mode, ini, ps.InitialResult, upd, ps.UpdateResult)
		}
	}
	bd := progRows(res, func(ps harness.ProgStat) bool { return len(ps.InitialSourceS)+len(ps.UpdateSourceS) > 0 },
		func(ps harness.ProgStat) []string {
			return []string{medianOr(ps.InitialSourceS, 1, "%.3f"), medianOr(ps.InitialApplyS, 1, "%.3f"),
				medianOr(ps.UpdateSourceS, 1e3, "%.1f"), medianOr(ps.UpdateApplyS, 1e3, "%.1f")}
		})
	if len(bd) > 0 {
		b.WriteString("\nWhere Sluice's time goes (from the agent's log; medians): `source` = from writing the manifest file (initial: from starting the agent) until the manifest source had loaded and translated it (includes its 100 ms debounce on updates); `apply` = the reconciler writing the maps. The rest of the total is the agent's start (BPF load, attach) and the probe.\n\n")
		b.WriteString("| N | mode | initial source s | initial apply s | update source ms | update apply ms |\n|---:|---|---:|---:|---:|---:|\n")
		b.WriteString(strings.Join(bd, "\n") + "\n")
	}
	fromStartTable(&b, res)
	var ver []string
	for _, p := range res.Points {
		for _, m := range p.Modes {
			if v, ok := p.Verified[m]; ok {
				ver = append(ver, fmt.Sprintf("- N=%d %s: %s", p.Services, m, v))
			}
		}
	}
	if len(ver) > 0 {
		b.WriteString("\nAfter the initial programming (untimed), one connection to every service:\n\n" + strings.Join(ver, "\n") + "\n")
	}
	b.WriteString("\n## Memory\n\n")
	b.WriteString("| N | mode | kernel MiB | agent RSS MiB | how |\n|---:|---|---:|---:|---|\n")
	for _, p := range res.Points {
		for _, ms := range p.Mem {
			if ms.Mode == harness.ModeFloor {
				continue
			}
			fmt.Fprintf(&b, "| %d | %s | %.1f | %.1f | %s |\n", p.Services, ms.Mode, float64(ms.KernelBytes)/(1<<20), float64(ms.AgentRSS)/(1<<20), ms.How)
		}
	}
	agentMemTable(&b, res)
	loadRunErrors(&b, res)
	cpuTable(&b, res)
	baseTable(&b, res)
	progCostTable(&b, res)
	b.WriteString("\n## tc program per packet (BPF_PROG_TEST_RUN)\n\n")
	b.WriteString("Sluice's tc ingress program with N services in its maps (programmed through the production reconciler). The kernel's repeat loop reruns one skb that the first run already translated, so each figure is the median of many single runs (the kernel's timing of each): `new flow` = a SYN from a fresh source port (service lookup, backend pick, conntrack insert, DNAT); `established` = the same segment again (conntrack hit, DNAT). Spread = min-max of 5 chunk medians.\n\n")
	b.WriteString("| N | new flow ns/packet median (min-max) | established ns/packet median (min-max) | runs | reconciler apply of N services s | result |\n|---:|---:|---:|---:|---:|---|\n")
	for _, p := range res.Points {
		if tr := p.TestRun; tr != nil {
			fmt.Fprintf(&b, "| %d | %.0f (%.0f-%.0f) | %.0f (%.0f-%.0f) | %d | %.3f | %s |\n", p.Services,
				tr.NewFlowNs.Median, tr.NewFlowNs.Min, tr.NewFlowNs.Max, tr.EstablishedNs.Median, tr.EstablishedNs.Min, tr.EstablishedNs.Max,
				2*tr.Calls, tr.ApplyS, tr.Result)
		} else {
			fmt.Fprintf(&b, "| %d | - | - | - | - | not measured |\n", p.Services)
		}
	}
	var skipped []string
	for _, p := range res.Points {
		if p.Skipped != "" {
			skipped = append(skipped, fmt.Sprintf("- N=%d skipped: %s", p.Services, p.Skipped))
		}
		var fm []string
		for k := range p.Failed {
			fm = append(fm, k)
		}
		sort.Strings(fm)
		for _, k := range fm {
			skipped = append(skipped, fmt.Sprintf("- N=%d %s: %s", p.Services, k, p.Failed[k]))
		}
	}
	if len(skipped) > 0 {
		b.WriteString("\n## Skipped and failed\n\n" + strings.Join(skipped, "\n") + "\n")
	}
	b.WriteString("\n## Plots\n\n")
	for _, f := range plotFiles {
		fmt.Fprintf(&b, "![%s](%s-%s.png)\n", f.title, stamp, f.suffix)
	}
	return b.Bytes()
}

// medianOr formats the median of v times scale, or "-" for no samples.
func medianOr(v []float64, scale float64, format string) string {
	if len(v) == 0 {
		return "-"
	}
	return fmt.Sprintf(format, testutil.Median(v)*scale)
}

// cpuTable renders the CPU per connection of every load run's mode: the
// figure that this shared machine's noise moves least (cpucost.go).
func cpuTable(b *bytes.Buffer, res *harness.Results) {
	head := false
	for _, p := range res.Points {
		for _, cs := range p.Conn {
			if len(cs.CPURounds) == 0 || cs.CPUUs.Median == 0 {
				continue
			}
			if !head {
				b.WriteString("\n## CPU per connection\n\n")
				b.WriteString("Per client run: the client's CPU (rusage), the backend server's and every ksoftirqd's (their threads' run time) over the connections it made; every hop of a connection runs in one of them. Medians over rounds in us; the ratio is the floor's CPU per connection over the mode's in the same round, median (min-max), so it reads as the connections-per-second ratio does; `w/o ksoftirqd` leaves the machine-wide ksoftirqd out. The agent's CPU per connection is its whole CPU in the run (a per-second cost, apart). Load is the 1-minute load average at the runs' start, min-max.\n\n")
				b.WriteString("| N | layer | target | mode | client | server | ksoftirqd | total us/conn | ratio to floor | w/o ksoftirqd | agent | load |\n|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
				head = true
			}
			var cl, sv, sq, ag, ld []float64
			for _, c := range cs.CPURounds {
				if c == nil {
					continue
				}
				cl, sv, sq, ag, ld = append(cl, c.ClientUs), append(sv, c.ServerUs), append(sq, c.SoftirqdUs), append(ag, c.AgentUs), append(ld, c.Load1)
			}
			ratio := func(s harness.Stat) string {
				if s.Median == 0 {
					return "-"
				}
				return fmt.Sprintf("%.3f (%.2f-%.2f)", s.Median, s.Min, s.Max)
			}
			fmt.Fprintf(b, "| %d | %s | %s | %s | %.1f | %.1f | %.1f | %.1f (%.1f-%.1f) | %s | %s | %s | %.1f-%.1f |\n",
				p.Services, cs.Layer, cs.Target, cs.Mode, testutil.Median(cl), testutil.Median(sv), testutil.Median(sq),
				cs.CPUUs.Median, cs.CPUUs.Min, cs.CPUUs.Max, ratio(cs.RatioCPU), ratio(cs.RatioCPUNoSoftirqd),
				medianOr(ag, 1, "%.2f"), slices.Min(ld), slices.Max(ld))
		}
	}
}

// progCostTable renders, for a run with BENCH_BPF_STATS, what Sluice's
// programs cost in the load runs themselves.
func progCostTable(b *bytes.Buffer, res *harness.Results) {
	head := false
	for _, p := range res.Points {
		for _, cs := range p.Conn {
			for _, pc := range cs.Prog {
				if !head {
					b.WriteString("\n## Sluice's programs in the load runs (BENCH_BPF_STATS)\n\n")
					b.WriteString("The kernel's BPF run-time statistics of every program the agent holds, read before and after each client run of the sluice mode, over the connections it made: medians over rounds. Unlike BPF_PROG_TEST_RUN, this is real traffic, with the cache misses of many flows and services.\n\n")
					b.WriteString("| N | layer | target | program | runs per connection | ns per run | us per connection |\n|---:|---|---|---|---:|---:|---:|\n")
					head = true
				}
				fmt.Fprintf(b, "| %d | %s | %s | %s | %.2f | %.0f | %.2f |\n", p.Services, cs.Layer, cs.Target, pc.Prog, pc.RunsPerConn, pc.NsPerRun, pc.NsPerConn/1e3)
			}
		}
	}
}
