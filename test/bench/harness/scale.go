package harness

import (
	"fmt"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// What the benchmark adds for its largest rows (issue 14, 100,000 Services
// x 10 endpoints): the kube-proxy-shaped rule modes stop at
// Config.RulesMaxServices, and the agent's memory is read a second time at
// the end of a point, with its peak.

// defaultRulesMaxServices is Config.RulesMaxServices unless set.
const defaultRulesMaxServices = 30000

// rulesCapReason says why the rule modes do not run above RulesMaxServices.
const rulesCapReason = "at 30,000 iptables-legacy's restore fails at COMMIT (x_tables' table size), and at 10,000 iptables-nft took over 300 s and nftables' one transaction over 120 s (test/bench/results/README.md)"

// rulesCapped says why mode does not run at n, or "" if it does.
func (r *runner) rulesCapped(mode string, n int) string {
	switch mode {
	case ModeIptNft, ModeIptLeg, ModeNft:
		if r.cfg.RulesMaxServices > 0 && n > r.cfg.RulesMaxServices {
			return fmt.Sprintf("not run above N=%d (BENCH_RULES_MAX_SERVICES): %s", r.cfg.RulesMaxServices, rulesCapReason)
		}
	}
	return ""
}

// memoryAtEnd reads every mode's memory once more, after the load runs and
// the endpoint changes: for the agent, its RSS then and its peak.
func memoryAtEnd(envs []*env) []MemStat {
	var out []MemStat
	for _, e := range envs {
		if e.name == ModeFloor || e.m == nil {
			continue
		}
		out = append(out, MemStat{Mode: e.name, memStat: e.m.memory()})
	}
	return out
}

// procStatusBytes reads the named "kB" fields of /proc/<pid>/status
// (VmRSS, VmHWM) in bytes.
func procStatusBytes(pid int, fields ...string) map[string]int64 {
	out, _ := testutil.ReadProcStatusKB(pid, fields...) // a process gone: no figures
	for f, kb := range out {
		out[f] = kb * 1024
	}
	return out
}

// agentLogTail is the end of the sluice mode's agent log, for a failure's
// log line ("" for other modes).
func agentLogTail(m mode) string {
	if sm, ok := m.(*sluiceMode); ok && sm.agent != nil {
		return sm.logTail()
	}
	return ""
}

// sourceReady is when the sluice mode's agent had its input, for a step
// that began at t0: its start (initial programming) or its manifest's
// rename into place (an update), after the benchmark wrote the file; t0
// for other modes, which write nothing first.
func sourceReady(m mode, t0 time.Time) time.Time {
	if sm, ok := m.(*sluiceMode); ok && sm.ready.After(t0) {
		return sm.ready
	}
	return t0
}
