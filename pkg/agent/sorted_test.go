package agent

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// failuresOf is a failure map of n frontends, over Services whose names
// are prefixes of one another ("a" and "a-b" in namespace and name, ports
// named and not), the cases where the spelled order and a field-by-field
// order part.
func failuresOf(n int) map[model.L4Addr]*reconciler.FrontendError {
	names := []string{"a", "a-b", "a0", "ab", "b"}
	ports := []string{"", "p", "p-1", "q"}
	m := map[model.L4Addr]*reconciler.FrontendError{}
	for i := range n {
		fe := model.L4Addr{Addr: netip.AddrFrom4([4]byte{10, 96, byte(i >> 8), byte(i)}), Port: 80, Proto: model.TCP}
		svc := model.ServicePortName{
			Namespace: names[i%len(names)],
			Name:      names[(i/len(names))%len(names)] + fmt.Sprint(i%3),
			Port:      ports[(i/7)%len(ports)],
		}
		if i%11 == 0 {
			svc.Name = names[i%len(names)]
		}
		m[fe] = &reconciler.FrontendError{Service: svc, Frontend: fe}
	}
	return m
}

// sortedFailures orders by the Service as it is spelled ("ns/name:port"),
// then by frontend, as it did when it compared the spellings themselves.
func TestSortedFailuresOrder(t *testing.T) {
	m := failuresOf(500)
	m[model.L4Addr{Addr: netip.MustParseAddr("10.0.0.1"), Port: 1, Proto: model.TCP}] = &reconciler.FrontendError{
		Frontend: model.L4Addr{Addr: netip.MustParseAddr("10.0.0.1"), Port: 1, Proto: model.TCP}} // nobody's
	got := sortedFailures(m)
	if len(got) != len(m) {
		t.Fatalf("%d failures sorted of %d", len(got), len(m))
	}
	if !slices.IsSortedFunc(got, func(x, y *reconciler.FrontendError) int {
		if c := strings.Compare(x.Service.String(), y.Service.String()); c != 0 {
			return c
		}
		return x.Frontend.Compare(y.Frontend)
	}) {
		for i := 1; i < len(got); i++ {
			if x, y := got[i-1].Service.String(), got[i].Service.String(); x > y {
				t.Errorf("%q sorted before %q", x, y)
			}
		}
		t.Fatal("not in the spelled Services' order")
	}
}

// BenchmarkSortedFailures is the agent's sort of an apply's failures at
// scale: 3,000 frontends the maps left out.
func BenchmarkSortedFailures(b *testing.B) {
	m := failuresOf(3000)
	b.ReportAllocs()
	for b.Loop() {
		sortedFailures(m)
	}
}
