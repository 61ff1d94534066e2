package reconciler

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/sluice-lb/sluice/pkg/model"
)

// String dumps ks as sorted text, one map entry a line, the way Cilium's
// DumpLBMaps does: the service map (each frontend's master, then its slots
// with the backend each names), the backends, the reverse-NAT entries and,
// when the maps hold any, the source ranges, the service IPs and the
// service CIDRs. It is the
// one text form of the maps: the golden files, fakedp.Fake.String and
// `sluicectl services --raw` all print it, so a golden case reads the same
// against the fake and against real pinned maps. A frontend's internal
// scope (two-scope frontends) is printed after its address, before its
// default scope, in the order they are programmed.
func (ks *KernelState) String() string {
	var sb strings.Builder
	fes := map[Frontend]bool{}
	for fe := range ks.Masters {
		fes[fe] = true
	}
	for fe := range ks.Slots {
		fes[fe] = true
	}
	sb.WriteString("services:\n")
	for _, fe := range slices.SortedFunc(maps.Keys(fes), Frontend.Compare) {
		if m, ok := ks.Masters[fe]; ok {
			fmt.Fprintf(&sb, "  %s [0] id=%d count=%d flags=%#x", fe, m.ID, m.Count, m.Flags)
			// Only when set, so that states without session
			// affinity read as they always have.
			if m.AffinityTimeout != 0 {
				fmt.Fprintf(&sb, " affinity=%ds", m.AffinityTimeout)
			}
			sb.WriteString("\n")
		} else {
			fmt.Fprintf(&sb, "  %s [0] (no master)\n", fe)
		}
		for _, s := range slices.Sorted(maps.Keys(ks.Slots[fe])) {
			id := ks.Slots[fe][s]
			desc := "(missing)"
			if b, ok := ks.Backends[id]; ok {
				desc = b.String()
			}
			fmt.Fprintf(&sb, "  %s [%d] backend=%d %s\n", fe, s, id, desc)
		}
	}
	sb.WriteString("backends:\n")
	for _, id := range slices.Sorted(maps.Keys(ks.Backends)) {
		fmt.Fprintf(&sb, "  %d %s\n", id, ks.Backends[id])
	}
	sb.WriteString("rev_nat:\n")
	for _, id := range slices.Sorted(maps.Keys(ks.RevNat)) {
		fmt.Fprintf(&sb, "  %d %s\n", id, ks.RevNat[id])
	}
	// Omitted when empty, so that states without LoadBalancer source
	// ranges (most golden cases) read as they always have.
	n := 0
	for _, ps := range ks.SourceRanges {
		n += len(ps)
	}
	if n > 0 {
		sb.WriteString("src_ranges:\n")
		for _, fe := range slices.SortedFunc(maps.Keys(ks.SourceRanges), model.L4Addr.Compare) {
			for _, p := range slices.SortedFunc(slices.Values(ks.SourceRanges[fe]), netip.Prefix.Compare) {
				fmt.Fprintf(&sb, "  %s %s\n", fe, p)
			}
		}
	}
	if len(ks.ServiceIPs) > 0 {
		sb.WriteString("service_ips:\n")
		for _, a := range slices.SortedFunc(slices.Values(ks.ServiceIPs), netip.Addr.Compare) {
			fmt.Fprintf(&sb, "  %s\n", a)
		}
	}
	// Omitted when empty, as the two above.
	if len(ks.ServiceCIDRs) > 0 {
		sb.WriteString("service_cidrs:\n")
		for _, p := range slices.SortedFunc(slices.Values(ks.ServiceCIDRs), netip.Prefix.Compare) {
			fmt.Fprintf(&sb, "  %s\n", p)
		}
	}
	return sb.String()
}
