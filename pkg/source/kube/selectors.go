package kube

// What the API server filters out of the Services and EndpointSlices the
// source lists and watches, as kube-proxy's informers do (v1.36,
// cmd/kube-proxy/app/server.go): Services with clusterIP None (a field
// selector) and EndpointSlices labelled service.kubernetes.io/headless (a
// label selector), which no proxy serves (DNS answers for them). On a
// cluster of many StatefulSets they are most of the Services and slices:
// filtered here they cost the agent neither memory nor watch traffic.
//
// kube-proxy also filters out, server-side, every Service labelled
// service.kubernetes.io/service-proxy-name. Sluice cannot: it serves the
// Services labelled with its own --proxy-name (a documented deviation),
// and a label selector cannot say "absent or equal to this" (its
// requirements are ANDed). That label stays filtered client-side, in
// translation, as do headless Services and slices: the manifest source
// reads them all, and a server that ignores a selector (an aggregated or
// old one) loses nothing.
//
// A slice that gains the headless label leaves the watch's selection:
// the API server sends a delete, as it sends an add for one that loses
// it, so the cache never holds a slice the selector refuses.

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

var (
	// serviceFieldSelector is "spec.clusterIP!=None".
	serviceFieldSelector = fields.OneTermNotEqualSelector("spec.clusterIP", corev1.ClusterIPNone).String()
	// sliceLabelSelector is "!service.kubernetes.io/headless".
	sliceLabelSelector = notLabelled(corev1.IsHeadlessService)
)

func notLabelled(key string) string {
	r, err := labels.NewRequirement(key, selection.DoesNotExist, nil)
	if err != nil {
		panic(err) // a constant key
	}
	return labels.NewSelector().Add(*r).String()
}

// selectServices is the Services informer's list and watch options.
func selectServices(o *metav1.ListOptions) { o.FieldSelector = serviceFieldSelector }

// selectSlices is the EndpointSlices informer's list and watch options.
func selectSlices(o *metav1.ListOptions) { o.LabelSelector = sliceLabelSelector }
