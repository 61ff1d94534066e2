package datapath

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
)

// On this machine (bpffs and cgroup v2 mounted, a recent kernel, root) the
// check passes, for a pin directory that does not exist yet too.
func TestCheckNodePasses(t *testing.T) {
	testutil.Privileged(t)
	cg, err := CgroupV2Mount()
	if err != nil {
		t.Skip(err)
	}
	for _, bpffs := range []string{DefaultBPFFS, filepath.Join(testutil.PinDir(t), "not-yet", "deeper")} {
		if err := CheckNode(Prerequisites{BPFFS: bpffs, Cgroup: cg}); err != nil {
			t.Errorf("bpffs %s: %v", bpffs, err)
		}
	}
	needs, err := kernelNeeds(Prerequisites{Cgroup: cg, XDP: XDPGeneric})
	if err != nil {
		t.Fatal(err)
	}
	// The needs come from the objects: the socket programs' attach types
	// and a helper only the tc programs call are among them.
	var whats []string
	for _, n := range needs {
		whats = append(whats, n.what)
	}
	all := strings.Join(whats, "\n")
	for _, want := range []string{"program type CGroupSockAddr", "program type SchedCLS", "program type XDP",
		"attach type CgroupInet4GetPeername of CGroupSockAddr programs", "helper FnFibLookup in SchedCLS programs",
		"map type LRUHash", "map type LPMTrie"} {
		if !strings.Contains(all, want) {
			t.Errorf("needs lack %q:\n%s", want, all)
		}
	}
}

// A pin directory off bpffs and a socket LB cgroup off cgroup v2 are named,
// both, with what to do.
func TestCheckNodeNamesWrongMounts(t *testing.T) {
	testutil.Privileged(t)
	notBPF := t.TempDir()
	err := CheckNode(Prerequisites{BPFFS: filepath.Join(notBPF, "pins"), Cgroup: notBPF})
	var pe *PrerequisiteError
	if !errors.As(err, &pe) {
		t.Fatalf("CheckNode = %v, want a *PrerequisiteError", err)
	}
	if len(pe.Problems) != 2 {
		t.Fatalf("problems %q, want two (bpffs, cgroup)", pe.Problems)
	}
	for i, want := range []string{"not a BPF file system (bpffs)", "needs cgroup v2"} {
		if !strings.Contains(pe.Problems[i], want) || !strings.Contains(pe.Problems[i], notBPF) {
			t.Errorf("problem %q does not say %q about %s", pe.Problems[i], want, notBPF)
		}
	}
	if !strings.Contains(pe.Problems[0], "mount -t bpf bpf") || !strings.Contains(pe.Problems[1], "--socket-lb=false") {
		t.Errorf("problems %q lack the remedies", pe.Problems)
	}
	t.Logf("%v", err)

	err = CheckNode(Prerequisites{BPFFS: DefaultBPFFS, Cgroup: filepath.Join(notBPF, "no-such-cgroup")})
	if err == nil || !strings.Contains(err.Error(), "no such file or directory") {
		t.Errorf("a missing cgroup: %v", err)
	}
}

// Without the right to use bpf(2), the check says so once, naming the
// capabilities, rather than reporting every kernel feature as missing.
func TestCheckNodeWithoutBPFPermission(t *testing.T) {
	if os.Getenv("SLUICE_PREREQ_CHILD") != "" {
		err := CheckNode(Prerequisites{BPFFS: DefaultBPFFS})
		if _, err := os.Stdout.WriteString(err.Error()); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	testutil.Privileged(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("needs setpriv (util-linux)")
	}
	if b, _ := os.ReadFile("/proc/sys/kernel/unprivileged_bpf_disabled"); strings.TrimSpace(string(b)) == "0" {
		t.Skip("unprivileged bpf(2) is enabled: an unprivileged process may load some programs")
	}
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all",
		os.Args[0], "-test.run=^TestCheckNodeWithoutBPFPermission$")
	cmd.Env = append(os.Environ(), "SLUICE_PREREQ_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	msg := string(out)
	if !strings.Contains(msg, "bpf(2) is not permitted") || !strings.Contains(msg, "CAP_BPF") {
		t.Errorf("unprivileged check said:\n%s", msg)
	}
	t.Logf("unprivileged: %s", msg)
	if strings.Contains(msg, "lacks") {
		t.Errorf("a permission problem reported as missing kernel features:\n%s", msg)
	}
}

// The digest `sluice --version` prints covers every committed object, as
// `cat pkg/datapath/*_bpfel.o | sha256sum` computes it.
func TestObjectsDigestCoversTheCommittedObjects(t *testing.T) {
	files, err := filepath.Glob("*_bpfel.o")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(objects()) {
		t.Fatalf("%d objects in the package, %d embedded in the digest: add the new one to objects()", len(files), len(objects()))
	}
	h := sha256.New()
	for _, f := range files { // Glob sorts
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		h.Write(b)
	}
	if want := "sha256:" + hex.EncodeToString(h.Sum(nil)); ObjectsDigest() != want {
		t.Errorf("ObjectsDigest() = %s, files hash to %s", ObjectsDigest(), want)
	}
}
