// Command bench measures Sluice against kube-proxy-shaped iptables (nft and
// legacy backends) and nftables rules, and against a direct connection to the
// backend, at several service counts (issue #5). Run it as root:
//
//	BENCH_SERVICES=100,1000 go run ./test/bench
//	go run ./test/bench render test/bench/results/<date>.json  # redo .md and plots
//
// It writes test/bench/results/<date>.json, <date>.md and PNG plots. See
// test/bench/README.md for every knob; BENCH_TIME_LIMIT bounds the run.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sluice-lb/sluice/test/bench/harness"
	"github.com/sluice-lb/sluice/test/bench/load"
	"github.com/sluice-lb/sluice/test/bench/report"
)

func main() {
	load.ChildMain() // the benchmark's own children (servers, clients) exit here
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if len(os.Args) == 3 && os.Args[1] == "render" {
		// Re-render the Markdown and plots of an earlier run from its JSON.
		if err := render(os.Args[2]); err != nil {
			log.Error("render", "err", err)
			os.Exit(1)
		}
		return
	}
	cfg, err := harness.ConfigFromEnv()
	if err != nil {
		log.Error("config", "err", err)
		os.Exit(2)
	}
	if cfg.Self, err = os.Executable(); err != nil {
		log.Error("executable", "err", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, runErr := harness.Run(ctx, cfg, log)
	var write func() ([]string, error)
	if res != nil {
		write = func() ([]string, error) { return report.Write(cfg.OutDir, cfg.Stamp, res) }
	}
	if code := harness.Finish(log, write, runErr); code != 0 {
		os.Exit(code)
	}
}

func render(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var res harness.Results
	if err := json.Unmarshal(b, &res); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	files, err := report.Write(filepath.Dir(path), strings.TrimSuffix(filepath.Base(path), ".json"), &res)
	for _, f := range files {
		fmt.Println(f)
	}
	return err
}
