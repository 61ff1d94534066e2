package health

// The healthCheckNodePort of LoadBalancer Services with
// externalTrafficPolicy Local, as kube-proxy serves it: an external load
// balancer asks every node over HTTP whether it has local endpoints for
// the Service, and sends traffic only to nodes that answer 200. The answer
// is 200 with the count of ready local endpoints when there is at least
// one, 503 otherwise (endpoints that are terminating do not count, so that
// load balancers drain a node whose endpoints terminate, while they still
// serve), with kube-proxy's JSON body:
//
//	{"service":{"namespace":"ns","name":"web"},"localEndpoints":2,"serviceProxyHealthy":true}
//
// Sync opens a listener for every health check port the desired state
// names, on each of the server's hosts (kube-proxy's --nodeport-addresses),
// and closes those it no longer names. The agent calls it, as an Observer,
// after every state it programmed.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
)

// NodePortServer serves every health check port of the desired state.
type NodePortServer struct {
	hosts []string // listen hosts, "" for all addresses
	log   *slog.Logger

	mu    sync.Mutex
	ports map[uint16]*port
}

type port struct {
	srv *http.Server

	mu      sync.Mutex
	service model.ServicePortName // namespace and name (Port empty)
	local   int
}

// NewNodePortServer returns a server that listens on each of hosts (none,
// or "": all addresses).
func NewNodePortServer(hosts []string, log *slog.Logger) *NodePortServer {
	if len(hosts) == 0 || slices.Contains(hosts, "") {
		hosts = []string{""}
	}
	return &NodePortServer{hosts: hosts, log: log, ports: map[uint16]*port{}}
}

type status struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

func (p *port) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	p.mu.Lock()
	var st status
	st.Service.Namespace, st.Service.Name = p.service.Namespace, p.service.Name
	st.LocalEndpoints = p.local
	p.mu.Unlock()
	st.ServiceProxyHealthy = true
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if st.LocalEndpoints > 0 {
		w.WriteHeader(http.StatusOK)
	} else {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(st)
}

// LocalEndpoints returns, per health check port of st, its Service and
// the number of distinct ready local endpoints (model.Service.LocalReady of
// its frontends, every port's: kube-proxy counts addresses).
func LocalEndpoints(st *model.State) map[uint16]struct {
	Service model.ServicePortName
	Count   int
} {
	type acc struct {
		svc   model.ServicePortName
		addrs map[string]bool
	}
	accs := map[uint16]*acc{}
	if st != nil {
		for _, s := range st.Services {
			if s == nil || s.HealthCheckNodePort == 0 || !s.ExternalLocal {
				continue
			}
			a := accs[s.HealthCheckNodePort]
			if a == nil {
				a = &acc{svc: model.ServicePortName{Namespace: s.Name.Namespace, Name: s.Name.Name}, addrs: map[string]bool{}}
				accs[s.HealthCheckNodePort] = a
			}
			for _, ip := range s.LocalReady {
				a.addrs[ip.String()] = true
			}
		}
	}
	out := map[uint16]struct {
		Service model.ServicePortName
		Count   int
	}{}
	for p, a := range accs {
		out[p] = struct {
			Service model.ServicePortName
			Count   int
		}{a.svc, len(a.addrs)}
	}
	return out
}

// Sync serves the health check ports st names, with its local endpoint
// counts, and stops serving the others. A port that cannot be bound is
// reported (the others are still served) and retried on the next Sync.
func (s *NodePortServer) Sync(st *model.State) error {
	want := LocalEndpoints(st)
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for n, p := range s.ports {
		if _, ok := want[n]; !ok {
			s.stop(n, p)
		}
	}
	for n, w := range want {
		p := s.ports[n]
		if p == nil {
			var ls []net.Listener
			for _, h := range s.hosts {
				l, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(int(n))))
				if err != nil {
					errs = append(errs, fmt.Errorf("health check port %d of %s: %w", n, w.Service, err))
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
				continue
			}
			p = &port{}
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
		p.service, p.local = w.Service, w.Count
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
