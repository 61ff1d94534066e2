package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/sluice-lb/sluice/pkg/agent"
	"github.com/sluice-lb/sluice/pkg/datapath"
)

// The overlay devices (flannel.1, tunl0, vxlan.calico: datapath.TunnelDevices):
// an overlay CNI routes other nodes' pods through one, and kube-proxy
// masquerades a NodePort, ExternalIP or LoadBalancer flow (and a
// ClusterIP one from outside the cluster CIDR) to a backend there
// whatever device it leaves by. Sluice source-NATs only through a device
// it attached to (nat_remote, bpf/tc.c), so by default it attaches to
// the overlay devices up at start too, and follows those that appear, or
// get their routes, later (followTunnels: the CNI's agent often starts
// after Sluice at node boot); with --devices, one left out is warned
// about.

// withTunnels is devs (the devices holding the node addresses) and the
// overlay devices up now (datapath.TunnelDevices) not among them, as
// many as --max-devices leaves room for. The tunnels a previous agent
// attached to (datapath.PinnedTunnelDevices, read from the pins under
// bpffs) are kept too, up and routed or not: one its watch attached after
// its start may be down or routeless at this start (the CNI's agent
// restarting with Sluice), and the start's Prune would take it off.
func withTunnels(devs []string, maxDevices int, bpffs string, log *slog.Logger) []string {
	tuns, err := datapath.TunnelDevices()
	if err != nil {
		log.Warn("list the overlay devices: not attached to, so flows routed through one to another node's backend are not source-NATed", "err", err)
		tuns = nil
	}
	kept, err := datapath.PinnedTunnelDevices(bpffs)
	if err != nil {
		log.Warn("read the overlay devices the previous agent attached to: those down or without routes now are detached", "err", err)
	}
	for _, d := range kept {
		if !slices.Contains(tuns, d) {
			tuns = append(tuns, d)
			log.Info("overlay device the previous agent attached to kept, though down or without routes now", "device", d)
		}
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
	log.Info("overlay devices attached to beside the node addresses'", "devices", tuns)
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

// followTunnels returns what attaches to the overlay devices that appear,
// come up or get their routes after the start (datapath.NewTunnelWatch),
// and forgets those deleted, once the agent's start is complete
// (agent.Config.FollowDevices): without --devices only. Each is logged
// at Info, a failure (--max-devices full: the error names the flag) at
// Error, and a failed subscription is retried every 5 seconds; an
// overrun (a burst of route changes) at Warn, at most once a minute.
func followTunnels(log *slog.Logger) func(context.Context, agent.Datapath) {
	return func(ctx context.Context, adp agent.Datapath) {
		dp := datapathOf(adp)
		if dp == nil {
			log.Error("following the overlay devices: not a datapath", "type", fmt.Sprintf("%T", adp))
			return
		}
		w, err := dp.NewTunnelWatch()
		if err != nil {
			log.Error("following the overlay devices: tunnels created later are not attached to", "err", err)
			return
		}
		w.Run(ctx, func(e datapath.DeviceEvent) {
			switch {
			case e.Reason == "overrun":
				// A burst of route changes (a BGP daemon loading a full
				// table): the watch lists again, after a backoff.
				log.Warn("following the overlay devices: changes missed, listing again", "err", e.Err)
			case e.Err != nil:
				log.Error("overlay device: flows routed through it to another node's backend are not source-NATed", "device", e.Device, "ifindex", e.Ifindex, "event", e.Reason, "err", e.Err)
			case e.Attached && e.Reason == "attached already":
				log.Debug("overlay device attached already", "device", e.Device, "ifindex", e.Ifindex)
			case e.Attached:
				log.Info("overlay device attached to", "device", e.Device, "ifindex", e.Ifindex, "event", e.Reason)
			default:
				log.Info("overlay device forgotten", "device", e.Device, "ifindex", e.Ifindex, "event", e.Reason)
			}
		}, retryAfter5s)
	}
}
