# Two entry points for a fresh machine; each creates .venv and installs what it needs.
VENV ?= .venv
PYTHON ?= python3
STAMP := $(VENV)/.installed-dev

.PHONY: serve-demo test lint bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

serve-demo: $(STAMP)  ## the interleaved pipeline on the CPU with the scripted engines
	$(VENV)/bin/sgl-omni serve --config configs/cpu-scripted.yaml --host 127.0.0.1 --port 8000 --model-name cosmos3

test: $(STAMP)  ## the whole test suite
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(VENV)/bin/ruff check sglang_omni tests benchmarks

bench: $(STAMP)
	$(VENV)/bin/python benchmarks/ipc_relay.py
