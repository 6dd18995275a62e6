# Quartermaster. `make demo` and `make test` set up everything they need themselves.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
KAFKA := deploy/kafka/kafka.sh

.PHONY: help install up down topics demo test test-unit test-k8s testcluster lint bench bench-core bench-webhook bench-queue \
	bench-kueue bench-replay bench-recovery bench-summary bench-warmup clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-18s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@command -v python3 >/dev/null || { echo "python3 not found: install Python 3.11+"; exit 1; }
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@rm -f $(VENV)/.installed-* && touch $(STAMP)

install: $(STAMP) ## create .venv and install Quartermaster with its test tools

up: install ## start the local Kafka broker (KRaft, no Docker) and create the topics
	$(KAFKA) start
	$(VENV)/bin/qm topics create

down: ## stop the local broker
	$(KAFKA) stop

topics: install ## create the bus topics on a running broker
	$(VENV)/bin/qm topics create

demo: up ## run the main job on the local broker
	$(VENV)/bin/qm demo

test: up ## unit, contract and integration tests (starts the broker if needed)
	QM_REQUIRE_KAFKA=1 $(PY) -m pytest -q

test-unit: install ## tests that need no broker
	$(PY) -m pytest -q tests/unit tests/contract

testcluster: ## build the Kubernetes test cluster binaries (once, ~5 min; cached in ~/.cache/quartermaster)
	bash deploy/testcluster/build.sh

test-k8s: install testcluster ## the watcher's tests against a real kube-apiserver (starts its own cluster)
	QM_REQUIRE_K8S=1 $(PY) -m pytest -q tests/k8s

lint: install ## ruff
	$(VENV)/bin/ruff check services tests bench

# BENCH_SCALE=0.1 make bench: a quick run of the same shapes (a tenth of the workloads).
BENCH_SCALE ?= 1
bench: up ## issue 10: Kueue's scenarios, the Alibaba replay, webhook, recovery; JSON in bench/results/, one table
	$(MAKE) --no-print-directory bench-core bench-warmup bench-queue bench-kueue bench-replay bench-webhook bench-recovery
	@$(PY) bench/summary.py

bench-warmup: up ## untimed pipeline runs until the broker's JVM has compiled its hot paths (ADR 0043)
	$(PY) bench/warm_broker.py

bench-kueue: up ## Kueue's baseline and large-scale scenarios on the full stack (--help: bench/bench_kueue.py)
	$(PY) bench/bench_kueue.py --scale $(BENCH_SCALE)

bench-replay: up ## the Alibaba GPU trace through every service as fast as it goes, ledger reconciled
	$(PY) bench/bench_replay.py --scale $(BENCH_SCALE)

bench-recovery: up ## queue-manager rebuild after 100,000 workloads, peak memory per service
	$(PY) bench/bench_recovery.py --scale $(BENCH_SCALE)

bench-summary: ## the markdown table of the JSON already in bench/results/
	@$(PY) bench/summary.py

bench-core: install ## quota core: one drain pass over 50,000 workloads
	$(PY) bench/bench_core.py

bench-webhook: install ## admission webhook latency at 500 and 2,000 requests/s
	$(PY) bench/bench_webhook.py

clean: ## stop the broker and delete its data
	$(KAFKA) reset

bench-queue: install ## queue-manager: decisions/s and latency at 500 submissions/s on the local broker
	$(PY) bench/bench_queue.py
