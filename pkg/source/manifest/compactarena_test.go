package manifest

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"unsafe"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// TestCompactArenaKeepsObjectsApart: the compact Services and slices of a
// load, and their arrays, are carved from shared chunks (compactArena),
// yet each is its own: appending to one object's ClusterIPs or Ports
// changes no other object, and a later load that decodes one Service and
// one slice again (by a patch, or a parse carving them from new chunks)
// leaves every other object as it was.
func TestCompactArenaKeepsObjectsApart(t *testing.T) {
	for _, noPatch := range []bool{false, true} {
		t.Run(fmt.Sprintf("noPatch=%v", noPatch), func(t *testing.T) { testCompactArena(t, noPatch) })
	}
}

func testCompactArena(t *testing.T, noPatch bool) {
	const n, change = 40, 7
	p := filepath.Join(t.TempDir(), "services.json")
	_, changed := writeList(t, p, n, 3, change)
	l := newLoader(translate.Options{})
	l.noPatch = noPatch
	if res, err := l.load(p); err != nil || len(res.Errors) > 0 {
		t.Fatal(err, res.Errors)
	}
	objs := l.byFile[p]
	if len(objs) != 2*n {
		t.Fatalf("%d objects, want %d", len(objs), 2*n)
	}
	// The load carved them: consecutive Services' Ports are adjacent
	// (else this test checks nothing).
	adjacent := 0
	var prev *translate.Service
	for _, o := range objs {
		if o.svc == nil {
			continue
		}
		if prev != nil && uintptr(unsafe.Pointer(&o.svc.Ports[0])) == uintptr(unsafe.Pointer(&prev.Ports[0]))+unsafe.Sizeof(prev.Ports[0]) {
			adjacent++
		}
		prev = o.svc
	}
	if adjacent == 0 {
		t.Fatal("no two Services' Ports adjacent: the load did not carve them from chunks")
	}

	// The compact forms (the objects' own structs may be updated in
	// place by a later load; the compact forms never are).
	forms := make([]object, len(objs))
	want := make([]string, len(objs))
	for i, o := range objs {
		forms[i] = object{key: o.key, svc: o.svc, slice: o.slice}
		want[i] = dumpCompact(&forms[i])
	}
	check := func(what string) {
		t.Helper()
		for i := range forms {
			if got := dumpCompact(&forms[i]); got != want[i] {
				t.Errorf("%s: %s changed:\n%s\nwant\n%s", what, forms[i].key, got, want[i])
			}
		}
	}

	for _, o := range objs {
		if s := o.svc; s != nil {
			_ = append(s.ClusterIPs, netip.MustParseAddr("192.0.2.99"))
			_ = append(s.Ports, translate.ServicePort{Name: "appended", Port: 1})
		}
		if s := o.slice; s != nil {
			_ = append(s.Ports, translate.SlicePort{Name: "appended", Port: 1, HasPort: true})
		}
	}
	check("after an append to each object's arrays")

	// Service `change` gets another ClusterIP, its slice another endpoint.
	from, to := fmt.Sprintf(`"10.96.0.%d"`, change), fmt.Sprintf(`"10.96.0.%d"`, 200+change)
	data := bytes.ReplaceAll(changed, []byte(from), []byte(to))
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
	decoded := l.decoded.Load()
	if res, err := l.load(p); err != nil || len(res.Errors) > 0 {
		t.Fatal(err, res.Errors)
	}
	if got := l.decoded.Load() - decoded; got != 2 {
		t.Fatalf("the change decoded %d objects, want 2", got)
	}
	if patched := l.patches == 1; patched == noPatch {
		t.Fatalf("%d loads patched, noPatch %v", l.patches, noPatch)
	}
	var redone *object
	for _, o := range l.byFile[p] {
		if o.svc != nil && o.key.Name == fmt.Sprintf("svc-%d", change) {
			redone = o
		}
	}
	if redone == nil || redone.svc.ClusterIPs[0].String() != to[1:len(to)-1] {
		t.Fatalf("the changed Service was not loaded: %+v", redone)
	}
	check("after a load decoding one Service and its slice again")
}

// dumpCompact renders what a translation reads of o's compact form.
func dumpCompact(o *object) string {
	if s := o.svc; s != nil {
		c := *s
		c.ClusterIPs, c.Ports = slices.Clone(c.ClusterIPs), slices.Clone(c.Ports)
		return fmt.Sprintf("%+v", c)
	}
	s := o.slice
	var eps []translate.SliceEndpoint
	for i := range s.Endpoints.Len() {
		eps = append(eps, s.Endpoints.At(i))
	}
	return fmt.Sprintf("%s/%s %s %s %+v %+v %v", s.Namespace, s.Name, s.Service, s.AddressType, s.Ports, eps, s.Invalid)
}
