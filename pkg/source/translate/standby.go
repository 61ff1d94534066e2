package translate

// Standby endpoints: a UDP Service port's serving endpoints that none of
// a frontend's backend sets holds (model.Service.Standby). kube-proxy
// deletes a UDP flow's conntrack entry only when its endpoint is no
// longer serving the Service port (pkg/proxy/conntrack/cleanup.go,
// CleanStaleEntries: "we do not take traffic policies, topology, or
// terminating status of the service into account"), so an endpoint that
// only stopped being chosen (terminating while others are ready, another
// zone under topology hints, another node under a Local policy) keeps
// its flows. The reconciler reads Standby to tell that case from one
// that is gone, and keeps such a backend's entry, which its flows name.

import "github.com/sluice-lb/sluice/pkg/model"

// setStandby sets the Standby of each of svcs, the frontends of one UDP
// Service port and family, from eps, that port's endpoints (endpointsFor,
// sorted by address). Frontends with the same backend sets share one
// array; nearly always there is none.
func setStandby(svcs []*model.Service, eps []endpoint) {
	var last []model.L4Addr
	var lastB, lastI []model.Backend
	for i, s := range svcs {
		if i > 0 && sameArray(s.Backends, lastB) && sameArray(s.InternalBackends, lastI) {
			s.Standby = last
			continue
		}
		last = standbyOf(eps, s.Backends, s.InternalBackends)
		lastB, lastI = s.Backends, s.InternalBackends
		s.Standby = last
	}
}

// standbyOf returns the serving endpoints of eps in neither a nor b (both
// sorted by address), nil if none.
func standbyOf(eps []endpoint, a, b []model.Backend) []model.L4Addr {
	var out []model.L4Addr
	i, j := 0, 0
	for k := range eps {
		e := &eps[k]
		if !e.serving {
			continue
		}
		x := e.b.L4Addr
		for i < len(a) && a[i].L4Addr.Compare(x) < 0 {
			i++
		}
		for j < len(b) && b[j].L4Addr.Compare(x) < 0 {
			j++
		}
		if (i < len(a) && a[i].L4Addr == x) || (j < len(b) && b[j].L4Addr == x) {
			continue
		}
		out = append(out, x)
	}
	return out
}

// sameArray says whether x and y are the same array (or both empty).
func sameArray(x, y []model.Backend) bool {
	if len(x) != len(y) {
		return false
	}
	return len(x) == 0 || &x[0] == &y[0]
}
