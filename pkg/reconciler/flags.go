package reconciler

import (
	"math"
	"time"

	"github.com/sluice-lb/sluice/pkg/model"
)

// Flags of a frontend's master entry (Master.Flags): the values of enum
// svc_flags in bpf/lib/structs.h. pkg/datapath writes Master.Flags as they
// are and does not compile unless these equal the constants bpf2go
// generates from that enum (pkg/datapath/abi.go).
const (
	// FlagExternal marks NodePort, ExternalIP and LoadBalancer frontends:
	// flows to a backend on another node are source-NATed.
	FlagExternal uint8 = 1
	// FlagLocal is externalTrafficPolicy Local: never source-NATed, and
	// dropped when the frontend has no (local) backend.
	FlagLocal uint8 = 2
	// FlagSourceRanges makes the datapath check the source against the
	// frontend's loadBalancerSourceRanges.
	FlagSourceRanges uint8 = 4
	// FlagAffinity is sessionAffinity ClientIP: a client keeps its
	// backend for Master.AffinityTimeout seconds after its last new
	// connection.
	FlagAffinity uint8 = 32
)

// MasterFlags returns the flags of svc's master entry.
func MasterFlags(svc *model.Service) uint8 {
	if svc == nil {
		return 0
	}
	var f uint8
	if svc.AffinityTimeout > 0 {
		f |= FlagAffinity
	}
	if svc.Kind == model.ClusterIP {
		return f
	}
	f |= FlagExternal
	if svc.ExternalLocal {
		f |= FlagLocal
	}
	if len(svc.SourceRanges) > 0 {
		f |= FlagSourceRanges
	}
	return f
}

// AffinitySeconds returns svc's session affinity timeout as its master
// holds it: whole seconds, rounded up (a timeout below a second is one),
// 0 without affinity.
func AffinitySeconds(svc *model.Service) uint32 {
	if svc == nil || svc.AffinityTimeout <= 0 {
		return 0
	}
	s := (svc.AffinityTimeout + time.Second - 1) / time.Second
	return uint32(min(s, math.MaxUint32))
}
