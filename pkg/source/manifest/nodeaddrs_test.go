package manifest

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// TestSourceFollowsNodeAddresses: new NodePort addresses (the node's
// interfaces changed: SetNodeAddresses, from another goroutine) make a
// new state with the NodePort frontends on them, and without those of
// an address gone, re-translating the NodePort Service alone and reading
// no file.
func TestSourceFollowsNodeAddresses(t *testing.T) {
	dir := t.TempDir()
	nodePortA := strings.NewReplacer("spec:\n", "spec:\n  type: NodePort\n", "protocol: TCP}", "protocol: TCP, nodePort: 30080}").Replace(svcA)
	writeFile(t, dir, "a.yaml", nodePortA+"---\n"+strings.NewReplacer("name: a,", "name: b,", "10.96.0.1", "10.96.0.2").Replace(svcA))
	writeFile(t, dir, "slice.yaml", sliceA)
	st := newStates()
	opts := translate.Options{Node: translate.Node{Name: "node", Addresses: []netip.Addr{netip.MustParseAddr("192.168.1.1")}}}
	src := NewSource(dir, opts, slog.New(slog.DiscardHandler))
	src.debounce = 20 * time.Millisecond
	testutil.RunUntilCleanup(t, "Run", func(ctx context.Context) error { return src.Run(ctx, st.apply) })
	l := src.loader

	first := st.waitUntil(t, "the first state", func(s string) bool { return strings.Contains(s, "192.168.1.1:") })
	if strings.Contains(first, "192.168.7.12") {
		t.Fatalf("first state:\n%s", first)
	}
	reads, translated := l.reads.Load(), l.translated

	src.SetNodeAddresses([]netip.Addr{netip.MustParseAddr("192.168.1.1"), netip.MustParseAddr("192.168.7.12")})
	got := st.waitUntil(t, "a NodePort on the new address", func(s string) bool { return strings.Contains(s, "192.168.7.12:") })
	if !strings.Contains(got, "192.168.1.1:") || !strings.Contains(got, "10.96.0.2:80") {
		t.Errorf("the other frontends lost:\n%s", got)
	}
	if n := l.translated - translated; n != 1 {
		t.Errorf("%d Services translated again, want 1 (the NodePort one)", n)
	}
	if n := l.reads.Load() - reads; n != 0 {
		t.Errorf("%d files read again, want none", n)
	}

	src.SetNodeAddresses([]netip.Addr{netip.MustParseAddr("192.168.7.12")})
	got = st.waitUntil(t, "the NodePort of the address gone removed", func(s string) bool { return !strings.Contains(s, "192.168.1.1:") })
	if !strings.Contains(got, "192.168.7.12:") {
		t.Errorf("the NodePort of the address kept lost:\n%s", got)
	}
}
