// Package deploy_test checks what deploy/ ships against the agent it
// deploys: the image `make image` builds runs from its own file system and
// is the version deploy/ names; deploy/sluice.yaml is the Helm chart
// rendered; the chart lints, renders, and passes only real flags; the
// dashboards and alerts query only metrics a running agent exports.
// test/kube applies the same objects to a real kube-apiserver.
package deploy_test

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
)

// root is the repository, seen from this package's directory.
const root = ".."

// helm returns the pinned helm binary, building it the first time on a
// machine (deploy/tools/helm.sh; minutes).
func helm(t *testing.T) string {
	t.Helper()
	start := time.Now()
	path, err := builtHelm()
	if err != nil {
		t.Fatalf("deploy/tools/helm.sh: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Logf("built helm in %v", d.Round(time.Second))
	}
	return path
}

// builtHelm runs deploy/tools/helm.sh once per test binary.
var builtHelm = sync.OnceValues(func() (string, error) {
	out, err := exec.Command("bash", filepath.Join("tools", "helm.sh")).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return "", &cmdError{err, string(ee.Stderr)}
		}
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
})

type cmdError struct {
	err    error
	stderr string
}

func (e *cmdError) Error() string { return e.err.Error() + "\n" + e.stderr }

// run runs a command and returns its stdout, failing the test (with its
// stderr) if it fails.
func run(t *testing.T, dir string, name string, args ...string) []byte {
	t.Helper()
	out, err := runErr(t.Context(), dir, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v", name, strings.Join(args, " "), err)
	}
	return out
}

func runErr(ctx context.Context, dir string, name string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), &cmdError{err, stderr.String()}
	}
	return stdout.Bytes(), nil
}

// buildSluice builds cmd/sluice into a temporary directory.
func buildSluice(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sluice")
	if err := agentproc.GoBuild(t.Context(), root, "./cmd/sluice", bin); err != nil {
		t.Fatal(err)
	}
	return bin
}
