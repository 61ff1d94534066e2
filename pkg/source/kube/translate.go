package kube

import (
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/sluice-lb/sluice/pkg/model"
	"github.com/sluice-lb/sluice/pkg/source/translate"
)

// Translator returns the TranslateFunc of pkg/source/translate, the translation the
// manifest source uses too, with this node's options bound. The Node object
// is not needed by the ClusterIP translation yet; it is passed so that
// NodePort frontends can use the node's addresses without another watch.
func Translator(opts translate.Options) TranslateFunc {
	return func(_ *corev1.Node, svc *corev1.Service, slices []*discoveryv1.EndpointSlice) ([]*model.Service, string, error) {
		return translate.ServiceToModel(svc, slices, opts)
	}
}
