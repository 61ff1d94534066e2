package datapath

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
)

func TestParseDevices(t *testing.T) {
	s, err := ParseDevices([]string{"eth0", "veth+", "cali+", "eth0", "veth+"})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Exact(); !slices.Equal(got, []string{"eth0"}) {
		t.Errorf("exact %q, want [eth0]", got)
	}
	if !s.HasPatterns() || s.Empty() {
		t.Errorf("HasPatterns %v Empty %v, want true false", s.HasPatterns(), s.Empty())
	}
	for name, want := range map[string]bool{"eth0": false, "veth": true, "veth12ab": true, "cali0": true, "eth1": false, "lxc1": false} {
		if got := s.followed(name); got != want {
			t.Errorf("followed(%q) = %v, want %v (exact names are attached at start, not followed)", name, got, want)
		}
	}
	if s, _ := ParseDevices(nil); !s.Empty() || s.HasPatterns() {
		t.Error("no --devices: want an empty selector")
	}
	for _, bad := range []string{"+", "eth+0+", "a/b", "with space", "abcdefghijklmnop", "+eth"} {
		_, err := ParseDevices([]string{"eth0", bad})
		if err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("ParseDevices(%q): %v, want an error naming it", bad, err)
		}
	}
}

// TestDeviceWatchFollowsPatterns runs the watch of --devices eth0,slv+ in
// a node namespace of the test's own: a matching link there at start is
// kept as attached; one that appears after gets the tc programs, its
// device entry and pins; a link that matches nothing is left alone; a
// rename into the pattern attaches, one out of it detaches; a link
// deleted has its entry and pins removed.
func TestDeviceWatchFollowsPatterns(t *testing.T) {
	bpffs, _ := attachNode(t, "devwatch")
	d := openTest(t, smallConfig(bpffs))
	addVeth(t, "eth0", "wire0")
	slv0 := addVeth(t, "slv0", "peer0")

	sel, err := ParseDevices([]string{"eth0", "slv+"})
	if err != nil {
		t.Fatal(err)
	}
	devs, err := sel.Expand()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(devs, []string{"eth0", "slv0"}) {
		t.Fatalf("Expand: %q, want [eth0 slv0]", devs)
	}
	if err := d.AttachDevices(devs); err != nil {
		t.Fatal(err)
	}
	if err := d.Commit(); err != nil {
		t.Fatal(err)
	}

	w, err := d.NewDeviceWatch(sel)
	if err != nil {
		t.Fatal(err)
	}
	nextEvent, stop := runDeviceWatch(t, w)
	next := func(what string) DeviceEvent {
		t.Helper()
		e := nextEvent(what)
		if e.Err != nil {
			t.Fatalf("waiting for %s: %s %s: %v", what, e.Device, e.Reason, e.Err)
		}
		return e
	}
	expect := func(dev string, attached bool, reason string) {
		t.Helper()
		e := next(dev + " " + reason)
		if e.Device != dev || e.Attached != attached || e.Reason != reason {
			t.Fatalf("event %+v, want %s attached=%v %s", e, dev, attached, reason)
		}
	}
	attachedHere := func(l netlink.Link) bool { t.Helper(); return tcAttached(t, d, l) }
	entry := func(l netlink.Link) (sockNodeDev, bool) { return deviceEntry(d, l) }
	wantPins := func(devs ...string) {
		t.Helper()
		var want []string
		for _, dev := range devs {
			want = append(want, "tcx_egress_"+dev, "tcx_ingress_"+dev)
		}
		wantLinkPins(t, d, want...)
	}

	// The start's device, found by the first listing, is not attached again.
	expect("slv0", true, "attached already")
	if !attachedHere(slv0) {
		t.Fatal("slv0: programs not attached")
	}

	// A pod's device after the start, then one no pattern matches and a
	// sentinel after it: by the sentinel's event the other was seen.
	slv1 := addVeth(t, "slv1", "peer1")
	expect("slv1", true, "appeared")
	if !attachedHere(slv1) {
		t.Fatal("slv1: programs not attached")
	}
	if nd, ok := entry(slv1); !ok || nd.Flags&nodeDevTC == 0 {
		t.Fatalf("slv1: device entry %+v (present %v), want one flagged tc", nd, ok)
	}
	other := addVeth(t, "other1", "peer2")
	addVeth(t, "slv9", "peer9")
	expect("slv9", true, "appeared")
	if attachedHere(other) {
		t.Fatal("other1 matches no pattern but has the programs")
	}
	if _, ok := entry(other); ok {
		t.Fatal("other1 matches no pattern but has a device entry")
	}
	wantPins("eth0", "slv0", "slv1", "slv9")

	// Renamed into the pattern, then out of it.
	if err := netlink.LinkSetName(other, "slv5"); err != nil {
		t.Fatal(err)
	}
	expect("slv5", true, "appeared")
	if !attachedHere(other) {
		t.Fatal("slv5: programs not attached after the rename")
	}
	if err := netlink.LinkSetName(other, "zz5"); err != nil {
		t.Fatal(err)
	}
	expect("slv5", false, "renamed away")
	if attachedHere(other) {
		t.Fatal("zz5: programs still attached after it was renamed out of the pattern")
	}
	if _, ok := entry(other); ok {
		t.Fatal("zz5: device entry left after it was renamed out of the pattern")
	}

	// A pod's device deleted: its entry and pins go.
	if err := netlink.LinkDel(slv1); err != nil {
		t.Fatal(err)
	}
	expect("slv1", false, "removed")
	if _, ok := entry(slv1); ok {
		t.Fatal("slv1: device entry left after the device was deleted")
	}
	wantPins("eth0", "slv0", "slv9")

	// The watch ends with ctx, and leaves the rest attached.
	stop()
	if !attachedHere(slv0) {
		t.Fatal("slv0: programs gone when the watch stopped")
	}
}

// TestDeviceWatchResubscribes: when the subscription fails (an overrun),
// the failure is reported, the watch subscribes again and lists the links
// again: a device deleted meanwhile is forgotten, one created meanwhile
// attached, one renamed meanwhile re-attached under its new name.
func TestDeviceWatchResubscribes(t *testing.T) {
	bpffs, _ := attachNode(t, "devresub")
	d := openTest(t, smallConfig(bpffs))
	slv0 := addVeth(t, "slv0", "peer0")
	slv1 := addVeth(t, "slv1", "peer1")
	if err := d.Commit(); err != nil {
		t.Fatal(err)
	}
	w := watchDevices(t, d, "slv+")
	// The first subscription hears nothing and fails when told to;
	// the second is the real one.
	fail, subscriptions := failFirstSubscription(&w.subscribe,
		func(o netlink.LinkSubscribeOptions) func(error) { return o.ErrorCallback },
		errors.New("Receive failed: no buffer space available"))
	nextEvent, _ := runDeviceWatch(t, w)
	next := func() DeviceEvent { t.Helper(); return nextEvent("the next") }
	got := map[string]DeviceEvent{}
	for range 2 {
		e := next()
		got[e.Device] = e
	}
	for _, dev := range []string{"slv0", "slv1"} {
		if e := got[dev]; e.Err != nil || !e.Attached || e.Reason != "appeared" {
			t.Fatalf("%s at the first listing: %+v, want attached, appeared", dev, e)
		}
	}

	// Unheard: slv0 deleted, slv1 renamed within the pattern, slv2 added.
	if err := netlink.LinkDel(slv0); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetName(slv1, "slv7"); err != nil {
		t.Fatal(err)
	}
	slv2 := addVeth(t, "slv2", "peer2")
	fail()
	if e := next(); e.Err == nil || !strings.Contains(e.Err.Error(), "subscribing again") {
		t.Fatalf("after the failure: %+v, want its error reported", e)
	}
	want := []string{"slv0 false missed", "slv1 false missed", "slv2 true appeared", "slv7 true appeared"}
	var seen []string
	for range want {
		e := next()
		if e.Err != nil {
			t.Fatalf("%+v", e)
		}
		seen = append(seen, fmt.Sprintf("%s %v %s", e.Device, e.Attached, e.Reason))
	}
	slices.Sort(seen)
	if !slices.Equal(seen, want) {
		t.Fatalf("after subscribing again: %q, want %q", seen, want)
	}
	for _, l := range []netlink.Link{slv1, slv2} {
		var nd sockNodeDev
		if err := d.maps.devices.Lookup(uint32(l.Attrs().Index), &nd); err != nil || nd.Flags&nodeDevTC == 0 {
			t.Errorf("ifindex %d: device entry %+v (%v), want one flagged tc", l.Attrs().Index, nd, err)
		}
	}
	var nd sockNodeDev
	if err := d.maps.devices.Lookup(uint32(slv0.Attrs().Index), &nd); err == nil {
		t.Error("slv0: device entry left after it was deleted unheard")
	}
	es, err := os.ReadDir(filepath.Join(d.dir, "links"))
	if err != nil {
		t.Fatal(err)
	}
	var pins []string
	for _, e := range es {
		pins = append(pins, e.Name())
	}
	if wantPins := []string{"tcx_egress_slv2", "tcx_egress_slv7", "tcx_ingress_slv2", "tcx_ingress_slv7"}; !slices.Equal(pins, wantPins) {
		t.Errorf("pinned links %q, want %q", pins, wantPins)
	}
	if n := subscriptions(); n != 2 {
		t.Errorf("%d subscriptions, want 2", n)
	}
}

// TestDeviceWatchListInterrupted: a link list interrupted by a change
// (netlink.ErrDumpInterrupted, with a partial list: vishvananda/netlink
// returns it whenever a link changes during the dump) is made again, by
// Expand (--devices with a pattern at start) and by the watch's relist;
// only lists interrupted listLinkTries times in a row are an error.
func TestDeviceWatchListInterrupted(t *testing.T) {
	link := func(idx int, name string) netlink.Link {
		return &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: idx, Name: name}}
	}
	full := []netlink.Link{link(1, "lo"), link(2, "eth0"), link(3, "slv0"), link(4, "slv1")}
	interrupted := 0
	lister := func(fails int) func() ([]netlink.Link, error) {
		calls := 0
		return func() ([]netlink.Link, error) {
			calls++
			if calls <= fails {
				interrupted++
				return full[:3], netlink.ErrDumpInterrupted // slv1 missed
			}
			return full, nil
		}
	}
	real := linkList
	t.Cleanup(func() { linkList = real })
	sel, err := ParseDevices([]string{"eth0", "slv+"})
	if err != nil {
		t.Fatal(err)
	}
	linkList = lister(listLinkTries - 1)
	got, err := sel.Expand()
	if err != nil || !slices.Equal(got, []string{"eth0", "slv0", "slv1"}) {
		t.Fatalf("Expand, %d lists interrupted: %q, %v; want [eth0 slv0 slv1]", listLinkTries-1, got, err)
	}
	if interrupted != listLinkTries-1 {
		t.Fatalf("%d lists interrupted, want %d", interrupted, listLinkTries-1)
	}
	linkList = lister(listLinkTries)
	if got, err := sel.Expand(); !errors.Is(err, netlink.ErrDumpInterrupted) {
		t.Fatalf("Expand, every list interrupted: %q, %v; want the interruption", got, err)
	}

	// The watch's relist: a list interrupted once is made again, not
	// reported (a pattern matching none of the fake links: no Datapath
	// is needed; TestDeviceWatchFollowsPatterns shows the relist's work).
	none, err := ParseDevices([]string{"zz+"})
	if err != nil {
		t.Fatal(err)
	}
	w := &DeviceWatch{sel: none, have: map[int]string{}, pending: map[int]string{}, list: lister(1)}
	var events []DeviceEvent
	w.relist(func(e DeviceEvent) { events = append(events, e) })
	for _, e := range events {
		if e.Err != nil {
			t.Fatalf("relist with one interrupted list reported %v", e.Err)
		}
	}
}

// TestDeviceWatchMaxDevices: with --max-devices 2 and three links the
// pattern matches, two are attached, the third is reported once with an
// error naming sluice_devices and --max-devices and kept pending; when an
// attached one goes, the pending one is attached in its place.
func TestDeviceWatchMaxDevices(t *testing.T) {
	bpffs, _ := attachNode(t, "devmax")
	cfg := smallConfig(bpffs)
	cfg.MaxDevices = 2
	d := openTest(t, cfg)
	links := map[string]netlink.Link{}
	for i := range 3 {
		name := fmt.Sprintf("slv%d", i)
		links[name] = addVeth(t, name, fmt.Sprintf("peer%d", i))
	}
	if err := d.Commit(); err != nil {
		t.Fatal(err)
	}
	w := watchDevices(t, d, "slv+")
	nextEvent, _ := runDeviceWatch(t, w)
	next := func() DeviceEvent { t.Helper(); return nextEvent("the next") }
	var attached []string
	left := ""
	for range 3 {
		e := next()
		switch {
		case e.Err == nil && e.Attached:
			attached = append(attached, e.Device)
		case errors.Is(e.Err, ErrDevicesFull):
			left = e.Device
			for _, want := range []string{"sluice_devices", "--max-devices 2"} {
				if !strings.Contains(e.Err.Error(), want) {
					t.Errorf("error %q does not name %s", e.Err, want)
				}
			}
		default:
			t.Fatalf("event %+v", e)
		}
	}
	if len(attached) != 2 || left == "" {
		t.Fatalf("attached %q, left out %q: want two attached and one left out", attached, left)
	}
	if err := netlink.LinkDel(links[attached[0]]); err != nil {
		t.Fatal(err)
	}
	if e := next(); e.Device != attached[0] || e.Attached || e.Err != nil {
		t.Fatalf("after deleting %s: %+v, want it forgotten", attached[0], e)
	}
	if e := next(); e.Device != left || !e.Attached || e.Err != nil || e.Reason != "room made" {
		t.Fatalf("after deleting %s: %+v, want %s attached (room made)", attached[0], e, left)
	}
	var nd sockNodeDev
	if err := d.maps.devices.Lookup(uint32(links[left].Attrs().Index), &nd); err != nil || nd.Flags&nodeDevTC == 0 {
		t.Fatalf("%s's entry: %+v, %v; want one with tc on", left, nd, err)
	}
	for _, name := range []string{attached[1], left} {
		if err := netlink.LinkDel(links[name]); err != nil {
			t.Fatal(err)
		}
		if e := next(); e.Device != name || e.Attached {
			t.Fatalf("after deleting %s: %+v", name, e)
		}
	}
}

// TestParseDevicesFit: at start the pattern matches beyond --max-devices
// are left out (the watch keeps them pending), never an exact name.
func TestParseDevicesFit(t *testing.T) {
	sel, err := ParseDevices([]string{"eth0", "eth1", "slv+"})
	if err != nil {
		t.Fatal(err)
	}
	devs := []string{"eth0", "eth1", "slv0", "slv1", "slv2"}
	for _, c := range []struct {
		max       int
		fit, left []string
	}{
		{5, devs, nil},
		{64, devs, nil},
		{3, devs[:3], devs[3:]},
		{2, devs[:2], devs[2:]},
		{1, devs[:2], devs[2:]}, // the exact names all: their attach fails, naming --max-devices
	} {
		fit, left := sel.Fit(devs, c.max)
		if !slices.Equal(fit, c.fit) || !slices.Equal(left, c.left) {
			t.Errorf("Fit(max %d): %q, left out %q; want %q, %q", c.max, fit, left, c.fit, c.left)
		}
	}
}

// TestDeviceWatchForgetsStartDevices: pattern devices the start attached
// and that are deleted, or renamed away, before the watch's first list
// are forgotten by it: their pins and entries removed, the programs
// taken off the renamed one. One still there is "attached already".
func TestDeviceWatchForgetsStartDevices(t *testing.T) {
	bpffs, _ := attachNode(t, "devseed")
	d := openTest(t, smallConfig(bpffs))
	links := map[string]netlink.Link{}
	for i := range 3 {
		name := fmt.Sprintf("slv%d", i)
		links[name] = addVeth(t, name, fmt.Sprintf("peer%d", i))
	}
	if err := d.AttachDevices([]string{"slv0", "slv1", "slv2"}); err != nil {
		t.Fatal(err)
	}
	if err := d.Commit(); err != nil {
		t.Fatal(err)
	}
	// Before the watch: slv0 deleted, slv1 renamed out of the pattern.
	if err := netlink.LinkDel(links["slv0"]); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetName(links["slv1"], "other1"); err != nil {
		t.Fatal(err)
	}
	w := watchDevices(t, d, "slv+")
	next, _ := runDeviceWatch(t, w)
	var seen []string
	for range 3 {
		e := next(fmt.Sprintf("after %q", seen))
		if e.Err != nil {
			t.Fatalf("%+v", e)
		}
		seen = append(seen, fmt.Sprintf("%s %v %s", e.Device, e.Attached, e.Reason))
	}
	slices.Sort(seen)
	if want := []string{"slv0 false missed", "slv1 false missed", "slv2 true attached already"}; !slices.Equal(seen, want) {
		t.Fatalf("first list: %q, want %q", seen, want)
	}
	es, err := os.ReadDir(filepath.Join(d.dir, "links"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if strings.HasSuffix(e.Name(), "slv0") || strings.HasSuffix(e.Name(), "slv1") {
			t.Errorf("pin %s left", e.Name())
		}
	}
	for _, name := range []string{"slv0", "slv1"} {
		var nd sockNodeDev
		if err := d.maps.devices.Lookup(uint32(links[name].Attrs().Index), &nd); err == nil {
			t.Errorf("%s's entry left: %+v", name, nd)
		}
	}
	if ids := attachedIDs(t, links["slv1"].Attrs().Index, ebpf.AttachTCXIngress); slices.Contains(ids, progID(t, d.tc.SluiceIngress)) {
		t.Error("the programs are still on other1 (slv1 renamed away)")
	}
}

// runDeviceWatch runs w until stop or the test's end; next returns its
// next event (the minute only keeps a broken watch from hanging the test).
func runDeviceWatch(t *testing.T, w *DeviceWatch) (next func(what string) DeviceEvent, stop func()) {
	t.Helper()
	events := make(chan DeviceEvent, 64)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		w.Run(ctx, func(e DeviceEvent) { events <- e }, func(context.Context) bool { return false })
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-ran }) }
	t.Cleanup(stop)
	next = func(what string) DeviceEvent {
		t.Helper()
		select {
		case e := <-events:
			return e
		case <-time.After(time.Minute):
			t.Fatalf("no device event (%s)", what)
		}
		return DeviceEvent{}
	}
	return next, stop
}

// tcAttached says whether d's tc programs are on l, failing t when only
// one of them (ingress or egress) is.
func tcAttached(t *testing.T, d *Datapath, l netlink.Link) bool {
	t.Helper()
	idx := l.Attrs().Index
	in := slices.Contains(attachedIDs(t, idx, ebpf.AttachTCXIngress), progID(t, d.tc.SluiceIngress))
	out := slices.Contains(attachedIDs(t, idx, ebpf.AttachTCXEgress), progID(t, d.tc.SluiceEgress))
	if in != out {
		t.Fatalf("%s: ingress attached %v, egress %v", l.Attrs().Name, in, out)
	}
	return in
}

// deviceEntry is l's sluice_devices entry, and whether it has one.
func deviceEntry(d *Datapath, l netlink.Link) (sockNodeDev, bool) {
	var nd sockNodeDev
	err := d.maps.devices.Lookup(uint32(l.Attrs().Index), &nd)
	return nd, err == nil
}

// wantLinkPins fails t unless d's pinned links, but for the cgroups',
// are want (in any order).
func wantLinkPins(t *testing.T, d *Datapath, want ...string) {
	t.Helper()
	es, err := os.ReadDir(filepath.Join(d.dir, "links"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range es {
		if !strings.HasPrefix(e.Name(), "cgroup_") {
			got = append(got, e.Name())
		}
	}
	want = slices.Sorted(slices.Values(want))
	if !slices.Equal(got, want) {
		t.Fatalf("pinned links %q, want %q", got, want)
	}
}

// failFirstSubscription replaces *subscribe, a watch's netlink
// subscription (to links or to routes): the first subscription hears
// nothing and, once fail is called, fails with err through the options'
// ErrorCallback (errorCallback picks it out); the later ones are the real
// subscription. subscriptions counts them.
func failFirstSubscription[U, O any](subscribe *func(chan<- U, <-chan struct{}, O) error, errorCallback func(O) func(error), err error) (fail func(), subscriptions func() int) {
	failed := make(chan struct{})
	n := 0
	real := *subscribe
	*subscribe = func(ch chan<- U, done <-chan struct{}, opts O) error {
		n++
		if n > 1 {
			return real(ch, done, opts)
		}
		go func() {
			defer close(ch)
			select {
			case <-failed:
				errorCallback(opts)(err)
			case <-done:
			}
		}()
		return nil
	}
	return func() { close(failed) }, func() int { return n }
}

// TestDevicePatternsRestartAtTheLimit: an earlier agent at --max-devices
// attached slv1 and slv2; slv0, sorting first, appeared while it ran.
// The next start (as cmd/sluice composes it) prunes to the matches Fit
// picks and attaches those: it must find room. Pruning to every match
// kept slv2's entry beside slv1's, and slv0's attach found the map full
// at every start (a crash loop).
func TestDevicePatternsRestartAtTheLimit(t *testing.T) {
	bpffs, _ := attachNode(t, "devrst")
	cfg := smallConfig(bpffs)
	cfg.MaxDevices = 2
	addVeth(t, "slv1", "pslv1")
	addVeth(t, "slv2", "pslv2")
	d1 := openTest(t, cfg)
	if err := d1.AttachDevices([]string{"slv1", "slv2"}); err != nil {
		t.Fatal(err)
	}
	if err := d1.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := d1.Close(); err != nil {
		t.Fatal(err)
	}
	addVeth(t, "slv0", "pslv0")

	sel, err := ParseDevices([]string{"slv+"})
	if err != nil {
		t.Fatal(err)
	}
	all, err := sel.Expand()
	if err != nil {
		t.Fatal(err)
	}
	fit, left := sel.Fit(all, cfg.MaxDevices)
	if !slices.Equal(fit, []string{"slv0", "slv1"}) || !slices.Equal(left, []string{"slv2"}) {
		t.Fatalf("Fit: %q and %q left out, want [slv0 slv1] and [slv2]", fit, left)
	}
	d2 := openTest(t, cfg)
	if err := d2.Prune("", fit); err != nil {
		t.Fatalf("Prune: %v", err)
	}
	if err := d2.AttachDevices(fit); err != nil {
		t.Fatalf("attach %q after an agent that held [slv1 slv2]: %v", fit, err)
	}
	if err := d2.Commit(); err != nil {
		t.Fatal(err)
	}
	if n, err := countEntries(d2.Maps().devices); err != nil || n != 2 {
		t.Fatalf("sluice_devices holds %d devices (%v), want 2", n, err)
	}
}

// watchDevices is d's watch of the devices patterns name, not running
// yet.
func watchDevices(t *testing.T, d *Datapath, patterns ...string) *DeviceWatch {
	t.Helper()
	sel, err := ParseDevices(patterns)
	if err != nil {
		t.Fatal(err)
	}
	w, err := d.NewDeviceWatch(sel)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// addVeth adds the veth pair name<->peer in the calling thread's
// namespace, left down, and returns the link of name.
func addVeth(t *testing.T, name, peer string) netlink.Link {
	t.Helper()
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peer}); err != nil {
		t.Fatalf("add veth %s: %v", name, err)
	}
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}
