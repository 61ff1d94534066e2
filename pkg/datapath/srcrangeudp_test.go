package datapath

import (
	"testing"

	"github.com/sluice-lb/sluice/pkg/model"
)

// TestSourceRangesKeepEstablishedUDP: TestSourceRangesKeepEstablished
// for UDP. A UDP flow the backend has answered is one netfilter no longer
// sees as `ct state new` (its conntrack has seen a reply), so a narrowing
// of loadBalancerSourceRanges leaves it going, through tc and through
// XDP; a flow not answered yet is still new to netfilter, so its next
// datagram is checked and refused, as a new flow's first one is.
func TestSourceRangesKeepEstablishedUDP(t *testing.T) {
	srcRangesNarrowedHooks(t, model.UDP)
}
