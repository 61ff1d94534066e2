package main

import (
	"log/slog"
	"slices"

	"github.com/sluice-lb/sluice/pkg/datapath"
)

// The overlay devices (flannel.1, tunl0, vxlan.calico: datapath.TunnelDevices):
// an overlay CNI routes other nodes' pods through one, and kube-proxy
// masquerades a NodePort, ExternalIP or LoadBalancer flow (and a
// ClusterIP one from outside the cluster CIDR) to a backend there
// whatever device it leaves by. Sluice source-NATs only through a device
// it attached to (nat_remote, bpf/tc.c), so by default it attaches to
// the overlay devices up at start too; with --devices, one left out is
// warned about.

// withTunnels is devs (the devices holding the node addresses) and the
// overlay devices up now (datapath.TunnelDevices) not among them, as
// many as --max-devices leaves room for.
func withTunnels(devs []string, maxDevices int, log *slog.Logger) []string {
	tuns, err := datapath.TunnelDevices()
	if err != nil {
		log.Warn("list the overlay devices: not attached to, so flows routed through one to another node's backend are not source-NATed", "err", err)
		return devs
	}
	tuns = slices.DeleteFunc(tuns, func(d string) bool { return slices.Contains(devs, d) })
	if len(tuns) == 0 {
		return devs
	}
	room := max(maxDevices-len(devs), 0)
	if len(tuns) > room {
		log.Warn("more overlay devices than --max-devices leaves room for: flows routed through those left out to another node's backend are not source-NATed; raise --max-devices",
			"max_devices", maxDevices, "left_out", tuns[room:])
		if tuns = tuns[:room]; len(tuns) == 0 {
			return devs
		}
	}
	log.Info("overlay devices attached to beside the node addresses' (a tunnel created later is not: name it, or a pattern matching it, in --devices)", "devices", tuns)
	return append(slices.Clone(devs), tuns...)
}

// warnTunnelsLeftOut warns about each overlay device up now that
// --devices leaves out (neither named nor matched: not in attached).
func warnTunnelsLeftOut(attached []string, log *slog.Logger) {
	tuns, err := datapath.TunnelDevices()
	if err != nil {
		return
	}
	for _, d := range tuns {
		if !slices.Contains(attached, d) {
			log.Warn("overlay device not in --devices: NodePort, ExternalIP and LoadBalancer flows (and ClusterIP ones from outside --cluster-cidr) routed through it to another node's backend are not source-NATed, "+
				"and the backend's replies go around this node; add it to --devices", "device", d)
		}
	}
}
