#!/usr/bin/env bash
# helm.sh builds the pinned Helm release from the Go module proxy (go install
# verifies it against the checksum database), once, into a cache directory
# keyed by version, and prints the binary's path. The chart tests and
# `make helm-lint` run it; a warm cache returns at once, a cold one takes a
# few minutes (4 on an idle 2-core machine, 15 on a busy one).
#
# Usage: deploy/tools/helm.sh            # prints the path of helm
#        deploy/tools/helm.sh --check    # exit 1 if it is not built yet
#        SLUICE_HELM=/path/helm helm.sh  # use that binary instead
set -euo pipefail

helm_version=v4.3.1
if [[ -n ${SLUICE_HELM:-} ]]; then
	echo "$SLUICE_HELM"
	exit 0
fi
cache=${XDG_CACHE_HOME:-$HOME/.cache}
dir=$cache/sluice/helm-$helm_version
if [[ -x $dir/helm ]]; then
	echo "$dir/helm"
	exit 0
fi
if [[ ${1:-} == --check ]]; then
	echo "missing: $dir/helm"
	exit 1
fi

export GOTOOLCHAIN=local CGO_ENABLED=0
export PATH=/usr/local/go/bin:$PATH
mkdir -p "$dir"
tmp=$(mktemp -d "$dir/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
echo "building helm $helm_version (helm.sh/helm/v4/cmd/helm) into $dir" >&2
start=$SECONDS
# Outside any module, so the main module's go.mod plays no part.
(cd "$tmp" && GOFLAGS=-buildvcs=false GOBIN="$tmp" go install -trimpath \
	-ldflags "-X helm.sh/helm/v4/internal/version.version=$helm_version" \
	"helm.sh/helm/v4/cmd/helm@$helm_version")
mv "$tmp/helm" "$dir/helm"
echo "built helm in $((SECONDS - start))s" >&2
echo "$dir/helm"
