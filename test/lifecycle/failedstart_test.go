package lifecycle

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
)

// pinIDs returns the maps the agent pinned (links/ aside), by pin name:
// the id of each.
func (e *env) pinIDs(t *testing.T) map[string]ebpf.MapID {
	t.Helper()
	dir := filepath.Join(e.bpffs, "sluice")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]ebpf.MapID{}
	for _, en := range entries {
		if en.IsDir() {
			continue
		}
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, en.Name()), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			t.Fatalf("pin %s: %v", en.Name(), err)
		}
		info, err := m.Info()
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		out[en.Name()] = id
	}
	return out
}

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
	if err := testutil.Poll(30*time.Second, func() error {
		if a.Exited() == nil {
			return fmt.Errorf("still running")
		}
		return nil
	}); err != nil {
		t.Fatalf("the agent with a missing device did not stop: %v", err)
	}
	if want := "attach to sl-nosuch0"; !strings.Contains(a.Log.String(), want) {
		t.Errorf("the failed agent's log does not say %q:\n%s", want, a.Log.String())
	}
	if got := e.pinIDs(t); !maps.Equal(got, before) {
		for name, id := range got {
			if before[name] != id {
				t.Errorf("after the failed start, pin %s names map %d, was %d (0: none)", name, id, before[name])
			}
		}
		for name, id := range before {
			if _, ok := got[name]; !ok {
				t.Errorf("after the failed start, pin %s (map %d) is gone", name, id)
			}
		}
	}
	time.Sleep(2 * time.Second) // load on the datapath alone
	a.Args = withFlag(args, "max-conntrack", "131072")
	startReady(t, a)
	time.Sleep(2 * time.Second) // load on the agent started again
	l.stop(t, what)
	if got := e.pinnedSize(t, "sluice_conntrack_v2"); got != 131072 {
		t.Errorf("after the next start, sluice_conntrack_v2 has %d entries, want 131072", got)
	}
}
