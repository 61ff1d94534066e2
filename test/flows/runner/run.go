package runner

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/test/flows"
)

// FlowResult is one flow's outcome: a row of the report.
type FlowResult struct {
	// ID names the flow in known-failures.txt: <case>/<flow>.
	ID                  string
	Case, Step, Flow    string
	Source, Destination string
	Expected, Observed  string
	Pass                bool
	// Skip is the corpus's reason for not running the flow.
	Skip string
	// Class is what kind of wrong a failure is ("got DROP", "not
	// sticky"...), Why its particulars.
	Class, Why string
	// Unsupported are the settings flags the agent did not know: the flow
	// ran without them.
	Unsupported []string
	Derived     bool
	Deviation   bool
	// IPv6 is set for the flows of an IPv6 case.
	IPv6 bool
}

const (
	// agentReady bounds an agent's start, readyWait a manifest change.
	agentReady = 30 * time.Second
	readyWait  = 20 * time.Second
	// stepParallel flows of a step run at once.
	stepParallel = 8
	// probePortMin and probePortMax are the source ports probes bind,
	// one new port per probe (affinity and conntrack see each as a new
	// connection, and a SYN capture can tell which probe it saw). The
	// namespaces' ephemeral range is moved below them.
	probePortMin, probePortMax = 40000, 59999
	ephemeralRange             = "32768 39999"
)

var (
	probePort atomic.Uint32
	tokens    atomic.Uint64
)

func nextPort() uint16 {
	return uint16(probePortMin + probePort.Add(1)%(probePortMax-probePortMin+1))
}

func newToken() string { return fmt.Sprintf("flow-%d", tokens.Add(1)) }

// listenKey names a reporting server.
type listenKey struct {
	network string
	addr    netip.AddrPort
}

// caseRun is one case being run.
type caseRun struct {
	t        *testing.T
	c        *flows.Case
	bin      agentproc.Binaries
	net      *caseNet
	seen     *topology.SeenLog
	captures []*topology.SYNCapture
	prober   *topology.Prober
	cgroup   *topology.Cgroup
	manifest string
	bpffs    string

	agent    *agentproc.Agent
	agentErr error    // the agent is not usable: every flow from here fails with it
	dropped  []string // settings flags the agent does not know

	listeners map[listenKey]bool
}

// runCase runs every step and flow of c against a fresh network and agent
// and returns one result per flow. Failures of the runner itself (the
// network cannot be built) fail t; what Sluice does is only reported.
func runCase(t *testing.T, bin agentproc.Binaries, c *flows.Case) []*FlowResult {
	r := newCaseRun(t, c)
	r.bin = bin
	t.Cleanup(r.teardownAgent)
	var results []*FlowResult
	for i, st := range c.Steps {
		if err := r.applyStep(i, st); err != nil && r.agentErr == nil {
			r.agentErr = err
		}
		results = append(results, r.runStep(st)...)
	}
	return results
}

// newCaseRun builds c's network and starts its servers, captures and the
// node's prober: everything but the agent. It fails t if it cannot.
func newCaseRun(t *testing.T, c *flows.Case) *caseRun {
	r := &caseRun{t: t, c: c, seen: &topology.SeenLog{}, listeners: map[listenKey]bool{}}
	topo := topology.NewT(t)
	var err error
	if r.net, err = buildNet(topo, c); err != nil {
		t.Fatalf("network: %v", err)
	}
	if err := r.setUp(topo); err != nil {
		t.Fatalf("set up: %v", err)
	}
	return r
}

// setUp starts the servers, captures and the node's prober.
func (r *caseRun) setUp(topo *topology.Topology) error {
	n := r.net
	for _, x := range []*topology.NS{n.node, n.router, n.other, n.ext} {
		if err := x.Sysctl("net/ipv4/ip_local_port_range", ephemeralRange); err != nil {
			return err
		}
	}
	for _, pod := range n.pods {
		if err := pod.Sysctl("net/ipv4/ip_local_port_range", ephemeralRange); err != nil {
			return err
		}
	}
	// The trap catches whatever the node forwards untranslated.
	for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
		wild := unspecified(r.net.nodeIP)
		if _, err := n.router.ServeReport(network(proto, wild), netip.AddrPortFrom(wild, trapPort), trapName, r.seen); err != nil {
			return err
		}
	}
	// Every endpoint of every step listens on its ports.
	for _, st := range r.c.Steps {
		for _, o := range st.Objects() {
			if o.Slice == nil {
				continue
			}
			for _, k := range endpointListeners(o.Slice) {
				if r.listeners[k] {
					continue
				}
				host, err := n.hostOf(r.c, k.addr.Addr())
				if err != nil {
					return fmt.Errorf("endpoint %s: %w", k.addr, err)
				}
				if _, err := host.ServeReport(k.network, k.addr, endpointName, r.seen); err != nil {
					return err
				}
				r.listeners[k] = true
			}
		}
	}
	for _, x := range append([]*topology.NS{n.other}, mapValues(n.pods)...) {
		c, err := x.CaptureSYNs("eth0")
		if err != nil {
			return err
		}
		r.captures = append(r.captures, c)
	}
	mount, err := datapath.CgroupV2Mount()
	if err != nil {
		return err
	}
	if r.cgroup, err = topo.AddCgroup(mount, "socklb"); err != nil {
		return err
	}
	// Node and localhost clients run in the socket LB cgroup; pods'
	// clients (this process) do not, so theirs go through tc.
	if r.prober, err = n.node.StartProber(r.cgroup); err != nil {
		return err
	}
	r.manifest = filepath.Join(r.t.TempDir(), "manifest.yaml")
	r.bpffs = filepath.Join(datapath.DefaultBPFFS, topo.Prefix()+"agent")
	return nil
}

func mapValues[K comparable, V any](m map[K]V) []V {
	var out []V
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// endpointListeners are the servers a slice's endpoints need: each
// address on each of the slice's TCP and UDP ports.
func endpointListeners(sl *discoveryv1.EndpointSlice) []listenKey {
	var out []listenKey
	for _, ep := range sl.Endpoints {
		for _, s := range ep.Addresses {
			a, err := flows.ParseAddr(s)
			if err != nil {
				continue
			}
			for _, p := range sl.Ports {
				if p.Port == nil {
					continue
				}
				proto := corev1.ProtocolTCP
				if p.Protocol != nil && *p.Protocol != "" {
					proto = *p.Protocol
				}
				if proto != corev1.ProtocolTCP && proto != corev1.ProtocolUDP {
					continue // SCTP: out of scope
				}
				out = append(out, listenKey{network(proto, a), netip.AddrPortFrom(a, uint16(*p.Port))})
			}
		}
	}
	return out
}

// applyStep puts step i's objects in place: the first starts the agent,
// later ones rewrite the manifest and wait for the agent to apply it (and
// restart it if the step says so).
func (r *caseRun) applyStep(i int, st *flows.Step) error {
	if r.agentErr != nil {
		return r.agentErr
	}
	m, err := flows.Manifest(st.Objects())
	if err != nil {
		r.t.Fatalf("step %q: manifest: %v", st.Name, err)
	}
	if i == 0 {
		if err := agentproc.WriteFile(r.manifest, string(m)); err != nil {
			r.t.Fatal(err)
		}
		return r.startAgent()
	}
	if err := r.agent.Exited(); err != nil {
		return fmt.Errorf("%w\n%s", err, logTail(r.agent.Log.String()))
	}
	gen := r.agent.AppliedGeneration()
	if err := agentproc.WriteFile(r.manifest, string(m)); err != nil {
		r.t.Fatal(err)
	}
	if err := r.agent.WaitApplied(gen, readyWait); err != nil {
		return fmt.Errorf("step %q: %w", st.Name, err)
	}
	if st.RestartAgent {
		if err := r.agent.Stop(); err != nil {
			return fmt.Errorf("step %q: stop the agent: %w", st.Name, err)
		}
		if err := r.agent.Start(); err != nil {
			return fmt.Errorf("step %q: restart the agent: %w", st.Name, err)
		}
		if err := r.agent.WaitReady(agentReady); err != nil {
			return fmt.Errorf("step %q: restarted agent: %w", st.Name, err)
		}
	}
	return nil
}

// startAgent starts the agent with the case's settings. A settings flag the
// agent does not define makes it exit with its usage: the flag is then
// dropped (for this and every later case) and the agent started again.
func (r *caseRun) startAgent() error {
	for {
		args, dropped := settingArgs(&r.c.Node, isUnsupported)
		a := agentproc.NewAgent(r.bin, r.net.node, agentproc.AgentConfig{
			Manifests: r.manifest,
			Devices:   append([]string{"eth0"}, r.net.podDevs...),
			Cgroup:    r.cgroup.Path,
			BPFFS:     r.bpffs,
			Extra:     args,
		})
		if err := a.Start(); err != nil {
			return err
		}
		err := a.WaitReady(agentReady)
		if err == nil {
			r.agent, r.dropped = a, dropped
			return nil
		}
		// Another case may have found the same flag meanwhile: what
		// counts is whether this start passed it.
		if flag := unknownFlag(a.Log.String()); flag != "" && slices.ContainsFunc(args, func(arg string) bool {
			return strings.HasPrefix(arg, flag+"=")
		}) {
			// It exited already (the flag stopped it): Stop only reaps it.
			_ = a.Stop()
			markUnsupported(flag)
			continue
		}
		// The start's error is the one to report; what stopping and
		// cleaning up the failed agent say is added to it.
		stopErr, cleanErr := a.Stop(), a.Cleanup(context.Background())
		r.dropped = dropped
		return fmt.Errorf("agent did not start: %w (stop: %v, cleanup: %v)\n%s", err, stopErr, cleanErr, logTail(a.Log.String()))
	}
}

// teardownAgent stops the agent (it must exit cleanly) and removes what
// it installed.
func (r *caseRun) teardownAgent() {
	if r.agent == nil {
		return
	}
	if r.t.Failed() {
		counters, err := r.agent.Counters(context.Background())
		r.t.Logf("agent counters (%v):\n%s\nlog:\n%s", err, counters, r.agent.Log.String())
	}
	if err := r.agent.Teardown(context.Background()); err != nil {
		r.t.Errorf("agent: %v\n%s", err, logTail(r.agent.Log.String()))
	}
}

// logTail is the last 20 lines of an agent's log.
func logTail(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}

// runStep runs a step's flows, in parallel except where they could
// disturb each other: flows of a ClientIP Service from one client run one
// after the other (affinity is per client address).
func (r *caseRun) runStep(st *flows.Step) []*FlowResult {
	sinks, sinkErrs := r.startSinks(st)
	defer func() {
		for _, s := range sinks {
			s.Close()
		}
	}()
	results := make([]*FlowResult, len(st.Flows))
	var groups [][]int
	byClient := map[string]int{}
	for i, f := range st.Flows {
		if svc := serviceFor(r.c, st, f); svc != nil && svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
			key := f.Source.IP.String()
			if g, ok := byClient[key]; ok {
				groups[g] = append(groups[g], i)
				continue
			}
			byClient[key] = len(groups)
		}
		groups = append(groups, []int{i})
	}
	sem := make(chan struct{}, stepParallel)
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() {
			for _, i := range g {
				sem <- struct{}{}
				results[i] = r.runFlow(st, st.Flows[i], sinkErrs)
				<-sem
			}
		})
	}
	wg.Wait()
	return results
}

// startSinks starts the step's reporting servers at original
// destinations: for the UNTOUCHED flows, one at each destination that is
// not the node's and has none yet; and on the node, one on all addresses
// for each port the step's flows send to a node or loopback address, so
// that what reaches the node's own stack untranslated is told apart from
// a reject (the stack would answer a closed port with a reset). A
// health-check port of one of the step's Services is left to the agent.
// What cannot listen is returned with the error.
func (r *caseRun) startSinks(st *flows.Step) ([]*topology.Server, map[listenKey]error) {
	var sinks []*topology.Server
	errs := map[listenKey]error{}
	hcPorts := map[uint16]bool{}
	for _, o := range st.Objects() {
		if o.Service != nil && o.Service.Spec.HealthCheckNodePort != 0 {
			hcPorts[uint16(o.Service.Spec.HealthCheckNodePort)] = true
		}
	}
	for _, f := range st.Flows {
		if f.Skip != "" {
			continue
		}
		dst := f.Destination.IP
		var k listenKey
		var host *topology.NS
		name := sinkName
		switch {
		case r.c.Node.IsNodeAddress(dst) || dst.IsLoopback():
			k = listenKey{networkOf(f), netip.AddrPortFrom(unspecified(dst), f.Destination.Port)}
			if hcPorts[f.Destination.Port] {
				// The agent's health-check server listens on the
				// port, on the nodeport addresses: a flow that
				// expects it untouched elsewhere needs a sink on
				// that one address only.
				if f.Expect.Verdict != flows.VerdictUntouched {
					continue
				}
				k.addr = netip.AddrPortFrom(dst, f.Destination.Port)
			}
			host, name = r.net.node, nodeName
		case f.Expect.Verdict == flows.VerdictUntouched:
			k = listenKey{networkOf(f), netip.AddrPortFrom(dst, f.Destination.Port)}
			if r.listeners[k] {
				continue // an endpoint listens there
			}
			var err error
			if host, err = r.net.hostOf(r.c, dst); err != nil {
				errs[k] = err
				continue
			}
		default:
			continue
		}
		if _, done := errs[k]; done {
			continue
		}
		var s *topology.Server
		var err error
		// The agent may take a moment to close a port it no longer
		// serves (a health check port of a deleted Service).
		deadline := time.Now().Add(time.Second)
		for {
			s, err = host.ServeReport(k.network, k.addr, name, r.seen)
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		errs[k] = err
		if err == nil {
			sinks = append(sinks, s)
		}
	}
	return sinks, errs
}

// sinkErr is why no sink listens where f's packets go untranslated, or nil.
func (r *caseRun) sinkErr(f *flows.Flow, errs map[listenKey]error) error {
	addr := netip.AddrPortFrom(f.Destination.IP, f.Destination.Port)
	if err, ok := errs[listenKey{networkOf(f), addr}]; ok {
		return err // a sink on the destination itself (see startSinks)
	}
	if r.c.Node.IsNodeAddress(f.Destination.IP) || f.Destination.IP.IsLoopback() {
		addr = netip.AddrPortFrom(unspecified(f.Destination.IP), f.Destination.Port)
	}
	return errs[listenKey{networkOf(f), addr}]
}

// networkOf is the network f is probed over.
func networkOf(f *flows.Flow) string { return network(f.Protocol, f.Destination.IP) }

// network is the Go network of protocol proto (UDP, else TCP) to or from
// address a: tcp4, udp4, tcp6 or udp6.
func network(proto corev1.Protocol, a netip.Addr) string {
	n := "tcp"
	if proto == corev1.ProtocolUDP {
		n = "udp"
	}
	if a.Unmap().Is6() {
		return n + "6"
	}
	return n + "4"
}

// unspecified is the wildcard address of a's family.
func unspecified(a netip.Addr) netip.Addr {
	if a.Unmap().Is6() {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

// runFlow runs one flow and judges it.
func (r *caseRun) runFlow(st *flows.Step, f *flows.Flow, sinkErrs map[listenKey]error) *FlowResult {
	res := &FlowResult{
		ID:          r.c.Name + "/" + f.Name,
		Case:        r.c.Name,
		Step:        st.Name,
		Flow:        f.Name,
		Source:      f.Source.Kind + " " + f.Source.IP.String(),
		Destination: fmt.Sprintf("%s %s", f.Protocol, netip.AddrPortFrom(f.Destination.IP, f.Destination.Port)),
		Expected:    f.Expect.String(),
		Unsupported: r.dropped,
		Derived:     r.c.Derived != "",
		Deviation:   f.Deviation != "",
		IPv6:        r.c.IPFamily == corev1.IPv6Protocol,
	}
	switch {
	case f.Skip != "":
		res.Skip = f.Skip
		return res
	case f.Protocol != corev1.ProtocolTCP && f.Protocol != corev1.ProtocolUDP:
		res.Class, res.Why, res.Observed = "runner limit", "protocol "+string(f.Protocol)+" is not probed", "not run"
		return res
	case r.agentErr != nil:
		res.Class, res.Why, res.Observed = "agent not running", r.agentErr.Error(), "not run: agent not running"
		return res
	}
	var timeout time.Duration
	svc := serviceFor(r.c, st, f)
	if svc != nil {
		timeout = flows.AffinityTimeout(svc)
	}
	k := checker{c: r.c, f: f}
	j := judge(k, func(t time.Duration) Observation { return r.attempt(f, t) }, timeout)
	res.Observed = summarize(j.obs)
	res.Pass = j.prob == nil
	if j.prob != nil {
		res.Class, res.Why = j.prob.class, j.prob.why
		if err := r.sinkErr(f, sinkErrs); err != nil && f.Expect.Verdict == flows.VerdictUntouched {
			res.Why += fmt.Sprintf(" (no sink could listen there: %v)", err)
		}
	}
	if err := r.agent.Exited(); err != nil {
		res.Pass = false
		res.Class, res.Why = "agent exited", fmt.Sprintf("%v\n%s", err, logTail(r.agent.Log.String()))
	}
	return res
}

// attempt makes one probe of f: a new connection (or UDP socket) from a
// new source port.
func (r *caseRun) attempt(f *flows.Flow, timeout time.Duration) Observation {
	host, src, err := r.net.sourceNS(f)
	if err != nil {
		return Observation{Kind: Other, Detail: err.Error()}
	}
	p := topology.Probe{
		Network: networkOf(f),
		Dst:     netip.AddrPortFrom(f.Destination.IP, f.Destination.Port),
		Token:   newToken(),
		HTTP:    f.Expect.Verdict == flows.VerdictHealthCheck,
		Timeout: timeout,
	}
	if src.IsValid() {
		p.Src = netip.AddrPortFrom(src, nextPort())
	}
	var res topology.ProbeResult
	switch f.Source.Kind {
	case flows.SourceNode, flows.SourceLocalhost:
		res = r.prober.Probe(p)
	default:
		res = host.Probe(p)
	}
	return observe(p, res, r.lookup)
}

// lookup finds where a probe that got no answer went: a server's log of
// its token (UDP), or a capture of its SYN at an endpoint (TCP). A packet
// still on its way when the client gave up is given lookupGrace to land.
func (r *caseRun) lookup(p topology.Probe, res topology.ProbeResult) (topology.Seen, bool) {
	if s, ok := r.lookupNow(p); ok {
		return s, true
	}
	time.Sleep(lookupGrace)
	return r.lookupNow(p)
}

// lookupGrace is how long after a probe's timeout its packets may still
// land somewhere.
const lookupGrace = 250 * time.Millisecond

func (r *caseRun) lookupNow(p topology.Probe) (topology.Seen, bool) {
	if seen := r.seen.Lookup(p.Token); len(seen) > 0 {
		return seen[0], true
	}
	if !strings.HasPrefix(p.Network, "tcp") || p.Src.Port() == 0 {
		return topology.Seen{}, false
	}
	for _, c := range r.captures {
		syns := c.Match(func(s topology.SYN) bool {
			return s.Src.Port() == p.Src.Port() && r.listeners[listenKey{network(corev1.ProtocolTCP, s.Dst.Addr()), s.Dst}]
		})
		if len(syns) > 0 {
			return topology.Seen{Name: endpointName, Local: syns[0].Dst, Peer: syns[0].Src}, true
		}
	}
	return topology.Seen{}, false
}

// serviceFor is the Service that serves f's destination in the step, or
// nil.
func serviceFor(c *flows.Case, st *flows.Step, f *flows.Flow) *corev1.Service {
	nodeDst := c.Node.IsNodeAddress(f.Destination.IP) || f.Destination.IP.IsLoopback()
	for _, o := range st.Objects() {
		svc := o.Service
		if svc == nil {
			continue
		}
		hasIP := slices.Contains(serviceAddrs(svc), f.Destination.IP)
		for _, p := range svc.Spec.Ports {
			proto := p.Protocol
			if proto == "" {
				proto = corev1.ProtocolTCP
			}
			if proto != f.Protocol {
				continue
			}
			if (hasIP && uint16(p.Port) == f.Destination.Port) || (nodeDst && p.NodePort != 0 && uint16(p.NodePort) == f.Destination.Port) {
				return svc
			}
		}
	}
	return nil
}
