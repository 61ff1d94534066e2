package reconciler

// Which UDP backends lose their flows. kube-proxy deletes a UDP flow's
// conntrack entry when its endpoint is no longer a serving endpoint of
// the Service port (pkg/proxy/conntrack/cleanup.go, CleanStaleEntries),
// not when the endpoint merely stops being chosen for new flows: a
// serving and terminating endpoint while others are ready, one of
// another zone under topology hints, or another node's under a Local
// policy keeps its flows, as a TCP connection keeps its endpoint. The
// desired state says which these are (model.Service.Standby, for UDP
// frontends). So a backend that leaves a frontend's slots is flushed only
// when its Service port no longer serves it (servesAddr), and one that
// leaves the standby set without coming back to a slot is flushed then.
//
// Its flows keep it only while its backend entry does (the datapath
// re-balances a UDP flow whose backend id is gone, ct_fwd_usable): a
// backend some frontend's Service holds in standby is not deleted when
// it loses its last slot. standbyRefs counts, per address, the views
// whose Service holds it in standby (the views' svc, set by setService).

import (
	"slices"

	"github.com/sluice-lb/sluice/pkg/model"
)

// servesAddr says whether svc's Service port still serves backend a, in
// one of its scopes or in standby.
func servesAddr(svc *model.Service, a model.L4Addr) bool {
	if svc == nil {
		return false
	}
	if hasBackend(svc.Backends, a) || (svc.TwoScopes && hasBackend(svc.InternalBackends, a)) {
		return true
	}
	_, ok := slices.BinarySearchFunc(svc.Standby, a, model.L4Addr.Compare)
	return ok
}

func hasBackend(bs []model.Backend, a model.L4Addr) bool {
	_, ok := slices.BinarySearchFunc(bs, a, func(b model.Backend, a model.L4Addr) int { return b.L4Addr.Compare(a) })
	return ok
}

// setService points v, frontend fe's view, at svc (nil: v goes), keeping
// standbyRefs and udpNamed in step (and dropping the flows Restore read
// at a default scope that gets a Service: restoredFlows). A backend svc no longer holds in
// standby nor serves is flushed: it stopped serving while it had no slot
// here (or lost one at the same time, and programFrontend flushed it
// too); and, if nothing else keeps it, its backend entry becomes a
// candidate for deletion.
func (r *Reconciler) setService(fe Frontend, v *frontendView, svc *model.Service) {
	old := v.svc
	v.svc = svc
	if old == svc {
		return
	}
	if svc != nil && fe.Scope == ScopeDefault && r.restoredFlows != nil {
		// Its Service names its standby backends now (holdUDPFlows).
		r.dropRestoredFlows(fe.L4Addr)
	}
	if fe.Proto == model.UDP && (old == nil || svc == nil || old.Name != svc.Name) {
		r.renameUDP(fe, old, svc)
	}
	var was, is []model.L4Addr
	if old != nil {
		was = old.Standby
	}
	if svc != nil {
		is = svc.Standby
	}
	if len(was) == 0 && len(is) == 0 {
		return // nearly always
	}
	for _, a := range is {
		r.standbyRefs[a]++
	}
	for _, a := range was {
		n := r.standbyRefs[a] - 1
		if n > 0 {
			r.standbyRefs[a] = n
		} else {
			delete(r.standbyRefs, a)
			if id, ok := r.backendOf.get(a); ok && r.isReal(id) && r.backends.refs(uint32(id)) <= 0 {
				r.backendCand[id] = true
			}
		}
		if svc != nil && a.Proto == model.UDP && !servesAddr(svc, a) {
			r.pendingFlush[a] = true
		}
	}
}

// renameUDP moves UDP frontend fe in udpNamed from the name of old to
// that of svc (nil: none).
func (r *Reconciler) renameUDP(fe Frontend, old, svc *model.Service) {
	if old != nil {
		fes := r.udpNamed[old.Name]
		if i := slices.Index(fes, fe); i >= 0 {
			fes = slices.Delete(fes, i, i+1)
		}
		if len(fes) == 0 {
			delete(r.udpNamed, old.Name)
		} else {
			r.udpNamed[old.Name] = fes
		}
	}
	if svc != nil {
		r.udpNamed[svc.Name] = append(r.udpNamed[svc.Name], fe)
	}
}

// servedByName says whether removing NodePort frontend fe, programmed
// for old, leaves UDP backend a served at fe's node port: by a desired
// NodePort frontend of the same Service port name and port number at
// another node address (one whose view was programmed for that name,
// udpNamed, and whose desired Service still has a: servesAddr). A
// frontend of the name new to the view is not looked at: its backend
// then is flushed, as before.
//
// kube-proxy keys its cleanup by Service port and endpoint: a node
// address that leaves --nodeport-addresses (its NodePort frontend goes
// while the others stay) deletes no flow while the port still serves
// the endpoint. A flush here is by backend address, across every
// frontend, so such a backend is not flushed. Only a NodePort whose
// number the Service port still holds is spared so: its address and
// port can come back only for the same Service port, whereas a
// LoadBalancer IP, an external IP or a NodePort number the Service
// gives up may be given to another Service within the UDP timeout, and
// the datapath follows an entry at a frontend whatever Service it was
// made for (ct_fwd_usable checks the backend, not the Service): their
// backends are flushed, as before.
func (r *Reconciler) servedByName(fe Frontend, old *model.Service, a model.L4Addr, services model.Services) bool {
	if old == nil || old.Kind != model.NodePort {
		return false
	}
	for _, o := range r.udpNamed[old.Name] {
		if o.Port != fe.Port || o.Proto != fe.Proto {
			continue
		}
		if svc := services.Get(o.L4Addr); svc != nil && svc.Name == old.Name && svc.Kind == model.NodePort && servesAddr(svc, a) {
			return true
		}
	}
	return false
}

// standby says whether some frontend's Service holds backend a in
// standby (its entry is kept).
func (r *Reconciler) standby(a model.L4Addr) bool { return r.standbyRefs[a] > 0 }
