package kube

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// cachedSlice is what the EndpointSlice informer keeps of a slice (the
// transform, slimmer.slim, makes it): what a translation reads of it
// (translate.Slice, which the tracker gets a pointer into), and of its
// annotations only a bookmark's (keptAnnotations). It is a metav1.Object so that the
// informer's store can key it and tell a resync (namespace, name,
// resourceVersion); the fields it does not keep read as none and are not
// set, as metav1.Object allows (unkept). Never modified once made.
type cachedSlice struct {
	unkept // first: a zero-size last field would be padded
	translate.Slice
	annotations map[string]string
}

// cachedService is what the Service informer keeps of a Service, as
// cachedSlice is of a slice: what a translation reads of it
// (translate.Service, which the tracker gets a pointer into), and what
// events.go reads: its uid (an Event names it) and generation (in
// translate.Service: a spec change forgets its causes). Never modified
// once made.
type cachedService struct {
	unkept
	translate.Service
	uid types.UID
}

var (
	_ metav1.Object = (*cachedSlice)(nil)
	_ metav1.Object = (*cachedService)(nil)
)

func (c *cachedSlice) GetNamespace() string               { return c.Namespace }
func (c *cachedSlice) SetNamespace(ns string)             { c.Namespace = ns }
func (c *cachedSlice) GetName() string                    { return c.Name }
func (c *cachedSlice) SetName(name string)                { c.Name = name }
func (c *cachedSlice) GetResourceVersion() string         { return c.ResourceVersion }
func (c *cachedSlice) SetResourceVersion(v string)        { c.ResourceVersion = v }
func (c *cachedSlice) GetAnnotations() map[string]string  { return c.annotations }
func (c *cachedSlice) SetAnnotations(a map[string]string) { c.annotations = a }

func (c *cachedService) GetNamespace() string        { return c.Namespace }
func (c *cachedService) SetNamespace(ns string)      { c.Namespace = ns }
func (c *cachedService) GetName() string             { return c.Name }
func (c *cachedService) SetName(name string)         { c.Name = name }
func (c *cachedService) GetResourceVersion() string  { return c.ResourceVersion }
func (c *cachedService) SetResourceVersion(v string) { c.ResourceVersion = v }
func (c *cachedService) GetUID() types.UID           { return c.uid }
func (c *cachedService) SetUID(uid types.UID)        { c.uid = uid }
func (c *cachedService) GetGeneration() int64        { return c.Generation }
func (c *cachedService) SetGeneration(g int64)       { c.Generation = g }
func (c *cachedService) GetCreationTimestamp() metav1.Time {
	return metav1.Time{Time: c.Created}
}
func (c *cachedService) SetCreationTimestamp(t metav1.Time) { c.Created = t.Time }

// unkept is the part of metav1.Object a cached form does not keep: read as
// none, set to nothing. A cached form embeds it and defines the methods of
// what it keeps.
type unkept struct{}

func (unkept) GetNamespace() string                          { return "" }
func (unkept) SetNamespace(string)                           {}
func (unkept) GetName() string                               { return "" }
func (unkept) SetName(string)                                {}
func (unkept) GetGenerateName() string                       { return "" }
func (unkept) SetGenerateName(string)                        {}
func (unkept) GetUID() types.UID                             { return "" }
func (unkept) SetUID(types.UID)                              {}
func (unkept) GetResourceVersion() string                    { return "" }
func (unkept) SetResourceVersion(string)                     {}
func (unkept) GetGeneration() int64                          { return 0 }
func (unkept) SetGeneration(int64)                           {}
func (unkept) GetSelfLink() string                           { return "" }
func (unkept) SetSelfLink(string)                            {}
func (unkept) GetCreationTimestamp() metav1.Time             { return metav1.Time{} }
func (unkept) SetCreationTimestamp(metav1.Time)              {}
func (unkept) GetDeletionTimestamp() *metav1.Time            { return nil }
func (unkept) SetDeletionTimestamp(*metav1.Time)             {}
func (unkept) GetDeletionGracePeriodSeconds() *int64         { return nil }
func (unkept) SetDeletionGracePeriodSeconds(*int64)          {}
func (unkept) GetLabels() map[string]string                  { return nil }
func (unkept) SetLabels(map[string]string)                   {}
func (unkept) GetAnnotations() map[string]string             { return nil }
func (unkept) SetAnnotations(map[string]string)              {}
func (unkept) GetFinalizers() []string                       { return nil }
func (unkept) SetFinalizers([]string)                        {}
func (unkept) GetOwnerReferences() []metav1.OwnerReference   { return nil }
func (unkept) SetOwnerReferences([]metav1.OwnerReference)    {}
func (unkept) GetManagedFields() []metav1.ManagedFieldsEntry { return nil }
func (unkept) SetManagedFields([]metav1.ManagedFieldsEntry)  {}
