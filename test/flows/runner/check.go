package runner

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/test/flows"
)

// Kind is what one probe of a flow showed.
type Kind int

const (
	// Reached: a reporting server (an endpoint, or the sink at an
	// original destination) got the request.
	Reached Kind = iota
	// Leaked: the packet left the node still addressed to a Service
	// frontend and landed in the router's trap: the node neither
	// translated, rejected nor dropped it.
	Leaked
	// Rejected: ECONNREFUSED (ICMP port unreachable or a TCP reset).
	Rejected
	// Dropped: nothing came back, and no server or capture saw it.
	Dropped
	// Health: an HTTP answer (a health-check server).
	Health
	// Other: anything else (an error, an answer that is no report).
	Other
)

// Observation is what one probe showed.
type Observation struct {
	Kind Kind
	// Server is the address the reporting server was reached on, Name
	// which one it is: "endpoint", "sink" (an UNTOUCHED flow's original
	// destination elsewhere than the node) or "node" (the node's own
	// stack, reached untranslated).
	Server netip.AddrPort
	Name   string
	// Seen is the source address the server (or a SYN capture) saw.
	Seen netip.Addr
	// ReplyLost: the request reached Server (its log or a SYN capture
	// says so) but nothing came back to the client.
	ReplyLost bool
	// Status and LocalEndpoints are a health check's answer
	// (LocalEndpoints -1 when the body had none).
	Status, LocalEndpoints int
	Detail                 string
}

func (o Observation) String() string {
	switch o.Kind {
	case Reached:
		s := fmt.Sprintf("%s saw %s", o.Server, o.Seen)
		switch o.Name {
		case nodeName:
			s = fmt.Sprintf("the node's own %s saw %s (untranslated)", o.Server, o.Seen)
		case sinkName:
			s = fmt.Sprintf("the original destination %s saw %s (untranslated)", o.Server, o.Seen)
		}
		if o.ReplyLost {
			s += " (no reply came back)"
		}
		return s
	case Leaked:
		return fmt.Sprintf("left the node untranslated (router trap saw %s)", o.Seen)
	case Rejected:
		return "REJECT"
	case Dropped:
		return "DROP"
	case Health:
		return fmt.Sprintf("HTTP %d localEndpoints=%d", o.Status, o.LocalEndpoints)
	}
	return o.Detail
}

// The reporting servers' names.
const (
	endpointName = "endpoint"
	sinkName     = "sink"
	nodeName     = "node"
	trapName     = "trap" // the router's
)

// observe turns a probe's result into an observation. lookup finds what
// the servers logged for the probe's token and what a SYN capture saw of
// it, for a probe that timed out.
func observe(p topology.Probe, r topology.ProbeResult, lookup func(p topology.Probe, r topology.ProbeResult) (topology.Seen, bool)) Observation {
	switch r.Outcome {
	case topology.Answered:
		if p.HTTP {
			var body struct {
				LocalEndpoints *int `json:"localEndpoints"`
			}
			o := Observation{Kind: Health, Status: r.Status, LocalEndpoints: -1}
			if json.Unmarshal([]byte(r.Answer), &body) == nil && body.LocalEndpoints != nil {
				o.LocalEndpoints = *body.LocalEndpoints
			}
			return o
		}
		rep, err := topology.ParseReport(r.Answer)
		if err != nil || rep.Token != p.Token {
			return Observation{Kind: Other, Detail: fmt.Sprintf("answered by something else: %q", r.Answer)}
		}
		if rep.Name == trapName {
			return Observation{Kind: Leaked, Seen: rep.Peer.Addr()}
		}
		return Observation{Kind: Reached, Name: rep.Name, Server: rep.Local, Seen: rep.Peer.Addr()}
	case topology.Refused:
		return Observation{Kind: Rejected}
	case topology.TimedOut:
		if s, ok := lookup(p, r); ok {
			if s.Name == trapName {
				return Observation{Kind: Leaked, Seen: s.Peer.Addr(), ReplyLost: true}
			}
			return Observation{Kind: Reached, Name: s.Name, Server: s.Local, Seen: s.Peer.Addr(), ReplyLost: true}
		}
		return Observation{Kind: Dropped}
	}
	return Observation{Kind: Other, Detail: r.String()}
}

// checker judges the observations of one flow.
type checker struct {
	c *flows.Case
	f *flows.Flow
}

// clientAddr is the source an endpoint sees when the flow is not
// masqueraded: the flow's own source (for "SNATted to LB" external
// sources, the LoadBalancer IP the router made it).
func (k checker) clientAddr() netip.Addr { return k.f.Source.IP }

// problem is what is wrong with a flow: a class (what kind of wrong, for
// the summary), the particulars, and a rank.
type problem struct {
	class, why string
	// rank orders the problems one flow's attempts may show, so that the
	// one reported does not depend on which endpoint the first attempt
	// happened to reach: lower is reported first.
	rank int
}

const (
	rankKind    = iota // not an endpoint at all
	rankOutside        // an endpoint outside the set
	rankMissing        // an expected endpoint never reached
	rankAffinity
	rankMasquerade
	rankReplyLost
)

// endpointOK says what is wrong with an observation of a flow that
// expects endpoints, or nil.
func (k checker) endpointOK(o Observation) *problem {
	e := k.f.Expect
	if o.Kind != Reached || o.Name != endpointName {
		return &problem{"got " + kindName(o), "got " + o.String(), rankKind}
	}
	if !slices.Contains(e.Endpoints, o.Server) {
		return &problem{"endpoint outside the set", fmt.Sprintf("reached %s, not one of the expected endpoints", o.Server), rankOutside}
	}
	want := e.Masquerade
	remote := k.c.Placement[o.Server.Addr()] == flows.PlaceRemote
	if want == flows.MasqueradeRemote {
		want = flows.MasqueradeNo
		if remote {
			want = flows.MasqueradeYes
		}
	}
	switch want {
	case flows.MasqueradeNo:
		if o.Seen != k.clientAddr() {
			return &problem{"masqueraded, should not be", fmt.Sprintf("%s saw %s, want the client's own %s (not masqueraded)", o.Server, o.Seen, k.clientAddr()), rankMasquerade}
		}
	case flows.MasqueradeYes:
		if !k.c.Node.IsNodeAddress(o.Seen) {
			return &problem{"not masqueraded, should be", fmt.Sprintf("%s saw %s, want a node address (masqueraded)", o.Server, o.Seen), rankMasquerade}
		}
	}
	if o.ReplyLost {
		// Only where the corpus says the reply cannot come back (README,
		// "Observing"): unmasqueraded to another node's endpoint, from a
		// client outside this node.
		bypass := remote && o.Seen == k.clientAddr() &&
			(k.f.Source.Kind == flows.SourceExternal || k.f.Source.Kind == flows.SourceRemotePod)
		if !bypass {
			return &problem{"reply lost", fmt.Sprintf("reached %s (saw %s) but no reply came back", o.Server, o.Seen), rankReplyLost}
		}
	}
	return nil
}

// verdictOK says what is wrong with an observation of a flow that expects
// a verdict, or nil.
func (k checker) verdictOK(o Observation) *problem {
	e := k.f.Expect
	got := &problem{"got " + kindName(o), "got " + o.String(), rankKind}
	switch e.Verdict {
	case flows.VerdictReject:
		if o.Kind != Rejected {
			return got
		}
	case flows.VerdictDrop:
		if o.Kind != Dropped {
			return got
		}
	case flows.VerdictUntouched:
		dst := netip.AddrPortFrom(k.f.Destination.IP, k.f.Destination.Port)
		switch {
		case o.Kind != Reached || o.ReplyLost:
			return got
		case o.Server != dst:
			return &problem{"translated, should not be", fmt.Sprintf("got %s, want the sink at %s", o, dst), rankKind}
		case o.Seen != k.clientAddr():
			return &problem{"source changed, should not be", fmt.Sprintf("got %s, want the sink at %s to see %s", o, dst, k.clientAddr()), rankMasquerade}
		}
	case flows.VerdictHealthCheck:
		want := 503
		if *e.LocalEndpoints > 0 {
			want = 200
		}
		switch {
		case o.Kind != Health:
			return got
		case o.Status != want || o.LocalEndpoints != *e.LocalEndpoints:
			return &problem{"wrong health answer", fmt.Sprintf("got %s, want HTTP %d localEndpoints=%d", o, want, *e.LocalEndpoints), rankKind}
		}
	default:
		return &problem{"unknown verdict", "unknown verdict " + e.Verdict, rankKind}
	}
	return nil
}

// summarize describes a flow's observations: identical ones counted.
func summarize(obs []Observation) string {
	var order []string
	count := map[string]int{}
	for _, o := range obs {
		s := o.String()
		if count[s] == 0 {
			order = append(order, s)
		}
		count[s]++
	}
	var parts []string
	for _, s := range order {
		if count[s] > 1 {
			s = fmt.Sprintf("%s ×%d", s, count[s])
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

// kindName names an observation's kind for failure classes.
func kindName(o Observation) string {
	switch o.Kind {
	case Reached:
		switch {
		case o.Name != endpointName:
			return "untranslated"
		case o.ReplyLost:
			return "endpoint (reply lost)"
		}
		return "endpoint"
	case Leaked:
		return "left the node untranslated"
	case Rejected:
		return "REJECT"
	case Dropped:
		return "DROP"
	case Health:
		return "HTTP"
	}
	if strings.HasPrefix(o.Detail, "answered by") {
		return "an answer from another server"
	}
	return "error"
}
