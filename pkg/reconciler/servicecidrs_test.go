package reconciler_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/reconciler/fakedp"
)

func withCIDRs(st *model.State, cidrs ...string) *model.State {
	st.HasServiceCIDRs = true
	st.ServiceCIDRs = nil
	for _, c := range cidrs {
		st.ServiceCIDRs = append(st.ServiceCIDRs, netip.MustParsePrefix(c))
	}
	return st
}

// The service CIDRs a state names are written after its frontends, once,
// and rewritten only when they change, a write fails or the maps are read
// again; a state that names none (the manifest source) leaves them.
func TestServiceCIDRsFollowTheState(t *testing.T) {
	f := newRecordingFake(t)
	r := reconciler.New(f, nil)
	web := svc(vip(1), "web", be(1, 1, model.TCP))
	if err := r.Apply(withCIDRs(state(web), "10.96.0.0/16", "fd00::/108")); err != nil {
		t.Fatal(err)
	}
	if got := f.Ops[len(f.Ops)-1].String(); got != "SetServiceCIDRs [10.96.0.0/16 fd00::/108]" {
		t.Errorf("last write = %s, want the service CIDRs, after the frontend's", got)
	}
	if d := f.String(); !strings.Contains(d, "service_cidrs:\n  10.96.0.0/16\n  fd00::/108\n") {
		t.Errorf("dump without the service CIDRs:\n%s", d)
	}

	f.ResetCounts()
	if err := r.Apply(withCIDRs(state(web), "10.96.0.0/16", "fd00::/108")); err != nil {
		t.Fatal(err)
	}
	if err := r.Apply(state(web)); err != nil { // names none: left as they are
		t.Fatal(err)
	}
	if n := f.Writes(); n != 0 {
		t.Errorf("%d writes for the same CIDRs, and for a state naming none; want 0", n)
	}
	if ks, _ := f.Dump(); len(ks.ServiceCIDRs) != 2 {
		t.Errorf("a state naming no CIDRs changed them: %v", ks.ServiceCIDRs)
	}

	// A failed write is retried by the next Apply.
	f.Fail = func(op fakedp.Op) error {
		if op.Kind == fakedp.OpSetServiceCIDRs {
			return errors.New("injected")
		}
		return nil
	}
	if err := r.Apply(withCIDRs(state(web), "10.96.0.0/16")); err == nil || r.InSync() {
		t.Fatalf("Apply = %v, InSync %v; want the injected failure", err, r.InSync())
	}
	f.Fail = nil
	if err := r.Apply(withCIDRs(state(web), "10.96.0.0/16")); err != nil {
		t.Fatal(err)
	}
	if ks, _ := f.Dump(); len(ks.ServiceCIDRs) != 1 || ks.ServiceCIDRs[0] != netip.MustParsePrefix("10.96.0.0/16") {
		t.Errorf("service CIDRs after the retry = %v, want [10.96.0.0/16]", ks.ServiceCIDRs)
	}

	// Drift: a re-read of the maps writes them again.
	ks := mustDump(t, f)
	ks.ServiceCIDRs = nil
	f.Seed(ks)
	r.SetRefreshInterval(time.Nanosecond)
	time.Sleep(time.Millisecond)
	if err := r.Apply(withCIDRs(state(web), "10.96.0.0/16")); err != nil {
		t.Fatal(err)
	}
	if ks := mustDump(t, f); len(ks.ServiceCIDRs) != 1 {
		t.Errorf("service CIDRs deleted behind the reconciler's back not rewritten: %v", ks.ServiceCIDRs)
	}
}

func mustDump(t *testing.T, f *fakedp.Fake) *reconciler.KernelState {
	t.Helper()
	ks, err := f.Dump()
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

// A restarted agent reads the service CIDRs back (Restore): a first state
// naming the same ones writes nothing, one naming others writes them.
func TestServiceCIDRsRestored(t *testing.T) {
	f := newFake(t)
	web := svc(vip(1), "web", be(1, 1, model.TCP))
	if err := reconciler.New(f, nil).Apply(withCIDRs(state(web), "10.96.0.0/16")); err != nil {
		t.Fatal(err)
	}
	f.ResetCounts()
	r := reconciler.New(f, nil)
	if err := r.Restore(); err != nil {
		t.Fatal(err)
	}
	if err := r.Apply(withCIDRs(state(web), "10.96.0.0/16")); err != nil {
		t.Fatal(err)
	}
	if n := f.Writes(); n != 0 {
		t.Errorf("%d writes after a restart for the same state and CIDRs, want 0", n)
	}
	if err := r.Apply(withCIDRs(state(web), "10.96.0.0/12")); err != nil {
		t.Fatal(err)
	}
	if n := f.Count(fakedp.OpSetServiceCIDRs); n != 1 {
		t.Errorf("%d writes of the service CIDRs for other CIDRs, want 1", n)
	}
}

// A set of service CIDRs the datapath refuses for its size fails no
// Apply (the frontends are programmed, the agent in sync), is logged once
// at Error, and is not written again until the set changes.
func TestServiceCIDRsOverCapacity(t *testing.T) {
	f := newRecordingFake(t)
	var logged bytes.Buffer
	r := reconciler.New(f, slog.New(slog.NewTextHandler(&logged, nil)))
	web := svc(vip(1), "web", be(1, 1, model.TCP))
	if err := r.Apply(withCIDRs(state(web), "10.96.0.0/16")); err != nil {
		t.Fatal(err)
	}
	tries := 0
	f.Fail = func(op fakedp.Op) error {
		if op.Kind == fakedp.OpSetServiceCIDRs && len(op.Prefixes) > 2 {
			tries++
			return fmt.Errorf("%w: sluice_node_cidrs_v1 holds 2 IPv4 CIDRs at most", reconciler.ErrCapacity)
		}
		return nil
	}
	big := func() *model.State { return withCIDRs(state(web), "10.96.0.0/16", "10.97.0.0/16", "10.98.0.0/16") }
	for range 3 {
		if err := r.Apply(big()); err != nil || !r.InSync() {
			t.Fatalf("Apply = %v, InSync %v; want a refused set of CIDRs to fail no Apply", err, r.InSync())
		}
	}
	if tries != 1 {
		t.Errorf("%d writes of the refused set over three Applies, want 1", tries)
	}
	if n := strings.Count(logged.String(), "level=ERROR msg=\"service CIDRs"); n != 1 || !strings.Contains(logged.String(), "holds 2 IPv4 CIDRs at most") {
		t.Errorf("logged %d times, want once with the datapath's limit:\n%s", n, logged.String())
	}
	if ks := mustDump(t, f); len(ks.ServiceCIDRs) != 1 {
		t.Errorf("service CIDRs after the refused set = %v, want the previous one kept", ks.ServiceCIDRs)
	}
	if err := r.Apply(withCIDRs(state(web), "10.97.0.0/16")); err != nil {
		t.Fatal(err)
	}
	if ks := mustDump(t, f); len(ks.ServiceCIDRs) != 1 || ks.ServiceCIDRs[0] != netip.MustParsePrefix("10.97.0.0/16") {
		t.Errorf("service CIDRs after a set that fits = %v, want [10.97.0.0/16]", ks.ServiceCIDRs)
	}
}
