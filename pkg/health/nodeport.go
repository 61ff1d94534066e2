package health

// The healthCheckNodePort of LoadBalancer Services with
// externalTrafficPolicy Local, as kube-proxy serves it: an external load
// balancer asks every node over HTTP whether it has local endpoints for
// the Service, and sends traffic only to nodes that answer 200. The answer
// is 200 when there is at least one ready local endpoint and the proxy is
// healthy, 503 otherwise. Endpoints that are terminating do not count, so
// that load balancers drain a node whose endpoints terminate, while they
// still serve. The proxy is unhealthy when its datapath is stale, as
// /livez says (Proxier.Stale): a node whose sync is stuck must stop
// attracting new traffic, as kube-proxy's does (its service health server
// asks its healthz server's Health(), what its /livez answers). Whether
// the Node is going away (deleted, or tainted ToBeDeletedByClusterAutoscaler)
// does not enter: kube-proxy tells that on /healthz only (KEP-3836), which
// load balancers probe for the node's health. Without a Proxier (the
// manifest source) the proxy is always healthy.
//
// The answer is kube-proxy's byte for byte (v1.36, hcHandler.ServeHTTP),
// since load balancer controllers parse it: the headers Content-Type
// application/json, X-Content-Type-Options nosniff and
// X-Load-Balancing-Endpoint-Weight with the count (always, 0 included,
// healthy or not), and this indented body, without a final newline:
//
//	{
//		"service": {
//			"namespace": "ns",
//			"name": "web"
//		},
//		"localEndpoints": 2,
//		"serviceProxyHealthy": true
//	}
//
// Sync opens a listener for every health check port the desired state
// names, on each of the server's hosts (kube-proxy's --nodeport-addresses),
// and closes those it no longer names. A port is named by every frontend
// of its Service that carries it (model.Service.HealthCheckNodePort): the
// ClusterIP ones too, so that a Service with no NodePort and no ingress IP
// is served, as kube-proxy serves it; one listener a port, whatever the
// number of frontends and families. The agent calls it, as an Observer,
// after every state it programmed.
//
// Counts are per IP family, as kube-proxy's two proxiers keep them: a query
// that arrives on a node address of one family is answered with the ready
// local endpoints of the Service's frontends of that family, so a
// dual-stack pod (one IPv4 and one IPv6 address) counts once, not twice. A
// single-stack Service answers its family's count on addresses of either
// (kube-proxy's proxier of that family is then the only one holding the
// port, and it listens on all addresses).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
)

// NodePortServer serves every health check port of the desired state.
type NodePortServer struct {
	hosts []string // listen hosts, "" for all addresses; none: nowhere
	prox  *Proxier // whether the proxy is healthy; nil: always
	log   *slog.Logger

	mu    sync.Mutex
	ports map[uint16]*port
	// index is the health check ports of the last state synced, and
	// unbound those of them that could not be bound (retried by the
	// next Sync).
	index   localIndex
	unbound map[uint16]bool
	// failed is the ports whose failure to bind was reported to
	// bindFailed, with the Service each was reported for: reported again
	// only once bound, or dropped, in between (or for another Service).
	failed     map[uint16]model.ServicePortName
	bindFailed func(svc model.ServicePortName, port uint16, err error)
}

type port struct {
	srv  *http.Server
	prox *Proxier

	mu sync.Mutex
	st PortStatus
}

// NewNodePortServer returns a server that listens on each of hosts ("":
// all addresses, whatever else hosts holds) and answers that the proxy is
// unhealthy while prox's datapath is stale (nil: never; the manifest
// source has none). With no hosts it listens nowhere, as kube-proxy's
// service health server does when no node address is inside
// --nodeport-addresses at its start (GetNodeIPs empty): the ports are
// followed but not bound, and no bind failure is reported. It says so, at
// Warn.
func NewNodePortServer(hosts []string, prox *Proxier, log *slog.Logger) *NodePortServer {
	switch {
	case slices.Contains(hosts, ""):
		hosts = []string{""}
	case len(hosts) == 0:
		log.Warn("no address to listen on: the healthCheckNodePorts are served nowhere")
	}
	return &NodePortServer{hosts: hosts, prox: prox, log: log, ports: map[uint16]*port{}, unbound: map[uint16]bool{},
		failed: map[uint16]model.ServicePortName{}}
}

// OnBindFailure has f told when the health check port of a Service cannot
// be bound, with the error of the first address that failed: once per
// failure, not at every Sync that retries it (kube-proxy's
// FailedToStartServiceHealthcheck event, which the Kubernetes source
// records). Call it before the first Sync; f is called outside the
// server's lock.
func (s *NodePortServer) OnBindFailure(f func(svc model.ServicePortName, port uint16, err error)) {
	s.bindFailed = f
}

func (p *port) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The family of the node address the query came to (an IPv4 one on
	// a dual-stack listener arrives mapped).
	v6 := false
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok {
		v6 = la.AddrPort().Addr().Unmap().Is6()
	}
	p.mu.Lock()
	svc, count := p.st.Service, p.st.Answer(v6)
	p.mu.Unlock()
	healthy := true
	if p.prox != nil {
		stale, _ := p.prox.Stale()
		healthy = !stale
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("X-Load-Balancing-Endpoint-Weight", strconv.Itoa(count))
	if count > 0 && healthy {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	// %q as kube-proxy quotes the names (the same as JSON's for every
	// valid Kubernetes name). A body that cannot be written means the
	// prober went away.
	_, _ = fmt.Fprintf(w, "{\n\t\"service\": {\n\t\t\"namespace\": %q,\n\t\t\"name\": %q\n\t},\n\t\"localEndpoints\": %d,\n\t\"serviceProxyHealthy\": %v\n}",
		svc.Namespace, svc.Name, count, healthy)
}

// PortStatus is what a health check port answers: its Service and, per IP
// family, the number of distinct ready local endpoints.
type PortStatus struct {
	Service model.ServicePortName
	// Count is per family, [0] IPv4 and [1] IPv6: the ready local
	// endpoint addresses of that family's frontends.
	Count [2]int
	// Serves says which families the Service has frontends of.
	Serves [2]bool
}

// Answer is the count a query to a node address of the family (v6 or not)
// gets: that family's, or, if the Service has no frontend of it, the count
// of the family it has.
func (p PortStatus) Answer(v6 bool) int {
	f := familyIndex(v6)
	if !p.Serves[f] {
		f = 1 - f
	}
	return p.Count[f]
}

func familyIndex(v6 bool) int {
	if v6 {
		return 1
	}
	return 0
}

// LocalEndpoints returns, per health check port of st, its Service and
// the number of distinct ready local endpoints per family
// (model.Service.LocalReady of its frontends of the family, every port's:
// kube-proxy counts addresses).
func LocalEndpoints(st *model.State) map[uint16]PortStatus {
	var x localIndex
	x.update(st)
	out := make(map[uint16]PortStatus, len(x.ports))
	for n := range x.ports {
		out[n] = x.status(n)
	}
	return out
}

// localIndex keeps the health check ports of the last state, updated from
// each state's changes (model.State.BaseGen), so that one change among
// 30,000 Services costs what changed.
type localIndex struct {
	last  *model.State
	ports map[uint16]*portFrontends
}

// portFrontends are the frontends that name one health check port, and
// how many of them name each of their ready local endpoints.
type portFrontends struct {
	frontends map[model.L4Addr]*model.Service
	addrs     map[netip.Addr]int
}

// update makes x the index of st and returns the ports whose status may
// have changed.
func (x *localIndex) update(st *model.State) []uint16 {
	touched := map[uint16]bool{}
	if x.last != nil && st != nil && st.BaseGen != 0 && st.BaseGen == x.last.Gen {
		for _, a := range st.Changed {
			if old := x.last.Services.Get(a); old != nil {
				x.add(old, -1, touched)
			}
			if s := st.Services.Get(a); s != nil {
				x.add(s, 1, touched)
			}
		}
	} else {
		for n := range x.ports {
			touched[n] = true
		}
		x.ports = map[uint16]*portFrontends{}
		if st != nil {
			for _, s := range st.Services.All() {
				x.add(s, 1, touched)
			}
		}
	}
	x.last = st
	return slices.Sorted(maps.Keys(touched))
}

// add adds (d = 1) or removes (d = -1) s's frontend.
func (x *localIndex) add(s *model.Service, d int, touched map[uint16]bool) {
	if s == nil || s.HealthCheckNodePort == 0 {
		return
	}
	n := s.HealthCheckNodePort
	touched[n] = true
	if x.ports == nil {
		x.ports = map[uint16]*portFrontends{}
	}
	p := x.ports[n]
	if p == nil {
		p = &portFrontends{frontends: map[model.L4Addr]*model.Service{}, addrs: map[netip.Addr]int{}}
		x.ports[n] = p
	}
	if d > 0 {
		p.frontends[s.Frontend] = s
	} else {
		delete(p.frontends, s.Frontend)
	}
	for _, ip := range s.LocalReady {
		if p.addrs[ip] += d; p.addrs[ip] <= 0 {
			delete(p.addrs, ip)
		}
	}
	if len(p.frontends) == 0 {
		delete(x.ports, n)
	}
}

// status returns what port n answers, if x has it: the Service of its
// first frontend (by address; a port belongs to one Service) and its
// distinct ready local endpoints per family. An endpoint address counts
// in its own family: a Service's frontends of one family balance over the
// EndpointSlices of that family only.
func (x *localIndex) status(n uint16) PortStatus {
	p := x.ports[n]
	first := slices.MinFunc(slices.Collect(maps.Keys(p.frontends)), model.L4Addr.Compare)
	name := p.frontends[first].Name
	st := PortStatus{Service: model.ServicePortName{Namespace: name.Namespace, Name: name.Name}}
	for fe := range p.frontends {
		st.Serves[familyIndex(fe.Addr.Is6())] = true
	}
	for a := range p.addrs {
		st.Count[familyIndex(a.Is6())]++
	}
	return st
}

// Sync serves the health check ports st names, with its local endpoint
// counts, and stops serving the others. A port that cannot be bound is
// reported (the others are still served) and retried on the next Sync.
// A state made from the last one (model.State.BaseGen) costs what
// changed.
func (s *NodePortServer) Sync(st *model.State) error {
	type failure struct {
		svc  model.ServicePortName
		port uint16
		err  error
	}
	var report []failure
	defer func() { // after the unlock
		for _, f := range report {
			s.bindFailed(f.svc, f.port, f.err)
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	touched := s.index.update(st)
	for n := range s.unbound {
		touched = append(touched, n)
	}
	slices.Sort(touched)
	touched = slices.Compact(touched)
	clear(s.unbound)
	var errs []error
	for _, n := range touched {
		p := s.ports[n]
		if _, ok := s.index.ports[n]; !ok {
			delete(s.failed, n)
			if p != nil {
				s.stop(n, p)
			}
			continue
		}
		w := s.index.status(n)
		if p == nil && len(s.hosts) == 0 {
			continue // listening nowhere: nothing to bind or retry
		}
		if p == nil {
			var ls []net.Listener
			for _, h := range s.hosts {
				l, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(int(n))))
				if err != nil {
					errs = append(errs, fmt.Errorf("health check port %d of %s: %w", n, w.Service, err))
					if s.bindFailed != nil && s.failed[n] != w.Service {
						s.failed[n] = w.Service
						report = append(report, failure{w.Service, n, err})
					}
					for _, l := range ls {
						// Never served: closing it loses nothing.
						_ = l.Close()
					}
					ls = nil
					break
				}
				ls = append(ls, l)
			}
			if ls == nil {
				s.unbound[n] = true
				continue
			}
			delete(s.failed, n)
			p = &port{prox: s.prox}
			p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
			s.ports[n] = p
			for _, l := range ls {
				go func() {
					if err := p.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
						s.log.Error("health check server failed", "port", n, "err", err)
					}
				}()
			}
			s.log.Info("serving health check", "port", n, "service", w.Service, "hosts", s.hosts)
		}
		p.mu.Lock()
		p.st = w
		p.mu.Unlock()
	}
	return errors.Join(errs...)
}

// SetProgrammed syncs the ports with st, a state the agent programmed (the
// agent's Observer interface). A port another process holds must not keep
// the datapath from being programmed: it is reported and retried with the
// next state.
func (s *NodePortServer) SetProgrammed(st *model.State) {
	if err := s.Sync(st); err != nil {
		s.log.Error("health check ports", "err", err)
	}
}

// ObserveSync does nothing: the ports follow programmed states only.
func (s *NodePortServer) ObserveSync(time.Duration, error) {}

func (s *NodePortServer) stop(n uint16, p *port) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = p.srv.Shutdown(ctx)
	delete(s.ports, n)
	s.log.Info("stopped health check", "port", n)
}

// Close stops serving every port.
func (s *NodePortServer) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for n, p := range s.ports {
		s.stop(n, p)
	}
}
