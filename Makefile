# fleetbench: `make run` and `make test` do all the set-up on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The environment is pinned: a regression suite compares runs, and torch changes between versions.
CONSTRAINTS := constraints.txt
# Where a machine keeps prebuilt wheels (this workplace keeps torch's CPU wheel there).
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
ARGS ?=

.PHONY: run test setup bench asv-smoke nightly-cpu clean-venv

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check $(FIND_LINKS) -c $(CONSTRAINTS) -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/fleetbench run $(ARGS)

test: setup
	$(PY) -m pytest tests $(ARGS)

bench: setup
	$(PY) -m pytest bench_cases --benchmark-only $(ARGS)

clean-venv:
	rm -rf $(VENV)
