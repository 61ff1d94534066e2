package harness

import (
	"os"
	"reflect"
	"testing"
)

func TestProgCosts(t *testing.T) {
	before := progCounters{"sluice_ingress": {100, 50_000}, "sluice_egress": {10, 9_000}, "sluice_ct_gc": {4, 80_000_000}}
	after := progCounters{"sluice_ingress": {700, 1_250_000}, "sluice_egress": {410, 489_000}, "sluice_ct_gc": {4, 80_000_000}, "sluice_connect4": {5, 10_000}}
	got := progCosts(before, after, 100)
	want := []ProgCost{
		{Prog: "sluice_connect4", RunsPerConn: 0.05, NsPerRun: 2000, NsPerConn: 100},
		{Prog: "sluice_egress", RunsPerConn: 4, NsPerRun: 1200, NsPerConn: 4800},
		{Prog: "sluice_ingress", RunsPerConn: 6, NsPerRun: 2000, NsPerConn: 12000},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("progCosts = %+v, want %+v (programs that did not run are left out)", got, want)
	}
	if c := progCosts(before, after, 0); c != nil {
		t.Errorf("no connections: %+v", c)
	}
	// A program reloaded under the same name (counters restart) is not
	// counted as a negative number of runs.
	if c := progCosts(progCounters{"sluice_ingress": {900, 1}}, progCounters{"sluice_ingress": {5, 1}}, 10); len(c) != 0 {
		t.Errorf("restarted counters: %+v", c)
	}
}

func TestMedianProgCosts(t *testing.T) {
	rounds := [][]ProgCost{
		{{Prog: "a", RunsPerConn: 1, NsPerRun: 10, NsPerConn: 10}, {Prog: "gc", RunsPerConn: 0.001, NsPerRun: 3e7, NsPerConn: 3e4}},
		{{Prog: "a", RunsPerConn: 3, NsPerRun: 30, NsPerConn: 90}},
		{{Prog: "a", RunsPerConn: 2, NsPerRun: 20, NsPerConn: 40}},
	}
	got := medianProgCosts(rounds)
	want := []ProgCost{
		{Prog: "a", RunsPerConn: 2, NsPerRun: 20, NsPerConn: 40},
		{Prog: "gc", RunsPerConn: 0, NsPerRun: 3e7, NsPerConn: 0}, // ran in one round of three
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("medianProgCosts = %+v, want %+v", got, want)
	}
}

func TestAgentProgCounters(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to open programs by id")
	}
	// This process holds no BPF program: no counters, no error.
	c, err := agentProgCounters(os.Getpid())
	if err != nil || len(c) != 0 {
		t.Errorf("agentProgCounters(self) = %v, %v", c, err)
	}
}
