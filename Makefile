# Sluice developer entry points. `make` alone lists them.
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

export GOTOOLCHAIN := local
# Static binaries, and one build cache for builds, vets and tests (cgo on
# or off changes the build of net and everything above it).
export CGO_ENABLED := 0
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go

# Files `make generate` writes (bpf2go output), checked by check-generate.
GENERATED := pkg/datapath/*_bpfel.go pkg/datapath/*_bpfel.o
# Tools the tests and generation need, and the Debian packages that hold
# them: `make deps` (and so `make test`) installs whatever is missing. The
# BPF build needs no kernel or libbpf headers from the host (they are
# vendored in bpf/vendor); gcc and libc6-dev are for cgo, which only the
# race detector uses.
TOOLS := clang-19 llvm-strip-19 clang-format-19 gcc bpftool nsenter ip iptables nft git
DEB_PACKAGES := ca-certificates git make gcc libc6-dev clang-19 llvm-19 clang-format-19 \
	bpftool iproute2 util-linux kmod iptables nftables

# golangci-lint, pinned, built from the Go module proxy (no other registry
# or download) into a directory of its own per version.
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT_DIR := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/sluice/golangci-lint-$(GOLANGCI_LINT_VERSION)
GOLANGCI_LINT := $(GOLANGCI_LINT_DIR)/golangci-lint
# The tree's Go modules: the main one and the tool modules with a go.mod of
# their own (deploy/tools, test/kube/tools). Every one must be tidy
# (test/kube/tools not under SLUICE_SKIP_KUBE: checking it fetches the
# Kubernetes sources); golangci-lint checks those with code of their own
# (test/kube/tools only lists, under a build tag, the commands it pins).
GO_MODULES := $(patsubst %/,%,$(dir $(shell git ls-files go.mod '*/go.mod')))
LINT_MODULES := $(filter-out test/kube/tools,$(GO_MODULES))
# The C clang-format checks (.clang-format); the headers in bpf/vendor are
# as upstream wrote them.
C_SOURCES := bpf/*.c bpf/lib/*.h
# The packages the race detector runs over: those whose concurrency is
# Go's: the agent's loop and its observers, the sources (informers, file
# watcher, tracker), the health and metrics servers, the reconciler and
# its fake, the agent's wiring in cmd/sluice (runAgent's servers and their
# in-flight handlers, the datapath closed after its users, the NodePort
# address watch), the test toolkit. Not pkg/datapath (its concurrency is
# mostly the kernel's, per-CPU BPF programs racing on maps, which the
# detector cannot see; its Go side's writers beside the reconciler are
# the device and port watches, ordered by Maps.devMu, and the ICMP rate
# limit follower, alone on its map; its tests take ~12 minutes without
# the detector),
# the other commands (flag parsing) or test/ and deploy/ (they run the
# agent as a process built without -race and drive it in sequence; under
# the detector their minutes would double for nothing it could find).
RACE_PKGS := ./pkg/agent/... ./pkg/health/... ./pkg/metrics/... ./pkg/model/... \
	./pkg/reconciler/... ./pkg/source/... ./internal/testutil/... ./cmd/sluice/
# How long `make fuzz` runs each fuzz target, and how many runs the fuzzer
# may spend minimizing one input (one that adds coverage, or fails) before
# it goes on: its default, 60 s of runs, would take a short run's whole
# time (a failing input is saved either way; `go test -fuzz` by hand
# minimizes it further).
FUZZ_TIME ?= 10s
FUZZ_MINIMIZE ?= 20x

.PHONY: help
help: ## Show the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-15s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: generate
generate: ## Rebuild BPF objects and their Go bindings (clang-19)
	$(GO) generate ./pkg/datapath

.PHONY: check-generate
check-generate: generate ## Fail if the committed generated files are stale
	@if ! git diff --exit-code --stat -- $(GENERATED); then \
		echo "generated files differ from the committed ones: run 'make generate' and commit"; exit 1; fi
	@untracked=$$(git ls-files --others --exclude-standard -- pkg/datapath/ | grep -E '_bpfel\.(go|o)$$' || true); \
	if [ -n "$$untracked" ]; then echo "generated files not committed: $$untracked"; exit 1; fi

# The commit `sluice --version` reports (the release is in cmd/sluice/version.go).
COMMIT = $(shell git rev-parse HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)

.PHONY: build
build: ## Build bin/sluice and bin/sluicectl (static, no clang needed)
	$(GO) build -ldflags "-X main.commit=$(COMMIT)" -o bin/sluice ./cmd/sluice
	$(GO) build -o bin/sluicectl ./cmd/sluicectl

# Platforms `make image` builds for (os/arch, comma-separated): one gives an
# image, more give an image index.
IMAGE_PLATFORMS ?= linux/$(shell $(GO) env GOARCH)

.PHONY: image
image: ## Build the container image bin/sluice-image.tar (OCI layout; no Docker needed)
	cd deploy/tools && $(GO) run ./image --root ../.. --out ../../bin/sluice-image.tar --platforms $(IMAGE_PLATFORMS)

.PHONY: manifests
manifests: ## Regenerate deploy/sluice.yaml from the Helm chart deploy/helm/sluice
	bash deploy/tools/manifests.sh > deploy/sluice.yaml.tmp
	mv deploy/sluice.yaml.tmp deploy/sluice.yaml

.PHONY: helm
helm: ## Build (once; cached) the pinned helm the chart tests run
	@echo "helm: $$(bash deploy/tools/helm.sh)"

.PHONY: chart
chart: ## helm lint the chart and render it
	@helm=$$(bash deploy/tools/helm.sh); $$helm lint --strict deploy/helm/sluice --set apiServer.host=10.0.0.10 && \
	$$helm template sluice deploy/helm/sluice --namespace kube-system --set apiServer.host=10.0.0.10 >/dev/null && echo "chart renders"

.PHONY: deps
deps: ## Install (Debian, as root) or check the tools and mounts the tests need
	@[ "$$(id -u)" = 0 ] || { echo "the tests need root (BPF, network namespaces, cgroups)"; exit 1; }
	@missing=""; for t in $(TOOLS); do command -v $$t >/dev/null || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ]; then \
		command -v apt-get >/dev/null || { echo "missing tools:$$missing (Debian packages: $(DEB_PACKAGES))"; exit 1; }; \
		echo "installing$$missing: apt-get install $(DEB_PACKAGES)"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(DEB_PACKAGES) >/dev/null; \
	fi
	@grep -qs ' /sys/fs/bpf bpf ' /proc/mounts || { mkdir -p /sys/fs/bpf && mount -t bpf bpf /sys/fs/bpf; }
	@grep -qs ' cgroup2 ' /proc/mounts || { mkdir -p /run/sluice-cgroup2 && mount -t cgroup2 none /run/sluice-cgroup2; }
	@$(GO) version
	@$(MAKE) --no-print-directory golangci-lint

.PHONY: golangci-lint
golangci-lint: ## Install (once; cached) the pinned golangci-lint from the Go module proxy
	@if ! "$(GOLANGCI_LINT)" version 2>/dev/null | grep -qF "version $(GOLANGCI_LINT_VERSION:v%=%) "; then \
		echo "building golangci-lint $(GOLANGCI_LINT_VERSION) into $(GOLANGCI_LINT_DIR) (from the Go module proxy; minutes, once)"; \
		rm -rf "$(GOLANGCI_LINT_DIR)"; \
		GOBIN="$(GOLANGCI_LINT_DIR)" $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION); \
	fi

.PHONY: lint
lint: golangci-lint ## golangci-lint (.golangci.yml), clang-format on bpf/, go mod tidy: every module
	@for m in $(LINT_MODULES); do echo "golangci-lint run ($$m)"; (cd $$m && "$(GOLANGCI_LINT)" run ./...) || exit 1; done
	clang-format-19 --dry-run -Werror $(C_SOURCES)
	@for m in $(if $(SLUICE_SKIP_KUBE),$(filter-out test/kube/tools,$(GO_MODULES)),$(GO_MODULES)); do echo "go mod tidy -diff ($$m)"; \
		(cd $$m && $(GO) mod tidy -diff) || { echo "$$m: go.mod or go.sum is not tidy: run 'go mod tidy' there and commit"; exit 1; }; done

.PHONY: race
race: ## Run the tests of the packages with Go concurrency under the race detector
	CGO_ENABLED=1 $(GO) test -race -count=1 -p 1 $(RACE_PKGS)

.PHONY: bench-smoke
bench-smoke: ## Run every Go benchmark once (-benchtime 1x, -short: the first sizes), so that one that no longer runs fails here rather than in review; no figure is read
	$(GO) test -count=1 -p 1 -run '^$$' -bench . -benchtime 1x -short -timeout 20m ./...

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZ_TIME (10s), one target per go test
	@targets=$$(grep -rHo --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*' pkg internal cmd test | \
		sed -E 's#^(.*)/[^/]*:func (Fuzz.*)$$#\1:\2#' | sort -u); \
	log=$$(mktemp); trap 'rm -f "$$log"' EXIT; \
	for t in $$targets; do \
		echo "fuzz $${t##*:} in ./$${t%%:*} for $(FUZZ_TIME)"; \
		if $(GO) test -run '^$$' -fuzz "^$${t##*:}$$" -fuzztime $(FUZZ_TIME) -fuzzminimizetime $(FUZZ_MINIMIZE) "./$${t%%:*}" >"$$log" 2>&1; then \
			cat "$$log"; continue; fi; \
		cat "$$log"; \
		if ! grep -q 'Failing input written' "$$log" && \
			[ "$$(grep -E '^\s+[^ ]' "$$log" | grep -v 'context deadline exceeded' | wc -l)" = 0 ] && \
			grep -qE '^\s+context deadline exceeded$$' "$$log"; then \
			echo "$${t##*:}: the fuzz time ran out under a busy worker (Go's coordinator race, golang/go#75804, fixed in Go 1.27): no input failed"; \
			continue; fi; \
		exit 1; \
	done

.PHONY: kube-bin
kube-bin: ## Build (once; cached) the kube-apiserver and etcd that test/kube runs, and the kube-proxy test/bench/kubeproxy runs
	@if [ -n "$${SLUICE_SKIP_KUBE:-}" ]; then echo "SLUICE_SKIP_KUBE set: not building kube binaries"; \
	else echo "kube binaries in $$(bash test/kube/tools/build.sh kube-apiserver etcd kube-proxy)"; fi

.PHONY: kube-bin-bench
kube-bin-bench: ## Build (once; cached) kube-apiserver, etcd and kube-proxy for the benchmark
	@echo "kube binaries in $$(bash test/kube/tools/build.sh kube-apiserver etcd kube-proxy)"

# What a cold cache costs, said before anything starts: the builds are
# long, once, and would otherwise look like a hang.
.PHONY: first-run-notice
first-run-notice:
	@cold=""; \
	if [ -z "$${SLUICE_SKIP_KUBE:-}" ] && ! bash test/kube/tools/build.sh --check kube-apiserver etcd kube-proxy >/dev/null 2>&1; then cold="kube-apiserver, etcd and kube-proxy (for test/kube and test/bench/kubeproxy)"; fi; \
	if ! bash deploy/tools/helm.sh --check >/dev/null 2>&1; then cold="$${cold:+$$cold and }helm (for the chart tests)"; fi; \
	if [ -n "$$cold" ]; then \
		echo "First run on this machine: building $$cold from source into ~/.cache/sluice."; \
		echo "That takes up to 30 minutes on 2 cores (measured: kube-apiserver 11-17 min, helm up to 16, etcd 20 s, kube-proxy 2 min), once;"; \
		echo "later runs reuse the binaries. SLUICE_SKIP_KUBE=1 skips the kube-apiserver and kube-proxy tests and their build."; \
	fi

.PHONY: test
test: first-run-notice deps check-generate kube-bin helm ## Vet, lint, race, fuzz, then run every test (as root: BPF, netns, cgroups)
	$(GO) vet ./...
	cd deploy/tools && $(GO) vet ./...
	@$(MAKE) --no-print-directory lint race fuzz bench-smoke
	$(GO) test -count=1 -p 1 -timeout 40m ./...

# A privileged test skips without root; under `make test` it fails instead
# (internal/testutil/privileged.go), so that no run passes by skipping.
test: export SLUICE_PRIVILEGED_TESTS := 1

.PHONY: demo
demo: build ## Show ClusterIP load balancing in throwaway network namespaces
	$(GO) run ./test/demo --bin bin

.PHONY: bench
bench: kube-bin-bench ## Run the benchmark suite
	$(GO) run ./test/bench

.PHONY: bench-100k
bench-100k: ## Run the benchmark's 100,000-Service row: Sluice and the floor, 10,000 as the reference (~40 min; BENCH_* in the environment win)
	BENCH_SERVICES=$${BENCH_SERVICES:-10000,100000} BENCH_MODES=$${BENCH_MODES:-sluice} \
	BENCH_ROUNDS=$${BENCH_ROUNDS:-3} BENCH_BPF_STATS=$${BENCH_BPF_STATS:-1} \
	BENCH_PROG_TIMEOUT=$${BENCH_PROG_TIMEOUT:-600s} BENCH_PROG_REPEAT_MAX=$${BENCH_PROG_REPEAT_MAX:-10m} \
	BENCH_TIME_LIMIT=$${BENCH_TIME_LIMIT:-40m} $(GO) run ./test/bench

.PHONY: bench-kubeproxy
bench-kubeproxy: kube-bin-bench ## Run the real kube-proxy beside Sluice against a real kube-apiserver
	$(GO) run ./test/bench/kubeproxy

.PHONY: clean
clean: ## Remove build output
	rm -rf bin
