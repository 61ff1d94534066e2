package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// -o wide adds columns, still sorted and aligned: services their kind and
// decoded flags, backends how many frontends use them, conntrack the ids
// the entries name.
func TestWideOutput(t *testing.T) {
	base := liveArgs(t)
	lines := func(args ...string) []string {
		t.Helper()
		return strings.Split(strings.TrimRight(runOK(t, append(append([]string{}, base...), args...)...), "\n"), "\n")
	}
	fields := func(line string) []string { return regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(line), -1) }

	svc := lines("services", "-o", "wide")
	if len(svc) != 3 || strings.Join(fields(svc[0]), "|") != "FRONTEND|SERVICE|KIND|ID|COUNT|FLAGS|BACKENDS" {
		t.Fatalf("services -o wide:\n%s", strings.Join(svc, "\n"))
	}
	if f := fields(svc[1]); f[0] != "10.96.0.10:80/TCP" || f[1] != "default/web:http" || f[2] != "ClusterIP" || f[5] != "-" {
		t.Errorf("services -o wide, web's line %q: want its kind and no flags", svc[1])
	}
	// Columns align: every line's SERVICE column starts where the
	// header's does.
	col := strings.Index(svc[0], "SERVICE")
	for _, l := range svc[1:] {
		if l[col-2:col] != "  " || l[col] == ' ' {
			t.Errorf("services -o wide: line %q not aligned on column %d", l, col)
		}
	}

	be := lines("backends", "-o", "wide")
	if len(be) != 4 || !strings.HasSuffix(strings.TrimSpace(be[0]), "USERS") {
		t.Fatalf("backends -o wide:\n%s", strings.Join(be, "\n"))
	}
	for _, l := range be[1:] {
		if f := fields(l); f[len(f)-1] != "1" {
			t.Errorf("backends -o wide: %q, want 1 user each", l)
		}
	}

	ct := lines("conntrack", "-o", "wide", "--port", "40000")
	if len(ct) != 3 || !strings.HasSuffix(strings.TrimSpace(ct[0]), "SERVICE-ID  BACKEND-ID") {
		t.Fatalf("conntrack -o wide:\n%s", strings.Join(ct, "\n"))
	}
	rows := decode[[]ConntrackRow](t, runOK(t, append(base, "conntrack", "-o", "json", "--port", "40000")...))
	for i, l := range ct[1:] {
		f := fields(l)
		if got, want := f[len(f)-2]+" "+f[len(f)-1], itoa(rows[i].ServiceID)+" "+itoa(rows[i].BackendID); got != want {
			t.Errorf("conntrack -o wide line %q: ids %q, want %q as -o json says", l, got, want)
		}
	}
}

func itoa(n uint32) string { return strconv.Itoa(int(n)) }
