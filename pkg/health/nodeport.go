package health

// The healthCheckNodePort of LoadBalancer Services with
// externalTrafficPolicy Local, as kube-proxy serves it: an external load
// balancer asks every node over HTTP whether it has local endpoints for
// the Service, and sends traffic only to nodes that answer 200. The answer
// is 200 with the local endpoint count when there is at least one, 503
// otherwise, with kube-proxy's JSON body:
//
//	{"service":{"namespace":"ns","name":"web"},"localEndpoints":2,"serviceProxyHealthy":true}
//
// Sync opens a listener for every health check port the desired state
// names and closes those it no longer names. The agent calls it, as an
// Observer, after every state it programmed.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
)

// NodePortServer serves every health check port of the desired state.
type NodePortServer struct {
	host string // listen host, "" for all addresses
	log  *slog.Logger

	mu    sync.Mutex
	ports map[uint16]*port
}

type port struct {
	srv *http.Server

	mu      sync.Mutex
	service model.ServicePortName // namespace and name (Port empty)
	local   int
}

// NewNodePortServer returns a server that listens on host (empty: all
// addresses).
func NewNodePortServer(host string, log *slog.Logger) *NodePortServer {
	return &NodePortServer{host: host, log: log, ports: map[uint16]*port{}}
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
// the number of distinct local endpoints (the backends of its Local
// frontends, which hold only this node's endpoints).
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
			for _, b := range s.Backends {
				a.addrs[b.Addr.String()] = true
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
			l, err := net.Listen("tcp", net.JoinHostPort(s.host, strconv.Itoa(int(n))))
			if err != nil {
				errs = append(errs, fmt.Errorf("health check port %d of %s: %w", n, w.Service, err))
				continue
			}
			p = &port{}
			p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 5 * time.Second}
			s.ports[n] = p
			go func() {
				if err := p.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
					s.log.Error("health check server failed", "port", n, "err", err)
				}
			}()
			s.log.Info("serving health check", "port", n, "service", w.Service)
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
