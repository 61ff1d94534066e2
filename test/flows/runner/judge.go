package runner

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/sluice-lb/sluice/test/flows"
)

// How hard a flow is tried. A flow that expects endpoints is connected to
// until every one of them has answered, and at least minAttempts times, so
// that an endpoint outside the set shows up too: with one wrong endpoint
// in three, 24 attempts miss it once in 17,000 runs. Any attempt that goes
// wrong ends the flow.
const (
	// answerTimeout bounds a probe that should be answered: past one SYN
	// retransmission (1 s), which an attempt meeting an endpoint's
	// TIME_WAIT from a reused source port costs (the TIME_WAIT refuses
	// its SYN by PAWS, answers with an ACK, the client's RST ends it),
	// with room for a loaded machine. Only a failing run waits it out.
	answerTimeout = 5 * time.Second
	// rejectTimeout bounds a probe that should be refused. A refusal is
	// an ECONNREFUSED, whether the error about the first SYN ends the
	// connect or only the error about the SYN retransmitted after 1 s
	// does: Linux keeps an ICMPv6 error that arrives while connect()
	// still holds the socket as a soft one, and over a veth on the same
	// host the error comes back inside the softirq of the SYN's own
	// transmit, unless the load defers that softirq (README "IPv6
	// REJECT"). 2.5 s is past the first retransmission and before the
	// second (3 s), so both are judged a REJECT every run, and a flow
	// that gets no answer a DROP.
	rejectTimeout = 2500 * time.Millisecond
	// dropTimeout is how long a probe that should be dropped waits for
	// an answer that must not come.
	dropTimeout = 500 * time.Millisecond

	minAttempts = 24
	// attemptsPerEndpoint bounds a flow whose endpoints have not all
	// answered: with 12 an endpoint, a fair pick left one of two
	// unanswered after 24 attempts once in 8 million flows, and the
	// corpus has 255 such flows and 12 with three endpoints (40
	// attempts): 3.4e-5 false failures a run. With 24, ~1e-11; a
	// passing flow stops once every endpoint has answered, at 24 attempts
	// or soon after, as before.
	attemptsPerEndpoint = 24
	// batch is how many attempts of one flow run at once.
	batch = 8
	// stickyAttempts: with two endpoints and no affinity, 16 connections
	// all reach the same one once in 32,000 runs.
	stickyAttempts = 16
	// expiresBurst connections make one round of an "affinity expires"
	// flow (sticky within it); after each round the client idles past the
	// Service's timeout. Eight in a row from a balancer without affinity
	// agree once in 128 rounds, so two agreeing rounds that differ do not
	// happen by chance.
	expiresBurst = 8
	// expiresRounds bounds the rounds of an "affinity expires" flow. An
	// expiry that works makes each round's choice afresh, so with two
	// endpoints every round still reaches the same one once in
	// 2^(expiresRounds-1) flows: 10 rounds failed a working datapath once
	// in 512 flows (the corpus has four such flows: once in 128 runs, and
	// CI saw it). 21 rounds make it once in a million flows; a flow that
	// passes ends at the first round that differs (two on average), so
	// only a failing one waits all 21.
	expiresRounds = 21
	expiresIdle   = time.Second // beyond the timeout
	// maxAffinityTimeout is the longest Service timeout an "expires" flow
	// may have: the runner idles that long, up to expiresRounds times.
	maxAffinityTimeout = 10 * time.Second
)

// sleep is time.Sleep; tests of the judging make it instant.
var sleep = time.Sleep

// judgement is a flow's outcome.
type judgement struct {
	obs  []Observation
	prob *problem // nil: the flow gets the expected answer
}

// prober makes one attempt of the flow with a timeout.
type prober func(timeout time.Duration) Observation

// judge runs a flow's attempts and says whether it gets the expected
// answer. affinityTimeout is the Service's ClientIP timeout (for
// "expires").
func judge(k checker, probe prober, affinityTimeout time.Duration) judgement {
	e := k.f.Expect
	switch {
	case e.Verdict != "":
		timeout := answerTimeout
		switch e.Verdict {
		case flows.VerdictReject:
			timeout = rejectTimeout
		case flows.VerdictDrop:
			timeout = dropTimeout
		}
		o := probe(timeout)
		return judgement{obs: []Observation{o}, prob: k.verdictOK(o)}
	case e.Affinity == flows.AffinitySticky:
		return judgeSticky(k, probe)
	case e.Affinity == flows.AffinityExpires:
		return judgeExpires(k, probe, affinityTimeout)
	}
	return judgeEndpoints(k, probe)
}

// judgeEndpoints: every attempt reaches an expected endpoint, masqueraded
// as expected, and every expected endpoint is reached. The attempts go on
// after a wrong one (so that the problem reported is the worst one, not
// the first), unless it reached no endpoint at all: then the others would
// most likely only wait for the same timeout.
func judgeEndpoints(k checker, probe prober) judgement {
	want := k.f.Expect.Endpoints
	limit := max(minAttempts, attemptsPerEndpoint*len(want))
	var j judgement
	reached := map[netip.AddrPort]bool{}
	for len(j.obs) < limit && (len(reached) < len(want) || len(j.obs) < minAttempts) {
		for _, o := range parallel(batch, probe, answerTimeout) {
			j.obs = append(j.obs, o)
			if o.Kind == Reached && o.Name == endpointName {
				reached[o.Server] = true
			}
			j.worse(k.endpointOK(o))
		}
		if j.prob != nil && j.prob.rank == rankKind {
			return j
		}
	}
	var missing []netip.AddrPort
	for _, ep := range want {
		if !reached[ep] {
			missing = append(missing, ep)
		}
	}
	if len(missing) > 0 {
		j.worse(&problem{"endpoints never reached", fmt.Sprintf("never reached %v in %d attempts", missing, len(j.obs)), rankMissing})
	}
	return j
}

// worse keeps the worse of the judgement's problem and p.
func (j *judgement) worse(p *problem) {
	if p != nil && (j.prob == nil || p.rank < j.prob.rank) {
		j.prob = p
	}
}

// judgeSticky: every attempt (each a new connection from a new source
// port) reaches the same expected endpoint.
func judgeSticky(k checker, probe prober) judgement {
	var j judgement
	for range stickyAttempts {
		o := probe(answerTimeout)
		j.obs = append(j.obs, o)
		j.worse(k.endpointOK(o))
		if first := j.obs[0]; o.Kind == Reached && first.Kind == Reached && o.Server != first.Server {
			j.worse(&problem{"not sticky", fmt.Sprintf("reached %s, then %s: no ClientIP affinity", first.Server, o.Server), rankAffinity})
		}
		if j.prob != nil && j.prob.rank == rankKind {
			break
		}
	}
	return j
}

// judgeExpires: sticky within each burst, and after idling past the
// timeout the choice is made afresh, so the rounds reach more than one
// endpoint.
func judgeExpires(k checker, probe prober, timeout time.Duration) judgement {
	var j judgement
	if timeout > maxAffinityTimeout {
		j.prob = &problem{"runner limit", fmt.Sprintf("the Service's affinity timeout %v is too long to wait for (at most %v)", timeout, maxAffinityTimeout), rankKind}
		return j
	}
	var rounds []netip.AddrPort
	for round := range expiresRounds {
		if round > 0 {
			sleep(timeout + expiresIdle)
		}
		var first netip.AddrPort
		for i := range expiresBurst {
			o := probe(answerTimeout)
			j.obs = append(j.obs, o)
			if p := k.endpointOK(o); p != nil {
				j.prob = p
				return j
			}
			if i == 0 {
				first = o.Server
			} else if o.Server != first {
				j.prob = &problem{"not sticky", fmt.Sprintf("round %d: reached %s, then %s: no ClientIP affinity", round+1, first, o.Server), rankAffinity}
				return j
			}
		}
		rounds = append(rounds, first)
		if slices.ContainsFunc(rounds, func(a netip.AddrPort) bool { return a != first }) {
			return j
		}
	}
	j.prob = &problem{"affinity never expires", fmt.Sprintf("reached only %s in %d rounds, idling %v between them", rounds[0], expiresRounds, timeout+expiresIdle), rankAffinity}
	return j
}

// parallel runs n attempts at once.
func parallel(n int, probe prober, timeout time.Duration) []Observation {
	out := make([]Observation, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { out[i] = probe(timeout) })
	}
	wg.Wait()
	return out
}
