package reconciler

// The periodic re-read of the maps (SetRefreshInterval) compares them with
// the view as it reads them (Datapath.Walk), collecting nothing: at 30,000
// Services x 10 a dump of them (KernelState) and a new view built from it
// made about 115 MB of heap (issue 14), every 5 minutes, to find in the
// common case that nothing drifted. Only when something did (or the walk
// failed) is the view rebuilt from a dump, as it always was (refresh).

import (
	"net/netip"
	"slices"

	"github.com/sluice-lb/sluice/pkg/model"
)

// viewCheck is the KernelVisitor that compares the maps with the view: it
// stops at the first entry the view does not hold as it is, and counts the
// entries of each map, so that an entry the view holds and the maps do not
// shows up as a count short.
type viewCheck struct {
	r                                             *Reconciler
	masters, slots, backends, revNat, ranges, ips int
	drift                                         bool
}

func (c *viewCheck) differs() bool {
	c.drift = true
	return false
}

func (c *viewCheck) Master(fe Frontend, m Master) bool {
	v := c.r.frontends.val(fe)
	if v == nil || !v.hasMaster || v.master != m {
		return c.differs()
	}
	c.masters++
	return true
}

func (c *viewCheck) Slot(fe Frontend, slot uint32, id BackendID) bool {
	v := c.r.frontends.val(fe)
	if v == nil {
		return c.differs()
	}
	if got, ok := v.slots.get(slot); !ok || got != id || slot == 0 {
		return c.differs()
	}
	c.slots++
	return true
}

func (c *viewCheck) Backend(id BackendID, addr model.L4Addr) bool {
	if got, ok := c.r.backends.get(uint32(id)); !ok || got != addr {
		return c.differs()
	}
	c.backends++
	return true
}

func (c *viewCheck) RevNat(id ServiceID, fe Frontend) bool {
	if got, ok := c.r.revNat.get(uint32(id)); !ok || got != fe {
		return c.differs()
	}
	c.revNat++
	return true
}

func (c *viewCheck) SourceRange(fe model.L4Addr, p netip.Prefix) bool {
	v := c.r.frontends.val(DefaultScope(fe))
	if v == nil {
		return c.differs()
	}
	if _, ok := slices.BinarySearchFunc(v.ranges(), p, netip.Prefix.Compare); !ok {
		return c.differs()
	}
	c.ranges++
	return true
}

func (c *viewCheck) ServiceIP(a netip.Addr) bool {
	if !c.r.inServiceIPs(a) {
		return c.differs()
	}
	c.ips++
	return true
}

// mapsMatchView reports whether the maps hold exactly what the view says
// they hold: every entry read is in the view as it is, and each map holds
// as many entries as the view has of it. An error reading them is reported
// as a difference (the caller reads them again, with Dump).
func (r *Reconciler) mapsMatchView() bool {
	c := viewCheck{r: r}
	if err := r.dp.Walk(&c); err != nil {
		r.log.Debug("Walk of the datapath maps failed, reading them whole", "err", err)
		return false
	}
	if c.drift {
		return false
	}
	var masters, slots, ranges int
	for _, v := range r.frontends.all() {
		if v.hasMaster {
			masters++
		}
		slots += v.slots.n
		ranges += len(v.ranges())
	}
	return c.masters == masters && c.slots == slots && c.ranges == ranges &&
		c.backends == r.backends.len() && c.revNat == r.revNat.len() && c.ips == r.nServiceIPs
}
