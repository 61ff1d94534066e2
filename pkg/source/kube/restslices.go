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
// informer's transform.

// GetObjectKind and DeepCopyObject make a cachedSlice a runtime.Object, as
// the informer's example type must be. It carries no type (as decoded
// objects do not, once the client's decoder cleared it) and is never
// modified once made: a copy is itself.
func (c *cachedSlice) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

func (c *cachedSlice) DeepCopyObject() runtime.Object { return c }

var _ runtime.Object = (*cachedSlice)(nil)

// sliceDecodes counts the slices the REST client decoded: fast, straight
// from their protobuf; standard, decoded as before and slimmed (declined
// by the fast path, bookmarks, JSON).
type sliceDecodes struct {
	fast, standard atomic.Int64
	// firstFast, if set, is called after the first fast decode.
	firstFast func()
}

// sliceSerializer is a media type's serializer of the slices' REST client:
// the standard one, but for its decode of a whole object (into nil: a
// watch event's), which returns the cached form of a slice.
type sliceSerializer struct {
	runtime.Serializer
	sl     *slimmer
	counts *sliceDecodes
	// fast, if set (protobuf), decodes a slice straight from its bytes;
	// mu serialises it (its scratch is reused).
	fast *sliceDecoder
	mu   *sync.Mutex
}

var sliceGVK = discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice")

func (s sliceSerializer) Decode(data []byte, defaults *schema.GroupVersionKind, into runtime.Object) (runtime.Object, *schema.GroupVersionKind, error) {
	if into != nil {
		return s.Serializer.Decode(data, defaults, into) // a list, or a Status
	}
	if s.fast != nil {
		s.mu.Lock()
		c, ok := s.fast.decodeEnvelope(data)
		s.mu.Unlock()
		if ok {
			if s.counts.fast.Add(1) == 1 && s.counts.firstFast != nil {
				s.counts.firstFast()
			}
			gvk := sliceGVK
			return c, &gvk, nil
		}
	}
	obj, gvk, err := s.Serializer.Decode(data, defaults, nil)
	if es, ok := obj.(*discoveryv1.EndpointSlice); ok && err == nil {
		s.counts.standard.Add(1)
		return s.sl.slimSlice(es), gvk, nil
	}
	return obj, gvk, err
}

// sliceNegotiator is the client-go codecs' negotiator with sliceSerializer
// as its serializers.
type sliceNegotiator struct {
	runtime.NegotiatedSerializer
	infos []runtime.SerializerInfo
}

func (n sliceNegotiator) SupportedMediaTypes() []runtime.SerializerInfo { return n.infos }

func newSliceNegotiator(sl *slimmer, counts *sliceDecodes) sliceNegotiator {
	base := rest.CodecFactoryForGeneratedClient(scheme.Scheme, scheme.Codecs).WithoutConversion()
	n := sliceNegotiator{NegotiatedSerializer: base}
	mu := &sync.Mutex{}
	for _, info := range base.SupportedMediaTypes() {
		s := sliceSerializer{Serializer: info.Serializer, sl: sl, counts: counts}
		if info.MediaType == runtime.ContentTypeProtobuf {
			s.fast, s.mu = newSliceDecoder(sl), mu
		}
		info.Serializer = s
		n.infos = append(n.infos, info)
	}
	return n
}

// newSliceClient returns a REST client of discovery.k8s.io/v1 over cfg
// whose decoder hands out slices in their cached form, asking for
// protobuf.
func newSliceClient(cfg *rest.Config, sl *slimmer, counts *sliceDecodes) (*rest.RESTClient, error) {
	c := rest.CopyConfig(cfg)
	gv := discoveryv1.SchemeGroupVersion
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	c.NegotiatedSerializer = newSliceNegotiator(sl, counts)
	c.ContentType = runtime.ContentTypeProtobuf
	c.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("endpointslices client: %w", err)
	}
	return rc, nil
}

// newSliceInformer is the EndpointSlice informer over rc, of every
// namespace, without indexes, its list and watch options set by tweak
// (nil: none): client-go's NewFilteredEndpointSliceInformer's, but its
// example type *cachedSlice.
func newSliceInformer(rc *rest.RESTClient, resync time.Duration, tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	if tweak == nil {
		tweak = func(*metav1.ListOptions) {}
	}
	list := func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
		tweak(&opts)
		out := &discoveryv1.EndpointSliceList{}
		err := rc.Get().Resource("endpointslices").
			VersionedParams(&opts, scheme.ParameterCodec).
			Timeout(timeoutOf(opts)).Do(ctx).Into(out)
		return out, err
	}
	watchFn := func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
		tweak(&opts)
		opts.Watch = true
		return rc.Get().Resource("endpointslices").
			VersionedParams(&opts, scheme.ParameterCodec).
			Timeout(timeoutOf(opts)).Watch(ctx)
	}
	lw := cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc:  list,
		WatchFuncWithContext: watchFn,
	}, rc)
	return cache.NewSharedIndexInformerWithOptions(lw, &cachedSlice{},
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
