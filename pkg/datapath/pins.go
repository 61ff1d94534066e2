package datapath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"

	"github.com/cilium/ebpf"
)

// Pinned maps outlive the agent, so their layouts are an ABI between
// releases as well as between the agent and the programs. Each map's name
// carries the version of its layout, as Cilium's do (cilium_lb4_services_v2):
// the _vN suffix in bpf/lib/maps.h, and so in its pin under BPFFS/sluice/.
// A release that changes a layout bumps that map's version; its agent then
// finds no pin of the old layout under the new name, and Open converts the
// previous release's map into a new one (pinMigrations) instead of
// refusing to start until `sluice cleanup` drops all state.

// Pinned map names (also their file names under BPFFS/sluice/). They must
// match bpf/lib/maps.h; the generated bindings name the same maps, and
// Open checks that each of these is in every object.
const (
	mapServices = "sluice_services_v2"
	// The backend slots of the frontends, an array (slots.go), new in
	// this release: sluice_services_v1 held them (migrateServicesV1).
	mapSlots     = "sluice_slots_v1"
	mapBackends  = "sluice_backends_v2"
	mapRevNat    = "sluice_rev_nat_v2"
	mapConntrack = "sluice_conntrack_v2"
	mapCTNew     = "sluice_ct_new_v1"
	mapCTFlush   = "sluice_ct_flush_v1"
	// The half-open share of sluice_conntrack and the LRU's new_live
	// word, and their per-CPU parts, new in this release: an agent
	// upgraded creates them (HoldConntrackNew sets the word before it
	// attaches a program; it stays set until Commit).
	mapCTAdmit  = "sluice_ct_admit_v1"
	mapCTPcpu   = "sluice_ct_pcpu_v1"
	mapSockRev  = "sluice_sock_rev_v1"
	mapUDPStick = "sluice_udp_stick_v1"
	// Session affinity (sessionAffinity ClientIP), new in this release.
	// Not "sluice_affinity_v1": the kernel keeps 15 characters of a
	// name, and "sluice_affinity" is release 0's name of the UDP
	// stickiness map (sluice_udp_stick_v1 now, migrated below), which
	// bpftool and the benchmark's memory tables would show alike.
	mapAffinity   = "sluice_session_affinity_v1"
	mapAffFix     = "sluice_aff_fix_v1"
	mapMetrics    = "sluice_metrics_v1"
	mapDevices    = "sluice_devices_v1"
	mapSrcRanges  = "sluice_src_ranges_v1"
	mapFragments  = "sluice_fragments_v1"
	mapServiceIPs = "sluice_service_ips_v1"
	mapNodeCIDRs  = "sluice_node_cidrs_v1"
	// Per-Service counters (--service-metrics), new in this release.
	mapSvcStats = "sluice_svc_stats_v1"
	// The ICMP rate limit sysctls tc's errors follow (icmprl.go), new
	// in this release (the previous one's programs had them as
	// constants): an agent upgraded creates it, Open writes it.
	mapICMPLimits = "sluice_icmp_limits_v1"

	// The IPv6 twins (family.go), new in this release: nothing to
	// migrate, an agent upgraded from a pin directory without them
	// creates them.
	mapServices6   = "sluice6_services_v2"
	mapSlots6      = "sluice6_slots_v1"
	mapBackends6   = "sluice6_backends_v2"
	mapRevNat6     = "sluice6_rev_nat_v2"
	mapSrcRanges6  = "sluice6_src_ranges_v1"
	mapServiceIPs6 = "sluice6_service_ips_v1"
	mapAffinity6   = "sluice6_affinity_v1"
	mapAffFix6     = "sluice6_aff_fix_v1"
	mapNodeCIDRs6  = "sluice6_node_cidrs_v1"
	mapDevices6    = "sluice6_devices_v1"

	// The program arrays the attached entries tail-call the IPv6
	// programs through (tc6.go), pinned so that the IPv6 programs stay
	// while no agent runs; filled by every agent that loads them.
	mapTC6  = "sluice6_tc_v1"
	mapXDP6 = "sluice6_xdp_v1"
)

// pinMigration turns the pin of a map of the previous release into this
// build's map.
type pinMigration struct {
	from, to string // pin names

	// convert copies the entries of the old map into the new one,
	// which has this build's layout and configured size, converting
	// each; spec is this build's configured collection (its constants
	// say what the entries mean). nil means the layout is the same:
	// the pin is renamed, so the map itself carries over with its
	// entries, and the previous agent's programs, still attached until
	// this agent replaces them, go on using it without a gap.
	convert func(old, cur *ebpf.Map, spec *ebpf.CollectionSpec) error

	// convertPins is convert for a conversion that also builds other
	// pins of dir (noted in j first): the services' slots array.
	convertPins func(old, cur *ebpf.Map, spec *ebpf.CollectionSpec, dir string, j *pinJournal) error

	// live: the previous agent's programs write the map, and what they
	// write until their links are updated must be carried over too. The
	// old map is kept for that (migrate.go); settle converts it with
	// convert again, for the entries the new map lacks.
	live bool
}

// pinMigrations is where a change of layout adds its conversion. Upgrades
// are supported from the previous release. To change a map's layout: bump
// the version in its name in bpf/lib/maps.h and in the constant above, and
// replace the map's entry here by one from the previous release's name to
// the new one, with a convert function (which runs while the previous
// agent's programs still update the old map: what they write between the
// copy and the attach is lost, so convert state that can be rebuilt or
// lost, such as counters and conntrack, or have the new programs read
// both).
//
// Release 0 pinned its maps without versions; their layouts are those of
// v1, apart from sluice_metrics, which now has room for reasons to be
// appended (METRIC_SLOTS) and so a different size, and sluice_conntrack,
// whose v2 holds expiry times instead of last-seen times and is a plain
// hash of established flows (half-open ones are in sluice_ct_new, which
// release 0 did not have).
//
// The backends of both families were hashes in release 0 (IPv4 only) and
// under their _v1 names; v2 are arrays indexed by the id (maps.h), whose
// entries carry BE_F_PRESENT: convertBackends copies each id's entry to
// its index, with the flag. No program writes them, so the copy is
// complete; the previous agent's programs read the old map until their
// links are replaced, and no agent writes either meanwhile.
//
// The reverse-NAT maps of both families were hashes (v1, and release 0's
// IPv4 one); v2 are arrays indexed by the service id whose entries carry
// RN_F_PRESENT in a flags byte the v1 value lacked: convertRevNat copies
// each id's entry to its index, flagged. No program reads or writes them
// (the agent alone does: the programs reverse-NAT from conntrack), so the
// copy is complete.
//
// The services maps held the frontends' masters and their backend slots
// (v1); v2 holds the masters, each with the base of its slots in the new
// slots array (sluice_slots_v1): convertServices gives each frontend a
// range, writes its slots there and its master with the base. No program
// writes either, so the copy is complete.
var pinMigrations = []pinMigration{
	{from: "sluice_services", to: mapServices, convertPins: convertServices4},
	{from: "sluice_services_v1", to: mapServices, convertPins: convertServices4},
	{from: "sluice6_services_v1", to: mapServices6, convertPins: convertServices6},
	{from: "sluice_backends", to: mapBackends, convert: convertBackends4},
	{from: "sluice_backends_v1", to: mapBackends, convert: convertBackends4},
	{from: "sluice6_backends_v1", to: mapBackends6, convert: convertBackends6},
	{from: "sluice_rev_nat", to: mapRevNat, convert: convertRevNat4},
	{from: "sluice_rev_nat_v1", to: mapRevNat, convert: convertRevNat4},
	{from: "sluice6_rev_nat_v1", to: mapRevNat6, convert: convertRevNat6},
	{from: "sluice_conntrack", to: mapConntrack, convert: convertRelease0Conntrack, live: true},
	{from: "sluice_sock_rev", to: mapSockRev},
	// UDP socket stickiness was called affinity, which Kubernetes
	// means per client address (sessionAffinity).
	{from: "sluice_affinity", to: mapUDPStick},
	{from: "sluice_metrics", to: mapMetrics, convert: copyCounters},
	{from: "sluice_devices", to: mapDevices},
	{from: "sluice_src_ranges", to: mapSrcRanges},
}

// migratePins brings the pins in dir from the previous release's names
// and layouts to spec's, before spec is loaded. A pin under an old name is
// the live state: the previous agent's programs use it. So it is moved
// even if a pin of the new name exists too, which happens only if an
// agent of the previous release ran again after an upgrade (a rollback):
// the new-named pin is then older. The old maps of live conversions are
// returned, for the switch (migrate.go). Each pin replaced or removed is
// kept in j first, to be put back if the start fails (rollback.go).
func migratePins(dir string, spec *ebpf.CollectionSpec, j *pinJournal) (migs []*migration, err error) {
	defer dropOnError(&migs, &err)
	for _, pm := range pinMigrations {
		from, to := filepath.Join(dir, pm.from), filepath.Join(dir, pm.to)
		ms, ok := spec.Maps[pm.to]
		if !ok {
			return migs, fmt.Errorf("migrate pin %s: map %s missing from BPF object", from, pm.to)
		}
		old, err := ebpf.LoadPinnedMap(from, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return migs, fmt.Errorf("migrate pin %s: %w", from, err)
		}
		err = errors.Join(j.keep(from), j.keep(to))
		convert := pm.convert
		if pm.convertPins != nil {
			convert = func(old, cur *ebpf.Map, spec *ebpf.CollectionSpec) error {
				return pm.convertPins(old, cur, spec, dir, j)
			}
		}
		if err == nil {
			err = migratePin(old, from, to, spec, ms, convert)
		}
		if err != nil {
			old.Close()
			return migs, fmt.Errorf("migrate pin %s to %s: %w", from, pm.to, err)
		}
		if pm.live && convert != nil {
			migs = append(migs, &migration{name: pm.to, old: old, r0: pm.to == mapConntrack})
		} else {
			old.Close()
		}
	}
	return migs, nil
}

func migratePin(old *ebpf.Map, from, to string, spec *ebpf.CollectionSpec, ms *ebpf.MapSpec,
	convert func(old, cur *ebpf.Map, spec *ebpf.CollectionSpec) error) error {
	if convert == nil {
		info, err := old.Info()
		if err != nil {
			return fmt.Errorf("info: %w", err)
		}
		if info.Type != ms.Type || info.KeySize != ms.KeySize || info.ValueSize != ms.ValueSize {
			return fmt.Errorf("pinned map is %s with key/value size %d/%d, this build expects %s with %d/%d: remove it with Cleanup",
				info.Type, info.KeySize, info.ValueSize, ms.Type, ms.KeySize, ms.ValueSize)
		}
		// rename(2) replaces a pin at to in one step: no moment
		// without one.
		return os.Rename(from, to)
	}

	// Build the new map beside the old one, pin it under a temporary
	// name and rename it into place, so that an agent that dies half
	// way leaves either no new pin or a complete one (and the old pin,
	// which the next attempt converts again).
	err := replacePin(to, "_migrating", ms, func(cur *ebpf.Map) error {
		if err := convert(old, cur, spec); err != nil {
			return fmt.Errorf("convert: %w", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return os.Remove(from)
}

// unpinned is a copy of ms that creates a map without pinning it.
func unpinned(ms *ebpf.MapSpec) *ebpf.MapSpec {
	c := ms.Copy()
	c.Pinning = ebpf.PinNone
	return c
}

// copyCounters copies the per-CPU counters of a metrics array into
// another: reasons are never renumbered, so key i is the same reason in
// both. Keys beyond the smaller map are dropped. The values are copied as
// bytes of the map's value size (a __u64 in sluice_metrics, a struct
// svc_stats in sluice_svc_stats).
func copyCounters(old, cur *ebpf.Map, _ *ebpf.CollectionSpec) error {
	n := min(old.MaxEntries(), cur.MaxEntries())
	perCPU := reflect.New(reflect.SliceOf(reflect.ArrayOf(int(old.ValueSize()), reflect.TypeFor[byte]())))
	for k := range n {
		if err := old.Lookup(k, perCPU.Interface()); err != nil {
			return fmt.Errorf("read counter %d: %w", k, err)
		}
		if err := cur.Put(k, perCPU.Elem().Interface()); err != nil {
			return fmt.Errorf("write counter %d: %w", k, err)
		}
	}
	return nil
}

// convertBackends4 and convertBackends6 copy the backends of a hash of
// the previous layout (id -> entry, no flags) into the array cur, each
// under its id's index and flagged BE_F_PRESENT. An id beyond the array
// is an error: the conntrack entries that name it would lose their
// backend.
func convertBackends4(old, cur *ebpf.Map, _ *ebpf.CollectionSpec) error {
	return convertBackends(old, cur, func(v *sockLb4Backend) { v.Flags |= bePresent })
}

func convertBackends6(old, cur *ebpf.Map, _ *ebpf.CollectionSpec) error {
	return convertBackends(old, cur, func(v *sockLb6Backend) { v.Flags |= bePresent })
}

const bePresent = uint8(sockBackendFlagsBE_F_PRESENT)

// convertRevNat4 and convertRevNat6 copy the reverse-NAT entries of a hash
// of the previous layout (lb4RevNatV1: no flags) into the array cur, each
// under its id's index and flagged RN_F_PRESENT. An id beyond the array
// is an error: the frontend's master names it.
func convertRevNat4(old, cur *ebpf.Map, _ *ebpf.CollectionSpec) error {
	return convertIDs(old, cur, "service", "--max-services", func(v *lb4RevNatV1) sockLb4RevNat {
		return sockLb4RevNat{Vip: v.Vip, Port: v.Port, Proto: v.Proto, Scope: v.Scope, Flags: rnPresent}
	})
}

func convertRevNat6(old, cur *ebpf.Map, _ *ebpf.CollectionSpec) error {
	return convertIDs(old, cur, "service", "--max-services", func(v *lb6RevNatV1) sockLb6RevNat {
		return sockLb6RevNat{Vip: v.Vip, Port: v.Port, Proto: v.Proto, Scope: v.Scope, Flags: rnPresent}
	})
}

// lb4RevNatV1 and lb6RevNatV1 are the values of the v1 reverse-NAT hashes
// (sluice_rev_nat_v1, sluice6_rev_nat_v1; release 0's sluice_rev_nat):
// struct lb4_rev_nat and lb6_rev_nat without their flags.
type lb4RevNatV1 struct {
	Vip   uint32
	Port  uint16
	Proto uint8
	Scope uint8
}

type lb6RevNatV1 struct {
	Vip   sockV6addr
	Port  uint16
	Proto uint8
	Scope uint8
}

// rnPresent is RN_F_PRESENT, the flags byte of a reverse-NAT entry that a
// service holds. It is the last byte of the value, as BE_F_PRESENT is of
// a backend's, with the same value: the readers and writers of the
// backends arrays (presentEntry, beTable) serve both.
const rnPresent = uint8(sockRevNatFlagsRN_F_PRESENT)

// The build fails if the two flags part.
var _ = [1]struct{}{}[int(rnPresent)-int(bePresent)]

func convertBackends[V any](old, cur *ebpf.Map, setPresent func(*V)) error {
	return convertIDs(old, cur, "backend", "--max-backends", func(v *V) V { setPresent(v); return *v })
}

// convertIDs copies the entries of the hash old (id -> O) into the array
// cur, each converted by conv under its id's index. An id beyond the
// array is an error, which names the flag that sizes it.
func convertIDs[O, V any](old, cur *ebpf.Map, what, flag string, conv func(*O) V) error {
	var ids []uint32
	var vals []V
	var id uint32
	var v O
	it := old.Iterate()
	for it.Next(&id, &v) {
		if id >= cur.MaxEntries() {
			return fmt.Errorf("%s id %d does not fit in %d entries (a larger %s keeps it)", what, id, cur.MaxEntries(), flag)
		}
		ids, vals = append(ids, id), append(vals, conv(&v))
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read %ss: %w", what, err)
	}
	if n, err := putBatch(cur, ids, vals); err != nil {
		return fmt.Errorf("write %s %d of %d: %w", what, n, len(ids), err)
	}
	return nil
}

// previousPin returns the name of the previous layout's pin of the map
// pinned as name that is in dir, or "".
func previousPin(dir, name string) string {
	for _, pm := range pinMigrations {
		if pm.to != name {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, pm.from)); err == nil {
			return pm.from
		}
	}
	return ""
}
