# apifailover — see README.md. Every target installs what it needs.
SHELL := /bin/bash

GO        ?= go
PKGS      := ./...
UNIT_PKGS := ./transport/... ./altsvc/... ./localproxy/... ./cmd/... ./hack/workload/...
KUBE_VERSION ?= v1.36.3
export KUBE_VERSION

# Linters, fetched through the Go module proxy and pinned.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

.PHONY: all test unit chart e2e chaos demo bench image compat lint deps kube fmt vet tidy clean

all: test

## test: unit tests (race detector), the Helm chart, then the end-to-end suite on a real control plane.
test: unit chart e2e

## unit: vet and race-enabled unit tests of the libraries.
unit: vet
	@echo "==> unit tests (go test -race $(UNIT_PKGS))"
	$(GO) test -race -count=1 -timeout 15m $(UNIT_PKGS)

## chart: helm lint and helm template of cmd/localproxy/deploy/chart, the source
## of deploy/daemonset.yaml, which must equal its rendering (helm from its Go
## module, pinned; the first build takes minutes).
chart:
	@echo "==> Helm chart (hack/tools/chart.sh check)"
	bash hack/tools/chart.sh check

## deps: OS packages (etcd, iptables, iproute2) and kube-apiserver/kubectl $(KUBE_VERSION).
deps:
	@echo "==> prerequisites: OS packages"
	bash hack/tools/ensure-deps.sh
	@echo "==> prerequisites: kube-apiserver and kubectl $(KUBE_VERSION) (first build takes minutes)"
	bash hack/tools/build-kube.sh $(KUBE_VERSION)

## e2e: the failover suite against etcd + real kube-apiservers in a private network namespace,
## then the 2-minute chaos soak built with the race detector (its clients, and localproxy, a
## process of its own built with -race too). go test -json, printed by hack/testlog as go test -v's
## lines; when tests fail (or one hangs until the timeout), their own lines come again at the end.
e2e: deps
	@echo "==> test bed smoke test and end-to-end suite"
	mkdir -p _output/e2e
	$(GO) build -o _output/testlog ./hack/testlog
	APIFAILOVER_E2E=1 $(GO) test -json -count=1 -timeout 40m $$($(GO) list ./hack/... | grep -v '/hack/chaos$$') 2>&1 | _output/testlog | tee _output/e2e/go-test.log; exit $${PIPESTATUS[0]}
	@echo "==> chaos soak, 2 minutes, race detector (go test -race ./hack/chaos/)"
	APIFAILOVER_E2E=1 $(GO) test -json -race -count=1 -timeout 30m ./hack/chaos/ 2>&1 | _output/testlog | tee _output/e2e/chaos.log; exit $${PIPESTATUS[0]}

## chaos: a seeded soak of random faults under load with invariants (hack/chaos):
## DURATION (default 10m) and SEED (default: from the clock) choose it; the
## same pair replays the same schedule. Results in _output/chaos/summary.json,
## the timeline chart in _output/chaos/timeline.svg. Built with the race detector: a data
## race in the clients (exit status 66) or in localproxy (a process of its own) fails it.
DURATION ?= 10m
SEED ?= 0
chaos: deps
	DURATION=$(DURATION) SEED=$(SEED) $(GO) run -race ./hack/chaos/run

## demo: start a local control plane and show the same faults against transport.Wrap,
## localproxy and HAProxy (kubespray's configuration) side by side, live (no flags needed).
demo: deps
	$(GO) run ./hack/demo

## bench: benchmarks with ratios against baselines measured in the same run: the
## Go micro-benchmarks, then the peer benchmark (hack/bench: direct, transport,
## localproxy, HAProxy and nginx on a real control plane; installs haproxy and
## nginx; about 40 minutes with the new-connection, data-path and health-cost runs; results
## and charts in _output/bench/).
bench:
	@echo "==> Go micro-benchmarks"
	$(GO) test -run=NONE -bench=. -benchmem $(UNIT_PKGS)
	@echo "==> peer benchmark (hack/bench)"
	$(GO) run ./hack/bench

## image: build the localproxy image from cmd/localproxy/deploy/Containerfile
## with buildah, tagged with the release (internal/version) and the git
## revision, then run it: --version and /healthz (installs buildah; a few minutes).
image:
	bash hack/tools/build-image.sh

## compat: the version matrix, not part of test: the smoke test and scenarios
## S1/S2 on the transport and localproxy paths against each kube-apiserver in
## KUBE_VERSIONS (default v1.34.4 v1.35.4 v1.36.3; each built once, minutes).
compat: deps
	bash hack/tools/compat.sh

## lint: gofmt, go vet, staticcheck.
lint: vet
	@echo "==> gofmt"
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "not gofmt-formatted:"; echo "$$out"; exit 1; fi
	@echo "==> staticcheck"
	$(GO) run $(STATICCHECK) $(PKGS)

vet:
	@echo "==> go vet"
	$(GO) vet $(PKGS)

fmt:
	gofmt -w $$(git ls-files '*.go')

tidy:
	$(GO) mod tidy

clean:
	rm -rf _output
