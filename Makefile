# GeoServe — every target sets up what it needs on a fresh machine.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROTO_SRC := $(wildcard protos/geoserve/v1/*.proto)
TOPOLOGY ?= topologies/small.yaml
POLICY ?= round-robin
PYTEST_ARGS ?=

.PHONY: all venv lock proto proto-check lint typecheck test test-fast run bench bench-all clean help deps-system

help:
	@echo "make run    - set up and run the default emulated topology end to end"
	@echo "make test   - set up and run lint, type checks and the whole test suite"
	@echo "make proto  - regenerate protos/geoserve/v1/*_pb2*.py from the .proto files"
	@echo "make lint   - ruff + mypy"
	@echo "make bench  - performance figures -> docs/performance.md (bench-all: every bench/)"

venv: $(STAMP)

# Every dependency at its locked version, checked against the lock's hashes, then the
# project itself (editable). `make lock` re-resolves both lock files from pyproject.toml.
$(STAMP): pyproject.toml requirements-dev.lock
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --require-hashes -r requirements-dev.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	@touch $(STAMP)

lock:
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet uv
	$(BIN)/uv pip compile pyproject.toml --generate-hashes --python-version 3.11 --quiet \
	  -o requirements.lock
	$(BIN)/uv pip compile pyproject.toml --extra dev --generate-hashes --python-version 3.11 \
	  --quiet -o requirements-dev.lock

proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I protos \
	  --python_out=protos --pyi_out=protos --grpc_python_out=protos $(PROTO_SRC)

# Fails when the committed generated code differs from what `make proto` produces.
proto-check: $(STAMP)
	@tmp=$$(mktemp -d); \
	$(BIN)/python -m grpc_tools.protoc -I protos --python_out=$$tmp --pyi_out=$$tmp \
	  --grpc_python_out=$$tmp $(PROTO_SRC) && \
	for f in $$tmp/geoserve/v1/*.py $$tmp/geoserve/v1/*.pyi; do \
	  cmp -s $$f protos/geoserve/v1/$$(basename $$f) || { echo "stale generated code: protos/geoserve/v1/$$(basename $$f) (run make proto)"; rm -rf $$tmp; exit 1; }; \
	done; rm -rf $$tmp; echo "proto-check: generated code is current"

lint: $(STAMP)
	$(BIN)/ruff check services tests bench
	$(BIN)/mypy services

# Real components the tests exercise: a Prometheus server and a Docker engine (installed
# and started here when missing; both scripts are idempotent).
deps-system:
	bash deploy/ensure-prometheus.sh
	bash deploy/setup-docker.sh

test: $(STAMP) proto-check lint deps-system
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -x -q tests/unit $(PYTEST_ARGS)

run: $(STAMP)
	$(BIN)/geoserve run --topology $(TOPOLOGY) --policy $(POLICY)

bench: $(STAMP)
	$(BIN)/python bench/bench_wall_lateness.py
	$(BIN)/python bench/bench_perf.py

bench-all: bench
	@for b in bench/bench_engine.py bench/bench_policies.py bench/bench_e2e.py \
		bench/bench_chaos.py bench/bench_soak.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
