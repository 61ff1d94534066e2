// Package health serves what asks whether this node's proxy is healthy:
//
//   - the agent's probes (probes.go), for the kubelet and for load
//     balancers that ask kube-proxy's port: /healthz, /livez and /readyz on
//     --health-addr;
//   - the healthCheckNodePorts of LoadBalancer Services with
//     externalTrafficPolicy Local (nodeport.go), for external load
//     balancers: does this node have local endpoints for the Service?
//
// It knows nothing of what "ready" means or where desired states come
// from: the agent supplies readiness as a function, and the node port
// server follows the states the agent programs (it is an agent Observer).
package health

// The probes, /healthz and /livez as kube-proxy serves them (KEP-3836):
//
//	/livez    200 unless the datapath is stale: a change read from the API
//	          has waited longer than the health timeout (kube-proxy: twice
//	          its sync period) without being programmed; 503 then. A
//	          kubelet restarts an agent whose sync loop is stuck.
//	/healthz  /livez, and 503 while this Node is going away: being deleted
//	          (deletionTimestamp set) or tainted ToBeDeletedByClusterAutoscaler.
//	          Cloud load balancers probe it (kube-proxy's port 10256) to
//	          drain a node before it goes, while its pods are still served.
//	/readyz   200 once the datapath holds everything of the last desired
//	          state read that it can hold, 503 with the reason otherwise;
//	          either way followed by the Services that could not be
//	          programmed, if any
//
// /healthz and /livez answer kube-proxy's JSON body
// ({"lastUpdated": ..., "currentTime": ..., "nodeEligible": ...}), which
// some load balancer controllers parse. Without a Proxier (Handler) both
// answer 200 "ok" while the process runs.

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ToBeDeletedTaint is the taint the cluster autoscaler puts on a Node it is
// about to delete (kube-proxy's healthcheck.ToBeDeletedTaint).
const ToBeDeletedTaint = "ToBeDeletedByClusterAutoscaler"

// Proxier holds what /healthz and /livez report: kube-proxy's
// proxierHealthServer without the server. The source tells it when a change
// is programmed (Updated) and whether this node is eligible (SetNode); it
// asks the source how old the oldest change not yet programmed is.
type Proxier struct {
	timeout time.Duration
	pending func() time.Time
	now     func() time.Time

	lastUpdated atomic.Int64 // unix nanoseconds; 0: never

	mu         sync.Mutex
	ineligible string // why the node is not eligible; "": it is
}

// NewProxier returns a Proxier that calls the datapath stale once the
// oldest pending change (pending's answer; zero: none) is timeout old. A
// nil pending never reports a pending change. The node is eligible until
// SetNode says otherwise, as kube-proxy's is while it starts.
func NewProxier(timeout time.Duration, pending func() time.Time) *Proxier {
	if pending == nil {
		pending = func() time.Time { return time.Time{} }
	}
	return &Proxier{timeout: timeout, pending: pending, now: time.Now}
}

// Updated records that a change was programmed (the time /healthz reports
// as lastUpdated when unhealthy).
func (p *Proxier) Updated() { p.lastUpdated.Store(p.now().UnixNano()) }

// SetNode says whether this node is eligible to receive traffic from load
// balancers, and if not, why (the Node is being deleted, or tainted
// ToBeDeletedTaint).
func (p *Proxier) SetNode(eligible bool, why string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ineligible = ""
	if !eligible {
		p.ineligible = why
		if why == "" {
			p.ineligible = "node not eligible"
		}
	}
}

// Stale reports whether a change has waited longer than the timeout
// without being programmed, and since when it waits.
func (p *Proxier) Stale() (bool, time.Time) {
	oldest := p.pending()
	return !oldest.IsZero() && p.now().Sub(oldest) >= p.timeout, oldest
}

// nodeIneligible returns why the node is not eligible ("": it is).
func (p *Proxier) nodeIneligible() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ineligible
}

// serve answers /healthz (withNode) or /livez the way kube-proxy does.
func (p *Proxier) serve(w http.ResponseWriter, withNode bool) {
	stale, since := p.Stale()
	now := p.now()
	healthy := !stale
	why := ""
	if stale {
		why = fmt.Sprintf("datapath stale: a change has waited %s to be programmed (limit %s)", now.Sub(since).Round(time.Millisecond), p.timeout)
	}
	ineligible := ""
	if withNode {
		if ineligible = p.nodeIneligible(); ineligible != "" {
			healthy = false
			why = strings.TrimPrefix(why+"; "+ineligible, "; ")
		}
	}
	// kube-proxy reports lastUpdated = now while healthy (older clients
	// read it as "the sync loop ran recently").
	lastUpdated := now
	if !healthy {
		lastUpdated = time.Time{}
		if ns := p.lastUpdated.Load(); ns != 0 {
			lastUpdated = time.Unix(0, ns)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	code := http.StatusOK
	if !healthy {
		code = http.StatusServiceUnavailable
		// Not in kube-proxy's body: a header keeps the body parseable
		// by what parses kube-proxy's.
		w.Header().Set("X-Sluice-Unhealthy", why)
	}
	body := fmt.Sprintf(`{"lastUpdated": %q,"currentTime": %q`, lastUpdated, now)
	if withNode {
		body += fmt.Sprintf(`, "nodeEligible": %v`, ineligible == "")
	}
	reply(w, code, body+"}\n")
}

// ReadyFunc returns nil when the agent is ready, else why it is not.
type ReadyFunc func() error

// NotesFunc returns what /readyz reports besides readiness, one line each:
// the Services the agent could not program. A ready agent may have some (a
// Service that does not fit is reported, not waited for).
type NotesFunc func() []string

// maxNotes is how many of NotesFunc's lines /readyz shows; it counts the
// rest. Maps that are full leave out thousands of Services at once, and a
// probe every few seconds has no use for a body of hundreds of kilobytes.
const maxNotes = 100

// Handler returns the mux serving /healthz, /livez and /readyz, the first
// two answering 200 while the process runs. notes may be nil.
func Handler(ready ReadyFunc, notes NotesFunc) http.Handler {
	return HandlerWith(ready, notes, nil)
}

// HandlerWith is Handler with /healthz and /livez answered by p (nil: 200
// while the process runs).
func HandlerWith(ready ReadyFunc, notes NotesFunc, p *Proxier) http.Handler {
	mux := http.NewServeMux()
	for path, withNode := range map[string]bool{"GET /healthz": true, "GET /livez": false} {
		mux.HandleFunc(path, func(w http.ResponseWriter, _ *http.Request) {
			if p == nil {
				reply(w, http.StatusOK, "ok\n")
				return
			}
			p.serve(w, withNode)
		})
	}
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		code, body := http.StatusOK, "ok\n"
		if err := ready(); err != nil {
			code, body = http.StatusServiceUnavailable, fmt.Sprintf("not ready: %v\n", err)
		}
		if notes != nil {
			if lines := notes(); len(lines) > 0 {
				more := ""
				if len(lines) > maxNotes {
					more = fmt.Sprintf("  and %d more (sluicectl status lists them all)\n", len(lines)-maxNotes)
					lines = lines[:maxNotes]
				}
				body += "not programmed:\n  " + strings.Join(lines, "\n  ") + "\n" + more
			}
		}
		reply(w, code, body)
	})
	return mux
}

// reply answers a probe. The status code is the answer; a body that cannot
// be written means the prober went away, and there is nobody left to tell.
func reply(w http.ResponseWriter, code int, body string) {
	w.WriteHeader(code)
	_, _ = io.WriteString(w, body)
}
