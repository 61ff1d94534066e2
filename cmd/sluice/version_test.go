package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/datapath"
)

func TestVersionNamesReleaseCommitAndObjects(t *testing.T) {
	var b bytes.Buffer
	if err := printVersion(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 4 || lines[0] != "sluice "+version {
		t.Fatalf("--version printed:\n%s", b.String())
	}
	if want := "bpf objects: " + datapath.ObjectsDigest(); lines[2] != want {
		t.Errorf("line %q, want %q", lines[2], want)
	}
	if code := run([]string{"--version"}); code != 0 {
		t.Errorf("sluice --version exited %d", code)
	}

	old := commit
	t.Cleanup(func() { commit = old })
	commit = "0123abcd"
	if buildCommit() != "0123abcd" {
		t.Errorf("buildCommit() = %q with commit set at link time", buildCommit())
	}
}

// A --manifests path that does not exist fails at once, before anything
// is loaded or pinned: nothing appears under a real bpffs directory, where
// an agent that went on would pin its maps.
func TestMissingManifestFailsBeforePinning(t *testing.T) {
	// Root, or the agent would fail for want of BPF rights, proving nothing.
	testutil.Privileged(t)
	bpffs := testutil.PinDir(t)
	t.Cleanup(func() {
		if err := datapath.Cleanup(bpffs); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	code := run([]string{"--manifests", filepath.Join(t.TempDir(), "typo.yaml"), "--bpffs", bpffs,
		"--health-addr", "", "--metrics-addr", "", "--socket-lb=false", "--node-name", "n"})
	if code == 0 {
		t.Fatal("sluice with a missing --manifests file exited 0")
	}
	if ents, err := os.ReadDir(bpffs); err != nil || len(ents) > 0 {
		t.Errorf("bpffs directory after the failed start: %v (%v), want empty", ents, err)
	}
}
