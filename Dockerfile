# Sluice agent image. The BPF objects and their Go bindings are committed
# (pkg/datapath/*_bpfel.*), so the build needs Go only: no clang, no cgo.
#
#   docker build -t sluice .
#   docker run --privileged --pid=host --network=host \
#     -v /sys/fs/bpf:/sys/fs/bpf -v /sys/fs/cgroup:/sys/fs/cgroup sluice --manifests /etc/sluice/services.yaml

FROM golang:1.26 AS build
WORKDIR /src
ENV CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN go build -ldflags="-s -w" -o /out/sluice ./cmd/sluice
RUN go build -ldflags="-s -w" -o /out/sluicectl ./cmd/sluicectl

FROM gcr.io/distroless/static-debian12
COPY --from=build /out/sluice /out/sluicectl /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/sluice"]
