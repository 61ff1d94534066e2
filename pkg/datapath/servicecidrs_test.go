package datapath

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// TestServiceCIDRsAtRunTime: service CIDRs set at run time
// (SetServiceCIDRs, the reconciler's write of the ServiceCIDR objects'
// CIDRs) drop an unallocated address of theirs from then on, and no longer
// once removed; a ClusterIP inside them is still DNATed and its other port
// still rejected, as the programs match frontends and service IPs before
// the drop.
func TestServiceCIDRsAtRunTime(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		w := semanticsOf(v6)
		ns, d, eth0, _ := semanticsNode(t, Config{}, w)
		ing := d.TCIngress()
		ns.Enter(t)
		unallocated := func(sport uint16) []byte {
			return nsClient(sport, l4(w.addr("10.96.5.5"), 80, model.TCP)).Bytes()
		}
		verdict, _ := runOn(t, ing, eth0, unallocated(43000))
		expectVerdict(t, "no service CIDR yet", verdict, tcActOK)

		if err := d.Maps().SetServiceCIDRs(w.prefixes("10.96.0.0/16")); err != nil {
			t.Fatal(err)
		}
		verdict, _ = runOn(t, ing, eth0, unallocated(43001))
		expectVerdict(t, "unallocated address of the new CIDR", verdict, tcActShot)
		expectDNAT(t, "ClusterIP in the new CIDR", ing, eth0, nsClient(43002, w.cipRem), w.beRemote)
		other := nsClient(43003, model.L4Addr{Addr: w.cipRem.Addr, Port: 81, Proto: model.TCP})
		verdict, out := runOn(t, ing, eth0, other.Bytes())
		if want := portUnreachable(other); verdict != tcActRedirect || !bytes.Equal(out, want) {
			t.Fatalf("ClusterIP's other port: verdict %d, output\n got %x\nwant %x", verdict, out, want)
		}

		if err := d.Maps().SetServiceCIDRs(nil); err != nil {
			t.Fatal(err)
		}
		verdict, _ = runOn(t, ing, eth0, unallocated(43004))
		expectVerdict(t, "the CIDR removed", verdict, tcActOK)
	})
}

// fromSourceConfig is the configuration of TestServiceCIDRsPinned and
// TestServiceCIDRsOverCapacity: a cluster CIDR (10.0.0.0/8), the flag's
// service CIDR (10.96.0.0/16), and ServiceCIDRsFromSource.
func fromSourceConfig(t *testing.T) Config {
	t.Helper()
	testutil.Privileged(t)
	cfg := smallConfig(testPinDir(t))
	cfg.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	cfg.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")}
	cfg.ServiceCIDRsFromSource = true
	return cfg
}

// TestServiceCIDRsPinned: SetServiceCIDRs changes the service CIDRs of
// both families and leaves the cluster CIDRs; Dump reads them; an agent
// restarted with ServiceCIDRsFromSource (the Kubernetes source) keeps the
// ones learnt before, adding the flag's, until its reconciler writes the
// set; without it the set is the flag's again.
func TestServiceCIDRsPinned(t *testing.T) {
	p := netip.MustParsePrefix
	cfg := fromSourceConfig(t)
	d := openTest(t, cfg)
	if err := d.Maps().SetServiceCIDRs([]netip.Prefix{p("10.96.0.0/16"), p("10.200.0.0/24"), p("fd00::/108")}); err != nil {
		t.Fatal(err)
	}
	if err := d.Maps().SetServiceCIDRs([]netip.Prefix{p("10.96.0.0/16"), {}}); err == nil {
		t.Fatal("SetServiceCIDRs took an invalid prefix")
	}
	nodeCIDRs := func(d *Datapath) []string {
		t.Helper()
		got, err := d.Maps().NodeCIDRs()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, c := range got {
			out = append(out, c.String())
		}
		slices.Sort(out)
		return out
	}
	learnt := []string{"cluster 10.0.0.0/8", "service 10.200.0.0/24", "service 10.96.0.0/16", "service fd00::/108"}
	if got := nodeCIDRs(d); !reflect.DeepEqual(got, learnt) {
		t.Errorf("node CIDRs = %v, want %v (nothing written for the failed call)", got, learnt)
	}
	ks, err := d.Maps().Dump()
	if err != nil {
		t.Fatal(err)
	}
	if want := []netip.Prefix{p("10.96.0.0/16"), p("10.200.0.0/24"), p("fd00::/108")}; !slices.Equal(ks.ServiceCIDRs, want) {
		t.Errorf("Dump's service CIDRs = %v, want %v", ks.ServiceCIDRs, want)
	}
	d.Close()

	d = openTest(t, cfg)
	if got := nodeCIDRs(d); !reflect.DeepEqual(got, learnt) {
		t.Errorf("restarted with ServiceCIDRsFromSource: node CIDRs = %v, want %v", got, learnt)
	}
	d.Close()

	cfg.ServiceCIDRsFromSource = false
	d = openTest(t, cfg)
	if got, want := nodeCIDRs(d), []string{"cluster 10.0.0.0/8", "service 10.96.0.0/16"}; !reflect.DeepEqual(got, want) {
		t.Errorf("restarted without it: node CIDRs = %v, want %v", got, want)
	}
}

// TestServiceCIDRsOverCapacity: a set of service CIDRs that would not fit
// sluice_node_cidrs with the cluster CIDRs is refused before anything is
// written, with an ErrCapacity error naming the limit and the count; a
// set that fits replaces a full map's (its stale entries deleted first);
// and an agent restarted with ServiceCIDRsFromSource on a full map opens,
// with the flag's CIDRs, though the flag's range is not among them.
func TestServiceCIDRsOverCapacity(t *testing.T) {
	cfg := fromSourceConfig(t)
	d := openTest(t, cfg)
	capacity := int(d.Maps().nodeCIDRs.MaxEntries())
	ranges := func(second, n int) []netip.Prefix {
		var out []netip.Prefix
		for i := range n {
			out = append(out, netip.PrefixFrom(netip.AddrFrom4([4]byte{172, byte(second), byte(i), 0}), 24))
		}
		return out
	}
	count := func(d *Datapath) (cluster, service int) {
		t.Helper()
		got, err := d.Maps().NodeCIDRs()
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range got {
			if c.Kind == nodeCIDRService {
				service++
			} else {
				cluster++
			}
		}
		return cluster, service
	}
	err := d.Maps().SetServiceCIDRs(ranges(16, capacity+6))
	if !errors.Is(err, reconciler.ErrCapacity) || !strings.Contains(err.Error(), fmt.Sprintf("%d IPv4 CIDRs at most", capacity)) ||
		!strings.Contains(err.Error(), fmt.Sprintf("%d asked (1 cluster, %d service)", capacity+7, capacity+6)) {
		t.Errorf("%d service CIDRs: err %v, want ErrCapacity naming %d and the count", capacity+6, err, capacity)
	}
	if c, s := count(d); c != 1 || s != 1 {
		t.Errorf("after the refused set: %d cluster and %d service CIDRs, want 1 and 1 (what was there kept)", c, s)
	}
	// Full: the cluster CIDR and capacity-1 service CIDRs; then another
	// such set, whose adds do not fit beside the old ones.
	for _, second := range []int{17, 18} {
		set := ranges(second, capacity-1)
		if err := d.Maps().SetServiceCIDRs(set); err != nil {
			t.Fatalf("%d service CIDRs 172.%d.x.0/24: %v", len(set), second, err)
		}
		ks, err := d.Maps().Dump()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ks.ServiceCIDRs, set) {
			t.Errorf("service CIDRs = %v, want %v", ks.ServiceCIDRs, set)
		}
	}
	d.Close()

	// Restarted on the full map: the flag's 10.96.0.0/16 does not fit
	// beside the learnt ones; Open keeps the flag's alone.
	d = openTest(t, cfg)
	if c, s := count(d); c != 1 || s != 1 {
		t.Errorf("restarted on a full map: %d cluster and %d service CIDRs, want 1 and 1 (the flag's)", c, s)
	}
}
