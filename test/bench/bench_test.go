package main

import (
	"context"
	"encoding/json"
	"image/png"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/test/bench/harness"
	"github.com/sluice-lb/sluice/test/bench/load"
	"github.com/sluice-lb/sluice/test/bench/report"
)

func TestMain(m *testing.M) {
	load.ChildMain() // the test binary also serves as server and client child
	os.Exit(agentproc.RunTests(m))
}

// TestQuick runs the whole benchmark at a tiny size (10 services x 2
// endpoints, a few hundred connections per run), over each IP family, and
// checks that every mode really carried connections, programmed and
// updated, and that the report files are written and parse. Over IPv4 it
// also runs mode sluice-base (BENCH_SLUICE_BASE) with the same agent
// binary: it must run like sluice, take its turn in every round, and get
// its table against sluice. It asserts no timings.
func TestQuick(t *testing.T) {
	testutil.Privileged(t)
	testutil.NeedCommands(t, "ip", "nsenter", "iptables-nft-restore", "iptables-legacy-restore",
		"ip6tables-nft-restore", "ip6tables-legacy-restore", "nft")
	for _, fam := range []string{"IPv4", "IPv6"} {
		t.Run(fam, func(t *testing.T) { quick(t, fam) })
	}
}

func quick(t *testing.T, fam string) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := harness.ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Services = []int{10}
	cfg.Endpoints = 2
	cfg.Rounds = 2
	cfg.RunTime = 2 * time.Second
	cfg.MaxConns = 200
	cfg.Workers = 2
	cfg.ProbeSample = 8
	cfg.TestRunCalls = 1000
	cfg.ProgTimeout = 30 * time.Second
	cfg.TimeLimit = 5 * time.Minute
	cfg.OutDir = t.TempDir()
	cfg.Stamp = "quick"
	cfg.Family = fam
	cfg.Self = self
	cfg.SluiceBin = sluiceForTest(t)
	if cfg.SluiceBin == "" {
		cfg.Modes = slices.DeleteFunc(cfg.Modes, func(m string) bool { return m == harness.ModeSluice })
	}
	base := fam == "IPv4" && cfg.SluiceBin != "" // once is enough: about 20 s more
	if base {
		cfg.SluiceBase = cfg.SluiceBin
		cfg.Modes = append(slices.Clone(cfg.Modes), harness.ModeSluiceBase)
	}
	isAgent := func(m string) bool { return m == harness.ModeSluice || m == harness.ModeSluiceBase }

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	w := &testWriter{t: t}
	log := slog.New(slog.NewTextHandler(w, nil))
	res, err := harness.Run(ctx, cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	files, err := report.Write(cfg.OutDir, cfg.Stamp, res)
	if err != nil {
		t.Fatal(err)
	}

	if len(res.Points) != 1 || res.Points[0].Skipped != "" {
		t.Fatalf("point: %+v", res.Points)
	}
	p := res.Points[0]
	for m, why := range p.Failed {
		t.Errorf("mode %s failed: %s", m, why)
	}
	want := append([]string{harness.ModeFloor}, cfg.Modes...)
	if strings.Join(p.Modes, ",") != strings.Join(want, ",") {
		t.Errorf("modes run %v, want %v", p.Modes, want)
	}
	seen := map[string]int{}
	for _, c := range p.Conn {
		seen[c.Mode]++
		for i, r := range c.Rounds {
			if r.Conns == 0 || r.Errors != 0 {
				t.Errorf("%s %s %s round %d: %d connections, %d errors (%s)", c.Layer, c.Target, c.Mode, i, r.Conns, r.Errors, r.FirstError)
			}
		}
		if len(c.Rounds) != cfg.Rounds {
			t.Errorf("%s %s %s: %d rounds, want %d", c.Layer, c.Target, c.Mode, len(c.Rounds), cfg.Rounds)
		}
		// Every run's CPU per connection is read (the client's, the
		// server's: both carry a connection), and held against the
		// floor's of the same round.
		for i, cpu := range c.CPURounds {
			if cpu == nil || cpu.ClientUs <= 0 || cpu.ServerUs <= 0 || cpu.TotalUs < cpu.ClientUs+cpu.ServerUs || cpu.Conns != c.Rounds[i].Conns {
				t.Errorf("%s %s %s round %d: CPU %+v", c.Layer, c.Target, c.Mode, i, cpu)
			}
		}
		if len(c.CPURounds) != cfg.Rounds || c.RatioCPU.Median <= 0 || c.Mode == harness.ModeFloor && c.RatioCPU.Median != 1 {
			t.Errorf("%s %s %s: CPU of %d rounds, ratio to the floor %+v", c.Layer, c.Target, c.Mode, len(c.CPURounds), c.RatioCPU)
		}
	}
	for _, m := range p.Modes {
		if seen[m] != 4 { // 2 layers x 2 targets
			t.Errorf("mode %s measured in %d layer/target combinations, want 4", m, seen[m])
		}
	}
	// The load runs in the order they ran (the harness's log): every mode,
	// sluice-base too, takes its turn for each layer and target of every
	// round, in the order of p.Modes and reversed in odd rounds.
	var order []string
	for _, s := range w.conns {
		order = append(order, strings.Join(s, " "))
	}
	var wantOrder []string
	for round := range cfg.Rounds {
		seq := slices.Clone(p.Modes)
		if round%2 == 1 {
			slices.Reverse(seq)
		}
		for _, layer := range []string{"packet", "socket"} {
			for _, target := range []string{"random", "last"} {
				for _, m := range seq {
					wantOrder = append(wantOrder, layer+" "+target+" "+m)
				}
			}
		}
	}
	if !slices.Equal(order, wantOrder) {
		t.Errorf("load runs in the order\n%s\nwant\n%s", strings.Join(order, "\n"), strings.Join(wantOrder, "\n"))
	}
	for _, ps := range p.Prog {
		if ps.InitialResult != "ok" || len(ps.InitialS) == 0 || ps.UpdateResult != "ok" || len(ps.UpdateS) != cfg.Rounds {
			t.Errorf("programming %s: initial %s (%d), update %s (%d)", ps.Mode, ps.InitialResult, len(ps.InitialS), ps.UpdateResult, len(ps.UpdateS))
		}
	}
	for _, m := range cfg.Modes {
		if v := p.Verified[m]; !strings.HasPrefix(v, "all 10 services answered") {
			t.Errorf("%s: sweep of all services: %q", m, v)
		}
	}
	// What the 100,000 row added (issue 14): the memory again at the end
	// with the agent's peak, and Sluice's times without the manifest write.
	if len(p.MemEnd) != len(cfg.Modes) {
		t.Errorf("memory at the end for %d modes, want %d", len(p.MemEnd), len(cfg.Modes))
	}
	for _, ms := range p.MemEnd {
		if isAgent(ms.Mode) && (ms.AgentRSS == 0 || ms.AgentPeakRSS < ms.AgentRSS) {
			t.Errorf("sluice at the end: RSS %d, peak %d", ms.AgentRSS, ms.AgentPeakRSS)
		}
	}
	for _, ps := range p.Prog {
		if isAgent(ps.Mode) && (len(ps.InitialFromStartS) != len(ps.InitialS) || len(ps.UpdateFromWriteS) != len(ps.UpdateS)) {
			t.Errorf("sluice from its start / the rename: %v / %v", ps.InitialFromStartS, ps.UpdateFromWriteS)
		}
	}
	if len(p.Prog) != len(cfg.Modes) {
		t.Errorf("programming measured for %d modes, want %d", len(p.Prog), len(cfg.Modes))
	}

	if cfg.SluiceBin != "" {
		if p.TestRun == nil || p.TestRun.Result != "ok" || p.TestRun.NewFlowNs.Median <= 0 {
			t.Errorf("BPF_PROG_TEST_RUN of the tc program: %+v", p.TestRun)
		}
		for _, ms := range p.Mem {
			if isAgent(ms.Mode) && (ms.KernelBytes <= 0 || ms.AgentRSS <= 0) {
				t.Errorf("sluice memory not read: %+v", ms)
			}
		}
	}

	// The report files exist and parse.
	var back harness.Results
	js, err := os.ReadFile(filepath.Join(cfg.OutDir, "quick.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatalf("results JSON: %v", err)
	}
	if len(back.Points) != 1 || len(back.Points[0].Conn) != len(p.Conn) {
		t.Errorf("results JSON round trip lost data")
	}
	md, err := os.ReadFile(filepath.Join(cfg.OutDir, "quick.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, cpuSection, _ := strings.Cut(string(md), "\n## CPU per connection\n")
	cpuSection, _, _ = strings.Cut(cpuSection, "\n## ")
	for _, m := range p.Modes {
		if !strings.Contains(string(md), "| 10 | "+m+" |") {
			t.Errorf("report has no row for %s", m)
		}
		if !strings.Contains(cpuSection, "| 10 | packet | random | "+m+" |") {
			t.Errorf("report has no CPU per connection row for %s", m)
		}
	}
	// sluice-base against sluice: the per-round ratios of every layer and
	// target (2 rounds each), programming and memory.
	_, baseSection, found := strings.Cut(string(md), "\n## sluice-base against sluice (BENCH_SLUICE_BASE)\n")
	if found != base {
		t.Errorf("table of sluice-base against sluice: %v, want %v", found, base)
	}
	if base {
		baseSection, _, _ = strings.Cut(baseSection, "\n## ")
		for _, row := range []string{"conns/s", "p99 us", "CPU us/conn"} {
			_, rest, _ := strings.Cut(baseSection, "| 10 | "+row+" | ")
			if line, _, _ := strings.Cut(rest, "\n"); strings.Count(line, "n=2") != 4 {
				t.Errorf("sluice-base / sluice %s: %q, want 4 cells of 2 rounds", row, line)
			}
		}
		for _, row := range []string{"| 10 | initial programming | ", "| 10 | endpoint update | ", "| 10 | BPF map memory | ", "| 10 | agent peak RSS at the end | "} {
			if !strings.Contains(baseSection, row) {
				t.Errorf("no %q in\n%s", row, baseSection)
			}
		}
	}
	pngs := 0
	for _, f := range files {
		if strings.HasSuffix(f, ".png") {
			pngs++
			checkPNG(t, f)
		}
	}
	if pngs != 5 {
		t.Errorf("%d plots written, want 5 (%v)", pngs, files)
	}
}

// testWriter logs the harness's lines to the test, and keeps the layer,
// target and mode of every load run ("conns" lines) in order.
type testWriter struct {
	t     *testing.T
	conns [][]string
}

func (w *testWriter) Write(b []byte) (int, error) {
	line := strings.TrimSpace(string(b))
	w.t.Log(line)
	if strings.Contains(line, " msg=conns ") {
		var run []string
		for _, k := range []string{"layer=", "target=", "mode="} {
			_, v, _ := strings.Cut(line, " "+k)
			v, _, _ = strings.Cut(v, " ")
			run = append(run, v)
		}
		w.conns = append(w.conns, run)
	}
	return len(b), nil
}

func checkPNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if b := img.Bounds(); b.Dx() < 100 || b.Dy() < 100 {
		t.Errorf("%s: %v too small", path, b)
	}
}

// sluiceForTest builds cmd/sluice for the sluice mode. Without a
// cmd/sluice in the tree the mode is left out.
func sluiceForTest(t *testing.T) string {
	if _, err := os.Stat("../../cmd/sluice/main.go"); err != nil || os.Getenv("BENCH_NO_SLUICE") != "" {
		t.Logf("no cmd/sluice: sluice mode left out")
		return ""
	}
	return agentproc.Shared(t).Sluice
}
