//go:build tools

// Package tools pins the Kubernetes and etcd binaries the kube tests run.
// It is a separate module so that the main module's dependency graph, and
// its `go test ./...`, never see k8s.io/kubernetes.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
)
