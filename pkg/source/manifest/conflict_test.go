package manifest

import (
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/agent"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// The agent tells the source's tracker what the maps hold.
var _ agent.HoldsSource = (*Source)(nil)

// The probe's VIP clash: a second Service claiming a ClusterIP:port in use,
// with a name that sorts first, must not take it over, neither at once nor
// after an agent restart (a new loader and reconciler over the same maps).
func TestLoadVIPClashFirstComeKeepsIt(t *testing.T) {
	dir := t.TempDir()
	owner := strings.NewReplacer("name: a,", "name: zz,", "service-name: a", "service-name: zz", "name: a-1", "name: zz-1").Replace(svcA + "---\n" + sliceA)
	writeFile(t, dir, "services.yaml", owner)
	dp := fakedp.New(16, 16, 64)
	rec := reconciler.New(dp, nil)
	l := newLoader(translate.Options{})
	l.tracker.SetHolds(rec.Holds)
	res, err := l.load(dir)
	if err != nil {
		t.Fatal(err)
	}
	const held = "10.96.0.1:80/TCP ns/zz:http -> 10.0.0.1:8080/TCP"
	if got := render(res.State); got != held {
		t.Fatalf("state %s, want %s", got, held)
	}
	if err := rec.Apply(res.State); err != nil {
		t.Fatal(err)
	}

	// The newcomer "aa", appended with the same VIP and other endpoints.
	newcomer := strings.NewReplacer("name: a,", "name: aa,", "service-name: a", "service-name: aa", "name: a-1", "name: aa-1", "10.0.0.1]", "10.0.0.9]").Replace(svcA + "---\n" + sliceA)
	writeFile(t, dir, "services.yaml", owner+"---\n"+newcomer)
	res, err = l.load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := render(res.State); got != held {
		t.Errorf("the newcomer took the VIP over: %s", got)
	}
	if len(res.Errors) != 1 || !strings.Contains(res.Errors[0].Error(), "ns/aa: frontend 10.96.0.1:80/TCP already belongs to Service ns/zz") {
		t.Errorf("errors %v, want the newcomer reported", res.Errors)
	}
	if err := rec.Apply(res.State); err != nil {
		t.Fatal(err)
	}

	// A restart: new reconciler restored from the maps, new loader.
	rec = reconciler.New(dp, nil)
	if err := rec.Restore(); err != nil {
		t.Fatal(err)
	}
	l = newLoader(translate.Options{})
	l.tracker.SetHolds(rec.Holds)
	res, err = l.load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := render(res.State); got != held {
		t.Errorf("after a restart the newcomer took the VIP over: %s", got)
	}
}
