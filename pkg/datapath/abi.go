package datapath

import (
	"bytes"
	"fmt"
	"strings"
	"sync"

	"github.com/cilium/ebpf/btf"

	"github.com/sluice-lb/sluice/pkg/reconciler"
)

// The values the agent and the BPF programs exchange through maps come
// from bpf/lib/structs.h, never from a copy: bpf2go -type generates the
// map layouts and the enums (ct_dir, ct_flags, svc_flags, node_dev_flags,
// metric_reason) into sock_bpfel.go, and the metric labels are read from
// the same enum in the embedded object's BTF.

// Conntrack directions (ct4_key.dir) and flags (ct4_entry.flags), typed
// like the fields that hold them.
const (
	ctForward = uint8(sockCtDirCT_FORWARD)
	ctReverse = uint8(sockCtDirCT_REVERSE)

	ctFlagSNAT    = uint32(sockCtFlagsCT_F_SNAT)
	ctFlagFinFwd  = uint32(sockCtFlagsCT_F_FIN_FWD)
	ctFlagFinRev  = uint32(sockCtFlagsCT_F_FIN_REV)
	ctFlagRSTFwd  = uint32(sockCtFlagsCT_F_RST_FWD)
	ctFlagRSTRev  = uint32(sockCtFlagsCT_F_RST_REV)
	ctFlagChalFwd = uint32(sockCtFlagsCT_F_CHAL_FWD)
	ctFlagChalRev = uint32(sockCtFlagsCT_F_CHAL_REV)
	ctFlagReplied = uint32(sockCtFlagsCT_F_REPLIED)
	ctFlagCounted = uint32(sockCtFlagsCT_F_COUNTED)
	// ctFlagAdmitted marks a port reservation counted in the half-open
	// share until ctFlagCounted is set on it (conntrack.h).
	ctFlagAdmitted = uint32(sockCtFlagsCT_F_ADMITTED)
	// ctFlagAwait marks a TCP flow answered but not assured yet (its
	// client's ACK not seen), ctFlagAssured one assured since
	// (conntrack.h, ct_awaiting).
	ctFlagAwait   = uint32(sockCtFlagsCT_F_AWAIT)
	ctFlagAssured = uint32(sockCtFlagsCT_F_ASSURED)
	// ctFlagRST is a RST either way (conntrack.h, CT_F_RST_ANY).
	ctFlagRST = ctFlagRSTFwd | ctFlagRSTRev
	// ctFlagChal is a challenged RST either way (CT_F_CHAL_ANY).
	ctFlagChal = ctFlagChalFwd | ctFlagChalRev

	// nodeDevL3 flags a device without a link-layer header, nodeDevTC
	// one the agent attached tc to, nodeDevPort a port of a bridge,
	// bond, team or Open vSwitch (node_dev.flags, isPortMaster),
	// nodeDevTunnel an overlay tunnel (isTunnel), which XDP sends
	// nothing out of, nodeDevFollowed a tunnel the agent follows (the
	// tunnel watch's, NewTunnelWatch: BPF never reads it), which a
	// restart keeps (PinnedTunnelDevices).
	nodeDevL3       = uint32(sockNodeDevFlagsNODE_DEV_F_L3)
	nodeDevTC       = uint32(sockNodeDevFlagsNODE_DEV_F_TC)
	nodeDevPort     = uint32(sockNodeDevFlagsNODE_DEV_F_PORT)
	nodeDevTunnel   = uint32(sockNodeDevFlagsNODE_DEV_F_TUNNEL)
	nodeDevFollowed = uint32(sockNodeDevFlagsNODE_DEV_F_FOLLOWED)

	// The kinds of the node's CIDRs (node_cidr_key.kind).
	nodeCIDRCluster = uint32(sockNodeCidrKindNODE_CIDR_CLUSTER)
	nodeCIDRService = uint32(sockNodeCidrKindNODE_CIDR_SERVICE)

	// The scopes of a frontend (lb4_key.scope).
	scopeDefault  = reconciler.Scope(sockLbScopeLB_SCOPE_DEFAULT)
	scopeInternal = reconciler.Scope(sockLbScopeLB_SCOPE_INTERNAL)
)

// The reconciler writes a master's flags (reconciler.Master.Flags) as
// reconciler.Flag*, and cannot import this package (which imports it), so
// it keeps its own named constants. These declarations do not compile
// unless each equals its enum svc_flags value: an array type's length is
// the constant, and [a]struct{} is assignable to [b]struct{} only if a == b.
var (
	_ [reconciler.FlagExternal]struct{}     = [sockSvcFlagsSVC_F_EXTERNAL]struct{}{}
	_ [reconciler.FlagLocal]struct{}        = [sockSvcFlagsSVC_F_LOCAL]struct{}{}
	_ [reconciler.FlagSourceRanges]struct{} = [sockSvcFlagsSVC_F_SRC_RANGES]struct{}{}
	_ [reconciler.FlagAffinity]struct{}     = [sockSvcFlagsSVC_F_AFFINITY]struct{}{}
	_ [reconciler.FlagTwoScopes]struct{}    = [sockSvcFlagsSVC_F_TWO_SCOPES]struct{}{}
	_ [reconciler.FlagDropEmpty]struct{}    = [sockSvcFlagsSVC_F_DROP_EMPTY]struct{}{}
	_ [reconciler.FlagRetired]struct{}      = [sockSvcFlagsSVC_F_RETIRED]struct{}{}
	_ [reconciler.ScopeDefault]struct{}     = [sockLbScopeLB_SCOPE_DEFAULT]struct{}{}
	_ [reconciler.ScopeInternal]struct{}    = [sockLbScopeLB_SCOPE_INTERNAL]struct{}{}
)

// metricNames returns the label of each reason of enum metric_reason, by
// value: its C name, lower-cased, without METRIC_ (METRIC_TC_DNAT_NEW is
// "tc_dnat_new"). They are read from the enum in the embedded socket
// object's BTF, the enum the generated sockMetricReason constants come
// from, so a reason added in C is counted and labelled with no change here.
var metricNames = sync.OnceValue(func() []string {
	names, err := reasonNames(_SockBytes)
	if err != nil {
		// The object is embedded in this binary: only a broken build
		// gets here, and every test that opens a datapath fails.
		panic(fmt.Sprintf("embedded BPF object: %v", err))
	}
	return names
})

// reasonNames reads enum metric_reason from the BTF of the ELF object obj.
func reasonNames(obj []byte) ([]string, error) {
	spec, err := btf.LoadSpecFromReader(bytes.NewReader(obj))
	if err != nil {
		return nil, fmt.Errorf("load BTF: %w", err)
	}
	var enum *btf.Enum
	if err := spec.TypeByName("metric_reason", &enum); err != nil {
		return nil, fmt.Errorf("enum metric_reason: %w", err)
	}
	n := -1 // METRIC_MAX: the number of reasons
	for _, v := range enum.Values {
		if v.Name == "METRIC_MAX" {
			n = int(v.Value)
		}
	}
	if n < 0 || n != len(enum.Values)-1 {
		return nil, fmt.Errorf("enum metric_reason: want reasons 0..METRIC_MAX-1 and METRIC_MAX, have %d values with METRIC_MAX=%d", len(enum.Values), n)
	}
	// n distinct values below n: each of 0..n-1 has a name.
	names := make([]string, n)
	for _, v := range enum.Values {
		if v.Name == "METRIC_MAX" {
			continue
		}
		name, ok := strings.CutPrefix(v.Name, "METRIC_")
		if !ok || name == "" || int(v.Value) >= n || names[v.Value] != "" {
			return nil, fmt.Errorf("enum metric_reason: %s = %d: want METRIC_<name>, a value below METRIC_MAX, each once", v.Name, v.Value)
		}
		names[v.Value] = strings.ToLower(name)
	}
	return names, nil
}
