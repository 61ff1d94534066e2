#!/usr/bin/env bash
# manifests.sh prints deploy/sluice.yaml: the Helm chart deploy/helm/sluice
# rendered with its default values, as release "sluice" in kube-system, with
# the API server's address left as a placeholder to replace. `make
# manifests` writes it; deploy/chart_test.go fails if the file differs.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
helm=$(bash "$here/helm.sh")
cat <<'HEADER'
# Sluice as a node proxy: one agent per node, replacing kube-proxy.
#
# GENERATED from the Helm chart deploy/helm/sluice by `make manifests`:
# change the chart (or pass it values), not this file.
#
#   1. replace API_SERVER_HOST below with the API server's real address (an
#      IP, or a host name the nodes' own resolver knows; deploy/README.md
#      says what to use on kubeadm and on managed clusters), and the port
#      if it is not 6443;
#   2. kubectl apply -f deploy/sluice.yaml
#
# or, with the same values and no editing:
#   helm template sluice deploy/helm/sluice -n kube-system \
#     --set apiServer.host=10.0.0.10 | kubectl apply -f -
#
# A ConfigMap edited here after the DaemonSet was created is not rolled out
# by itself (the pod template's checksum/config names the old one): run
# `kubectl -n kube-system rollout restart ds/sluice`, or use the chart.
# test/kube/deploy_test.go applies these objects to a real kube-apiserver.
HEADER
"$helm" template sluice "$here/../helm/sluice" --namespace kube-system \
	--set apiServer.host=API_SERVER_HOST
