package main

// The Kubernetes source plugs in here, kept apart from main.go so that its
// flags and client setup live in one file.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/sluice-lb/sluice/pkg/agent"
	"github.com/sluice-lb/sluice/pkg/health"
	"github.com/sluice-lb/sluice/pkg/metrics"
	"github.com/sluice-lb/sluice/pkg/source/kube"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

type kubeFlags struct {
	kubeconfig    *string
	inCluster     *bool
	minSyncPeriod *time.Duration
	syncPeriod    *time.Duration
	apiQPS        *float64
}

func addKubeFlags(fs *flag.FlagSet) *kubeFlags {
	return &kubeFlags{
		kubeconfig: fs.String("kubeconfig", "", "watch the Kubernetes API with this kubeconfig"),
		inCluster: fs.Bool("in-cluster", false,
			"watch the Kubernetes API with the pod's service account (in-cluster config), as the DaemonSet does"),
		minSyncPeriod: fs.Duration("min-sync-period", time.Second,
			"Kubernetes source: shortest time between two syncs; changes arriving faster are folded into one"),
		syncPeriod: fs.Duration("sync-period", 30*time.Second,
			"Kubernetes source: longest time between two syncs (a full sync runs at least this often)"),
		apiQPS: fs.Float64("kube-api-qps", 20, "Kubernetes source: client queries per second (burst: twice that)"),
	}
}

// enabled reports whether the Kubernetes source was asked for.
func (k *kubeFlags) enabled() bool { return *k.kubeconfig != "" || *k.inCluster }

// source returns the Kubernetes source, and what /healthz and /livez
// answer from it. m is the agent's metrics registry: the source records
// the network programming latency in it when the agent reports a state
// programmed. podCIDRs, in NodeCIDR mode, are the Node's the agent took:
// the source fails if they change. serviceCIDRs are --service-cidr's, which
// the source adds to the ServiceCIDR objects' CIDRs.
func (k *kubeFlags) source(opts translate.Options, podCIDRs []string, serviceCIDRs []netip.Prefix, m *metrics.Metrics, log *slog.Logger) (agent.Source, *health.Proxier, error) {
	client, cfg, err := k.client(opts.Node.Name)
	if err != nil {
		return nil, nil, err
	}
	// kube-proxy's health timeout: twice the sync period, the longest a
	// healthy proxier waits between two syncs.
	var src *kube.Source
	prox := health.NewProxier(2**k.syncPeriod, func() time.Time { return src.OldestPending() })
	src, err = kube.New(kube.Config{
		Client:            client,
		REST:              cfg, // EndpointSlices read from their protobuf straight into the cache
		Options:           opts,
		MinSyncPeriod:     *k.minSyncPeriod,
		SyncPeriod:        *k.syncPeriod,
		ObserveProgrammed: m.ObserveProgrammed,
		Health:            prox,
		Changes:           m, // kube-proxy's change and last-queued metrics
		Logger:            log,
		PodCIDRs:          podCIDRs,
		ServiceCIDRs:      serviceCIDRs,
	})
	if err != nil {
		return nil, nil, err
	}
	return src, prox, nil
}

// nodeWithIPs reads this node's Node object for the node IPs --node-ip
// does not give, waiting for it as kube-proxy does (waitForNodeIPs), at
// most bound in all; have is a Node already read (NodeCIDR's), or nil.
func (k *kubeFlags) nodeWithIPs(ctx context.Context, nodeName string, have *corev1.Node, bound time.Duration, log *slog.Logger) (*corev1.Node, error) {
	client, _, err := k.client(nodeName)
	if err != nil {
		return nil, err
	}
	return waitForNodeIPs(ctx, client, nodeName, have, bound, nodeIPsWait, nodePoll, log)
}

// nodeWithPodCIDRs waits for this node's Node object to have podCIDRs
// (--detect-local-mode NodeCIDR, localmode.go) and returns it.
func (k *kubeFlags) nodeWithPodCIDRs(ctx context.Context, nodeName string, log *slog.Logger) (*corev1.Node, error) {
	client, _, err := k.client(nodeName)
	if err != nil {
		return nil, err
	}
	return waitForPodCIDRs(ctx, client, nodeName, nodeAPIWait, nodePoll, log)
}

// client returns a Kubernetes client for --kubeconfig or --in-cluster, and
// its configuration.
func (k *kubeFlags) client(nodeName string) (*kubernetes.Clientset, *rest.Config, error) {
	var cfg *rest.Config
	var err error
	switch {
	case *k.kubeconfig != "" && *k.inCluster:
		return nil, nil, errors.New("give --kubeconfig or --in-cluster, not both")
	case *k.inCluster:
		cfg, err = rest.InClusterConfig()
	default:
		cfg, err = clientcmd.BuildConfigFromFlags("", *k.kubeconfig)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("client config: %w", err)
	}
	cfg.UserAgent = "sluice/" + nodeName
	cfg.QPS = float32(*k.apiQPS)
	cfg.Burst = int(2 * *k.apiQPS)
	// One budget for the clientset and the source's own EndpointSlice
	// client (kube.Config.REST), which would otherwise each make one.
	cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(cfg.QPS, cfg.Burst)
	// Watches stream protobuf: cheaper than JSON for EndpointSlices at scale.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("client: %w", err)
	}
	return client, cfg, nil
}
