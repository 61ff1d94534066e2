// Package health serves what asks whether this node's proxy is healthy:
//
//   - the agent's probes (probes.go), for the kubelet and for load
//     balancers that ask kube-proxy's port: /healthz, /livez and /readyz on
//     --health-addr, and /readyz?verbose, which names the Services not
//     programmed, for the metrics server (readyz.go);
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
//	          either way followed by how many frontends and Services could
//	          not be programmed, if any (readyz.go: which ones only on the
//	          metrics address)
//
// /healthz and /livez answer kube-proxy's JSON body (its ProxyHealth,
// pkg/proxy/healthcheck/proxy_health.go: json.Marshal of lastUpdated,
// currentTime, nodeEligible on /healthz only, healthy and status per IP
// family, times in RFC 3339), which load balancer controllers parse. One
// Sluice sync serves both families, so status has both, alike, as the
// kubeproxy_* metrics record a sync under both. Without a Proxier (Handler)
// both answer 200 "ok" while the process runs.

import (
	"encoding/json"
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
// ProxyHealthServer without the server. The source tells it when a change
// is programmed (Updated) and whether this node is eligible (SetNode); it
// asks the source how old the oldest change not yet programmed is.
type Proxier struct {
	timeout time.Duration
	pending func() time.Time
	now     func() time.Time

	lastUpdated atomic.Int64 // unix nanoseconds

	mu         sync.Mutex
	ineligible string // why the node is not eligible; "": it is
}

// NewProxier returns a Proxier that calls the datapath stale once the
// oldest pending change (pending's answer; zero: none) is timeout old. A
// nil pending never reports a pending change. The node is eligible until
// SetNode says otherwise, and lastUpdated is now until the first Updated,
// as kube-proxy's are while it starts (its SyncLoop calls Updated before
// the first sync, "in case Sync() never succeeds").
func NewProxier(timeout time.Duration, pending func() time.Time) *Proxier {
	if pending == nil {
		pending = func() time.Time { return time.Time{} }
	}
	p := &Proxier{timeout: timeout, pending: pending, now: time.Now}
	p.Updated()
	return p
}

// Updated records that a change was programmed (the time /healthz reports
// as lastUpdated when unhealthy, and status' lastUpdated).
func (p *Proxier) Updated() { p.lastUpdated.Store(p.now().UnixNano()) }

// SetNode says whether this node is eligible to receive traffic from load
// balancers, and if not, why (the Node is being deleted, is tainted
// ToBeDeletedTaint, or does not exist).
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

// ProxierHealth and ProxyHealth are kube-proxy's body of /healthz and
// /livez (pkg/proxy/healthcheck.ProxierHealth, ProxyHealth), field for
// field; json.Marshal writes the times in RFC 3339.
type ProxierHealth struct {
	LastUpdated time.Time `json:"lastUpdated"`
	Healthy     bool      `json:"healthy"`
}

type ProxyHealth struct {
	// LastUpdated is when a change was last programmed, or now while
	// healthy (kube-proxy's compatibility with older releases, where it
	// was the last run of the sync loop).
	LastUpdated  time.Time `json:"lastUpdated"`
	CurrentTime  time.Time `json:"currentTime"`
	NodeEligible *bool     `json:"nodeEligible,omitempty"` // /healthz only
	Healthy      bool      `json:"healthy"`
	// Status is per IP family (IPv4, IPv6), each with its last update.
	Status map[string]ProxierHealth `json:"status,omitempty"`
}

// ipFamilies are the status keys: kube-proxy's v1.IPFamily values.
var ipFamilies = [...]string{"IPv4", "IPv6"}

// serve answers /healthz (withNode) or /livez the way kube-proxy does, and
// returns the status code.
func (p *Proxier) serve(w http.ResponseWriter, withNode bool) int {
	stale, since := p.Stale()
	now := p.now()
	lastUpdated := time.Unix(0, p.lastUpdated.Load())
	body := ProxyHealth{CurrentTime: now, LastUpdated: lastUpdated, Healthy: !stale,
		Status: make(map[string]ProxierHealth, len(ipFamilies))}
	for _, f := range ipFamilies {
		body.Status[f] = ProxierHealth{LastUpdated: lastUpdated, Healthy: !stale}
	}
	healthy := !stale
	why := ""
	if stale {
		why = fmt.Sprintf("datapath stale: a change has waited %s to be programmed (limit %s)", now.Sub(since).Round(time.Millisecond), p.timeout)
	}
	if withNode {
		ineligible := p.nodeIneligible()
		eligible := ineligible == ""
		body.NodeEligible = &eligible
		if !eligible {
			healthy = false
			why = strings.TrimPrefix(why+"; "+ineligible, "; ")
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	code := http.StatusOK
	if healthy {
		body.LastUpdated = now
	} else {
		code = http.StatusServiceUnavailable
		// Not in kube-proxy's body: a header keeps the body kube-proxy's.
		w.Header().Set("X-Sluice-Unhealthy", why)
	}
	// A ProxyHealth always marshals; kube-proxy writes it without a
	// newline.
	out, _ := json.Marshal(body)
	w.WriteHeader(code)
	_, _ = w.Write(out)
	return code
}

// Handler returns the mux serving /healthz, /livez and /readyz, the first
// two answering 200 while the process runs. u may be nil.
func Handler(ready ReadyFunc, u *Unprogrammed) http.Handler {
	return HandlerWith(ready, u, nil)
}

// HandlerWith is Handler with /healthz and /livez answered by p (nil: 200
// while the process runs).
func HandlerWith(ready ReadyFunc, u *Unprogrammed, p *Proxier) http.Handler {
	return CountedHandler(ready, u, p, nil)
}

// ProbeCounter is told the status code of every answer to /healthz (probe
// "healthz") and /livez ("livez"): kube-proxy's kubeproxy_proxy_healthz_total
// and kubeproxy_proxy_livez_total (pkg/metrics.Metrics.ObserveProbe).
type ProbeCounter func(probe string, code int)

// CountedHandler is HandlerWith, telling count (nil: nobody) of every
// answer to /healthz and /livez. Its /readyz is the brief one (readyz.go):
// this server is on every address by default.
func CountedHandler(ready ReadyFunc, u *Unprogrammed, p *Proxier, count ProbeCounter) http.Handler {
	mux := http.NewServeMux()
	for probe, withNode := range map[string]bool{"healthz": true, "livez": false} {
		// Any method, as kube-proxy's health server answers.
		mux.HandleFunc("/"+probe, func(w http.ResponseWriter, _ *http.Request) {
			code := http.StatusOK
			if p == nil {
				reply(w, code, "ok\n")
			} else {
				code = p.serve(w, withNode)
			}
			if count != nil {
				count(probe, code)
			}
		})
	}
	mux.Handle("GET /readyz", readyz(ready, u, false))
	return mux
}

// reply answers a probe. The status code is the answer; a body that cannot
// be written means the prober went away, and there is nobody left to tell.
func reply(w http.ResponseWriter, code int, body string) {
	w.WriteHeader(code)
	_, _ = io.WriteString(w, body)
}
