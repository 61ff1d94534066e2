package deploy_test

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// The chart's clusterCIDR value is --cluster-cidr: in the ConfigMap and
// on the command line when set, nowhere when empty (the default, so
// deploy/sluice.yaml sets no detector).
func TestChartClusterCIDR(t *testing.T) {
	const arg = "--cluster-cidr=$(SLUICE_CLUSTER_CIDR)"
	cm, ds := render(t, "apiServer.host=10.0.0.10")
	if _, ok := cm.Data["cluster-cidr"]; ok || slices.Contains(ds.Spec.Template.Spec.Containers[0].Args, arg) {
		t.Errorf("by default: ConfigMap %v, args %q; want no --cluster-cidr", cm.Data, ds.Spec.Template.Spec.Containers[0].Args)
	}
	cm, ds = render(t, "apiServer.host=10.0.0.10", "clusterCIDR=10.244.0.0/16\\,fd00:10:244::/56")
	c := ds.Spec.Template.Spec.Containers[0]
	if got := cm.Data["cluster-cidr"]; got != "10.244.0.0/16,fd00:10:244::/56" {
		t.Errorf("ConfigMap cluster-cidr %q, want the value", got)
	}
	if !slices.Contains(c.Args, arg) {
		t.Errorf("args %q lack %s", c.Args, arg)
	}
	if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
		return e.Name == "SLUICE_CLUSTER_CIDR" && e.ValueFrom != nil && e.ValueFrom.ConfigMapKeyRef != nil && e.ValueFrom.ConfigMapKeyRef.Key == "cluster-cidr"
	}) {
		t.Errorf("env %v lacks SLUICE_CLUSTER_CIDR from the ConfigMap's cluster-cidr", c.Env)
	}
}
