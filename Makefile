# Developer entry points. `make test` is what CI runs (after `make check`).
SHELL := bash
CARGO ?= cargo
TESTCLUSTER_WORK ?= $(CURDIR)/target/testcluster

.PHONY: all build test unit cluster-test check fmt lint generate

all: build

build:
	$(CARGO) build --release

## test: unit and fixture tests, then the cluster tests against a real local control plane
test: unit cluster-test

unit:
	$(CARGO) test

## cluster-test: start etcd + kube-apiserver (+ controller-manager, scheduler, kwok), run every
## test including the `#[ignore = "needs cluster"]` ones, and stop the cluster even on failure.
cluster-test:
	@if ! command -v go >/dev/null 2>&1; then \
	  if [ "$${CI:-}" = true ]; then echo "error: Go is required to build the test control plane" >&2; exit 1; fi; \
	  echo "warning: no Go toolchain; skipping the cluster tests" >&2; exit 0; \
	fi; \
	trap 'tests/cluster/down.sh "$(TESTCLUSTER_WORK)"' EXIT; \
	tests/cluster/up.sh --full "$(TESTCLUSTER_WORK)"; \
	set -a; . "$(TESTCLUSTER_WORK)/env"; set +a; \
	$(CARGO) test -- --include-ignored

## check: formatting, lints, and generated files up to date
check: lint

fmt:
	$(CARGO) fmt

lint:
	$(CARGO) fmt --check
	$(CARGO) clippy --all-targets -- -D warnings
