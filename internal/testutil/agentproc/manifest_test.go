package agentproc

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/sluice-lb/sluice/pkg/source/manifest"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// What Services renders loads through the manifest source as the Services
// it describes: an IPv4 one, and each family of a dual-stack one with the
// endpoints of its family only.
func TestServicesLoad(t *testing.T) {
	file := filepath.Join(t.TempDir(), "svc.yaml")
	docs := Services(
		Service{Name: "web", ClusterIP: "10.96.0.10", Endpoints: []string{"10.1.1.2", "10.1.2.2"},
			Ports: []Port{TCP("http", 80, 8080)}},
		Service{Name: "dual", ClusterIP: "10.96.0.11", ClusterIP6: "2001:db8:96::11",
			Endpoints: []string{"10.1.1.2", "2001:db8:1:1::2", "2001:db8:1:2::2"},
			Ports:     []Port{UDP("dns", 53, 5353)}},
	)
	if err := os.WriteFile(file, []byte(Manifest(docs...)), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := manifest.Load(file, translate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Errors) > 0 || len(res.Warnings) > 0 {
		t.Fatalf("errors %v, warnings %v", res.Errors, res.Warnings)
	}
	want := map[string][]string{
		"10.96.0.10:80/TCP":        {"10.1.1.2:8080/TCP", "10.1.2.2:8080/TCP"},
		"10.96.0.11:53/UDP":        {"10.1.1.2:5353/UDP"},
		"[2001:db8:96::11]:53/UDP": {"[2001:db8:1:1::2]:5353/UDP", "[2001:db8:1:2::2]:5353/UDP"},
	}
	got := map[string][]string{}
	for fe, svc := range res.State.Services.All() {
		for _, b := range svc.Backends {
			got[fe.String()] = append(got[fe.String()], b.String())
		}
		slices.Sort(got[fe.String()])
	}
	if len(got) != len(want) {
		t.Fatalf("frontends %v, want %v", got, want)
	}
	for fe, bes := range want {
		if !slices.Equal(got[fe], bes) {
			t.Errorf("%s: backends %v, want %v", fe, got[fe], bes)
		}
	}
}
