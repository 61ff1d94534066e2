package kube

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// The EndpointSlice informer of a source given a rest.Config (Config.REST)
// watches over a REST client of its own, whose decoder hands the informer
// the cached form of each slice (cachedSlice) rather than the API object:
// the slices of a watch, a streamed list's included, are read from their
// protobuf straight into it (sliceDecoder); what that declines (a slice of
// FQDN addresses, a bookmark, a server's JSON answer) is decoded as before
// and slimmed at once (slimmer.slimSlice). The informer's example type is
// *cachedSlice: client-go's reflector drops a watch event whose object is
// of another type. A list the server does not stream stays an
// EndpointSliceList, decoded as before, its items slimmed by the
// informer's transform. The Service informer is made the same way, of
// cachedService and serviceDecoder (svcdec.go): the clients, serializers
// and informers here serve both kinds.

// GetObjectKind and DeepCopyObject make a cachedSlice a runtime.Object, as
// the informer's example type must be. It carries no type (as decoded
// objects do not, once the client's decoder cleared it) and is never
// modified once made: a copy is itself.
func (c *cachedSlice) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (c *cachedSlice) DeepCopyObject() runtime.Object { return c }

var _ runtime.Object = (*cachedSlice)(nil)

// decodeCounts counts the objects a REST client of the source's decoded
// (the slices', the Services'): fast, straight from their protobuf;
// standard, decoded as before and slimmed (declined by the fast path,
// bookmarks, JSON).
type decodeCounts struct {
	fast, standard atomic.Int64
	// firstFast, if set, is called after the first fast decode.
	firstFast func()
}

// fastDecoder decodes an object straight from its protobuf in the API's
// envelope into its cached form (sliceDecoder, serviceDecoder), or
// declines it.
type fastDecoder interface {
	decodeObject(data []byte) (runtime.Object, bool)
}

func (d *sliceDecoder) decodeObject(data []byte) (runtime.Object, bool) {
	if c, ok := d.decodeEnvelope(data); ok {
		return c, true
	}
	return nil, false
}

func (d *serviceDecoder) decodeObject(data []byte) (runtime.Object, bool) {
	if c, ok := d.decodeEnvelope(data); ok {
		return c, true
	}
	return nil, false
}

// cachingSerializer is a media type's serializer of one of the source's
// REST clients: the standard one, but for its decode of a whole object
// (into nil: a watch event's), which returns the object's cached form.
type cachingSerializer struct {
	runtime.Serializer
	gvk schema.GroupVersionKind
	// slim returns the cached form of an object the standard decoder
	// made, false if it is not of the client's kind (a Status).
	slim   func(runtime.Object) (runtime.Object, bool)
	counts *decodeCounts
	// fast, if set (protobuf), decodes an object straight from its
	// bytes; mu serialises it (its scratch is reused).
	fast fastDecoder
	mu   *sync.Mutex
}

var sliceGVK = discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice")

func (s cachingSerializer) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if into != nil {
		return s.Serializer.Decode(data, defaults, into) // a list, or a Status
	}
	if s.fast != nil {
		s.mu.Lock()
		c, ok := s.fast.decodeObject(data)
		s.mu.Unlock()
		if ok {
			if s.counts.fast.Add(1) == 1 && s.counts.firstFast != nil {
				s.counts.firstFast()
			}
			gvk := s.gvk
			return c, &gvk, nil
		}
	}
	obj, gvk, err := s.Serializer.Decode(data, defaults, nil)
	if err != nil {
		return obj, gvk, err
	}
	if c, ok := s.slim(obj); ok {
		s.counts.standard.Add(1)
		return c, gvk, nil
	}
	return obj, gvk, err
}

// cachingNegotiator is the client-go codecs' negotiator with
// cachingSerializer as its serializers.
type cachingNegotiator struct {
	runtime.NegotiatedSerializer
	infos []runtime.SerializerInfo
}

func (n cachingNegotiator) SupportedMediaTypes() []runtime.SerializerInfo { return n.infos }

// newCachingNegotiator returns the negotiator of a client of gvk's kind:
// its protobuf serializer decodes with fast, each slims what the
// standard decoder made with slim.
func newCachingNegotiator(gvk schema.GroupVersionKind, fast fastDecoder, slim func(runtime.Object) (runtime.Object, bool), counts *decodeCounts) cachingNegotiator {
	base := rest.CodecFactoryForGeneratedClient(scheme.Scheme, scheme.Codecs).WithoutConversion()
	n := cachingNegotiator{NegotiatedSerializer: base}
	mu := &sync.Mutex{}
	for _, info := range base.SupportedMediaTypes() {
		s := cachingSerializer{Serializer: info.Serializer, gvk: gvk, slim: slim, counts: counts}
		if info.MediaType == runtime.ContentTypeProtobuf {
			s.fast, s.mu = fast, mu
		}
		info.Serializer = s
		n.infos = append(n.infos, info)
	}
	return n
}

// newSliceNegotiator is the slices' client's negotiator: a slice comes
// out a *cachedSlice, from sliceDecoder when it takes the bytes, else
// slimmed at once (slimSlice; a bookmark's annotation survives it).
func newSliceNegotiator(sl *slimmer, counts *decodeCounts) cachingNegotiator {
	return newCachingNegotiator(sliceGVK, newSliceDecoder(sl), func(obj runtime.Object) (runtime.Object, bool) {
		es, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok {
			return nil, false
		}
		return sl.slimSlice(es), true
	}, counts)
}

// newCachingClient returns a REST client of gv over cfg (at apiPath)
// whose decoder is neg's, asking for protobuf.
func newCachingClient(cfg *rest.Config, gv schema.GroupVersion, apiPath string, neg runtime.NegotiatedSerializer) (*rest.RESTClient, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &gv
	c.APIPath = apiPath
	c.NegotiatedSerializer = neg
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("%s client: %w", gv, err)
	}
	return rc, nil
}

// newSliceClient returns a REST client of discovery.k8s.io/v1 over cfg
// whose decoder hands out slices in their cached form.
func newSliceClient(cfg *rest.Config, sl *slimmer, counts *decodeCounts) (*rest.RESTClient, error) {
	return newCachingClient(cfg, discoveryv1.SchemeGroupVersion, "/apis", newSliceNegotiator(sl, counts))
}

// newSliceInformer is the EndpointSlice informer over rc, of every
// namespace, without indexes: client-go's
// NewFilteredEndpointSliceInformer's, but its example type *cachedSlice.
func newSliceInformer(rc *rest.RESTClient, resync time.Duration) cache.SharedIndexInformer {
	return newCachingInformer(rc, "endpointslices", func() runtime.Object { return &discoveryv1.EndpointSliceList{} }, &cachedSlice{}, resync)
}

// newCachingInformer is the informer of resource over rc, of every
// namespace, without indexes, its objects of example's type (a cached
// form); newList makes a list of the API's type, which a server that
// does not stream its lists answers.
func newCachingInformer(rc *rest.RESTClient, resource string, newList func() runtime.Object, example runtime.Object, resync time.Duration) cache.SharedIndexInformer {
	list := func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		out := newList()
		err := rc.Get().Resource(resource).
			VersionedParams(&opts, scheme.ParameterCodec).
			Timeout(timeoutOf(opts)).Do(ctx).Into(out)
		return out, err
	}
	watchFn := func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
		opts.Watch = true
		return rc.Get().Resource(resource).
			VersionedParams(&opts, scheme.ParameterCodec).
			Timeout(timeoutOf(opts)).Watch(ctx)
	}
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc:  list,
		WatchFuncWithContext: watchFn,
	}, rc)
	return cache.NewSharedIndexInformerWithOptions(lw, example,
		cache.SharedIndexInformerOptions{ResyncPeriod: resync, Indexers: cache.Indexers{}})
}

func timeoutOf(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

// firstFastLog is logged once, when the first slice was read from its
// protobuf straight into the cache.
const firstFastLog = "endpointslices read from protobuf straight into the cache"
