package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cilium/ebpf"

	"github.com/sluice-lb/sluice/test/bench/rules"
	"github.com/sluice-lb/sluice/test/bench/topo"
)

// sluiceMode runs the real agent (cmd/sluice) in the node namespace with a
// generated manifest: tc programs on the node's client-facing veth for the
// per-packet path, and cgroup connect4 on a cgroup the benchmark creates for
// the socket layer. Its pins go to a bpffs mounted for this run only.
type sluiceMode struct {
	bin, ns, dir  string
	bpffs, cgroup string
	manifest      string
	capacity      []string
	agent         *exec.Cmd
	agentDone     chan error
	logPath       string
}

// sluiceBinary returns the agent binary: BENCH_SLUICE, or cmd/sluice built
// once into the run's temporary directory.
func (r *runner) sluiceBinary() (string, error) {
	if r.cfg.SluiceBin != "" {
		return r.cfg.SluiceBin, nil
	}
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || strings.TrimSpace(string(gomod)) == "" || strings.TrimSpace(string(gomod)) == os.DevNull {
		return "", fmt.Errorf("no BENCH_SLUICE and not inside the module to build cmd/sluice")
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	bin := filepath.Join(r.tmp, "sluice")
	// A few tries: a build cache shared with concurrent builds has been
	// seen to fail transiently.
	var lastErr error
	for try := 0; try < 3; try++ {
		cmd := exec.Command("go", "build", "-o", bin, "./cmd/sluice")
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err == nil {
			r.cfg.SluiceBin = bin
			return bin, nil
		}
		lastErr = fmt.Errorf("build cmd/sluice: %w: %s", err, out)
		time.Sleep(time.Second)
	}
	return "", lastErr
}

func cgroup2Mount() (string, error) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 3 && f[2] == "cgroup2" {
			return f[1], nil
		}
	}
	return "", errors.New("no cgroup2 mount")
}

func newSluiceMode(r *runner, tri *topo.Triple, dir, cgName string) (mode, error) {
	bin, err := r.sluiceBinary()
	if err != nil {
		return nil, err
	}
	m := &sluiceMode{bin: bin, ns: tri.Node, dir: dir, manifest: filepath.Join(dir, "services.json"), logPath: filepath.Join(dir, "agent.log")}
	m.bpffs = filepath.Join(dir, "bpffs")
	if err := os.MkdirAll(m.bpffs, 0o755); err != nil {
		return nil, err
	}
	if err := syscall.Mount("bpf", m.bpffs, "bpf", 0, ""); err != nil {
		return nil, fmt.Errorf("mount bpffs at %s: %w", m.bpffs, err)
	}
	mnt, err := cgroup2Mount()
	if err != nil {
		m.close()
		return nil, err
	}
	m.cgroup = filepath.Join(mnt, cgName)
	if err := os.Mkdir(m.cgroup, 0o755); err != nil {
		m.cgroup = ""
		m.close()
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	return m, nil
}

// writeManifest writes svcs as a List of Services and EndpointSlices,
// atomically (temporary file, then rename), as an editor or a config
// management tool would.
func (m *sluiceMode) writeManifest(svcs []rules.Service) error {
	type obj = map[string]any
	items := make([]obj, 0, 2*len(svcs))
	for _, s := range svcs {
		ns, name, _ := strings.Cut(s.Name, "/")
		items = append(items, obj{
			"apiVersion": "v1", "kind": "Service",
			"metadata": obj{"namespace": ns, "name": name},
			"spec": obj{
				"type": "ClusterIP", "clusterIP": s.VIP.String(), "clusterIPs": []string{s.VIP.String()},
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
			"addressType": "IPv4",
			"endpoints":   eps,
			"ports":       []obj{{"name": rules.PortName, "port": rules.BackendPort, "protocol": "TCP"}},
		})
	}
	data, err := json.Marshal(obj{"apiVersion": "v1", "kind": "List", "items": items})
	if err != nil {
		return err
	}
	tmp := m.manifest + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, m.manifest)
}

// sizing gives the agent maps sized for the run (1.25x what N needs, at
// least 1024), as an operator would, so map memory follows N.
func sizing(svcs []rules.Service) []string {
	backends, entries := 0, 0
	for _, s := range svcs {
		backends += len(s.Endpoints)
		entries += len(s.Endpoints) + 1
	}
	size := func(n int) string { return strconv.Itoa(max(1024, n+n/4+64)) }
	return []string{
		"--max-services", size(len(svcs)),
		"--max-backends", size(backends + 64), // room for the endpoint changes
		"--max-service-entries", size(entries),
	}
}

func (m *sluiceMode) program(ctx context.Context, svcs []rules.Service) error {
	if err := m.writeManifest(svcs); err != nil {
		return err
	}
	m.capacity = sizing(svcs)
	// nsenter, not ip netns exec: the latter remounts /sys, hiding the
	// cgroup2 mount the agent attaches to.
	args := append([]string{"--net=/run/netns/" + m.ns, m.bin,
		"--manifests", m.manifest,
		"--devices", topo.NodeClientDev,
		"--cgroup", m.cgroup,
		"--bpffs", m.bpffs,
		"--health-addr", "", "--metrics-addr", "",
		"--node-name", "bench-node",
		"--resync-interval", "0",
		"--log-level", "info", // the sync lines give the source/apply breakdown
	}, m.capacity...)
	cmd := exec.Command("nsenter", args...)
	logf, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start agent: %w", err)
	}
	m.agent = cmd
	m.agentDone = make(chan error, 1)
	go func() { m.agentDone <- cmd.Wait(); logf.Close() }()
	return nil
}

// agentError says why the agent exited, if it did.
func (m *sluiceMode) agentError() error {
	if m.agentDone == nil {
		return nil
	}
	select {
	case err := <-m.agentDone:
		m.agentDone <- err
		return fmt.Errorf("agent exited (%v): %s", err, m.logTail())
	default:
		return nil
	}
}

func (m *sluiceMode) logTail() string {
	b, _ := os.ReadFile(m.logPath)
	b = bytes.TrimSpace(b)
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	return string(b)
}

func (m *sluiceMode) update(ctx context.Context, all []rules.Service, _, _ rules.Service) error {
	if err := m.agentError(); err != nil {
		return err
	}
	return m.writeManifest(all)
}

func (m *sluiceMode) stopAgent() {
	if m.agent == nil || m.agent.Process == nil {
		return
	}
	_ = m.agent.Process.Signal(syscall.SIGTERM)
	select {
	case <-m.agentDone:
	case <-time.After(10 * time.Second):
		_ = m.agent.Process.Kill()
		<-m.agentDone
	}
	m.agent, m.agentDone = nil, nil
}

func (m *sluiceMode) reset(ctx context.Context) error {
	m.stopAgent()
	out, err := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+m.ns, m.bin, "cleanup", "--bpffs", m.bpffs).CombinedOutput()
	if err != nil {
		return fmt.Errorf("sluice cleanup: %w: %s", err, out)
	}
	return nil
}

// memory reads the agent's RSS and the memlock of the BPF maps it holds
// (fdinfo of its map fds; each map counted once).
func (m *sluiceMode) memory() memStat {
	if m.agent == nil || m.agent.Process == nil {
		return memStat{How: "agent not running"}
	}
	pid := m.agent.Process.Pid // nsenter execs the agent: same pid
	st := memStat{How: "agent VmRSS; BPF maps: sum of memlock in /proc/<agent>/fdinfo of its map fds"}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				st.AgentRSS = kb * 1024
			}
		}
	}
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

func (m *sluiceMode) socketCgroup() string { return m.cgroup }

// lastSync reads the agent's log for the first sync after t0: when the
// manifest source finished loading (relative to t0: debounce plus parse and
// translation) and how long the reconciler's Apply took.
func (m *sluiceMode) lastSync(t0 time.Time) (sourceS, applyS float64, ok bool) {
	// The agent logs the sync after its map writes, which the probe may
	// already have seen: give the line a moment to appear.
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if sourceS, applyS, ok = m.parseSync(t0); ok || time.Now().After(deadline) {
			return sourceS, applyS, ok
		}
	}
}

func (m *sluiceMode) parseSync(t0 time.Time) (sourceS, applyS float64, ok bool) {
	b, err := os.ReadFile(m.logPath)
	if err != nil {
		return 0, 0, false
	}
	var loaded time.Time
	for _, l := range strings.Split(string(b), "\n") {
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
	if m.bin != "" && m.bpffs != "" {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+m.ns, m.bin, "cleanup", "--bpffs", m.bpffs).Run()
		cancel()
	}
	if m.bpffs != "" {
		_ = syscall.Unmount(m.bpffs, syscall.MNT_DETACH)
	}
	if m.cgroup != "" {
		_ = os.Remove(m.cgroup)
	}
}
