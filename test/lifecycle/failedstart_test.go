package lifecycle

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
)

// TestFailedResizeStartUnderLoad: an agent restarted with a larger
// --max-conntrack fails after it resized the conntrack tables (a device
// in --devices that does not exist): every pin names the map it named
// before, the previous agent's programs go on writing those maps, and an
// agent started again with that size and the right devices resizes them
// again, carrying the flows started while no agent ran. Not one
// connection fails across the three. Before, the failed start left the
// pins naming its copies, and the next start, whose sizes then matched,
// opened them without the flows added since.
func TestFailedResizeStartUnderLoad(t *testing.T) {
	e := setup(t)
	failedStartUnderLoad(t, e, "--max-conntrack=131072 failed at attach", []string{e.lb.NodeDev, "sl-nosuch0"},
		"attach to sl-nosuch0", nil)
}

// TestFailedStartAfterLinkUpdateUnderLoad (issue 14, thirty-ninth pass):
// the same, with the start failing after it updated its first link:
// eth0's ingress runs the new program when the second device of
// --devices fails (its link's pin cannot be read: a directory there). The
// failed start puts eth0's previous programs back before the pins: the
// old programs run on the old maps again, and not one connection fails.
// Before, the start committed before its first link update: eth0's
// ingress ran the new programs on the new maps and its egress the old
// ones on the old maps until the next start, which lost what those wrote.
func TestFailedStartAfterLinkUpdateUnderLoad(t *testing.T) {
	e := setup(t)
	bad := e.lb.NodeBackendDevs[0]
	// The program eth0's pinned ingress link runs.
	ingress := func() ebpf.ProgramID {
		t.Helper()
		l, err := link.LoadPinnedLink(filepath.Join(e.bpffs, "sluice", "links", "tcx_ingress_"+e.lb.NodeDev), nil)
		if err == nil {
			defer l.Close()
			var info *link.Info
			if info, err = l.Info(); err == nil {
				return info.Program
			}
		}
		t.Fatalf("eth0's ingress link: %v", err)
		return 0
	}
	var prev ebpf.ProgramID
	failedStartUnderLoad(t, e, "--max-conntrack=131072 failed after eth0's link update", []string{e.lb.NodeDev, bad},
		"tcx_ingress_"+bad, func(failed bool) {
			dir := filepath.Join(e.bpffs, "sluice", "links", "tcx_ingress_"+bad)
			if !failed {
				prev = ingress()
				if err := os.Mkdir(dir, 0o700); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err := os.Remove(dir); err != nil {
				t.Fatal(err)
			}
			if got := ingress(); got != prev {
				t.Errorf("after the failed start, %s's ingress runs program %d, want the previous agent's %d", e.lb.NodeDev, got, prev)
			}
		})
}

// failedStartUnderLoad runs an agent with --max-conntrack=65536 under
// load, stops it and starts one with 131072 and devices, which must fail
// (its log saying wantLog) leaving the pins as they were, then the agent
// again with 131072: not one connection fails (what names the change).
// around, if set, is called before the failing start (false) and after it
// (true).
func failedStartUnderLoad(t *testing.T, e *env, what string, devices []string, wantLog string, around func(failed bool)) {
	t.Helper()
	cur := agentproc.Shared(t)
	a := e.agent(t, cur, []string{e.lb.NodeDev}, "--max-conntrack=65536")
	startReady(t, a)
	args := a.Args
	before := e.pinIDs(t)

	l := e.startLoad(t, 2*time.Millisecond)
	time.Sleep(2 * time.Second) // load on the first agent
	if err := a.Stop(); err != nil {
		t.Fatalf("agent did not exit cleanly: %v", err)
	}
	if around != nil {
		around(false)
	}
	// --node-ip, or the agent looks for the devices' addresses and
	// stops before it opens the datapath.
	a.Args = withFlag(withFlag(withFlag(args, "max-conntrack", "131072"), "devices", strings.Join(devices, ",")),
		"node-ip", e.lb.NodeAddr.String())
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	waitExited(t, a, "the agent whose start fails")
	if !strings.Contains(a.Log.String(), wantLog) {
		t.Errorf("the failed agent's log does not say %q:\n%s", wantLog, a.Log.String())
	}
	if around != nil {
		around(true)
	}
	testutil.SamePinnedMaps(t, "after the failed start", e.pinIDs(t), before)
	time.Sleep(2 * time.Second) // load on the datapath alone
	a.Args = withFlag(args, "max-conntrack", "131072")
	startReady(t, a)
	time.Sleep(2 * time.Second) // load on the agent started again
	l.stop(t, what)
	if got := e.pinnedSize(t, "sluice_conntrack_v2"); got != 131072 {
		t.Errorf("after the next start, sluice_conntrack_v2 has %d entries, want 131072", got)
	}
}

// pinIDs returns the maps the agent pinned, by pin name: the id of each.
func (e *env) pinIDs(t *testing.T) map[string]ebpf.MapID {
	t.Helper()
	return testutil.PinnedMapIDs(t, filepath.Join(e.bpffs, "sluice"))
}
