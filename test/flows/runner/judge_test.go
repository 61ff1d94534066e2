package runner

import (
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/test/flows"
)

// testdataCase loads testdata/name, a corpus of one case, and returns
// the case.
func testdataCase(t *testing.T, name string) *flows.Case {
	t.Helper()
	data, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	corpus, err := flows.LoadFS(fstest.MapFS{name: {Data: data}})
	if err != nil {
		t.Fatal(err)
	}
	return corpus.Cases[0]
}

func judgeFixture(t *testing.T) (*flows.Case, map[string]*flows.Flow) {
	t.Helper()
	c := testdataCase(t, "judge.yaml")
	byName := map[string]*flows.Flow{}
	for _, f := range c.Steps[0].Flows {
		byName[f.Name] = f
	}
	return c, byName
}

var (
	local  = netip.MustParseAddrPort("10.180.0.1:80")
	remote = netip.MustParseAddrPort("10.180.1.1:80")
	pod    = netip.MustParseAddr("10.0.0.2")
	ext    = netip.MustParseAddr("203.0.113.2")
	node   = netip.MustParseAddr("192.168.0.2")
)

func at(server netip.AddrPort, seen netip.Addr) Observation {
	return Observation{Kind: Reached, Name: endpointName, Server: server, Seen: seen}
}

// cycle returns a prober that answers with obs in turn (safe for the
// parallel attempts).
func cycle(obs ...Observation) prober {
	var mu sync.Mutex
	i := 0
	return func(time.Duration) Observation {
		mu.Lock()
		defer mu.Unlock()
		o := obs[i%len(obs)]
		i++
		return o
	}
}

func TestJudge(t *testing.T) {
	c, f := judgeFixture(t)
	sleep = func(time.Duration) {}
	t.Cleanup(func() { sleep = time.Sleep })
	lost := at(remote, ext)
	lost.ReplyLost = true
	for _, x := range []struct {
		flow  string
		probe prober
		class string // "" for a pass
	}{
		{"both", cycle(at(local, pod), at(remote, pod)), ""},
		{"both", cycle(at(local, pod)), "endpoints never reached"},
		{"both", cycle(at(local, pod), at(remote, pod), at(netip.MustParseAddrPort("10.180.0.9:80"), pod)), "endpoint outside the set"},
		{"both", cycle(at(local, pod), at(remote, node)), "masqueraded, should not be"},
		// The worst problem is reported, whichever attempt shows it first.
		{"both", cycle(at(local, node), at(remote, pod), at(netip.MustParseAddrPort("10.180.0.9:80"), pod)), "endpoint outside the set"},
		{"both", cycle(Observation{Kind: Dropped}), "got DROP"},
		{"both", cycle(Observation{Kind: Leaked, Seen: pod}), "got left the node untranslated"},
		{"both", cycle(Observation{Kind: Reached, Name: nodeName, Server: netip.MustParseAddrPort("192.168.0.2:80"), Seen: pod}), "got untranslated"},
		{"remote masq", cycle(at(local, ext), at(remote, node)), ""},
		{"remote masq", cycle(at(local, node), at(remote, node)), "masqueraded, should not be"},
		{"remote masq", cycle(at(local, ext), at(remote, ext)), "not masqueraded, should be"},
		// An unmasqueraded external flow to another node's endpoint
		// cannot get its reply back: seen at the endpoint, it counts.
		{"external unmasq", cycle(at(local, ext), lost), ""},
		{"both", cycle(at(local, pod), func() Observation { o := at(remote, pod); o.ReplyLost = true; return o }()), "reply lost"},
		{"sticky", cycle(at(remote, pod)), ""},
		{"sticky", cycle(at(remote, pod), at(local, pod)), "not sticky"},
		{"expires", rounds(at(local, pod), at(remote, pod)), ""},
		{"expires", cycle(at(local, pod)), "affinity never expires"},
		{"expires", cycle(at(local, pod), at(remote, pod)), "not sticky"},
		{"reject", cycle(Observation{Kind: Rejected}), ""},
		{"reject", cycle(Observation{Kind: Dropped}), "got DROP"},
		{"drop", cycle(Observation{Kind: Dropped}), ""},
		{"drop", cycle(at(local, pod)), "got endpoint"},
		{"drop", cycle(Observation{Kind: Leaked, Seen: pod}), "got left the node untranslated"},
		{"untouched", cycle(Observation{Kind: Reached, Name: sinkName, Server: netip.MustParseAddrPort("10.0.0.3:80"), Seen: pod}), ""},
		{"untouched", cycle(Observation{Kind: Reached, Name: sinkName, Server: netip.MustParseAddrPort("10.0.0.3:80"), Seen: node}), "source changed, should not be"},
		{"untouched", cycle(at(local, pod)), "translated, should not be"},
	} {
		j := judge(checker{c, f[x.flow]}, x.probe, 2*time.Second)
		got := ""
		if j.prob != nil {
			got = j.prob.class
		}
		if got != x.class {
			t.Errorf("%s: class %q (%v), want %q; observed %s", x.flow, got, j.prob, x.class, summarize(j.obs))
		}
	}
}

// rounds answers a in the first expiresBurst attempts, b after: a
// client stuck to a until its affinity expired.
func rounds(a, b Observation) prober {
	n := 0
	return func(time.Duration) Observation {
		n++
		if n <= expiresBurst {
			return a
		}
		return b
	}
}

func TestObserve(t *testing.T) {
	p := topology.Probe{Network: "tcp4", Token: "tok", HTTP: false}
	none := func(topology.Probe, topology.ProbeResult) (topology.Seen, bool) { return topology.Seen{}, false }
	for _, x := range []struct {
		res    topology.ProbeResult
		lookup func(topology.Probe, topology.ProbeResult) (topology.Seen, bool)
		want   Observation
	}{
		{topology.ProbeResult{Outcome: topology.Answered, Answer: "tok endpoint 10.180.0.1:80 10.0.0.2:40001"}, none,
			Observation{Kind: Reached, Name: endpointName, Server: local, Seen: pod}},
		{topology.ProbeResult{Outcome: topology.Answered, Answer: "tok trap 192.168.0.1:9999 10.0.0.2:40001"}, none,
			Observation{Kind: Leaked, Seen: pod}},
		{topology.ProbeResult{Outcome: topology.Answered, Answer: "other tok endpoint 10.180.0.1:80 10.0.0.2:40001"}, none,
			Observation{Kind: Other, Detail: `answered by something else: "other tok endpoint 10.180.0.1:80 10.0.0.2:40001"`}},
		{topology.ProbeResult{Outcome: topology.Refused}, none, Observation{Kind: Rejected}},
		{topology.ProbeResult{Outcome: topology.TimedOut}, none, Observation{Kind: Dropped}},
		{topology.ProbeResult{Outcome: topology.TimedOut}, func(topology.Probe, topology.ProbeResult) (topology.Seen, bool) {
			return topology.Seen{Name: endpointName, Local: remote, Peer: netip.MustParseAddrPort("203.0.113.2:40001")}, true
		}, Observation{Kind: Reached, Name: endpointName, Server: remote, Seen: ext, ReplyLost: true}},
	} {
		if got := observe(p, x.res, x.lookup); got != x.want {
			t.Errorf("observe(%v) = %+v, want %+v", x.res, got, x.want)
		}
	}
	hp := p
	hp.HTTP = true
	got := observe(hp, topology.ProbeResult{Outcome: topology.Answered, Status: 503, Answer: `{"service":{},"localEndpoints":0}`}, none)
	if got.Kind != Health || got.Status != 503 || got.LocalEndpoints != 0 {
		t.Errorf("health answer observed as %+v", got)
	}
	if s := summarize([]Observation{at(local, pod), at(local, pod), {Kind: Dropped}}); !strings.Contains(s, "×2") || !strings.Contains(s, "DROP") {
		t.Errorf("summarize = %q", s)
	}
}
