package kube

import (
	"errors"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// serviceDecoder decodes a Service from the API's protobuf wire format
// straight into what the informer's cache keeps of it (cachedService, as
// slimmer.slimService makes it of the decoded object), as sliceDecoder
// does for EndpointSlices: client-go's Service.Unmarshal makes a string of
// every label, annotation, selector entry and managedFields entry (each
// with a copy of its fieldsV1 JSON), which the transform throws away at
// once.
//
// It reads into a scratch Service only what slimService reads (through
// translate.MakeService and ValidateService: the namespace, name, uid,
// resourceVersion, generation and creationTimestamp, the proxy-name and
// headless labels, the spec's type, clusterIP(s), ipFamilies, ports
// (name, protocol, port, targetPort, nodePort), externalIPs,
// sessionAffinity and its config, loadBalancerSourceRanges, traffic
// policies and health check node port, and the status's load-balancer
// ingress IPs and ipModes), then makes the cached form of it with
// slimService's own code (keepService): what it keeps cannot differ from
// what the standard path keeps but by what the scratch was given. Every
// string the cached form may keep is its own (or a shared one), never the
// input's bytes, which the watch's decoder reuses. The rest it skips in
// place (managedFields, annotations, the other labels, selector,
// conditions...), allocating nothing for it.
//
// It declines (ok false; the caller decodes the object as before) what it
// does not read as the standard decoder would: a field it reads of a wire
// type not its own, a message given twice that the standard decoder
// merges (metadata, spec, status, loadBalancer, sessionAffinityConfig,
// clientIP, a port's targetPort), a malformed length, a timestamp the
// standard decoder rejects; and a Service without a name (invalid: nothing
// to serve; and the end of a streamed list is a bookmark of that kind,
// which the standard path reads). Like sliceDecoder it does not look
// inside what it skips: bytes the standard decoder would reject there, it
// accepts (an API server sends none).
//
// Not safe for concurrent use: its scratch is reused from one Service to
// the next. It holds sl.mu while it decodes (to share the strings).
type serviceDecoder struct {
	sl  *slimmer
	svc corev1.Service
	// The scratch's arrays, kept from one Service to the next: the cached
	// form keeps none of them (MakeService copies what it keeps).
	labels                  map[string]string
	ports                   []corev1.ServicePort
	clusterIPs, externalIPs []string
	families                []corev1.IPFamily
	ingress                 []corev1.LoadBalancerIngress
	affinity                corev1.SessionAffinityConfig
	clientIP                corev1.ClientIPConfig
}

func newServiceDecoder(sl *slimmer) *serviceDecoder {
	return &serviceDecoder{sl: sl, labels: map[string]string{}}
}

// decodeEnvelope is decode of data, an object as the API serves it in
// protobuf (k8sMagic, then a runtime.Unknown), if it is a v1 Service of no
// content encoding.
func (d *serviceDecoder) decodeEnvelope(data []byte) (*cachedService, bool) {
	raw, ok := unwrap(data, "v1", "Service")
	if !ok {
		return nil, false
	}
	return d.decode(raw)
}

// decode returns what the cache keeps of the Service data encodes (its
// protobuf, no envelope), as slimmer.slimService makes it of the decoded
// object, or false if it declines data (see serviceDecoder): the caller
// decodes it then.
func (d *serviceDecoder) decode(data []byte) (*cachedService, bool) {
	sl := d.sl
	sl.mu.Lock()
	defer sl.mu.Unlock()
	svc := &d.svc
	*svc = corev1.Service{}
	clear(d.labels)
	d.ports, d.clusterIPs, d.externalIPs, d.families, d.ingress = d.ports[:0], d.clusterIPs[:0], d.externalIPs[:0], d.families[:0], d.ingress[:0]
	d.affinity, d.clientIP = corev1.SessionAffinityConfig{}, corev1.ClientIPConfig{}
	var meta, spec, status bool
	ok := eachField(data, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		if num > 3 {
			return true
		}
		if typ != protowire.BytesType {
			return false
		}
		switch num {
		case 1:
			if meta {
				return false
			}
			meta = true
			return d.objectMeta(v)
		case 2:
			if spec {
				return false
			}
			spec = true
			return d.spec(v)
		case 3:
			if status {
				return false
			}
			status = true
			return d.status(v)
		}
		return true
	})
	if !ok || svc.Name == "" {
		return nil, false
	}
	// The scratch's arrays, nil where the standard decoder leaves them
	// so (MakeService reads only their elements, but the scratch is
	// the decoded object's twin).
	if len(d.labels) > 0 {
		svc.Labels = d.labels
	}
	sp := &svc.Spec
	sp.Ports, sp.ClusterIPs, sp.ExternalIPs, sp.IPFamilies = nilIfEmpty(d.ports), nilIfEmpty(d.clusterIPs), nilIfEmpty(d.externalIPs), nilIfEmpty(d.families)
	svc.Status.LoadBalancer.Ingress = nilIfEmpty(d.ingress)
	c := &cachedService{Service: translate.MakeService(svc), uid: svc.UID}
	sl.keepService(c)
	*svc = corev1.Service{}
	return c, true
}

func nilIfEmpty[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

// objectMeta reads the Service's ObjectMeta: what slimService reads of it.
func (d *serviceDecoder) objectMeta(b []byte) bool {
	m := &d.svc.ObjectMeta
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		switch num {
		case 1, 3, 5, 6, 8, 11:
			if typ != protowire.BytesType {
				return false
			}
		case 7:
			if typ != protowire.VarintType {
				return false
			}
		default:
			return true // skipped, whatever its type
		}
		switch num {
		case 1:
			m.Name = string(v)
		case 3:
			m.Namespace = d.sl.shareBytes(v)
		case 5:
			m.UID = types.UID(v)
		case 6:
			m.ResourceVersion = string(v)
		case 7:
			x, n := protowire.ConsumeVarint(v)
			if n < 0 {
				return false
			}
			m.Generation = int64(x) //nolint:gosec // as the standard decoder reads it
		case 8:
			// metav1.Time's own decoder, which the standard one calls
			// (a second timestamp replaces the first there too).
			return m.CreationTimestamp.Unmarshal(v) == nil
		case 11:
			k, val, ok := mapEntry(v)
			switch {
			case !ok:
				return false
			case string(k) == translate.LabelServiceProxyName:
				d.labels[translate.LabelServiceProxyName] = d.sl.shareBytes(val)
			case string(k) == corev1.IsHeadlessService:
				d.labels[corev1.IsHeadlessService] = "" // its value is not read
			}
		}
		return true
	})
}

// spec reads the ServiceSpec: what slimService reads of it.
func (d *serviceDecoder) spec(b []byte) bool {
	sp := &d.svc.Spec
	var affinity bool
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		switch num {
		case 1, 3, 4, 5, 7, 9, 11, 14, 18, 19, 22:
			if typ != protowire.BytesType {
				return false
			}
		case 12:
			if typ != protowire.VarintType {
				return false
			}
		default:
			return true
		}
		switch num {
		case 1:
			return d.port(v)
		case 3:
			sp.ClusterIP = string(v)
		case 4:
			sp.Type = constantOf(v, corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeExternalName)
		case 5:
			d.externalIPs = append(d.externalIPs, string(v))
		case 7:
			sp.SessionAffinity = constantOf(v, corev1.ServiceAffinityNone, corev1.ServiceAffinityClientIP)
		case 9:
			// Kept by the cached form (a LoadBalancer Service's):
			// an array of its own.
			sp.LoadBalancerSourceRanges = append(sp.LoadBalancerSourceRanges, string(v))
		case 11:
			sp.ExternalTrafficPolicy = constantOf(v, corev1.ServiceExternalTrafficPolicyCluster, corev1.ServiceExternalTrafficPolicyLocal)
		case 12:
			x, n := protowire.ConsumeVarint(v)
			if n < 0 {
				return false
			}
			sp.HealthCheckNodePort = int32(x) //nolint:gosec // truncated as the standard decoder does
		case 14:
			if affinity {
				return false
			}
			affinity = true
			sp.SessionAffinityConfig = &d.affinity
			return d.sessionAffinityConfig(v)
		case 18:
			d.clusterIPs = append(d.clusterIPs, string(v))
		case 19:
			d.families = append(d.families, constantOf(v, corev1.IPv4Protocol, corev1.IPv6Protocol))
		case 22:
			p := constantOf(v, corev1.ServiceInternalTrafficPolicyCluster, corev1.ServiceInternalTrafficPolicyLocal)
			sp.InternalTrafficPolicy = &p
		}
		return true
	})
}

// sessionAffinityConfig reads its clientIP's timeoutSeconds.
func (d *serviceDecoder) sessionAffinityConfig(b []byte) bool {
	var clientIP bool
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		if num != 1 {
			return true
		}
		if typ != protowire.BytesType || clientIP {
			return false
		}
		clientIP = true
		d.affinity.ClientIP = &d.clientIP
		return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte) bool {
			if num != 1 {
				return true
			}
			if typ != protowire.VarintType {
				return false
			}
			x, n := protowire.ConsumeVarint(v)
			if n < 0 {
				return false
			}
			t := int32(x) //nolint:gosec // truncated as the standard decoder does
			d.clientIP.TimeoutSeconds = &t
			return true
		})
	})
}

// port reads a ServicePort into d.ports: its name, protocol, port,
// targetPort and nodePort.
func (d *serviceDecoder) port(b []byte) bool {
	var p corev1.ServicePort
	var target bool
	ok := eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		switch num {
		case 1, 2, 4:
			if typ != protowire.BytesType {
				return false
			}
		case 3, 5:
			if typ != protowire.VarintType {
				return false
			}
		default:
			return true
		}
		switch num {
		case 1:
			p.Name = d.sl.shareBytes(v)
		case 2:
			p.Protocol = constantOf(v, corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP)
		case 3, 5:
			x, n := protowire.ConsumeVarint(v)
			if n < 0 {
				return false
			}
			if num == 3 {
				p.Port = int32(x) //nolint:gosec // truncated as the standard decoder does
			} else {
				p.NodePort = int32(x) //nolint:gosec // truncated as the standard decoder does
			}
		case 4:
			if target {
				return false
			}
			target = true
			return intOrString(v, &p.TargetPort)
		}
		return true
	})
	if ok {
		d.ports = append(d.ports, p)
	}
	return ok
}

// intOrString reads what ValidateService reads of an IntOrString: its
// type and intVal (its strVal skipped).
func intOrString(b []byte, out *intstr.IntOrString) bool {
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		switch num {
		case 1, 2:
			if typ != protowire.VarintType {
				return false
			}
			x, n := protowire.ConsumeVarint(v)
			if n < 0 {
				return false
			}
			if num == 1 {
				out.Type = intstr.Type(x) //nolint:gosec // as the standard decoder reads it
			} else {
				out.IntVal = int32(x) //nolint:gosec // truncated as the standard decoder does
			}
		case 3:
			return typ == protowire.BytesType
		}
		return true
	})
}

// status reads the ServiceStatus's load-balancer ingress: each entry's ip
// and ipMode.
func (d *serviceDecoder) status(b []byte) bool {
	var lb bool
	return eachField(b, func(num protowire.Number, typ protowire.Type, v []byte) bool {
		if num != 1 {
			return true
		}
		if typ != protowire.BytesType || lb {
			return false
		}
		lb = true
		return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte) bool {
			if num != 1 {
				return true
			}
			if typ != protowire.BytesType {
				return false
			}
			var ing corev1.LoadBalancerIngress
			ok := eachField(v, func(num protowire.Number, typ protowire.Type, v []byte) bool {
				switch num {
				case 1, 3:
					if typ != protowire.BytesType {
						return false
					}
				default:
					return true
				}
				if num == 1 {
					ing.IP = string(v)
				} else {
					m := constantOf(v, corev1.LoadBalancerIPModeVIP, corev1.LoadBalancerIPModeProxy)
					ing.IPMode = &m
				}
				return true
			})
			d.ingress = append(d.ingress, ing)
			return ok
		})
	})
}

// constantOf returns the constant of consts that b spells, or a string
// of b's own: the API's enumerations, decoded without allocating.
func constantOf[T ~string](b []byte, consts ...T) T {
	for _, c := range consts {
		if string(b) == string(c) {
			return c
		}
	}
	return T(b)
}

// GetObjectKind and DeepCopyObject make a cachedService a runtime.Object,
// as cachedSlice is (restslices.go).
func (c *cachedService) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (c *cachedService) DeepCopyObject() runtime.Object { return c }

var _ runtime.Object = (*cachedService)(nil)

var serviceGVK = corev1.SchemeGroupVersion.WithKind("Service")

// newServiceNegotiator is the Services' client's negotiator, as the
// slices' is: a Service comes out a *cachedService, from serviceDecoder
// when it takes the bytes, else slimmed at once (slimService); the
// bookmark that ends a streamed list, as bookmarkService.
func newServiceNegotiator(sl *slimmer, counts *decodeCounts) cachingNegotiator {
	return newCachingNegotiator(serviceGVK, newServiceDecoder(sl), func(obj runtime.Object) (runtime.Object, bool) {
		svc, ok := obj.(*corev1.Service)
		switch {
		case !ok:
			return nil, false
		case svc.Name == "" && svc.Annotations[metav1.InitialEventsAnnotationKey] == "true":
			return bookmarkService(svc.ResourceVersion), true
		}
		return sl.slimService(svc), true
	}, counts)
}

// newServiceClient returns a REST client of core/v1 over cfg whose
// decoder hands out Services in their cached form.
func newServiceClient(cfg *rest.Config, sl *slimmer, counts *decodeCounts) (*rest.RESTClient, error) {
	return newCachingClient(cfg, corev1.SchemeGroupVersion, "/api", newServiceNegotiator(sl, counts))
}

// newServiceInformer is the Service informer over rc, of every namespace,
// without indexes, its example type *cachedService.
func newServiceInformer(rc *rest.RESTClient, resync time.Duration) cache.SharedIndexInformer {
	return newCachingInformer(rc, "services", func() runtime.Object { return &corev1.ServiceList{} }, &cachedService{}, resync)
}

// errInitialEventsEnd marks the cached form of the bookmark that ends a
// streamed list (bookmarkService): the reflector reads its
// resourceVersion and its k8s.io/initial-events-end annotation, which a
// cached Service does not keep. The bookmark is never cached, nor
// translated; no Service the API serves is invalid with this error.
var errInitialEventsEnd = errors.New("the end of a streamed list (a bookmark)")

// bookmarkService is the cached form of the bookmark that ends a
// streamed list, at resourceVersion rv.
func bookmarkService(rv string) *cachedService {
	return &cachedService{Service: translate.Service{ResourceVersion: rv, Invalid: errInitialEventsEnd}}
}

// GetAnnotations is a bookmark's (bookmarkService): none for a Service.
func (c *cachedService) GetAnnotations() map[string]string {
	if c.Invalid == errInitialEventsEnd { //nolint:errorlint // the marker itself, never wrapped
		return map[string]string{metav1.InitialEventsAnnotationKey: "true"}
	}
	return nil
}

// firstFastServiceLog is logged once, when the first Service was read
// from its protobuf straight into the cache.
const firstFastServiceLog = "services read from protobuf straight into the cache"
