# Entry points for a fresh machine (demo, serve-demo, test, lint, bench); each creates .venv
# and installs what it needs, showing pip's progress.
VENV ?= .venv
PYTHON ?= python3
# Options for `python -m venv`: make demo VENV_FLAGS=--system-site-packages reuses a torch 2.14.1
# already installed for $(PYTHON) (a CPU build, say) instead of downloading torch's CUDA build.
VENV_FLAGS ?=
# Where demo and serve-demo listen: make demo PORT=8001 (HOST=0.0.0.0 for every interface).
HOST ?= 127.0.0.1
PORT ?= 8000
PIP := $(VENV)/bin/pip install --disable-pip-version-check
# demo and serve-demo need the hf extra only; test, lint and bench add the dev tools and the ray
# extra (a venv made by `make demo` gets the rest on the first `make test`).
DEMO_STAMP := $(VENV)/.installed-hf
STAMP := $(VENV)/.installed-dev-hf-ray

.PHONY: demo serve-demo test lint bench

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)

# The hf extra (torch, transformers, diffusers) runs the real Cosmos3 model code on the CPU. On
# Linux the package index serves torch's CUDA build, mostly CUDA libraries and triton unused on a
# CPU (README.md states the size and how to reuse an existing torch instead).
$(DEMO_STAMP): pyproject.toml | $(VENV)/bin/python
	@echo "sgl-omni: installing the hf extra into $(VENV), most of it torch's CUDA build (README.md: its size, why, and how to reuse a torch you have)"
	$(PIP) -e '.[hf]'
	touch $(DEMO_STAMP)

# The tests add the dev tools (pytest, playwright, schemathesis, ruff, mypy, ...) and the ray
# extra (Ray Serve, about 0.5 GB: the scale-out tests run a local Ray cluster).
$(STAMP): pyproject.toml | $(VENV)/bin/python
	@echo "sgl-omni: installing the hf, ray and dev extras into $(VENV)"
	$(PIP) -e '.[dev,hf,ray]'
	touch $(DEMO_STAMP) $(STAMP)

demo: $(DEMO_STAMP)  ## the interleaved pipeline on the CPU: hf backend, tiny random-weight checkpoint
	$(VENV)/bin/sgl-omni serve --demo --host $(HOST) --port $(PORT) --model-name cosmos3

serve-demo: $(DEMO_STAMP)  ## the interleaved pipeline on the CPU with the scripted engines
	$(VENV)/bin/sgl-omni serve --config configs/cpu-scripted.yaml --host $(HOST) --port $(PORT) --model-name cosmos3

# The tests wait on servers more than they compute: two pytest-xdist workers, each taking whole
# files (module-scoped servers start once). How long it takes: docs/development.md#test-time.
# TEST_WORKERS=0 runs it in one process. --max-worker-restart=0: a worker that dies (a test past
# its timeout ends its worker) fails the run at once; xdist 3.8's file scheduling can hang for
# good when it replaces a crashed worker (docs/development.md says more).
TEST_WORKERS ?= 2

test: $(STAMP)  ## the whole test suite
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadfile --max-worker-restart=0

lint: $(STAMP)  ## ruff on the code and tests, mypy on the package (CI runs both)
	$(VENV)/bin/ruff check sglang_omni tests benchmarks
	$(VENV)/bin/mypy sglang_omni

bench: $(STAMP)  ## the IPC relay benchmark
	$(VENV)/bin/python benchmarks/ipc_relay.py
