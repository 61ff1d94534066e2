package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/source/manifest"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// TestReadmeManifestLoads keeps the README's example manifest true: it loads
// without errors into one frontend with two backends.
func TestReadmeManifestLoads(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(moduleRootDir(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(readme), "```yaml\n")
	if !ok {
		t.Fatal("README has no ```yaml example")
	}
	example, _, _ := strings.Cut(rest, "```")
	path := filepath.Join(t.TempDir(), "services.yaml")
	if err := os.WriteFile(path, []byte(example), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := manifest.Load(path, translate.Options{Node: translate.Node{Name: "node"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Errors) > 0 || len(res.Warnings) > 0 {
		t.Fatalf("README example: errors %v, warnings %v", res.Errors, res.Warnings)
	}
	if res.State.Services.Len() != 1 {
		t.Fatalf("README example gives %d frontends, want 1", res.State.Services.Len())
	}
	for fe, svc := range res.State.Services.All() {
		if fe.String() != "10.96.0.10:80/TCP" || len(svc.Backends) != 2 {
			t.Errorf("README example: %s with %d backends, want 10.96.0.10:80/TCP with 2", fe, len(svc.Backends))
		}
	}
}
