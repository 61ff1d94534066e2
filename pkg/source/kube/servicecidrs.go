package kube

// The cluster's service CIDRs, as kube-proxy (v1.33+, MultiCIDRServiceAllocator
// on by default) learns them: from every networking.k8s.io/v1 ServiceCIDR
// object's spec.cidrs, whatever its status or deletionTimestamp (a
// ServiceCIDR being deleted still holds the ClusterIPs allocated from it
// until they go: kube-proxy's ServiceCIDRConfig takes them all), their
// union with --service-cidr's (Config.ServiceCIDRs). The states the source
// hands over carry the set (model.State.ServiceCIDRs), and the reconciler
// writes it: a packet to an address in it that no ClusterIP holds is
// dropped, kube-proxy nftables' "drop traffic to unallocated ClusterIPs".
//
// An API server that does not serve the resource (before 1.33, or
// networking.k8s.io/v1 servicecidrs disabled: 404 on it), or that refuses
// this agent the list (a ClusterRole without servicecidrs, 403), leaves
// the flag's CIDRs alone, said once in the log, and is asked again every
// minute: once it serves them they are followed (kube-proxy's reflector
// keeps retrying too). A first list tells, made once the Service,
// EndpointSlice and Node caches have synced: an API server just started
// answers 403 to everyone until its RBAC cache is filled, and a 403 means
// a missing permission only once the same role was granted those lists. A CIDR that does not parse is logged with its object's
// name and skipped; the object's other CIDRs, and every other object,
// still count.

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/sluice-lb/sluice/pkg/model"
)

// serviceCIDRs is the set the ServiceCIDR objects and the flag make.
type serviceCIDRs struct {
	mu     sync.Mutex
	flag   []netip.Prefix
	byName map[string][]netip.Prefix // each object's parsed spec.cidrs
}

func newServiceCIDRs(flag []netip.Prefix) *serviceCIDRs {
	// flag's are in model.NormalPrefix's form already (cmd/sluice's
	// parsePrefix).
	return &serviceCIDRs{flag: slices.Clone(flag), byName: map[string][]netip.Prefix{}}
}

// publishServiceCIDRs records object name's CIDRs (nil: the object is gone; name ""
// records nothing) and hands the union of every object's and the flag's,
// sorted and unique, to the tracker, under the same lock: a union taken
// before another object's event is never handed over after that event's
// (Run's first hand-over and the informer's events race at start). It
// returns whether the tracker's set changed.
func (s *Source) publishServiceCIDRs(name string, cidrs []netip.Prefix) bool {
	c := s.cidrs
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case name == "":
	case cidrs == nil:
		delete(c.byName, name)
	default:
		c.byName[name] = cidrs
	}
	return s.tracker.SetServiceCIDRs(c.unionLocked())
}

// union returns the set as it is.
func (c *serviceCIDRs) union() []netip.Prefix {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.unionLocked()
}

func (c *serviceCIDRs) unionLocked() []netip.Prefix {
	out := slices.Clone(c.flag)
	for _, ps := range c.byName {
		out = append(out, ps...)
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return slices.Compact(out)
}

// parseServiceCIDR parses one of a ServiceCIDR's spec.cidrs, in
// model.NormalPrefix's form.
func parseServiceCIDR(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return p, err
	}
	return model.NormalPrefix(p)
}

// onServiceCIDR follows one ServiceCIDR object.
func (s *Source) onServiceCIDR(_, obj any, deleted bool) {
	o, ok := objectOf(obj).(*networkingv1.ServiceCIDR)
	if !ok {
		return
	}
	var ps []netip.Prefix
	if !deleted {
		ps = []netip.Prefix{} // not nil: an object without CIDRs is still there
		for _, c := range o.Spec.CIDRs {
			p, err := parseServiceCIDR(c)
			if err != nil {
				s.log.Warn("ServiceCIDR: CIDR skipped", "servicecidr", o.Name, "cidr", c, "err", err)
				continue
			}
			ps = append(ps, p)
		}
	}
	s.request(s.publishServiceCIDRs(o.Name, ps))
}

// serviceCIDRsServed reports whether the API server serves
// networking.k8s.io/v1 ServiceCIDRs to this agent, and if not why: a first
// list of at most one object answers, retried every second while the
// answer is neither that nor a 404 or 403 (the API server unreachable at
// start). false with ctx done too.
func serviceCIDRsServed(ctx context.Context, client kubernetes.Interface, log *slog.Logger) (bool, error) {
	for try := 1; ; try++ {
		_, err := client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{Limit: 1})
		switch {
		case err == nil:
			return true, nil
		case apierrors.IsNotFound(err), apierrors.IsForbidden(err):
			return false, err
		}
		// Said at Warn every 30 tries (the caches have synced: the
		// API server answered the other lists), at Debug between.
		lvl := slog.LevelDebug
		if try%30 == 0 {
			lvl = slog.LevelWarn
		}
		log.Log(ctx, lvl, "listing networking.k8s.io/v1 ServiceCIDRs failed, retrying every second", "tries", try, "err", err)
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(retryServiceCIDRs):
		}
	}
}

// followServiceCIDRs starts following the ServiceCIDR objects with
// factory's informer, if the API server serves them, and returns its
// registration's HasSynced; nil when it does not (logged once: the flag's
// CIDRs are the set then, until a re-probe every reprobeServiceCIDRs
// finds them served, as kube-proxy's reflector keeps retrying).
func (s *Source) followServiceCIDRs(ctx context.Context, factory informers.SharedInformerFactory) (cache.InformerSynced, error) {
	served, err := serviceCIDRsServed(ctx, s.cfg.Client, s.log)
	switch {
	case served:
	case ctx.Err() != nil:
		return nil, nil
	case apierrors.IsForbidden(err):
		s.log.Warn("listing networking.k8s.io/v1 ServiceCIDRs is forbidden (the ClusterRole lacks list and watch on servicecidrs): the service CIDRs are --service-cidr's alone, asked again every minute",
			"service_cidrs", s.cidrs.union(), "err", err)
		go s.reprobeServiceCIDRs(ctx, factory, reprobeServiceCIDRs)
		return nil, nil
	default:
		s.log.Info("the API server does not serve networking.k8s.io/v1 ServiceCIDRs (Kubernetes before 1.33, or networking.k8s.io/v1 servicecidrs disabled): the service CIDRs are --service-cidr's alone, asked again every minute",
			"service_cidrs", s.cidrs.union())
		go s.reprobeServiceCIDRs(ctx, factory, reprobeServiceCIDRs)
		return nil, nil
	}
	return s.watchServiceCIDRs(ctx, factory)
}

// watchServiceCIDRs starts factory's ServiceCIDR informer with
// onServiceCIDR on it.
func (s *Source) watchServiceCIDRs(ctx context.Context, factory informers.SharedInformerFactory) (cache.InformerSynced, error) {
	reg, err := factory.Networking().V1().ServiceCIDRs().Informer().AddEventHandler(handler(s.onServiceCIDR))
	if err != nil {
		return nil, fmt.Errorf("watch servicecidrs: %w", err)
	}
	factory.Start(ctx.Done())
	return reg.HasSynced, nil
}

// reprobeServiceCIDRs lists the ServiceCIDRs every interval until the API server serves them to this agent (the resource enabled,
// the ClusterRole granted), then follows them: their CIDRs join the set
// as the informer's first list delivers them, each a change like any.
func (s *Source) reprobeServiceCIDRs(ctx context.Context, factory informers.SharedInformerFactory, every time.Duration) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		_, err := s.cfg.Client.NetworkingV1().ServiceCIDRs().List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			s.log.Debug("listing ServiceCIDRs still fails", "err", err)
			continue
		}
		if _, err := s.watchServiceCIDRs(ctx, factory); err != nil {
			s.log.Warn("ServiceCIDRs now served, but not followed", "err", err)
			return
		}
		s.log.Info("networking.k8s.io/v1 ServiceCIDRs now served: following them")
		return
	}
}

// reprobeServiceCIDRs is how long a refused or unserved ServiceCIDR list
// waits before it is asked again; retryServiceCIDRs is the first list's
// pause between failures of other kinds (the API server unreachable).
var reprobeServiceCIDRs, retryServiceCIDRs = time.Minute, time.Second

// logServiceCIDRs says what the service CIDRs became: each family's, and
// what was added and removed since the last ones logged.
func (s *Source) logServiceCIDRs(cidrs []netip.Prefix) {
	var v4, v6, added, removed []string
	for _, p := range cidrs {
		if p.Addr().Is4() {
			v4 = append(v4, p.String())
		} else {
			v6 = append(v6, p.String())
		}
		if !slices.Contains(s.lastCIDRs, p) {
			added = append(added, p.String())
		}
	}
	for _, p := range s.lastCIDRs {
		if !slices.Contains(cidrs, p) {
			removed = append(removed, p.String())
		}
	}
	s.lastCIDRs = cidrs
	s.log.Info("service CIDRs", "ipv4", v4, "ipv6", v6, "added", added, "removed", removed)
}
