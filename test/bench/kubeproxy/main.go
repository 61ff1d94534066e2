// Command kubeproxy measures the control plane of the real kube-proxy
// (iptables and nftables modes, the v1.36.3 that test/kube/tools builds)
// beside Sluice's agent (`sluice --kubeconfig`), all three against one real
// kube-apiserver and etcd holding N ClusterIP Services of E endpoints each
// (issue 14). Run it as root from the module root:
//
//	go run ./test/bench/kubeproxy                       # N = 1000,10000,30000
//	BENCH_SERVICES=1000 BENCH_ROUNDS=3 go run ./test/bench/kubeproxy
//
// The control plane runs in a network namespace of its own. For every N
// and every round, each mode in turn (interleaved: A B C, A B C, ...)
// gets a fresh network namespace joined to the control plane's by a veth
// pair, so no mode ever sees another's rules, and is measured from its
// process start to its exit:
//
//   - first full sync: from the process's start until the end of its first
//     successful sync, which is kubeproxy_sync_proxy_rules_last_timestamp_seconds
//     (ip_family IPv4) the first time it is set. kube-proxy and Sluice both
//     export it under that name, and neither syncs before its Service and
//     EndpointSlice informers have synced, so the first sync programs all N
//     Services; the run checks that afterwards from the mode's own state
//     (KUBE-SVC jumps in KUBE-SERVICES, elements of the service-ips map,
//     sluice_services).
//   - network programming latency of single EndpointSlice changes: one
//     endpoint address of one Service's slice is patched, with a fresh
//     endpoints.kubernetes.io/last-change-trigger-time as the EndpointSlice
//     controller would set, and the latency is what the mode itself records
//     in kubeproxy_network_programming_duration_seconds (the difference of
//     its _sum over the difference of its _count, so the histogram's coarse
//     buckets do not round it). A change is sent only once the previous one
//     was recorded and the mode's last sync ended at least
//     BENCH_CHANGE_GAP before, so that no change waits out the min sync
//     period (1 s in all three modes, their default) behind the previous.
//   - memory under steady change (BENCH_STEADY_RATE for
//     BENCH_STEADY_DURATION, off by default): changes one after another at
//     a steady rate, after the others; see steadyChanges.
//   - memory and CPU: VmRSS and VmHWM sampled every 2 s from the start to
//     the end (memSample), VmRSS after the first sync and at the end, VmHWM (the
//     peak) at the end, and CPU seconds from /proc/<pid>/stat, the
//     process's own and with the children it waited for (kube-proxy runs
//     iptables-restore and nft as children: their work is its work).
//
// Every mode runs with its defaults besides what it needs to run in a
// namespace (the kubeconfig, the Node's name, addresses on the namespace's
// loopback, conntrack left alone). BENCH_TIME_LIMIT (or Ctrl-C) stops the
// run; what was measured by then is written. Figures are medians over rounds with
// their min-max spread, and ratios are medians of per-round ratios to
// Sluice in the same round. It writes
// test/bench/results/kubeproxy-<date>.json and .md, and plots of the
// summary's figures over N, kubeproxy-<date>-<figure>.png;
// `go run ./test/bench/kubeproxy plot <kubeproxy-<date>.json>...` draws
// the plots of a recorded run.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-lb/sluice/test/bench/harness"
)

// Mode names.
const (
	modeIptables = "kube-proxy-iptables"
	modeNftables = "kube-proxy-nftables"
	modeSluice   = "sluice"
	// modeSluiceBase is another build of the agent (BENCH_SLUICE_BASE,
	// e.g. main's), run like Sluice and interleaved with it, so that a
	// change is measured against what it changes in the same rounds.
	modeSluiceBase = "sluice-base"
)

var allModes = []string{modeIptables, modeNftables, modeSluice}

// config is what a run does; ConfigFromEnv reads it from BENCH_* variables.
type config struct {
	Services  []int         `json:"services"`
	Endpoints int           `json:"endpoints_per_service"`
	Modes     []string      `json:"modes"`
	Rounds    int           `json:"rounds"`
	Changes   int           `json:"changes_per_mode_and_round"`
	ChangeGap time.Duration `json:"change_gap_ns"`
	// SyncTimeout bounds a mode's first sync, ChangeTimeout one change.
	SyncTimeout   time.Duration `json:"sync_timeout_ns"`
	ChangeTimeout time.Duration `json:"change_timeout_ns"`
	// TimeLimit bounds the whole run: what was measured by then is
	// written, the rest recorded as skipped.
	TimeLimit time.Duration `json:"time_limit_ns"`
	OutDir    string        `json:"-"`
	// LogDir, if set (BENCH_LOG_DIR), keeps each mode's log there as
	// <N>-<mode>-r<round>.log.
	LogDir string `json:"-"`
	// SluiceBase is the agent binary mode sluice-base runs.
	SluiceBase string `json:"sluice_base,omitempty"`
	// SluiceArgs are added to both agent modes' command lines
	// (BENCH_SLUICE_ARGS, split at spaces), e.g. a --max-backends that
	// holds N x E.
	SluiceArgs []string `json:"sluice_args,omitempty"`
	// SluiceEnv is added to both agent modes' environment
	// (BENCH_SLUICE_ENV, NAME=value split at spaces), e.g.
	// GODEBUG=gctrace=1, which the harness's own environment would also
	// give the apiserver and etcd.
	SluiceEnv []string `json:"sluice_env,omitempty"`
	// Populate is how the Services are made: "etcd" (the first through
	// the API, the rest copies of it written to etcd: seconds) or "api"
	// (every one through the API: most of an hour at 30,000).
	Populate string `json:"populate"`
	// CPUChanges, if not 0, is K for the CPU blocks per mode and round
	// after the latency changes (cpuBlocks): blocks of CPUBlock changes
	// CPUGap apart, each followed by as long without.
	CPUChanges int           `json:"cpu_changes,omitempty"`
	CPUBlock   int           `json:"cpu_block,omitempty"`
	CPUGap     time.Duration `json:"cpu_gap_ns,omitempty"`
	// SteadyRate, if not 0, sends changes at that rate a second for
	// SteadyFor per mode and round, after the others (steadyChanges).
	SteadyRate float64       `json:"steady_rate,omitempty"`
	SteadyFor  time.Duration `json:"steady_for_ns,omitempty"`
	Stamp      string        `json:"stamp"`
}

// configFromEnv reads the BENCH_* knobs (see README.md).
func configFromEnv() (config, error) {
	cfg := config{Endpoints: 10, Rounds: 3, Changes: 10, ChangeGap: 1200 * time.Millisecond,
		SyncTimeout: 15 * time.Minute, ChangeTimeout: 3 * time.Minute, Populate: "etcd", CPUBlock: 20, CPUGap: 1200 * time.Millisecond, TimeLimit: 2 * time.Hour, OutDir: "test/bench/results",
		Modes: allModes, Stamp: time.Now().UTC().Format("2006-01-02T150405Z")}
	services := "1000,10000,30000"
	if v := os.Getenv("BENCH_SERVICES"); v != "" {
		services = v
	}
	for _, s := range strings.Split(services, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return cfg, fmt.Errorf("BENCH_SERVICES=%q: want positive counts", services)
		}
		cfg.Services = append(cfg.Services, n)
	}
	for _, x := range []struct {
		env string
		dst *int
	}{{"BENCH_ENDPOINTS", &cfg.Endpoints}, {"BENCH_ROUNDS", &cfg.Rounds}, {"BENCH_CHANGES", &cfg.Changes}, {"BENCH_CPU_CHANGES", &cfg.CPUChanges}, {"BENCH_CPU_BLOCK", &cfg.CPUBlock}} {
		if v := os.Getenv(x.env); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return cfg, fmt.Errorf("%s=%q: want a positive count", x.env, v)
			}
			*x.dst = n
		}
	}
	for _, x := range []struct {
		env string
		dst *time.Duration
	}{{"BENCH_CHANGE_GAP", &cfg.ChangeGap}, {"BENCH_CPU_GAP", &cfg.CPUGap}, {"BENCH_STEADY_DURATION", &cfg.SteadyFor}, {"BENCH_SYNC_TIMEOUT", &cfg.SyncTimeout}, {"BENCH_CHANGE_TIMEOUT", &cfg.ChangeTimeout}, {"BENCH_TIME_LIMIT", &cfg.TimeLimit}} {
		if v := os.Getenv(x.env); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d < 0 {
				return cfg, fmt.Errorf("%s=%q: want a duration", x.env, v)
			}
			*x.dst = d
		}
	}
	if v := os.Getenv("BENCH_STEADY_RATE"); v != "" {
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || r <= 0 || r > 1000 {
			return cfg, fmt.Errorf("BENCH_STEADY_RATE=%q: want changes a second, above 0 and at most 1000", v)
		}
		cfg.SteadyRate = r
	}
	if (cfg.SteadyRate > 0) != (cfg.SteadyFor > 0) {
		return cfg, fmt.Errorf("BENCH_STEADY_RATE and BENCH_STEADY_DURATION go together")
	}
	if v := os.Getenv("BENCH_KUBE_MODES"); v != "" {
		cfg.Modes = nil
		for _, m := range strings.Split(v, ",") {
			m = strings.TrimSpace(m)
			if !slices.Contains(allModes, m) && m != modeSluiceBase {
				return cfg, fmt.Errorf("BENCH_KUBE_MODES: unknown mode %q (want %s)", m, strings.Join(allModes, ", "))
			}
			cfg.Modes = append(cfg.Modes, m)
		}
	}
	cfg.SluiceBase = os.Getenv("BENCH_SLUICE_BASE")
	if slices.Contains(cfg.Modes, modeSluiceBase) != (cfg.SluiceBase != "") {
		return cfg, fmt.Errorf("mode %s and BENCH_SLUICE_BASE (its agent binary) go together", modeSluiceBase)
	}
	cfg.LogDir = os.Getenv("BENCH_LOG_DIR")
	cfg.SluiceArgs = strings.Fields(os.Getenv("BENCH_SLUICE_ARGS"))
	cfg.SluiceEnv = strings.Fields(os.Getenv("BENCH_SLUICE_ENV"))
	for _, kv := range cfg.SluiceEnv {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return cfg, fmt.Errorf("BENCH_SLUICE_ENV: %q is not NAME=value", kv)
		}
	}
	if v := os.Getenv("BENCH_POPULATE"); v != "" {
		if v != "etcd" && v != "api" {
			return cfg, fmt.Errorf("BENCH_POPULATE=%q: want etcd or api", v)
		}
		cfg.Populate = v
	}
	if v := os.Getenv("BENCH_OUT"); v != "" {
		cfg.OutDir = v
	}
	if cfg.Endpoints > 250 {
		return cfg, fmt.Errorf("BENCH_ENDPOINTS=%d: at most 250", cfg.Endpoints)
	}
	return cfg, nil
}

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if len(os.Args) > 1 && os.Args[1] == "plot" {
		files, err := plotRecorded(os.Args[2:])
		for _, f := range files {
			fmt.Println(f)
		}
		if err != nil {
			log.Error("plot", "err", err)
			os.Exit(1)
		}
		return
	}
	cfg, err := configFromEnv()
	if err != nil {
		log.Error("config", "err", err)
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		log.Error("needs root (network namespaces, BPF, iptables)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, cfg.TimeLimit)
	defer cancel()
	res, runErr := run(ctx, cfg, log)
	var write func() ([]string, error)
	if res != nil {
		write = func() ([]string, error) { return writeReport(cfg.OutDir, cfg.Stamp, res) }
	}
	if code := harness.Finish(log, write, runErr); code != 0 {
		os.Exit(code)
	}
}
