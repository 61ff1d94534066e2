package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/test/bench/harness"
	"github.com/sluice-lb/sluice/test/kube/kubeenv"
)

// run builds what the modes run, starts the control plane and measures
// every N, round and mode. It returns what was measured even when it
// fails part way.
func run(ctx context.Context, cfg config, log *slog.Logger) (*result, error) {
	res := newResult(cfg)
	defer res.Finish()
	var bins binaries
	var err error
	if bins.kubeProxy, err = kubeBinary(ctx, "kube-proxy"); err != nil {
		return nil, err
	}
	binDir, removeBinDir, err := harness.TempDir("sluice-kpbench-", log)
	if err != nil {
		return nil, err
	}
	defer removeBinDir()
	if bins.agent, err = agentproc.Build(ctx, binDir); err != nil {
		return nil, err
	}
	// The pinned binaries are built without version stamps: the pin is
	// their version.
	res.Versions["kube-proxy, kube-apiserver"] = pinnedKubeVersion(ctx)
	res.Versions["sluice"] = version(bins.agent.Sluice, "--version")
	if bins.agentBase = cfg.SluiceBase; bins.agentBase != "" {
		res.Versions[modeSluiceBase] = version(bins.agentBase, "--version")
	}
	bins.agentArgs = cfg.SluiceArgs
	bins.agentEnv = cfg.SluiceEnv
	res.Versions["iptables"] = version("iptables", "--version")
	res.Versions["nft"] = version("nft", "--version")

	logf := func(format string, args ...any) { log.Info(fmt.Sprintf(format, args...)) }
	err = kubeenv.Run(logf, func(t kubeenv.TB) error {
		topo, err := topology.New()
		if err != nil {
			return err
		}
		t.Cleanup(func() {
			if err := topo.Close(); err != nil {
				t.Errorf("control plane namespace: %v", err)
			}
		})
		c, err := startCluster(ctx, t, topo, cfg.Endpoints)
		if err != nil {
			return err
		}
		c.viaAPI = cfg.Populate == "api"
		for _, n := range cfg.Services {
			pt := &point{Services: n, Endpoints: cfg.Endpoints}
			res.Points = append(res.Points, pt)
			if err := ctx.Err(); err != nil {
				pt.Skipped = err.Error()
				continue
			}
			start := time.Now()
			if err := c.grow(ctx, n); err != nil {
				pt.Skipped = err.Error()
				return err
			}
			pt.CreateS = time.Since(start).Seconds()
			log.Info("services created", "n", n, "s", pt.CreateS)
			for round := 1; round <= cfg.Rounds && ctx.Err() == nil; round++ {
				for _, m := range roundOrder(cfg.Modes, round) {
					if ctx.Err() != nil {
						break // stopped: what was measured is written
					}
					r := measure(ctx, cfg, c, bins, m, n, round)
					log.Info("measured", "n", n, "round", round, "mode", m, "first_sync_s", r.FirstSyncS,
						"startup_s", r.StartupS, "caches_s", r.CachesS,
						"latency_median_s", testutil.Median(r.LatencyS), "rss_peak_mib", r.RSSPeakBytes>>20,
						"cpu_s", r.CPUEndS, "errors", len(r.Errors))
					for _, e := range r.Errors {
						log.Warn("error", "n", n, "round", round, "mode", m, "err", e)
					}
					pt.Runs = append(pt.Runs, r)
				}
			}
			pt.finish(cfg.Modes)
		}
		return ctx.Err()
	})
	return res, err
}

// kubeBinary returns the path of a pinned Kubernetes binary, building it
// with test/kube/tools/build.sh if it is missing (kube-proxy: about a
// minute once kube-apiserver's build cache is warm).
func kubeBinary(ctx context.Context, name string) (string, error) {
	root, err := testutil.ModuleRoot(ctx)
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "test", "kube", "tools", "build.sh"), name)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("build %s: %w", name, err)
	}
	return filepath.Join(strings.TrimSpace(string(out)), name), nil
}

// pinnedKubeVersion is the Kubernetes version test/kube/tools/build.sh
// pins.
func pinnedKubeVersion(ctx context.Context) string {
	root, err := testutil.ModuleRoot(ctx)
	if err != nil {
		return "unknown: " + err.Error()
	}
	b, err := os.ReadFile(filepath.Join(root, "test", "kube", "tools", "build.sh"))
	if err != nil {
		return "unknown: " + err.Error()
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "kube_version="); ok {
			return v
		}
	}
	return "unknown"
}

// version is the first line a program prints of its version.
func version(bin string, args ...string) string {
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		return "unknown: " + err.Error()
	}
	return strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0]
}

// roundOrder is the order of the modes in round (from 1): as given in odd
// rounds, reversed in even ones, so that no mode always comes first after
// the Services' creation or the same other mode (the API server's and the
// machine's state after a run is not the same for the next).
func roundOrder(modes []string, round int) []string {
	if round%2 == 1 {
		return modes
	}
	r := slices.Clone(modes)
	slices.Reverse(r)
	return r
}
