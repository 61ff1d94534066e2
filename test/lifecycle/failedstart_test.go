package lifecycle

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

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
	cur := agentproc.Shared(t)
	a := e.agent(t, cur, []string{e.lb.NodeDev}, "--max-conntrack=65536")
	startReady(t, a)
	args := a.Args
	before := e.pinIDs(t)
	const what = "--max-conntrack=131072 failed at attach"

	l := e.startLoad(t, 2*time.Millisecond)
	time.Sleep(2 * time.Second) // load on the first agent
	if err := a.Stop(); err != nil {
		t.Fatalf("agent did not exit cleanly: %v", err)
	}
	// --node-ip, or the agent looks for the devices' addresses and
	// stops before it opens the datapath.
	a.Args = withFlag(withFlag(withFlag(args, "max-conntrack", "131072"), "devices", e.lb.NodeDev+",sl-nosuch0"),
		"node-ip", e.lb.NodeAddr.String())
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	waitExited(t, a, "the agent with a missing device")
	if want := "attach to sl-nosuch0"; !strings.Contains(a.Log.String(), want) {
		t.Errorf("the failed agent's log does not say %q:\n%s", want, a.Log.String())
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
