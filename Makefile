# Entry points for a fresh machine (demo, serve-demo, test, lint, bench); each creates .venv
# and installs what it needs.
VENV ?= .venv
PYTHON ?= python3
# Where demo and serve-demo listen: make demo PORT=8001 (HOST=0.0.0.0 for every interface).
HOST ?= 127.0.0.1
PORT ?= 8000
STAMP := $(VENV)/.installed-dev-hf-ray

.PHONY: demo serve-demo test lint bench

# The hf extra (torch, transformers, diffusers) runs the real Cosmos3 model code on the CPU; the
# ray extra (Ray Serve, about 0.5 GB) lets the scale-out tests run a local Ray cluster.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e '.[dev,hf,ray]'
	touch $(STAMP)

demo: $(STAMP)  ## the interleaved pipeline on the CPU: hf backend, tiny random-weight checkpoint
	$(VENV)/bin/sgl-omni serve --demo --host $(HOST) --port $(PORT) --model-name cosmos3

serve-demo: $(STAMP)  ## the interleaved pipeline on the CPU with the scripted engines
	$(VENV)/bin/sgl-omni serve --config configs/cpu-scripted.yaml --host $(HOST) --port $(PORT) --model-name cosmos3

# The tests wait on servers more than they compute: two pytest-xdist workers, each taking whole
# files (module-scoped servers start once), ran the suite in 6.5 min instead of 7.5 on the 2-core
# CI machine. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2

test: $(STAMP)  ## the whole test suite
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile

lint: $(STAMP)  ## ruff on the code and tests, mypy on the package (CI runs both)
	$(VENV)/bin/ruff check sglang_omni tests benchmarks
	$(VENV)/bin/mypy sglang_omni

bench: $(STAMP)  ## the IPC relay benchmark
	$(VENV)/bin/python benchmarks/ipc_relay.py
