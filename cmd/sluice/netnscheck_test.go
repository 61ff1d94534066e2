package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOutsideNetns: two names of one namespace file (or of one file) are
// the same namespace, two files are not, and a file that cannot be read
// is an error, no finding.
func TestOutsideNetns(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	for _, p := range []string{a, b} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(a, filepath.Join(dir, "a2")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		self, init string
		outside    bool
		err        bool
	}{
		{"/proc/self/ns/net", "/proc/thread-self/ns/net", false, false},
		{a, filepath.Join(dir, "a2"), false, false},
		{a, b, true, false},
		{a, filepath.Join(dir, "missing"), false, true},
		{filepath.Join(dir, "missing"), a, false, true},
	} {
		outside, err := outsideNetns(c.self, c.init)
		if outside != c.outside || (err != nil) != c.err {
			t.Errorf("outsideNetns(%s, %s) = %v, %v; want %v, error %v", c.self, c.init, outside, err, c.outside, c.err)
		}
	}
}

// TestOutsideInitNetnsWarns: an agent whose network namespace is not PID
// 1's (here PID 1's stood in for by another file) is warned of at start,
// naming the NodePorts on 127.0.0.1 it serves to its own namespace only
// (with --localhost-nodeports, the default, socket load balancing and
// --nodeport-addresses covering 127.0.0.1) and --socket-lb-host-netns-only's
// sockets; one in PID 1's namespace (this test's, unless it runs in
// another) is not. The start then fails at the missing --manifests.
func TestOutsideInitNetnsWarns(t *testing.T) {
	const (
		warned    = `level=WARN msg="the agent runs in another network namespace than PID 1`
		localhost = "NodePorts on 127.0.0.1 are served to this namespace's sockets only"
		hostOnly  = "--socket-lb-host-netns-only translates this namespace's sockets only"
	)
	if outside, err := outsideNetns(selfNetnsPath, initNetnsPath); err != nil || outside {
		t.Logf("PID 1's network namespace is another than this test's, or unreadable (%v, %v): the case without a warning is not run", outside, err)
	} else {
		stderr := runToMissingManifests(t, "--socket-lb=false")
		if strings.Contains(stderr, warned) {
			t.Errorf("in PID 1's network namespace: warned; stderr:\n%s", stderr)
		}
	}

	other := filepath.Join(t.TempDir(), "pid1-netns")
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	defer func(p string) { initNetnsPath = p }(initNetnsPath)
	initNetnsPath = other
	for _, c := range []struct {
		args                []string
		localhost, hostOnly bool
	}{
		{[]string{"--nodeport-addresses", "localhost,10.0.0.0/8", "--devices", "lo"}, true, false},
		{[]string{"--nodeport-addresses", "0.0.0.0/0", "--devices", "lo"}, true, false},
		{[]string{"--devices", "lo"}, false, false}, // primary: no NodePorts on 127.0.0.1
		{[]string{"--socket-lb=false", "--nodeport-addresses", "localhost"}, false, false},
		{[]string{"--nodeport-addresses", "localhost", "--localhost-nodeports=false", "--devices", "lo"}, false, false},
		{[]string{"--socket-lb-host-netns-only", "--localhost-nodeports=false", "--devices", "lo"}, false, true},
	} {
		stderr := runToMissingManifests(t, c.args...)
		if !strings.Contains(stderr, warned) {
			t.Errorf("%q: not warned; stderr:\n%s", c.args, stderr)
			continue
		}
		if strings.Contains(stderr, localhost) != c.localhost || strings.Contains(stderr, hostOnly) != c.hostOnly {
			t.Errorf("%q: warning names 127.0.0.1 %v, --socket-lb-host-netns-only %v; want %v, %v; stderr:\n%s",
				c.args, !c.localhost, !c.hostOnly, c.localhost, c.hostOnly, stderr)
		}
	}
}
