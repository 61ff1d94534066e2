// Command sluice is the Sluice agent: it programs the eBPF datapath on this
// node from a source of desired state (a manifest file, or the Kubernetes
// API) and keeps it in sync.
//
//	sluice --manifests services.yaml [--devices eth0] ...
//	sluice cleanup [--bpffs /sys/fs/bpf]
//
// The agent can stop and restart at any time without touching traffic: the
// programs and maps stay pinned under <bpffs>/sluice/. `sluice cleanup`
// removes them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sluice-lb/sluice/internal/namesfile"
	"github.com/sluice-lb/sluice/pkg/agent"
	"github.com/sluice-lb/sluice/pkg/datapath"
	"github.com/sluice-lb/sluice/pkg/health"
	"github.com/sluice-lb/sluice/pkg/metrics"
	"github.com/sluice-lb/sluice/pkg/reconciler"
	"github.com/sluice-lb/sluice/pkg/source/manifest"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) > 0 && args[0] == "cleanup" {
		return runCleanup(args[1:])
	}
	fs := flag.NewFlagSet("sluice", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage:\n  sluice --manifests PATH [flags]\n  sluice --kubeconfig PATH [flags]\n  sluice --in-cluster [flags]\n  sluice cleanup [--bpffs DIR]\n  sluice --version\n\nFlags:\n")
		fs.PrintDefaults()
	}
	var (
		manifests   = fs.String("manifests", "", "read Services and EndpointSlices from this YAML file (or directory), watching it for changes")
		devices     = fs.String("devices", "", "comma-separated devices to attach the tc programs to (ingress and egress); a name ending in + is a prefix, as Cilium's (eth0,veth+,cali+): the links it matches are followed as they come and go (pods' host-side devices; size --max-devices for them)")
		cgroup      = fs.String("cgroup", "", "cgroup v2 directory for socket load balancing (default: the cgroup2 root)")
		socketLB    = fs.Bool("socket-lb", true, "translate at the socket layer (cgroup connect4/sendmsg4/recvmsg4/getpeername4)")
		bpffs       = fs.String("bpffs", datapath.DefaultBPFFS, "bpffs mount; state is pinned under <bpffs>/sluice/")
		healthAddr  = fs.String("health-addr", ":10256", "address for /healthz, /livez (kube-proxy's, KEP-3836) and /readyz (empty: off)")
		metricsAddr = fs.String("metrics-addr", "127.0.0.1:10249", "address for Prometheus /metrics (empty: off); kube-proxy's default keeps it on the node: a cluster's Prometheus needs the node's address (NODE_IP:10249) or :10249")
		logLevel    = fs.String("log-level", "info", "debug, info, warn or error")
		nodeName    = fs.String("node-name", "", "this node's name (default: the host name)")
		hostname    = fs.String("hostname-override", "", "kube-proxy's name of --node-name, as kubeadm's kube-proxy DaemonSet passes it: lower-cased and trimmed as kube-proxy does; given with --node-name, they must agree")
		proxyName   = fs.String("proxy-name", "", "serve Services without a service.kubernetes.io/service-proxy-name label and those labelled with NAME (empty: sluice)")
		resync      = fs.Duration("resync-interval", time.Minute, "re-apply the desired state this often, repairing drift (0: never)")
		mapRefresh  = fs.Duration("map-refresh-interval", reconciler.DefaultRefreshInterval, "re-read the BPF maps this often to find entries changed or deleted behind the agent's back (e.g. with bpftool), which are then rewritten; the re-read happens inside an apply, so at the first resync (--resync-interval) or change after the interval (0: never)")
		nodeIPs     = fs.String("node-ip", "", "comma-separated addresses of this node, of either family or both (\"IPv4,IPv6\" in either order, as status.hostIPs; the first of each family its primary address, where NodePorts are served by default); with the Kubernetes source a family not given comes from the Node object (its InternalIPs, then ExternalIPs), waited for at start: external flows to other nodes' backends are source-NATed to the one their device holds, and --devices defaults to the devices holding any")
		ctGC        = fs.Duration("conntrack-gc-interval", 30*time.Second, "delete expired per-packet conntrack entries this often (must be > 0: nothing else empties the established table)")
		xdpMode     = fs.String("xdp", "off", "XDP fast path for NodePort/ExternalIP/LoadBalancer traffic to other nodes' backends on --devices: native, generic or off")
		healthCheck = fs.Bool("health-check-node-ports", true, "serve the healthCheckNodePort of LoadBalancer Services with externalTrafficPolicy Local (on the --nodeport-addresses)")
		nodeZone    = fs.String("node-zone", "", "this node's zone (the topology.kubernetes.io/zone label), which EndpointSlice hints are matched against; with the Kubernetes source the Node's label replaces it")
		localMode   = fs.String("detect-local-mode", localModeClusterCIDR, "how pods' traffic is told (kube-proxy's local traffic detector): ClusterCIDR (sources in --cluster-cidr) or NodeCIDR (sources in this node's Node spec.podCIDRs, waited for at start, at most 5 minutes; --cluster-cidr is then ignored, and the agent exits when they change, to be restarted with the new ones; needs --kubeconfig or --in-cluster)")
		clusterCIDR = fs.String("cluster-cidr", "", "comma-separated CIDRs of the cluster's pods, of either family or both: their traffic to an externalTrafficPolicy Local Service's NodePort, ExternalIP or LoadBalancer IP goes to all its endpoints, and ClusterIP traffic from elsewhere is masqueraded (empty: no source is a pod, and ClusterIP traffic is not masqueraded)")
		serviceCIDR = fs.String("service-cidr", "", "comma-separated CIDRs of the ClusterIPs, of either family or both: a packet to one of their addresses that no Service holds is dropped; with the Kubernetes source, added to the CIDRs of the cluster's ServiceCIDR objects (networking.k8s.io/v1), which are followed")
		npAddrs     = fs.String("nodeport-addresses", "", "comma-separated CIDRs of either family and kube-proxy's keywords primary (the node's primary address of each family, --node-ip), all (0.0.0.0/0 and ::/0) and localhost (127.0.0.0/8): NodePorts (and health checks) are served on the node's addresses inside them; in a family none of them names, or with 0.0.0.0/0 or ::/0, on every address of that family (default: primary)")
		localhostNP = fs.Bool("localhost-nodeports", true, "also serve NodePorts on 127.0.0.1 (TCP and UDP, through socket load balancing) when --nodeport-addresses cover it")
		allowExtIPs = fs.Bool("allow-service-external-ips", true, "serve Services' spec.externalIPs, as kube-proxy's feature gate AllowServiceExternalIPs (GA, default true; --config's featureGates sets it); false, as against CVE-2020-8554, programs no ExternalIP frontends (LoadBalancer ingress IPs, NodePorts and ClusterIPs are served as before)")
		masqAll     = fs.Bool("masquerade-all", false, "source-NAT all ClusterIP traffic, and external traffic sent to this node's endpoints (which otherwise keeps its client's address)")
		snatPorts   = fs.String("snat-port-range", fmt.Sprintf("%d-%d", datapath.DefaultSNATPortMin, datapath.DefaultSNATPortMax), "MIN-MAX (inclusive, within 1024-65535): the source ports of flows source-NATed to a node address (to another node's endpoint, hairpins, masquerading); at most MAX-MIN+1 such flows of a protocol at once from one node address to one endpoint address and port (kube-proxy's MASQUERADE --random-fully: 64,512). Reserved from the node's ephemeral ports (net.ipv4.ip_local_reserved_ports): a range inside ip_local_port_range takes ports from the node's own connections; keep it out of the API server's --service-node-port-range")
		svcMetrics  = fs.Bool("service-metrics", false, "count new flows, packets, bytes and drops per Service in the datapath, exported as sluice_service_*_total and shown by sluicectl services --stats (off by default: a series per Service port, and a per-CPU counter array sized by --max-services)")
		progStats   = fs.Bool("bpf-program-stats", false, "have the kernel count the run count and run time of BPF programs (BPF_ENABLE_STATS, system wide, while the agent runs), exported as sluice_bpf_program_runs_total and sluice_bpf_program_run_seconds_total (off by default: every run of every BPF program on the node then pays two clock reads)")
		namesFile   = fs.String("names-file", namesfile.Default, "write which Service each programmed frontend belongs to here (JSON), for sluicectl to show beside the addresses (empty: off)")
		configFile  = fs.String("config", "", "kube-proxy's configuration file (a KubeProxyConfiguration): the fields that apply set the flags they map to; flags given on the command line override it")
		profiling   = fs.Bool("profiling", false, "serve Go's profiles (net/http/pprof: /debug/pprof/heap, allocs, profile, ...) on the --metrics-addr server, as kube-proxy's enableProfiling (off by default: they expose the agent's internals; keep --metrics-addr on loopback)")
		gcPercent   = fs.Int("gc-percent", defaultGCPercent, "the Go collector's target (GOGC): the heap may grow by this percentage of what the last collection found live before the next; lower trades CPU for memory (negative: off); the environment's GOGC, if set, wins")
		startGCPct  = fs.Int("start-gc-percent", defaultStartGCPercent, "with the manifest source, the Go collector's target (GOGC) from the agent's start until its first sync has succeeded, then --gc-percent's (must be > 0; 100: Go's default); the environment's GOGC, if set, wins")
		startLimMiB = fs.Int("start-memory-limit", defaultStartMemoryLimitMiB, "with the Kubernetes source, a soft memory limit for the Go runtime (what GOMEMLIMIT sets), in MiB, from the agent's start until its first sync has succeeded, lifted then or as soon as the live heap passes 80% of it (0: none); the environment's GOMEMLIMIT, if set, wins and stays")
		showVersion = fs.Bool("version", false, "print the version, the commit and the digest of the BPF objects, and exit")
		dpCfg       datapath.Config
	)
	fs.IntVar(&dpCfg.MaxServices, "max-services", datapath.DefaultMaxServices, "service frontends, of both families together: sizes sluice_rev_nat and sluice6_rev_nat (arrays of an entry for every service id: this plus 257), and sluice_service_ips and sluice_services (the frontends' masters) and their IPv6 twins")
	fs.IntVar(&dpCfg.MaxBackends, "max-backends", datapath.DefaultMaxBackends, "size of sluice_backends and sluice6_backends: distinct backends of each family")
	fs.IntVar(&dpCfg.MaxServiceEntries, "max-service-entries", datapath.DefaultMaxServiceEntries, "service entries (frontends plus backend slots) of each family: half the size of sluice_slots and sluice6_slots (the slots, in ranges of powers of two)")
	fs.IntVar(&dpCfg.MaxConntrack, "max-conntrack", datapath.DefaultMaxConntrack, "size of sluice_conntrack: established per-packet flows, SNAT port reservations, and flows not answered yet up to --conntrack-half-open-max (when full, new flows stay in sluice_ct_new, an LRU, and new SNAT port reservations are refused)")
	fs.IntVar(&dpCfg.MaxConntrackNew, "max-conntrack-new", datapath.DefaultMaxConntrackNew, "size of sluice_ct_new (LRU): per-packet flows not answered yet beyond sluice_conntrack's half-open share (--conntrack-half-open-max), which a flood of new flows evicts among themselves")
	fs.IntVar(&dpCfg.CTHalfOpenMax, "conntrack-half-open-max", 0, "how many per-packet flows not answered yet of each family sluice_conntrack may hold, promoted in place by their first reply (the rest go to sluice_ct_new); 0: a quarter of --max-conntrack in entries (two a flow); negative: none")
	fs.IntVar(&dpCfg.MaxSockRev, "max-sock-rev", datapath.DefaultMaxSockRev, "size of sluice_sock_rev (LRU): translated sockets")
	fs.IntVar(&dpCfg.MaxAffinity, "max-affinity", datapath.DefaultMaxAffinity, "size of sluice_session_affinity (LRU): clients of Services with sessionAffinity ClientIP")
	fs.IntVar(&dpCfg.MaxSourceRanges, "max-source-ranges", datapath.DefaultMaxSourceRanges, "size of sluice_src_ranges and sluice6_src_ranges: loadBalancerSourceRanges of all Services of each family")
	fs.IntVar(&dpCfg.MaxDevices, "max-devices", datapath.DefaultMaxDevices, "size of sluice_devices: devices the tc programs are attached to")
	fs.BoolVar(&dpCfg.SocketLBHostNetnsOnly, "socket-lb-host-netns-only", false, "translate at the socket only for the host's network namespace (the agent's), as kube-proxy translates only there: pods' sockets reach the ClusterIP, for a service mesh sidecar (Istio) or a cluster nested in a pod (kind) to see it, and their packets are translated per packet where tc runs (their host-side devices in --devices, or their bridge); as Cilium's --bpf-lb-sock-hostns-only")
	fs.BoolVar(&dpCfg.PreallocateMaps, "preallocate-bpf-maps", false, "create the service maps (sluice_services, sluice_service_ips and their IPv6 twins) preallocated, as Cilium's flag of the name: an insert takes the kernel about 0.7 of the time (at 30,000 Services x 10 endpoints, the first apply 0.05-0.06 s of CPU less, the maps' creation 0.03 s more), but the maps hold what their --max-services entries cost from the start, whatever the cluster has (24 MiB of kernel memory at the default sizes, both families, where the empty maps take 4 MiB without it; size the flag from the cluster with it on); switching rebuilds the pinned maps with their entries")
	mapRatio := fs.Float64("map-dynamic-size-ratio", 0, "share of the node's memory (0-1] for the flow tables (conntrack, half-open flows, translated sockets, affinity), each scaled from its default as Cilium's --bpf-map-dynamic-size-ratio (0.0025 in Cilium's chart); a --max-* flag given overrides its table; 0: the fixed defaults")
	fs.StringVar(&dpCfg.ProcSysNet, "proc-sys-net", datapath.DefaultProcSysNet, "the node's network sysctls (/proc/sys/net of the agent's network namespace): the SNAT ports are added to ipv4/ip_local_reserved_ports there and the ICMP rate limits read; a container's /proc/sys is read-only, so the DaemonSet mounts the node's writable at /host/proc/sys/net and passes that")
	fs.DurationVar(&dpCfg.CTTimeoutTCP, "conntrack-tcp-timeout", datapath.DefaultCTTimeoutTCP, "idle timeout of an answered, open TCP flow in sluice_conntrack (kube-proxy's conntrack.tcpEstablishedTimeout)")
	fs.DurationVar(&dpCfg.CTTimeoutSYN, "conntrack-tcp-syn-timeout", datapath.DefaultCTTimeoutSYN, "idle timeout of a TCP flow not answered yet (in sluice_conntrack's half-open share or in sluice_ct_new)")
	fs.DurationVar(&dpCfg.CTTimeoutClose, "conntrack-tcp-close-timeout", datapath.DefaultCTTimeoutClose, "how long a TCP flow's entry stays after a RST, or a FIN each way")
	fs.DurationVar(&dpCfg.CTTimeoutSNATTimeWait, "conntrack-tcp-snat-time-wait", datapath.DefaultCTTimeoutSNATTW, "how long a source-NATed TCP flow's entries, and so its SNAT port, stay after a FIN each way (not after a RST), instead of --conntrack-tcp-close-timeout (netfilter's TIME_WAIT): the backend may hold the port in TIME_WAIT after it closed first; a new flow that finds no free port takes over one so held once its flow has been closed --conntrack-tcp-close-timeout; at least --conntrack-tcp-close-timeout (equal: no extension; by default raised to a longer close timeout)")
	fs.DurationVar(&dpCfg.CTTimeoutUDP, "conntrack-udp-timeout", datapath.DefaultCTTimeoutUDP, "idle timeout of a UDP flow, answered or not (kube-proxy's conntrack.udpStreamTimeout)")
	kube := addKubeFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *showVersion {
		if err := printVersion(os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "sluice: write version: %v\n", err)
			return 1
		}
		return 0
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "sluice: unexpected arguments %q\n", fs.Args())
		return 2
	}
	nodeNameGiven := false // on the command line, not by --config
	fs.Visit(func(f *flag.Flag) { nodeNameGiven = nodeNameGiven || f.Name == "node-name" })
	var kp kubeProxyConfig
	if *configFile != "" {
		var err error
		if kp, err = applyKubeProxyConfig(fs, *configFile); err != nil {
			fmt.Fprintf(os.Stderr, "sluice: --config: %v\n", err)
			return 2
		}
	}
	if err := applyHostnameOverride(nodeName, *hostname, nodeNameGiven); err != nil {
		fmt.Fprintf(os.Stderr, "sluice: %v\n", err)
		return 2
	}
	if err := checkProcSysNet(dpCfg.ProcSysNet); err != nil {
		fmt.Fprintf(os.Stderr, "sluice: %v\n", err)
		return 2
	}
	for name, d := range map[string]time.Duration{"conntrack-tcp-timeout": dpCfg.CTTimeoutTCP, "conntrack-tcp-syn-timeout": dpCfg.CTTimeoutSYN,
		"conntrack-tcp-close-timeout": dpCfg.CTTimeoutClose, "conntrack-udp-timeout": dpCfg.CTTimeoutUDP,
		"conntrack-tcp-snat-time-wait": dpCfg.CTTimeoutSNATTimeWait} {
		// The BPF programs take a timeout in nanoseconds; 0 would
		// expire every flow at once (datapath.Config takes it for
		// the default).
		if d <= 0 {
			fmt.Fprintf(os.Stderr, "sluice: --%s %s: must be > 0\n", name, d)
			return 2
		}
	}
	// Its default (120 s) below a --conntrack-tcp-close-timeout given is
	// raised to it (no extension: datapath.Config does the same); only
	// a value given below it is refused.
	twGiven := false
	fs.Visit(func(f *flag.Flag) { twGiven = twGiven || f.Name == "conntrack-tcp-snat-time-wait" })
	if twGiven && dpCfg.CTTimeoutSNATTimeWait < dpCfg.CTTimeoutClose {
		fmt.Fprintf(os.Stderr, "sluice: --conntrack-tcp-snat-time-wait %s: must be >= --conntrack-tcp-close-timeout (%s)\n", dpCfg.CTTimeoutSNATTimeWait, dpCfg.CTTimeoutClose)
		return 2
	}
	dpCfg.CTTimeoutSNATTimeWait = max(dpCfg.CTTimeoutSNATTimeWait, dpCfg.CTTimeoutClose)
	if *mapRefresh < 0 {
		fmt.Fprintf(os.Stderr, "sluice: --map-refresh-interval %s: must be >= 0 (0: never)\n", *mapRefresh)
		return 2
	}
	if *startGCPct <= 0 {
		// Off (or 0) until the first sync: the manifest source's start
		// has no memory limit to pace the collector.
		fmt.Fprintf(os.Stderr, "sluice: --start-gc-percent %d: must be > 0\n", *startGCPct)
		return 2
	}
	if *ctGC <= 0 {
		fmt.Fprintf(os.Stderr, "sluice: --conntrack-gc-interval %s: must be > 0 (nothing else deletes expired established flows)\n", *ctGC)
		return 2
	}
	snatLo, snatHi, err := datapath.ParseSNATPortRange(*snatPorts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sluice: --snat-port-range: %v\n", err)
		return 2
	}
	dpCfg.SNATPortMin, dpCfg.SNATPortMax = snatLo, snatHi

	log, err := newLogger(*logLevel)
	if err != nil {
		fmt.Fprintf(os.Stderr, "sluice: %v\n", err)
		return 2
	}
	if *configFile != "" {
		kp.log(log, *configFile)
	}
	if *nodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			log.Error("no --node-name and no host name", "err", err)
			return 2
		}
		*nodeName = strings.ToLower(h)
	}
	opts := translate.Options{ProxyName: *proxyName, Node: translate.Node{Name: *nodeName}, NoExternalIPs: !*allowExtIPs}
	if opts.NoExternalIPs {
		log.Info("Services' spec.externalIPs not served (--allow-service-external-ips=false, or --config's featureGates AllowServiceExternalIPs: false)")
	}
	if *nodeZone != "" {
		opts.Node.Labels = map[string]string{corev1.LabelTopologyZone: *nodeZone}
	}
	flagIPs, err := parseNodeIPs(*nodeIPs)
	if err != nil {
		log.Error("bad flag", "err", err)
		return 2
	}
	if *mapRatio != 0 {
		mem, err := memTotal("/proc/meminfo")
		if err == nil {
			err = sizeFlowTables(fs, &dpCfg, *mapRatio, mem, log)
		}
		if err != nil {
			log.Error("bad flag", "err", err)
			return 2
		}
	}
	dpCfg.MasqueradeAll = *masqAll
	if snatLo <= 32767 && snatHi >= 30000 {
		// 30000-32767: the API server's default --service-node-port-range,
		// which the agent is not told: a source-NATed flow's reply
		// tuple <endpoint -> node:port> could then be a NodePort flow's.
		log.Warn("--snat-port-range overlaps 30000-32767, the API server's default NodePort range: keep them apart",
			"snat_ports", fmt.Sprintf("%d-%d", snatLo, snatHi))
	}
	dpCfg.ServiceMetrics = *svcMetrics
	if dpCfg.ClusterCIDRs, err = parseCIDRs("cluster-cidr", *clusterCIDR); err == nil {
		dpCfg.ServiceCIDRs, err = parseCIDRs("service-cidr", *serviceCIDR)
	}
	var npCIDRs []netip.Prefix
	var npPrimary bool
	if err == nil {
		npCIDRs, npPrimary, err = parseNodePortAddresses(*npAddrs)
	}
	if err != nil {
		log.Error("bad flag", "err", err)
		return 2
	}
	if dpCfg.XDP, err = datapath.ParseXDPMode(*xdpMode); err != nil {
		log.Error("bad flag", "err", fmt.Errorf("--xdp: %w", err))
		return 2
	}
	if *localMode, err = parseLocalMode(*localMode); err != nil {
		log.Error("bad flag", "err", err)
		return 2
	}
	devSel, err := datapath.ParseDevices(splitList(*devices))
	if err != nil {
		log.Error("bad flag", "err", fmt.Errorf("--devices: %w", err))
		return 2
	}

	if (*manifests == "") == !kube.enabled() {
		log.Error("give exactly one source: --manifests PATH, --kubeconfig PATH or --in-cluster")
		return 2
	}
	var podCIDRs []string // NodeCIDR: the Node's, which the Kubernetes source watches
	var node *corev1.Node // this node's, when read (nodeips.go)
	// A signal ends the waits for the Node, which may be long (the
	// agent's own handler is set up later).
	wctx, stopWait := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stopWait()
	budgetEnd := nodeWaitClock().Add(nodeAPIWait) // the waits take nodeAPIWait at most, together
	if *localMode == localModeNodeCIDR {
		if !kube.enabled() {
			log.Error("bad flag", "err", errors.New("--detect-local-mode NodeCIDR takes the pods' CIDRs from this node's Node object: it needs the Kubernetes source (--kubeconfig or --in-cluster), not --manifests"))
			return 2
		}
		node, err = kube.nodeWithPodCIDRs(wctx, opts.Node.Name, log)
		if errors.Is(err, context.Canceled) {
			log.Info("stopped while waiting for the Node's podCIDRs", "err", err)
			return 0
		}
		if err == nil {
			dpCfg.ClusterCIDRs, err = nodePodCIDRs(node)
		}
		if err != nil {
			log.Error("--detect-local-mode NodeCIDR", "err", err)
			return 1
		}
		podCIDRs = node.Spec.PodCIDRs
		if *clusterCIDR != "" {
			log.Info("--cluster-cidr (the configuration's clusterCIDR) ignored: --detect-local-mode NodeCIDR tells pods by the Node's podCIDRs", "cluster_cidr", *clusterCIDR)
		}
		log.Info("pods told by the Node's podCIDRs (--detect-local-mode NodeCIDR)", "node", node.Name, "pod_cidrs", dpCfg.ClusterCIDRs)
	}
	if !bothFamilies(flagIPs) && kube.enabled() && *kube.kubeconfig != "" != *kube.inCluster {
		// The Node gives the families --node-ip does not (all of
		// them without it), as kube-proxy's Node does beside its
		// bindAddress.
		node, err = kube.nodeWithIPs(wctx, opts.Node.Name, node, max(budgetEnd.Sub(nodeWaitClock()), 0), log)
		if errors.Is(err, context.Canceled) {
			log.Info("stopped while waiting for the Node's addresses", "err", err)
			return 0
		}
		if err != nil {
			log.Error("this node's addresses", "err", err)
			return 1
		}
	}
	stopWait()
	na := nodeAddressesOf(flagIPs, node)
	switch {
	case len(na.fromNode) > 0:
		log.Info("node addresses from the Node object", "node", opts.Node.Name, "addresses", na.fromNode, "node_ip", flagIPs)
	case len(na.all) == 0 && kube.enabled():
		log.Warn("no --node-ip and no node addresses from the Node object: NodePorts served on the devices' addresses only", "node", opts.Node.Name)
	}
	dpCfg.NodeIPs = na.all
	cfg := agent.Config{Resync: *resync}
	if devSel.HasPatterns() {
		// The links the patterns match now, those beyond --max-devices
		// left out (logged), not the start: the watch keeps them
		// pending until a device goes. Prune keeps the entries of these
		// only, so the attach below has room for them whatever an
		// earlier agent attached.
		var all, left []string
		if all, err = devSel.Expand(); err != nil {
			log.Error("--devices", "err", err)
			return 1
		}
		cfg.Devices, left = devSel.Fit(all, dpCfg.MaxDevices)
		if len(left) > 0 {
			log.Error("more devices match --devices than sluice_devices holds: raise --max-devices; those left out are attached once a device goes",
				"max_devices", dpCfg.MaxDevices, "left_out", left)
		}
		// Attached: those still there of the devices just fitted,
		// which hold every exact name (Fit keeps them all); a link
		// that appeared since is the watch's.
		kept := cfg.Devices
		cfg.DevicesNow = func() ([]string, error) {
			devs, err := devSel.Expand()
			if err != nil {
				return nil, err
			}
			return slices.DeleteFunc(devs, func(d string) bool { return !slices.Contains(kept, d) }), nil
		}
		warnTunnelsLeftOut(all, log)
		cfg.FollowDevices = followDevices(devSel, log.With("component", "devices"))
		log.Info("devices by pattern followed", "devices", *devices, "matching_now", cfg.Devices)
		if dpCfg.XDP != datapath.XDPOff {
			log.Warn("--xdp attaches XDP to the devices --devices' patterns match too (pods' veths): XDP belongs on devices whose packets come from a wire, "+
				"and with native XDP on a veth, frames it sends on are delivered only if the peer runs an XDP program; "+
				"name the pods' devices without --xdp, or their bridge", "devices", *devices, "xdp", dpCfg.XDP)
		}
	} else {
		cfg.Devices = devSel.Exact()
		if !devSel.Empty() {
			warnTunnelsLeftOut(cfg.Devices, log)
		}
	}
	if len(cfg.Devices) == 0 && devSel.Empty() && len(na.all) > 0 {
		// Every node address, not only the primary ones: ExternalIP and
		// LoadBalancer traffic may arrive on any of them.
		if cfg.Devices, err = datapath.DevicesOf(na.all); err != nil {
			log.Error("find the devices of --node-ip", "err", err)
			return 1
		}
		if len(cfg.Devices) == 0 {
			// No tc program then (Prune detaches an earlier agent's):
			// the NodePorts the watch adds once an address comes are
			// served by the socket programs alone. Not fatal, as a
			// node without node IPs is not (below).
			log.Warn("no device holds a node address: no tc program attached, so external clients reach no NodePort, ExternalIP or LoadBalancer IP; "+
				"name the devices with --devices (or restart once an interface holds the address)", "node_ips", na.all)
		} else {
			log.Info("devices holding the node addresses", "devices", cfg.Devices)
			nodeDevs := cfg.Devices
			cfg.Devices, dpCfg.FollowedTunnels = withTunnels(nodeDevs, dpCfg.MaxDevices, *bpffs, log)
			cfg.FollowDevices = followTunnels(nodeDevs, log.With("component", "overlay"))
		}
	}
	// NodePorts answer on the --nodeport-addresses (default: primary,
	// kube-proxy's node IP of each family) that are on the node's
	// interfaces, and follow them (nodeportaddrs.go). A node whose IPs
	// are unknown answers on the devices' addresses, as before there was
	// the flag.
	if npPrimary && len(npCIDRs) > 0 {
		// primary beside CIDRs: the node's primary addresses are
		// one more range (alone, primary is the default).
		for _, a := range na.primaryNodePorts() {
			npCIDRs = append(npCIDRs, netip.PrefixFrom(a, a.BitLen()))
		}
	}
	// The devices a node without node IPs serves NodePorts on are the
	// named and the detected ones, not those a pattern matched (pods'
	// veths, which come and go).
	npDevices := cfg.Devices
	if devSel.HasPatterns() {
		npDevices = devSel.Exact()
	}
	plan := nodePortPlan{cidrs: npCIDRs, primary: na.primaryNodePorts(), localhost: *localhostNP, devices: npDevices}
	npWatch, np, err := watchNodePorts(plan, log)
	if err != nil {
		log.Error("NodePort addresses", "err", err)
		return 1
	}
	defer npWatch.stop()
	opts.Node.IPs = na.primary
	opts.Node.Addresses = np.Addrs
	log.Info("NodePorts served", "addresses", np.Addrs, "cluster_cidrs", dpCfg.ClusterCIDRs,
		"service_cidrs", dpCfg.ServiceCIDRs, "masquerade_all", dpCfg.MasqueradeAll)

	m := metrics.New()
	var src agent.Source
	var prox *health.Proxier // /healthz and /livez; nil: 200 while running
	if *manifests != "" {
		src = manifest.NewSource(*manifests, opts, log.With("source", "manifests"))
	} else if src, prox, err = kube.source(opts, podCIDRs, dpCfg.ServiceCIDRs, m, log); err != nil {
		log.Error("Kubernetes source", "err", err)
		return 1
	}
	npWatch.start(src)
	if fo, ok := src.(agent.FailureObserver); ok {
		// The Kubernetes source turns what could not be programmed
		// into Events on the Services.
		cfg.Observers = append(cfg.Observers, fo)
	}
	if *socketLB {
		cfg.Cgroup = *cgroup
		if cfg.Cgroup == "" {
			if cfg.Cgroup, err = datapath.CgroupV2Mount(); err != nil {
				log.Error("socket load balancing needs a cgroup v2 mount (or --socket-lb=false)", "err", err)
				return 1
			}
		}
	} else {
		// tc translates at the ingress of --devices only (its egress
		// program translates replies back): kube-proxy's nat-output
		// chain has no counterpart for the node's own processes.
		log.Warn("--socket-lb=false: the node's own connections to Services are not translated, and pods' only where their packets arrive on a device in --devices", "devices", cfg.Devices)
	}
	// --socket-lb-host-netns-only leaves pods' sockets to tc, which
	// runs on --devices only: a pod's packets to a ClusterIP arrive on
	// its host-side device (or its bridge), not on the devices holding
	// the node addresses (the default), and with no tc there they leave
	// by the default route untranslated.
	switch {
	case dpCfg.SocketLBHostNetnsOnly && !*socketLB:
		log.Warn("--socket-lb-host-netns-only does nothing with --socket-lb=false: no socket is translated")
	case dpCfg.SocketLBHostNetnsOnly && *devices == "":
		log.Warn("--socket-lb-host-netns-only without --devices: pods' connections to Services are translated only where their packets arrive on a device in --devices, "+
			"and the devices holding the node addresses are not the pods'; name the pods' host-side devices or their bridge (such as cni0) in --devices, or pods reach no Service",
			"devices", cfg.Devices)
	}
	// The agent outside the node's network namespace (netnscheck.go).
	warnOutsideInitNetns(log, *localhostNP && *socketLB && coversLocalhost(npCIDRs), dpCfg.SocketLBHostNetnsOnly && *socketLB)
	dpCfg.BPFFS = *bpffs
	// The Kubernetes source names the service CIDRs (its ServiceCIDR
	// objects and the flag's), which the reconciler writes: Open keeps
	// those pinned until then.
	dpCfg.ServiceCIDRsFromSource = kube.enabled()
	dpCfg.DisableSocketLB = !*socketLB
	dpCfg.DeferDryRun = true // loaded after the first sync (dryRunLoader)
	// tc's ICMP errors follow the kernel's rate limits, this network
	// namespace's (the node's) sysctls: as they are now, then as runAgent
	// reads them again (FollowICMPRateLimits).
	if rl, err := datapath.ReadICMPRateLimits(dpCfg.ProcSysNet); err != nil {
		log.Warn("ICMP rate limit sysctls unreadable: tc's ICMP errors follow Linux's defaults", "err", err)
	} else {
		dpCfg.ICMPRateLimits = &rl
	}
	if !checkPrerequisites(*manifests, dpCfg.BPFFS, cfg.Cgroup, dpCfg.XDP, log) {
		return 1
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ns := northSouthConfig{gcEvery: *ctGC, hc: *healthCheck, hcHosts: np.HealthHosts}
	if *namesFile != "" {
		cfg.Observers = append(cfg.Observers, &namesWriter{path: *namesFile, bpffs: *bpffs, log: log.With("component", "names")})
	}
	var startLim *startLimit
	if kube.enabled() { // each measured with its own source (gc.go)
		startLim = startMemoryLimit(*startLimMiB, os.Getenv("GOMEMLIMIT"), log)
	} else {
		startGCPercent(*startGCPct, os.Getenv("GOGC"), log)
	}
	if startLim != nil {
		go startLim.watch(ctx, 50*time.Millisecond)
	}
	cfg.Observers = append(cfg.Observers, &gcTarget{percent: *gcPercent, gogc: os.Getenv("GOGC"), start: startLim, log: log})
	if *progStats {
		// Held open for the agent's life: the kernel counts while
		// someone holds it.
		stats, err := datapath.EnableStats()
		if err != nil {
			log.Warn("BPF program statistics unavailable: sluice_bpf_program_* stay 0", "err", err)
		} else {
			// Closing drops this process's hold on the accounting;
			// it fails only on a bad descriptor, and the process is
			// exiting.
			defer func() { _ = stats.Close() }()
		}
	}
	if *profiling && *metricsAddr == "" {
		log.Warn("--profiling without --metrics-addr: the profiles are not served")
	}
	srv := listenAddrs{health: *healthAddr, metrics: *metricsAddr, profiling: *profiling}
	if err := runAgent(ctx, cfg, dpCfg, *mapRefresh, ns, src, m, prox, srv, log); err != nil {
		log.Error("agent failed", "err", err)
		return 1
	}
	return 0
}

// northSouthConfig is what runAgent runs beside the reconciler for
// north-south traffic.
type northSouthConfig struct {
	gcEvery time.Duration // conntrack garbage collection period (> 0)
	hc      bool          // serve healthCheckNodePorts
	hcHosts []string      // on these hosts ("": every address)
}

// listenAddrs is where runAgent serves health and metrics ("": not served).
type listenAddrs struct {
	health, metrics string
	profiling       bool // net/http/pprof on the metrics server
}

// healthCheckPorts returns the server of the healthCheckNodePorts, nil if
// ns does not serve them. prox is what /livez answers from (nil with the
// manifest source): the ports answer serviceProxyHealthy false, and 503,
// while its datapath is stale, as kube-proxy's do.
func healthCheckPorts(ns northSouthConfig, prox *health.Proxier, log *slog.Logger) *health.NodePortServer {
	if !ns.hc {
		return nil
	}
	return health.NewNodePortServer(ns.hcHosts, prox, log.With("component", "healthcheck"))
}

// runAgent opens the datapath and runs the agent, serving health and
// metrics beside it, until ctx is done or something fails. The reconciler
// re-reads the maps every mapRefresh (0: never).
func runAgent(ctx context.Context, cfg agent.Config, dpCfg datapath.Config, mapRefresh time.Duration, ns northSouthConfig, src agent.Source, m *metrics.Metrics, prox *health.Proxier, srv listenAddrs, log *slog.Logger) error {
	// Listen before touching the datapath, so a taken port fails fast.
	var healthL, metricsL net.Listener
	var err error
	if srv.health != "" {
		if healthL, err = listenServer("health", srv.health); err != nil {
			reportServerFailure(src, true, err, log)
			return err
		}
	}
	// closeListeners closes what listens when the start fails before
	// the servers take the listeners.
	closeListeners := func() {
		for _, l := range []net.Listener{healthL, metricsL} {
			if l != nil {
				_ = l.Close() // nothing was accepted on it
			}
		}
	}
	if srv.metrics != "" {
		if metricsL, err = listenServer("metrics", srv.metrics); err != nil {
			closeListeners()
			reportServerFailure(src, false, err, log)
			return err
		}
	}

	dp, err := datapath.Open(dpCfg)
	if err != nil {
		closeListeners()
		return fmt.Errorf("open datapath: %w", err)
	}
	if n := dp.RetiredLeftOut(); n > 0 {
		log.Warn("retired frontends left out of the smaller service maps: their established per-packet flows end",
			"retired", n, "max_services", dpCfg.MaxServices)
	}
	if dpCfg.PreallocateMaps {
		b, err := dp.PreallocatedBytes()
		if err != nil {
			closeListeners()
			// The start failed: the pins go back as they were.
			return errors.Join(err, dp.Abort())
		}
		log.Info("service maps preallocated", "kernel_mib", b>>20)
	}
	prepareDatapath(dp, cfg, m, log)
	m.SetCapacity(dp.Maps().Capacity)
	m.SetDatapath(dp)
	if dpCfg.ServiceMetrics {
		m.SetServiceStats(dp.Maps())
	}
	cfg.Observers = append(cfg.Observers, m, &dryRunLoader{dp: dp, log: log},
		&staleUDPEnder{end: dp.EndStaleUDP, cgroup: cfg.Cgroup, observe: m.ObserveStaleUDP, log: log.With("component", "stale-udp")})
	cfg.BeforeFirstApply = collectBeforeFirstApply
	if hc := healthCheckPorts(ns, prox, log); hc != nil {
		defer hc.Close()
		reportBindFailures(hc, src)
		cfg.Observers = append(cfg.Observers, hc)
	}
	// /readyz's count of the frontends not programmed, and on the metrics
	// address their list (pkg/health's readyz.go).
	unprogrammed := health.NewUnprogrammed()
	cfg.Observers = append(cfg.Observers, unprogrammed)
	rec := reconciler.New(dp.Maps(), log.With("component", "reconciler"))
	m.SetBackendCounter(rec.BackendCounts) // the reconciler's count: no second map of every backend
	m.SetDriftCounter(rec.Drift)
	m.SetFullSync(rec.LastApplyFull) // kube-proxy's full and partial sync durations
	rec.SetRefreshHook(collectAroundRefresh)
	rec.SetRefreshInterval(mapRefresh)
	// A removed frontend's established flows live on under a retired
	// master until conntrack would have let them idle out (retired.go;
	// a UDP one's backends held and flushed if another Service takes its
	// address and port: udpretired.go).
	rec.SetRetireTimeout(dpCfg.CTTimeoutTCP)
	rec.SetUDPRetireTimeout(dpCfg.CTTimeoutUDP)
	// Their gauge, and their entries in the rev_nat and services fill
	// ratios, which the programmed state does not count.
	m.SetRetiredCounter(rec.RetiredCounts)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// users are the goroutines beside the agent that use the datapath's
	// maps (the conntrack GC, the XDP route follower, the HTTP servers:
	// a scrape reads the maps); the agent closes the datapath when Run
	// returns, and only once they have stopped.
	var users sync.WaitGroup
	a := agent.New(cfg, closedLast{dp, func() { cancel(nil); users.Wait() }}, rec, log)

	served := make(chan struct{}, 2)
	serve := func(name string, fn func() error) {
		users.Add(1)
		go func() {
			defer users.Done()
			defer func() { served <- struct{}{} }()
			if err := fn(); err != nil {
				err = fmt.Errorf("%s server: %w", name, err)
				cancel(err)
				reportServerFailure(src, name == "health", err, log) // runAgent waits for served
			}
		}()
	}
	servers := 0
	if healthL != nil {
		servers++
		h := health.CountedHandler(a.Ready, unprogrammed, prox, m.ObserveProbe)
		serve("health", func() error { return serveHTTP(ctx, healthL, h, log) })
	}
	if metricsL != nil {
		servers++
		h := metricsHandler(m.Handler(), health.VerboseReadyz(a.Ready, unprogrammed), srv.profiling)
		serve("metrics", func() error { return serveHTTP(ctx, metricsL, h, log) })
	}
	users.Go(func() {
		runConntrackGC(ctx, observedGC{ctUpkeep{dp.Maps(), dp}, m.ObserveConntrackGC, m.SetConntrackHalfOpen}, ns.gcEvery, log.With("component", "conntrack-gc"))
	})
	if dpCfg.XDP != datapath.XDPOff {
		users.Go(func() { followRouting(ctx, watchRouting(dp), 5*time.Second, log.With("component", "xdp-routes")) })
	}
	// Once started: a node device enslaved to or released from a
	// bridge, bond, team or Open vSwitch master is followed (portwatch.go),
	// and so are the ICMP rate limit sysctls, read again every 10 s
	// (icmprl.go: sysctls notify no change).
	users.Go(func() { dp.FollowPorts(ctx, 5*time.Second, log.With("component", "ports")) })
	users.Go(func() {
		dp.FollowICMPRateLimits(ctx, dpCfg.ProcSysNet, 10*time.Second, log.With("component", "icmp-ratelimit"))
	})
	runErr := a.Run(ctx, src)
	cancel(nil)
	for range servers {
		<-served
	}
	if cause := context.Cause(ctx); runErr == nil && cause != nil && !errors.Is(cause, context.Canceled) {
		return cause
	}
	return runErr
}

// prepareDatapath does what comes between opening the datapath and
// attaching it: it says what the kernel offers beyond the minimum, makes
// the metrics and log hear about socket terminations, detaches what an
// earlier agent attached and this configuration does not name (before the
// agent attaches the rest), and reserves the SNAT ports from the node's
// ephemeral ports when a device is attached or may be (a --devices
// pattern that matches none yet). Failures are logged: traffic goes on as
// configured.
func prepareDatapath(dp *datapath.Datapath, cfg agent.Config, m *metrics.Metrics, log *slog.Logger) {
	f := dp.Features()
	if cfg.Cgroup != "" {
		log.Info("socket load balancing", "refusal_errno", map[bool]string{true: "ECONNREFUSED", false: "EPERM"}[f.SetRetval],
			"udp_socket_termination", f.SockDestroy)
		if !f.SetRetval {
			log.Warn("kernel before 6.1: a connect to a Service without endpoints fails with EPERM, not ECONNREFUSED")
		}
		if f.SockDestroy == datapath.SockDestroyNone {
			log.Warn("connected UDP sockets keep a removed backend until the application reconnects: " +
				"the kernel has neither bpf_sock_destroy (6.5+) nor SOCK_DESTROY (CONFIG_INET_DIAG_DESTROY)")
		} else {
			m.DeclareSocketTermination(string(f.SockDestroy))
		}
	}
	if !f.MapCount {
		log.Info("kernel before 6.6 (no bpf_map_sum_elem_count): a /metrics scrape walks the hash maps to count their entries")
	}
	dp.Maps().OnSocketTermination(func(st datapath.SocketTermination) {
		m.ObserveSocketTermination(string(st.Method), st.Destroyed, st.Failed, st.SparedUnconnected, st.SparedStillBackend)
		args := []any{"method", st.Method, "backends", st.Backends, "destroyed", st.Destroyed, "failed", st.Failed,
			"spared_unconnected", st.SparedUnconnected, "spared_still_backend", st.SparedStillBackend, "namespaces", st.Namespaces}
		if st.Err != nil {
			log.Error("ending the UDP sockets of removed backends", append(args, "err", st.Err)...)
			return
		}
		log.Info("ended the connected UDP sockets of removed backends", args...)
	})
	if err := dp.Prune(cfg.Cgroup, cfg.Devices); err != nil {
		log.Error("detaching what the configuration no longer names", "err", err)
	}
	if len(cfg.Devices) == 0 && cfg.FollowDevices == nil {
		return // nothing is source-NATed, now or later
	}
	res, err := dp.ReserveSNATPorts()
	logSNATReservation(res, err, log)
}

// checkProcSysNet refuses a --proc-sys-net that is not a /proc/sys/net:
// empty, or without ipv4/ip_local_port_range (a typo, or a manifest
// without the DaemonSet's mount of the node's), where the ICMP rate
// limits would fall back to Linux's defaults without a word and the SNAT
// ports go unreserved.
func checkProcSysNet(dir string) error {
	if dir == "" {
		return errors.New("--proc-sys-net: empty, want the node's /proc/sys/net")
	}
	if _, err := os.Stat(filepath.Join(dir, "ipv4", "ip_local_port_range")); err != nil {
		return fmt.Errorf("--proc-sys-net %s: not the node's /proc/sys/net: %w", dir, err)
	}
	return nil
}

// logSNATReservation logs what the SNAT port reservation found and did
// (ReserveSNATPorts): a refusal and a failed write give opposite advice.
func logSNATReservation(res datapath.PortReservation, err error, log *slog.Logger) {
	switch {
	case errors.Is(err, datapath.ErrReservationRefused):
		log.Warn(fmt.Sprintf("SNAT ports not reserved: it would leave the node %d ephemeral ports (fewer than 1024, and every connect() without a bound port would fail): "+
			"narrow --snat-port-range, or move it out of ip_local_port_range %s. "+
			"Until then the node's own connections may take these ports: a reply to one, on the tuple of a source-NATed flow to the same endpoint address and port, "+
			"is translated back and sent to that flow's client, and the node's connection never gets it", res.EphemeralLeft, res.Ephemeral),
			"ports", res.Exposed, "err", err)
	case err != nil && res.Exposed != "":
		log.Warn("SNAT ports not reserved: the node may hand them out to its own connections, whose replies would then be taken for NodePort flows; "+
			"reserve them on the node (sysctl net.ipv4.ip_local_reserved_ports) or narrow ip_local_port_range",
			"ports", res.Exposed, "err", err)
	case err != nil:
		log.Info("SNAT ports not reserved, but outside the node's ephemeral ports", "err", err)
	case res.Added:
		log.Info("SNAT ports reserved from the node's ephemeral ports")
	}
}

// closedLast is the agent's datapath in runAgent: its Close and Abort
// first run stop, which ends and waits for the datapath's other users, so
// that none reads or writes a map after its descriptor is closed (or
// through a descriptor number the process has since reused).
type closedLast struct {
	*datapath.Datapath
	stop func()
}

func (c closedLast) Close() error { c.stop(); return c.Datapath.Close() }
func (c closedLast) Abort() error { c.stop(); return c.Datapath.Abort() }

// httpShutdownWait is how long serveHTTP's shutdown waits for idle
// connections before it closes the rest (a variable for tests).
var httpShutdownWait = 2 * time.Second

// serveHTTP serves h on l until ctx is done, or until serving fails (its
// listener), when it returns the error. It returns only once no handler
// runs: a /metrics scrape reads the datapath's maps, which runAgent
// closes after this returns (closedLast), and http.Server's Shutdown
// gives up on handlers still running when its deadline passes. Past the
// deadline the connections are closed, which cancels the requests'
// contexts (a CPU profile ends early), and their handlers are waited for;
// a request that comes in since is answered 503.
func serveHTTP(ctx context.Context, l net.Listener, h http.Handler, log *slog.Logger) error {
	var running inflight
	srv := &http.Server{Handler: running.wrap(h), ReadHeaderTimeout: 5 * time.Second}
	// A Serve failing on its own shuts down the connections it has
	// too; the shutdown waiting for ctx alone would wait forever, as
	// runAgent ends ctx when this returns.
	ctx, cancel := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), httpShutdownWait)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			// Past the deadline: what is left is closed, its
			// handlers waited for below. The error is Shutdown's
			// again, or a listener's close error: nothing to do.
			_ = srv.Close()
		}
	}()
	log.Info("serving HTTP", "addr", l.Addr().String())
	err := srv.Serve(l)
	cancel()
	<-stopped
	running.wait()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// inflight counts the handlers running, so that serveHTTP can wait for
// them.
type inflight struct {
	mu      sync.Mutex
	closed  bool // wait was called: handlers no longer run
	running sync.WaitGroup
}

// wrap returns h counted in f.
func (f *inflight) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			http.Error(w, "shutting down", http.StatusServiceUnavailable)
			return
		}
		f.running.Add(1)
		f.mu.Unlock()
		defer f.running.Done()
		h.ServeHTTP(w, r)
	})
}

// wait returns once no handler runs, and keeps them from running again.
func (f *inflight) wait() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.running.Wait()
}

func runCleanup(args []string) int {
	fs := flag.NewFlagSet("sluice cleanup", flag.ContinueOnError)
	bpffs := fs.String("bpffs", datapath.DefaultBPFFS, "bpffs mount the agent pinned under")
	fs.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: sluice cleanup [--bpffs DIR]\n\nRemoves every program, link and map Sluice pinned under <bpffs>/sluice/;\ntraffic to services stops being translated.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := datapath.Cleanup(*bpffs); err != nil {
		fmt.Fprintf(os.Stderr, "sluice cleanup: %v\n", err)
		return 1
	}
	return 0
}

func newLogger(level string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}

// followDevices returns what follows the links sel's patterns match, once
// the agent's start is complete (agent.Config.FollowDevices): each link
// attached or forgotten is logged at Info, a failure at Error, an
// overrun (a burst of link changes) at Warn, at most once a minute, and a
// failed subscription is retried every 5 seconds (deviceReporter).
func followDevices(sel datapath.DeviceSelector, log *slog.Logger) func(context.Context, agent.Datapath) {
	return followWatch(log, "following the --devices patterns", "following the --devices patterns",
		func(dp *datapath.Datapath) (*datapath.DeviceWatch, error) { return dp.NewDeviceWatch(sel) },
		deviceMessages{
			overrun:   "following the --devices patterns: changes missed, listing again",
			failed:    "device",
			already:   "device attached already",
			attached:  "tc programs attached to device",
			forgotten: "device forgotten",
		})
}

// followWatch returns what runs the device watch newWatch makes on the
// agent's datapath until ctx is done: its events logged with msgs
// (deviceReporter), a failed subscription retried every 5 seconds. what
// names the watch where the agent's datapath is none (logged at Error),
// noWatch is logged at Error with the error where newWatch fails.
func followWatch(log *slog.Logger, what, noWatch string, newWatch func(*datapath.Datapath) (*datapath.DeviceWatch, error), msgs deviceMessages) func(context.Context, agent.Datapath) {
	return func(ctx context.Context, adp agent.Datapath) {
		dp := datapathOf(adp)
		if dp == nil {
			log.Error(what+": not a datapath", "type", fmt.Sprintf("%T", adp))
			return
		}
		w, err := newWatch(dp)
		if err != nil {
			log.Error(noWatch, "err", err)
			return
		}
		w.Run(ctx, deviceReporter(log, msgs), retryAfter5s)
	}
}

// datapathOf is the datapath the agent runs (runAgent wraps it in
// closedLast), or nil.
func datapathOf(adp agent.Datapath) *datapath.Datapath {
	switch v := adp.(type) {
	case *datapath.Datapath:
		return v
	case closedLast:
		return v.Datapath
	}
	return nil
}

// retryAfter5s is a device watch's retry after a failed subscription:
// 5 seconds, or false once ctx is done.
func retryAfter5s(ctx context.Context) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(5 * time.Second):
		return true
	}
}

func splitList(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			out = append(out, f)
		}
	}
	return out
}
