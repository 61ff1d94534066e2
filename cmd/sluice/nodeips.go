package main

// This node's addresses, as kube-proxy finds them (cmd/kube-proxy/app
// detectNodeIPs, pkg/proxy/node.go newNodeManager, pkg/util/node
// GetNodeHostIPs), and the waits for the Node object they and the
// NodeCIDR mode's podCIDRs (localmode.go) come from.
//
// The node IPs: --node-ip (the configuration's bindAddress, the
// DaemonSet's status.hostIPs) gives its families' addresses; with the
// Kubernetes source, a family it does not give comes from the Node's
// addresses (InternalIPs, then ExternalIPs), as kube-proxy's bindAddress
// replaces only its own family's node IP. So a dual-stack node whose
// DaemonSet passes one address (status.hostIP, a bindAddress) still
// serves NodePorts of both families.
// Of all these, kube-proxy's node IP of a family is the first (its
// primary address): NodePorts are served there by default
// (--nodeport-addresses primary), never on the node's secondary
// InternalIPs or its ExternalIPs. The whole list stays what external
// flows are source-NATed to (per device: datapath.Config.NodeIPs) and
// what the --devices default is made of, since traffic for ExternalIPs
// and LoadBalancer IPs may arrive on any of them.
//
// The waits: kube-proxy reads the Node through an informer whose first
// list has no time bound, then polls it every second, at most 30 seconds,
// for addresses, and goes on without them (its node IPs then loopback,
// its NodePorts on every address; the agent's on the --devices'
// addresses, main's fallback). The agent polls the Node the same way, but
// bounds its waits for the Node, the NodeCIDR mode's included, by
// nodeAPIWait together (the health server listens after them, and the
// DaemonSet's startupProbe allows about that), and fails if the API has
// not answered by then, for the DaemonSet to restart it: the single read
// before this went on with no node IP, and an API down at the start left
// the agent ready without NodePorts until a restart.
// The NodeCIDR mode's wait for podCIDRs (waitForPodCIDRs) is the same
// poll with its own condition and bound.

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// The start's waits for the Node, variables for tests to shorten.
var (
	// nodeAPIWait bounds the start's waits for the Node together: the
	// NodeCIDR mode's for podCIDRs (kube-proxy's 5 minutes), and the
	// node IPs' for the API to answer a read of the Node (found or not
	// found), after which the agent gives up.
	nodeAPIWait = 5 * time.Minute
	// nodeIPsWait bounds the wait for the Node to exist and have
	// addresses once the API answers: kube-proxy's nodeIPsTimeout.
	nodeIPsWait = 30 * time.Second
	// nodeWaitClock keeps the budget's time: the addresses' wait gets
	// nodeAPIWait less what the NodeCIDR wait took by it (tests move it
	// on instead of waiting).
	nodeWaitClock = time.Now
)

// nodePoll is how often the Node is read while waiting (kube-proxy's poll
// interval).
const nodePoll = time.Second

// nodeRead is what the reads of the Node so far said.
type nodeRead struct {
	// node is the Node of the last read that answered (nil: not found,
	// or no read answered).
	node *corev1.Node
	// notFound: the last read that answered did not find the Node.
	notFound bool
	// err is the last read's error when it failed other than not found
	// (nil when it answered).
	err error
}

// reason says why a wait goes on, for its log lines.
func (r nodeRead) reason() string {
	switch {
	case r.err != nil:
		return r.err.Error()
	case r.notFound:
		return "not found"
	}
	return "found"
}

// pollNode reads the Node nodeName every poll until done says the reads
// so far are what the caller waits for, or ctx is done, and returns them
// (with ctx's error in the second case). report is called with the
// first reads that are not done and whenever the reason to wait changes
// (the Node found or not, the error), for the caller to log it.
func pollNode(ctx context.Context, client kubernetes.Interface, nodeName string, poll time.Duration, done func(nodeRead) bool, report func(nodeRead)) (nodeRead, error) {
	var r nodeRead
	reported := ""
	for reads := 0; ; reads++ {
		node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		switch {
		case err == nil:
			r = nodeRead{node: node}
		case apierrors.IsNotFound(err):
			r = nodeRead{notFound: true}
		case ctx.Err() == nil || reads == 0:
			r.err = err
			// else the wait's end cut the read short: the reads
			// before say why it waited.
		}
		if done(r) {
			return r, nil
		}
		if reason := r.reason(); reason != reported {
			report(r)
			reported = reason
		}
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-time.After(poll):
		}
	}
}

// waitForNodeIPs returns this node's Node object once it has addresses,
// starting from have (the Node the NodeCIDR wait read, or nil). It waits
// at most bound in all: for the API to answer a read (an error after
// bound, with the last read's error), then at most ipBound more for the
// Node to exist and have an InternalIP or ExternalIP; after that it
// returns the Node as read (nil if not found), without error: kube-proxy
// goes on without node IPs. bound keeps the start's waits together under
// what the DaemonSet's startupProbe allows (the health server listens
// after them). A done ctx (a signal) ends it with ctx's error.
func waitForNodeIPs(ctx context.Context, client kubernetes.Interface, nodeName string, have *corev1.Node, bound, ipBound, poll time.Duration, log *slog.Logger) (*corev1.Node, error) {
	hasIPs := func(r nodeRead) bool { return len(translate.NodeIPs(r.node)) > 0 }
	bctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	if have == nil {
		r, err := pollNode(bctx, client, nodeName, poll, func(r nodeRead) bool { return r.err == nil },
			func(r nodeRead) {
				log.Warn("reading the Node for this node's addresses: the API does not answer; retrying", "node", nodeName, "at_most", bound, "err", r.err)
			})
		switch {
		case ctx.Err() != nil:
			return nil, fmt.Errorf("reading node %q: %w", nodeName, ctx.Err())
		case err != nil:
			return nil, fmt.Errorf("reading node %q: the API did not answer for %v: last read: %w", nodeName, bound, r.err)
		case hasIPs(r):
			return r.node, nil
		}
		have = r.node
	} else if hasIPs(nodeRead{node: have}) {
		return have, nil
	}
	ictx, cancel := context.WithTimeout(bctx, ipBound)
	defer cancel()
	r, err := pollNode(ictx, client, nodeName, poll, hasIPs, func(r nodeRead) {
		log.Info("waiting for the Node's addresses (InternalIP, ExternalIP)", "node", nodeName, "at_most", ipBound,
			"node_exists", !r.notFound, "err", r.err)
	})
	switch {
	case ctx.Err() != nil:
		return nil, fmt.Errorf("waiting for the addresses of node %q: %w", nodeName, ctx.Err())
	case err == nil:
		return r.node, nil
	}
	// kube-proxy's words, at its level.
	log.Error("timed out waiting for the Node to be assigned addresses: no node IPs from it", "node", nodeName, "waited", ipBound,
		"node_exists", !r.notFound, "err", r.err)
	if r.node == nil {
		return have, nil
	}
	return r.node, nil
}

// bothFamilies reports whether addrs hold an address of each family.
func bothFamilies(addrs []netip.Addr) bool {
	return slices.ContainsFunc(addrs, netip.Addr.Is4) && slices.ContainsFunc(addrs, netip.Addr.Is6)
}

// nodeAddrs are this node's addresses, as the agent uses them.
type nodeAddrs struct {
	// all are --node-ip's addresses, then the Node's (translate.NodeIPs)
	// of the families --node-ip gives none of: what external flows are
	// source-NATed to (datapath.Config.NodeIPs), and where the devices
	// default comes from.
	all []netip.Addr
	// primary are kube-proxy's node IPs: the first of all of each
	// family (translate.Node.IPs).
	primary []netip.Addr
	// fromNode are the addresses all took from the Node.
	fromNode []netip.Addr
}

// nodeAddressesOf merges --node-ip's addresses flagIPs with node's (nil:
// none), as kube-proxy's detectNodeIPs merges bindAddress with the Node's
// GetNodeHostIPs: a family flagIPs give is theirs alone.
func nodeAddressesOf(flagIPs []netip.Addr, node *corev1.Node) nodeAddrs {
	na := nodeAddrs{all: slices.Clone(flagIPs)}
	for _, a := range translate.NodeIPs(node) {
		if !slices.ContainsFunc(flagIPs, func(b netip.Addr) bool { return b.Is6() == a.Is6() }) {
			na.fromNode = append(na.fromNode, a)
		}
	}
	na.all = append(na.all, na.fromNode...)
	na.primary = translate.PrimaryIPs(na.all)
	return na
}

// primaryNodePorts are the addresses --nodeport-addresses primary (the
// default) serves NodePorts on: kube-proxy's node IP of each family, a
// loopback one left out as kube-proxy leaves it out.
func (na nodeAddrs) primaryNodePorts() []netip.Addr {
	return slices.DeleteFunc(slices.Clone(na.primary), netip.Addr.IsLoopback)
}

// applyHostnameOverride applies --hostname-override, kube-proxy's name
// of --node-name (kubeadm's kube-proxy DaemonSet passes
// --hostname-override=$(NODE_NAME)), to nodeName: lower-cased and
// trimmed, as kube-proxy's GetHostname makes it. It wins over a node name
// from --config's hostnameOverride; beside a --node-name given on the
// command line (nodeNameGiven) it must name the same node.
func applyHostnameOverride(nodeName *string, override string, nodeNameGiven bool) error {
	h := strings.ToLower(strings.TrimSpace(override))
	switch {
	case override == "":
		return nil
	case h == "":
		// kube-proxy's processHostnameOverrideFlag refuses it too.
		return fmt.Errorf("--hostname-override %q: empty after trimming", override)
	case nodeNameGiven && !strings.EqualFold(*nodeName, h):
		return fmt.Errorf("--node-name %q and --hostname-override %q name different nodes", *nodeName, override)
	}
	*nodeName = h
	return nil
}
