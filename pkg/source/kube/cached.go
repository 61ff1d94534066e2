package kube

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// cachedSlice is what the EndpointSlice informer keeps of a slice (the
// transform, slimmer.slim, makes it): what a translation reads of it
// (translate.Slice, which the tracker gets a pointer into), and its
// annotations but the trigger time. It is a metav1.Object so that the
// informer's store can key it and tell a resync (namespace, name,
// resourceVersion); the fields it does not keep read as none and are not
// set, as metav1.Object allows. Never modified once made.
type cachedSlice struct {
	translate.Slice
	annotations map[string]string
}

var _ metav1.Object = (*cachedSlice)(nil)

func (c *cachedSlice) GetNamespace() string                          { return c.Namespace }
func (c *cachedSlice) SetNamespace(ns string)                        { c.Namespace = ns }
func (c *cachedSlice) GetName() string                               { return c.Name }
func (c *cachedSlice) SetName(name string)                           { c.Name = name }
func (c *cachedSlice) GetGenerateName() string                       { return "" }
func (c *cachedSlice) SetGenerateName(string)                        {}
func (c *cachedSlice) GetUID() types.UID                             { return "" }
func (c *cachedSlice) SetUID(types.UID)                              {}
func (c *cachedSlice) GetResourceVersion() string                    { return c.ResourceVersion }
func (c *cachedSlice) SetResourceVersion(v string)                   { c.ResourceVersion = v }
func (c *cachedSlice) GetGeneration() int64                          { return 0 }
func (c *cachedSlice) SetGeneration(int64)                           {}
func (c *cachedSlice) GetSelfLink() string                           { return "" }
func (c *cachedSlice) SetSelfLink(string)                            {}
func (c *cachedSlice) GetCreationTimestamp() metav1.Time             { return metav1.Time{} }
func (c *cachedSlice) SetCreationTimestamp(metav1.Time)              {}
func (c *cachedSlice) GetDeletionTimestamp() *metav1.Time            { return nil }
func (c *cachedSlice) SetDeletionTimestamp(*metav1.Time)             {}
func (c *cachedSlice) GetDeletionGracePeriodSeconds() *int64         { return nil }
func (c *cachedSlice) SetDeletionGracePeriodSeconds(*int64)          {}
func (c *cachedSlice) GetLabels() map[string]string                  { return nil }
func (c *cachedSlice) SetLabels(map[string]string)                   {}
func (c *cachedSlice) GetAnnotations() map[string]string             { return c.annotations }
func (c *cachedSlice) SetAnnotations(a map[string]string)            { c.annotations = a }
func (c *cachedSlice) GetFinalizers() []string                       { return nil }
func (c *cachedSlice) SetFinalizers([]string)                        {}
func (c *cachedSlice) GetOwnerReferences() []metav1.OwnerReference   { return nil }
func (c *cachedSlice) SetOwnerReferences([]metav1.OwnerReference)    {}
func (c *cachedSlice) GetManagedFields() []metav1.ManagedFieldsEntry { return nil }
func (c *cachedSlice) SetManagedFields([]metav1.ManagedFieldsEntry)  {}
