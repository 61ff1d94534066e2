package datapath

import (
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

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

func progID(t *testing.T, p *ebpf.Program) ebpf.ProgramID {
	t.Helper()
	info, err := p.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, ok := info.ID()
	if !ok {
		t.Fatal("program has no id")
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
	testutil.Privileged(t)
	bpffs := testPinDir(t)
	ns := topology.NewNS(t, "attach")
	cg := newTestCgroup(t).Path
	ns.Enter(t)

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
	if len(pins) != 4+4 {
		t.Errorf("%d pinned links, want 8 (4 tcx, 4 cgroup): %v", len(pins), pins)
	}

	if err := Cleanup(bpffs); err != nil {
		t.Fatalf("Cleanup: %v", err)
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
