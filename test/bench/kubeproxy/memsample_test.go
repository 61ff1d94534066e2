package main

import (
	"os/exec"
	"slices"
	"testing"
	"time"
)

// TestSampleMemory samples a running process until told to stop: samples
// in time order with its RSS and a VmHWM at least as large; and a process
// that is gone ends the sampling by itself.
func TestSampleMemory(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	started := time.Now()
	stop := sampleMemory(cmd.Process.Pid, started, 10*time.Millisecond)
	time.Sleep(200 * time.Millisecond)
	s := stop()
	if len(s) < 3 {
		t.Fatalf("%d samples in 200 ms every 10 ms, want at least 3", len(s))
	}
	for i, x := range s {
		if x.RSS <= 0 || x.HWM < x.RSS {
			t.Errorf("sample %d: VmRSS %d, VmHWM %d", i, x.RSS, x.HWM)
		}
		if i > 0 && x.T <= s[i-1].T {
			t.Errorf("sample %d at %v s, after %v s", i, x.T, s[i-1].T)
		}
	}

	stop = sampleMemory(cmd.Process.Pid, started, 10*time.Millisecond)
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	time.Sleep(100 * time.Millisecond)
	n := len(stop())
	if n == 0 {
		t.Errorf("no sample before the process was gone")
	}
}

func TestRSSMaxAndPerMinute(t *testing.T) {
	const mib = 1 << 20
	s := []memSample{{T: 1, RSS: 100 * mib}, {T: 59, RSS: 130 * mib}, {T: 61, RSS: 120 * mib}, {T: 185, RSS: 140 * mib}, {T: 187, RSS: 90 * mib}}
	if rss, at, ok := rssMax(s, 0, 1e9); !ok || rss != 140*mib || at != 185 {
		t.Errorf("rssMax of all = %d, %v, %v; want 140 MiB at 185 s", rss>>20, at, ok)
	}
	if rss, at, ok := rssMax(s, 60, 185); !ok || rss != 120*mib || at != 61 {
		t.Errorf("rssMax in [60, 185) = %d, %v, %v; want 120 MiB at 61 s", rss>>20, at, ok)
	}
	if _, _, ok := rssMax(s, 62, 180); ok {
		t.Errorf("rssMax of a window without a sample: ok")
	}
	if got, want := perMinute(s), []string{"130", "120", "-", "140"}; !slices.Equal(got, want) {
		t.Errorf("perMinute = %v, want %v", got, want)
	}
}

func TestSteadyConfig(t *testing.T) {
	for _, c := range []struct {
		rate, dur string
		ok        bool
	}{{"", "", true}, {"20", "6m", true}, {"20", "", false}, {"", "6m", false}, {"0", "6m", false}, {"x", "6m", false}} {
		t.Setenv("BENCH_STEADY_RATE", c.rate)
		t.Setenv("BENCH_STEADY_DURATION", c.dur)
		cfg, err := configFromEnv()
		if (err == nil) != c.ok {
			t.Errorf("rate %q, duration %q: err %v, want ok %v", c.rate, c.dur, err, c.ok)
		}
		if err == nil && c.rate == "20" && (cfg.SteadyRate != 20 || cfg.SteadyFor != 6*time.Minute) {
			t.Errorf("rate 20 for 6m read as %v for %v", cfg.SteadyRate, cfg.SteadyFor)
		}
	}
}

// TestSluiceEnvConfig: BENCH_SLUICE_ENV is NAME=value pairs split at
// spaces; a word without a name and an equals sign is refused.
func TestSluiceEnvConfig(t *testing.T) {
	for _, c := range []struct {
		env  string
		want []string
		ok   bool
	}{{"", nil, true}, {"GODEBUG=gctrace=1  GOGC=50", []string{"GODEBUG=gctrace=1", "GOGC=50"}, true}, {"gctrace", nil, false}, {"=1", nil, false}} {
		t.Setenv("BENCH_SLUICE_ENV", c.env)
		cfg, err := configFromEnv()
		if (err == nil) != c.ok {
			t.Errorf("%q: err %v, want ok %v", c.env, err, c.ok)
		}
		if err == nil && !slices.Equal(cfg.SluiceEnv, c.want) {
			t.Errorf("%q read as %q, want %q", c.env, cfg.SluiceEnv, c.want)
		}
	}
}
