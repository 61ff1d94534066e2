package runner

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
)

// Known failures: the flows Sluice does not yet answer as expected, one a
// line as "<case>/<flow>  # <reason>". The list only shrinks: a flow that
// fails and is not listed fails the run, and so does a listed flow that
// passes (remove it) or that does not exist.

// knownSep separates a flow's ID from the reason in known-failures.txt.
const knownSep = "  # "

// Known is the parsed known-failures list.
type Known struct {
	// Reasons maps a flow's ID to why it fails.
	Reasons map[string]string
	// Order is the IDs as listed.
	Order []string
}

// ParseKnown reads a known-failures list: comment lines start with "#".
func ParseKnown(r io.Reader) (*Known, error) {
	k := &Known{Reasons: map[string]string{}}
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		id, reason, ok := strings.Cut(sc.Text(), knownSep)
		id, reason = strings.TrimSpace(id), strings.TrimSpace(reason)
		if !ok || reason == "" {
			return nil, fmt.Errorf("line %d: want <case>/<flow>%s<reason>, got %q", line, knownSep, l)
		}
		if _, dup := k.Reasons[id]; dup {
			return nil, fmt.Errorf("line %d: %s listed twice", line, id)
		}
		k.Reasons[id] = reason
		k.Order = append(k.Order, id)
	}
	return k, sc.Err()
}

// knownHeader heads the known-failures file.
const knownHeader = `# Packet-flow corpus flows that Sluice does not answer as expected yet:
# the work list of issue 9. One flow a line: <case>/<flow>  # <reason>.
#
# test/flows/runner fails when a flow fails that is not listed here, and
# when a listed flow passes (remove its line: the list only shrinks) or no
# longer exists. SLUICE_FLOWS_UPDATE_KNOWN=1 rewrites the file from a run,
# keeping the reasons of the lines that stay. See test/flows/README.md.
`

// Compare checks the results of a run against the known failures. all
// holds every flow ID of the corpus (to catch listed flows that do not
// exist); results only the flows that ran (a subset may run).
func Compare(k *Known, all map[string]bool, results []*FlowResult) []string {
	var errs []string
	ran := map[string]*FlowResult{}
	for _, r := range results {
		ran[r.ID] = r
	}
	for _, r := range results {
		if r.Skip != "" || r.Pass {
			continue
		}
		if _, listed := k.Reasons[r.ID]; !listed {
			errs = append(errs, fmt.Sprintf("%s: fails and is not a known failure: expected %s, observed %s: %s", r.ID, r.Expected, r.Observed, r.Why))
		}
	}
	for _, id := range k.Order {
		r, ok := ran[id]
		switch {
		case !all[id]:
			errs = append(errs, fmt.Sprintf("%s: listed in known-failures but no such flow", id))
		case !ok:
		case r.Skip != "":
			errs = append(errs, fmt.Sprintf("%s: listed in known-failures but skipped by the corpus (%s): remove it", id, r.Skip))
		case r.Pass:
			errs = append(errs, fmt.Sprintf("%s: passes now: remove it from known-failures", id))
		}
	}
	return errs
}

// UpdateKnown returns the known-failures file for the run: the flows that
// failed (with their listed reason, or the failure's class), and the
// listed flows that did not run.
func UpdateKnown(k *Known, all map[string]bool, results []*FlowResult, order []string) string {
	ran := map[string]bool{}
	reasons := map[string]string{}
	for _, r := range results {
		ran[r.ID] = true
		if r.Skip == "" && !r.Pass {
			reasons[r.ID] = cmp.Or(k.Reasons[r.ID], autoReason(r))
		}
	}
	for id, why := range k.Reasons {
		if !ran[id] && all[id] {
			reasons[id] = why
		}
	}
	var b strings.Builder
	b.WriteString(knownHeader)
	for _, id := range order {
		if why, ok := reasons[id]; ok {
			fmt.Fprintf(&b, "%s%s%s\n", id, knownSep, why)
		}
	}
	return b.String()
}

func autoReason(r *FlowResult) string {
	why := r.Class
	if len(r.Unsupported) > 0 {
		why += " (run without " + strings.Join(r.Unsupported, ", ") + ")"
	}
	return why
}

// Summary counts a run's results.
type Summary struct {
	Run, Pass, Skipped   int
	Ported, PortedPass   int
	Derived, DerivedPass int
	IPv6, IPv6Pass       int            // flows of IPv6 cases (the rest are IPv4)
	Unsupported          map[string]int // flows run without a flag
	UnsupportedPass      int
	Classes              map[string]int
}

// Summarize counts results.
func Summarize(results []*FlowResult) Summary {
	s := Summary{Unsupported: map[string]int{}, Classes: map[string]int{}}
	for _, r := range results {
		if r.Skip != "" {
			s.Skipped++
			continue
		}
		count(r, &s.Run, &s.Ported, &s.Derived, &s.IPv6)
		for _, f := range r.Unsupported {
			s.Unsupported[f]++
		}
		if r.Pass {
			count(r, &s.Pass, &s.PortedPass, &s.DerivedPass, &s.IPv6Pass)
			if len(r.Unsupported) > 0 {
				s.UnsupportedPass++
			}
			continue
		}
		s.Classes[expectKind(r)+": "+r.Class]++
	}
	return s
}

// count adds r to a total and to the counts of its kinds: ported from
// kube-proxy or derived, and IPv6.
func count(r *FlowResult, total, ported, derived, ipv6 *int) {
	*total++
	if r.Derived {
		*derived++
	} else {
		*ported++
	}
	if r.IPv6 {
		*ipv6++
	}
}

// Line is the run's one-line summary.
func (s Summary) Line() string {
	return fmt.Sprintf("%d of %d flows get the expected answer (kube-proxy's, or a documented deviation): %d of %d ported from kube-proxy, %d of %d derived; %d of %d IPv4, %d of %d IPv6; %d skipped",
		s.Pass, s.Run, s.PortedPass, s.Ported, s.DerivedPass, s.Derived, s.Pass-s.IPv6Pass, s.Run-s.IPv6, s.IPv6Pass, s.IPv6, s.Skipped)
}

// expectKind is the kind of answer a flow expects.
func expectKind(r *FlowResult) string {
	e := r.Expected
	if strings.HasPrefix(e, "[") {
		return "want endpoints"
	}
	v, _, _ := strings.Cut(e, "(")
	return "want " + v
}

// WriteReport writes the run as Markdown: the summary, the failures by
// class, and every flow.
func WriteReport(out io.Writer, header string, results []*FlowResult) error {
	w := &errWriter{w: out}
	s := Summarize(results)
	w.printf("# Packet-flow results\n\n%s\n\n**%s.**\n\n", header, s.Line())
	if len(s.Unsupported) > 0 {
		flags := slices.Sorted(maps.Keys(s.Unsupported))
		var parts []string
		for _, f := range flags {
			parts = append(parts, fmt.Sprintf("`%s` (%d flows)", f, s.Unsupported[f]))
		}
		w.printf("The agent does not know %s: those flows ran without the setting (%d of them passed anyway).\n\n",
			strings.Join(parts, ", "), s.UnsupportedPass)
	}
	if len(s.Classes) > 0 {
		w.printf("## Failures by class\n\n| class | flows |\n|---|---:|\n")
		classes := slices.SortedFunc(maps.Keys(s.Classes), func(a, b string) int {
			return cmp.Or(cmp.Compare(s.Classes[b], s.Classes[a]), cmp.Compare(a, b))
		})
		for _, c := range classes {
			w.printf("| %s | %d |\n", cell(c), s.Classes[c])
		}
		w.printf("\n")
	}
	w.printf("## Every flow\n")
	lastCase, lastStep := "", ""
	for _, r := range results {
		if r.Case != lastCase {
			w.printf("\n### %s\n", r.Case)
			if len(r.Unsupported) > 0 {
				w.printf("\nRun without `%s`: the agent does not know it.\n", strings.Join(r.Unsupported, "`, `"))
			}
			lastCase, lastStep = r.Case, ""
		}
		if r.Step != lastStep {
			w.printf("\nStep **%s**\n\n| flow | from | to | expected | observed | result |\n|---|---|---|---|---|---|\n", r.Step)
			lastStep = r.Step
		}
		result := "pass"
		switch {
		case r.Skip != "":
			result = "skipped: " + r.Skip
		case !r.Pass:
			result = "**FAIL** (" + r.Class + "): " + r.Why
		}
		exp := r.Expected
		if r.Deviation {
			exp += " (deviation)"
		}
		w.printf("| %s | %s | %s | %s | %s | %s |\n", cell(r.Flow), cell(r.Source), cell(r.Destination), cell(exp), cell(r.Observed), cell(result))
	}
	return w.err
}

// errWriter keeps the first error of a sequence of writes, so that a
// report is written straight through and its error checked once.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, args ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, args...)
	}
}

func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(strings.TrimSpace(s), "\n", "<br>")
}

// readKnown reads the known-failures file (missing: none known).
func readKnown(path string) (*Known, error) {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return &Known{Reasons: map[string]string{}}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseKnown(f)
}
