// Package harness runs the Sluice benchmark (issue #5): for each service
// count N it builds one client -> node -> backend namespace triple per mode,
// programs N kube-proxy-shaped services into each, and measures new
// connections per second and latency through the node (per-packet path) and
// from the node itself (socket layer), programming time from empty and for
// one endpoint change, and memory. Modes are measured interleaved (A B C A B
// C ...), and every figure is a median over rounds with its spread; ratios
// are taken against the direct-to-backend floor of the same round.
package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/test/bench/load"
	"github.com/sluice-lb/sluice/test/bench/rules"
)

// Config is what a run measures. ConfigFromEnv reads it from BENCH_*.
type Config struct {
	Services     []int         `json:"services"`
	Endpoints    int           `json:"endpoints"`
	Rounds       int           `json:"rounds"`
	RunTime      time.Duration `json:"run_time"`       // one client run
	MaxConns     int           `json:"max_conns"`      // per client run
	Workers      int           `json:"workers"`        // concurrent connections per client run
	Modes        []string      `json:"modes"`          // besides the floor, which always runs
	TimeLimit    time.Duration `json:"time_limit"`     // the whole run; later N are skipped past it
	ProgTimeout  time.Duration `json:"prog_timeout"`   // one programming step of one mode
	LoadTimeout  time.Duration `json:"load_timeout"`   // an initial load past ProgTimeout may finish until then, so connections can still be measured
	ProbeSample  int           `json:"probe_sample"`   // services probed for "all answering"
	TestRunCalls int           `json:"test_run_calls"` // BPF_PROG_TEST_RUN single runs per figure
	BPFStats     bool          `json:"bpf_stats"`      // kernel BPF run-time statistics on during the load runs: Sluice's program cost per connection (progcost.go)
	PerfDir      string        `json:"perf_dir"`       // a system-wide perf profile of every client run goes here (perfrec.go)
	Family       string        `json:"family"`         // "IPv4" or "IPv6": the services', clients' and backends' family
	OutDir       string        `json:"-"`
	Stamp        string        `json:"stamp"`
	SluiceBin    string        `json:"-"`
	Self         string        `json:"-"` // binary that serves the child roles

	// RulesMaxServices is the largest N at which the iptables and nftables
	// modes run; above it they are recorded as not run, with the reason.
	RulesMaxServices int `json:"rules_max_services,omitempty"`
	// ProgRepeatMax: an initial programming that took longer than this is
	// not repeated in later rounds (measured once).
	ProgRepeatMax time.Duration `json:"prog_repeat_max,omitempty"`
	// SluiceBase is the agent binary of mode sluice-base (BENCH_SLUICE_BASE).
	SluiceBase string `json:"sluice_base,omitempty"`
}

// AllModes is every mode the harness knows, floor excluded.
var AllModes = []string{ModeIptNft, ModeIptLeg, ModeNft, ModeSluice}

// ConfigFromEnv reads the BENCH_* environment.
func ConfigFromEnv() (Config, error) {
	c := Config{
		Services:     []int{100, 1000, 10000, 30000},
		Endpoints:    10,
		Rounds:       3,
		RunTime:      2 * time.Second,
		MaxConns:     200000,
		Workers:      4,
		Modes:        AllModes,
		TimeLimit:    45 * time.Minute,
		ProgTimeout:  120 * time.Second,
		ProbeSample:  32,
		TestRunCalls: 20000,
		OutDir:       "test/bench/results",
		Family:       rules.IPv4.Name,
		Stamp:        time.Now().UTC().Format("2006-01-02T150405Z"),
	}
	c.RulesMaxServices, c.ProgRepeatMax = defaultRulesMaxServices, 20*time.Second
	var err error
	get := func(k string, f func(string) error) {
		if v := os.Getenv(k); v != "" && err == nil {
			if e := f(v); e != nil {
				err = fmt.Errorf("%s=%q: %w", k, v, e)
			}
		}
	}
	atoi := func(p *int) func(string) error {
		return func(v string) error { n, e := strconv.Atoi(v); *p = n; return e }
	}
	dur := func(p *time.Duration) func(string) error {
		return func(v string) error { d, e := time.ParseDuration(v); *p = d; return e }
	}
	get("BENCH_SERVICES", func(v string) error {
		c.Services = nil
		for _, s := range strings.Split(v, ",") {
			n, e := strconv.Atoi(strings.TrimSpace(strings.ReplaceAll(s, "_", "")))
			if e != nil {
				return e
			}
			c.Services = append(c.Services, n)
		}
		return nil
	})
	get("BENCH_ENDPOINTS", atoi(&c.Endpoints))
	get("BENCH_ROUNDS", atoi(&c.Rounds))
	get("BENCH_RUN_TIME", dur(&c.RunTime))
	get("BENCH_MAX_CONNS", atoi(&c.MaxConns))
	get("BENCH_WORKERS", atoi(&c.Workers))
	get("BENCH_TIME_LIMIT", dur(&c.TimeLimit))
	get("BENCH_PROG_TIMEOUT", dur(&c.ProgTimeout))
	get("BENCH_LOAD_TIMEOUT", dur(&c.LoadTimeout))
	get("BENCH_PROBE_SAMPLE", atoi(&c.ProbeSample))
	get("BENCH_TEST_RUN_CALLS", atoi(&c.TestRunCalls))
	get("BENCH_RULES_MAX_SERVICES", atoi(&c.RulesMaxServices))
	get("BENCH_PROG_REPEAT_MAX", dur(&c.ProgRepeatMax))
	get("BENCH_OUT", func(v string) error { c.OutDir = v; return nil })
	get("BENCH_BPF_STATS", func(v string) error { b, e := strconv.ParseBool(v); c.BPFStats = b; return e })
	get("BENCH_PERF", func(v string) error { c.PerfDir = v; return os.MkdirAll(v, 0o755) })
	get("BENCH_FAMILY", func(v string) error {
		f, e := rules.FamilyOf(v)
		c.Family = f.Name
		return e
	})
	get("BENCH_SLUICE", func(v string) error { c.SluiceBin = v; return nil })
	get("BENCH_SLUICE_BASE", func(v string) error {
		c.SluiceBase = v
		c.Modes = append(slices.Clone(c.Modes), ModeSluiceBase) // the default; BENCH_MODES below may name it instead
		return nil
	})
	get("BENCH_MODES", func(v string) error {
		c.Modes = nil
		for _, m := range strings.Split(v, ",") {
			m = strings.TrimSpace(m)
			if m == ModeFloor || m == "" {
				continue
			}
			if !slices.Contains(append(AllModes, ModeKubeProx, ModeSluiceBase), m) {
				return fmt.Errorf("unknown mode %q", m)
			}
			c.Modes = append(c.Modes, m)
		}
		return nil
	})
	if err == nil && slices.Contains(c.Modes, ModeSluiceBase) != (c.SluiceBase != "") {
		err = fmt.Errorf("mode %s and BENCH_SLUICE_BASE (its agent binary) go together", ModeSluiceBase)
	}
	return c, err
}

// runner holds one run's state.
type runner struct {
	cfg  Config
	fam  rules.Family // cfg.Family's plan
	log  *slog.Logger
	res  *Results
	rng  *rand.Rand
	dead time.Time
	tmp  string
	// dropped are modes whose initial load failed at a smaller N: they
	// would only fail again, slower, at a larger one.
	dropped map[string]string
	// softirqd are the ksoftirqd threads, whose run time is part of a
	// client run's CPU (cpucost.go).
	softirqd []int
}

// Run measures everything in cfg and returns the results (also on error,
// as far as they got).
func Run(ctx context.Context, cfg Config, log *slog.Logger) (*Results, error) {
	// BENCH_TIME_LIMIT stops new N from starting; this hard limit stops a
	// point that runs on too long (its partial results are kept).
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, cfg.TimeLimit+hardGrace)
	defer cancel()
	fam, err := rules.FamilyOf(cfg.Family)
	if err != nil {
		return nil, err
	}
	tmp, removeTmp, err := TempDir("sluice-bench-", log)
	if err != nil {
		return nil, err
	}
	defer removeTmp()
	r := &runner{
		cfg:      cfg,
		fam:      fam,
		log:      log,
		rng:      rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano()))),
		dead:     time.Now().Add(cfg.TimeLimit),
		tmp:      tmp,
		dropped:  map[string]string{},
		softirqd: softirqdPids(),
		res:      &Results{Span: StartSpan(), Config: cfg, Machine: DescribeMachine()},
	}
	r.res.Settings = []string{
		"IP family: " + fam.Name + " (services " + fam.ServiceCIDR + ", backends " + fam.BackendCIDR + ")",
		"client and node netns: net.ipv4.ip_local_port_range=1024 65535, net.ipv4.tcp_tw_reuse=1 (both families)",
		"backend netns: net.core.somaxconn=4096, net.ipv4.tcp_max_syn_backlog=4096",
		"node netns: net.ipv4.ip_forward=1, and net.ipv6.conf.all.forwarding=1 for IPv6",
		fmt.Sprintf("client source addresses: %d (%s..)", ClientSources, ClientSourceAddrs(fam)[0]),
		"nf_conntrack_max is global (not settable per netns); left at " + ReadTrim("/proc/sys/net/netfilter/nf_conntrack_max") + ", counted per netns",
	}
	defer r.res.Finish()
	if cfg.RulesMaxServices > 0 && slices.ContainsFunc(cfg.Services, func(n int) bool { return n > cfg.RulesMaxServices }) {
		r.note(fmt.Sprintf("iptables-nft, iptables-legacy and nftables run only up to N=%d (BENCH_RULES_MAX_SERVICES): %s", cfg.RulesMaxServices, rulesCapReason))
	}
	if slices.Contains(cfg.Modes, ModeSluice) || slices.Contains(cfg.Modes, ModeSluiceBase) {
		r.res.Settings = append(r.res.Settings,
			"sluice: agent from cmd/sluice, --devices "+NodeClientDev+" (node's client-facing veth), --cgroup <a cgroup v2 dir the bench creates; socket-layer clients start in it>, its own bpffs mount, --resync-interval 0",
			"sluice: --max-services/--max-backends/--max-service-entries sized 1.25x what N needs (at least 1024); conntrack (hash, 262144 entries), ct_new (LRU, 65536), sock_rev and affinity (LRU, 262144) at their defaults, all preallocated",
			"sluice: endpoint changes are atomic rewrites (write + rename) of the manifest file the agent watches")
	}
	if slices.Contains(cfg.Modes, ModeSluice) {
		if _, err := r.sluiceBinaries(ctx); err != nil {
			r.note("sluice mode unavailable: " + err.Error())
		}
	}
	if cfg.SluiceBase != "" {
		r.res.Settings = append(r.res.Settings, "sluice-base: the agent "+cfg.SluiceBase+" (BENCH_SLUICE_BASE), run exactly as sluice (same flags, manifest, devices, socket cgroup) in its own triple, interleaved with the other modes in every round")
	}
	for _, n := range cfg.Services {
		if err := ctx.Err(); err != nil {
			return r.res, err
		}
		p := Point{Services: n, Endpoints: cfg.Endpoints}
		if time.Now().After(r.dead) {
			p.Skipped = fmt.Sprintf("time limit %s reached", cfg.TimeLimit)
			r.res.Points = append(r.res.Points, p)
			continue
		}
		log.Info("point", "services", n, "endpoints", cfg.Endpoints)
		if err := r.point(ctx, &p); err != nil {
			p.Skipped = err.Error()
			log.Error("point failed", "services", n, "err", err)
		}
		r.res.Points = append(r.res.Points, p)
		if ctx.Err() != nil {
			if parent.Err() == nil {
				r.note(fmt.Sprintf("hard time limit (BENCH_TIME_LIMIT + %s) reached during N=%d: later figures missing", hardGrace, n))
				return r.res, nil
			}
			return r.res, ctx.Err()
		}
	}
	return r.res, nil
}

// hardGrace is how long a point may run past BENCH_TIME_LIMIT.
const hardGrace = 15 * time.Minute

// env is one mode's namespaces, backend server and datapath.
type env struct {
	name   string
	tri    *triple
	server *exec.Cmd
	m      mode
	failed string
}

func (e *env) close() {
	if e.m != nil {
		e.m.close()
	}
	if e.server != nil && e.server.Process != nil {
		_ = e.server.Process.Kill()
		_ = e.server.Wait()
	}
	if e.tri != nil {
		e.tri.close()
	}
}

func (r *runner) newEnv(ctx context.Context, name string, n int) (*env, error) {
	tri, err := newTriple(ctx, name, r.fam)
	if err != nil {
		return nil, err
	}
	e := &env{name: name, tri: tri}
	if e.server, err = r.startServer(ctx, tri.Backend); err != nil {
		e.close()
		return nil, err
	}
	dir := filepath.Join(r.tmp, fmt.Sprintf("%s-%d", name, n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		e.close()
		return nil, err
	}
	cgName := fmt.Sprintf("sluice-bench-%d-%s-%d", os.Getpid(), name, n)
	switch name {
	case ModeFloor:
		e.m = floorMode{}
	case ModeIptNft, ModeIptLeg, ModeNft:
		cg, err := newMemcg(cgName)
		if err != nil {
			r.note("memory: " + err.Error())
		}
		l := ruleLoader{ns: tri.Node, fam: r.fam, bound: r.cfg.ProgTimeout, loadBound: r.loadBound(), cg: cg, tmp: dir}
		if name == ModeNft {
			l.tool = "nft"
			e.m = &nftMode{l}
		} else {
			l.tool = "iptables-restore"
			e.m = &iptMode{ruleLoader: l, variant: strings.TrimPrefix(name, "iptables-")}
		}
	case ModeSluice, ModeSluiceBase:
		m, err := newSluiceMode(ctx, r, tri, dir, name == ModeSluiceBase)
		if err != nil {
			e.close()
			return nil, err
		}
		e.m = m
	default:
		e.close()
		return nil, fmt.Errorf("mode %s not available", name)
	}
	return e, nil
}

func (r *runner) note(s string) {
	if !slices.Contains(r.res.Notes, s) {
		r.res.Notes = append(r.res.Notes, s)
	}
}

func (r *runner) startServer(ctx context.Context, ns *topology.NS) (*exec.Cmd, error) {
	cmd := ns.Command(context.Background(), r.cfg.Self)
	unspec := netip.IPv4Unspecified()
	if r.fam.Is6() {
		unspec = netip.IPv6Unspecified()
	}
	listen := netip.AddrPortFrom(unspec, rules.BackendPort).String()
	cmd.Env = append(os.Environ(), load.RoleEnv+"=server", "SLUICE_BENCH_LISTEN="+listen)
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start server in %s: %w", ns.Name, err)
	}
	ready := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() && sc.Text() == "ready" {
			ready <- nil
			for sc.Scan() {
			}
			return
		}
		ready <- errors.New("server exited before ready")
	}()
	select {
	case err = <-ready:
	case <-time.After(10 * time.Second):
		err = errors.New("server not ready after 10s")
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("server in %s: %w", ns.Name, err)
	}
	return cmd, nil
}

// runClient runs one client child in ns (and cgroup, if set); the state it
// exited with carries its CPU time.
func (r *runner) runClient(ctx context.Context, ns *topology.NS, cg *topology.Cgroup, cc load.ClientConfig) (load.ClientResult, *os.ProcessState, error) {
	ctx, cancel := context.WithTimeout(ctx, cc.Duration+30*time.Second)
	defer cancel()
	cmd := ns.Command(ctx, r.cfg.Self)
	cmd.Env = append(os.Environ(), load.RoleEnv+"=client")
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	if cg != nil {
		cg.Put(cmd)
	}
	in, _ := json.Marshal(cc)
	cmd.Stdin = strings.NewReader(string(in))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return load.ClientResult{}, nil, fmt.Errorf("client in %s: %w: %s", ns.Name, err, strings.TrimSpace(stderr.String()))
	}
	var res load.ClientResult
	if err := json.Unmarshal(out, &res); err != nil {
		return res, nil, fmt.Errorf("client output %q: %w", out, err)
	}
	return res, cmd.ProcessState, nil
}

// point measures one service count.
func (r *runner) point(ctx context.Context, p *Point) error {
	n := p.Services
	svcs, err := r.fam.Layout(n, r.cfg.Endpoints)
	if err != nil {
		return err
	}
	p.Failed = map[string]string{}
	var envs []*env
	defer func() {
		for _, e := range envs {
			e.close()
		}
	}()
	for _, name := range append([]string{ModeFloor}, r.cfg.Modes...) {
		if why, ok := r.dropped[name]; ok {
			p.Failed[name] = why
			continue
		}
		if why := r.rulesCapped(name, n); why != "" {
			p.Failed[name] = why
			continue
		}
		e, err := r.newEnv(ctx, name, n)
		if err != nil {
			if name == ModeFloor {
				return err
			}
			p.Failed[name] = err.Error()
			r.log.Warn("mode unavailable", "mode", name, "err", err)
			continue
		}
		envs = append(envs, e)
		p.Modes = append(p.Modes, name)
	}

	r.programInitial(ctx, p, envs, svcs)
	for _, e := range envs {
		if e.failed != "" {
			continue
		}
		if e.name != ModeFloor {
			// Untimed: every one of the N services answers, not just the
			// sampled ones the programming time waited for.
			bad, first := sweep(ctx, e.tri.Client, svcs)
			if p.Verified == nil {
				p.Verified = map[string]string{}
			}
			p.Verified[e.name] = fmt.Sprintf("all %d services answered", len(svcs))
			if bad > 0 {
				p.Verified[e.name] = fmt.Sprintf("%d+ of %d services did not answer (first: %s)", bad, len(svcs), first)
			}
		}
		for _, s := range e.tri.conntrackSysctls() {
			r.note("node netns (modes with conntrack): " + s)
		}
		p.Mem = append(p.Mem, MemStat{Mode: e.name, memStat: e.m.memory()})
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	r.connections(ctx, p, envs, svcs)
	if err := ctx.Err(); err != nil {
		return err
	}
	r.updates(ctx, p, envs, svcs)
	if err := ctx.Err(); err != nil {
		return err
	}
	p.MemEnd = memoryAtEnd(envs)
	p.TestRun = r.testRun(ctx, svcs)
	for _, e := range envs {
		if e.failed != "" {
			p.Failed[e.name] = e.failed
		}
		if strings.HasPrefix(e.failed, "initial programming") {
			r.dropped[e.name] = fmt.Sprintf("not run: its initial programming failed at N=%d (%s)", n, e.failed)
		}
	}
	return nil
}

// loadBound bounds an initial load: LoadTimeout, but never less than
// ProgTimeout.
func (r *runner) loadBound() time.Duration { return max(r.cfg.LoadTimeout, r.cfg.ProgTimeout) }

// probeSet is the services probed for "all answering": the last one (the
// last rule in KUBE-SERVICES), the first, and a random sample.
func (r *runner) probeSet(svcs []rules.Service) []netip.AddrPort {
	set := []netip.AddrPort{svcs[len(svcs)-1].VIPPort(), svcs[0].VIPPort()}
	for i := 0; i < r.cfg.ProbeSample-2 && i < len(svcs)-2; i++ {
		set = append(set, svcs[r.rng.IntN(len(svcs))].VIPPort())
	}
	return set
}

// waitAnswering returns when every target answered once, from ns.
func waitAnswering(ctx context.Context, ns *topology.NS, targets []netip.AddrPort, t0 time.Time, bound time.Duration) (time.Duration, error) {
	var el time.Duration
	err := ns.Do(func() error {
		pending := slices.Clone(targets)
		var lastErr error
		for {
			next := pending[:0]
			for _, t := range pending {
				if err := load.Ping(t, 500*time.Millisecond); err != nil {
					next = append(next, t)
					lastErr = err
				}
			}
			pending = next
			if len(pending) == 0 {
				el = time.Since(t0)
				return nil
			}
			if time.Since(t0) > bound {
				return fmt.Errorf("%w (%d of %d not answering: %v)", errTimeout{bound}, len(pending), len(targets), lastErr)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			time.Sleep(time.Millisecond)
		}
	})
	return el, err
}

// waitBackend returns when a connection to vip from ns lands on want.
func waitBackend(ctx context.Context, ns *topology.NS, vip netip.AddrPort, want netip.Addr, t0 time.Time, bound time.Duration) (time.Duration, error) {
	var el time.Duration
	err := ns.Do(func() error {
		for {
			if who, err := load.Who(vip, 500*time.Millisecond); err == nil && who == want {
				el = time.Since(t0)
				return nil
			}
			if time.Since(t0) > bound {
				return errTimeout{bound}
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	})
	return el, err
}

func describeErr(err error) string {
	var te errTimeout
	if errors.As(err, &te) {
		return te.Error()
	}
	return err.Error()
}

func (r *runner) programInitial(ctx context.Context, p *Point, envs []*env, svcs []rules.Service) {
	probes := r.probeSet(svcs)
	stats := map[string]*ProgStat{}
	for _, e := range envs {
		if e.name == ModeFloor {
			continue
		}
		stats[e.name] = &ProgStat{Mode: e.name, InitialResult: "ok"}
	}
	for round := 0; round < r.cfg.Rounds; round++ {
		for _, e := range envs {
			st := stats[e.name]
			if st == nil || e.failed != "" || ctx.Err() != nil {
				continue
			}
			if round > 0 {
				// Repeat only cheap programming: a slow one is measured once.
				if len(st.InitialS) == 0 || st.InitialS[len(st.InitialS)-1] > r.cfg.ProgRepeatMax.Seconds() || time.Now().After(r.dead) {
					continue
				}
				if err := e.m.reset(ctx); err != nil {
					e.failed = "reset: " + describeErr(err)
					continue
				}
			}
			t0 := time.Now()
			err := e.m.program(ctx, svcs)
			var el time.Duration
			if err == nil {
				el, err = waitAnswering(ctx, e.tri.Client, probes, t0, r.loadBound())
			}
			if err != nil {
				st.InitialResult = describeErr(err)
				e.failed = "initial programming: " + st.InitialResult
				r.log.Warn("programming failed", "mode", e.name, "services", p.Services, "err", err, "agent_log", agentLogTail(e.m))
				continue
			}
			if el > r.cfg.ProgTimeout {
				// Over the bound: record it as such, but the rules are in,
				// so the connection figures can still be taken.
				st.InitialResult = errTimeout{r.cfg.ProgTimeout}.Error()
				st.LoadedAfterS = el.Seconds()
				r.log.Warn("programming over its bound", "mode", e.name, "services", p.Services, "seconds", el.Seconds())
				continue
			}
			st.InitialS = append(st.InitialS, el.Seconds())
			start := sourceReady(e.m, t0)
			st.InitialFromStartS = append(st.InitialFromStartS, (el - start.Sub(t0)).Seconds())
			recordSync(e.m, start, &st.InitialSourceS, &st.InitialApplyS)
			r.log.Info("programmed", "mode", e.name, "services", p.Services, "seconds", el.Seconds())
		}
	}
	for _, e := range envs {
		if st := stats[e.name]; st != nil {
			st.Initial = testutil.SpreadOf(st.InitialS)
			p.Prog = append(p.Prog, *st)
		}
	}
}

// recordSync appends, for the sluice mode, the manifest source's and the
// reconciler's shares of the first sync after t0 (from the agent's log).
func recordSync(m mode, t0 time.Time, source, apply *[]float64) {
	if sm, ok := m.(*sluiceMode); ok {
		if src, app, ok := sm.lastSync(t0); ok {
			*source = append(*source, src)
			*apply = append(*apply, app)
		}
	}
}

func (r *runner) updates(ctx context.Context, p *Point, envs []*env, svcs []rules.Service) {
	cur := rules.Clone(svcs)
	idx := map[string]int{}
	for i := range p.Prog {
		idx[p.Prog[i].Mode] = i
		if p.Prog[i].UpdateResult == "" {
			p.Prog[i].UpdateResult = "ok"
			if p.Prog[i].InitialResult != "ok" && p.Prog[i].LoadedAfterS == 0 {
				p.Prog[i].UpdateResult = "not run: no initial load"
			}
		}
	}
	for round := 0; round < r.cfg.Rounds && !time.Now().After(r.dead); round++ {
		k := r.rng.IntN(len(cur))
		next := rules.Clone(cur)
		spare := r.fam.SpareBackend(p.Services%1000*16 + round)
		next[k].Endpoints[0] = spare
		for _, e := range envs {
			i, ok := idx[e.name]
			if !ok || e.failed != "" || ctx.Err() != nil {
				continue
			}
			st := &p.Prog[i]
			t0 := time.Now()
			err := e.m.update(ctx, next, cur[k], next[k])
			var el time.Duration
			if err == nil {
				el, err = waitBackend(ctx, e.tri.Client, next[k].VIPPort(), spare.Addr(), t0, r.cfg.ProgTimeout)
			}
			if err != nil {
				st.UpdateResult = describeErr(err)
				e.failed = "update: " + st.UpdateResult
				continue
			}
			st.UpdateS = append(st.UpdateS, el.Seconds())
			ready := sourceReady(e.m, t0)
			st.UpdateFromWriteS = append(st.UpdateFromWriteS, (el - ready.Sub(t0)).Seconds())
			recordSync(e.m, ready, &st.UpdateSourceS, &st.UpdateApplyS)
		}
		cur = next
	}
	for i := range p.Prog {
		p.Prog[i].Update = testutil.SpreadOf(p.Prog[i].UpdateS)
	}
}

func (r *runner) connections(ctx context.Context, p *Point, envs []*env, svcs []rules.Service) {
	type key struct{ layer, target, mode string }
	stats := map[key]*ConnStat{}
	var order []key
	last := svcs[len(svcs)-1]
	vips := func(target string) []string {
		if target == "last" {
			return []string{last.VIPPort().String()}
		}
		out := make([]string, len(svcs))
		for i, s := range svcs {
			out[i] = s.VIPPort().String()
		}
		return out
	}
	direct := func(target string) []string {
		if target == "last" {
			var out []string
			for _, ep := range last.Endpoints {
				out = append(out, ep.String())
			}
			return out
		}
		out := make([]string, len(svcs))
		for i, s := range svcs {
			out[i] = s.Endpoints[r.rng.IntN(len(s.Endpoints))].String()
		}
		return out
	}
	if r.cfg.BPFStats {
		stats, err := enableBPFStats()
		if err != nil {
			r.note("BENCH_BPF_STATS: " + err.Error())
		} else {
			defer stats.Close()
			r.note("BPF run-time statistics on during the load runs (BENCH_BPF_STATS): every program run pays two clock reads the floor does not")
		}
	}
	for round := 0; round < r.cfg.Rounds; round++ {
		for _, layer := range []string{"packet", "socket"} {
			for _, target := range []string{"random", "last"} {
				// A B C, then C B A: drift in the machine's load hits every
				// mode alike over a pair of rounds.
				seq := slices.Clone(envs)
				if round%2 == 1 {
					slices.Reverse(seq)
				}
				for _, e := range seq {
					if e.failed != "" || ctx.Err() != nil || time.Now().After(r.dead.Add(r.cfg.RunTime*10)) {
						continue
					}
					k := key{layer, target, e.name}
					st := stats[k]
					if st == nil {
						st = &ConnStat{Layer: layer, Target: target, Mode: e.name}
						stats[k] = st
						order = append(order, k)
					}
					cc := load.ClientConfig{
						Workers:  r.cfg.Workers,
						Duration: r.cfg.RunTime,
						MaxConns: r.cfg.MaxConns,
					}
					if e.name == ModeFloor {
						cc.Targets = direct(target)
					} else {
						cc.Targets = vips(target)
					}
					ns, cg := e.tri.Client, (*topology.Cgroup)(nil)
					if layer == "packet" {
						cc.Sources = ClientSourceAddrs(r.fam)
					} else {
						ns, cg = e.tri.Node, e.m.socketCgroup()
					}
					pid, before := r.progCounters(e)
					rec := r.startPerf(ctx, p.Services, layer, target, e.name, round)
					cpu0 := r.snapCPU(e)
					res, ps, err := r.runClient(ctx, ns, cg, cc)
					cpu := r.cpuCost(e, cpu0, ps, res.Conns)
					rec.stop(res.Conns)
					if err != nil {
						res.Errors++
						res.FirstError = err.Error()
					}
					st.Rounds = append(st.Rounds, res)
					st.CPURounds = append(st.CPURounds, cpu)
					if before != nil {
						if after, err := agentProgCounters(pid); err == nil {
							st.ProgRounds = append(st.ProgRounds, progCosts(before, after, res.Conns))
						}
					}
					if n, ok := conntrackCount(e.tri.Node); ok && n > p.ConntrackPeak[e.name] {
						if p.ConntrackPeak == nil {
							p.ConntrackPeak = map[string]int{}
						}
						p.ConntrackPeak[e.name] = n
					}
					var cpuUs float64
					if cpu != nil {
						cpuUs = cpu.TotalUs
					}
					r.log.Info("conns", "services", p.Services, "layer", layer, "target", target, "mode", e.name,
						"conns_per_s", int(res.ConnsPerS), "p50_us", int(res.P50us), "p99_us", int(res.P99us), "cpu_us_per_conn", cpuUs, "errors", res.Errors)
				}
			}
		}
	}
	for _, k := range order {
		st := stats[k]
		var cps, p50, p99, rc, rp []float64
		floor := stats[key{k.layer, k.target, ModeFloor}]
		for i, rr := range st.Rounds {
			st.Errors += rr.Errors
			if rr.Conns == 0 {
				continue
			}
			cps = append(cps, rr.ConnsPerS)
			p50 = append(p50, rr.P50us)
			p99 = append(p99, rr.P99us)
			if floor != nil && i < len(floor.Rounds) && floor.Rounds[i].Conns > 0 {
				rc = append(rc, rr.ConnsPerS/floor.Rounds[i].ConnsPerS)
				rp = append(rp, rr.P99us/floor.Rounds[i].P99us)
			}
		}
		st.ConnsPerS, st.P50us, st.P99us = testutil.SpreadOf(cps), testutil.SpreadOf(p50), testutil.SpreadOf(p99)
		if floor != nil {
			st.cpuRatios(floor)
		}
		st.Prog = medianProgCosts(st.ProgRounds)
		st.RatioConnsPerS, st.RatioP99 = testutil.Median(rc), testutil.Median(rp)
		st.RatioSpread = testutil.SpreadOf(rc)
		p.Conn = append(p.Conn, *st)
	}
}

// progCounters is the agent's pid and its programs' counters, for a
// sluice mode's load run under BENCH_BPF_STATS; nil otherwise.
func (r *runner) progCounters(e *env) (int, progCounters) {
	sm, ok := e.m.(*sluiceMode)
	if !r.cfg.BPFStats || !ok || sm.agent == nil || sm.agent.Pid() == 0 {
		return 0, nil
	}
	c, err := agentProgCounters(sm.agent.Pid())
	if err != nil {
		r.note("BENCH_BPF_STATS: " + err.Error())
		return 0, nil
	}
	return sm.agent.Pid(), c
}

// conntrackCount reads the node namespace's conntrack entry count; false
// where conntrack is not in use there.
func conntrackCount(ns *topology.NS) (int, bool) {
	var n int
	err := ns.Do(func() error {
		b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_count")
		if err != nil {
			return err
		}
		n, err = strconv.Atoi(strings.TrimSpace(string(b)))
		return err
	})
	return n, err == nil && n > 0
}

// sweep connects once to every service from ns, giving up after 20
// failures; it returns the failures and the first error.
func sweep(ctx context.Context, ns *topology.NS, svcs []rules.Service) (bad int, first string) {
	err := ns.Do(func() error {
		for _, s := range svcs {
			if ctx.Err() != nil || bad >= 20 {
				break
			}
			err := load.Ping(s.VIPPort(), time.Second)
			if err != nil && load.Ping(s.VIPPort(), time.Second) != nil { // one retry: a lost SYN is not a missing service
				bad++
				if first == "" {
					first = fmt.Sprintf("%s: %v", s.VIPPort(), err)
				}
			}
		}
		return nil
	})
	if err != nil {
		return len(svcs), err.Error()
	}
	return bad, first
}
