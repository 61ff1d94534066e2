package main

import (
	"errors"
	"log/slog"
	"os"

	"github.com/sluice-lb/sluice/pkg/datapath"
)

// checkPrerequisites runs before anything is loaded or pinned: the
// manifest path exists (a typo must not leave a datapath pinned with
// nothing to program it), and the node has bpffs, cgroup v2 where socket
// load balancing attaches, and the kernel features the objects the
// configuration uses need. It logs each problem on a line of its own and
// reports whether there was none. cgroup is "" when socket load balancing
// is off.
func checkPrerequisites(manifests, bpffs, cgroup string, xdp datapath.XDPMode, log *slog.Logger) bool {
	if manifests != "" {
		if _, err := os.Stat(manifests); err != nil {
			log.Error("cannot read --manifests", "err", err)
			return false
		}
	}
	err := datapath.CheckNode(datapath.Prerequisites{BPFFS: bpffs, Cgroup: cgroup, XDP: xdp})
	var pe *datapath.PrerequisiteError
	switch {
	case err == nil:
		return true
	case errors.As(err, &pe):
		for _, p := range pe.Problems {
			log.Error("node prerequisite not met", "problem", p)
		}
	default:
		log.Error("check node prerequisites", "err", err)
	}
	return false
}
