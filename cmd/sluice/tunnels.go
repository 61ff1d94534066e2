package main

import (
	"cmp"
	"context"
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

// withTunnels returns all, devs (the devices holding the node
// addresses) and the overlay devices up now (datapath.TunnelDevices) not
// among them, as many as --max-devices leaves room for, and tuns, those
// it added: the tunnels the agent follows, whose entries AttachDevices
// flags followed (datapath.Config.FollowedTunnels). The tunnels a
// previous agent followed (datapath.PinnedTunnelDevices, read from the
// pins under bpffs: its default tunnels and its tunnel watch's) are kept
// too, up and routed or not: one its watch attached after its start may
// be down or routeless at this start (the CNI's agent restarting with
// Sluice), and the start's Prune would take it off. One it attached
// because --devices named it is not: dropped from --devices, it goes.
func withTunnels(devs []string, maxDevices int, bpffs string, log *slog.Logger) (all, tuns []string) {
	tuns, err := datapath.TunnelDevices()
	if err != nil {
		log.Warn("list the overlay devices: not attached to, so flows routed through one to another node's backend are not source-NATed", "err", err)
		tuns = nil
	}
	kept, err := datapath.PinnedTunnelDevices(bpffs)
	if err != nil {
		log.Warn("read the overlay devices the previous agent followed: those down or without routes now are detached", "err", err)
	}
	for _, d := range kept {
		if !slices.Contains(tuns, d) {
			tuns = append(tuns, d)
			log.Info("overlay device the previous agent followed kept, though down or without routes now", "device", d)
		}
	}
	tuns = slices.DeleteFunc(tuns, func(d string) bool { return slices.Contains(devs, d) })
	if len(tuns) == 0 {
		return devs, nil
	}
	room := max(maxDevices-len(devs), 0)
	if len(tuns) > room {
		log.Warn("more overlay devices than --max-devices leaves room for: flows routed through those left out to another node's backend are not source-NATed; raise --max-devices",
			"max_devices", maxDevices, "left_out", tuns[room:])
		if tuns = tuns[:room]; len(tuns) == 0 {
			return devs, nil
		}
	}
	log.Info("overlay devices attached to beside the node addresses'", "devices", tuns)
	return append(slices.Clone(devs), tuns...), tuns
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
// (agent.Config.FollowDevices): without --devices only. nodeDevs are the
// start's devices holding the node addresses, which the watch leaves
// alone (a node IP on wg0: the start's, renamed or not); the start's
// other devices, the tunnels withTunnels added (flagged followed by
// AttachDevices), are the watch's, and those it attaches are flagged
// followed too, so that a restart keeps them
// (datapath.PinnedTunnelDevices). Each is logged at Info, a failure
// (--max-devices full: the error names the flag) at Error, and a failed
// subscription is retried every 5 seconds; an overrun (a burst of route
// changes) at Warn, at most once a minute, and one found attached whose
// entry could not be flagged followed at Warn.
func followTunnels(nodeDevs []string, log *slog.Logger) func(context.Context, agent.Datapath) {
	nodeDevs = slices.Clone(nodeDevs)
	return followWatch(log, "following the overlay devices", "following the overlay devices: tunnels created later are not attached to",
		func(dp *datapath.Datapath) (*datapath.DeviceWatch, error) { return dp.NewTunnelWatch(nodeDevs...) },
		deviceMessages{
			overrun:   "following the overlay devices: changes missed, listing again",
			failed:    "overlay device: flows routed through it to another node's backend are not source-NATed",
			already:   "overlay device attached already",
			unflagged: "overlay device attached already, but not flagged followed: a restart while it is down or without routes detaches it",
			attached:  "overlay device attached to",
			forgotten: "overlay device forgotten",
		})
}

// deviceMessages are the log messages of a device watch's reporter
// (deviceReporter). unflagged is the tunnel watch's only (the pattern
// watch flags nothing): already, if unset.
type deviceMessages struct {
	overrun, failed, already, unflagged, attached, forgotten string
}

// deviceReporter logs a device watch's events (datapath.DeviceEvent)
// with msgs: an overrun (a burst of changes: the watch lists again, after
// a backoff, and reports one a minute at most) at Warn, one found
// attached whose entry could not be flagged (Attached and Err: still
// attached) at Warn, another failure at Error, a link attached or
// forgotten at Info, one found attached already at Debug.
func deviceReporter(log *slog.Logger, msgs deviceMessages) func(datapath.DeviceEvent) {
	return func(e datapath.DeviceEvent) {
		switch {
		case e.Reason == "overrun":
			log.Warn(msgs.overrun, "err", e.Err)
		case e.Err != nil && e.Attached:
			log.Warn(cmp.Or(msgs.unflagged, msgs.already), "device", e.Device, "ifindex", e.Ifindex, "event", e.Reason, "err", e.Err)
		case e.Err != nil:
			log.Error(msgs.failed, "device", e.Device, "ifindex", e.Ifindex, "event", e.Reason, "err", e.Err)
		case e.Attached && e.Reason == "attached already":
			log.Debug(msgs.already, "device", e.Device, "ifindex", e.Ifindex)
		case e.Attached:
			log.Info(msgs.attached, "device", e.Device, "ifindex", e.Ifindex, "event", e.Reason)
		default:
			log.Info(msgs.forgotten, "device", e.Device, "ifindex", e.Ifindex, "event", e.Reason)
		}
	}
}
