package harness

import (
	"os"
	"strings"
	"testing"
)

func TestRulesCapped(t *testing.T) {
	r := &runner{cfg: Config{RulesMaxServices: 30000}}
	for _, tc := range []struct {
		mode   string
		n      int
		capped bool
	}{
		{ModeIptNft, 30000, false},
		{ModeIptLeg, 30001, true},
		{ModeNft, 100000, true},
		{ModeSluice, 100000, false},
		{ModeFloor, 100000, false},
	} {
		why := r.rulesCapped(tc.mode, tc.n)
		if (why != "") != tc.capped {
			t.Errorf("%s at %d: %q, want capped %v", tc.mode, tc.n, why, tc.capped)
		}
		if tc.capped && !strings.Contains(why, "BENCH_RULES_MAX_SERVICES") {
			t.Errorf("%s at %d: %q does not name the knob", tc.mode, tc.n, why)
		}
	}
	r.cfg.RulesMaxServices = 0 // no cap
	if why := r.rulesCapped(ModeNft, 1<<20); why != "" {
		t.Errorf("uncapped: %q", why)
	}
}

func TestProcStatusBytes(t *testing.T) {
	vm := procStatusBytes(os.Getpid(), "VmRSS", "VmHWM")
	if vm["VmRSS"] <= 0 || vm["VmHWM"] < vm["VmRSS"] {
		t.Fatalf("VmRSS %d, VmHWM %d: want 0 < VmRSS <= VmHWM", vm["VmRSS"], vm["VmHWM"])
	}
	if vm["VmRSS"]%1024 != 0 {
		t.Errorf("VmRSS %d not in whole kB", vm["VmRSS"])
	}
}
