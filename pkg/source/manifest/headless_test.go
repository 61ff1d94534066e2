package manifest

import (
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// The service.kubernetes.io/headless label, as kube-proxy reads it: on an
// EndpointSlice (it belongs to no Service, silently: it is no mistake of
// the manifest's), not on a Service (a ClusterIP Service labelled so is
// served). The Kubernetes source reads it alike (translate.Slice.Headless).
func TestLoadHeadlessLabel(t *testing.T) {
	svc := strings.Replace(svcA, "metadata: {name: a, namespace: ns}", "metadata: {name: a, namespace: ns, labels: {service.kubernetes.io/headless: \"\"}}", 1)
	labelled := strings.NewReplacer("name: a-1", "name: a-2", "{kubernetes.io/service-name: a}", "{kubernetes.io/service-name: a, service.kubernetes.io/headless: \"\"}",
		"[10.0.0.1]", "[10.0.0.2]").Replace(sliceA)
	if svc == svcA || labelled == sliceA || !strings.Contains(labelled, "headless") {
		t.Fatal("the test objects changed: nothing to replace")
	}
	dir := t.TempDir()
	writeFile(t, dir, "f.yaml", svc+"---\n"+sliceA+"---\n"+labelled)
	res, err := Load(dir, translate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Errors) != 0 || len(res.Skipped) != 0 || len(res.Warnings) != 0 {
		t.Fatalf("errors %v, skipped %v, warnings %q", res.Errors, res.Skipped, res.Warnings)
	}
	if got, want := render(res.State), "10.96.0.1:80/TCP ns/a:http -> 10.0.0.1:8080/TCP"; got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}
