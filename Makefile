# nymph: developer and operator entry points. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
DEPS := tests/envtest/deps.sh
IMAGE ?= nymph:dev
KIND_CLUSTER ?= nymph
PYTEST_ARGS ?=
# make test's pytest-xdist workers: one runs the tests that need the control plane, in order
# (tests/support/xdist_groups.py), the others every other test beside it
TEST_WORKERS ?= 2

.PHONY: help install install-demo deps images envtest faults test test-unit lint fmt demo bench screenshots image kind-up kind-load deploy undeploy clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	@touch $(STAMP) $(DEMO_STAMP)

# The demo needs nymph alone (it ships kubectl), not the test tools (ray and friends).
$(DEMO_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	@touch $(DEMO_STAMP)

install: $(STAMP) ## create .venv and install nymph with its test tools

install-demo: $(DEMO_STAMP) ## create .venv and install nymph only (what `make demo` needs)

# Without them (e.g. not root) the real node is unavailable: the demo falls back to kwok, and
# the real-node tests skip, unless NYMPH_E2E=require or NYMPH_NODE=real make it an error.
deps: ## the Debian packages the real node and the local images use (runc, CNI plugins, debootstrap...), when missing
	@if [[ -x $(DEPS) ]] && ! $(DEPS); then \
	  if [[ "$$NYMPH_E2E" == "require" || "$$NYMPH_NODE" == "real" ]]; then exit 1; fi; \
	  echo "deps: not installed: no real node (Pods will be simulated by kwok)" >&2; \
	fi

envtest: ## build the local control plane (kube-apiserver, etcd, kwok) and the real node (kubelet, containerd) into ~/.cache/nymph/envtest, and helm, the KubeRay operator and kube-router into ~/.cache/nymph/tools
	@if [[ -n "$$KUBEBUILDER_ASSETS" ]] || command -v go >/dev/null; then \
	  tests/envtest/build.sh >/dev/null; \
	  if ! tests/envtest/build-tools.sh helm kuberay-operator kube-router >/dev/null && [[ "$$NYMPH_E2E" == "require" ]]; then exit 1; fi; \
	elif [[ "$$NYMPH_E2E" == "require" ]]; then \
	  echo "envtest: Go is not installed and KUBEBUILDER_ASSETS is unset; cannot build the control plane" >&2; exit 1; \
	else \
	  echo "envtest: no Go and no KUBEBUILDER_ASSETS: real-cluster tests will be skipped" >&2; \
	fi

images: install-demo deps ## build the local images (pause, python, ray, nymph) into ~/.cache/nymph/images (tests do it on demand)
	$(BIN)/python -m nymph.localcluster.imagebuild

test: install deps envtest ## run the whole suite (unit, queue, daemon, real-cluster e2e on kwok and the real node), on every core
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

faults: install deps envtest ## the whole fault suite at full size (200 crash-matrix launches on SQLite and on PostgreSQL 1 ms away, every stage killed twice, a 20 s API server outage; 1,000 launches over 3 PostgreSQL replicas, one killed), open_fault checks included
	NYMPH_FAULT_LAUNCHES=$${NYMPH_FAULT_LAUNCHES:-200} NYMPH_FAULT_ROUNDS=$${NYMPH_FAULT_ROUNDS:-2} \
	NYMPH_FAULT_OUTAGE=$${NYMPH_FAULT_OUTAGE:-20} NYMPH_FAULT_BACKEND=$${NYMPH_FAULT_BACKEND:-sqlite,pg} \
	NYMPH_REPLICA_LAUNCHES=$${NYMPH_REPLICA_LAUNCHES:-1000} NYMPH_PG_DELAY_MS=$${NYMPH_PG_DELAY_MS:-1} \
	$(BIN)/pytest -q -m "faults or open_fault" $(PYTEST_ARGS)

test-unit: install ## the quick run: every test not marked e2e (no control plane needed)
	$(BIN)/pytest -q -m "not e2e and not open_fault" $(PYTEST_ARGS)

screenshots: install deps ## regenerate the console's screenshots in docs/images/console (its browser tests, in Debian's chromium)
	NYMPH_CONSOLE_SCREENSHOTS=docs/images/console $(BIN)/pytest -q tests/queue/console/test_browser.py $(PYTEST_ARGS)

lint: install ## ruff, mypy --strict and the import-linter layer contracts (.importlinter)
	$(BIN)/ruff check nymph tests benchmarks
	$(BIN)/ruff format --check nymph tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports

fmt: install ## format the code
	$(BIN)/ruff format nymph tests benchmarks
	$(BIN)/ruff check --fix nymph tests benchmarks

demo: install-demo deps envtest ## the main job: queue + daemon + a sample launch, on the current context or an embedded cluster (real node when possible; NYMPH_NODE=real|kwok)
	$(BIN)/nymph dev

# One run against the local control plane: raw API server limit, nymph end to end, latency, CPU
# per launch, idle footprint, queue claims; writes bench-results.json, adds the scheduler with a
# backlog (schedule_bench.py, under "scheduling") and PostgreSQL 1 ms away (pg_bench.py, under
# "pg_concurrency", "pg_replicas" and "pg_relay"), the API server's CPU per create at set paces
# (raw_paced.py, under "raw_paced"), then docs/performance.md from it. SOAK=1 adds
# the 10,000-launch RSS soak.
bench: install envtest ## the benchmark scoreboard: prints a table, writes bench-results.json and docs/performance.md (SOAK=1: 10,000-launch soak)
	$(BIN)/python benchmarks/daemon_bench.py $(if $(SOAK),--soak 10000)
	$(BIN)/python benchmarks/schedule_bench.py --backend both
	$(BIN)/python benchmarks/cli_startup.py
	$(BIN)/python benchmarks/daemons_bench.py
	$(BIN)/python benchmarks/pg_bench.py
	$(BIN)/python benchmarks/raw_paced.py
	$(BIN)/python benchmarks/daemon_bench.py --markdown bench-results.json > docs/performance.md
	$(BIN)/python benchmarks/queue_bench.py --backend both
	$(BIN)/python benchmarks/group_bench.py --write bench-results.json
	NYMPH_REPLICA_LAUNCHES=1000 NYMPH_PG_DELAY_MS=1 $(BIN)/pytest -q -s -p no:cacheprovider tests/queue/test_replicas.py -k killed

# --- for users with Docker (not runnable on machines without a Docker engine) --------------
image: ## build the nymph image
	docker build -f daemonset/Dockerfile -t $(IMAGE) .

kind-up: ## a kind cluster with the workdir root mounted from the host
	kind create cluster --name $(KIND_CLUSTER) --config manifests/overlays/kind/kind-cluster.yaml

kind-load: ## load the image into the kind cluster
	kind load docker-image $(IMAGE) --name $(KIND_CLUSTER)

OVERLAY ?= kind
deploy: install ## apply an overlay (OVERLAY=kind|k3d), creating the daemon token Secret once
	$(BIN)/kubectl create namespace nymph-system --dry-run=client -o yaml | $(BIN)/kubectl apply -f -
	@$(BIN)/kubectl -n nymph-system get secret nymph-daemon-token >/dev/null 2>&1 || \
	  $(BIN)/kubectl -n nymph-system create secret generic nymph-daemon-token \
	    --from-literal=token=nyq_$$($(BIN)/python -c 'import secrets; print(secrets.token_urlsafe(32))')
	$(BIN)/kubectl apply -k manifests/overlays/$(OVERLAY)

undeploy: ## remove nymph from the cluster
	$(BIN)/kubectl delete -k manifests/overlays/$(OVERLAY) --ignore-not-found

clean: 
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
