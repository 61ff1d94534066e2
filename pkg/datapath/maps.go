package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Maps is the reconciler's view of the pinned maps: every write is a single
// idempotent map update or delete, or a batch of them (batch.go); the
// ordering between them (backends, then slots, then the master) is the
// reconciler's job.
//
// Keys are built from zeroed structs so that their padding, which the
// kernel hashes too, is always zero. Addresses and ports are stored in
// network byte order, ids and slots in host order, as bpf/lib/structs.h
// says.
type Maps struct {
	services, backends, revNat, conntrack, sockRev, udpStick, metrics *ebpf.Map
	devices, srcRanges, ctNew, ctFlush, serviceIPs, nodeCIDRs         *ebpf.Map
	affinity, affFix                                                  *ebpf.Map
	svcStats                                                          *ebpf.Map // per-Service counters (svcstats.go)
	ctFlush6                                                          *ebpf.Map // IPv6 conntrack flush set (conntrack.go)
	// The IPv6 conntrack tables, established and new, for
	// UDPFlowBackends (udpflows.go); nil in a Maps of pins.
	conntrack6, ctNew6 *ebpf.Map
	// devMu orders the writes of sluice_devices after the start: the
	// port flag's read-modify-writes (portwatch.go) and the attach and
	// detach of the devices that --devices' patterns follow (devwatch.go).
	devMu sync.Mutex
	// The half-open share of sluice_conntrack and the LRU's new_live
	// word (sluice_ct_admit), and its per-CPU parts (sluice_ct_pcpu):
	// bpf/lib/conntrack.h.
	ctAdmit, ctPcpu *ebpf.Map
	sockRev6        *ebpf.Map // IPv6 sock_rev (sockdestroy.go)

	// The IPv6 twins (family.go); nil in a Maps made of an older
	// agent's pins.
	services6, backends6, revNat6, srcRanges6, serviceIPs6 *ebpf.Map
	affinity6, affFix6, nodeCIDRs6, devices6               *ebpf.Map

	// The backend slots of each family's frontends (slots.go), nil in
	// a Maps without them (tests of older pins).
	slots4, slots6 *slotTable
	// The backends arrays mapped read-write (bemem.go), nil where an
	// array cannot be mapped: its backends go through system calls.
	be4, be6 *beTable
	// The reverse-NAT arrays, mapped (rnmem.go); nil where they cannot
	// be.
	rn4, rn6 *beTable

	ctGC       *ebpf.Program // bpf/ctgc.c: conntrack GC and flush (conntrack.go)
	affFixProg *ebpf.Program // bpf/ctgc.c: session affinity upkeep (affinity.go)
	// bpf/ctgc.c: the same for IPv6 frontends (sluice6_affinity_v1).
	affFixProg6 *ebpf.Program

	// Ends the connected UDP sockets of flushed backends, nil if none
	// can be (sockdestroy.go); onSockTerm hears what it did.
	sockTerm   *sockTerminator
	onSockTerm func(SocketTermination)

	// dev_l3_maybe of each loaded object whose programs read the
	// device map for it (tc and XDP; devices.go): nil in a Maps of pins.
	l3Gates []*ebpf.Variable
	// dev_tunnel_maybe of the XDP object (bpf/lib/nat.h, xdp_fwd_ok;
	// devices.go): nil without XDP and in a Maps of pins.
	tunGates []*ebpf.Variable

	// ctNewHeld: an agent's start holds sluice_ct_new's new_live word
	// set until it is committed (HoldConntrackNew).
	ctNewHeld atomic.Bool
	// halfOpen: the drift of the half-open count that collections saw
	// (conntrack.go, GCConntrack).
	halfOpen halfOpenDrift

	cfg Config
}

var _ reconciler.Datapath = (*Maps)(nil)

// be32 returns the uint32 whose in-memory bytes are a's, in network order.
func be32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

// be16 returns the uint16 whose in-memory bytes are port in network order.
func be16(port uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], port)
	return binary.NativeEndian.Uint16(b[:])
}

func addrFromBE32(v uint32) netip.Addr {
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

func portFromBE16(v uint16) uint16 {
	var b [2]byte
	binary.NativeEndian.PutUint16(b[:], v)
	return binary.BigEndian.Uint16(b[:])
}

// checkL4 validates an L4Addr for the datapath: an IPv4 address (an
// IPv4-mapped IPv6 address is its IPv4 address) or an IPv6 one, without a
// zone, and TCP or UDP.
func checkL4(a model.L4Addr) (model.L4Addr, error) {
	a.Addr = a.Addr.Unmap()
	if !a.Addr.IsValid() || a.Addr.Zone() != "" {
		return a, fmt.Errorf("%s: not an IPv4 or IPv6 address", a)
	}
	if a.Proto != model.TCP && a.Proto != model.UDP {
		return a, fmt.Errorf("%s: protocol not supported", a)
	}
	return a, nil
}

func serviceKey(fe reconciler.Frontend, slot uint32) (sockLb4Key, error) {
	l4, err := checkL4(fe.L4Addr)
	if err != nil {
		return sockLb4Key{}, fmt.Errorf("frontend %w", err)
	}
	if slot > 0xffff {
		return sockLb4Key{}, fmt.Errorf("frontend %s: slot %d out of range", fe, slot)
	}
	if err := checkScope(fe.Scope); err != nil {
		return sockLb4Key{}, fmt.Errorf("frontend %s: %w", fe, err)
	}
	return sockLb4Key{
		Vip:   addr4(l4.Addr),
		Port:  be16(l4.Port),
		Proto: uint8(l4.Proto),
		Scope: uint8(fe.Scope),
		Slot:  uint16(slot),
	}, nil
}

// checkScope validates a scope (enum lb_scope).
func checkScope(s reconciler.Scope) error {
	if s != scopeDefault && s != scopeInternal {
		return fmt.Errorf("scope %d out of range", s)
	}
	return nil
}

func idOK(kind string, id uint32) error {
	if id == 0 {
		return fmt.Errorf("%s id 0 is reserved", kind)
	}
	return nil
}

// deleteIgnoringMissing makes deletes idempotent.
func deleteIgnoringMissing(m *ebpf.Map, key any) error {
	if err := m.Delete(key); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return err
	}
	return nil
}

// backendSlots is the number of entries of each family's backends array
// for cfg: every id the reconciler may hand out (reconciler.BackendIDSlots:
// ids are one space over both families, each with MaxBackends).
func backendSlots(cfg Config) int {
	return reconciler.BackendIDSlots(cfg.MaxBackends)
}

// serviceSlots is the number of entries of each family's reverse-NAT
// array for cfg: every service id the reconciler may hand out
// (reconciler.ServiceIDSlots). The per-Service counters are indexed alike
// (svcStatsSize).
func serviceSlots(cfg Config) int {
	return reconciler.ServiceIDSlots(cfg.MaxServices)
}

// backendPresent says whether a backend entry of m, with flags, is a
// backend: in the arrays, an entry without BE_F_PRESENT is an id no
// backend holds (structs.h); in the previous release's hash maps
// (read by OpenPinned while that agent runs) every entry is one.
func backendPresent(m *ebpf.Map, flags uint8) bool {
	return m.Type() != ebpf.Array || flags&bePresent != 0
}

// backendEntry encodes backend id -> b for sluice_backends.
func backendEntry(id reconciler.BackendID, b model.L4Addr) (uint32, sockLb4Backend, error) {
	if err := idOK("backend", uint32(id)); err != nil {
		return 0, sockLb4Backend{}, err
	}
	b, err := checkL4(b)
	if err != nil {
		return 0, sockLb4Backend{}, fmt.Errorf("upsert backend %d: %w", id, err)
	}
	return uint32(id), sockLb4Backend{Addr: addr4(b.Addr), Port: be16(b.Port), Proto: uint8(b.Proto),
		Flags: bePresent}, nil
}

// The maps of each kind of entry, with their IPv6 twins.
func (m *Maps) backendMaps() twin[uint32, sockLb4Backend, uint32, sockLb6Backend] {
	return twin[uint32, sockLb4Backend, uint32, sockLb6Backend]{m.backends, m.backends6, mapBackends, mapBackends6,
		func(k uint32, v sockLb4Backend, a netip.Addr) (uint32, sockLb6Backend) { return k, lb6Backend(v, a) }}
}

func (m *Maps) revNatMaps() twin[uint32, sockLb4RevNat, uint32, sockLb6RevNat] {
	return twin[uint32, sockLb4RevNat, uint32, sockLb6RevNat]{m.revNat, m.revNat6, mapRevNat, mapRevNat6,
		func(k uint32, v sockLb4RevNat, a netip.Addr) (uint32, sockLb6RevNat) { return k, lb6RevNat(v, a) }}
}

func (m *Maps) serviceMaps() twin[sockLb4Key, sockLb4Service, sockLb6Key, sockLb4Service] {
	return twin[sockLb4Key, sockLb4Service, sockLb6Key, sockLb4Service]{m.services, m.services6, mapServices, mapServices6,
		func(k sockLb4Key, v sockLb4Service, a netip.Addr) (sockLb6Key, sockLb4Service) {
			return lb6Key(k, a), v
		}}
}

// UpsertBackend writes backend id -> b.
func (m *Maps) UpsertBackend(id reconciler.BackendID, b model.L4Addr) error {
	k, v, err := backendEntry(id, b)
	if err != nil {
		return err
	}
	if err := putOne(m.beArrays(), k, v, b.Addr, lb6Backend); err != nil {
		return fmt.Errorf("upsert backend %d (%s): %w", id, b, err)
	}
	return nil
}

// DeleteBackend deletes backend id; deleting a missing backend succeeds.
func (m *Maps) DeleteBackend(id reconciler.BackendID) error {
	if _, err := m.DeleteBackends([]reconciler.BackendID{id}); err != nil {
		return fmt.Errorf("delete backend %d: %w", id, err)
	}
	return nil
}

// revNatEntry encodes service id -> frontend address, port, protocol and
// scope for sluice_rev_nat.
func revNatEntry(id reconciler.ServiceID, fe reconciler.Frontend) (uint32, sockLb4RevNat, error) {
	if err := idOK("service", uint32(id)); err != nil {
		return 0, sockLb4RevNat{}, err
	}
	l4, err := checkL4(fe.L4Addr)
	if err == nil {
		err = checkScope(fe.Scope)
	}
	if err != nil {
		return 0, sockLb4RevNat{}, fmt.Errorf("upsert rev-nat %d: %w", id, err)
	}
	return uint32(id), sockLb4RevNat{Vip: addr4(l4.Addr), Port: be16(l4.Port), Proto: uint8(l4.Proto), Scope: uint8(fe.Scope),
		Flags: rnPresent}, nil
}

// UpsertRevNat writes service id -> frontend address, port, protocol and
// scope.
func (m *Maps) UpsertRevNat(id reconciler.ServiceID, fe reconciler.Frontend) error {
	k, v, err := revNatEntry(id, fe)
	if err != nil {
		return err
	}
	if err := putOne(m.rnArrays(), k, v, fe.Addr, lb6RevNat); err != nil {
		return fmt.Errorf("upsert rev-nat %d (%s): %w", id, fe, err)
	}
	return nil
}

// DeleteRevNat deletes service id's reverse-NAT entry.
func (m *Maps) DeleteRevNat(id reconciler.ServiceID) error {
	if _, err := m.DeleteRevNats([]reconciler.ServiceID{id}); err != nil {
		return fmt.Errorf("delete rev-nat %d: %w", id, err)
	}
	return nil
}

// checkSlot checks slot >= 1 of a frontend naming backend.
func checkSlot(fe reconciler.Frontend, slot uint32, backend reconciler.BackendID) error {
	if slot == 0 {
		return fmt.Errorf("upsert slot of %s: slot 0 is the master, use UpsertMaster", fe)
	}
	if err := idOK("backend", uint32(backend)); err != nil {
		return err
	}
	if _, err := serviceKey(fe, slot); err != nil {
		return fmt.Errorf("upsert slot: %w", err)
	}
	return nil
}

// frontendKey is fe as the slot tables key it: its address unmapped, as
// the kernel's keys read back give it.
func frontendKey(fe reconciler.Frontend) reconciler.Frontend {
	fe.Addr = fe.Addr.Unmap()
	return fe
}

// UpsertSlot writes slot >= 1 of a frontend into its range of the slots
// array (slots.go), moving it to a larger range if the slot is beyond
// its own.
func (m *Maps) UpsertSlot(fe reconciler.Frontend, slot uint32, backend reconciler.BackendID) error {
	if err := checkSlot(fe, slot, backend); err != nil {
		return err
	}
	fe = frontendKey(fe)
	t := m.slotTableOf(fe)
	if t == nil {
		return fmt.Errorf("upsert slot %d of %s: no slots array", slot, fe)
	}
	t.mu.Lock()
	defer t.unlock()
	if err := t.write(fe, slot, []reconciler.BackendID{backend}, m.rebaseMaster); err != nil {
		return fmt.Errorf("upsert slot %d of %s: %w", slot, fe, err)
	}
	return nil
}

// masterEntry encodes the master of a frontend for sluice_services; the
// value repeats the key's scope, for a reader that holds the master to
// find its slots. Its slots_base is the caller's (slotTable.forMaster).
func masterEntry(fe reconciler.Frontend, ms reconciler.Master) (sockLb4Key, sockLb4Service, error) {
	if err := idOK("service", uint32(ms.ID)); err != nil {
		return sockLb4Key{}, sockLb4Service{}, err
	}
	if ms.Count > 0xffff {
		return sockLb4Key{}, sockLb4Service{}, fmt.Errorf("upsert master of %s: %d backends, at most 65535", fe, ms.Count)
	}
	k, err := serviceKey(fe, 0)
	if err != nil {
		return sockLb4Key{}, sockLb4Service{}, fmt.Errorf("upsert master: %w", err)
	}
	// A master's backend_id is the union's affinity_timeout.
	return k, sockLb4Service{BackendId: ms.AffinityTimeout, Count: ms.Count, RevNatId: uint32(ms.ID), Flags: ms.Flags, Scope: uint8(fe.Scope)}, nil
}

// masterWithBase is masterEntry with the base of the frontend's range,
// which it moves to one that holds count slots if its own does not.
func (m *Maps) masterWithBase(fe reconciler.Frontend, ms reconciler.Master) (sockLb4Key, sockLb4Service, error) {
	k, v, err := masterEntry(fe, ms)
	if err != nil {
		return k, v, err
	}
	fe = frontendKey(fe)
	t := m.slotTableOf(fe)
	if t == nil {
		return k, v, fmt.Errorf("upsert master of %s: no slots array", fe)
	}
	t.mu.Lock()
	defer t.unlock()
	if v.SlotsBase, err = t.forMaster(fe, ms.Count, m.rebaseMaster); err != nil {
		return k, v, fmt.Errorf("upsert master of %s: %w", fe, err)
	}
	return k, v, nil
}

// UpsertMaster writes the master of a frontend, with the base of its
// slots.
func (m *Maps) UpsertMaster(fe reconciler.Frontend, ms reconciler.Master) error {
	k, v, err := m.masterWithBase(fe, ms)
	if err != nil {
		return err
	}
	if err := m.serviceMaps().put(fe.Addr, k, v); err != nil {
		return fmt.Errorf("upsert master of %s: %w", fe, err)
	}
	if ms.Flags&reconciler.FlagRetired != 0 {
		// Its range is quarantined now the kernel no longer reads it.
		fe = frontendKey(fe)
		if t := m.slotTableOf(fe); t != nil {
			t.mu.Lock()
			t.release(fe)
			t.unlock()
		}
	}
	return nil
}

// DeleteSlot deletes slot (0 = the master) of a frontend: the master's
// entry, its range quarantined after it (slotAlloc), or a slot emptied.
func (m *Maps) DeleteSlot(fe reconciler.Frontend, slot uint32) error {
	k, err := serviceKey(fe, slot)
	if err != nil {
		return fmt.Errorf("delete slot: %w", err)
	}
	fe = frontendKey(fe)
	t := m.slotTableOf(fe)
	if slot > 0 {
		if t != nil {
			t.mu.Lock()
			err := t.clear(fe, slot)
			t.unlock()
			if err != nil {
				return fmt.Errorf("delete slot %d of %s: %w", slot, fe, err)
			}
		}
		return nil
	}
	if err := m.serviceMaps().del(fe.Addr, k); err != nil {
		return fmt.Errorf("delete slot %d of %s: %w", slot, fe, err)
	}
	if t != nil {
		t.mu.Lock()
		t.drop(fe)
		t.unlock()
	}
	return nil
}

// Dump reads the service, backend, reverse-NAT, source-range and
// service-IP maps of both families back, and the service CIDRs.
func (m *Maps) Dump() (*reconciler.KernelState, error) {
	return dumpState(m.stateMaps())
}

func (m *Maps) stateMaps() stateMaps {
	return stateMaps{
		slots4: m.slots4, slots6: m.slots6, slotArr4: m.slots4.array(), slotArr6: m.slots6.array(),
		services: m.services, backends: m.backends, revNat: m.revNat, srcRanges: m.srcRanges, serviceIPs: m.serviceIPs,
		services6: m.services6, backends6: m.backends6, revNat6: m.revNat6, srcRanges6: m.srcRanges6, serviceIPs6: m.serviceIPs6,
		nodeCIDRs: m.nodeCIDRs, nodeCIDRs6: m.nodeCIDRs6,
	}
}

// stateMaps are the maps a KernelState is read from, IPv4 and IPv6. The
// read-only Pinned may have no service-IP map, and neither has IPv6 maps
// when an older agent pinned the maps: nil, read as empty.
type stateMaps struct {
	services, backends, revNat, srcRanges, serviceIPs      *ebpf.Map
	services6, backends6, revNat6, srcRanges6, serviceIPs6 *ebpf.Map
	// sluice_node_cidrs and its twin, for the service CIDRs (Dump only:
	// walkState does not read them).
	nodeCIDRs, nodeCIDRs6 *ebpf.Map
	// The slots: the agent's tables (Maps), or the arrays read by the
	// masters' bases (the read-only Pinned).
	slots4, slots6     *slotTable
	slotArr4, slotArr6 *ebpf.Map
}

// masterOf is the Master of a services value's fields (both layouts: v2
// sockLb4Service, v1 lb4ServiceV1), whose backend_id is the union's
// affinity_timeout in a master.
func masterOf(revNatID, count uint32, flags uint8, backendID uint32) reconciler.Master {
	return reconciler.Master{ID: reconciler.ServiceID(revNatID), Count: count, Flags: flags, AffinityTimeout: backendID}
}

func frontendOf(a netip.Addr, port uint16, proto, scope uint8) reconciler.Frontend {
	return reconciler.Frontend{
		L4Addr: model.L4Addr{Addr: a, Port: portFromBE16(port), Proto: model.Protocol(proto)},
		Scope:  reconciler.Scope(scope),
	}
}

func l4Of(a netip.Addr, port uint16, proto uint8) model.L4Addr {
	return model.L4Addr{Addr: a, Port: portFromBE16(port), Proto: model.Protocol(proto)}
}

// dumpState reads ms into a KernelState (shared by Maps and the read-only
// Pinned): what walkState gives, collected.
func dumpState(ms stateMaps) (*reconciler.KernelState, error) {
	d := &dumper{ks: &reconciler.KernelState{
		Masters:  map[reconciler.Frontend]reconciler.Master{},
		Slots:    map[reconciler.Frontend]map[uint32]reconciler.BackendID{},
		Backends: map[reconciler.BackendID]model.L4Addr{},
		RevNat:   map[reconciler.ServiceID]reconciler.Frontend{},
	}}
	if err := walkState(ms, d); err != nil {
		return nil, err
	}
	slices.SortFunc(d.ks.ServiceIPs, netip.Addr.Compare)
	cidrs, err := (&Maps{nodeCIDRs: ms.nodeCIDRs, nodeCIDRs6: ms.nodeCIDRs6}).NodeCIDRs()
	if err != nil {
		return nil, err
	}
	for _, c := range cidrs {
		if c.Kind == nodeCIDRService {
			d.ks.ServiceCIDRs = append(d.ks.ServiceCIDRs, c.Prefix)
		}
	}
	slices.SortFunc(d.ks.ServiceCIDRs, netip.Prefix.Compare)
	return d.ks, nil
}

// dumper collects what walkState gives into a KernelState.
type dumper struct{ ks *reconciler.KernelState }

func (d *dumper) Master(fe reconciler.Frontend, m reconciler.Master) bool {
	d.ks.Masters[fe] = m
	return true
}

func (d *dumper) Slot(fe reconciler.Frontend, slot uint32, id reconciler.BackendID) bool {
	if d.ks.Slots[fe] == nil {
		d.ks.Slots[fe] = map[uint32]reconciler.BackendID{}
	}
	d.ks.Slots[fe][slot] = id
	return true
}

func (d *dumper) Backend(id reconciler.BackendID, a model.L4Addr) bool {
	d.ks.Backends[id] = a
	return true
}

func (d *dumper) RevNat(id reconciler.ServiceID, fe reconciler.Frontend) bool {
	d.ks.RevNat[id] = fe
	return true
}

func (d *dumper) SourceRange(fe model.L4Addr, p netip.Prefix) bool {
	if d.ks.SourceRanges == nil {
		d.ks.SourceRanges = map[model.L4Addr][]netip.Prefix{}
	}
	d.ks.SourceRanges[fe] = append(d.ks.SourceRanges[fe], p)
	return true
}

func (d *dumper) ServiceIP(a netip.Addr) bool {
	d.ks.ServiceIPs = append(d.ks.ServiceIPs, a)
	return true
}

// Walk gives v the entries of the service, backend, reverse-NAT,
// source-range and service-IP maps of both families, as Dump reads them,
// one at a time. Like Dump, it also checks each master read against the
// agent's slot ranges (walkState), repairing a base that drifted.
//
// The re-read also counts the present entries of the backends and
// reverse-NAT arrays anew (beTable.recount), where entries changed
// behind the agent's back, or written around its tables, made the
// counts its writes keep wrong or unknown.
func (m *Maps) Walk(v reconciler.KernelVisitor) error {
	err := walkState(m.stateMaps(), v)
	m.beArrays().recount()
	m.rnArrays().recount()
	return err
}

// walkState gives v the entries of ms, map by map, until a method of v
// returns false or a read fails (shared by Maps and the read-only Pinned,
// and by Dump). Where ms has the agent's slot tables (Maps), every master
// read also goes through slotTable.checkMaster, on purpose: a Dump or a
// Walk updates the agent's slot ranges, and that is how a master whose
// base drifted behind the agent's back loses its range and gets its
// slots rewritten into a new one.
func walkState(ms stateMaps, v reconciler.KernelVisitor) error {
	more := true // v wants more
	// The masters' slots, where no table has them: base and count, by
	// frontend.
	var bases4, bases6 map[reconciler.Frontend][2]uint32
	master := func(t *slotTable, bases *map[reconciler.Frontend][2]uint32, fe reconciler.Frontend, sv *sockLb4Service) bool {
		if t != nil {
			t.mu.Lock()
			t.checkMaster(fe, sv.SlotsBase, sv.Count)
			t.unlock()
		} else if sv.Count > 0 {
			if *bases == nil {
				*bases = map[reconciler.Frontend][2]uint32{}
			}
			(*bases)[fe] = [2]uint32{sv.SlotsBase, sv.Count}
		}
		more = v.Master(fe, masterOf(sv.RevNatId, sv.Count, sv.Flags, sv.BackendId))
		return more
	}
	// The previous release's services maps (v1, read by the read-only
	// Pinned until the agent of this one converts them): masters and
	// slots in one hash.
	serviceV1 := func(fe reconciler.Frontend, slot uint16, sv *lb4ServiceV1) bool {
		if slot == 0 {
			more = v.Master(fe, masterOf(sv.RevNatId, sv.Count, sv.Flags, sv.BackendId))
		} else {
			more = v.Slot(fe, uint32(slot), reconciler.BackendID(sv.BackendId))
		}
		return more
	}
	slots := func(t *slotTable, arr *ebpf.Map, name string, bases map[reconciler.Frontend][2]uint32) error {
		if t != nil {
			t.mu.Lock()
			defer t.unlock()
			if err := t.walk(func(fe reconciler.Frontend, slot uint32, id reconciler.BackendID) bool {
				more = v.Slot(fe, slot, id)
				return more
			}); err != nil {
				return fmt.Errorf("dump %s: %w", name, err)
			}
			return nil
		}
		return eachMasterSlot(arr, name, bases, func(fe reconciler.Frontend, slot uint32, id reconciler.BackendID) bool {
			more = v.Slot(fe, slot, id)
			return more
		})
	}
	var bad uint32 // a source-range key that covers no whole frontend, or 0
	sourceRange := func(fe model.L4Addr, saddr netip.Addr, prefixlen, feBits uint32) bool {
		bits := int(prefixlen) - int(feBits)
		if bits < 0 || bits > saddr.BitLen() {
			// Only a key that covers a whole frontend can be told
			// apart; the agent writes no other.
			bad = prefixlen
			return false
		}
		more = v.SourceRange(fe, netip.PrefixFrom(saddr, bits))
		return more
	}
	walks := []func() error{
		func() error {
			if isServicesV1(ms.services) {
				return eachEntryWhile(ms.services, mapServices, func(k *sockLb4Key, sv *lb4ServiceV1) bool {
					return serviceV1(frontendOf(addrFromBE32(k.Vip), k.Port, k.Proto, k.Scope), k.Slot, sv)
				})
			}
			return eachEntryWhile(ms.services, mapServices, func(k *sockLb4Key, sv *sockLb4Service) bool {
				return master(ms.slots4, &bases4, frontendOf(addrFromBE32(k.Vip), k.Port, k.Proto, k.Scope), sv)
			})
		},
		func() error {
			if isServicesV1(ms.services6) {
				return eachEntryWhile(ms.services6, mapServices6, func(k *sockLb6Key, sv *lb4ServiceV1) bool {
					return serviceV1(frontendOf(addrFrom16(k.Vip), k.Port, k.Proto, k.Scope), k.Slot, sv)
				})
			}
			return eachEntryWhile(ms.services6, mapServices6, func(k *sockLb6Key, sv *sockLb4Service) bool {
				return master(ms.slots6, &bases6, frontendOf(addrFrom16(k.Vip), k.Port, k.Proto, k.Scope), sv)
			})
		},
		func() error { return slots(ms.slots4, ms.slotArr4, mapSlots, bases4) },
		func() error { return slots(ms.slots6, ms.slotArr6, mapSlots6, bases6) },
		func() error {
			return eachBackendWhile(ms.backends, mapBackends, func(k *uint32, b *sockLb4Backend) bool {
				more = v.Backend(reconciler.BackendID(*k), l4Of(addrFromBE32(b.Addr), b.Port, b.Proto))
				return more
			})
		},
		func() error {
			return eachBackendWhile(ms.backends6, mapBackends6, func(k *uint32, b *sockLb6Backend) bool {
				more = v.Backend(reconciler.BackendID(*k), l4Of(addrFrom16(b.Addr), b.Port, b.Proto))
				return more
			})
		},
		func() error {
			return eachRevNatWhile(ms.revNat, ms.revNat6, func(id reconciler.ServiceID, fe reconciler.Frontend) bool {
				more = v.RevNat(id, fe)
				return more
			})
		},
		func() error {
			err := eachEntryWhile(ms.srcRanges, mapSrcRanges, func(k *sockSrcRangeKey, _ *uint8) bool {
				return sourceRange(l4Of(addrFromBE32(k.Vip), k.Port, k.Proto), addrFromBE32(k.Saddr), k.Prefixlen, 64)
			})
			if err == nil {
				err = eachEntryWhile(ms.srcRanges6, mapSrcRanges6, func(k *sockSrcRange6Key, _ *uint8) bool {
					return sourceRange(l4Of(addrFrom16(k.Vip), k.Port, k.Proto), addrFrom16(k.Saddr), k.Prefixlen, 160)
				})
			}
			if err == nil && bad != 0 {
				err = fmt.Errorf("dump %s: key with prefix length %d", mapSrcRanges, bad)
			}
			return err
		},
		func() error {
			return eachEntryWhile(ms.serviceIPs, mapServiceIPs, func(k *uint32, _ *uint8) bool {
				more = v.ServiceIP(addrFromBE32(*k))
				return more
			})
		},
		func() error {
			return eachEntryWhile(ms.serviceIPs6, mapServiceIPs6, func(k *sockV6addr, _ *uint8) bool {
				more = v.ServiceIP(addrFrom16(*k))
				return more
			})
		},
	}
	for _, walk := range walks {
		if err := walk(); err != nil {
			return err
		}
		if !more {
			return nil
		}
	}
	return nil
}

// Capacity returns the sizes of sluice_rev_nat (the services it holds: as
// an array it has an entry for every id, serviceSlots), sluice_backends
// (likewise, backendSlots) and sluice_services. Their IPv6 twins have the same sizes:
// the reconciler counts each family's backends and service entries
// against its own maps, and services of both families together, as
// service ids are one space (the per-Service counters are sized for
// MaxServices ids).
func (m *Maps) Capacity() (services, backends, serviceEntries int) {
	return m.cfg.MaxServices, m.cfg.MaxBackends, m.cfg.MaxServiceEntries
}
