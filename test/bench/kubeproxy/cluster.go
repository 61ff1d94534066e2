package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/uuid"

	"github.com/sluice-lb/sluice/internal/testutil/topology"
	"github.com/sluice-lb/sluice/test/kube/kubeenv"
)

// The control plane's namespace and every mode's namespace are joined by a
// veth pair with these addresses (one mode namespace exists at a time, so
// every one of them uses the same pair). nodeAddr is also the Node's
// InternalIP: the address the proxies find on their own namespace.
var (
	cpAddr   = netip.MustParsePrefix("10.255.0.1/30")
	nodeAddr = netip.MustParsePrefix("10.255.0.2/30")
)

const (
	nodeName  = "node"
	otherNode = "other" // where the endpoints are: none is local
	namespace = "bench"
	// triggerAnnotation is what the EndpointSlice controller sets to the
	// time of the change that caused a slice's update; both proxies measure
	// network programming latency from it.
	triggerAnnotation = "endpoints.kubernetes.io/last-change-trigger-time"
	// endpointBase is where endpoint addresses are taken from: service i's
	// endpoint j is endpointBase + i*E + j, and changed addresses come from
	// changeBase up.
	clusterCIDR = "10.128.0.0/9"
)

var (
	endpointBase = netip.MustParseAddr("10.128.0.0")
	changeBase   = netip.MustParseAddr("10.224.0.0")
)

// cluster is the control plane and the objects in it.
type cluster struct {
	env *kubeenv.Env
	cp  *topology.NS
	// adminKubeconfig (system:masters; kube-proxy's) and agentKubeconfig
	// (deploy/'s ServiceAccount; Sluice's) name the apiserver at cpAddr,
	// as the mode namespaces reach it.
	adminKubeconfig, agentKubeconfig string
	endpoints                        int
	services                         int // Services created so far: svc-00000 ..
	changes                          int // endpoint addresses changed so far
	rng                              *rand.Rand
	// viaAPI creates every Service through the API (BENCH_POPULATE=api);
	// else all but the first are written to etcd, copies of tmpl.
	viaAPI bool
	tmpl   *template
}

// startCluster starts etcd and kube-apiserver in a namespace of topo,
// listening on all its addresses, and creates the Node and the namespace.
func startCluster(ctx context.Context, t kubeenv.TB, topo *topology.Topology, endpoints int) (*cluster, error) {
	cp, err := topo.AddNS("cp")
	if err != nil {
		return nil, err
	}
	env := kubeenv.StartWith(t, kubeenv.Options{NetNS: cp.Path, Dial: cp.DialContext,
		// After kubeenv's own --bind-address=127.0.0.1: the last wins, and
		// the proxies reach the apiserver through the veth.
		APIServerArgs: []string{"--bind-address=0.0.0.0"}})
	u, err := url.Parse(env.URL)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(u.Port(), 10, 16)
	if err != nil {
		return nil, fmt.Errorf("apiserver port in %s: %w", env.URL, err)
	}
	server := "https://" + netip.AddrPortFrom(cpAddr.Addr(), uint16(port)).String()
	c := &cluster{env: env, cp: cp, endpoints: endpoints, rng: rand.New(rand.NewPCG(14, 14)),
		adminKubeconfig: filepath.Join(env.Dir, "bench-admin.kubeconfig"),
		agentKubeconfig: filepath.Join(env.Dir, "bench-agent.kubeconfig")}
	kubeenv.WriteKubeconfig(t, c.adminKubeconfig, server, "admin", env.Config.BearerToken)
	kubeenv.WriteKubeconfig(t, c.agentKubeconfig, server, "sluice", env.AgentConfig.BearerToken)
	env.CreateNode(ctx, nodeName, nodeAddr.Addr().String())
	if _, err := env.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create namespace %s: %w", namespace, err)
	}
	return c, nil
}

// grow creates Services (and their EndpointSlices) until there are n,
// with a few concurrent clients. Their trigger times are the time of
// creation: before any mode starts, so no mode counts them as changes.
//
// Through the API (c.viaAPI) the apiserver takes most of an hour for
// 30,000: each ClusterIP it allocates makes an IPAddress object and then
// counts every IPAddress of its lister twice for its metrics
// (ipallocator's createIPAddress calls Used and Free), so a create costs
// time in proportion to the Services there already (121 Services a second
// up to 2,000, 72 from 2,000 to 4,000, about 10 near 30,000). Otherwise
// the first Service is created through the API, as a template of what the
// apiserver makes of the bench's objects (defaults, uid, managedFields, the
// IPAddress), and the rest are copies of it written straight to etcd
// (storeIPAddress, then storeService), which the apiserver's watch picks
// up: the same objects, in seconds.
func (c *cluster) grow(ctx context.Context, n int) error {
	if n <= c.services {
		return nil
	}
	from := c.services
	if !c.viaAPI && c.tmpl == nil {
		if err := c.createService(ctx, from); err != nil {
			return err
		}
		if err := c.takeTemplate(ctx, from); err != nil {
			return err
		}
		from++
	}
	if c.viaAPI {
		if err := inParallel(ctx, from, n, c.createService); err != nil {
			return err
		}
		c.services = n
		return nil
	}
	free, err := c.freeClusterIPs(ctx, n-from)
	if err != nil {
		return err
	}
	// Every IPAddress first, and in the apiserver's watch cache before
	// any Service naming one is written: its ClusterIP repair loop checks
	// each Service it hears of against its IPAddress informer and, not
	// finding the address there yet, reports the ClusterIP as not
	// allocated (an event) and tries to create it. The allocator's own
	// order, with the wait its API round trips give it.
	var mu sync.Mutex
	var newest int64
	newestIP := ""
	if err := inParallel(ctx, from, n, func(ctx context.Context, i int) error {
		rev, err := c.storeIPAddress(ctx, i, free[i-from])
		mu.Lock()
		if rev > newest {
			newest, newestIP = rev, free[i-from]
		}
		mu.Unlock()
		return err
	}); err != nil {
		return err
	}
	if err := c.waitCached(ctx, newestIP); err != nil {
		return err
	}
	if err := inParallel(ctx, from, n, func(ctx context.Context, i int) error {
		return c.storeService(ctx, i, free[i-from])
	}); err != nil {
		return err
	}
	if err := c.waitListed(ctx, n); err != nil {
		return err
	}
	c.services = n
	return nil
}

// inParallel runs do for from..n-1 on a few concurrent clients and
// returns the first error (the rest are not started).
func inParallel(ctx context.Context, from, n int, do func(context.Context, int) error) error {
	const workers = 8
	next := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := do(ctx, i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := from; i < n; i++ {
		select {
		case next <- i:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(next)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return err
}

func svcName(i int) string { return fmt.Sprintf("svc-%05d", i) }

// serviceObject is Service i as the bench creates it: ClusterIP, TCP port
// 80 to 8080, selecting app=svc-NNNNN.
func serviceObject(i int) *corev1.Service {
	name := svcName(i)
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
}

// sliceObject is Service i's EndpointSlice as the bench creates it:
// c.endpoints ready endpoints on another node, triggered now.
func (c *cluster) sliceObject(i int) *discoveryv1.EndpointSlice {
	name := svcName(i)
	eps := make([]discoveryv1.Endpoint, c.endpoints)
	for j := range eps {
		eps[j] = endpoint(addrAt(endpointBase, i*c.endpoints+j))
	}
	port, proto, portName := int32(8080), corev1.ProtocolTCP, "http"
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-0", Namespace: namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: name,
				discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"},
			Annotations: map[string]string{triggerAnnotation: time.Now().UTC().Format(time.RFC3339Nano)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Protocol: &proto, Port: &port}},
	}
}

// createService creates Service i and its EndpointSlice through the API.
func (c *cluster) createService(ctx context.Context, i int) error {
	if _, err := c.env.Client.CoreV1().Services(namespace).Create(ctx, serviceObject(i), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create service %s: %w", svcName(i), err)
	}
	slice := c.sliceObject(i)
	if _, err := c.env.Client.DiscoveryV1().EndpointSlices(namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create endpointslice %s: %w", slice.Name, err)
	}
	return nil
}

// template is what the apiserver made of one Service created through the
// API: the Service, its EndpointSlice and its ClusterIP's IPAddress.
type template struct {
	svc   *corev1.Service
	slice *discoveryv1.EndpointSlice
	addr  *networkingv1.IPAddress
}

// takeTemplate reads Service i, its slice and IPAddress back as c.tmpl.
func (c *cluster) takeTemplate(ctx context.Context, i int) error {
	svc, err := c.env.Client.CoreV1().Services(namespace).Get(ctx, svcName(i), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("template: %w", err)
	}
	slice, err := c.env.Client.DiscoveryV1().EndpointSlices(namespace).Get(ctx, svcName(i)+"-0", metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("template: %w", err)
	}
	addr, err := c.env.Client.NetworkingV1().IPAddresses().Get(ctx, svc.Spec.ClusterIP, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("template: the IPAddress of %s: %w", svc.Name, err)
	}
	c.tmpl = &template{svc: svc, slice: slice, addr: addr}
	return nil
}

// freeClusterIPs returns k addresses of the Service range that no
// IPAddress holds, in a random order (the apiserver's allocator starts
// at a random offset too).
func (c *cluster) freeClusterIPs(ctx context.Context, k int) ([]string, error) {
	used := map[string]bool{}
	list, err := c.env.Client.NetworkingV1().IPAddresses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list IPAddresses: %w", err)
	}
	for _, a := range list.Items {
		used[a.Name] = true
	}
	prefix := netip.MustParsePrefix(kubeenv.ServiceCIDR)
	size := 1 << (32 - prefix.Bits())
	var free []string
	// Not the network's address nor the last (the allocator's range).
	for _, off := range c.rng.Perm(size - 2) {
		a := addrAt(prefix.Addr(), off+1).String()
		if !used[a] {
			free = append(free, a)
			if len(free) == k {
				return free, nil
			}
		}
	}
	return nil, fmt.Errorf("%s has %d free addresses, want %d", kubeenv.ServiceCIDR, len(free), k)
}

// storeIPAddress writes the IPAddress of Service i's ClusterIP ip
// straight to etcd, a copy of c.tmpl's with its own name, uid, times and
// parent (as the API path creates it), and returns etcd's revision after
// it.
func (c *cluster) storeIPAddress(ctx context.Context, i int, ip string) (int64, error) {
	addr := c.tmpl.addr.DeepCopy()
	fresh(&addr.ObjectMeta, ip)
	addr.Spec.ParentRef.Name = svcName(i)
	return c.env.Store(ctx, kubeenv.StorageKey("ipaddresses", "", ip), addr, networkingv1.SchemeGroupVersion.WithKind("IPAddress"))
}

// storeService writes Service i with ClusterIP ip and its EndpointSlice
// straight to etcd, as copies of c.tmpl with what differs from Service to
// Service (names, uids, times, the address, the selector, labels,
// annotation and endpoints) taken from the objects the API path creates.
// The IPAddress is storeIPAddress's, written before.
func (c *cluster) storeService(ctx context.Context, i int, ip string) error {
	want := serviceObject(i)
	svc := c.tmpl.svc.DeepCopy()
	fresh(&svc.ObjectMeta, want.Name)
	svc.Spec.Selector = want.Spec.Selector
	svc.Spec.ClusterIP, svc.Spec.ClusterIPs = ip, []string{ip}
	if _, err := c.env.Store(ctx, kubeenv.StorageKey("services/specs", namespace, svc.Name), svc, corev1.SchemeGroupVersion.WithKind("Service")); err != nil {
		return err
	}
	wantSlice := c.sliceObject(i)
	slice := c.tmpl.slice.DeepCopy()
	fresh(&slice.ObjectMeta, wantSlice.Name)
	slice.Labels, slice.Annotations, slice.Endpoints = wantSlice.Labels, wantSlice.Annotations, wantSlice.Endpoints
	_, err := c.env.Store(ctx, kubeenv.StorageKey("endpointslices", namespace, slice.Name), slice, discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice"))
	return err
}

// fresh gives a copied object its own name and uid and this second as
// its creation and managedFields times; etcd gives it its resourceVersion.
func fresh(m *metav1.ObjectMeta, name string) {
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	m.Name, m.UID, m.CreationTimestamp, m.ResourceVersion = name, uuid.NewUUID(), now, ""
	for j := range m.ManagedFields {
		m.ManagedFields[j].Time = &now
	}
}

// waitCached waits until the apiserver's watch cache serves IPAddress ip
// (a get at resourceVersion 0 is answered from it). The cache applies
// etcd's events in revision order, so with the newest write there, every
// earlier one is too.
func (c *cluster) waitCached(ctx context.Context, ip string) error {
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := c.env.Client.NetworkingV1().IPAddresses().Get(ctx, ip, metav1.GetOptions{ResourceVersion: "0"})
		if err == nil {
			return nil
		}
		if !apierrors.IsNotFound(err) || time.Now().After(deadline) {
			return fmt.Errorf("IPAddress %s written to etcd, not in the apiserver's cache: %w", ip, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitListed waits until the apiserver lists n Services and n
// EndpointSlices in the namespace (its watch of etcd has caught up with
// what storeService wrote), and as many IPAddresses beside the rest.
func (c *cluster) waitListed(ctx context.Context, n int) error {
	count := func(list func(metav1.ListOptions) (metav1.ListInterface, error)) (int, error) {
		l, err := list(metav1.ListOptions{Limit: 1})
		if err != nil {
			return 0, err
		}
		got := 0
		if meta.LenList(l.(runtime.Object)) > 0 {
			got = 1
		}
		if r := l.GetRemainingItemCount(); r != nil {
			got += int(*r)
		}
		return got, nil
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		svcs, err := count(func(o metav1.ListOptions) (metav1.ListInterface, error) {
			return c.env.Client.CoreV1().Services(namespace).List(ctx, o)
		})
		if err != nil {
			return err
		}
		slices, err := count(func(o metav1.ListOptions) (metav1.ListInterface, error) {
			return c.env.Client.DiscoveryV1().EndpointSlices(namespace).List(ctx, o)
		})
		if err != nil {
			return err
		}
		if svcs >= n && slices >= n {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the apiserver lists %d Services and %d EndpointSlices of %d written to etcd", svcs, slices, n)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func endpoint(a netip.Addr) discoveryv1.Endpoint {
	ready, node := true, otherNode
	return discoveryv1.Endpoint{Addresses: []string{a.String()}, NodeName: &node,
		Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &ready}}
}

// addrAt is base + n.
func addrAt(base netip.Addr, n int) netip.Addr {
	b := base.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) + uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// change replaces one endpoint address of a random Service's slice with a
// new one, and sets the slice's trigger time to now, in one patch.
func (c *cluster) change(ctx context.Context, n int) error {
	i := c.rng.IntN(n)
	name := svcName(i)
	eps := make([]discoveryv1.Endpoint, c.endpoints)
	for j := range eps {
		eps[j] = endpoint(addrAt(endpointBase, i*c.endpoints+j))
	}
	c.changes++
	eps[c.changes%c.endpoints] = endpoint(addrAt(changeBase, c.changes))
	patch, err := json.Marshal(map[string]any{
		"metadata":  map[string]any{"annotations": map[string]string{triggerAnnotation: time.Now().UTC().Format(time.RFC3339Nano)}},
		"endpoints": eps,
	})
	if err != nil {
		return err
	}
	if _, err := c.env.Client.DiscoveryV1().EndpointSlices(namespace).Patch(ctx, name+"-0", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("patch endpointslice %s-0: %w", name, err)
	}
	return nil
}
