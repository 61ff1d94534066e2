// Command start measures the agent's start through the manifest source: the
// CPU and the memory it takes from its start to the end of its first sync
// (the first load and the first apply of N Services from empty), and the
// collector's part of it, for one or more builds or settings of the agent
// started in turn (interleaved, the order reversed every other round).
//
// The kube-proxy benchmark (../kubeproxy) measures the Kubernetes source's
// start against a real apiserver; the main benchmark (..) measures the
// manifest source's start in wall time and memory, between its load runs,
// but not its CPU. This one does the start alone, many times: per start it
// reads the agent's utime+stime (/proc/<pid>/stat) as soon as its log says
// its first sync is done ("desired state applied", logged just after the
// sync's observers ran), its VmHWM then, and its VmHWM again once the
// dry-run programs are loaded (the start's last step; its peak is the
// largest of the two), and with GODEBUG=gctrace=1 in the agent's
// environment it counts the collections whose trace came before that line
// and sums their CPU (assist + background + idle marking, the trace's "ms
// cpu" fields).
//
//	go build -o /tmp/startbench ./test/bench/start
//	BENCH_START_MODES='main=/tmp/sluice-main; cand=/tmp/sluice SOME_ENV=1 --some-flag=x' \
//	  BENCH_SERVICES=30000 BENCH_ROUNDS=8 /tmp/startbench
//
// BENCH_START_MODES: modes separated by ';', each "name=binary" followed by
// words that are the agent's environment (NAME=value) or more flags (-...).
// The agent runs in a network namespace of its own with a veth (its
// --devices), a cgroup for its socket programs and a bpffs of its own, with
// the main benchmark's flags (harness.AgentArgs); `sluice cleanup` runs
// after each start. The results (every start, and per mode the medians)
// are printed and written as JSON to BENCH_OUT (test/bench/results) as
// start-<date>.json.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/test/bench/harness"
	"github.com/sluice-lb/sluice/test/bench/rules"
)

type mode struct {
	Name string   `json:"name"`
	Bin  string   `json:"bin"`
	Env  []string `json:"env,omitempty"`
	Args []string `json:"args,omitempty"`
}

// start is what one start of one mode measured.
type start struct {
	Mode  string `json:"mode"`
	Round int    `json:"round"`
	// FirstSyncS is from the process's start to the first sync's log line.
	FirstSyncS float64 `json:"first_sync_s"`
	// CPUS is utime+stime at the first sync's line; UserS and SysS its parts.
	CPUS  float64 `json:"cpu_s"`
	UserS float64 `json:"user_s"`
	SysS  float64 `json:"sys_s"`
	// HWMSyncMiB is VmHWM at the first sync, HWMMiB after the dry-run load
	// (the start's peak).
	HWMSyncMiB float64 `json:"vmhwm_sync_mib"`
	HWMMiB     float64 `json:"vmhwm_mib"`
	// GCs and GCCPUS are the collections traced before the first sync's
	// line and their CPU (0 without gctrace); GCForced of them forced.
	// WorkS is the CPU from the datapath's attach ("tc programs attached",
	// logged before the source starts) to the first sync: the source's
	// first load and the first apply, without the programs' load (the
	// verifier's time, the largest and noisiest part of CPUS); WorkUserS
	// its user part.
	WorkS     float64 `json:"work_cpu_s"`
	WorkUserS float64 `json:"work_user_s"`
	GCs       int     `json:"gcs"`
	GCForced  int     `json:"gcs_forced"`
	GCCPUS    float64 `json:"gc_cpu_s"`
	// HeapMB sums each collection's heap at its start (the trace's first
	// MB figure), MarkedMB what each found live (the third): the bytes
	// marked; LiveMB is the last collection's live heap.
	HeapMB   float64 `json:"heap_at_gc_start_mb"`
	MarkedMB float64 `json:"marked_mb"`
	LiveMB   float64 `json:"last_live_mb"`
	Load1    float64 `json:"load1"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "start:", err)
		os.Exit(1)
	}
}

func envInt(name string, def int) (int, error) {
	v := os.Getenv(name)
	if v == "" {
		return def, nil
	}
	return strconv.Atoi(v)
}

func parseModes(s string) ([]mode, error) {
	var modes []mode
	for _, part := range strings.Split(s, ";") {
		words := strings.Fields(part)
		if len(words) == 0 {
			continue
		}
		name, bin, ok := strings.Cut(words[0], "=")
		if !ok || name == "" || bin == "" {
			return nil, fmt.Errorf("BENCH_START_MODES: %q is not name=binary", words[0])
		}
		m := mode{Name: name, Bin: bin}
		for _, w := range words[1:] {
			switch {
			case strings.HasPrefix(w, "-"):
				m.Args = append(m.Args, w)
			case strings.Contains(w, "="):
				m.Env = append(m.Env, w)
			default:
				return nil, fmt.Errorf("BENCH_START_MODES: %q is neither NAME=value nor a flag", w)
			}
		}
		modes = append(modes, m)
	}
	if len(modes) == 0 {
		return nil, errors.New("BENCH_START_MODES: no mode")
	}
	return modes, nil
}

func run() error {
	modes, err := parseModes(os.Getenv("BENCH_START_MODES"))
	if err != nil {
		return err
	}
	n, err := envInt("BENCH_SERVICES", 30000)
	if err != nil {
		return err
	}
	eps, err := envInt("BENCH_ENDPOINTS", 10)
	if err != nil {
		return err
	}
	rounds, err := envInt("BENCH_ROUNDS", 8)
	if err != nil {
		return err
	}
	out := os.Getenv("BENCH_OUT")
	if out == "" {
		out = "test/bench/results"
	}
	logDir := os.Getenv("BENCH_LOG_DIR")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	topo, err := topology.New()
	if err != nil {
		return err
	}
	defer topo.Close()
	node, err := topo.AddNS("start-n")
	if err != nil {
		return err
	}
	peer, err := topo.AddNS("start-p")
	if err != nil {
		return err
	}
	if err := topo.Veth(node, harness.NodeClientDev, peer, "p0"); err != nil {
		return err
	}
	for _, x := range []struct {
		ns   *topology.NS
		dev  string
		addr string
	}{{node, harness.NodeClientDev, "10.64.1.1/24"}, {peer, "p0", "10.64.1.2/24"}} {
		if err := x.ns.LinkUp(x.dev); err != nil {
			return err
		}
		if err := x.ns.AddAddr(x.dev, netip.MustParsePrefix(x.addr)); err != nil {
			return err
		}
	}
	mnt, err := datapath.CgroupV2Mount()
	if err != nil {
		return err
	}
	cg, err := topo.AddCgroup(mnt, "start")
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "sl-start-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	bpffs := filepath.Join(dir, "bpffs")
	if err := os.MkdirAll(bpffs, 0o755); err != nil {
		return err
	}
	if err := syscall.Mount("bpf", bpffs, "bpf", 0, ""); err != nil {
		return fmt.Errorf("mount bpffs: %w", err)
	}
	defer func() { _ = syscall.Unmount(bpffs, syscall.MNT_DETACH) }()

	svcs, err := rules.IPv4.Layout(n, eps)
	if err != nil {
		return err
	}
	manifest := filepath.Join(dir, "services.json")
	if err := harness.WriteManifest(manifest, rules.IPv4, svcs); err != nil {
		return err
	}
	agentArgs := harness.AgentArgs(svcs)

	var all []start
	for r := range rounds {
		order := slices.Clone(modes)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, m := range order {
			if ctx.Err() != nil {
				break
			}
			a := agentproc.NewAgent(agentproc.Binaries{Sluice: m.Bin}, node, agentproc.AgentConfig{
				Manifests: manifest,
				Devices:   []string{harness.NodeClientDev},
				Cgroup:    cg.Path,
				BPFFS:     bpffs,
				Extra:     append(slices.Clone(agentArgs), m.Args...),
			})
			a.Env = m.Env
			st, err := measure(ctx, a)
			stopErr := a.Stop()
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			uerr := a.Uninstall(cctx)
			cancel()
			if err != nil {
				return fmt.Errorf("%s round %d: %w\n%s", m.Name, r, err, testutil.LastLines(a.Log.String(), 20))
			}
			if stopErr != nil || uerr != nil {
				return fmt.Errorf("%s round %d: stop: %v; cleanup: %v", m.Name, r, stopErr, uerr)
			}
			st.Mode, st.Round = m.Name, r
			if logDir != "" {
				if err := os.WriteFile(filepath.Join(logDir, fmt.Sprintf("%s-r%d.log", m.Name, r)), []byte(a.Log.String()), 0o644); err != nil {
					return err
				}
			}
			fmt.Printf("%-10s r%d first sync %5.2f s  CPU %.3f s (user %.3f sys %.3f; after attach %.3f, user %.3f)  VmHWM %.1f MiB (at sync %.1f)  GCs %d (%d forced) %.3f s CPU, heap at their starts %.0f MB, marked %.0f MB, last live %.0f MB  load %.1f\n",
				st.Mode, st.Round, st.FirstSyncS, st.CPUS, st.UserS, st.SysS, st.WorkS, st.WorkUserS, st.HWMMiB, st.HWMSyncMiB, st.GCs, st.GCForced, st.GCCPUS, st.HeapMB, st.MarkedMB, st.LiveMB, st.Load1)
			all = append(all, st)
		}
	}
	summary(modes, all)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	name := filepath.Join(out, "start-"+time.Now().UTC().Format("2006-01-02T150405Z")+".json")
	data, err := json.MarshalIndent(map[string]any{"services": n, "endpoints": eps, "rounds": rounds, "modes": modes, "starts": all}, "", "  ")
	if err != nil {
		return err
	}
	fmt.Println("written:", name)
	return os.WriteFile(name, data, 0o644)
}

// measure starts a and waits for its first sync and its dry-run load.
func measure(ctx context.Context, a *agentproc.Agent) (start, error) {
	var st start
	t0 := time.Now()
	if err := a.Start(); err != nil {
		return st, err
	}
	pid := a.Pid()
	deadline := time.Now().Add(5 * time.Minute)
	var attached *proc
	for {
		if err := a.Exited(); err != nil {
			return st, err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return st, errors.New("no first sync")
		}
		// Read the process first, then the log: the figures are at
		// most one poll after the line.
		ps, err := readProc(pid)
		if err != nil {
			return st, err
		}
		log := a.Log.String()
		if attached == nil && strings.Contains(log, `msg="tc programs attached"`) {
			attached = &ps
		}
		if i := strings.Index(log, `msg="desired state applied"`); i >= 0 {
			if attached == nil {
				return st, errors.New(`no "tc programs attached" line before the first sync`)
			}
			st.WorkS = ps.user + ps.sys - attached.user - attached.sys
			st.WorkUserS = ps.user - attached.user
			st.FirstSyncS = time.Since(t0).Seconds()
			st.UserS, st.SysS, st.CPUS = ps.user, ps.sys, ps.user+ps.sys
			st.HWMSyncMiB = ps.hwm
			gcTrace(log[:i], &st)
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if err := a.Exited(); err != nil {
			return st, err
		}
		log := a.Log.String()
		if strings.Contains(log, "dry-run programs loaded") || strings.Contains(log, "dry-run programs not loaded") || time.Now().After(deadline) {
			break
		}
	}
	time.Sleep(time.Second) // the FreeOSMemory after it
	ps, err := readProc(pid)
	if err != nil {
		return st, err
	}
	st.HWMMiB = ps.hwm
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		st.Load1, _ = strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	}
	return st, nil
}

// gc 12 @1.234s 5%: 0.02+45+0.01 ms clock, 0.05+10/40/5+0.02 ms cpu, 80->82->73 MB, 145 MB goal, ...
var gcLine = regexp.MustCompile(`gc \d+ @[0-9.]+s \d+%: [0-9.+]+ ms clock, ([0-9.]+)\+([0-9.]+)/([0-9.]+)/([0-9.]+)\+([0-9.]+) ms cpu, ([0-9]+)->([0-9]+)->([0-9]+) MB`)

func gcTrace(log string, st *start) {
	for _, l := range strings.Split(log, "\n") {
		m := gcLine.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		st.GCs++
		if strings.Contains(l, "(forced)") {
			st.GCForced++
		}
		for _, f := range m[1:6] {
			v, _ := strconv.ParseFloat(f, 64)
			st.GCCPUS += v / 1000
		}
		heap, _ := strconv.ParseFloat(m[6], 64)
		live, _ := strconv.ParseFloat(m[8], 64)
		st.HeapMB += heap
		st.MarkedMB += live
		st.LiveMB = live
	}
}

type proc struct{ user, sys, hwm float64 }

// readProc reads utime and stime (s) from /proc/<pid>/stat and VmHWM
// (MiB) from its status.
func readProc(pid int) (proc, error) {
	var p proc
	t, err := testutil.ReadProcTicks(pid)
	if err != nil {
		return p, err
	}
	p.user, p.sys = t.UTime/testutil.ClockTicks, t.STime/testutil.ClockTicks
	vm, err := testutil.ReadProcStatusKB(pid, "VmHWM")
	if err != nil {
		return p, err
	}
	p.hwm = float64(vm["VmHWM"]) / 1024
	return p, nil
}

// summary prints per mode the medians [min-max], and against the first
// mode the per-round ratios of the CPU to the first sync.
func summary(modes []mode, all []start) {
	by := map[string]map[int]start{}
	for _, s := range all {
		if by[s.Mode] == nil {
			by[s.Mode] = map[int]start{}
		}
		by[s.Mode][s.Round] = s
	}
	span := func(v []float64) string {
		if len(v) == 0 {
			return "-"
		}
		return fmt.Sprintf("%.3f [%.3f-%.3f]", testutil.Median(v), slices.Min(v), slices.Max(v))
	}
	base := modes[0].Name
	for _, m := range modes {
		var cpu, hwm, gcs, gccpu, ratio []float64
		for r, s := range by[m.Name] {
			cpu, hwm, gcs, gccpu = append(cpu, s.CPUS), append(hwm, s.HWMMiB), append(gcs, float64(s.GCs)), append(gccpu, s.GCCPUS)
			if b, ok := by[base][r]; ok && m.Name != base {
				ratio = append(ratio, s.CPUS/b.CPUS)
			}
		}
		fmt.Printf("%-10s starts %d  CPU to first sync %s s  VmHWM %s MiB (max %.1f)  GCs %s  GC CPU %s s", m.Name, len(cpu), span(cpu), span(hwm), slices.Max(append(hwm, 0)), span(gcs), span(gccpu))
		if len(ratio) > 0 {
			fmt.Printf("  CPU / %s per round %s", base, span(ratio))
		}
		fmt.Println()
	}
}
