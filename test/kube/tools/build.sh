#!/usr/bin/env bash
# build.sh builds the pinned kube-apiserver, kube-proxy and etcd binaries the
# kube tests run, into a cache directory keyed by version, and prints that
# directory. A warm cache returns at once; a cold one takes minutes (the
# apiserver is a large build). Binaries are built into a temporary directory
# and renamed into place, so an interrupted build never leaves a half-written
# binary that a later run would trust.
#
# Usage: test/kube/tools/build.sh            # prints the bin dir
#        SLUICE_KUBE_BIN=/path build.sh      # use/fill that dir instead
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
kube_version=v1.36.3
etcd_version=v3.6.8
cache=${XDG_CACHE_HOME:-$HOME/.cache}
bin=${SLUICE_KUBE_BIN:-$cache/sluice/kube-$kube_version-etcd-$etcd_version}

want=(kube-apiserver kube-proxy etcd)
missing=()
for b in "${want[@]}"; do
	[[ -x $bin/$b ]] || missing+=("$b")
done
if ((${#missing[@]} == 0)); then
	echo "$bin"
	exit 0
fi

export GOTOOLCHAIN=local
export GOFLAGS="-mod=readonly -buildvcs=false"
mkdir -p "$bin"
tmp=$(mktemp -d "$bin/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

declare -A pkg=(
	[kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
	[kube-proxy]=k8s.io/kubernetes/cmd/kube-proxy
	[etcd]=go.etcd.io/etcd/server/v3
)
for b in "${missing[@]}"; do
	echo "building $b (${pkg[$b]}) into $bin" >&2
	start=$SECONDS
	(cd "$here" && go build -trimpath -o "$tmp/$b" "${pkg[$b]}")
	mv "$tmp/$b" "$bin/$b"
	echo "built $b in $((SECONDS - start))s" >&2
done
echo "$bin"
