package agentproc

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/namesfile"
	"github.com/sluice-lb/sluice/internal/testutil"
)

// Binaries are the built sluice and sluicectl.
type Binaries struct {
	Sluice, Sluicectl string
}

// Build compiles cmd/sluice and cmd/sluicectl of this module into dir.
func Build(ctx context.Context, dir string) (Binaries, error) {
	root, err := testutil.ModuleRoot(ctx)
	if err != nil {
		return Binaries{}, err
	}
	b := Binaries{Sluice: filepath.Join(dir, "sluice"), Sluicectl: filepath.Join(dir, "sluicectl")}
	for _, x := range []struct{ pkg, out string }{{"./cmd/sluice", b.Sluice}, {"./cmd/sluicectl", b.Sluicectl}} {
		if err := GoBuild(ctx, root, x.pkg, x.out); err != nil {
			return Binaries{}, err
		}
	}
	return b, nil
}

// GoBuild builds pkg of the module in root into out (static, with the
// local toolchain, env added to the environment), with a few tries: a
// build cache shared with concurrent builds (other test binaries, other
// checkouts) has been seen to fail transiently.
func GoBuild(ctx context.Context, root, pkg, out string, env ...string) error {
	var err error
	for try := range 3 {
		if try > 0 {
			time.Sleep(time.Second)
		}
		cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
		cmd.Dir = root
		cmd.Env = append(append(os.Environ(), "CGO_ENABLED=0", "GOTOOLCHAIN=local"), env...)
		var output []byte
		if output, err = cmd.CombinedOutput(); err == nil {
			return nil
		}
		err = fmt.Errorf("go build %s: %w\n%s", pkg, err, output)
		if ctx.Err() != nil {
			break
		}
	}
	return err
}

var shared struct {
	once sync.Once
	dir  string
	bins Binaries
	err  error
}

// Shared builds the binaries once per test process, into a directory that
// RemoveShared deletes (TestMain calls it through RunTests).
func Shared(t testing.TB) Binaries {
	t.Helper()
	shared.once.Do(func() {
		if shared.dir, shared.err = os.MkdirTemp("", "sluice-bin-"); shared.err == nil {
			shared.bins, shared.err = Build(context.Background(), shared.dir)
		}
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.bins
}

// RunTests runs the tests of m and then RemoveShared, returning m.Run's
// code: a test suite's TestMain is os.Exit(agentproc.RunTests(m)).
func RunTests(m *testing.M) int {
	code := m.Run()
	RemoveShared()
	return code
}

// RemoveShared deletes what Shared built. It runs after m.Run, when there
// is no test left to fail, so a failure is reported on stderr.
func RemoveShared() {
	if shared.dir == "" {
		return
	}
	if err := os.RemoveAll(shared.dir); err != nil {
		fmt.Fprintf(os.Stderr, "remove the shared sluice binaries: %v\n", err)
	}
}

// WriteFile replaces path atomically, as the agent writes its names file
// (a temporary file renamed over it), so a watcher never reads half a
// manifest.
func WriteFile(path, content string) error {
	return namesfile.WriteAtomic(path, []byte(content))
}
