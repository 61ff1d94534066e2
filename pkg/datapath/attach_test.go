package datapath

import (
	"bufio"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
)

// attachedIDs returns the ids of the programs attached at target (an
// ifindex or a cgroup fd) for attach.
func attachedIDs(t *testing.T, target int, attach ebpf.AttachType) []ebpf.ProgramID {
	t.Helper()
	res, err := link.QueryPrograms(link.QueryOptions{Target: target, Attach: attach})
	if err != nil {
		t.Fatalf("query %s programs of %d: %v", attach, target, err)
	}
	var ids []ebpf.ProgramID
	for _, p := range res.Programs {
		ids = append(ids, p.ID)
	}
	return ids
}

// attachNode is the attach tests' set-up: a pin directory and a cgroup of
// the test's own, and a network namespace of its own (named name), which
// the calling goroutine enters.
func attachNode(t *testing.T, name string) (bpffs, cgroup string) {
	t.Helper()
	testutil.Privileged(t)
	bpffs = testPinDir(t)
	ns := topology.NewNS(t, name)
	cgroup = newTestCgroup(t).Path
	ns.Enter(t)
	return bpffs, cgroup
}

func progID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := p.Info()
	return kernelID[ebpf.ProgramID](t, "program", info, err)
}

// kernelID is the id the kernel gave a program or map, from its info (and
// the error of getting it).
func kernelID[ID any](t *testing.T, what string, info interface{ ID() (ID, bool) }, err error) ID {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	id, ok := info.ID()
	if !ok {
		t.Fatalf("%s has no id", what)
	}
	return id
}

func bpfFilters(t *testing.T, l netlink.Link) []string {
	t.Helper()
	var names []string
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := netlink.FilterList(l, parent)
		if err != nil {
			continue
		}
		for _, f := range fs {
			if bf, ok := f.(*netlink.BpfFilter); ok {
				names = append(names, bf.Name)
			}
		}
	}
	return names
}

// TestAttachDetach: attaching is idempotent, a new agent (re-Open) swaps
// its programs in behind the same links, and Cleanup leaves nothing: no
// pins, no links, no filters.
func TestAttachDetach(t *testing.T) {
	bpffs, cg := attachNode(t, "attach")

	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "sl-a"}, PeerName: "sl-b"}
	if err := netlink.LinkAdd(veth); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	veth2 := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "sl-c"}, PeerName: "sl-d"}
	if err := netlink.LinkAdd(veth2); err != nil {
		t.Fatalf("add veth: %v", err)
	}
	var devs []netlink.Link
	for _, name := range []string{"sl-a", "sl-b", "sl-c"} {
		l, err := netlink.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
		devs = append(devs, l)
	}
	cgf, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer cgf.Close()

	// expectAttached checks that exactly d's programs are attached, once.
	expectAttached := func(d *Datapath) {
		t.Helper()
		for _, l := range devs[:2] {
			idx := l.Attrs().Index
			if got := attachedIDs(t, idx, ebpf.AttachTCXIngress); !slices.Equal(got, []ebpf.ProgramID{progID(t, d.TCIngress())}) {
				t.Errorf("%s tcx ingress programs %v, want only %d", l.Attrs().Name, got, progID(t, d.TCIngress()))
			}
			if got := attachedIDs(t, idx, ebpf.AttachTCXEgress); !slices.Equal(got, []ebpf.ProgramID{progID(t, d.TCEgress())}) {
				t.Errorf("%s tcx egress programs %v, want only %d", l.Attrs().Name, got, progID(t, d.TCEgress()))
			}
		}
		for _, cp := range cgroupProgs {
			want := []ebpf.ProgramID{progID(t, cp.prog(d))}
			if got := attachedIDs(t, int(cgf.Fd()), cp.attach); !slices.Equal(got, want) {
				t.Errorf("cgroup %s programs %v, want only %v", cp.name, got, want)
			}
		}
	}
	attach := func(d *Datapath) {
		t.Helper()
		if err := d.AttachDevices([]string{"sl-a", "sl-b"}); err != nil {
			t.Fatalf("AttachDevices: %v", err)
		}
		if err := d.AttachCgroup(cg); err != nil {
			t.Fatalf("AttachCgroup: %v", err)
		}
	}

	d1, err := Open(smallConfig(bpffs))
	if err != nil {
		t.Fatal(err)
	}
	attach(d1)
	attach(d1) // idempotent
	expectAttached(d1)
	// The clsact fallback (for kernels without tcx), tried directly on
	// sl-c since this kernel has tcx.
	if err := attachClsact(devs[2].Attrs().Index, netlink.HANDLE_MIN_INGRESS, filterPrefix+"ingress", d1.TCIngress(), nil); err != nil {
		t.Fatalf("clsact fallback: %v", err)
	}
	if err := attachClsact(devs[2].Attrs().Index, netlink.HANDLE_MIN_INGRESS, filterPrefix+"ingress", d1.TCIngress(), nil); err != nil {
		t.Fatalf("clsact fallback again: %v", err)
	}
	if got := bpfFilters(t, devs[2]); !slices.Equal(got, []string{filterPrefix + "ingress"}) {
		t.Errorf("clsact filters on sl-c: %v, want one %singress", got, filterPrefix)
	}
	if err := d1.Close(); err != nil {
		t.Fatal(err)
	}
	// The agent is gone; its programs stay attached through the pins.
	for _, l := range devs[:2] {
		if got := attachedIDs(t, l.Attrs().Index, ebpf.AttachTCXIngress); len(got) != 1 {
			t.Errorf("after Close, %s has %d ingress programs, want 1", l.Attrs().Name, len(got))
		}
	}

	// A new agent: same maps, new programs behind the same links.
	d2, err := Open(smallConfig(bpffs))
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	attach(d2)
	expectAttached(d2)
	// A device deleted and created again under the same name has a new
	// ifindex: its stale pinned links are replaced.
	if err := netlink.LinkDel(devs[0]); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "sl-a"}, PeerName: "sl-b"}); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"sl-a", "sl-b"} {
		if devs[i], err = netlink.LinkByName(name); err != nil {
			t.Fatal(err)
		}
	}
	attach(d2)
	expectAttached(d2)

	// Moving the socket programs to another cgroup attaches them there
	// before detaching them from the old one, behind the same pins.
	cg2 := newTestCgroup(t).Path
	if err := d2.AttachCgroup(cg2); err != nil {
		t.Fatalf("AttachCgroup to a second cgroup: %v", err)
	}
	cg2f, err := os.Open(cg2)
	if err != nil {
		t.Fatal(err)
	}
	defer cg2f.Close()
	for _, cp := range cgroupProgs {
		if got := attachedIDs(t, int(cgf.Fd()), cp.attach); len(got) != 0 {
			t.Errorf("old cgroup still has %s programs %v", cp.name, got)
		}
		if got, want := attachedIDs(t, int(cg2f.Fd()), cp.attach), []ebpf.ProgramID{progID(t, cp.prog(d2))}; !slices.Equal(got, want) {
			t.Errorf("new cgroup %s programs %v, want %v", cp.name, got, want)
		}
	}
	if err := d2.AttachCgroup(cg); err != nil {
		t.Fatal(err)
	}
	expectAttached(d2)

	pins, _ := os.ReadDir(filepath.Join(bpffs, "sluice", "links"))
	if len(pins) != 4+len(cgroupProgs) {
		t.Errorf("%d pinned links, want 4 tcx and %d cgroup: %v", len(pins), len(cgroupProgs), pins)
	}

	for _, l := range devs[:2] {
		var nd sockNodeDev
		if err := d2.maps.devices.Lookup(uint32(l.Attrs().Index), &nd); err != nil || nd.Flags&nodeDevTC == 0 {
			t.Fatalf("before Cleanup %s's node device entry %+v (%v), want the tc flag", l.Attrs().Name, nd, err)
		}
	}
	if err := Cleanup(bpffs); err != nil {
		t.Fatalf("Cleanup: %v", err)
	}
	// Cleanup clears the tc flag (before it detaches the links) as the
	// normal detach path does; d2 still holds the unpinned map.
	for _, l := range devs[:2] {
		var nd sockNodeDev
		if err := d2.maps.devices.Lookup(uint32(l.Attrs().Index), &nd); err == nil && nd.Flags&nodeDevTC != 0 {
			t.Errorf("after Cleanup %s's node device entry %+v still has the tc flag", l.Attrs().Name, nd)
		}
	}
	if err := Cleanup(bpffs); err != nil {
		t.Fatalf("Cleanup again: %v", err)
	}
	if _, err := os.Stat(filepath.Join(bpffs, "sluice")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin directory still there after Cleanup: %v", err)
	}
	for _, l := range devs {
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			if got := attachedIDs(t, l.Attrs().Index, at); len(got) != 0 {
				t.Errorf("after Cleanup %s %s has programs %v", l.Attrs().Name, at, got)
			}
		}
		if got := bpfFilters(t, l); len(got) != 0 {
			t.Errorf("after Cleanup %s has filters %v", l.Attrs().Name, got)
		}
	}
	for _, cp := range cgroupProgs {
		if got := attachedIDs(t, int(cgf.Fd()), cp.attach); len(got) != 0 {
			t.Errorf("after Cleanup cgroup %s has programs %v", cp.name, got)
		}
	}
}

func TestCgroupV2Mount(t *testing.T) {
	const mountinfo = `22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw
25 22 0:23 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified\040v2 rw,nosuid shared:10 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:25 / /sys/fs/cgroup/systemd rw,nosuid shared:11 - cgroup cgroup rw,name=systemd
`
	got, err := parseCgroup2Mount(bufio.NewScanner(strings.NewReader(mountinfo)))
	if err != nil || got != "/sys/fs/cgroup/unified v2" {
		t.Errorf("parse = %q, %v", got, err)
	}
	if _, err := parseCgroup2Mount(bufio.NewScanner(strings.NewReader(mountinfo[:80]))); err == nil {
		t.Error("no cgroup2 line: want an error")
	}
	// On this machine, whatever it is, the mount must have cgroup.procs.
	if os.Geteuid() == 0 {
		root, err := CgroupV2Mount()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
			t.Errorf("CgroupV2Mount() = %s: %v", root, err)
		}
	}
}

// addVeths adds veth pairs named a<->b for each pair in the calling
// thread's namespace, sets them up and returns the links by name.
func addVeths(t *testing.T, pairs ...[2]string) map[string]netlink.Link {
	t.Helper()
	out := map[string]netlink.Link{}
	for _, p := range pairs {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: p[0]}, PeerName: p[1]}); err != nil {
			t.Fatalf("add veth %s: %v", p[0], err)
		}
		for _, name := range p {
			l, err := netlink.LinkByName(name)
			if err != nil {
				t.Fatal(err)
			}
			if err := netlink.LinkSetUp(l); err != nil {
				t.Fatal(err)
			}
			out[name] = l
		}
	}
	return out
}

// xdpProgID returns the id of the XDP program attached to l, or 0.
func xdpProgID(t *testing.T, l netlink.Link) uint32 {
	t.Helper()
	l, err := netlink.LinkByIndex(l.Attrs().Index)
	if err != nil {
		t.Fatal(err)
	}
	if x := l.Attrs().Xdp; x != nil && x.Attached {
		return x.ProgId
	}
	return 0
}

// TestPruneFollowsConfiguration (C3): what an earlier agent attached and
// the configuration no longer names is detached when the agent starts:
// a device dropped from --devices loses its tcx links (and their pins),
// its clsact filters and its sluice_devices entry; --socket-lb=false
// detaches the cgroup programs; --xdp=off detaches XDP. What the
// configuration names is left for the Attach methods to replace in place.
// Before, attachments only ever accumulated.
func TestPruneFollowsConfiguration(t *testing.T) {
	bpffs, cg := attachNode(t, "prune")
	links := addVeths(t, [2]string{"sl-a", "sl-b"}, [2]string{"sl-c", "sl-d"})
	// (A device without an address is no SNAT source: sluice_devices
	// would not record it.)
	for _, na := range [][2]string{{"sl-a", "192.168.7.1/24"}, {"sl-c", "192.168.8.1/24"}, {"sl-a", "2001:db8:7::1/64"}, {"sl-c", "2001:db8:8::1/64"}} {
		ap, err := netlink.ParseAddr(na[1])
		if err != nil {
			t.Fatal(err)
		}
		ap.Flags = unix.IFA_F_NODAD
		if err := netlink.AddrAdd(links[na[0]], ap); err != nil {
			t.Fatal(err)
		}
	}
	cgf, err := os.Open(cg)
	if err != nil {
		t.Fatal(err)
	}
	defer cgf.Close()

	d1, err := Open(xdpConfig(bpffs))
	if err != nil {
		t.Fatal(err)
	}
	if err := d1.AttachCgroup(cg); err != nil {
		t.Fatal(err)
	}
	if err := d1.AttachDevices([]string{"sl-a", "sl-c"}); err != nil {
		t.Fatal(err)
	}
	// A clsact filter as an agent on a kernel without tcx left it, and
	// one of another tool, on the device to be dropped.
	if err := attachClsact(links["sl-c"].Attrs().Index, netlink.HANDLE_MIN_INGRESS, filterPrefix+"ingress", d1.TCIngress(), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := addClsactFilter(links["sl-c"].Attrs().Index, netlink.HANDLE_MIN_EGRESS, 1, 1, "other_tool", d1.TCEgress()); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"sl-a", "sl-c"} {
		if xdpProgID(t, links[name]) == 0 {
			t.Fatalf("no XDP program on %s after attaching with XDP generic", name)
		}
	}
	if n, err := countEntries(d1.Maps().devices); err != nil || n != 2 {
		t.Fatalf("sluice_devices holds %d devices after attaching two (%v)", n, err)
	}
	var a6 sockV6addr
	if err := d1.Maps().devices6.Lookup(uint32(links["sl-c"].Attrs().Index), &a6); err != nil || addrFrom16(a6) != netip.MustParseAddr("2001:db8:8::1") {
		t.Fatalf("sluice6_devices of sl-c: %s, %v; want its IPv6 address", addrFrom16(a6), err)
	}
	d1.Close()
	// The IPv6 programs stay in their pinned program arrays once the
	// agent's objects are closed, for the attached entries to go on
	// tail-calling them (an unpinned array is emptied then).
	for _, name := range []string{mapTC6, mapXDP6} {
		if ids := testutil.ProgArrayIDs(t, filepath.Join(bpffs, "sluice", name)); len(ids) == 0 || slices.Contains(ids, 0) {
			t.Errorf("%s after the agent's objects closed: programs %v, want every slot filled", name, ids)
		}
	}

	cfg := smallConfig(bpffs)
	cfg.DisableSocketLB = true // and XDP off
	d2 := openTest(t, cfg)
	if err := d2.Prune("", []string{"sl-a"}); err != nil {
		t.Fatalf("Prune: %v", err)
	}
	if err := d2.AttachDevices([]string{"sl-a"}); err != nil {
		t.Fatal(err)
	}

	a, c := links["sl-a"].Attrs().Index, links["sl-c"].Attrs().Index
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		if got := attachedIDs(t, c, at); len(got) != 0 {
			t.Errorf("dropped device sl-c still has %s programs %v", at, got)
		}
		if got := attachedIDs(t, a, at); len(got) != 1 {
			t.Errorf("sl-a has %s programs %v, want this agent's one", at, got)
		}
	}
	for _, name := range []string{"sl-a", "sl-c"} {
		if id := xdpProgID(t, links[name]); id != 0 {
			t.Errorf("%s still runs XDP program %d with XDP off", name, id)
		}
	}
	for _, cp := range cgroupProgs {
		if got := attachedIDs(t, int(cgf.Fd()), cp.attach); len(got) != 0 {
			t.Errorf("cgroup still has %s programs %v with socket LB off", cp.name, got)
		}
	}
	pins, _ := os.ReadDir(filepath.Join(bpffs, "sluice", "links"))
	var names []string
	for _, p := range pins {
		names = append(names, p.Name())
	}
	if want := []string{"tcx_egress_sl-a", "tcx_ingress_sl-a"}; !slices.Equal(names, want) {
		t.Errorf("pinned links %v, want %v", names, want)
	}
	if _, err := os.Stat(filepath.Join(bpffs, "sluice", mapXDP6)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still pinned with XDP off (%v): it keeps the IPv6 XDP program loaded", mapXDP6, err)
	}
	if got := bpfFilters(t, links["sl-c"]); !slices.Equal(got, []string{"other_tool"}) {
		t.Errorf("filters on sl-c: %v, want only the other tool's", got)
	}
	var idx uint32
	var nd sockNodeDev
	var devs []uint32
	for it := d2.Maps().devices.Iterate(); it.Next(&idx, &nd); {
		devs = append(devs, idx)
	}
	if !slices.Equal(devs, []uint32{uint32(a)}) {
		t.Errorf("sluice_devices holds %v, want only sl-a's %d", devs, a)
	}
	devs = nil
	var a6s []netip.Addr
	for it := d2.Maps().devices6.Iterate(); it.Next(&idx, &a6); {
		devs, a6s = append(devs, idx), append(a6s, addrFrom16(a6))
	}
	if !slices.Equal(devs, []uint32{uint32(a)}) || !slices.Equal(a6s, []netip.Addr{netip.MustParseAddr("2001:db8:7::1")}) {
		t.Errorf("sluice6_devices holds %v %v, want only sl-a's %d 2001:db8:7::1", devs, a6s, a)
	}
}

// TestClsactLeavesOtherToolsFilters (C3): the clsact fallback puts its
// filter at a priority and handle of its own, refuses to replace a filter
// of another tool found there, leaves other tools' filters elsewhere alone
// (release 0 replaced whatever was at priority 1, handle 1), and removes
// only Sluice's own older filters.
func TestClsactLeavesOtherToolsFilters(t *testing.T) {
	d := newTestDatapath(t)
	ns := topology.NewNS(t, "clsact")
	ns.Enter(t)
	links := addVeths(t, [2]string{"sl-e", "sl-f"})
	e := links["sl-e"].Attrs().Index

	// Another tool at priority 1 handle 1 and Sluice's release 0 filter
	// on ingress; another tool in Sluice's own place on egress.
	if _, err := addClsactFilter(e, netlink.HANDLE_MIN_INGRESS, 1, 1, "other_tool", d.TCEgress()); err != nil {
		t.Fatal(err)
	}
	if _, err := addClsactFilter(e, netlink.HANDLE_MIN_INGRESS, 1, 2, filterPrefix+"ingress", d.TCIngress()); err != nil {
		t.Fatal(err)
	}
	if _, err := addClsactFilter(e, netlink.HANDLE_MIN_EGRESS, clsactPriority, clsactHandle, "cilium_other", d.TCIngress()); err != nil {
		t.Fatal(err)
	}

	if err := attachClsact(e, netlink.HANDLE_MIN_INGRESS, filterPrefix+"ingress", d.TCIngress(), nil); err != nil {
		t.Fatalf("attach ingress: %v", err)
	}
	err := attachClsact(e, netlink.HANDLE_MIN_EGRESS, filterPrefix+"egress", d.TCEgress(), nil)
	if err == nil || !strings.Contains(err.Error(), "cilium_other") || !strings.Contains(err.Error(), "not replacing") {
		t.Errorf("attach egress over another tool's filter: %v, want a refusal naming it", err)
	}
	type place struct {
		name       string
		prio       uint16
		handle     uint32
		parentEgrs bool
	}
	var got []place
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := netlink.FilterList(links["sl-e"], parent)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fs {
			if bf, ok := f.(*netlink.BpfFilter); ok {
				got = append(got, place{bf.Name, bf.Priority, bf.Handle, parent == netlink.HANDLE_MIN_EGRESS})
			}
		}
	}
	want := []place{
		{"other_tool", 1, 1, false},
		{filterPrefix + "ingress", clsactPriority, clsactHandle, false},
		{"cilium_other", clsactPriority, clsactHandle, true},
	}
	slices.SortFunc(got, func(a, b place) int { return strings.Compare(a.name, b.name) })
	slices.SortFunc(want, func(a, b place) int { return strings.Compare(a.name, b.name) })
	if !slices.Equal(got, want) {
		t.Errorf("filters %+v, want %+v", got, want)
	}
}

// TestPinsArePrivate: everything under the pin directory, maps and links
// (and the directories), is root's alone: 0600 files, 0700 directories,
// even if the directory was there before with a laxer mode.
func TestPinsArePrivate(t *testing.T) {
	testutil.Privileged(t)
	bpffs := testPinDir(t)
	if err := os.MkdirAll(filepath.Join(bpffs, "sluice"), 0o755); err != nil {
		t.Fatal(err)
	}
	ns := topology.NewNS(t, "pins")
	cg := newTestCgroup(t).Path
	ns.Enter(t)
	addVeths(t, [2]string{"sl-p", "sl-q"})
	d := openTest(t, xdpConfig(bpffs))
	if err := d.AttachCgroup(cg); err != nil {
		t.Fatal(err)
	}
	if err := d.AttachDevices([]string{"sl-p"}); err != nil {
		t.Fatal(err)
	}
	n := 0
	err := filepath.WalkDir(filepath.Join(bpffs, "sluice"), func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		want := os.FileMode(0o600)
		if e.IsDir() {
			want = 0o700 | os.ModeDir
		}
		if info.Mode() != want {
			t.Errorf("%s: mode %v, want %v", p, info.Mode(), want)
		}
		n++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// 2 directories, the maps, 4 cgroup links, 2 tcx links, 1 XDP link.
	if n < 2+len(smallConfig("").withDefaults().maxEntries())+4+2+1 {
		t.Errorf("walked only %d pins and directories", n)
	}
}
