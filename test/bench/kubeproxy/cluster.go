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
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

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
func (c *cluster) grow(ctx context.Context, n int) error {
	if n <= c.services {
		return nil
	}
	const workers = 8
	next := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := c.createService(ctx, i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := c.services; i < n; i++ {
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
	if err != nil {
		return err
	}
	c.services = n
	return nil
}

func svcName(i int) string { return fmt.Sprintf("svc-%05d", i) }

// createService creates Service i (ClusterIP, TCP port 80 to 8080) and its
// EndpointSlice of c.endpoints ready endpoints on another node.
func (c *cluster) createService(ctx context.Context, i int) error {
	name := svcName(i)
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}
	if _, err := c.env.Client.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create service %s: %w", name, err)
	}
	eps := make([]discoveryv1.Endpoint, c.endpoints)
	for j := range eps {
		eps[j] = endpoint(addrAt(endpointBase, i*c.endpoints+j))
	}
	port, proto, portName := int32(8080), corev1.ProtocolTCP, "http"
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-0", Namespace: namespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: name,
				discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"},
			Annotations: map[string]string{triggerAnnotation: time.Now().UTC().Format(time.RFC3339Nano)}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports:       []discoveryv1.EndpointPort{{Name: &portName, Protocol: &proto, Port: &port}},
	}
	if _, err := c.env.Client.DiscoveryV1().EndpointSlices(namespace).Create(ctx, slice, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create endpointslice %s: %w", slice.Name, err)
	}
	return nil
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
// new one, and sets the slice's trigger time to now, in one patch. It
// returns the Service's name.
func (c *cluster) change(ctx context.Context, n int) (string, error) {
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
		return "", err
	}
	if _, err := c.env.Client.DiscoveryV1().EndpointSlices(namespace).Patch(ctx, name+"-0", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return "", fmt.Errorf("patch endpointslice %s-0: %w", name, err)
	}
	return name, nil
}
