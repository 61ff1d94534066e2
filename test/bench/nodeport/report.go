package main

import (
	"fmt"
	"os/exec"
	"runtime"
	"strings"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/test/bench/harness"
)

// result is what a run measured; it is written as JSON and rendered as
// Markdown.
type result struct {
	harness.Span
	Machine  machine      `json:"machine"`
	Config   config       `json:"config"`
	Target   string       `json:"target"`
	Settings []string     `json:"settings"`
	Caveats  []string     `json:"caveats"`
	Modes    []*modeStats `json:"modes"`
	// Ratios are medians of per-round ratios: mode / base of the same
	// round, for base tc and iptables-nft.
	Ratios  []ratio      `json:"ratios"`
	ProgRun []progResult `json:"prog_run"`
}

// machine is the harness's description of the machine, and what the agent
// was built from.
type machine struct {
	harness.Machine
	// Source is the commit the agent was built from, and whether the
	// work tree had changes under bpf/, pkg/ or cmd/ (they are built in).
	Source string `json:"source"`
}

type modeStats struct {
	Mode           string            `json:"mode"`
	ProgramSeconds float64           `json:"program_seconds"`       // until the target answered (agents) or iptables-restore took
	LoadedWith     string            `json:"loaded_with,omitempty"` // how the iptables rules went in
	UDP            []udpResult       `json:"udp_rounds"`
	TCP            []tcpResult       `json:"tcp_rounds"`
	UDPRecvPPS     testutil.Spread   `json:"udp_recv_pps"`
	UDPSentPPS     testutil.Spread   `json:"udp_sent_pps"`
	TCPConnsPerSec testutil.Spread   `json:"tcp_conns_per_sec"`
	Counters       map[string]uint64 `json:"counters,omitempty"`
}

type ratio struct {
	Mode string           `json:"mode"`
	Base string           `json:"base"`
	UDP  *testutil.Spread `json:"udp_recv_pps,omitempty"`
	TCP  *testutil.Spread `json:"tcp_conns_per_sec,omitempty"`
}

func newResult(cfg config) *result {
	r := &result{Span: harness.StartSpan(), Config: cfg}
	r.Machine = machine{Machine: harness.DescribeMachine(), Source: sourceState()}
	for _, m := range cfg.Modes {
		r.Modes = append(r.Modes, &modeStats{Mode: m})
	}
	r.Caveats = []string{
		fmt.Sprintf("%d CPUs shared with the generator, the backend and other users of the machine: the generator competes with the datapath for CPU, so absolute pps/conns/s are a floor set by the whole system, not the datapath's capacity; compare the ratios", runtime.NumCPU()),
		"veth links, not NICs: native XDP on veth is the veth driver's XDP (frames redirected into the peer's NAPI), not a NIC driver's; generic XDP runs after the skb is built",
		"every node forwards to the remote backend through a router namespace; the tc and XDP programs see the same packets as iptables would, but only the iptables nodes run netfilter/conntrack",
		"UDP pps is counted where the packets arrive at the backend (an nftables counter in its prerouting); what the generator could not send or the node dropped is not counted: sent pps is reported beside it, and on veth the sender's own CPU also carries the receive-side softirq work of the next hops",
		"TCP conns/s includes the generator's and the backend's socket work (connect, 1 byte each way, reset) and a setns per connect; between the Sluice modes it is dominated by the end hosts (XDP only shortens the path of packets the hosts spend far longer on), while against iptables it is where N shows: every SYN walks the chains",
		"UDP flows are established after their first packet: iptables walks KUBE-SERVICES/KUBE-NODEPORTS only for a flow's first packet (conntrack NEW), so N shows in iptables' UDP pps hardly at all and in TCP conns/s (every SYN walks the chains) most; Sluice's lookups are hashes at any N",
		fmt.Sprintf("iptables-nft above N=%d: iptables-nft-restore v1.8.9 is superlinear in chains here (measured 12 s at N=1000, 445 s at N=3000), so the same ruleset is loaded through iptables-restore-translate and nft -f: same chains, rules and order in the same nf_tables engine, but native expressions where iptables-nft may use xt compat matches (statistic -> meta random, addrtype -> fib daddr type local)", nftRestoreMax),
		"BPF_PROG_TEST_RUN runs on the node's loopback without a real device (no driver, no veth transmit); it measures the programs alone on an established flow with the agent's N services in the maps (hash lookups: independent of N)",
	}
	return r
}

func (r *result) modeResult(mode string) *modeStats {
	for _, m := range r.Modes {
		if m.Mode == mode {
			return m
		}
	}
	m := &modeStats{Mode: mode}
	r.Modes = append(r.Modes, m)
	return m
}

func (r *result) finish() {
	r.Finish()
	udp := func(m *modeStats) []float64 {
		var xs []float64
		for _, u := range m.UDP {
			xs = append(xs, u.RecvPPS)
		}
		return xs
	}
	tcp := func(m *modeStats) []float64 {
		var xs []float64
		for _, t := range m.TCP {
			xs = append(xs, t.ConnsPerSec)
		}
		return xs
	}
	for _, m := range r.Modes {
		m.UDPRecvPPS = testutil.SpreadOf(udp(m))
		var sent []float64
		for _, u := range m.UDP {
			sent = append(sent, u.SentPPS)
		}
		m.UDPSentPPS = testutil.SpreadOf(sent)
		m.TCPConnsPerSec = testutil.SpreadOf(tcp(m))
	}
	perRound := func(a, b []float64) *testutil.Spread {
		var xs []float64
		for i := range min(len(a), len(b)) {
			if b[i] > 0 {
				xs = append(xs, a[i]/b[i])
			}
		}
		if len(xs) == 0 {
			return nil
		}
		s := testutil.SpreadOf(xs)
		return &s
	}
	for _, base := range []string{modeTC, modeNft} {
		var b *modeStats
		for _, m := range r.Modes {
			if m.Mode == base {
				b = m
			}
		}
		if b == nil {
			continue
		}
		for _, m := range r.Modes {
			if m == b {
				continue
			}
			r.Ratios = append(r.Ratios, ratio{Mode: m.Mode, Base: base, UDP: perRound(udp(m), udp(b)), TCP: perRound(tcp(m), tcp(b))})
		}
	}
}

// writeReport writes nodeport-<stamp>.json and .md into dir.
func writeReport(dir, stamp string, r *result) ([]string, error) {
	return harness.WriteRecord(dir, "nodeport-"+stamp, r, []byte(markdown(stamp, r)))
}

func markdown(stamp string, r *result) string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("# NodePort to a remote backend: XDP vs tc vs iptables, %s\n\n", stamp)
	p("%s. `go run ./test/bench/nodeport` (issue #4).\n\n", r.Times())
	p("## Machine\n\n- %d CPUs (%s), kernel %s, %s\n- load average at start: %s\n- agent built from: %s\n\n", r.Machine.CPUs, r.Machine.CPU, r.Machine.Kernel, r.Machine.Go, r.Machine.Load, r.Machine.Source)
	c := r.Config
	p("## Method\n\n")
	p("- N = %d NodePort services, %d endpoints each, all on another node (DNAT + SNAT); target: %s\n", c.Services, c.Endpoints, r.Target)
	p("- topology: generator netns -> node netns (one per mode, same shape) -> router netns -> backend netns, veth links; all modes stay programmed for the whole run\n")
	p("- %d rounds; in each, every mode in the order %s for UDP, then again for TCP; %s per measurement\n", c.Rounds, strings.Join(c.Modes, ", "), c.Duration)
	p("- UDP: %d sender goroutines x %d connected sockets (source ports), %d-byte payload, plain write() loops; pps received at the backend\n", c.UDPSenders, c.UDPFlows, c.UDPPayload)
	p("- TCP: %d concurrent loops of connect, 1 byte each way, close with RST (no TIME_WAIT)\n", c.TCPWorkers)
	p("- ratios: per round mode / base, then the median (min-max over rounds)\n")
	p("- per packet: BPF_PROG_TEST_RUN, tc and XDP programs interleaved packet by packet, %d packets each, median of 20 batch means\n\n", c.ProgIters)
	p("### What the run set\n\n")
	for _, s := range r.Settings {
		p("- %s\n", s)
	}
	p("\n## Live traffic (medians, min-max over rounds)\n\n")
	p("| mode | UDP pps received | UDP pps sent | TCP conns/s | programmed in (agent: start to target answering; iptables: restore) |\n|---|---|---|---|---|\n")
	for _, m := range r.Modes {
		p("| %s | %s | %s | %s | %.2fs |\n", m.Mode, fmtSpread(m.UDPRecvPPS, "%.0f"), fmtSpread(m.UDPSentPPS, "%.0f"), fmtSpread(m.TCPConnsPerSec, "%.0f"), m.ProgramSeconds)
	}
	for _, m := range r.Modes {
		if m.LoadedWith != "" {
			p("\n%s rules loaded with: %s\n", m.Mode, m.LoadedWith)
		}
	}
	p("\n## Ratios\n\n| mode | vs | UDP pps received | TCP conns/s |\n|---|---|---|---|\n")
	for _, x := range r.Ratios {
		p("| %s | %s | %s | %s |\n", x.Mode, x.Base, fmtRatio(x.UDP), fmtRatio(x.TCP))
	}
	if len(r.ProgRun) > 0 {
		p("\n## Per packet (BPF_PROG_TEST_RUN, N = %d)\n\n| packet | tc ns/pkt | XDP ns/pkt | XDP / tc | verdicts (tc, XDP) |\n|---|---|---|---|---|\n", c.Services)
		for _, x := range r.ProgRun {
			p("| %s | %.0f | %.0f | %.2f | %d, %d |\n", x.Packet, x.TCNs, x.XDPNs, x.XDPOverTC, x.TCVerdict, x.XDPVerdict)
		}
	}
	var ctrs []string
	for _, m := range r.Modes {
		if len(m.Counters) > 0 {
			ctrs = append(ctrs, fmt.Sprintf("%s: xdp_fwd=%d xdp_rev=%d", m.Mode, m.Counters["xdp_fwd"], m.Counters["xdp_rev"]))
		}
	}
	if len(ctrs) > 0 {
		p("\nSluice counters at the end (XDP modes must show xdp_fwd > 0: the fast path, not the tc fallback, forwarded): %s\n", strings.Join(ctrs, "; "))
	}
	p("\n## Caveats\n\n")
	for _, s := range r.Caveats {
		p("- %s\n", s)
	}
	return b.String()
}

func fmtSpread(s testutil.Spread, f string) string {
	return fmt.Sprintf(f+" ("+f+"-"+f+")", s.Median, s.Min, s.Max)
}

func fmtRatio(s *testutil.Spread) string {
	if s == nil {
		return "-"
	}
	return fmt.Sprintf("%.2fx (%.2f-%.2f)", s.Median, s.Min, s.Max)
}

// sourceState names the commit the agent is built from and whether the
// work tree differs from it where the agent's code lives.
func sourceState() string {
	head, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown (not a git checkout)"
	}
	s := strings.TrimSpace(string(head))
	dirty, err := exec.Command("git", "status", "--porcelain", "--", "bpf", "pkg", "cmd").Output()
	if err == nil && len(strings.TrimSpace(string(dirty))) > 0 {
		s += fmt.Sprintf(" + uncommitted changes in %d files under bpf/, pkg/, cmd/", len(strings.Split(strings.TrimSpace(string(dirty)), "\n")))
	}
	return s
}
