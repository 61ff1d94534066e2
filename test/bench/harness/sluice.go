package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/test/bench/rules"
)

// sluiceMode runs the real agent (cmd/sluice) in the node namespace with a
// generated manifest: tc programs on the node's client-facing veth for the
// per-packet path, and cgroup connect4 on a cgroup the benchmark creates for
// the socket layer. Its pins go to a bpffs mounted for this run only.
type sluiceMode struct {
	bins     agentproc.Binaries
	ns       *topology.NS
	bpffs    string
	cgroup   *topology.Cgroup
	manifest string
	fam      rules.Family
	agent    *agentproc.Agent
	// ready is when the agent last had something new to read: its start
	// (its manifest already written), or the manifest's rename into place.
	ready time.Time
}

// sluiceBinaries returns the agent binary: BENCH_SLUICE, or cmd/sluice
// built once into the run's temporary directory.
func (r *runner) sluiceBinaries(ctx context.Context) (agentproc.Binaries, error) {
	if r.cfg.SluiceBin != "" {
		return agentproc.Binaries{Sluice: r.cfg.SluiceBin}, nil
	}
	bins, err := agentproc.Build(ctx, r.tmp)
	if err != nil {
		return bins, fmt.Errorf("no BENCH_SLUICE, and building it failed: %w", err)
	}
	r.cfg.SluiceBin = bins.Sluice
	return bins, nil
}

// newSluiceMode sets up mode sluice, or with base mode sluice-base: the
// same in every respect but the agent binary (BENCH_SLUICE_BASE).
func newSluiceMode(ctx context.Context, r *runner, tri *triple, dir string, base bool) (mode, error) {
	bins, err := agentproc.Binaries{Sluice: r.cfg.SluiceBase}, error(nil)
	if !base {
		bins, err = r.sluiceBinaries(ctx)
	}
	if err != nil {
		return nil, err
	}
	m := &sluiceMode{bins: bins, ns: tri.Node, manifest: filepath.Join(dir, "services.json"), fam: r.fam}
	m.bpffs = filepath.Join(dir, "bpffs")
	if err := os.MkdirAll(m.bpffs, 0o755); err != nil {
		return nil, err
	}
	if err := syscall.Mount("bpf", m.bpffs, "bpf", 0, ""); err != nil {
		return nil, fmt.Errorf("mount bpffs at %s: %w", m.bpffs, err)
	}
	mnt, err := datapath.CgroupV2Mount()
	if err != nil {
		m.close()
		return nil, err
	}
	// Removed, with whatever still runs in it, when the triple closes.
	if m.cgroup, err = tri.topo.AddCgroup(mnt, "sluice"); err != nil {
		m.close()
		return nil, err
	}
	return m, nil
}

// writeManifest writes svcs as a List of Services and EndpointSlices,
// atomically (temporary file, then rename), as an editor or a config
// management tool would.
func (m *sluiceMode) writeManifest(svcs []rules.Service) error {
	if err := WriteManifest(m.manifest, m.fam, svcs); err != nil {
		return err
	}
	m.ready = time.Now()
	return nil
}

// WriteManifest writes svcs to path as the benchmark's agent reads them: a
// List of Services and EndpointSlices of family fam, written atomically.
func WriteManifest(path string, fam rules.Family, svcs []rules.Service) error {
	type obj = map[string]any
	items := make([]obj, 0, 2*len(svcs))
	for _, s := range svcs {
		ns, name, _ := strings.Cut(s.Name, "/")
		items = append(items, obj{
			"apiVersion": "v1", "kind": "Service",
			"metadata": obj{"namespace": ns, "name": name},
			"spec": obj{
				"type": "ClusterIP", "clusterIP": s.VIP.String(), "clusterIPs": []string{s.VIP.String()},
				"ipFamilies": []string{fam.Name}, "ipFamilyPolicy": "SingleStack",
				"ports": []obj{{"name": rules.PortName, "port": s.Port, "targetPort": rules.BackendPort, "protocol": "TCP"}},
			},
		})
		eps := make([]obj, 0, len(s.Endpoints))
		for _, ep := range s.Endpoints {
			eps = append(eps, obj{"addresses": []string{ep.Addr().String()}, "conditions": obj{"ready": true, "serving": true, "terminating": false}})
		}
		items = append(items, obj{
			"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
			"metadata":    obj{"namespace": ns, "name": name + "-bench", "labels": obj{"kubernetes.io/service-name": name}},
			"addressType": fam.Name,
			"endpoints":   eps,
			"ports":       []obj{{"name": rules.PortName, "port": rules.BackendPort, "protocol": "TCP"}},
		})
	}
	data, err := json.Marshal(obj{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		return err
	}
	return agentproc.WriteFile(path, string(data))
}

// AgentArgs are the flags the benchmark's agent runs with for svcs (besides
// agentproc's): no health or metrics listener, no periodic re-read, info
// logs (the sync lines give the source/apply breakdown), maps sized from
// svcs with room for the endpoint changes.
func AgentArgs(svcs []rules.Service) []string {
	services, backends, entries := needs(svcs)
	return []string{
		"--health-addr", "", "--metrics-addr", "",
		"--node-name", "bench-node",
		"--resync-interval", "0",
		"--log-level", "info",
		"--max-services", strconv.Itoa(mapSize(services)),
		"--max-backends", strconv.Itoa(mapSize(backends + 64)),
		"--max-service-entries", strconv.Itoa(mapSize(entries)),
	}
}

// needs counts the map entries svcs take.
func needs(svcs []rules.Service) (services, backends, entries int) {
	for _, s := range svcs {
		backends += len(s.Endpoints)
		entries += len(s.Endpoints) + 1
	}
	return len(svcs), backends, entries
}

// mapSize sizes a map for n entries as an operator would (1.25x, at least
// 1024), so map memory follows N.
func mapSize(n int) int { return max(1024, n+n/4+64) }

func (m *sluiceMode) program(ctx context.Context, svcs []rules.Service) error {
	if err := m.writeManifest(svcs); err != nil {
		return err
	}
	m.agent = agentproc.NewAgent(m.bins, m.ns, agentproc.AgentConfig{
		Manifests: m.manifest,
		Devices:   []string{NodeClientDev},
		Cgroup:    m.cgroup.Path,
		BPFFS:     m.bpffs,
		Extra:     AgentArgs(svcs),
	})
	m.ready = time.Now()
	if err := m.agent.Start(); err != nil {
		return fmt.Errorf("start agent: %w", err)
	}
	return nil
}

// agentError says why the agent exited, if it did.
func (m *sluiceMode) agentError() error {
	if m.agent == nil {
		return nil
	}
	if err := m.agent.Exited(); err != nil {
		return fmt.Errorf("%w: %s", err, m.logTail())
	}
	return nil
}

func (m *sluiceMode) logTail() string {
	b := strings.TrimSpace(m.agent.Log.String())
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	return b
}

func (m *sluiceMode) update(ctx context.Context, all []rules.Service, _, _ rules.Service) error {
	if err := m.agentError(); err != nil {
		return err
	}
	return m.writeManifest(all)
}

func (m *sluiceMode) stopAgent() {
	if m.agent != nil {
		_ = m.agent.Stop()
	}
}

func (m *sluiceMode) reset(ctx context.Context) error {
	m.stopAgent()
	if m.agent == nil {
		return nil
	}
	return m.agent.Uninstall(ctx)
}

// memory reads the agent's RSS and the memlock of the BPF maps it holds
// (fdinfo of its map fds; each map counted once).
func (m *sluiceMode) memory() memStat {
	if m.agent == nil || m.agent.Exited() != nil || m.agent.Pid() == 0 {
		return memStat{How: "agent not running"}
	}
	pid := m.agent.Pid()
	st := memStat{How: "agent VmRSS (peak: VmHWM); BPF maps: sum of memlock in /proc/<agent>/fdinfo of its map fds"}
	vm := procStatusBytes(pid, "VmRSS", "VmHWM")
	st.AgentRSS, st.AgentPeakRSS = vm["VmRSS"], vm["VmHWM"]
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fdinfo", pid))
	seen := map[string]bool{}
	var parts []string
	for _, fd := range fds {
		f, err := os.Open(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
		if err != nil {
			continue
		}
		var id string
		var memlock int64
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, _ := strings.Cut(sc.Text(), ":")
			switch k {
			case "map_id":
				id = strings.TrimSpace(v)
			case "memlock":
				memlock, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			}
		}
		f.Close()
		if id != "" && !seen[id] {
			seen[id] = true
			st.KernelBytes += memlock
			name := "map " + id
			if n, err := strconv.ParseUint(id, 10, 32); err == nil {
				if mp, err := ebpf.NewMapFromID(ebpf.MapID(n)); err == nil {
					if info, err := mp.Info(); err == nil && info.Name != "" {
						name = info.Name
					}
					mp.Close()
				}
			}
			parts = append(parts, fmt.Sprintf("%s %.1f", name, float64(memlock)/(1<<20)))
		}
	}
	sort.Strings(parts)
	st.How += " (MiB: " + strings.Join(parts, ", ") + ")"
	return st
}

func (m *sluiceMode) socketCgroup() *topology.Cgroup { return m.cgroup }

// lastSync reads the agent's log for the first sync after t0: when the
// manifest source finished loading (relative to t0: debounce plus parse and
// translation) and how long the reconciler's Apply took.
func (m *sluiceMode) lastSync(t0 time.Time) (sourceS, applyS float64, ok bool) {
	// The agent logs the sync after its map writes, which the probe may
	// already have seen: give the line a moment to appear (at 100,000
	// Services on a loaded machine, more than 3 s).
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if sourceS, applyS, ok = m.parseSync(t0); ok || time.Now().After(deadline) {
			return sourceS, applyS, ok
		}
	}
}

func (m *sluiceMode) parseSync(t0 time.Time) (sourceS, applyS float64, ok bool) {
	if m.agent == nil {
		return 0, 0, false
	}
	var loaded time.Time
	for _, l := range strings.Split(m.agent.Log.String(), "\n") {
		ts, _, _ := strings.Cut(strings.TrimPrefix(l, "time="), " ")
		t, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil || t.Add(time.Millisecond).Before(t0) {
			continue
		}
		switch {
		case strings.Contains(l, "msg=\"Loaded manifests\"") && loaded.IsZero():
			loaded = t
		case strings.Contains(l, "msg=\"desired state applied\"") && !loaded.IsZero():
			_, took, found := strings.Cut(l, " took=")
			if !found {
				return 0, 0, false
			}
			d, err := time.ParseDuration(strings.Fields(took)[0])
			if err != nil {
				return 0, 0, false
			}
			return max(0, loaded.Sub(t0).Seconds()), d.Seconds(), true
		}
	}
	return 0, 0, false
}

func (m *sluiceMode) close() {
	m.stopAgent()
	if m.agent != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = m.agent.Uninstall(ctx)
		cancel()
	}
	if m.bpffs != "" {
		_ = syscall.Unmount(m.bpffs, syscall.MNT_DETACH)
	}
}
