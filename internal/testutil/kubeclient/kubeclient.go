// Package kubeclient holds the tests' writes to Kubernetes objects through
// client-go that more than one test package makes, against the fake
// clientset (pkg/source/kube) and the real kube-apiserver (test/kube)
// alike.
package kubeclient

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// UpdateNode reads Node name, lets mutate change it and writes it back,
// failing tb on an error.
func UpdateNode(tb testing.TB, ctx context.Context, c kubernetes.Interface, name string, mutate func(*corev1.Node)) {
	tb.Helper()
	n, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	mutate(n)
	if _, err := c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		tb.Fatal(err)
	}
}
