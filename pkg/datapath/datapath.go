// Package datapath loads Sluice's BPF programs, owns its pinned maps and
// attaches the programs to cgroups and network devices. It is the only
// package in Sluice that imports cilium/ebpf.
//
// Everything the kernel holds outlives the agent: maps are pinned under
// BPFFS/sluice/ and links under BPFFS/sluice/links/, so an agent that exits
// or restarts leaves traffic alone. Open reuses pinned maps (their contents
// are the state the reconciler restores from), migrating those of the
// previous release to this one's names and layouts (pins.go), and the
// Attach methods replace the programs behind pinned links in place. Only
// Cleanup removes anything. OpenPinned is the operators' read-only view of
// the same pins. The constants both sides of the maps use are generated
// from bpf/lib/structs.h (abi.go).
//
// Four objects are built from bpf/: sock.c (cgroup connect4, sendmsg4,
// recvmsg4, getpeername4), tc.c (tc ingress and egress), xdp.c (the XDP
// fast path for north-south flows to remote backends) and ctgc.c (the
// conntrack garbage collector the agent runs, conntrack.go, and the
// session affinity upkeep, affinity.go). All declare
// every map with pinning by name, so whichever loads first creates the
// pins and the others reuse them.
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
	"time"

	"github.com/cilium/ebpf"
)

// Config sizes the maps and sets per-node datapath settings.
type Config struct {
	// BPFFS is the bpffs mount, default "/sys/fs/bpf". Maps are pinned in
	// BPFFS/sluice/ and links in BPFFS/sluice/links/.
	BPFFS string

	// Map sizes; 0 means the default. MaxServices sizes sluice_rev_nat
	// (65536), MaxBackends sluice_backends (262144), MaxServiceEntries
	// sluice_services, masters plus slots (1<<20), MaxConntrack
	// sluice_conntrack, the established flows and SNAT port reservations
	// (262144; when it is full new flows are refused), MaxConntrackNew
	// sluice_ct_new, the flows not answered yet (65536; an LRU: a flood of
	// new flows evicts only its own kind), MaxSockRev sluice_sock_rev and
	// sluice_udp_stick (262144), MaxAffinity sluice_session_affinity, the
	// session affinity of clients (65536, as Cilium's; an LRU: the
	// clients seen longest ago make room).
	MaxServices, MaxBackends, MaxServiceEntries, MaxConntrack, MaxConntrackNew, MaxSockRev, MaxAffinity int

	// Idle timeouts of per-packet conntrack entries; 0 means the default
	// (6h for established TCP, 60s for UDP). CTTimeoutSYN is how long a
	// TCP flow lives before its first reply (default 60s, as Cilium's SYN
	// timeout), CTTimeoutClose after a RST or a FIN each way (default
	// 10s).
	CTTimeoutTCP, CTTimeoutSYN, CTTimeoutUDP, CTTimeoutClose time.Duration

	// SNATPortMin and SNATPortMax bound the source ports external flows
	// to remote backends are source-NATed to (default 61000-65535, above
	// the kernel's default ephemeral range).
	SNATPortMin, SNATPortMax uint16

	// XDP is how the XDP fast path is attached to the devices: XDPOff
	// (the default), XDPGeneric or XDPNative.
	XDP XDPMode

	// NodeIPs are this node's addresses. On a device that holds one of
	// them, external flows to remote backends are source-NATed to it;
	// otherwise to the device's first IPv4 address. The first is the
	// node's primary address: what a flow masqueraded towards a backend on
	// this node is source-NATed to, and the source of a socket reaching
	// a LoadBalancer IP unbound (loadBalancerSourceRanges).
	NodeIPs []netip.Addr

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
	// MasqueradeAll (--masquerade-all) source-NATs all ClusterIP traffic,
	// and external traffic to a backend on this node.
	MasqueradeAll bool
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
	DefaultCTTimeoutTCP      = 6 * time.Hour
	DefaultCTTimeoutSYN      = 60 * time.Second
	DefaultCTTimeoutUDP      = 60 * time.Second
	DefaultCTTimeoutClose    = 10 * time.Second
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
	if c.SNATPortMin == 0 && c.SNATPortMax == 0 {
		c.SNATPortMin, c.SNATPortMax = DefaultSNATPortMin, DefaultSNATPortMax
	}
	return c
}

// maxEntries returns the configured size of each sized map.
func (c Config) maxEntries() map[string]int {
	return map[string]int{
		mapServices:  c.MaxServiceEntries,
		mapBackends:  c.MaxBackends,
		mapRevNat:    c.MaxServices,
		mapConntrack: c.MaxConntrack,
		mapCTNew:     c.MaxConntrackNew,
		mapSockRev:   c.MaxSockRev,
		mapUDPStick:  c.MaxSockRev,
		mapAffinity:  c.MaxAffinity,
		// Every service IP is some ClusterIP frontend's address.
		mapServiceIPs: c.MaxServices,
	}
}

// Datapath is the loaded programs and the maps they share.
type Datapath struct {
	cfg  Config
	dir  string // BPFFS/sluice
	sock sockObjects
	tc   tcObjects
	xdp  xdpObjects
	gc   ctgcObjects
	maps *Maps
}

// Open loads the programs and creates the pinned maps, or reuses them if
// an earlier agent pinned them; maps the previous release pinned under
// other names or layouts are migrated first (pins.go). A pinned map whose
// type, key, value or size differ from what this agent wants is an error:
// resizing would drop the state that keeps traffic flowing, so it takes an
// explicit Cleanup.
func Open(cfg Config) (*Datapath, error) {
	cfg = cfg.withDefaults()
	for name, n := range cfg.maxEntries() {
		if n < 0 || n > 1<<30 {
			return nil, fmt.Errorf("size of %s: %d out of range", name, n)
		}
	}
	if cfg.SNATPortMin == 0 || cfg.SNATPortMax < cfg.SNATPortMin {
		return nil, fmt.Errorf("SNAT port range %d-%d is empty", cfg.SNATPortMin, cfg.SNATPortMax)
	}
	cidrs, err := wantNodeCIDRs(cfg)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cfg.BPFFS, "sluice")
	if err := os.MkdirAll(filepath.Join(dir, "links"), 0o700); err != nil {
		return nil, fmt.Errorf("create pin directory: %w", err)
	}

	sockSpec, err := loadSock()
	if err != nil {
		return nil, err
	}
	tcSpec, err := loadTc()
	if err != nil {
		return nil, err
	}
	xdpSpec, err := loadXdp()
	if err != nil {
		return nil, err
	}
	gcSpec, err := loadCtgc()
	if err != nil {
		return nil, err
	}
	if cfg.XDP, err = ParseXDPMode(string(cfg.XDP)); err != nil {
		return nil, err
	}
	specs := []*ebpf.CollectionSpec{sockSpec, tcSpec, xdpSpec, gcSpec}
	for _, spec := range specs {
		if err := configure(spec, cfg); err != nil {
			return nil, err
		}
	}
	// The objects declare every map alike (TestObjectsShareMaps).
	if err := migratePins(dir, sockSpec); err != nil {
		return nil, err
	}
	for _, spec := range specs {
		if err := checkPinned(spec, dir); err != nil {
			return nil, err
		}
	}

	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}}
	d := &Datapath{cfg: cfg, dir: dir}
	for _, o := range []struct {
		what string
		spec *ebpf.CollectionSpec
		objs any
	}{
		{"socket programs", sockSpec, &d.sock},
		{"tc programs", tcSpec, &d.tc},
		{"XDP program", xdpSpec, &d.xdp},
		{"conntrack GC program", gcSpec, &d.gc},
	} {
		if err := o.spec.LoadAndAssign(o.objs, opts); err != nil {
			// d.Close closes what the objects before this one
			// loaded; the rest are still zero and close as nothing.
			return nil, errors.Join(fmt.Errorf("load %s: %w", o.what, verifierDetail(err)), d.Close())
		}
	}
	d.maps = &Maps{
		services:   d.sock.SluiceServicesV1,
		backends:   d.sock.SluiceBackendsV1,
		revNat:     d.sock.SluiceRevNatV1,
		conntrack:  d.sock.SluiceConntrackV2,
		ctNew:      d.sock.SluiceCtNewV1,
		ctFlush:    d.sock.SluiceCtFlushV1,
		ctGC:       d.gc.SluiceCtGc,
		affinity:   d.sock.SluiceSessionAffinityV1,
		affFix:     d.sock.SluiceAffFixV1,
		affFixProg: d.gc.SluiceAffFix,
		sockRev:    d.sock.SluiceSockRevV1,
		udpStick:   d.sock.SluiceUdpStickV1,
		metrics:    d.sock.SluiceMetricsV1,
		devices:    d.sock.SluiceDevicesV1,
		srcRanges:  d.sock.SluiceSrcRangesV1,
		serviceIPs: d.sock.SluiceServiceIpsV1,
		nodeCIDRs:  d.sock.SluiceNodeCidrsV1,
		cfg:        cfg,
	}
	if err := d.maps.setNodeCIDRs(cidrs); err != nil {
		return nil, errors.Join(err, d.Close())
	}
	return d, nil
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
	if ms, ok := spec.Maps[mapMetrics]; !ok || int(ms.MaxEntries) < len(metricNames()) {
		return fmt.Errorf("map %s: missing from BPF object, or without room for its %d reasons", mapMetrics, len(metricNames()))
	}
	vars := map[string]any{
		"ct_timeout_tcp_ns":   uint64(cfg.CTTimeoutTCP.Nanoseconds()),
		"ct_timeout_syn_ns":   uint64(cfg.CTTimeoutSYN.Nanoseconds()),
		"ct_timeout_udp_ns":   uint64(cfg.CTTimeoutUDP.Nanoseconds()),
		"ct_timeout_close_ns": uint64(cfg.CTTimeoutClose.Nanoseconds()),
		"snat_port_min":       cfg.SNATPortMin,
		"snat_port_max":       cfg.SNATPortMax,
		"node_ip4":            uint32(0),
		"have_cluster_cidr":   boolU8(len(cfg.ClusterCIDRs) > 0),
		"masquerade_all":      boolU8(cfg.MasqueradeAll),
	}
	for _, ip := range cfg.NodeIPs {
		if ip.Unmap().Is4() {
			vars["node_ip4"] = be32(ip.Unmap())
			break
		}
	}
	for name, v := range vars {
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("variable %s missing from BPF object", name)
		}
		if err := vs.Set(v); err != nil {
			return fmt.Errorf("set %s: %w", name, err)
		}
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
	for name, ms := range spec.Maps {
		if ms.Pinning != ebpf.PinByName {
			continue
		}
		path := filepath.Join(dir, name)
		m, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("open pinned map %s: %w", path, err)
		}
		info, err := m.Info()
		m.Close()
		if err != nil {
			return fmt.Errorf("info of pinned map %s: %w", path, err)
		}
		switch {
		case info.Type != ms.Type:
			return fmt.Errorf("pinned map %s has type %s, want %s: remove it with Cleanup", path, info.Type, ms.Type)
		case info.KeySize != ms.KeySize || info.ValueSize != ms.ValueSize:
			return fmt.Errorf("pinned map %s has key/value size %d/%d, want %d/%d: remove it with Cleanup",
				path, info.KeySize, info.ValueSize, ms.KeySize, ms.ValueSize)
		case info.MaxEntries != ms.MaxEntries:
			return fmt.Errorf("pinned map %s has max_entries %d, configured %d: restore the old size or remove it with Cleanup",
				path, info.MaxEntries, ms.MaxEntries)
		}
	}
	return nil
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

// XDP is the program attached to the devices in XDP mode.
func (d *Datapath) XDP() *ebpf.Program { return d.xdp.SluiceXdp }

// TCEgress is the program attached to device egress.
func (d *Datapath) TCEgress() *ebpf.Program { return d.tc.SluiceEgress }

// Close releases the agent's file descriptors. Pins and links stay, so
// traffic keeps flowing while no agent runs.
func (d *Datapath) Close() error {
	return errors.Join(d.sock.Close(), d.tc.Close(), d.xdp.Close(), d.gc.Close())
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
