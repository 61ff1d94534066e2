package datapath

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// Checks of the ABI between the agent and the BPF objects that the Go
// compiler cannot make (the compile-time ones are in abi.go). None needs
// root: they read the embedded objects.

func loadSpecs(t *testing.T) map[string]*ebpf.CollectionSpec {
	t.Helper()
	specs := map[string]*ebpf.CollectionSpec{}
	for name, load := range map[string]func() (*ebpf.CollectionSpec, error){
		"sock": loadSock, "tc": loadTc, "xdp": loadXdp, "ctgc": loadCtgc,
	} {
		spec, err := load()
		if err != nil {
			t.Fatalf("load %s spec: %v", name, err)
		}
		specs[name] = spec
	}
	return specs
}

// TestMetricNames: every reason of enum metric_reason has a label derived
// from its C name, and the labels that dashboards and tests use are the
// ones they always were.
func TestMetricNames(t *testing.T) {
	names := metricNames()
	if len(names) != int(sockMetricReasonMETRIC_MAX) {
		t.Fatalf("%d labels for %d reasons", len(names), sockMetricReasonMETRIC_MAX)
	}
	for r, want := range map[sockMetricReason]string{
		sockMetricReasonMETRIC_SOCK_XLATE:        "sock_xlate",
		sockMetricReasonMETRIC_TC_DNAT_NEW:       "tc_dnat_new",
		sockMetricReasonMETRIC_TC_SRC_RANGE_DENY: "tc_src_range_deny",
		sockMetricReasonMETRIC_XDP_REV:           "xdp_rev",
	} {
		if names[r] != want {
			t.Errorf("reason %d labelled %q, want %q", r, names[r], want)
		}
	}
	for obj, spec := range loadSpecs(t) {
		ms := spec.Maps[mapMetrics]
		if ms == nil || int(ms.MaxEntries) < len(names) {
			t.Errorf("%s: %s has room for %v reasons, want %d", obj, mapMetrics, ms, len(names))
		}
	}
}

// TestObjectsShareMaps: the objects declare every pinned map alike.
// Whichever loads first creates the pins and the others reuse them, so a
// difference would show only as a load error in the field (or, for the
// size, as one object's view of a map the others see differently).
func TestObjectsShareMaps(t *testing.T) {
	specs := loadSpecs(t)
	ref := specs["tc"]
	// The maps an object has alone, unpinned: the socket path's dry-run
	// record (only sluicectl's load of sluice_sock_explain creates it,
	// sockexplain.go), XDP's route cache and its generation
	// (routecache.go), and the .data of the objects that parse
	// (dev_l3_maybe, devices.go; tc's and XDP's ct_admit_paused too,
	// migrate.go), and tc's ICMP rate limit buckets (icmprl.go).
	own := map[string][]string{
		"sock": {sockExplainMap},
		"tc":   {".data", "sluice_icmp_peers_v1", "sluice_icmp_global_v1"},
		"xdp":  {"sluice_fib_v1", "sluice6_fib_v1", ".bss", ".data"},
	}
	for obj, spec := range specs {
		for _, name := range own[obj] {
			if ms := spec.Maps[name]; ms == nil || ms.Pinning != ebpf.PinNone {
				t.Errorf("%s: %s is %v, want an unpinned map", obj, name, ms)
			}
		}
		if len(spec.Maps)-len(own[obj]) != len(ref.Maps)-len(own["tc"]) {
			t.Errorf("%s declares %d maps, %d its own; tc %d, %d its own", obj, len(spec.Maps), len(own[obj]), len(ref.Maps), len(own["tc"]))
		}
		for name, ms := range spec.Maps {
			if slices.Contains(own[obj], name) {
				continue
			}
			if obj == "sock" && name == ".rodata" {
				// The socket object's constants hold two more,
				// host_netns_cookie and agent_netns_cookie
				// (bpf/lib/socklb.h).
				continue
			}
			r, ok := ref.Maps[name]
			if !ok {
				t.Errorf("%s declares %s, tc does not", obj, name)
				continue
			}
			if ms.Type != r.Type || ms.KeySize != r.KeySize || ms.ValueSize != r.ValueSize ||
				ms.MaxEntries != r.MaxEntries || ms.Flags != r.Flags || ms.Pinning != r.Pinning {
				t.Errorf("%s: %s is %v, in tc %v", obj, name, ms, r)
			}
		}
	}
}

// TestConfigDefaults: the defaults in bpf/lib/config.h and maps.h are
// Config's, so an object loaded without configure behaves like the
// agent's default configuration.
func TestConfigDefaults(t *testing.T) {
	for obj, spec := range loadSpecs(t) {
		for name, want := range map[string]uint64{
			"ct_timeout_tcp_ns":   uint64(DefaultCTTimeoutTCP / time.Nanosecond),
			"ct_timeout_syn_ns":   uint64(DefaultCTTimeoutSYN / time.Nanosecond),
			"ct_timeout_udp_ns":   uint64(DefaultCTTimeoutUDP / time.Nanosecond),
			"ct_timeout_close_ns": uint64(DefaultCTTimeoutClose / time.Nanosecond),
			"fib_cache_ns":        uint64(DefaultXDPRouteCacheAge / time.Nanosecond),
		} {
			var got uint64
			if vs := spec.Variables[name]; vs == nil || vs.Get(&got) != nil || got != want {
				t.Errorf("%s: %s = %d, Config's default is %d", obj, name, got, want)
			}
		}
		for name, want := range map[string]uint16{
			"snat_port_min": DefaultSNATPortMin,
			"snat_port_max": DefaultSNATPortMax,
		} {
			var got uint16
			if vs := spec.Variables[name]; vs == nil || vs.Get(&got) != nil || got != want {
				t.Errorf("%s: %s = %d, Config's default is %d", obj, name, got, want)
			}
		}
		d := Config{}.withDefaults()
		for name, want := range d.maxEntries() {
			if ms := spec.Maps[name]; ms == nil || int(ms.MaxEntries) != want {
				t.Errorf("%s: %s has max_entries %v, Config's default is %d", obj, name, ms, want)
			}
		}
	}
}

// TestNoProgramReadsRevNat: no BPF program uses the reverse-NAT maps (a
// reply is reverse-NATed from its flow's conntrack entry, which names the
// frontend), so that the entries without RN_F_PRESENT need no check in
// BPF. A program that starts to read them must treat an absent entry as
// a missing one, as lookup_backend does: this test is where that is
// remembered. Fails if a program references sluice_rev_nat_v2 or its
// IPv6 twin.
func TestNoProgramReadsRevNat(t *testing.T) {
	for name, spec := range loadSpecs(t) {
		for pname, ps := range spec.Programs {
			for _, ins := range ps.Instructions {
				if ref := ins.Reference(); ins.IsLoadFromMap() && strings.Contains(ref, "rev_nat") {
					t.Errorf("%s program %s uses %s (%v)", name, pname, ref, ins)
				}
			}
		}
	}
}
