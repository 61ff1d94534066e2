#!/usr/bin/env bash
# build.sh builds the pinned Kubernetes and etcd binaries named on its
# command line (default: kube-apiserver and etcd, what test/kube runs; the
# benchmark adds kube-proxy) into a cache directory keyed by version, and
# prints that directory. A warm cache returns at once; a cold one takes
# minutes (kube-apiserver is a large build: 11-18 minutes on 2 cores; etcd
# and then kube-proxy well under one). Binaries are built into a temporary
# directory and renamed into place, so an interrupted build never leaves a
# half-written binary that a later run would trust.
#
# Usage: test/kube/tools/build.sh [BINARY...]       # prints the bin dir
#        test/kube/tools/build.sh --check [BINARY...] # exit 1 if any is missing
#        SLUICE_KUBE_BIN=/path build.sh               # use/fill that dir instead
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
kube_version=v1.36.3
etcd_version=v3.6.8
cache=${XDG_CACHE_HOME:-$HOME/.cache}
bin=${SLUICE_KUBE_BIN:-$cache/sluice/kube-$kube_version-etcd-$etcd_version}

check=false
if [[ ${1:-} == --check ]]; then
	check=true
	shift
fi
want=("$@")
if ((${#want[@]} == 0)); then
	want=(kube-apiserver etcd)
fi
declare -A pkg=(
	[kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
	[kube-proxy]=k8s.io/kubernetes/cmd/kube-proxy
	[etcd]=go.etcd.io/etcd/server/v3
)
missing=()
for b in "${want[@]}"; do
	[[ -n ${pkg[$b]:-} ]] || { echo "build.sh: unknown binary $b (want: ${!pkg[*]})" >&2; exit 2; }
	[[ -x $bin/$b ]] || missing+=("$b")
done
if ((${#missing[@]} == 0)); then
	echo "$bin"
	exit 0
fi
if $check; then
	echo "missing in $bin: ${missing[*]}"
	exit 1
fi

export GOTOOLCHAIN=local
export GOFLAGS="-mod=readonly -buildvcs=false"
mkdir -p "$bin"
tmp=$(mktemp -d "$bin/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

for b in "${missing[@]}"; do
	echo "building $b (${pkg[$b]}) into $bin" >&2
	start=$SECONDS
	(cd "$here" && go build -trimpath -o "$tmp/$b" "${pkg[$b]}")
	mv "$tmp/$b" "$bin/$b"
	echo "built $b in $((SECONDS - start))s" >&2
done
echo "$bin"
