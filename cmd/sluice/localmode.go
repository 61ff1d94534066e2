package main

// --detect-local-mode: how the agent tells pods' traffic ("local" traffic
// in kube-proxy's words) from the rest, kube-proxy's flag of the name.
// Sluice tells a pod by its source address, against the node's CIDRs of
// kind cluster in sluice_node_cidrs (datapath.Config.ClusterCIDRs), which
// mean exactly kube-proxy's local traffic detector: ClusterCIDR takes them
// from --cluster-cidr, NodeCIDR from this node's Node object
// (spec.podCIDRs), for clusters that allocate pod CIDRs per node and run
// kube-proxy so (GKE, kind with some CNIs).
//
// NodeCIDR follows kube-proxy (cmd/kube-proxy/app getLocalDetectors, and
// its node manager, pkg/proxy/node.go): the start waits, at most 5
// minutes, for the Node to exist and have podCIDRs; the first CIDR of each
// family is taken and the cluster CIDR ignored (kubeadm's file always
// carries one); a later change of the Node's podCIDRs ends the agent with
// an error (the Kubernetes source, kube.Config.PodCIDRs), and the
// DaemonSet restarts it with the new ones. The datapath's cluster CIDRs
// are written once, when it opens: an agent that re-programmed them while
// running would be writing the maps outside the reconciler's order (the
// service CIDRs of the same maps change while it runs, through the
// reconciler: the ServiceCIDR objects).

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sluice-lb/sluice/pkg/kubeproxyconfig"
)

// The local traffic detectors Sluice has (kube-proxy's LocalMode values).
const (
	localModeClusterCIDR = "ClusterCIDR"
	localModeNodeCIDR    = "NodeCIDR"
)

// parseLocalMode checks --detect-local-mode.
func parseLocalMode(s string) (string, error) {
	switch s {
	case "":
		return localModeClusterCIDR, nil // kube-proxy's default for an empty mode
	case localModeClusterCIDR, localModeNodeCIDR:
		return s, nil
	case "BridgeInterface", "InterfaceNamePrefix":
		return "", fmt.Errorf("--detect-local-mode %q: %s", s, kubeproxyconfig.InterfaceModes)
	}
	return "", fmt.Errorf("--detect-local-mode %q: want %s or %s", s, localModeClusterCIDR, localModeNodeCIDR)
}

// waitForPodCIDRs reads the Node nodeName every poll until it exists and
// has spec.podCIDRs, for at most bound, and returns it (pollNode, the
// node IPs' wait's poll). After bound, the error is kube-proxy's
// ("timeout waiting for PodCIDR allocation on node ...", or "... for node
// ... to exist"), with the last read's error if it failed; when ctx is
// done first (a signal), it wraps ctx's error.
func waitForPodCIDRs(ctx context.Context, client kubernetes.Interface, nodeName string, bound, poll time.Duration, log *slog.Logger) (*corev1.Node, error) {
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	r, err := pollNode(wctx, client, nodeName, poll, func(r nodeRead) bool { return r.node != nil && len(r.node.Spec.PodCIDRs) > 0 },
		func(r nodeRead) {
			log.Info("waiting for the Node's podCIDRs (--detect-local-mode NodeCIDR)", "node", nodeName, "at_most", bound,
				"node_exists", !r.notFound, "err", r.err)
		})
	switch {
	case err == nil:
		return r.node, nil
	case ctx.Err() != nil:
		return nil, fmt.Errorf("waiting for the podCIDRs of node %q: %w", nodeName, ctx.Err())
	}
	what := fmt.Sprintf("timeout waiting for PodCIDR allocation on node %q", nodeName)
	if r.notFound {
		what = fmt.Sprintf("timeout waiting for node %q to exist", nodeName)
	}
	if r.err != nil {
		return nil, fmt.Errorf("%s (waited %v for --detect-local-mode NodeCIDR): last read: %w", what, bound, r.err)
	}
	return nil, fmt.Errorf("%s (waited %v for --detect-local-mode NodeCIDR)", what, bound)
}

// nodePodCIDRs returns the local traffic detector's CIDRs from node's
// spec.podCIDRs: the first of each family, as kube-proxy's
// getLocalDetectors takes them (the API allows one of each), masked; an
// IPv4-mapped prefix is IPv4, as in --cluster-cidr. A value that does not
// parse is an error naming the Node and the value.
func nodePodCIDRs(node *corev1.Node) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for i, s := range node.Spec.PodCIDRs {
		p, err := parsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("node %s: spec.podCIDRs[%d] %q: %w", node.Name, i, s, err)
		}
		if !slices.ContainsFunc(out, func(q netip.Prefix) bool { return q.Addr().Is4() == p.Addr().Is4() }) {
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("node %s: no spec.podCIDRs", node.Name)
	}
	return out, nil
}
