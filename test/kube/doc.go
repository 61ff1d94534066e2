// Package kube holds Sluice's tests against a real kube-apiserver and etcd
// (started on loopback by test/kube/kubeenv): the Kubernetes source run
// in-process with the reconciler, and the deploy/ manifests.
//
// The first run on a machine builds the pinned apiserver and etcd (minutes);
// later runs reuse the cached binaries. Set SLUICE_SKIP_KUBE=1 to skip.
package kube
