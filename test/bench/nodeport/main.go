// Command nodeport measures NodePort traffic to a remote backend through
// Sluice's XDP fast path (native and generic), through its tc path, and
// through kube-proxy-shaped iptables rules (iptables-nft and
// iptables-legacy), side by side in one run, at N services (issue #4).
// Run it as root from the module root:
//
//	go run ./test/bench/nodeport                      # N=10000, writes test/bench/results/nodeport-<date>.{json,md}
//	NODEPORT_SERVICES=1000 go run ./test/bench/nodeport -rounds 5
//
// Every mode has a node namespace of its own between one traffic
// generator namespace and one backend namespace (see topo.go), with the
// same N services programmed, so the modes are measured interleaved in
// every round (A B C D E, A B C D E, ...) on the same machine load:
//
//   - UDP: small datagrams from many source ports to the target NodePort
//     for a bounded time; packets per second counted as they arrive at
//     the backend.
//   - TCP: short connections per second to the target NodePort.
//   - per packet: BPF_PROG_TEST_RUN of the XDP and the tc program on an
//     established NodePort flow, with the agent's N services in the maps.
//
// Figures are reported as ratios of medians of per-round ratios, to the
// tc mode and to iptables-nft of the same round: on a shared machine the
// absolute numbers move, the ratios much less.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/test/bench/harness"
)

// config is what a run does.
type config struct {
	Services    int           `json:"services"`
	Endpoints   int           `json:"endpoints_per_service"`
	Modes       []string      `json:"modes"`
	Rounds      int           `json:"rounds"`
	Duration    time.Duration `json:"round_duration_ns"`
	UDPSenders  int           `json:"udp_senders"`
	UDPFlows    int           `json:"udp_flows_per_sender"`
	UDPPayload  int           `json:"udp_payload_bytes"`
	TCPWorkers  int           `json:"tcp_workers"`
	ProgIters   int           `json:"prog_run_iterations"`
	OutDir      string        `json:"-"`
	Stamp       string        `json:"-"`
	ReadyTimout time.Duration `json:"-"`
}

func main() {
	os.Exit(mainErr(os.Args[1:]))
}

func mainErr(args []string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg, err := parseConfig(args)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(os.Stderr, "nodeport:", err)
		return 2
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "nodeport: needs root (network namespaces, BPF, iptables)")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, cfg, log)
	if err != nil {
		return harness.Finish(log, nil, err)
	}
	return harness.Finish(log, func() ([]string, error) { return writeReport(cfg.OutDir, cfg.Stamp, res) }, nil)
}

func parseConfig(args []string) (config, error) {
	fs := flag.NewFlagSet("nodeport", flag.ContinueOnError)
	cfg := config{}
	defN := 10000
	if v := os.Getenv("NODEPORT_SERVICES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return cfg, fmt.Errorf("NODEPORT_SERVICES=%q: %w", v, err)
		}
		defN = n
	}
	modes := fs.String("modes", strings.Join(allModes, ","), "modes to measure, comma-separated: "+strings.Join(allModes, ", "))
	fs.IntVar(&cfg.Services, "services", defN, "NodePort services (N; env NODEPORT_SERVICES)")
	fs.IntVar(&cfg.Endpoints, "endpoints", 10, "endpoints per service")
	fs.IntVar(&cfg.Rounds, "rounds", 3, "rounds; each measures every mode once, in the same order")
	fs.DurationVar(&cfg.Duration, "duration", 3*time.Second, "length of one UDP or TCP measurement")
	fs.IntVar(&cfg.UDPSenders, "udp-senders", 4, "UDP sender goroutines")
	fs.IntVar(&cfg.UDPFlows, "udp-flows", 16, "UDP sockets (source ports) per sender")
	fs.IntVar(&cfg.UDPPayload, "udp-payload", 18, "UDP payload bytes")
	fs.IntVar(&cfg.TCPWorkers, "tcp-workers", 8, "concurrent TCP connection loops")
	fs.IntVar(&cfg.ProgIters, "prog-iterations", 20000, "BPF_PROG_TEST_RUN packets per program and packet kind")
	fs.StringVar(&cfg.OutDir, "out", "test/bench/results", "directory for nodeport-<date>.json and .md")
	fs.DurationVar(&cfg.ReadyTimout, "ready-timeout", 3*time.Minute, "how long the agents and rules may take to be programmed")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	for _, m := range strings.Split(*modes, ",") {
		if m = strings.TrimSpace(m); m == "" {
			continue
		}
		if !slices.Contains(allModes, m) {
			return cfg, fmt.Errorf("unknown mode %q (want %s)", m, strings.Join(allModes, ", "))
		}
		cfg.Modes = append(cfg.Modes, m)
	}
	if len(cfg.Modes) == 0 || cfg.Rounds < 1 || cfg.Duration <= 0 || cfg.UDPSenders < 1 || cfg.UDPFlows < 1 || cfg.TCPWorkers < 1 {
		return cfg, errors.New("need at least one mode, round, sender, flow and worker, and a positive duration")
	}
	cfg.Stamp = time.Now().UTC().Format("2006-01-02T150405Z")
	return cfg, nil
}

// run builds the lab, programs every mode, measures, and tears everything
// down again (also on error and on ctx's cancellation).
func run(ctx context.Context, cfg config, log *slog.Logger) (res *result, err error) {
	svcs, err := layout(cfg.Services, cfg.Endpoints)
	if err != nil {
		return nil, err
	}
	target := svcs[len(svcs)-1]
	nodePort := target.ports[0].nodePort
	res = newResult(cfg)
	res.Target = fmt.Sprintf("bench/%s (the last of %d: its KUBE-SERVICES and KUBE-NODEPORTS rules come last), NodePort %d TCP+UDP", target.name, cfg.Services, nodePort)

	tmp, err := os.MkdirTemp("", "sluice-nodeport-")
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, os.RemoveAll(tmp)) }()
	var bins agentproc.Binaries
	needSluice := slices.ContainsFunc(cfg.Modes, isSluice)
	if needSluice {
		log.Info("building cmd/sluice")
		if bins, err = agentproc.Build(ctx, tmp); err != nil {
			return nil, err
		}
	}

	log.Info("building the lab", "modes", cfg.Modes)
	l, err := buildLab(cfg.Modes)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := l.close(); cerr != nil {
			log.Error("cleanup", "err", cerr)
			if err == nil {
				err = cerr
			}
		}
	}()
	res.Settings = append(res.Settings, l.settings...)
	srv, err := serveTCP(l.be)
	if err != nil {
		return nil, err
	}
	defer srv.Close()

	// Program every mode: the agents load concurrently; the rule sets
	// one after the other.
	start := time.Now()
	var mf string
	if needSluice {
		if mf, err = writeManifest(tmp, svcs); err != nil {
			return nil, err
		}
		for _, n := range l.nodes {
			if isSluice(n.mode) {
				log.Info("starting the agent", "mode", n.mode)
				if err := l.startSluice(n, bins, mf); err != nil {
					return nil, err
				}
			}
		}
		res.Settings = append(res.Settings,
			"sluice: cmd/sluice per node, --devices eth0,eth1 --node-ip <eth0> --socket-lb=false --resync-interval 0 --health-check-node-ports=false; conntrack GC every 30s (the default); map sizes at their defaults; its own pin directory under /sys/fs/bpf",
			"sluice: endpoints carry nodeName node-b, the agent runs as node-a: every backend is remote, flows are DNATed and SNATed to the node's eth1 address")
	}
	// The agents program concurrently; each is ready when the target
	// answers through its node. The rule sets load after that, one after
	// the other, so neither's programming time includes the other's.
	for _, n := range l.nodes {
		if n.agent == nil {
			continue
		}
		if err := n.agent.WaitReady(cfg.ReadyTimout); err != nil {
			return nil, fmt.Errorf("agent %s: %w\n%s", n.mode, err, tail(n.agent.Log.String(), 2000))
		}
		if err := l.waitTarget(ctx, n, nodePort, cfg.ReadyTimout); err != nil {
			return nil, err
		}
		res.modeResult(n.mode).ProgramSeconds = time.Since(start).Seconds()
		log.Info("mode ready", "mode", n.mode, "since the agents started", time.Since(start).Round(time.Millisecond))
	}
	var ruleset []byte
	for _, n := range l.nodes {
		if isSluice(n.mode) {
			continue
		}
		if ruleset == nil {
			ruleset = iptablesRestore(svcs)
		}
		log.Info("loading rules", "mode", n.mode)
		d, how, err := loadIptables(ctx, n, ruleset, cfg.Services, tmp)
		if err != nil {
			return nil, err
		}
		res.modeResult(n.mode).ProgramSeconds = d.Seconds()
		res.modeResult(n.mode).LoadedWith = how
		log.Info("rules loaded", "mode", n.mode, "took", d.Round(time.Millisecond), "with", how)
		if err := l.waitTarget(ctx, n, nodePort, cfg.ReadyTimout); err != nil {
			return nil, err
		}
	}
	if ruleset != nil {
		res.Settings = append(res.Settings, fmt.Sprintf("iptables: kube-proxy-shaped nat+filter ruleset (%d bytes, iptables-restore --noflush into the fresh node netns): KUBE-SERVICES (one rule per ClusterIP:port, then --dst-type LOCAL -j KUBE-NODEPORTS), KUBE-NODEPORTS -> KUBE-EXT-* (KUBE-MARK-MASQ) -> KUBE-SVC-* (statistic random 1/(n-i)) -> KUBE-SEP-* (DNAT), KUBE-POSTROUTING MASQUERADE --random-fully; filter KUBE-FORWARD etc.", len(ruleset)))
	}
	for r := range cfg.Rounds {
		for _, n := range l.nodes {
			u, err := l.udpLoad(ctx, n, nodePort, cfg.UDPSenders, cfg.UDPFlows, cfg.UDPPayload, cfg.Duration)
			if err != nil {
				return nil, fmt.Errorf("round %d, %s, UDP: %w", r, n.mode, err)
			}
			res.modeResult(n.mode).UDP = append(res.modeResult(n.mode).UDP, u)
			log.Info("udp", "round", r, "mode", n.mode, "sent_pps", int(u.SentPPS), "recv_pps", int(u.RecvPPS))
		}
		for _, n := range l.nodes {
			t, err := l.tcpLoad(ctx, n, nodePort, cfg.TCPWorkers, cfg.Duration)
			if err != nil {
				return nil, fmt.Errorf("round %d, %s, TCP: %w", r, n.mode, err)
			}
			res.modeResult(n.mode).TCP = append(res.modeResult(n.mode).TCP, t)
			log.Info("tcp", "round", r, "mode", n.mode, "conns_per_sec", int(t.ConnsPerSec), "errors", t.Errors)
		}
	}
	for _, n := range l.nodes {
		if n.agent == nil {
			continue
		}
		m := res.modeResult(n.mode)
		m.Counters = map[string]uint64{}
		for _, c := range []string{"xdp_fwd", "xdp_rev"} {
			if v, err := n.agent.Counter(ctx, c); err == nil {
				m.Counters[c] = v
			}
		}
	}
	// Per packet, on the tc node (any Sluice node would do: the programs
	// are loaded anew over its pinned maps).
	for _, n := range l.nodes {
		if n.mode == modeTC || (n.agent != nil && !slices.Contains(cfg.Modes, modeTC)) {
			log.Info("BPF_PROG_TEST_RUN", "node", n.mode, "iterations", cfg.ProgIters)
			if res.ProgRun, err = l.progRun(n, nodePort, cfg.ProgIters); err != nil {
				return nil, err
			}
			break
		}
	}
	res.finish()
	return res, nil
}

// waitTarget waits until a TCP connection to the target NodePort through n
// completes.
func (l *lab) waitTarget(ctx context.Context, n *node, nodePort int, timeout time.Duration) error {
	dst := fmt.Sprintf("%s:%d", n.addr, nodePort)
	deadline := time.Now().Add(timeout)
	for {
		err := oneConn(ctx, l.gen, dst)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: target NodePort %s does not answer after %v: %w", n.mode, dst, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
