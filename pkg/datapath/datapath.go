// Package datapath loads Sluice's BPF programs, owns its pinned maps and
// attaches the programs to cgroups and network devices. It is the only
// package in Sluice that imports cilium/ebpf.
//
// Everything the kernel holds outlives the agent: maps are pinned under
// BPFFS/sluice/ and links under BPFFS/sluice/links/, so an agent that exits
// or restarts leaves traffic alone. Open reuses pinned maps (their contents
// are the state the reconciler restores from), migrating those of the
// previous release to this one's names and layouts (pins.go) and those of
// another size to the configured one (migrate.go), and the Attach methods
// replace the programs behind pinned links in place; Prune detaches what
// the configuration no longer names. Only Cleanup removes everything.
// OpenPinned is the operators' read-only view of the same pins. The
// constants both sides of the maps use are generated from
// bpf/lib/structs.h (abi.go).
//
// Six objects are built from bpf/: tc.c (tc ingress and egress), ctgc.c
// (the conntrack garbage collector the agent runs, conntrack.go, and the
// session affinity upkeep, affinity.go), sock.c
// (cgroup connect, sendmsg, recvmsg, getpeername, 4 and 6), xdp.c (the XDP fast
// path for north-south flows to remote backends), sockdestroy.c (an
// iterator that ends connected UDP sockets of removed backends,
// sockdestroy.go) and migrate.c (conntrack carried over to a new map while
// the programs are replaced). Open loads only what the configuration
// uses: tc and the GC always, the socket programs unless socket load
// balancing is off, XDP only in an XDP mode, and the last two only where
// the kernel and the moment call for them (features.go says what each
// needs). All declare every pinned map alike, so whichever loads first
// creates the pins and the others reuse them.
//
// The package returns errors with context and never logs.
package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// Config sizes the maps and sets per-node datapath settings.
type Config struct {
	// BPFFS is the bpffs mount, default "/sys/fs/bpf". Maps are pinned in
	// BPFFS/sluice/ and links in BPFFS/sluice/links/.
	BPFFS string

	// Map sizes; 0 means the default. MaxServices sizes sluice_rev_nat
	// (65536; the arrays sluice_rev_nat and sluice6_rev_nat have an entry
	// for every service id the agent may hand out, serviceSlots),
	// MaxBackends the backends of each family (262144; the
	// arrays sluice_backends and sluice6_backends have an entry for every
	// id the agent may hand out, backendSlots), MaxServiceEntries the
	// masters plus slots of each family (1<<20): sluice_services (the
	// masters) and sluice_slots, twice as large (slotEntries: slots lie
	// in ranges of powers of two), MaxConntrack
	// sluice_conntrack, the established flows and SNAT port reservations
	// (262144; when it is full new flows stay in sluice_ct_new, and new
	// port reservations are refused), MaxConntrackNew sluice_ct_new, the
	// flows not answered yet and those the full sluice_conntrack could
	// not take (65536; an LRU: a flood of new flows evicts only its own
	// kind), MaxSockRev sluice_sock_rev and
	// sluice_udp_stick (262144), MaxAffinity sluice_session_affinity, the
	// session affinity of clients (65536, as Cilium's; an LRU: the
	// clients seen longest ago make room), MaxSourceRanges
	// sluice_src_ranges, the loadBalancerSourceRanges of all frontends
	// together (16384), and MaxDevices sluice_devices, the devices the
	// programs are attached to (1024: a node's pods' devices under a
	// pattern such as cali+, with room; 8 bytes an entry: the programs
	// look it up by ifindex, the agent walks it on a device change only).
	// A pinned map of another size is migrated to this one at Open
	// (migrate.go).
	MaxServices, MaxBackends, MaxServiceEntries, MaxConntrack, MaxConntrackNew, MaxSockRev, MaxAffinity int
	MaxSourceRanges, MaxDevices                                                                         int
	// PreallocateMaps (--preallocate-bpf-maps) creates the service maps
	// the reconciler fills (preallocatedMaps) preallocated, as Cilium's
	// --preallocate-bpf-maps: their max_entries' memory is held from the
	// start, and an insert takes an element off a free list instead of
	// allocating one (prealloc.go). Pinned maps made the other way are
	// rebuilt at Open, with their entries (migrate.go).
	PreallocateMaps bool

	// DisableSocketLB leaves the socket programs unloaded (--socket-lb=false):
	// they need more of the kernel than the rest (features.go), and
	// AttachCgroup then fails. Prune detaches those an earlier agent
	// attached.
	DisableSocketLB bool
	// SocketLBHostNetnsOnly (--socket-lb-host-netns-only) has the socket
	// programs translate the sockets of the network namespace Open runs
	// in (the agent's: the host's) only, as kube-proxy translates in the
	// host's namespace only; a pod's connections then reach the VIP and
	// are translated per packet where tc runs (hostns.go).
	SocketLBHostNetnsOnly bool

	// DeferDryRun leaves the tc programs' dry twins (sluicectl explain)
	// for LoadDryRun to load, after Open (dryrun.go): the agent's start
	// then verifies half as much.
	DeferDryRun bool

	// Idle timeouts of per-packet conntrack entries; 0 means the default
	// (6h for established TCP, 60s for UDP). CTTimeoutSYN is how long a
	// TCP flow lives before its first reply, and after it until its
	// client's ACK assures it (default 60s, as Cilium's SYN timeout;
	// netfilter's SYN_RECV), CTTimeoutClose after a RST or a FIN each way
	// (default 10s).
	CTTimeoutTCP, CTTimeoutSYN, CTTimeoutUDP, CTTimeoutClose time.Duration

	// CTTimeoutSNATTimeWait is how long a closed source-NATed TCP flow's
	// entries, and so its port, live instead of CTTimeoutClose (default
	// 120s, netfilter's TIME_WAIT): the backend may hold the tuple in
	// TIME_WAIT after it closed first. A port search that finds no free
	// port takes such a port over once the flow has been closed
	// CTTimeoutClose (bpf/lib/conntrack.h). Never less than
	// CTTimeoutClose (a shorter one is taken as CTTimeoutClose).
	CTTimeoutSNATTimeWait time.Duration

	// CTHalfOpenMax is how many half-open flows (no reply yet) of each
	// family may be in sluice_conntrack at once, the rest going to
	// sluice_ct_new (bpf/lib/conntrack.h): 0 means the default, a
	// quarter of MaxConntrack in entries (MaxConntrack/8 flows, two
	// entries each); negative, none (every new flow goes to the LRU and
	// is moved at its first reply, as before).
	CTHalfOpenMax int

	// SNATPortMin and SNATPortMax bound the source ports external flows
	// to remote backends are source-NATed to (default 61000-65535, above
	// the kernel's default ephemeral range; both 0: the default; else
	// within SNATPortFloor-65535, see snatrange.go).
	SNATPortMin, SNATPortMax uint16

	// XDP is how the XDP fast path is attached to the devices: XDPOff
	// (the default), XDPGeneric or XDPNative.
	XDP XDPMode
	// XDPRouteCacheAge is how long XDP uses a route it looked up for an
	// established flow at most (default 1s): how stale a route can be
	// when no WatchRouting follows the node's routing (routecache.go).
	XDPRouteCacheAge time.Duration

	// NodeIPs are this node's addresses. On a device that holds one of
	// them, external flows to remote backends are source-NATed to it;
	// otherwise to the device's first IPv4 address. The first is the
	// node's primary address: what a flow masqueraded towards a backend on
	// this node is source-NATed to, and the source of a socket reaching
	// a LoadBalancer IP unbound (loadBalancerSourceRanges).
	NodeIPs []netip.Addr
	// FollowedTunnels are the overlay devices among AttachDevices' that
	// the agent follows (cmd/sluice's withTunnels without --devices:
	// those up and routed at its start, and those a previous agent
	// followed), never a device --devices named or one holding a node
	// address: AttachDevices flags their entries nodeDevFollowed itself,
	// so that a restart keeps them (PinnedTunnelDevices), down or
	// routeless, even if the agent stops before its tunnel watch runs.
	// A name AttachDevices is not given, or not of a tunnel kind, is
	// passed over.
	FollowedTunnels []string

	// ClusterCIDRs (--cluster-cidr) say which clients are internal
	// (pods): they are short-circuited to all endpoints of an
	// externalTrafficPolicy Local frontend, and ClusterIP traffic from
	// elsewhere is masqueraded. None: no client is internal, and
	// ClusterIP traffic is never masqueraded (kube-proxy without a local
	// traffic detector).
	ClusterCIDRs []netip.Prefix
	// ServiceCIDRs (--service-cidr): a packet to an address in them that
	// is no ClusterIP is dropped.
	ServiceCIDRs []netip.Prefix
	// ServiceCIDRsFromSource says the source names the service CIDRs at
	// run time (the Kubernetes source's ServiceCIDR objects, with
	// ServiceCIDRs among them), which the reconciler writes
	// (SetServiceCIDRs): Open adds ServiceCIDRs but deletes no other
	// service CIDR it finds pinned, so that an agent restarted keeps
	// dropping for the CIDRs its predecessor learnt until its first
	// apply says which still are. Without it Open makes the service
	// CIDRs exactly ServiceCIDRs.
	ServiceCIDRsFromSource bool
	// MasqueradeAll (--masquerade-all) source-NATs all ClusterIP traffic,
	// and external traffic to a backend on this node.
	MasqueradeAll bool
	// ICMPRateLimits are the kernel's ICMP rate limits tc's errors
	// follow from the start (icmprl.go): the agent's
	// ReadICMPRateLimits; nil, Linux 6.18's defaults. Open writes them
	// into sluice_icmp_limits_v1; FollowICMPRateLimits keeps it up to
	// date after.
	ICMPRateLimits *ICMPRateLimits
	// ProcSysNet (--proc-sys-net) is the node's /proc/sys/net, where
	// ReserveSNATPorts writes (empty: DefaultProcSysNet, the calling
	// thread's network namespace's); a container mounts the node's
	// writable elsewhere.
	ProcSysNet string
	// ServiceMetrics (--service-metrics) makes the programs count per
	// Service (svcstats.go). Off, they count nothing and
	// sluice_svc_stats has one entry.
	ServiceMetrics bool
}

// XDPMode says whether and how the XDP program is attached.
type XDPMode string

const (
	XDPOff     XDPMode = "off"
	XDPGeneric XDPMode = "generic" // in the stack, after the skb exists: any device
	XDPNative  XDPMode = "native"  // in the driver: the device must support it
)

// ParseXDPMode parses "off", "generic" or "native" (empty is off).
func ParseXDPMode(s string) (XDPMode, error) {
	switch m := XDPMode(s); m {
	case "", XDPOff:
		return XDPOff, nil
	case XDPGeneric, XDPNative:
		return m, nil
	}
	return "", fmt.Errorf("XDP mode %q: want native, generic or off", s)
}

// Defaults for Config's zero values.
const (
	DefaultBPFFS             = "/sys/fs/bpf"
	DefaultMaxServices       = 65536
	DefaultMaxBackends       = 262144
	DefaultMaxServiceEntries = 1 << 20
	DefaultMaxConntrack      = 262144
	DefaultMaxConntrackNew   = 65536
	DefaultMaxSockRev        = 262144
	DefaultMaxAffinity       = 65536
	DefaultMaxSourceRanges   = 16384
	DefaultMaxDevices        = 1024
	DefaultCTTimeoutTCP      = 6 * time.Hour
	DefaultCTTimeoutSYN      = 60 * time.Second
	DefaultCTTimeoutUDP      = 60 * time.Second
	DefaultCTTimeoutClose    = 10 * time.Second
	DefaultCTTimeoutSNATTW   = 120 * time.Second
	DefaultSNATPortMin       = 61000
	DefaultSNATPortMax       = 65535
)

func (c Config) withDefaults() Config {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	if c.BPFFS == "" {
		c.BPFFS = DefaultBPFFS
	}
	def(&c.MaxServices, DefaultMaxServices)
	def(&c.MaxBackends, DefaultMaxBackends)
	def(&c.MaxServiceEntries, DefaultMaxServiceEntries)
	def(&c.MaxConntrack, DefaultMaxConntrack)
	def(&c.MaxConntrackNew, DefaultMaxConntrackNew)
	def(&c.MaxSockRev, DefaultMaxSockRev)
	def(&c.MaxAffinity, DefaultMaxAffinity)
	def(&c.MaxSourceRanges, DefaultMaxSourceRanges)
	def(&c.MaxDevices, DefaultMaxDevices)
	if c.CTTimeoutTCP == 0 {
		c.CTTimeoutTCP = DefaultCTTimeoutTCP
	}
	if c.CTTimeoutSYN == 0 {
		c.CTTimeoutSYN = DefaultCTTimeoutSYN
	}
	if c.CTTimeoutUDP == 0 {
		c.CTTimeoutUDP = DefaultCTTimeoutUDP
	}
	if c.CTTimeoutClose == 0 {
		c.CTTimeoutClose = DefaultCTTimeoutClose
	}
	if c.CTTimeoutSNATTimeWait == 0 {
		c.CTTimeoutSNATTimeWait = DefaultCTTimeoutSNATTW
	}
	c.CTTimeoutSNATTimeWait = max(c.CTTimeoutSNATTimeWait, c.CTTimeoutClose)
	if c.CTHalfOpenMax == 0 {
		c.CTHalfOpenMax = c.MaxConntrack / 8
	}
	if c.SNATPortMin == 0 && c.SNATPortMax == 0 {
		c.SNATPortMin, c.SNATPortMax = DefaultSNATPortMin, DefaultSNATPortMax
	}
	if c.XDPRouteCacheAge == 0 {
		c.XDPRouteCacheAge = DefaultXDPRouteCacheAge
	}
	return c
}

// maxEntries returns the configured size of each sized map.
func (c Config) maxEntries() map[string]int {
	return map[string]int{
		// The masters: one per frontend, and every frontend has a
		// service id (its rev_nat entry, written before the master and
		// deleted after it), so --max-services bounds them, both
		// families together. A hash sized by --max-service-entries
		// (1<<20) had a 16 MiB bucket array that each packet's lookup
		// touched at random.
		mapServices:  c.MaxServices,
		mapSlots:     slotEntries(c),
		mapBackends:  backendSlots(c),
		mapRevNat:    serviceSlots(c),
		mapConntrack: c.MaxConntrack,
		mapCTNew:     c.MaxConntrackNew,
		// IPv6 conntrack, as large as IPv4's (tc6.go).
		mapConntrack6: c.MaxConntrack,
		mapCTNew6:     c.MaxConntrackNew,
		mapSockRev:    c.MaxSockRev,
		mapUDPStick:   c.MaxSockRev,
		mapSockRev6:   c.MaxSockRev,
		mapUDPStick6:  c.MaxSockRev,
		mapAffinity:   c.MaxAffinity,
		mapSrcRanges:  c.MaxSourceRanges,
		mapDevices:    c.MaxDevices,
		mapDevices6:   c.MaxDevices,
		// Every service IP is some ClusterIP frontend's address.
		mapServiceIPs: c.MaxServices,
		mapSvcStats:   svcStatsSize(c),
		// The IPv6 twins are sized like the IPv4 maps: the
		// reconciler counts each family against its own maps, of
		// one size (Maps.Capacity).
		mapServices6:   c.MaxServices,
		mapSlots6:      slotEntries(c),
		mapBackends6:   backendSlots(c),
		mapRevNat6:     serviceSlots(c),
		mapAffinity6:   c.MaxAffinity,
		mapSrcRanges6:  c.MaxSourceRanges,
		mapServiceIPs6: c.MaxServices,
	}
}

// Datapath is the loaded programs and the maps they share.
type Datapath struct {
	cfg  Config
	dir  string // BPFFS/sluice
	tc   tcLoaded
	gc   ctgcPrograms
	sock sockProgs // nil programs with socket load balancing off
	xdp  xdpProgs  // nil programs with XDP off
	maps *Maps

	// retiredLeftOut counts the retired masters this Open's resize left
	// out of smaller service maps (shrink.go): RetiredLeftOut.
	retiredLeftOut int

	// routeGen is what WatchRouting last set XDP's route cache's
	// generation to (routecache.go).
	routeGen routeGen

	// attachedAtStart is what AttachDevices attached (ifindex -> name):
	// a device watch starts from it (NewDeviceWatch).
	attachedAtStart map[int]string

	// committed is closed by Commit: FollowPorts waits for it
	// (waitCommitted), so that it writes sluice_devices only after the
	// start's writes; the device watch is made after Commit by its
	// caller (NewDeviceWatch). FollowICMPRateLimits does not wait: Open
	// wrote its map already.
	committed     chan struct{}
	committedOnce sync.Once

	// What the kernel offers beyond the minimum (features.go).
	features Features

	// Maps replaced at Open whose old map the previous agent's programs
	// may still write (migrate.go); the shim programs that carry
	// conntrack over while the programs are replaced, when one of them
	// is conntrack.
	migrations []*migration
	shim       migratePrograms

	// counter reads the hash maps' element counts (mapcount.go); nil
	// without Features.MapCount.
	counter *mapCounter
	// ctCounted: the conntrack tables whose fill ConntrackEntries polls
	// every second, their ids and sizes looked up once at load.
	ctCounted []countedTable

	// The dry twins of the tc programs (dryrun.go), nil until loaded,
	// and the tc spec they load from, dropped once they are loaded (a
	// few MiB of instructions and BTF the agent would otherwise keep for
	// its life); dryClosed: Close was called.
	dryMu      sync.Mutex
	dry        *tcDry
	tcSpec     *ebpf.CollectionSpec
	dryLoading bool // a LoadDryRun is under way
	dryClosed  bool

	// ipv6Pending: load left the previous agent's IPv6 programs in the
	// pinned program arrays, for switchIPv6 to replace.
	ipv6Pending bool

	// pins: what Open changed in the pin directory, put back if the
	// start fails before Commit (rollback.go); nil once committed or
	// put back.
	pins *pinJournal
}

// The IPv6 socket path's maps (bpf/lib/maps.h), sized like their IPv4
// twins (Config.MaxSockRev).
const (
	mapSockRev6  = "sluice6_sock_rev_v1"
	mapUDPStick6 = "sluice6_udp_stick_v1"
)

// sockProgs are the socket programs, each in the variant this kernel
// takes (Features.SetRetval).
type sockProgs struct {
	Connect4     *ebpf.Program `ebpf:"sluice_connect4"`
	Sendmsg4     *ebpf.Program `ebpf:"sluice_sendmsg4"`
	Recvmsg4     *ebpf.Program `ebpf:"sluice_recvmsg4"`
	Getpeername4 *ebpf.Program `ebpf:"sluice_getpeername4"`
	Connect6     *ebpf.Program `ebpf:"sluice_connect6"`
	Sendmsg6     *ebpf.Program `ebpf:"sluice_sendmsg6"`
	Recvmsg6     *ebpf.Program `ebpf:"sluice_recvmsg6"`
	Getpeername6 *ebpf.Program `ebpf:"sluice_getpeername6"`
	SockRelease  *ebpf.Program `ebpf:"sluice_sock_release"`
}

func (p *sockProgs) Close() error {
	return errors.Join(p.Connect4.Close(), p.Sendmsg4.Close(), p.Recvmsg4.Close(), p.Getpeername4.Close(),
		p.Connect6.Close(), p.Sendmsg6.Close(), p.Recvmsg6.Close(), p.Getpeername6.Close(), p.SockRelease.Close())
}

// Open loads the programs the configuration uses and creates the pinned
// maps, or reuses them if an earlier agent pinned them. Maps the previous
// release pinned under other names or layouts are converted first
// (pins.go), and maps pinned with another size than configured are
// migrated to the new size (migrate.go): the entries are copied into a new
// map whose pin replaces the old one. A pinned map whose type, key or
// value differ from what this agent wants, under the same name, is an
// error: that is not a layout this build knows.
//
// The pins it changes are kept until the start is complete (Commit): an
// Open that fails, or an Abort, puts every one back as it was, and the
// next Open puts back those of a start that was killed (rollback.go).
func Open(cfg Config) (*Datapath, error) {
	cfg = cfg.withDefaults()
	for name, n := range cfg.maxEntries() {
		if n <= 0 || n > 1<<30 {
			return nil, fmt.Errorf("size of %s: %d out of range", name, n)
		}
	}
	if cfg.XDPRouteCacheAge < 0 {
		return nil, fmt.Errorf("XDP route cache age %s is negative", cfg.XDPRouteCacheAge)
	}
	if err := checkSNATPortRange(cfg.SNATPortMin, cfg.SNATPortMax); err != nil {
		return nil, err
	}
	cidrs, err := wantNodeCIDRs(cfg)
	if err != nil {
		return nil, err
	}
	if cfg.XDP, err = ParseXDPMode(string(cfg.XDP)); err != nil {
		return nil, err
	}
	if err := refuseDefaultBPFFSInTest(cfg.BPFFS); err != nil {
		return nil, err
	}
	dir := filepath.Join(cfg.BPFFS, "sluice")
	// Only root may reach the pins: a map's pin opens it for writing
	// (the kernel creates each pin 0600 itself).
	for _, p := range []string{dir, filepath.Join(dir, "links")} {
		if err := os.MkdirAll(p, 0o700); err != nil {
			return nil, fmt.Errorf("create pin directory: %w", err)
		}
		if err := os.Chmod(p, 0o700); err != nil {
			return nil, fmt.Errorf("restrict pin directory: %w", err)
		}
	}

	d := &Datapath{cfg: cfg, dir: dir, committed: make(chan struct{})}
	specs, err := d.specs()
	if err != nil {
		return nil, err
	}
	for _, spec := range specs.all() {
		if err := configure(spec, cfg); err != nil {
			return nil, err
		}
	}
	if specs.sock != nil {
		if err := configureHostNetns(specs.sock, cfg); err != nil {
			return nil, err
		}
	}
	// A start killed before it was complete left the pins it changed
	// kept: they are put back first (rollback.go).
	if d.pins, err = startPinJournal(dir); err != nil {
		return nil, err
	}
	d.pins.carryBack = d.carryBack
	// A size below what the service maps hold is refused before any pin
	// changes (shrink.go); one that holds them only without the retired
	// masters leaves those out of the resize's copies.
	drop, err := checkShrink(dir, cfg)
	if err != nil {
		return nil, err
	}
	if err := d.migratePins(specs, drop); err != nil {
		// Every pin changed is put back (rollback.go).
		d.closeMigrations()
		return nil, errors.Join(err, d.pins.undo())
	}
	if err := d.load(specs); err != nil {
		d.closeMigrations()
		return nil, errors.Join(err, d.pins.undo())
	}
	if err := errors.Join(d.pins.keepEntries(d.maps.nodeCIDRs, mapNodeCIDRs), d.pins.keepEntries(d.maps.nodeCIDRs6, mapNodeCIDRs6)); err != nil {
		return nil, errors.Join(err, d.Abort())
	}
	owned := func(kind uint32) bool { return kind != nodeCIDRService || !cfg.ServiceCIDRsFromSource }
	err = d.maps.setNodeCIDRs(cidrs, owned)
	if errors.Is(err, reconciler.ErrCapacity) && cfg.ServiceCIDRsFromSource {
		// The service CIDRs learnt before and the flag's do not fit
		// together (nothing was written): the flag's alone until the
		// reconciler writes the source's set.
		err = d.maps.setNodeCIDRs(cidrs, func(uint32) bool { return true })
	}
	if err != nil {
		return nil, errors.Join(err, d.Abort())
	}
	if failAfterLoad != nil {
		if err := failAfterLoad(); err != nil {
			return nil, errors.Join(err, d.Abort())
		}
	}
	return d, nil
}

// migratePins converts the previous release's pins and resizes the maps
// pinned with another size, leaving drop's retired masters out
// (shrink.go), noting each pin it changes in d.pins.
func (d *Datapath) migratePins(specs objectSpecs, drop *retiredMasters) error {
	// The objects declare every pinned map alike (TestObjectsShareMaps):
	// the tc object, always loaded, stands for all.
	var err error
	if d.migrations, err = migratePins(d.dir, specs.tc, d.pins); err != nil {
		return err
	}
	for _, mg := range d.migrations {
		switch mg.name {
		case mapServices, mapServices6, mapRevNat, mapRevNat6:
			// Converted from the previous layout, which has no retired
			// masters: what checkShrink read of this layout's pins (stale
			// ones beside a rolled-back agent's, which the conversion
			// replaced) names nothing here, and its ids may be live
			// masters' now. A size that fits only without them fails
			// the resize instead (rolled back).
			drop = nil
		}
	}
	resized, err := resizePins(d.dir, specs.tc, d.pins, drop)
	if err != nil {
		return err
	}
	d.migrations = append(d.migrations, resized...)
	if drop != nil {
		d.retiredLeftOut = drop.n
	}
	return checkPinned(specs.tc, d.dir)
}

// RetiredLeftOut returns how many retired masters (removed TCP
// frontends' masters kept for their established flows: reconciler's
// retired.go) Open left out of service maps it made smaller (shrink.go):
// their established per-packet flows end, as at a deletion. 0 when no
// map shrank so.
func (d *Datapath) RetiredLeftOut() int { return d.retiredLeftOut }

// failAfterLoad, set by a test, makes Open fail once the pins are
// converted and resized and the programs loaded: as a verifier rejection
// of a later program, or a start cancelled there, would.
var failAfterLoad func() error

// beforeIPv6Programs, if set (tests), is called by Open just before the
// IPv6 tc programs go into the pinned sluice6_tc_v1.
var beforeIPv6Programs func(*Datapath)

// objectSpecs are the collections Open loads; nil ones are not loaded.
type objectSpecs struct {
	tc, gc, sock, xdp, sockDestroy *ebpf.CollectionSpec
}

func (o objectSpecs) all() []*ebpf.CollectionSpec {
	var out []*ebpf.CollectionSpec
	for _, s := range []*ebpf.CollectionSpec{o.tc, o.gc, o.sock, o.xdp, o.sockDestroy} {
		if s != nil {
			out = append(out, s)
		}
	}
	return out
}

// specs reads the objects the configuration uses, probing the kernel for
// the variants (features.go), and records what it found in d.features.
func (d *Datapath) specs() (objectSpecs, error) {
	var o objectSpecs
	var err error
	if o.tc, err = loadTc(); err != nil {
		return o, err
	}
	if o.gc, err = loadCtgc(); err != nil {
		return o, err
	}
	if d.cfg.XDP != XDPOff {
		if o.xdp, err = loadXdp(); err != nil {
			return o, err
		}
	}
	if d.cfg.DisableSocketLB {
		return o, nil
	}
	if o.sock, err = loadSock(); err != nil {
		return o, err
	}
	d.features.SetRetval = haveSetRetval() == nil
	if err := selectSockVariant(o.sock, d.features.SetRetval); err != nil {
		return o, err
	}
	if d.features.SockDestroy = sockDestroyMethod(); d.features.SockDestroy == SockDestroyBPF {
		if o.sockDestroy, err = loadSockdestroy(); err != nil {
			return o, err
		}
	}
	return o, nil
}

// selectSockVariant makes the socket programs that refuse a connection
// the variant the kernel takes: with bpf_set_retval (ECONNREFUSED), or
// their eperm twins without it (sock.c), which keep their own names
// (bpftool shows sluice_eperm_co for sluice_eperm_connect4).
func selectSockVariant(spec *ebpf.CollectionSpec, setRetval bool) error {
	for _, hook := range []string{"connect4", "sendmsg4", "connect6", "sendmsg6"} {
		name, twinName := "sluice_"+hook, "sluice_eperm_"+hook
		twin := spec.Programs[twinName]
		if spec.Programs[name] == nil || twin == nil {
			return fmt.Errorf("program %s or its twin %s missing from the socket object", name, twinName)
		}
		if !setRetval {
			spec.Programs[name] = twin
		}
		delete(spec.Programs, twinName)
	}
	return nil
}

// load loads the collections in specs, reusing (or creating) the pins.
func (d *Datapath) load(specs objectSpecs) (err error) {
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: d.dir}}
	defer func() {
		if err != nil {
			// What was loaded is dropped; err says why.
			_ = d.closeObjects()
		}
	}()
	// While conntrack is migrated, this load's new flows keep out of
	// the new sluice_conntrack until AttachDevices has switched every
	// hook (ct_admit_paused, bpf/lib/conntrack.h; resumeAdmit).
	if err := setVariable(specs.tc, "the tc object", "ct_admit_paused", boolU8(d.pauseShare())); err != nil {
		return err
	}
	if err := specs.tc.LoadAndAssign(&d.tc, opts); err != nil {
		return fmt.Errorf("load tc programs: %w", verifierDetail(err))
	}
	// The ICMP rate limits as soon as their map exists, before any
	// program goes into a pinned prog array: a map created by this load
	// holds zeros (ratemask 0: no limit at all), and the previous
	// agent's running IPv4 entry tail-calls the IPv6 program put into
	// sluice6_tc_v1 below. Not put back by a start that fails: what it
	// writes is the node's sysctls now.
	rl := DefaultICMPRateLimits()
	if d.cfg.ICMPRateLimits != nil {
		rl = *d.cfg.ICMPRateLimits
	}
	if _, err := d.setICMPRateLimits(rl); err != nil {
		return err
	}
	// The dry-run programs, loaded from the same spec, stand for the
	// programs after the start.
	if err := setVariable(specs.tc, "the tc object", "ct_admit_paused", uint8(0)); err != nil {
		return err
	}
	d.tcSpec = specs.tc
	if !d.cfg.DeferDryRun {
		if _, err := d.LoadDryRun(); err != nil {
			return err
		}
	}
	// While IPv6 conntrack is migrated, the previous agent's IPv6
	// programs stay until switchIPv6 (migrate.go).
	d.ipv6Pending, _ = d.migratingIPv6()
	if !d.ipv6Pending {
		if err := d.pins.keepProgArray(d.tc.Sluice6TcV1, mapTC6, false); err != nil {
			return err
		}
		if beforeIPv6Programs != nil {
			beforeIPv6Programs(d)
		}
		if err := d.tc.setIPv6Programs(false); err != nil {
			return err
		}
	}
	if err := specs.gc.LoadAndAssign(&d.gc, opts); err != nil {
		return fmt.Errorf("load conntrack GC program: %w", verifierDetail(err))
	}
	if specs.sock != nil {
		if err := specs.sock.LoadAndAssign(&d.sock, opts); err != nil {
			return fmt.Errorf("load socket programs: %w", verifierDetail(err))
		}
	}
	if specs.xdp != nil {
		if err := specs.xdp.LoadAndAssign(&d.xdp, opts); err != nil {
			return fmt.Errorf("load XDP program: %w", verifierDetail(err))
		}
		if !d.ipv6Pending {
			if err := d.pins.keepProgArray(d.xdp.Sluice6XdpV1, mapXDP6, false); err != nil {
				return err
			}
			if err := d.xdp.setIPv6Program(); err != nil {
				return err
			}
		}
	}
	d.maps = &Maps{
		services:   d.tc.SluiceServicesV2,
		backends:   d.tc.SluiceBackendsV2,
		revNat:     d.tc.SluiceRevNatV2,
		conntrack:  d.tc.SluiceConntrackV2,
		ctNew:      d.tc.SluiceCtNewV1,
		ctAdmit:    d.tc.SluiceCtAdmitV1,
		ctPcpu:     d.tc.SluiceCtPcpuV1,
		ctFlush:    d.tc.SluiceCtFlushV1,
		ctGC:       d.gc.SluiceCtGc,
		affinity:   d.tc.SluiceSessionAffinityV1,
		affFix:     d.tc.SluiceAffFixV1,
		affFixProg: d.gc.SluiceAffFix,
		sockRev:    d.tc.SluiceSockRevV1,
		udpStick:   d.tc.SluiceUdpStickV1,
		metrics:    d.tc.SluiceMetricsV1,
		devices:    d.tc.SluiceDevicesV1,
		srcRanges:  d.tc.SluiceSrcRangesV1,
		serviceIPs: d.tc.SluiceServiceIpsV1,
		nodeCIDRs:  d.tc.SluiceNodeCidrsV1,
		svcStats:   d.tc.SluiceSvcStatsV1,
		cfg:        d.cfg,

		services6:   d.tc.Sluice6ServicesV2,
		backends6:   d.tc.Sluice6BackendsV2,
		revNat6:     d.tc.Sluice6RevNatV2,
		srcRanges6:  d.tc.Sluice6SrcRangesV1,
		serviceIPs6: d.tc.Sluice6ServiceIpsV1,
		affinity6:   d.tc.Sluice6AffinityV1,
		affFix6:     d.tc.Sluice6AffFixV1,
		affFixProg6: d.gc.SluiceAffFix6,
		nodeCIDRs6:  d.tc.Sluice6NodeCidrsV1,
		devices6:    d.tc.Sluice6DevicesV1,
	}
	d.maps.ctFlush6 = d.tc.Sluice6CtFlushV1
	d.maps.conntrack6, d.maps.ctNew6 = d.tc.Sluice6ConntrackV1, d.tc.Sluice6CtNewV1
	// The programs' dev_l3_maybe (1 as loaded) says what the pinned
	// device map holds before they are attached (devices.go).
	d.maps.l3Gates = []*ebpf.Variable{d.tc.DevL3Maybe}
	if d.xdp.DevL3Maybe != nil {
		d.maps.l3Gates = append(d.maps.l3Gates, d.xdp.DevL3Maybe)
	}
	if d.xdp.DevTunnelMaybe != nil {
		d.maps.tunGates = []*ebpf.Variable{d.xdp.DevTunnelMaybe}
	}
	if err := d.maps.syncL3Gate(); err != nil {
		return err
	}
	if d.maps.slots4, err = openSlotTable(d.tc.SluiceSlotsV1, mapSlots); err != nil {
		return err
	}
	if d.maps.slots6, err = openSlotTable(d.tc.Sluice6SlotsV1, mapSlots6); err != nil {
		return err
	}
	if err := d.maps.openBeTables(); err != nil {
		return err
	}
	// The ranges in use are the masters' (slots.go).
	if err := d.maps.rebuildSlots(); err != nil {
		return err
	}
	d.maps.sockRev6 = d.tc.Sluice6SockRevV1
	if specs.sockDestroy != nil {
		if d.maps.sockTerm, err = loadSockTerminator(specs.sockDestroy, opts); err != nil {
			return err
		}
	} else if d.features.SockDestroy == SockDestroyNetlink {
		d.maps.sockTerm = &sockTerminator{method: SockDestroyNetlink}
	}
	if d.features.MapCount = haveMapCount() == nil; d.features.MapCount {
		if d.counter, err = loadMapCounter(); err != nil {
			return err
		}
		if d.ctCounted, err = countedTables(d.tc.SluiceConntrackV2, d.tc.Sluice6ConntrackV1); err != nil {
			return err
		}
	}
	for _, mg := range d.migrations {
		if mg.cur, err = d.tc.mapByName(mg.name); err != nil {
			return err
		}
	}
	return d.loadShim(opts)
}

// configure sizes the maps and sets the per-node constants of spec.
func configure(spec *ebpf.CollectionSpec, cfg Config) error {
	for name, n := range cfg.maxEntries() {
		ms, ok := spec.Maps[name]
		if !ok {
			return fmt.Errorf("map %s missing from BPF object", name)
		}
		ms.MaxEntries = uint32(n)
	}
	if err := setPreallocation(spec, cfg.PreallocateMaps); err != nil {
		return err
	}
	if ms, ok := spec.Maps[mapMetrics]; !ok || int(ms.MaxEntries) < len(metricNames()) {
		return fmt.Errorf("map %s: missing from BPF object, or without room for its %d reasons", mapMetrics, len(metricNames()))
	}
	cidrs, err := wantNodeCIDRs(cfg)
	if err != nil {
		return err
	}
	vars := map[string]any{
		"ct_timeout_tcp_ns":     uint64(cfg.CTTimeoutTCP.Nanoseconds()),
		"ct_timeout_syn_ns":     uint64(cfg.CTTimeoutSYN.Nanoseconds()),
		"ct_timeout_udp_ns":     uint64(cfg.CTTimeoutUDP.Nanoseconds()),
		"ct_timeout_close_ns":   uint64(cfg.CTTimeoutClose.Nanoseconds()),
		"ct_timeout_snat_tw_ns": uint64(cfg.CTTimeoutSNATTimeWait.Nanoseconds()),
		"ct_half_open_max":      uint32(max(cfg.CTHalfOpenMax, 0)),
		"snat_port_min":         cfg.SNATPortMin,
		"snat_port_max":         cfg.SNATPortMax,
		"node_ip4":              uint32(0),
		"have_cluster_cidr":     boolU8(hasCIDR(cidrs, nodeCIDRCluster, false)),
		"node_ip6":              sockV6addr{},
		"have_cluster_cidr6":    boolU8(hasCIDR(cidrs, nodeCIDRCluster, true)),
		"masquerade_all":        boolU8(cfg.MasqueradeAll),
		"service_metrics":       boolU8(cfg.ServiceMetrics),
		"fib_cache_ns":          uint64(cfg.XDPRouteCacheAge.Nanoseconds()),
	}
	for _, ip := range cfg.NodeIPs {
		if ip.Unmap().Is4() {
			vars["node_ip4"] = be32(ip.Unmap())
			break
		}
	}
	if i := slices.IndexFunc(cfg.NodeIPs, is6); i >= 0 {
		vars["node_ip6"] = v6addr(cfg.NodeIPs[i])
	}
	for name, v := range vars {
		if err := setVariable(spec, "BPF object", name, v); err != nil {
			return err
		}
	}
	return nil
}

// setVariable sets the variable name of spec, the object obj names in the
// error if it has none, to v.
func setVariable(spec *ebpf.CollectionSpec, obj, name string, v any) error {
	vs := spec.Variables[name]
	if vs == nil {
		return fmt.Errorf("variable %s missing from %s", name, obj)
	}
	if err := vs.Set(v); err != nil {
		return fmt.Errorf("set %s: %w", name, err)
	}
	return nil
}

func boolU8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// checkPinned reports a pinned map that the load would refuse to reuse,
// with the reason spelled out.
func checkPinned(spec *ebpf.CollectionSpec, dir string) error {
	return eachPin(spec, dir, func(_, path string, ms *ebpf.MapSpec, m *ebpf.Map, info *ebpf.MapInfo) error {
		m.Close()
		switch {
		case info.Type != ms.Type:
			return fmt.Errorf("pinned map %s has type %s, want %s: remove it with Cleanup", path, info.Type, ms.Type)
		case info.KeySize != ms.KeySize || info.ValueSize != ms.ValueSize:
			return fmt.Errorf("pinned map %s has key/value size %d/%d, want %d/%d: remove it with Cleanup",
				path, info.KeySize, info.ValueSize, ms.KeySize, ms.ValueSize)
		case info.MaxEntries != ms.MaxEntries:
			return fmt.Errorf("pinned map %s has max_entries %d, configured %d: restore the old size or remove it with Cleanup",
				path, info.MaxEntries, ms.MaxEntries)
		case info.Flags != ms.Flags:
			return fmt.Errorf("pinned map %s has flags %#x, want %#x (%s): remove it with Cleanup",
				path, info.Flags, ms.Flags, preallocation(ms.Flags))
		}
		return nil
	})
}

// loadPinnedInfo opens the map pinned at path (opts as
// ebpf.LoadPinnedMap takes them) and reads its info. On an error nothing
// is left open; a missing pin is an error that errors.Is os.ErrNotExist.
func loadPinnedInfo(path string, opts *ebpf.LoadPinOptions) (*ebpf.Map, *ebpf.MapInfo, error) {
	m, err := ebpf.LoadPinnedMap(path, opts)
	if err != nil {
		return nil, nil, fmt.Errorf("open pinned map %s: %w", path, err)
	}
	info, err := m.Info()
	if err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("info of pinned map %s: %w", path, err)
	}
	return m, info, nil
}

// verifierDetail makes a verifier rejection carry the end of its log.
func verifierDetail(err error) error {
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		return fmt.Errorf("%w\n%+v", err, ve)
	}
	return err
}

// Maps returns the map operations the reconciler drives.
func (d *Datapath) Maps() *Maps { return d.maps }

// TCIngress is the program attached to device ingress.
func (d *Datapath) TCIngress() *ebpf.Program { return d.tc.SluiceIngress }

// XDP is the program attached to the devices in XDP mode; nil with XDP
// off (it is not loaded then).
func (d *Datapath) XDP() *ebpf.Program { return d.xdp.SluiceXdp }

// TCEgress is the program attached to device egress.
func (d *Datapath) TCEgress() *ebpf.Program { return d.tc.SluiceEgress }

// Features says what the kernel offered beyond the minimum (features.go).
func (d *Datapath) Features() Features { return d.features }

// Close releases the agent's file descriptors. Pins and links stay, so
// traffic keeps flowing while no agent runs; the pins Open converted or
// resized too (Commit). A start that failed closes with Abort instead.
func (d *Datapath) Close() error {
	err := d.Commit()
	d.closeMigrations()
	return errors.Join(err, d.closeObjects())
}

func (d *Datapath) closeObjects() error {
	var errs []error
	if d.maps != nil && d.maps.sockTerm != nil {
		errs = append(errs, d.maps.sockTerm.Close())
	}
	if d.maps != nil {
		errs = append(errs, d.maps.closeSlots(), d.maps.closeBeTables())
	}
	return errors.Join(append(errs, d.closeDryRun(), d.sock.Close(), d.tc.Close(), d.xdp.Close(), d.gc.Close(),
		d.shim.Close(), d.counter.Close())...)
}

// CounterNames returns the reasons Counters reports, in a stable order (for
// declaring metrics before the first scrape).
func CounterNames() []string { return slices.Clone(metricNames()) }

// Counters returns the datapath outcome counters, summed over CPUs, by
// reason.
func (d *Datapath) Counters() (map[string]uint64, error) {
	return readCounters(d.maps.metrics, len(metricNames()))
}

// readCounters sums the first n reasons of sluice_metrics over CPUs.
func readCounters(metrics *ebpf.Map, n int) (map[string]uint64, error) {
	names := metricNames()
	n = min(n, len(names))
	out := make(map[string]uint64, n)
	var perCPU []uint64
	for i, name := range names[:n] {
		if err := metrics.Lookup(uint32(i), &perCPU); err != nil {
			return nil, fmt.Errorf("read counter %s: %w", name, err)
		}
		var sum uint64
		for _, v := range perCPU {
			sum += v
		}
		out[name] = sum
	}
	return out, nil
}

// refuseDefaultBPFFSInTest refuses the host's own bpffs (DefaultBPFFS)
// in a test binary: a test that pins there, or cleans up there, touches
// the node's real agent state and leaves or removes pins at its root.
// Tests set their own bpffs (a mount of their own, or a t.TempDir() where
// nothing is to be pinned).
func refuseDefaultBPFFSInTest(bpffs string) error {
	if !testing.Testing() {
		return nil
	}
	p := filepath.Clean(bpffs)
	if r, err := filepath.EvalSymlinks(p); err == nil {
		p = r
	}
	if p == DefaultBPFFS {
		return fmt.Errorf("bpffs %s is the host's default: tests must set their own bpffs (datapath.Config.BPFFS)", bpffs)
	}
	return nil
}
