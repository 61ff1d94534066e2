package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestCommandLineErrorsExitTwo(t *testing.T) {
	manifest := filepath.Join(t.TempDir(), "m.yaml")
	if err := os.WriteFile(manifest, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"no source", []string{"--health-addr", ""}},
		{"two sources", []string{"--manifests", manifest, "--kubeconfig", "/nonexistent"}},
		{"bad log level", []string{"--manifests", manifest, "--log-level", "loud"}},
		{"stray argument", []string{"--manifests", manifest, "extra"}},
		{"bad node IP", []string{"--manifests", manifest, "--node-ip", "192.168.1.300"}},
		{"unspecified node IP", []string{"--manifests", manifest, "--node-ip", "192.168.1.1,::"}},
		{"scoped node IP", []string{"--manifests", manifest, "--node-ip", "fe80::1%eth0"}},
		{"bad XDP mode", []string{"--manifests", manifest, "--xdp", "fast"}},
		{"device pattern matching every link", []string{"--manifests", manifest, "--devices", "eth0,+"}},
		{"bad device name", []string{"--manifests", manifest, "--devices", "eth0,a/b+"}},
		{"bad cluster CIDR", []string{"--manifests", manifest, "--cluster-cidr", "10.0.0.0/40"}},
		{"bad service CIDR", []string{"--manifests", manifest, "--service-cidr", "bogus"}},
		{"bad nodeport addresses", []string{"--manifests", manifest, "--nodeport-addresses", "192.168.0.2"}},
		{"bad IPv6 nodeport addresses", []string{"--manifests", manifest, "--nodeport-addresses", "2001:db8::/129"}},
		{"no conntrack GC", []string{"--manifests", manifest, "--conntrack-gc-interval", "0"}},
		{"collector off for the start", []string{"--manifests", manifest, "--start-gc-percent", "-1"}},
		{"start's target 0", []string{"--manifests", manifest, "--start-gc-percent", "0"}},
		{"negative map refresh", []string{"--manifests", manifest, "--map-refresh-interval", "-1s"}},
		{"map size ratio above 1", []string{"--manifests", manifest, "--map-dynamic-size-ratio", "1.5"}},
		{"negative map size ratio", []string{"--manifests", manifest, "--map-dynamic-size-ratio", "-0.1"}},
		{"unknown flag", []string{"--frobnicate"}},
		{"cleanup unknown flag", []string{"cleanup", "--frobnicate"}},
	} {
		if code := run(tc.args); code != 2 {
			t.Errorf("%s: sluice %q exited %d, want 2", tc.name, tc.args, code)
		}
	}
}

func TestHelpExitsZero(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"cleanup", "--help"}} {
		if code := run(args); code != 0 {
			t.Errorf("sluice %q exited %d, want 0", args, code)
		}
	}
}

func TestSplitList(t *testing.T) {
	got := splitList(" eth0, ,eth1,")
	if want := []string{"eth0", "eth1"}; !reflect.DeepEqual(got, want) {
		t.Errorf("splitList = %q, want %q", got, want)
	}
	if got := splitList(""); got != nil {
		t.Errorf("splitList(\"\") = %q, want nil", got)
	}
}

// BPF_ENABLE_STATS is system wide: every run of every BPF program on the
// node pays two clock reads while it is on (issue 14, twenty-third pass:
// about 1% of a per-packet connection's CPU), so the agent holds it only
// when asked.
func TestProgramStatsOffByDefault(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = w
	code := run([]string{"--help"})
	os.Stderr = stderr
	_ = w.Close()
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if code != 0 {
		t.Fatalf("sluice --help exited %d", code)
	}
	i := bytes.Index(out, []byte("-bpf-program-stats"))
	if i < 0 {
		t.Fatalf("--help lists no -bpf-program-stats:\n%s", out)
	}
	line, _, _ := bytes.Cut(out[i:], []byte("\n  -"))
	if bytes.Contains(line, []byte("(default true)")) {
		t.Errorf("--bpf-program-stats is on by default: %s", line)
	}
}

// runToMissingManifests runs the agent with the flags extra beside a
// --manifests file that does not exist, no servers and a bpffs of its
// own, and returns its log: the start must stop with exit 1 at the
// missing file, after what it says at start and before it loads or pins
// anything.
func runToMissingManifests(t *testing.T, extra ...string) string {
	t.Helper()
	args := append([]string{"--manifests", filepath.Join(t.TempDir(), "missing.yaml"), "--health-addr", "", "--metrics-addr", "",
		"--names-file", "", "--node-name", "n", "--bpffs", t.TempDir()}, extra...)
	var code int
	stderr := captureStderr(t, func() { code = run(args) })
	if code != 1 || !strings.Contains(stderr, "cannot read --manifests") {
		t.Fatalf("%q: exit %d, want 1 at the missing --manifests; stderr:\n%s", extra, code, stderr)
	}
	return stderr
}
