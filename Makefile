# ztunnel-go: run `make` (or `make help`) for the list of targets.
SHELL := /bin/bash
GO ?= go
BIN := bin
GOTESTFLAGS ?=
TEST_TIMEOUT ?= 20m
FUZZTIME ?= 10s
FUZZPARALLEL ?=
GOLANGCI_LINT_VERSION := v2.15.0
# ztunnel-go's version and revision, stamped into the daemon (its start log,
# /config_dump, `ztunnel version`) by scripts/ldflags.sh: the VERSION file and
# the checkout's commit unless VERSION=... / GIT_REVISION=... are given.
VERSION ?= $(shell tr -d ' \n' < VERSION)
GIT_REVISION ?=
VERSION_LDFLAGS := $(shell version='$(VERSION)' git_revision='$(GIT_REVISION)' sh scripts/ldflags.sh)
IMAGE ?= ztunnel-go:$(VERSION)

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build the daemon (bin/ztunnel) and the tools (bin/zlab)
	@mkdir -p $(BIN)
	$(GO) build -trimpath -ldflags '$(VERSION_LDFLAGS)' -o $(BIN)/ztunnel ./cmd/ztunnel
	$(GO) build -trimpath -o $(BIN)/zlab ./cmd/zlab

.PHONY: image
image: ## Build the container image (IMAGE, default ztunnel-go:<VERSION>) with deploy/Dockerfile, stamped with VERSION and this checkout's commit (needs a Docker engine)
	docker build -f deploy/Dockerfile --build-arg version='$(VERSION)' \
		--build-arg git_revision="$$(git rev-parse HEAD 2>/dev/null || echo unknown)" -t '$(IMAGE)' .

.PHONY: test
test: ## Run every test with the race detector; as root installs the system packages first and runs the lab tests too
	@scripts/deps.sh test
	@log=$$(mktemp); trap 'rm -f "$$log"' EXIT; \
		NETNSLAB_SKIP_LOG=$$log $(GO) test -race -timeout $(TEST_TIMEOUT) $(GOTESTFLAGS) ./...; rc=$$?; \
		scripts/skips.sh "$$log" || rc=1; exit $$rc

.PHONY: h2spec
h2spec: ## Run the h2spec HTTP/2 conformance suite against the HBONE server (built from the Go module proxy; docs/h2spec.md)
	ZTUNNEL_REQUIRE_H2SPEC=1 $(GO) test -race -count=1 -v -run '^TestH2Spec' ./hbone/

.PHONY: test-short
test-short: ## Run the tests that need neither root nor the lab
	$(GO) test -short -timeout $(TEST_TIMEOUT) ./...

.PHONY: lint
lint: ## gofmt, go vet, and golangci-lint (with the import-layering rules) if installed
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags istiolab ./internal/istiolab/ ./cmd/zlab/
	@if command -v golangci-lint >/dev/null 2>&1 || [ -x "$$($(GO) env GOPATH)/bin/golangci-lint" ]; then \
		PATH="$$PATH:$$($(GO) env GOPATH)/bin" golangci-lint run ./...; \
	else echo "golangci-lint not installed (make tools); layering is still checked by the deptest in make test"; fi

.PHONY: tools
tools: ## Install golangci-lint from the Go module proxy
	$(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

.PHONY: generate
generate: ## Regenerate generated code (go generate)
	$(GO) generate ./...

.PHONY: generate-check
generate-check: generate ## Fail if generated code (api/) is stale
	@git diff --exit-code -- api/ || { echo "generated code is stale: run make generate"; exit 1; }
	@out=$$(git status --porcelain -- api/); if [ -n "$$out" ]; then echo "uncommitted generated files:"; echo "$$out"; exit 1; fi

.PHONY: run
run: build ## Run the daemon on its embedded default: examples/localhost.yaml, built-in CA, no control plane
	PROXY_MODE=dedicated PROXY_WORKLOAD_INFO=default/local/default LOCAL_XDS_PATH=examples/localhost.yaml \
		$(BIN)/ztunnel proxy ztunnel

.PHONY: demo
demo: ## Build a lab of 2 nodes x 2 pods, send pod-to-pod traffic through HBONE, show a policy decision (root; installs the system packages)
	@scripts/deps.sh demo
	@$(MAKE) --no-print-directory build
	$(BIN)/zlab demo --ztunnel $(BIN)/ztunnel --config examples/demo.yaml

.PHONY: demo-istio
demo-istio: istio-bins build ## The Istio lab for a newcomer: two nodes, Pods from plain YAML, a call through HBONE, an AuthorizationPolicy from kubectl refusing it, then down (root; builds istio-bins, ~14 min cold; docs/istio-lab.md)
	@scripts/deps.sh lab
	$(BIN)/zlab istio demo --bins $(BIN)/istiolab --ztunnel $(BIN)/ztunnel

.PHONY: bench-tools
bench-tools: ## Build the daemon and the benchmark tools (zload, zpeer, zbench) into bin/
	@mkdir -p $(BIN)
	$(GO) build -trimpath -o $(BIN)/ztunnel ./cmd/ztunnel
	$(GO) build -trimpath -o $(BIN)/zload ./cmd/zload
	$(GO) build -trimpath -o $(BIN)/zpeer ./bench/cmd/zpeer
	$(GO) build -trimpath -o $(BIN)/zbench ./bench/cmd/zbench

.PHONY: bench
bench: bench-tools ## End-to-end benchmarks of std, epoll and io_uring side by side, report in bench/results/<date>-<host>/ (root, ~30 min: each idle ramp is read 30 s after its last step; BENCHFLAGS=--help)
	@scripts/deps.sh bench
	@command -v haproxy >/dev/null 2>&1 || echo "haproxy is not installed: the report will mark its rows as skipped"
	$(BIN)/zbench $(BENCHFLAGS)

.PHONY: bench-census
bench-census: bench-tools ## Round-trip census (issue 23): syscalls, context switches, CPU (kernel and user by function, with perf) and goroutine wake-ups per 1-byte round trip, ztunnel-go pair against the HAProxy mTLS pair (root, a few minutes; BENCHFLAGS adds zbench flags)
	@scripts/deps.sh bench
	$(BIN)/zbench --syscalls 20000 --paths 'hbone2/' --backends epoll $(BENCHFLAGS)

.PHONY: bench-clients
bench-clients: bench-tools ## Two clients, two verdicts (issue 36): zload's RR and one stream, a blocking Python RR client and iperf3 on the daemons' and HAProxy's one- and two-hop paths (HAProxy's also behind the capture rules), rounds interleaved; CLIENTS.md in bench/results/<date>-<host>-clients/ (root, a few minutes; BENCHFLAGS adds zbench flags)
	@scripts/deps.sh bench
	$(BIN)/zbench --clients --rounds 5 $(BENCHFLAGS)

.PHONY: bench-quick
bench-quick: bench-tools ## CI smoke run of the end-to-end benchmarks, of the mesh- and node-scale and Load scenarios and of the clients comparison (root, about a minute; HAProxy paths skipped if it is missing)
	@scripts/deps.sh lab
	$(BIN)/zbench --quick $(BENCHFLAGS)
	$(BIN)/zbench --quick --load --prefix zl-loadq
	$(BIN)/zbench --quick --clients --prefix zl-cliq
	$(GO) test -count=1 -run '^Test(Mesh|Node)Scale$$' ./e2e/

.PHONY: bench-scale
bench-scale: bench-tools ## Mesh, node and load at scale (issue 36): a daemon fed 1k, 10k and 100k workloads (services and policies in proportion) over delta xDS (memory per workload, first byte to synced, CPU, VIP set-up, change latency under churn; SCALE.md), and a shared-mode daemon handed 10, 100 and 250 pods over ZDS (add to ack and to serving, memory, fds and goroutines per pod, a storm of adds, a restart, churn under traffic; NODE.md), both in bench/results/<date>-<host>-scale/ (ZTUNNEL_SCALE=N,M,... picks mesh sizes, ZTUNNEL_NODE_PODS=N,M,... pod counts, ZTUNNEL_SCALE_OUT the directory); then the Load scenario (1,000, 5,000 and 8,000 connections at 10,000 requests/s through the daemon pair and the HAProxy mTLS pair; LOAD.md in bench/results/<date>-<host>-load/; LOADFLAGS adds zbench flags) (root, ~15 min)
	@scripts/deps.sh bench
	set -o pipefail; ZTUNNEL_SCALE=$${ZTUNNEL_SCALE:-full} $(GO) test -count=1 -timeout 60m -run '^Test(Mesh|Node)Scale$$' -v ./e2e/ | grep -v '^=== RUN'
	$(BIN)/zbench --load $(LOADFLAGS)

.PHONY: bench-micro
bench-micro: ## Run every go test benchmark once (so none rots); BENCHTIME=2s for real figures
	$(GO) test -run '^$$' -bench . -benchtime $${BENCHTIME:-1x} ./...

.PHONY: soak
soak: ## Load and soak: 10,000 connections through a node pair, 60s connection storm, a policy push a second, 25 start-up rounds against a slow istiod, upgrades under load (with and without /proc/sys read-only), descriptor exhaustion per listener at RLIMIT_NOFILE 6144, figures table (root, a few minutes)
	set -o pipefail; ZTUNNEL_SOAK=1 $(GO) test -count=1 -v -timeout 30m -run '^(TestLoad|TestStartupServesNothingBeforeSync|TestSharedUpgrade|TestSharedUpgradeReadOnlyProcSys|TestHostileDescriptors)$$' ./e2e/ | grep -v '^=== RUN'

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 10s), then print executions per target
	scripts/fuzz.sh $(FUZZTIME) $(FUZZPARALLEL)

.PHONY: fuzz-quick
fuzz-quick: ## CI smoke run of every fuzz target (2s each; a few minutes with compilation)
	scripts/fuzz.sh 2s $(FUZZPARALLEL)

.PHONY: istio-bins
istio-bins: ## Build the Istio lab's upstream programs (etcd, kube-apiserver, kube-controller-manager, kubectl, istiod, istio-cni, istioctl, helm) and copy Istio's charts, from istiolab/ into bin/istiolab/ (~14 min cold here; docs/istio-lab.md)
	GO=$(GO) scripts/istio-bins.sh $(BIN)/istiolab

.PHONY: test-istio
test-istio: istio-bins build ## The Istio lab's suite: upstream Kubernetes API server, istiod and istio-cni in the lab, and zlab istio (root; not part of make test; CI runs test-istio-quick; docs/istio-lab.md)
	@scripts/deps.sh lab
	ZTUNNEL_ISTIOLAB_BIN=$(CURDIR)/$(BIN)/istiolab ZTUNNEL_BIN=$(CURDIR)/$(BIN)/ztunnel \
		$(GO) test -tags istiolab -race -count=1 -v -p 1 -timeout 30m $(GOTESTFLAGS) ./internal/istiolab/ ./cmd/zlab/

.PHONY: test-istio-quick
test-istio-quick: istio-bins build ## CI's variant of test-istio: the lab comes up (two nodes, istio-cni with iptables), one pod-to-pod call through HBONE, one AuthorizationPolicy decision through istiod (root)
	@scripts/deps.sh lab
	ZTUNNEL_ISTIOLAB_BIN=$(CURDIR)/$(BIN)/istiolab ZTUNNEL_BIN=$(CURDIR)/$(BIN)/ztunnel \
		$(GO) test -tags istiolab -race -count=1 -v -p 1 -timeout 15m -run '^TestCNIPodToPod$$/^iptables$$' ./internal/istiolab/

.PHONY: clean
clean: ## Remove build outputs and any leftover lab namespaces
	-@[ -x $(BIN)/zlab ] && $(BIN)/zlab down || true
	rm -rf $(BIN)
