package runner

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/internal/testutil"
)

func TestParseKnown(t *testing.T) {
	k, err := ParseKnown(strings.NewReader("# header\n\na/b/flow one  # reason one\na/b/flow: two  # reason # two\n"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(k.Order, []string{"a/b/flow one", "a/b/flow: two"}) || k.Reasons["a/b/flow: two"] != "reason # two" {
		t.Errorf("parsed %+v", k)
	}
	for _, bad := range []string{"a/b/flow without reason\n", "a/b/x  # r\na/b/x  # again\n", "a/b/x  # \n"} {
		if _, err := ParseKnown(strings.NewReader(bad)); err == nil {
			t.Errorf("ParseKnown(%q) accepted it", bad)
		}
	}
}

func TestCompareOnlyShrinks(t *testing.T) {
	k, err := ParseKnown(strings.NewReader("c/known fail  # r\nc/now passes  # r\nc/gone  # r\nc/skipped  # r\nc/not run  # r\n"))
	if err != nil {
		t.Fatal(err)
	}
	all := map[string]bool{"c/known fail": true, "c/now passes": true, "c/skipped": true, "c/not run": true, "c/new fail": true, "c/pass": true}
	results := []*FlowResult{
		{ID: "c/known fail", Class: "got DROP"},
		{ID: "c/now passes", Pass: true},
		{ID: "c/skipped", Skip: "SCTP"},
		{ID: "c/new fail", Class: "got REJECT"},
		{ID: "c/pass", Pass: true},
	}
	errs := Compare(k, all, results)
	want := []string{"c/new fail: fails and is not a known failure", "c/now passes: passes now", "c/gone: listed in known-failures but no such flow", "c/skipped: listed in known-failures but skipped"}
	if len(errs) != len(want) {
		t.Fatalf("Compare = %q, want %d errors", errs, len(want))
	}
	for _, w := range want {
		if !slices.ContainsFunc(errs, func(e string) bool { return strings.HasPrefix(e, w) }) {
			t.Errorf("Compare = %q, lacks %q", errs, w)
		}
	}

	// The rewritten list: this run's failures (listed reasons kept),
	// listed flows that did not run; nothing that passed, went or is
	// skipped.
	got := UpdateKnown(k, all, results, []string{"c/known fail", "c/now passes", "c/skipped", "c/not run", "c/new fail", "c/pass"})
	body := strings.TrimPrefix(got, knownHeader)
	if body != "c/known fail  # r\nc/not run  # r\nc/new fail  # got REJECT\n" {
		t.Errorf("UpdateKnown =\n%s", body)
	}
	if k2, err := ParseKnown(strings.NewReader(got)); err != nil || len(k2.Order) != 3 {
		t.Errorf("UpdateKnown's output does not parse back: %v %+v", err, k2)
	}
}

func TestReport(t *testing.T) {
	results := []*FlowResult{
		{ID: "f/c/a", Case: "f/c", Step: "initial", Flow: "a", Expected: "[10.0.0.1:80] masquerade=false", Observed: "x", Pass: true, Unsupported: []string{"--cluster-cidr"}},
		{ID: "f/c/b", Case: "f/c", Step: "initial", Flow: "b | pipe", Expected: "DROP", Observed: "REJECT", Class: "got REJECT", Why: "got REJECT", Unsupported: []string{"--cluster-cidr"}},
		{ID: "f/c/c", Case: "f/c", Step: "initial", Flow: "c", Expected: "REJECT", Skip: "SCTP", Derived: true},
		{ID: "f/c6/a", Case: "f/c6", Step: "initial", Flow: "a", Expected: "REJECT", Observed: "REJECT", Pass: true, Derived: true, IPv6: true},
		{ID: "f/c6/b", Case: "f/c6", Step: "initial", Flow: "b", Expected: "REJECT", Observed: "DROP", Class: "got DROP", Derived: true, IPv6: true},
	}
	s := Summarize(results)
	if s.Run != 4 || s.Pass != 2 || s.Skipped != 1 || s.IPv6 != 2 || s.IPv6Pass != 1 || s.Classes["want DROP: got REJECT"] != 1 || s.Unsupported["--cluster-cidr"] != 2 {
		t.Errorf("Summarize = %+v", s)
	}
	if want := "2 of 4 flows get the expected answer (kube-proxy's, or a documented deviation): 1 of 2 ported from kube-proxy, 1 of 2 derived; 1 of 2 IPv4, 1 of 2 IPv6; 1 skipped"; s.Line() != want {
		t.Errorf("Line = %q", s.Line())
	}
	var b bytes.Buffer
	if err := WriteReport(&b, "header", results); err != nil {
		t.Fatal(err)
	}
	testutil.ContainsAll(t, "report", b.String(), "**2 of 4 flows", "| want DROP: got REJECT | 1 |", `b \| pipe`, "skipped: SCTP", "Run without `--cluster-cidr`")
}
