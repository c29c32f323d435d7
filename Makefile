# dnsrace: `make help` lists the targets.

# sudo resets PATH (secure_path); Go's usual home keeps working under it.
export PATH := $(PATH):/usr/local/go/bin
GO ?= go
GOFLAGS_TEST ?= -count=1
# Privileged tests run as root (CI is root); they skip with a message otherwise.
TEST_TIMEOUT ?= 20m

.DEFAULT_GOAL := help

include mk/bpf.mk
include mk/vmtest.mk

.PHONY: help build deps demo test test-unit test-host test-lab test-rules bench-smoke lint vagrant-check clean

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | sort | awk 'BEGIN {FS = ":.*## "}; {printf "  %-16s %s\n", $$1, $$2}'

build: ## Build ./dnsrace (static, no clang needed: BPF objects are committed)
	CGO_ENABLED=0 $(GO) build -o dnsrace ./cmd/dnsrace

deps: ## Install build and test dependencies from Debian (root)
	scripts/install-deps

demo: build ## Run the tracer through the lab's race scenarios (root)
	./dnsrace demo

lint: ## gofmt, go vet and staticcheck (a tool dependency in go.mod: nothing to install)
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }
	$(GO) vet ./...
	$(GO) tool staticcheck ./...

test-unit: ## Tests that need no root
	$(GO) test $(GOFLAGS_TEST) -short ./...

test-host: ## The whole suite on this kernel (root: namespaces, netfilter, BPF); the lab's scenarios run inside the trace tests
	$(GO) test $(GOFLAGS_TEST) -timeout $(TEST_TIMEOUT) -p 1 -skip '^TestScenarios$$' ./...

test-lab: ## Every lab scenario alone, without the tracer, held to its expectation (root)
	$(GO) test $(GOFLAGS_TEST) -timeout $(TEST_TIMEOUT) -run '^TestScenarios$$' ./internal/lab

test-race: ## The counters' concurrency test and the unit tests under Go's race detector (root, cgo)
	CGO_ENABLED=1 $(GO) test -race -count=1 -run 'TestCloseWhileCounting' ./internal/probe
	CGO_ENABLED=1 $(GO) test -race -short ./internal/correlate ./internal/metrics ./internal/trace

bench-smoke: build ## Short benchmark run: checks the harness works and loses no events
	$(GO) test -run '^$$' -bench . -benchtime 2000x ./internal/... && ./dnsrace bench --smoke

test-rules: ## Check the Prometheus rules and run their promtool unit tests
	promtool check rules scripts/prometheus-rules.yaml
	promtool test rules scripts/prometheus-rules.test.yaml

vagrant-check: ## Syntax-check the Vagrantfile
	ruby -c Vagrantfile

test: deps lint generate-check vagrant-check test-rules test-host test-race vmtest bench-smoke ## Everything CI runs (root)

clean: ## Remove build outputs
	rm -f dnsrace
