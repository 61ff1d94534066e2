# Sluice agent image, for those with a container engine; `make image`
# builds the same image without one (deploy/tools/image): the two binaries,
# static, in /usr/local/bin of an otherwise empty image. The BPF objects and
# their Go bindings are committed (pkg/datapath/*_bpfel.*), so the build
# needs Go only: no clang, no cgo.
#
#   docker build --build-arg COMMIT=$(git rev-parse HEAD) -t ghcr.io/sluice-lb/sluice:0.1.0 .
#   docker run --privileged --pid=host --network=host \
#     -v /sys/fs/bpf:/sys/fs/bpf -v /sys/fs/cgroup:/sys/fs/cgroup ghcr.io/sluice-lb/sluice:0.1.0 --manifests /etc/sluice/services.yaml
#
# The tag is the release `sluice --version` prints (cmd/sluice/version.go).

FROM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
ARG COMMIT=unknown
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN go build -trimpath -ldflags="-s -w -X main.commit=${COMMIT}" -o /out/sluice ./cmd/sluice
RUN go build -trimpath -ldflags="-s -w" -o /out/sluicectl ./cmd/sluicectl

FROM scratch
COPY --from=build /out/sluice /out/sluicectl /usr/local/bin/
ENV PATH=/usr/local/bin
ENTRYPOINT ["/usr/local/bin/sluice"]
