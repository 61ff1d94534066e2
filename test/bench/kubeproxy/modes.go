package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/sluice-lb/sluice/internal/testutil"
	"github.com/sluice-lb/sluice/internal/testutil/agentproc"
	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/pkg/datapath"
)

// metricsAddr is where every mode serves /metrics, on its namespace's
// loopback (kube-proxy's default address; Sluice's too in agentproc).
const metricsAddr = "127.0.0.1:10249"

// binaries are the programs the modes run.
type binaries struct {
	agent     agentproc.Binaries
	kubeProxy string
	// agentBase is mode sluice-base's agent (config.SluiceBase).
	agentBase string
	// agentArgs are added to both agents' flags (config.SluiceArgs).
	agentArgs []string
	// agentEnv is added to both agents' environment (config.SluiceEnv).
	agentEnv []string
}

// proxy is one mode's process, running in a namespace of its own.
type proxy struct {
	mode string
	topo *topology.Topology
	ns   *topology.NS
	log  *testutil.Buffer
	// pid is the process's id (nsenter execs it: the id is its own).
	pid int
	// exited is nil while the process runs, else how it ended.
	exited func() error
	// stop ends the process and removes what it installed outside its
	// namespace; the namespace goes with topo.
	stop func(ctx context.Context) error
	// programmed counts the Services programmed, from the mode's own
	// state: kernel rules or maps, or the agent's count of them.
	programmed func(ctx context.Context) (int, error)
	// scrapes counts the reads of its /metrics; served those it
	// answered (the others, before it listens, cost it nothing).
	scrapes, served int
}

// startProxy creates a fresh namespace joined to the control plane's and
// starts mode in it; it returns the proxy and the time just before its
// start.
func startProxy(c *cluster, mode string, bins binaries) (_ *proxy, started time.Time, err error) {
	topo, err := topology.New()
	if err != nil {
		return nil, started, err
	}
	defer func() {
		if err != nil {
			_ = c.cp.Run(context.Background(), "ip", "link", "del", "kp0") // if it was made
			err = errors.Join(err, topo.Close())
		}
	}()
	short := map[string]string{modeIptables: "ipt", modeNftables: "nft", modeSluice: "sluice", modeSluiceBase: "base"}[mode]
	ns, err := topo.AddNS(short)
	if err != nil {
		return nil, started, err
	}
	if err := topo.Veth(ns, "eth0", c.cp, "kp0"); err != nil {
		return nil, started, err
	}
	if err := c.cp.AddAddr("kp0", cpAddr); err != nil {
		return nil, started, err
	}
	if err := ns.AddAddr("eth0", nodeAddr); err != nil {
		return nil, started, err
	}
	p := &proxy{mode: mode, topo: topo, ns: ns, log: &testutil.Buffer{}}
	switch mode {
	case modeIptables, modeNftables:
		proxyMode := strings.TrimPrefix(mode, "kube-proxy-")
		args := []string{
			"--kubeconfig=" + c.adminKubeconfig,
			"--proxy-mode=" + proxyMode,
			"--hostname-override=" + nodeName,
			"--cluster-cidr=" + clusterCIDR,
			"--metrics-bind-address=" + metricsAddr,
			"--healthz-bind-address=127.0.0.1:10256",
			// nf_conntrack_max cannot be set outside the initial
			// namespace: leave conntrack as it is.
			"--conntrack-max-per-core=0",
			"--conntrack-tcp-timeout-established=0",
			"--conntrack-tcp-timeout-close-wait=0",
		}
		started = time.Now()
		proc, err := ns.Start(p.log, nil, bins.kubeProxy, args...)
		if err != nil {
			return nil, started, err
		}
		p.pid = proc.Cmd.Process.Pid
		p.exited = func() error {
			select {
			case <-proc.Exited():
				return fmt.Errorf("%s exited: %v", mode, proc.Err())
			default:
				return nil
			}
		}
		p.stop = func(context.Context) error { _ = proc.Stop(10 * time.Second); return nil }
		if proxyMode == "iptables" {
			p.programmed = p.iptablesServices
		} else {
			p.programmed = p.nftablesServices
		}
	case modeSluice, modeSluiceBase:
		mnt, err := datapath.CgroupV2Mount()
		if err != nil {
			return nil, started, err
		}
		cg, err := topo.AddCgroup(mnt, "sluice")
		if err != nil {
			return nil, started, err
		}
		bin := bins.agent
		if mode == modeSluiceBase {
			bin.Sluice = bins.agentBase
		}
		a := agentproc.NewAgent(bin, ns, agentproc.AgentConfig{
			Devices: []string{"eth0"},
			Cgroup:  cg.Path,
			BPFFS:   filepath.Join(testutil.BPFFS, topo.Prefix()+"sluice"),
			Extra:   append([]string{"--kubeconfig", c.agentKubeconfig, "--log-level", "info"}, bins.agentArgs...),
		})
		a.Env = bins.agentEnv
		a.Log = p.log
		a.MetricsAddr = metricsAddr
		started = time.Now()
		if err := a.Start(); err != nil {
			return nil, started, err
		}
		p.pid = a.Pid()
		p.exited = a.Exited
		p.stop = a.Teardown
		p.programmed = func(context.Context) (int, error) {
			body, err := p.metrics()
			if err != nil {
				return 0, err
			}
			n, ok := sample(body, "sluice_services", "")
			if !ok {
				return 0, errors.New("no sluice_services in the agent's metrics")
			}
			return int(n), nil
		}
	default:
		return nil, started, fmt.Errorf("unknown mode %q", mode)
	}
	return p, started, nil
}

// close stops the process and removes its namespace. The veth pair is
// deleted first, from the control plane's end: a namespace is destroyed
// asynchronously, and its end of the pair would otherwise linger in the
// control plane's namespace, with its address, when the next mode's pair
// is made.
func (p *proxy) close(ctx context.Context, c *cluster) error {
	err := p.stop(ctx)
	if e := c.cp.Run(ctx, "ip", "link", "del", "kp0"); e != nil {
		err = errors.Join(err, fmt.Errorf("delete the veth pair: %w", e))
	}
	return errors.Join(err, p.topo.Close())
}

// metrics fetches the mode's Prometheus exposition.
func (p *proxy) metrics() (string, error) {
	p.scrapes++
	c := p.ns.HTTPClient(5 * time.Second)
	resp, err := c.Get("http://" + metricsAddr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("/metrics: %s", resp.Status)
	}
	p.served++
	return string(b), nil
}

// iptablesServices counts the jumps from KUBE-SERVICES to a service chain
// in the nat table: one per Service port with endpoints.
func (p *proxy) iptablesServices(ctx context.Context) (int, error) {
	out, err := p.ns.Command(ctx, "iptables-save", "-t", "nat").Output()
	if err != nil {
		return 0, fmt.Errorf("iptables-save: %w", err)
	}
	n := 0
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "-A KUBE-SERVICES ") && strings.Contains(l, "-j KUBE-SVC-") {
			n++
		}
	}
	return n, nil
}

// nftablesServices counts the elements of kube-proxy's service-ips verdict
// map: one per Service port with endpoints.
func (p *proxy) nftablesServices(ctx context.Context) (int, error) {
	out, err := p.ns.Command(ctx, "nft", "-j", "list", "map", "ip", "kube-proxy", "service-ips").Output()
	if err != nil {
		return 0, fmt.Errorf("nft list map ip kube-proxy service-ips: %w", err)
	}
	var doc struct {
		Nftables []struct {
			Map *struct {
				Elem []json.RawMessage `json:"elem"`
			} `json:"map"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return 0, fmt.Errorf("nft -j: %w", err)
	}
	for _, o := range doc.Nftables {
		if o.Map != nil {
			return len(o.Map.Elem), nil
		}
	}
	return 0, errors.New("nft -j: no map in the output")
}
