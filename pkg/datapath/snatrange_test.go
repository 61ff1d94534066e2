package datapath

// Tests of the SNAT port range (--snat-port-range, snatrange.go): its
// parsing and checks, the programs' load over ranges of every size, and
// ct_create_snat's port search over a tiny range and a large one, per
// family, through BPF_PROG_TEST_RUN in a node namespace of the test's own.

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/packet"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/model"
)

func TestParseSNATPortRange(t *testing.T) {
	for _, c := range []struct {
		in     string
		lo, hi uint16
		err    string // a part of the error; "" for none
	}{
		{in: "61000-65535", lo: 61000, hi: 65535},
		{in: "1024-65535", lo: 1024, hi: 65535},
		{in: "40000-40000", lo: 40000, hi: 40000},
		{in: " 40000 - 40003 ", lo: 40000, hi: 40003},
		{in: "", err: "want MIN-MAX"},
		{in: "61000", err: "want MIN-MAX"},
		{in: "61000:65535", err: "want MIN-MAX"},
		{in: "-65535", err: `MIN "" is not a port`},
		{in: "x-65535", err: `MIN "x" is not a port`},
		{in: "61000-", err: `MAX "" is not a port`},
		{in: "61000-65536", err: `MAX "65536" is not a port`},
		{in: "61000-62000-63000", err: `MAX "62000-63000" is not a port`},
		{in: "65535-61000", err: "65535-61000 is empty (MIN > MAX)"},
		{in: "0-0", err: "0-0 starts below 1024"},
		{in: "600-2000", err: "600-2000 starts below 1024"},
	} {
		lo, hi, err := ParseSNATPortRange(c.in)
		switch {
		case c.err == "" && (err != nil || lo != c.lo || hi != c.hi):
			t.Errorf("ParseSNATPortRange(%q) = %d, %d, %v; want %d, %d", c.in, lo, hi, err, c.lo, c.hi)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("ParseSNATPortRange(%q) = %d, %d, %v; want an error with %q", c.in, lo, hi, err, c.err)
		}
	}
}

// TestOpenChecksSNATPortRange: Open refuses a range the flag's parsing
// would have refused, before it loads or pins anything; both bounds 0
// are the default range.
func TestOpenChecksSNATPortRange(t *testing.T) {
	for _, c := range []struct {
		lo, hi uint16
		err    string
	}{
		{5000, 4000, "SNAT port range 5000-4000 is empty"},
		{100, 200, "SNAT port range 100-200 starts below 1024"},
		{0, 5000, "SNAT port range 0-5000 starts below 1024"},
	} {
		dir := t.TempDir()
		d, err := Open(Config{BPFFS: dir, SNATPortMin: c.lo, SNATPortMax: c.hi})
		if err == nil {
			_ = d.Close()
		}
		if err == nil || !strings.Contains(err.Error(), c.err) {
			t.Errorf("Open with SNAT ports %d-%d: %v, want an error with %q", c.lo, c.hi, err, c.err)
		}
	}
	if c := (Config{}).withDefaults(); int(c.SNATPortMax)-int(c.SNATPortMin)+1 != 4536 {
		t.Errorf("the default range is %d-%d, want 4,536 ports (61000-65535)", c.SNATPortMin, c.SNATPortMax)
	}
}

// TestSNATPortRangeLoads: the programs of every kind load, and the
// verifier accepts them, whatever the range's size: one port, fewer than
// a search tries (SNAT_TRIES), exactly as many, one more, twice as many,
// the default, and all of 1024-65535. The instructions the verifier
// walked for tc's and XDP's programs are logged, to compare across
// ranges and builds.
func TestSNATPortRangeLoads(t *testing.T) {
	testutil.Privileged(t)
	for _, r := range []string{"62000-62000", "62000-62003", "62000-62031", "62000-62032", "62000-62063", "61000-65535", "1024-65535"} {
		lo, hi, err := ParseSNATPortRange(r)
		if err != nil {
			t.Fatal(err)
		}
		d := openTestWith(t, xdpConfig, func(c *Config) { c.SNATPortMin, c.SNATPortMax = lo, hi })
		var insns []string
		for name, p := range map[string]*ebpf.Program{
			"sluice_ingress": d.tc.SluiceIngress, "sluice6_ingress": d.tc.Sluice6Ingress,
			"sluice_xdp": d.xdp.SluiceXdp, "sluice6_xdp": d.xdp.Sluice6Xdp,
		} {
			if n, ok := progInfo(t, p).VerifiedInstructions(); ok {
				insns = append(insns, fmt.Sprintf("%s %d", name, n))
			}
		}
		sort.Strings(insns)
		t.Logf("SNAT ports %s: verified instructions: %s", r, strings.Join(insns, ", "))
	}
}

// TestSNATPortRangeTiny: with a range of 4 ports, 4 flows at once
// through one node to one remote backend each get a port of the range of
// their own, and a 5th is refused (XDP leaves it to tc, which drops it)
// and counted tc_snat_exhausted; with a range of 8 the 5th gets a port
// too. Per family, through tc and through XDP.
func TestSNATPortRangeTiny(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		for _, c := range []struct {
			ports string
			admit int // of 5 flows
		}{{"62000-62003", 4}, {"62000-62007", 5}} {
			for _, xdp := range []bool{false, true} {
				name := map[bool]string{false: "tc", true: "xdp"}[xdp] + "/" + c.ports
				t.Run(name, func(t *testing.T) { snatTiny(t, v6, xdp, c.ports, c.admit) })
			}
		}
	})
}

func snatTiny(t *testing.T, v6, xdp bool, ports string, admit int) {
	lo, hi, err := ParseSNATPortRange(ports)
	if err != nil {
		t.Fatal(err)
	}
	base := smallConfig
	if xdp {
		base = xdpConfig
	}
	d, ifindex, np, _ := snatNode(t, v6, configWith(base, func(c *Config) { c.SNATPortMin, c.SNATPortMax = lo, hi }))
	exhausted := func() uint64 {
		cs, err := d.Counters()
		if err != nil {
			t.Fatal(err)
		}
		return cs["tc_snat_exhausted"]
	}
	used := map[uint16]int{}
	for i := range 5 {
		syn := nsClient(uint16(41000+i), np)
		syn.Src = addr(twinAddr(v6, fmt.Sprintf("172.16.1.%d", 10+i)))
		before := exhausted()
		var v uint32
		if xdp {
			if v, _ = runXDP(t, d.XDP(), ifindex, syn.Bytes()); v != xdpTx && v != xdpPass {
				t.Fatalf("flow %d: XDP verdict %d", i, v)
			}
		}
		if !xdp || v == xdpPass {
			v, _ = runOn(t, d.TCIngress(), ifindex, syn.Bytes())
		}
		if i >= admit {
			if v != tcActShot {
				t.Fatalf("flow %d of a %d-port range: verdict %d, want it refused (drop)", i, admit, v)
			}
			if got := exhausted(); got != before+1 {
				t.Errorf("flow %d refused: tc_snat_exhausted %d, want %d", i, got, before+1)
			}
			continue
		}
		if v != tcActRedirect && v != xdpTx {
			t.Fatalf("flow %d: verdict %d, want it sent on (xdp %v)", i, v, xdp)
		}
		if xdp && v != xdpTx {
			t.Errorf("flow %d: left to tc, want XDP to send it", i)
		}
		sp := snatPortIn(t, d, syn.Src.String(), syn.SrcPort, np)
		if sp < lo || sp > hi {
			t.Errorf("flow %d: SNAT port %d outside %s", i, sp, ports)
		}
		if j, dup := used[sp]; dup {
			t.Errorf("flows %d and %d share the SNAT port %d", j, i, sp)
		}
		used[sp] = i
	}
}

// TestSNATPortSearchSpread: in a range larger than a search tries
// (SNAT_TRIES), a new flow finds a free port when a long run of the
// range is taken. Of 256 ports, 62000-62127 are held (reply entries of
// live reservations, copies of a real flow's); 24 new flows each get a
// free port. A search in order from a random start (the one before)
// fails when it starts among the first 97 of the held ports: each flow
// with a chance of 97/256 or more, all 24 passing about once in 100,000
// runs. Tries drawn at random each miss with 152/256 at most: all 32 of
// one flow's with (152/256)^32 < 6e-8. Per family, through tc and
// through XDP (its own inlined copy of the search: a miss there is a
// failure, not left to tc).
func TestSNATPortSearchSpread(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		t.Run("tc", func(t *testing.T) { snatSpread(t, v6, false) })
		t.Run("xdp", func(t *testing.T) { snatSpread(t, v6, true) })
	})
}

// snatRangeNode is snatNode with the SNAT range lo-hi (XDP loaded too
// with xdp) and a first flow source-NATed through tc: its port, and
// revAt, the reply key of a flow to the same backend source-NATed to
// port p (the first flow's entry copied under another port holds it).
func snatRangeNode(t *testing.T, v6, xdp bool, lo, hi uint16) (d *Datapath, ifindex int, np model.L4Addr, revAt func(p uint16) ctK, first uint16) {
	t.Helper()
	base := smallConfig
	if xdp {
		base = xdpConfig
	}
	d, ifindex, np, be := snatNode(t, v6, configWith(base, func(c *Config) { c.SNATPortMin, c.SNATPortMax = lo, hi }))
	syn := nsClient(42000, np)
	if v, _ := runOn(t, d.TCIngress(), ifindex, syn.Bytes()); v != tcActRedirect {
		t.Fatalf("first flow: verdict %d", v)
	}
	node := ofFamily(np.Addr, nsNodeIP, nsNodeIP6).String()
	revAt = func(p uint16) ctK { return ctKeyOf(be.addr.Addr.String(), be.addr.Port, node, p, model.TCP, ctReverse) }
	return d, ifindex, np, revAt, snatPortIn(t, d, syn.Src.String(), syn.SrcPort, np)
}

func snatSpread(t *testing.T, v6, xdp bool) {
	const lo, hi, held = 62000, 62255, 128
	d, ifindex, np, revAt, sp0 := snatRangeNode(t, v6, xdp, lo, hi)
	m := d.Maps()
	rev := revAt(sp0)
	taken := map[uint16]bool{sp0: true}
	for p := uint16(lo); p < lo+held; p++ {
		if p != sp0 {
			ctCopyEntry(t, m, rev, p)
			taken[p] = true
		}
	}
	for i := range 24 {
		syn := nsClient(uint16(43000+i), np)
		syn.Src = addr(twinAddr(v6, fmt.Sprintf("172.16.2.%d", 10+i)))
		syn.TCPFlags = packet.SYN
		if xdp {
			if v, _ := runXDP(t, d.XDP(), ifindex, syn.Bytes()); v != xdpTx {
				t.Fatalf("flow %d: XDP verdict %d: no free port found with %d of %d taken", i, v, len(taken), hi-lo+1)
			}
		} else if v, _ := runOn(t, d.TCIngress(), ifindex, syn.Bytes()); v != tcActRedirect {
			t.Fatalf("flow %d: verdict %d: no free port found with %d of %d taken", i, v, len(taken), hi-lo+1)
		}
		sp := snatPortIn(t, d, syn.Src.String(), syn.SrcPort, np)
		if sp < lo || sp > hi || taken[sp] {
			t.Fatalf("flow %d: SNAT port %d (outside %d-%d, or taken)", i, sp, lo, hi)
		}
		taken[sp] = true
	}
}

// TestSNATPortSearchOneFree: in a small range larger than a search
// tries (SNAT_TRIES: 32) with every port held but one, a new flow finds
// that one as often as the search can: each try frees one port (in turn,
// every port of the range), sends a new flow, and counts whether it got
// that port. The search cuts the range into 32 stretches and tries one
// port of each. Of 33 ports, one stretch has two and the others one: only
// those two can be missed, so in 2 rounds (66 tries) at most 4 are missed
// (false-failure chance 0); tries drawn with replacement miss each with
// (32/33)^32 = 37%, 4 misses or fewer about once in 250 million runs. Of
// 64 every stretch has two: each try finds the free port with exactly
// 1/2; of 2,048 tries at least 912 must find it (fewer: a chance of
// 3.2e-7), where tries with replacement find it with 1-(63/64)^32 = 40%,
// and 912 or more about 3e-6 of the time. Per family, through tc and XDP
// (each has its own inlined copy of the search); XDP's verdict alone
// counts (a miss is left to tc, not sent on to it here).
func TestSNATPortSearchOneFree(t *testing.T) {
	forFamilies(t, func(t *testing.T, v6 bool) {
		for _, c := range []struct {
			n, tries, minFound int
		}{{33, 66, 62}, {64, 2048, 912}} {
			for _, xdp := range []bool{false, true} {
				name := fmt.Sprintf("%s/%d", map[bool]string{false: "tc", true: "xdp"}[xdp], c.n)
				t.Run(name, func(t *testing.T) { snatOneFree(t, v6, xdp, c.n, c.tries, c.minFound) })
			}
		}
	})
}

func snatOneFree(t *testing.T, v6, xdp bool, n, tries, minFound int) {
	const lo = 62000
	hi := uint16(lo + n - 1)
	d, ifindex, np, revAt, sp0 := snatRangeNode(t, v6, xdp, lo, hi)
	m := d.Maps()
	tmpl := revAt(sp0)
	for p := uint16(lo); p <= hi; p++ {
		if p != tmpl.dst.Port() {
			ctCopyEntry(t, m, tmpl, p)
		}
	}
	found := 0
	for j := range tries {
		free := uint16(lo + j%n)
		if free == tmpl.dst.Port() { // the template moves to another held port
			other := lo + uint16((j+1)%n)
			tmpl = revAt(other)
		}
		ctRemove(t, m, revAt(free))
		syn := nsClient(uint16(20000+j), np)
		syn.TCPFlags = packet.SYN
		var v uint32
		if xdp {
			v, _ = runXDP(t, d.XDP(), ifindex, syn.Bytes())
		} else {
			v, _ = runOn(t, d.TCIngress(), ifindex, syn.Bytes())
		}
		switch {
		case v == tcActRedirect && !xdp, v == xdpTx && xdp:
			if sp := snatPortIn(t, d, syn.Src.String(), syn.SrcPort, np); sp != free {
				t.Fatalf("try %d: SNAT port %d, want the free one, %d", j, sp, free)
			}
			found++
			// Held again as the others are: the new flow is forgotten,
			// and its reservation taken off the half-open count, as its
			// deleter would (ctRemove takes nothing off).
			ctRemove(t, m, ctKeyOf(syn.Src.String(), syn.SrcPort, np.Addr.String(), np.Port, model.TCP, ctForward))
			ctRemove(t, m, revAt(free))
			editAdmit(t, m, v6, func(g *sockCtAdmit) { g.Pending-- })
			ctCopyEntry(t, m, tmpl, free)
		case v == tcActShot && !xdp, v == xdpPass && xdp:
			ctCopyEntry(t, m, tmpl, free)
		default:
			t.Fatalf("try %d: verdict %d (xdp %v)", j, v, xdp)
		}
	}
	t.Logf("%d ports, all held but one: %d of %d tries found it", n, found, tries)
	if found < minFound {
		t.Errorf("%d ports, all held but one: %d of %d tries found it, want %d or more", n, found, tries, minFound)
	}
}

// ctCopyEntry writes the established entry under k again under k with
// its destination port set to port: another reservation of the same
// flow's kind, held as long as it.
func ctCopyEntry(t *testing.T, m *Maps, k ctK, port uint16) {
	t.Helper()
	cm := ctTablesOf(t, m, k)[0]
	to := k
	to.dst = netip.AddrPortFrom(k.dst.Addr(), port)
	var err error
	if k.v6() {
		key, v := k.k6(), tcCt6Entry{}
		if err = cm.Lookup(&key, &v); err == nil {
			nk := to.k6()
			err = cm.Update(&nk, &v, ebpf.UpdateNoExist)
		}
	} else {
		key, v := k.k4(), sockCt4Entry{}
		if err = cm.Lookup(&key, &v); err == nil {
			nk := to.k4()
			err = cm.Update(&nk, &v, ebpf.UpdateNoExist)
		}
	}
	if err != nil {
		t.Fatalf("copy %s to port %d: %v", k, port, err)
	}
}

// TestReserveSNATPortsFollowsRange: the agent's reservation from the
// node's ephemeral ports is the configured range, not the default one,
// in a namespace of the test's own.
func TestReserveSNATPortsFollowsRange(t *testing.T) {
	testutil.Privileged(t)
	topology.NewNS(t, "snatres").Enter(t)
	lo, hi, err := ParseSNATPortRange("40000-40003")
	if err != nil {
		t.Fatal(err)
	}
	d := openTestWith(t, smallConfig, func(c *Config) { c.SNATPortMin, c.SNATPortMax = lo, hi })
	res, err := d.ReserveSNATPorts()
	if err != nil || !res.Added {
		t.Fatalf("ReserveSNATPorts = %+v, %v; want the range added", res, err)
	}
	b, err := os.ReadFile(sysctlReservedPorts)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(b)); got != "40000-40003" {
		t.Errorf("ip_local_reserved_ports = %q, want 40000-40003", got)
	}
}

// TestReserveSNATPortsLeavesEphemeralPorts: a SNAT range that would
// leave the node fewer than minEphemeralLeft ephemeral ports is not
// reserved (every connect() without a bound port would fail): an error,
// its ports in the ephemeral range named as exposed, the sysctl
// untouched. One that leaves enough is reserved; so is one that takes
// none of them, however few the node has.
func TestReserveSNATPortsLeavesEphemeralPorts(t *testing.T) {
	testutil.Privileged(t)
	topology.NewNS(t, "snateph").Enter(t)
	set := func(path, v string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(v), 0); err != nil {
			t.Fatal(err)
		}
	}
	get := func() string {
		t.Helper()
		b, err := os.ReadFile(sysctlReservedPorts)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	set(sysctlPortRange, "32768 60999")
	for _, c := range []struct {
		lo, hi  uint16
		exposed string // "": reserved
	}{
		{1024, 65535, "32768-60999"},
		{32768, 60000, "32768-60000"}, // 999 left
		{30000, 59976, "32768-59976"}, // 1,023 left
	} {
		res, err := ReserveSNATPortRange(c.lo, c.hi)
		if !errors.Is(err, ErrReservationRefused) || res.Exposed != c.exposed || res.Added || res.Ephemeral != "32768-60999" {
			t.Errorf("reserve %d-%d: %+v, %v; want it refused, %s exposed", c.lo, c.hi, res, err, c.exposed)
		}
		if got := get(); got != "" {
			t.Fatalf("reserve %d-%d: ip_local_reserved_ports = %q, want it untouched", c.lo, c.hi, got)
		}
	}
	if res, err := ReserveSNATPortRange(30000, 59975); err != nil || !res.Added { // 1,024 left
		t.Errorf("reserve 30000-59975: %+v, %v; want it reserved", res, err)
	}
	// Another tool's reservation leaves 100 ports: a range outside the
	// ephemeral ones takes none of them, and is reserved.
	set(sysctlReservedPorts, "32768-60899")
	if got := get(); got != "32768-60899" {
		t.Fatalf("ip_local_reserved_ports = %q after writing 32768-60899", got)
	}
	if res, err := ReserveSNATPortRange(61000, 65535); err != nil || !res.Added {
		t.Errorf("reserve 61000-65535 beside 100 ephemeral ports left: %+v, %v; want it reserved", res, err)
	}
	if got := get(); got != "32768-60899,61000-65535" {
		t.Errorf("ip_local_reserved_ports = %q", got)
	}
}
