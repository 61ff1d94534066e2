package manifest

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// dumpState prints every field of every frontend of st, sorted.
func dumpState(st *model.State) string {
	var lines []string
	for fe, s := range st.Services.All() {
		lines = append(lines, fmt.Sprintf("%s %+v", fe, *s))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// writeRandomCluster writes into dir a few files of Services and
// EndpointSlices in random order (YAML streams and a JSON List): some
// Services claim one ClusterIP, some are invalid, headless or NodePort,
// some are defined twice; some slices name no Service or one that does
// not exist, list their endpoints out of order or twice.
func writeRandomCluster(t *testing.T, r *rand.Rand, dir string) {
	t.Helper()
	var docs []string
	svcDoc := func(i int) string {
		ns := fmt.Sprintf("ns-%d", i%2)
		ip := fmt.Sprintf("10.96.0.%d", 1+r.IntN(25))
		typ, port, extra := "ClusterIP", 80, ""
		switch r.IntN(10) {
		case 0:
			port = 0 // invalid
		case 1:
			ip = "None"
		case 2:
			typ, extra = "NodePort", ", nodePort: 30080"
		}
		return fmt.Sprintf(`{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s%d", "namespace": %q}, `+
			`"spec": {"type": %q, "clusterIP": %q, "ports": [{"name": "http", "port": %d, "targetPort": 8080%s}]}}`,
			i, ns, typ, ip, port, extra)
	}
	for i := range 30 {
		if r.IntN(8) != 0 {
			docs = append(docs, svcDoc(i))
			if r.IntN(12) == 0 {
				docs = append(docs, svcDoc(i)) // defined twice
			}
		}
		if r.IntN(6) == 0 {
			continue
		}
		owner := fmt.Sprintf(`"labels": {"kubernetes.io/service-name": "s%d"}`, i)
		switch r.IntN(12) {
		case 0:
			owner = `"labels": {}`
		case 1:
			owner = fmt.Sprintf(`"labels": {"kubernetes.io/service-name": "s%d"}`, 30+i) // no such Service
		}
		var eps []string
		a := 1 + r.IntN(50)
		for range r.IntN(6) {
			if r.IntN(5) == 0 {
				a -= r.IntN(3) // out of order, or twice
			} else {
				a += 1 + r.IntN(9)
			}
			eps = append(eps, fmt.Sprintf(`{"addresses": ["10.1.%d.%d"], "conditions": {"ready": %v}}`, i, max(a, 1), r.IntN(4) != 0))
		}
		docs = append(docs, fmt.Sprintf(`{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", `+
			`"metadata": {"name": "s%d-x", "namespace": "ns-%d", %s}, "addressType": "IPv4", `+
			`"ports": [{"name": "http", "port": 8080}], "endpoints": [%s]}`, i, i%2, owner, strings.Join(eps, ", ")))
	}
	r.Shuffle(len(docs), func(i, j int) { docs[i], docs[j] = docs[j], docs[i] })
	files := map[string][]string{}
	names := []string{"a.yaml", "b.yaml", "c.json"}
	for _, d := range docs {
		f := names[r.IntN(len(names))]
		files[f] = append(files[f], d)
	}
	for _, f := range names {
		var body string
		if strings.HasSuffix(f, ".json") {
			body = `{"apiVersion": "v1", "kind": "List", "items": [` + strings.Join(files[f], ", ") + `]}`
		} else {
			body = "---\n" + strings.Join(files[f], "\n---\n") + "\n"
		}
		if err := os.WriteFile(filepath.Join(dir, f), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// A first load feeds the tracker in file order (inFileOrder): every
// object in effect once, file by file in name order, each file's in its
// order; and what the load makes of them (every field of every frontend,
// errors, warnings, skipped Services, counts) is what feeding them in map
// order made, over random directories with conflicts, invalid, headless
// and duplicate Services and slices of no Service.
func TestFirstLoadInFileOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(54, 3))
	var conflicts, twice int
	for n := range 150 {
		dir := t.TempDir()
		writeRandomCluster(t, r, dir)
		l := newLoader(translate.Options{})
		res, err := l.load(dir)
		if err != nil {
			t.Fatal(err)
		}
		var want []*object
		for _, f := range slices.Sorted(maps.Keys(l.byFile)) {
			want = append(want, l.byFile[f]...)
		}
		got := slices.Collect(l.inFileOrder(l.lastGood))
		if !slices.Equal(got, want) {
			t.Fatalf("directory %d: inFileOrder gives %d objects, not the %d of the files in their order", n, len(got), len(want))
		}
		inEffect := slices.Collect(maps.Values(l.lastGood))
		byKey := func(a, b *object) int { return strings.Compare(a.key.String(), b.key.String()) }
		slices.SortFunc(got, byKey)
		slices.SortFunc(inEffect, byKey)
		if !slices.Equal(got, inEffect) {
			t.Fatalf("directory %d: inFileOrder gives other objects than those in effect", n)
		}

		m := newLoader(translate.Options{})
		m.mapOrder = true
		mres, err := m.load(dir)
		if err != nil {
			t.Fatal(err)
		}
		if g, w := dumpState(res.State), dumpState(mres.State); g != w {
			t.Fatalf("directory %d: in file order\n%s\nin map order\n%s", n, g, w)
		}
		res.State, mres.State = nil, nil
		ge, we := errorStrings(res.Errors), errorStrings(mres.Errors)
		res.Errors, mres.Errors = nil, nil
		if !reflect.DeepEqual(ge, we) || !reflect.DeepEqual(res, mres) {
			t.Fatalf("directory %d: in file order %+v %q\nin map order %+v %q", n, res, ge, mres, we)
		}
		for _, e := range ge {
			switch {
			case strings.Contains(e, "already belongs"):
				conflicts++
			case strings.Contains(e, "already defined"):
				twice++
			}
		}
	}
	if conflicts < 100 || twice < 50 {
		t.Errorf("%d frontends lost to another Service, %d objects defined twice: the random directories miss a case", conflicts, twice)
	}
}
