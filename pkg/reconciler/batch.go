package reconciler

// Batched programming of new frontends. A frontend whose address the view
// knows nothing of (in either scope) is programmed with new entries only:
// no slot moves, no deletes, no session affinity to fix. Many of them (the
// first program of 30,000 services) are programmed together, map by map,
// one batch per map, in the order that programFrontend writes one:
//
//	backends -> rev_nat -> slots 1..m -> source ranges -> masters ->
//	service IPs
//
// so every entry a batch names was written by an earlier batch, and a
// datapath reading concurrently sees what it sees between single writes.
// Within the master batch a frontend's internal scope comes before its
// default scope (Frontend.Compare). A batch stops at its first failed
// entry; what follows is written one entry at a time, so a failure fails
// only the frontends that entry belongs to, which then write nothing
// more and keep no master, exactly as programFrontend leaves them.

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/sluice-lb/sluice/pkg/model"
)

// errBatchSkipped marks an entry a batch's retry skips: its frontend
// failed already.
var errBatchSkipped = errors.New("skipped")

// freshAddr reports whether the view has nothing at a, in either scope.
func (r *Reconciler) freshAddr(a model.L4Addr) bool {
	return r.frontends.val(DefaultScope(a)) == nil && r.frontends.val(Frontend{L4Addr: a, Scope: ScopeInternal}) == nil
}

// splitFresh splits changed (sorted) into the frontends programFresh
// programs (both scopes of an address are fresh together) and the others,
// keeping their order. With fewer than r.batchMin fresh ones, all go the
// single-write way.
func (r *Reconciler) splitFresh(changed []*desiredFrontend) (fresh, rest []*desiredFrontend) {
	if r.batchMin <= 0 {
		return nil, changed
	}
	n := 0
	for _, d := range changed {
		if r.freshAddr(d.fe.L4Addr) {
			n++
		}
	}
	if n < r.batchMin {
		return nil, changed
	}
	if n == len(changed) {
		return changed, nil // a first program's: no copy
	}
	fresh = make([]*desiredFrontend, 0, n)
	rest = make([]*desiredFrontend, 0, len(changed)-n)
	for _, d := range changed {
		if r.freshAddr(d.fe.L4Addr) {
			fresh = append(fresh, d)
		} else {
			rest = append(rest, d)
		}
	}
	return fresh, rest
}

// defaultFreshChunk is how many fresh frontends programFresh programs at
// once (Reconciler.freshChunk, unless a test sets it). Its batches hold
// copies of their entries, live until the batch is written (and their
// room then serves the next chunk, freshBufs): a first program of 30,000
// Services x 8 in one go held about 30 MiB of them at its peak, on top
// of the view it builds, which the collector then let the heap grow to
// twice of; 4,096 frontends x 10 held about 4.5 MB, on top of the
// agent's heap at its peak (the collector does not run during a first
// program). A thousand keep them about 1 MB and still make every batch
// large (the datapath writes a batch in system calls of 1,024 entries:
// the masters' and rev_nat's in one, the slots' and backends' in about
// ten).
const defaultFreshChunk = 1024

// freshChunk returns how many of fresh (sorted) programFresh takes next:
// size, and then as many more as it takes to keep both scopes of an
// address together (a default scope's master names its internal scope,
// which must be programmed in the same go).
func freshChunk(fresh []*desiredFrontend, size int) int {
	n := min(len(fresh), max(1, size))
	for n < len(fresh) && fresh[n].fe.L4Addr == fresh[n-1].fe.L4Addr {
		n++
	}
	return n
}

// batch writes n entries: entries 0..n-1 in one operation (many), and
// those after the one it failed on one at a time (one). ok hears of every
// entry written, fail of every entry that failed (not of those one
// skipped with errBatchSkipped); the three are called with no i before
// one they were called with already.
func (r *Reconciler) batch(n int, many func() (int, error), one func(i int) error, ok func(i int), fail func(i int, err error)) {
	if n == 0 {
		return
	}
	r.writes++
	k, err := many()
	k = max(0, min(k, n))
	for i := range k {
		ok(i)
	}
	if k == n {
		return
	}
	if err != nil {
		// Entry k failed: the error is its own.
		fail(k, err)
		k++
	}
	for i := k; i < n; i++ {
		err := one(i)
		switch {
		case errors.Is(err, errBatchSkipped):
			continue
		case err != nil:
			r.writes++
			fail(i, err)
		default:
			r.writes++
			ok(i)
		}
	}
}

// freshBufs are programFresh's batches and its indexes into them, kept
// from one chunk of fresh frontends to the next in one Apply: a first
// program of 30,000 Services x 10 made a new set per chunk, 30 MB in all
// (of 70) that the collector then had to catch up with, on the agent's
// heap of the manifests or the informers' caches. Their entries are
// copies (of ids, addresses and frontends): nothing outlives the Apply.
type freshBufs struct {
	ids  [][]BackendID
	flat []BackendID
	sids []ServiceID
	bes  []BackendEntry
	rns  []RevNatEntry
	runs []SlotRun
	ms   []MasterEntry
	ips  []netip.Addr
	// The frontend of each entry of rns, runs and ms.
	rnOf, runOf, mOf []*desiredFrontend
}

// reuse returns s emptied, with room for n.
func reuse[T any](s []T, n int) []T {
	return slices.Grow(s[:0], n)
}

// programFresh programs fresh frontends (see splitFresh) in batches and
// returns one error per frontend it could not program. It leaves the
// view as programFrontend would have, frontend by frontend. buf holds
// the batches of the chunk before (if any), whose room it reuses.
func (r *Reconciler) programFresh(ds []*desiredFrontend, capacity sizes, buf *freshBufs) []error {
	var errs []error
	failed := make(map[Frontend]bool)
	fail := func(d *desiredFrontend, err error) {
		if !failed[d.fe] {
			failed[d.fe] = true
			errs = append(errs, frontendError(d.svc.Name, d.fe, false, err))
		}
	}
	// internalFailed reports whether d's master would say two scopes
	// while its internal scope failed (or is not programmed here).
	var inBatch map[Frontend]bool // made when a two-scope frontend first asks
	internalFailed := func(d *desiredFrontend) bool {
		if d.flags&FlagTwoScopes == 0 {
			return false
		}
		if inBatch == nil {
			inBatch = make(map[Frontend]bool, len(ds))
			for _, d := range ds {
				inBatch[d.fe] = true
			}
		}
		in := Frontend{L4Addr: d.fe.L4Addr, Scope: ScopeInternal}
		return !inBatch[in] || failed[in]
	}

	// Checked before any write, as programFrontend checks them: a
	// frontend that is invalid or does not fit fails alone and writes
	// nothing. Backends new to several frontends count once; when
	// everything fits even counted many times over (the common case),
	// they are not counted at all.
	var upper sizes
	naddrs := 0
	for _, d := range ds {
		naddrs += len(d.backends)
		f := familyOf(d.fe.Addr)
		upper.services++
		upper.backends[f] += len(d.backends)
		upper.entries[f] += 1 + len(d.backends)
		upper.ranges[f] += len(d.ranges)
	}
	// (Retired masters are freed for a frontend that does not fit, not
	// for this upper bound.) All of them are new: they leave the reserve
	// to changes of programmed frontends (capacity.go).
	reserve := reserveOf(capacity)
	roomy := checkRoom(r.inUse(), upper, capacity, reserve) == nil
	var need sizes
	var counted map[model.L4Addr]bool
	if !roomy {
		counted = make(map[model.L4Addr]bool)
	}
	// A two-scope frontend's scopes are checked together (pairAt): both
	// are written, or neither.
	for i := 0; i < len(ds); i++ {
		group := ds[i : i+1]
		if pairAt(ds, i) {
			group = ds[i : i+2]
			i++
		}
		var err error
		for _, d := range group {
			if err = validate(d); err != nil {
				break
			}
		}
		var n sizes
		if err == nil && !roomy {
			n = r.needOf(group, counted)
			err = r.checkRoomFreeing(need, n, capacity, reserve)
		}
		if err != nil {
			for _, d := range group {
				fail(d, err)
			}
			continue
		}
		if roomy {
			continue
		}
		need = need.add(n)
		for _, d := range group {
			r.markNewBackends(d, counted)
		}
	}

	// Ids: the ones reserved before, or new ones.
	// (A frontend failed already has no ids: sids is read only where
	// set below.)
	buf.ids, buf.flat, buf.sids = reuse(buf.ids, len(ds))[:len(ds)], reuse(buf.flat, naddrs)[:naddrs], reuse(buf.sids, len(ds))[:len(ds)]
	ids, flat, sids := buf.ids, buf.flat, buf.sids
	clear(ids)
	bes := reuse(buf.bes, naddrs)
	defer func() { buf.bes = bes }()
	// The ids handed out below are under next+naddrs: room for them at
	// once, up to a million (grown by append as the ids came, the set
	// allocated 0.3 MB in a first program of 30,000 x 10).
	queued := make(bitset, 0, min(int(r.beIDs.next)+naddrs, 1<<20)/64+1)
	newBackendID := func() BackendID { return BackendID(r.beIDs.alloc()) }
	for i, d := range ds {
		if failed[d.fe] {
			continue
		}
		sid, ok := r.serviceOf.get(d.fe)
		if !ok {
			sid = ServiceID(r.svcIDs.alloc())
			// As program does: a reused id must not carry the counters
			// of the frontend that had it (one write each, and none but
			// a bounds check without --service-metrics).
			if err := r.dp.ResetServiceStats(sid); err != nil {
				r.svcIDs.release(uint32(sid))
				fail(d, fmt.Errorf("reset counters of service %d: %w", sid, err))
				continue
			}
			r.serviceOf.put(d.fe, sid)
		}
		sids[i] = sid
		ids[i], flat = flat[:len(d.backends):len(d.backends)], flat[len(d.backends):]
		for j, b := range d.backends {
			a := b.L4Addr
			id, _ := r.backendOf.getOrPut(a, newBackendID)
			ids[i][j] = id
			if cur, ok := r.backend(id); (ok && cur == a) || queued.has(uint32(id)) {
				continue
			}
			queued.set(uint32(id))
		}
	}
	// The backends to write, in the order their ids first came: made in
	// a walk of their own. In the walk above each new address takes
	// stores to random cache lines of the address-to-id table, which
	// the CPU commits in order: the entries' stores waited behind them
	// there (about a sixth of a first program's own CPU at 30,000 x 10);
	// here they do not, though part of that wait moves to the lookups.
	for i, d := range ds {
		for j, id := range ids[i] {
			if queued.has(uint32(id)) {
				queued.clear(uint32(id))
				bes = append(bes, BackendEntry{ID: id, Addr: d.backends[j].L4Addr})
			}
		}
	}

	// 1. Backends.
	beErr := make(map[BackendID]error)
	r.batch(len(bes),
		func() (int, error) { return r.dp.UpsertBackends(bes) },
		func(i int) error { return r.dp.UpsertBackend(bes[i].ID, bes[i].Addr) },
		func(i int) { r.putBackend(bes[i].ID, bes[i].Addr) },
		func(i int, err error) {
			beErr[bes[i].ID] = fmt.Errorf("upsert backend %d (%s): %w", bes[i].ID, bes[i].Addr, err)
		})
	if len(beErr) > 0 {
		for i, d := range ds {
			for _, id := range ids[i] {
				if err := beErr[id]; err != nil {
					fail(d, err)
					break
				}
			}
		}
	}

	// 2. Reverse NAT.
	rns, rnOf := reuse(buf.rns, len(ds)), reuse(buf.rnOf, len(ds))
	defer func() { buf.rns, buf.rnOf = rns, rnOf }()
	for i, d := range ds {
		if failed[d.fe] {
			continue
		}
		if cur, ok := r.revNat.get(uint32(sids[i])); !ok || cur != d.fe {
			rns = append(rns, RevNatEntry{ID: sids[i], Frontend: d.fe})
			rnOf = append(rnOf, d)
		}
	}
	r.batch(len(rns),
		func() (int, error) { return r.dp.UpsertRevNats(rns) },
		func(i int) error { return r.dp.UpsertRevNat(rns[i].ID, rns[i].Frontend) },
		func(i int) { r.revNat.put(uint32(rns[i].ID), rns[i].Frontend) },
		func(i int, err error) { fail(rnOf[i], fmt.Errorf("upsert rev_nat %d: %w", rns[i].ID, err)) })

	// 3. Slots 1..m, in the order of the frontend's backends: a run of
	// them a frontend, its ids as they are, which the datapath encodes
	// straight into its system calls' buffers.
	runs, runOf := reuse(buf.runs, len(ds)), reuse(buf.runOf, len(ds))
	defer func() { buf.runs, buf.runOf = runs, runOf }()
	nslots := 0
	for i, d := range ds {
		if failed[d.fe] {
			continue
		}
		d.view = r.frontend(d.fe)
		if d.view.slots.ids == nil {
			d.view.slots.ids = make([]slotEntry, 0, len(ids[i])+1) // slots 0..m, filled below
		}
		if len(ids[i]) > 0 {
			runs = append(runs, SlotRun{Frontend: d.fe, First: 1, IDs: ids[i]})
			runOf = append(runOf, d)
			nslots += len(ids[i])
		}
	}
	// slotAt returns the run of the batch's i-th slot and the slot's
	// index in it. Reconciler.batch asks for no i before the last one
	// asked for, so the run is found by moving on from the last one.
	at, atStart := 0, 0
	slotAt := func(i int) (int, int) {
		for i >= atStart+len(runs[at].IDs) {
			atStart += len(runs[at].IDs)
			at++
		}
		return at, i - atStart
	}
	r.batch(nslots,
		func() (int, error) { return r.dp.UpsertSlots(runs) },
		func(i int) error {
			k, j := slotAt(i)
			if failed[runOf[k].fe] {
				return errBatchSkipped
			}
			return r.dp.UpsertSlot(runs[k].Frontend, runs[k].First+uint32(j), runs[k].IDs[j])
		},
		func(i int) {
			k, j := slotAt(i)
			r.setSlot(runOf[k].view, runs[k].First+uint32(j), runs[k].IDs[j])
		},
		func(i int, err error) {
			k, j := slotAt(i)
			fail(runOf[k], fmt.Errorf("upsert slot %d: %w", runs[k].First+uint32(j), err))
		})
	// A backend written that no slot names (its frontends failed) may
	// go. (Marked only now, rather than each until its slot is written
	// as programFrontend does: 300,000 map inserts and deletes fewer.)
	for _, e := range bes {
		if a, ok := r.backend(e.ID); ok && a == e.Addr && r.backends.refs(uint32(e.ID)) == 0 {
			r.backendCand[e.ID] = true
		}
	}

	// 4. Source ranges (few: one write each).
	for _, d := range ds {
		if failed[d.fe] || len(d.ranges) == 0 {
			continue
		}
		if err := r.addRanges(d.fe.L4Addr, d.view, d.ranges); err != nil {
			fail(d, err)
		}
	}

	// 5. Masters, a frontend's internal scope before its default one.
	ms, mOf := reuse(buf.ms, len(ds)), reuse(buf.mOf, len(ds))
	defer func() { buf.ms, buf.mOf = ms, mOf }()
	for i, d := range ds {
		if failed[d.fe] {
			continue
		}
		if internalFailed(d) {
			fail(d, errInternalScope)
			continue
		}
		ms = append(ms, MasterEntry{Frontend: d.fe, Master: masterOf(sids[i], d)})
		mOf = append(mOf, d)
	}
	r.batch(len(ms),
		func() (int, error) { return r.dp.UpsertMasters(ms) },
		func(i int) error {
			if internalFailed(mOf[i]) {
				fail(mOf[i], errInternalScope)
				return errBatchSkipped
			}
			return r.dp.UpsertMaster(ms[i].Frontend, ms[i].Master)
		},
		func(i int) {
			fe, m, v := ms[i].Frontend, ms[i].Master, mOf[i].view
			if isClusterIP(fe, m) {
				r.refServiceIP(fe.Addr)
			}
			r.entries[v.fam]++
			v.hasMaster, v.master = true, m
			r.revNat.addRefs(uint32(m.ID), 1)
		},
		func(i int, err error) { fail(mOf[i], fmt.Errorf("upsert master: %w", err)) })
	// A rev_nat entry written that no master names (its frontend failed)
	// may go: marked only now, as the backends are.
	for _, e := range rns {
		if fe, ok := r.revNat.get(uint32(e.ID)); ok && fe == e.Frontend && r.revNat.refs(uint32(e.ID)) == 0 {
			r.revNatCand[e.ID] = true
		}
	}

	// 6. The addresses of the ClusterIP masters among the service IPs.
	ips := reuse(buf.ips, len(ms))
	defer func() { buf.ips = ips }()
	queuedIP := makeKeyMap[netip.Addr, bool, addrKeys](len(ms))
	cipMaster := func(k int) bool {
		e := ms[k]
		return mOf[k].view.hasMaster && isClusterIP(e.Frontend, e.Master)
	}
	for k, e := range ms {
		a := e.Frontend.Addr
		if !cipMaster(k) || r.inServiceIPs(a) || queuedIP.val(a) {
			continue
		}
		queuedIP.put(a, true)
		ips = append(ips, a)
	}
	// The frontends of each address, made on the first failure.
	var ipOf map[netip.Addr][]*desiredFrontend
	frontendsOf := func(a netip.Addr) []*desiredFrontend {
		if ipOf == nil {
			ipOf = make(map[netip.Addr][]*desiredFrontend)
			for k, e := range ms {
				if cipMaster(k) {
					ipOf[e.Frontend.Addr] = append(ipOf[e.Frontend.Addr], mOf[k])
				}
			}
		}
		return ipOf[a]
	}
	r.batch(len(ips),
		func() (int, error) { return r.dp.UpsertServiceIPs(ips) },
		func(i int) error { return r.dp.UpsertServiceIP(ips[i]) },
		func(i int) {
			r.setInServiceIPs(ips[i], true)
			delete(r.ipDirty, ips[i])
		},
		func(i int, err error) {
			r.ipDirty[ips[i]] = true
			for _, d := range frontendsOf(ips[i]) {
				fail(d, fmt.Errorf("upsert service IP %s: %w", ips[i], err))
			}
		})

	for _, d := range ds {
		if !failed[d.fe] {
			r.markViewSynced(d.fe, d.view, d)
		}
	}
	return errs
}

// defaultBatchMin is Reconciler.batchMin unless a test sets it: a batch
// of one frontend's few entries gains nothing.
const defaultBatchMin = 2

// bitset is a set of small integers (ids).
type bitset []uint64

func (b bitset) has(i uint32) bool {
	return int(i/64) < len(b) && b[i/64]&(1<<(i%64)) != 0
}

func (b bitset) clear(i uint32) {
	if int(i/64) < len(b) {
		b[i/64] &^= 1 << (i % 64)
	}
}

func (b *bitset) set(i uint32) {
	if w := int(i / 64); w >= len(*b) {
		*b = append(*b, make([]uint64, w+1-len(*b))...)
	}
	(*b)[i/64] |= 1 << (i % 64)
}
