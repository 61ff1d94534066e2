package main

import (
	"bytes"
	"strings"
	"testing"
)

// conntrack delete removes flows made by real packets (BPF_PROG_TEST_RUN):
// one by its tuple, then the rest by Service with --yes, which more than
// one flow needs.
func TestConntrackDelete(t *testing.T) {
	base := liveArgs(t)
	list := func(args ...string) []ConntrackRow {
		t.Helper()
		return decode[[]ConntrackRow](t, runOK(t, append(append(append([]string{}, base...), "conntrack", "-o", "json"), args...)...))
	}
	if n := len(list()); n != 4 {
		t.Fatalf("%d entries before, want 4 (two flows): the test proves nothing", n)
	}
	if got := list("--service", "default/web:http"); len(got) != 4 {
		t.Errorf("--service default/web:http: %d entries, want 4", len(got))
	}
	if got := list("--service", "prod/db"); len(got) != 0 {
		t.Errorf("--service prod/db: %+v, want none", got)
	}
	if got := list("--src", "10.0.0.1:40001", "--dst", "10.96.0.10:80"); len(got) != 2 {
		t.Errorf("--src/--dst of one flow: %d entries, want its 2 (forward and reverse)", len(got))
	}

	var stdout, stderr bytes.Buffer
	if code := run(append(base, "conntrack", "delete", "--addr", "10.0.0.1"), &stdout, &stderr); code != 1 ||
		!strings.Contains(stderr.String(), "2 flows (4 entries) match") {
		t.Errorf("delete of two flows without --yes: exit %d, stderr %q; want 1 and the count", code, stderr.String())
	}
	if n := len(list()); n != 4 {
		t.Fatalf("a refused delete deleted: %d entries left", n)
	}

	got := decode[ConntrackDeleted](t, runOK(t, append(base, "conntrack", "delete", "--src", "10.0.0.1:40001", "--dst", "10.96.0.10:80", "-o", "json")...))
	if got != (ConntrackDeleted{Flows: 1, Entries: 2}) {
		t.Errorf("delete one flow: %+v, want 1 flow, 2 entries", got)
	}
	left := list()
	if len(left) != 2 {
		t.Fatalf("after deleting one flow %d entries left, want 2: %+v", len(left), left)
	}
	for _, r := range left {
		if !strings.Contains(r.Src+r.Dst, ":40000") {
			t.Errorf("entry %+v of the deleted flow left", r)
		}
	}
	out := runOK(t, append(base, "conntrack", "delete", "--service", "default/web", "--yes")...)
	if out != "deleted 2 entries (1 flow)\n" {
		t.Errorf("delete by Service: %q", out)
	}
	if n := len(list()); n != 0 {
		t.Errorf("%d entries left, want none", n)
	}
}

func TestConntrackDeleteUsage(t *testing.T) {
	for _, args := range [][]string{
		{"conntrack", "delete"}, {"conntrack", "delete", "--src", "10.0.0.1"}, {"conntrack", "delete", "--service", "web"},
		{"conntrack", "delete", "--proto", "sctp"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(append([]string{"--bpffs", t.TempDir()}, args...), &stdout, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2 (stderr %q)", args, code, stderr.String())
		}
	}
}
