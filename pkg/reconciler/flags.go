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
	// FlagExternal marks NodePort, ExternalIP and LoadBalancer frontends
	// (in both scopes). A master without it, in the default scope, is a
	// ClusterIP's: its address is a service IP.
	FlagExternal uint8 = 1
	// FlagLocal is externalTrafficPolicy Local: the client's address is
	// kept (a hairpin excepted).
	FlagLocal uint8 = 2
	// FlagSourceRanges makes the datapath check the source against the
	// frontend's loadBalancerSourceRanges (default scope only: the check
	// comes before the scope is chosen).
	FlagSourceRanges uint8 = 4
	// FlagTwoScopes says the frontend has an internal scope, for
	// internal clients (default scope only).
	FlagTwoScopes uint8 = 8
	// FlagDropEmpty makes a frontend without backends drop new flows
	// instead of rejecting them.
	FlagDropEmpty uint8 = 16
	// FlagAffinity is sessionAffinity ClientIP: a client keeps its
	// backend for Master.AffinityTimeout seconds after its last new
	// connection (in both scopes of a two-scope frontend).
	FlagAffinity uint8 = 32
	// FlagRetired marks a retired master (retired.go): a removed
	// frontend whose established flows the datapath still follows; it
	// starts none. Count 0, with at most FlagExternal besides.
	FlagRetired uint8 = 64
)

// MasterFlags returns the flags of svc's master entry in scope.
func MasterFlags(svc *model.Service, scope Scope) uint8 {
	if svc == nil {
		return 0
	}
	var f uint8
	if svc.AffinityTimeout > 0 {
		f |= FlagAffinity
	}
	if svc.Kind != model.ClusterIP {
		f |= FlagExternal
		if svc.ExternalLocal {
			f |= FlagLocal
		}
	}
	if scope == ScopeInternal {
		// The Cluster set, which rejects when empty.
		return f
	}
	if svc.Kind != model.ClusterIP && len(svc.SourceRanges) > 0 {
		f |= FlagSourceRanges
	}
	if svc.TwoScopes && svc.Kind != model.ClusterIP {
		f |= FlagTwoScopes
	}
	if svc.DropWhenEmpty {
		f |= FlagDropEmpty
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

// scopes returns how many scopes svc's frontend has: 1, or 2 when it has
// an internal one (scope 1).
func scopes(svc *model.Service) Scope {
	if svc.TwoScopes && svc.Kind != model.ClusterIP {
		return 2
	}
	return 1
}

// scopeBackends returns the backends of svc's frontend in scope.
func scopeBackends(svc *model.Service, scope Scope) []model.Backend {
	if scope == ScopeInternal {
		return svc.InternalBackends
	}
	return svc.Backends
}

// isClusterIP reports whether m, the master of fe, is a ClusterIP
// frontend's: its address belongs in the service IPs. A retired master
// (retired.go) is no frontend's.
func isClusterIP(fe Frontend, m Master) bool {
	return fe.Scope == ScopeDefault && m.Flags&(FlagExternal|FlagRetired) == 0
}
