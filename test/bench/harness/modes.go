package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/test/bench/rules"
)

// Mode names.
const (
	ModeFloor    = "direct"
	ModeIptNft   = "iptables-nft"
	ModeIptLeg   = "iptables-legacy"
	ModeNft      = "nftables"
	ModeSluice   = "sluice"
	ModeKubeProx = "kube-proxy"

	// ModeSluiceBase is another build of the agent (BENCH_SLUICE_BASE, say
	// main's), run exactly as ModeSluice and interleaved with it, so that a
	// change is measured against its base in the same rounds.
	ModeSluiceBase = "sluice-base"
)

// errTimeout marks a programming step that ran into its bound.
type errTimeout struct{ bound time.Duration }

func (e errTimeout) Error() string { return fmt.Sprintf("timeout > %.0f s", e.bound.Seconds()) }

// mode is one way of making VIPs reach backends in a triple's node namespace.
type mode interface {
	// program loads svcs into an empty datapath; it returns once the
	// programming command returned (an agent may still be working).
	program(ctx context.Context, svcs []rules.Service) error
	// update moves the datapath from old to new, where only service k
	// differs.
	update(ctx context.Context, all []rules.Service, old, new rules.Service) error
	// reset empties the datapath.
	reset(ctx context.Context) error
	// memory reports what the mode's state costs.
	memory() memStat
	// socketCgroup is the cgroup v2 directory a node-local client must run
	// in for the mode to apply to it; nil when any process is covered.
	socketCgroup() *topology.Cgroup
	close()
}

type memStat struct {
	KernelBytes int64  `json:"kernel_bytes,omitempty"` // ruleset or BPF map memory
	AgentRSS    int64  `json:"agent_rss_bytes,omitempty"`
	How         string `json:"how"`

	// AgentPeakRSS is the agent's VmHWM: its largest RSS so far.
	AgentPeakRSS int64 `json:"agent_peak_rss_bytes,omitempty"`
}

// floor programs nothing: clients connect to backends directly.
type floorMode struct{}

func (floorMode) program(context.Context, []rules.Service) error { return nil }
func (floorMode) update(context.Context, []rules.Service, rules.Service, rules.Service) error {
	return errors.ErrUnsupported
}
func (floorMode) reset(context.Context) error    { return nil }
func (floorMode) memory() memStat                { return memStat{How: "no state"} }
func (floorMode) socketCgroup() *topology.Cgroup { return nil }
func (floorMode) close()                         {}

// runBounded runs argv in namespace ns under `timeout`, inside cg if set.
func runBounded(ctx context.Context, ns *topology.NS, bound time.Duration, cg *memcg, argv ...string) error {
	full := append([]string{"timeout", "--kill-after=5", fmt.Sprintf("%.0f", bound.Seconds())}, argv...)
	full = cg.wrap(full)
	cmd := ns.Command(ctx, full[0], full[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) && (ee.ExitCode() == 124 || ee.ExitCode() == 137) {
		return errTimeout{bound}
	}
	if err != nil {
		msg := strings.TrimSpace(errb.String())
		if len(msg) > 400 {
			msg = msg[:400] + "..."
		}
		return fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, msg)
	}
	return nil
}

// ruleLoader is what the iptables and nftables modes share: the node
// namespace they load rules into, how long loading may take, and the memory
// cgroup the loading tool runs in, whose kernel memory is the mode's.
type ruleLoader struct {
	ns        *topology.NS
	fam       rules.Family
	bound     time.Duration // updates
	loadBound time.Duration // the initial load
	cg        *memcg
	tmp       string
	tool      string // the loading tool, as memory() names it
}

// load writes data to file in the temporary directory and runs argv with
// the file's path appended, in the memory cgroup.
func (l *ruleLoader) load(ctx context.Context, file string, data []byte, bound time.Duration, argv ...string) error {
	f := filepath.Join(l.tmp, file)
	if err := os.WriteFile(f, data, 0o644); err != nil {
		return err
	}
	return runBounded(ctx, l.ns, bound, l.cg, append(argv, f)...)
}

func (l *ruleLoader) memory() memStat {
	b, err := l.cg.kernelBytes()
	if err != nil {
		return memStat{How: "unavailable: " + err.Error()}
	}
	return memStat{KernelBytes: b, How: "kernel memory charged to the memory cgroup " + l.tool + " ran in"}
}
func (l *ruleLoader) socketCgroup() *topology.Cgroup { return nil }
func (l *ruleLoader) close()                         { l.cg.remove() }

// iptMode is kube-proxy-shaped iptables rules, loaded with iptables-restore
// --noflush as kube-proxy does, through the nft or the legacy backend.
type iptMode struct {
	ruleLoader
	variant string // "nft" or "legacy"
}

// bin is the tool of the variant and family: iptables-nft, ip6tables-legacy...
func (m *iptMode) bin() string {
	if m.fam.Is6() {
		return "ip6tables-" + m.variant
	}
	return "iptables-" + m.variant
}

func (m *iptMode) restore(ctx context.Context, data []byte, bound time.Duration) error {
	return m.load(ctx, "rules.iptables", data, bound, m.bin()+"-restore", "-w", "60", "--noflush")
}

func (m *iptMode) program(ctx context.Context, svcs []rules.Service) error {
	return m.restore(ctx, m.fam.IptablesRestore(svcs, rules.IptablesOptions{Jumps: true}), m.loadBound)
}

func (m *iptMode) update(ctx context.Context, all []rules.Service, old, new rules.Service) error {
	// kube-proxy's full sync: every chain rewritten, stale SEP chains deleted.
	var stale []string
	keep := map[string]bool{}
	for _, ep := range new.Endpoints {
		keep[rules.SepChain(new, ep)] = true
	}
	for _, ep := range old.Endpoints {
		if c := rules.SepChain(old, ep); !keep[c] {
			stale = append(stale, c)
		}
	}
	return m.restore(ctx, m.fam.IptablesRestore(all, rules.IptablesOptions{Stale: stale}), m.bound)
}

func (m *iptMode) reset(ctx context.Context) error {
	bin := m.bin()
	for _, t := range []string{"nat", "filter"} {
		for _, op := range []string{"-F", "-X"} {
			if err := runBounded(ctx, m.ns, m.bound, nil, bin, "-w", "60", "-t", t, op); err != nil {
				return err
			}
		}
	}
	return nil
}

// nftMode is a kube-proxy-shaped nftables ruleset (kube-proxy's nftables
// mode): the full table in one transaction, endpoint changes as small
// transactions.
type nftMode struct{ ruleLoader }

func (m *nftMode) apply(ctx context.Context, data []byte, bound time.Duration) error {
	return m.load(ctx, "rules.nft", data, bound, "nft", "-f")
}

func (m *nftMode) program(ctx context.Context, svcs []rules.Service) error {
	return m.apply(ctx, m.fam.NftRuleset(svcs), m.loadBound)
}

func (m *nftMode) update(ctx context.Context, _ []rules.Service, old, new rules.Service) error {
	return m.apply(ctx, m.fam.NftEndpointChange(old, new), m.bound)
}

func (m *nftMode) reset(ctx context.Context) error {
	return runBounded(ctx, m.ns, m.bound, nil, "nft", "delete", "table", m.fam.NftFamily(), rules.NftTable)
}
