// Command bench measures Sluice against kube-proxy-shaped iptables (nft and
// legacy backends) and nftables rules, and against a direct connection to the
// backend, at several service counts (issue #5). Run it as root:
//
//	BENCH_SERVICES=100,1000 go run ./test/bench
//
// It writes test/bench/results/<date>.json, <date>.md and PNG plots. See
// test/bench/README.md for every knob; BENCH_TIME_LIMIT bounds the run.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluice-lb/sluice/test/bench/harness"
	"github.com/sluice-lb/sluice/test/bench/load"
	"github.com/sluice-lb/sluice/test/bench/report"
)

func main() {
	load.ChildMain() // the benchmark's own children (servers, clients) exit here
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
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
	if res != nil {
		files, err := report.Write(cfg.OutDir, cfg.Stamp, res)
		if err != nil {
			log.Error("report", "err", err)
			os.Exit(1)
		}
		for _, f := range files {
			fmt.Println(f)
		}
	}
	if runErr != nil {
		log.Error("run", "err", runErr)
		os.Exit(1)
	}
}
