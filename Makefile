# fleetbench: `make run` and `make test` do all the set-up on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The environment is pinned: a regression suite compares runs, and torch changes between versions.
CONSTRAINTS := constraints.txt
# A machine with an NVIDIA driver (nvidia-smi on the PATH) gets torch's CUDA build from the package index with
# every nvidia-*, triton and cuda-* package pinned (constraints-cuda.txt, which also refuses 2.13.0+cpu), never a
# local CPU wheel: no --find-links, and pip's PIP_FIND_LINKS unset; setup then checks torch is a CUDA build.
# Elsewhere: constraints.txt alone, and the folder where a machine keeps prebuilt wheels (torch's CPU wheel).
NVIDIA_SMI := $(shell command -v nvidia-smi 2>/dev/null)
ifeq ($(NVIDIA_SMI),)
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
PIN := -c $(CONSTRAINTS)
CHECK_WHEEL := true
else
FIND_LINKS :=
PIP := env -u PIP_FIND_LINKS $(PIP)
PIN := -c $(CONSTRAINTS) -c constraints-cuda.txt
CHECK_WHEEL := $(PY) -c 'import sys, torch; sys.exit(None if torch.version.cuda else "make setup: torch " \
	+ torch.__version__ + " is a CPU wheel on a machine with nvidia-smi (see constraints-cuda.txt)")'
endif
ARGS ?=

.PHONY: run test test-slow lint setup setup-hf bench asv-smoke asv-preview nightly-cpu figures clean-venv

# pip byte-compiles one file at a time (about 50 s of a 2-core machine's install for torch); compileall does the same on
# every core (about 20 s). Files in a newer Python's syntax (torch's testing/_internal/py312_intrinsics.py) are skipped,
# as pip skips them.
COMPILE := $(PY) -m compileall -q -j 0 $(VENV)/lib >/dev/null 2>&1 || true

# pip prints each package as it goes (a fresh install takes a minute or two; torch is the large one).
$(VENV)/.installed: pyproject.toml $(CONSTRAINTS) constraints-cuda.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --disable-pip-version-check --no-compile $(FIND_LINKS) $(PIN) -e '.[dev]'
	$(COMPILE)
	$(CHECK_WHEEL)
	touch $@

# Hugging Face models (`--model hf:GPT2Config`): transformers, about 180 MB, only when asked (and for the tests).
$(VENV)/.installed-hf: $(VENV)/.installed
	$(PIP) install --disable-pip-version-check --no-compile $(FIND_LINKS) $(PIN) -e '.[dev,hf]'
	$(COMPILE)
	touch $@

setup: $(VENV)/.installed
setup-hf: $(VENV)/.installed-hf

run: setup
	$(VENV)/bin/fleetbench run $(ARGS)

# Lint, type check, then the tests (CI runs this through .ci/run).
# Tests whose verdict depends on the machine's load (marked `statistical`) and whole pipelines run as
# subprocesses (marked `heavy`) are left to `make test-slow`.
# The tests run on TEST_WORKERS pytest-xdist workers, each test file on one worker (its module fixtures and its rank
# pools started once): a test waits on its ranks, children and bounds much of the time, so two workers keep a 2-core
# machine busy (a quarter less time here: docs/environment.md); TEST_WORKERS=0 runs them in this process, one at a time.
TEST_WORKERS ?= 2
test: setup-hf lint
	$(PY) -m pytest tests -m "not statistical and not heavy" -n $(TEST_WORKERS) --dist loadfile $(ARGS)

# The statistical end-to-end tests: ab catching +10%, bisect naming a +10% commit, asv history, kill sweeps,
# browser checks. Run by the scheduled CPU workflow and by `make nightly-cpu`; best on a quiet machine, and one test
# at a time (no workers): their verdicts depend on the machine's load.
test-slow: setup-hf
	$(PY) -m pytest tests -m "statistical or heavy" $(ARGS)

lint: setup
	$(VENV)/bin/ruff check suite tests bench_cases
	$(VENV)/bin/mypy

# pytest-benchmark over the smoke cases at world size 2 (about a minute on 2 cores); one table per model and
# world size; e.g. ARGS='--fleetbench-tag default' for more (docs/benchmarks.md).
bench: setup
	$(PY) -m pytest bench_cases --benchmark-only $(ARGS)

# The statistical tests (make test-slow), then the nightly pipeline (fleetbench nightly) on CPU over the smoke
# cases: run, pytest-benchmark, asv, report, gate.
nightly-cpu: setup test-slow
	PY=$(PY) .ci/nightly --device cpu --tag smoke

# One asv pass of mlp/plain at 2 ranks (5 timed windows in each of 2 processes, recorded as samples with their
# spread), recorded for this commit, and the dashboard built to work offline (vendored assets).
# Its own asv machine, `fleetbench machine-name` + "-smoke": asv keeps one result per commit and machine, written
# whole by each run, so a pass of another selection under the nightly's machine name would replace the nightly's
# cases for this commit (docs/benchmarks.md, "One selection per machine name").
# asv writes its machine file (~/.asv-machine.json) under HOME itself: every asv call gets a HOME inside results/
# (as the nightly's, --out/asv-home), so nothing is written under the user's home.
ASV_MACHINE ?= $(addsuffix -smoke,$(shell PYTHONPATH=. $(PY) -m suite.cli.main machine-name 2>/dev/null))
ASV_HOME := $(CURDIR)/results/asv-home
ASV := env HOME=$(ASV_HOME) $(VENV)/bin/asv
asv-smoke: setup
	mkdir -p $(ASV_HOME)
	$(ASV) machine --machine $(ASV_MACHINE) --yes
	FLEETBENCH_BENCH_CASES=mlp/plain FLEETBENCH_BENCH_WORLDS=2 $(ASV) run -E existing:same --record-samples \
		--set-commit-hash $$(git rev-parse HEAD) --machine $(ASV_MACHINE) --launch-method spawn --show-stderr
	$(ASV) publish
	$(VENV)/bin/fleetbench asv-offline results/html

# The dashboard served on loopback (opened as a file its pages cannot fetch their data): http://127.0.0.1:8080/
asv-preview:
	$(PY) -m http.server --bind 127.0.0.1 --directory results/html 8080

# Every strategy's benchmark figures, as written into the README (takes a while; run on a quiet machine).
# Each keeps its raw data (*-raw.json): `fleetbench figures NAME --load FILE` renders it again.
FIGURES := docs/figures
figures: setup
	mkdir -p $(FIGURES)
	$(VENV)/bin/fleetbench figures comm      --nproc 2 --rounds 9 --steps 5  --out $(FIGURES)/comm.md --save $(FIGURES)/comm-raw.json
	$(VENV)/bin/fleetbench figures compute   --nproc 2 --rounds 7 --steps 5  --out $(FIGURES)/compute.md --save $(FIGURES)/compute-raw.json
	$(VENV)/bin/fleetbench figures amp       --nproc 2 --rounds 7 --steps 5  --out $(FIGURES)/amp.md --save $(FIGURES)/amp-raw.json
	$(VENV)/bin/fleetbench figures local_sgd --nproc 2 --rounds 5 --steps 16 --out $(FIGURES)/local_sgd.md --save $(FIGURES)/local_sgd-raw.json
	$(VENV)/bin/fleetbench figures reader    --nproc 1 --rounds 5            --out $(FIGURES)/reader.md --save $(FIGURES)/reader-raw.json
	$(VENV)/bin/fleetbench figures host      --nproc 2 --rounds 5 --steps 20 --out $(FIGURES)/host.md --save $(FIGURES)/host-raw.json
	$(VENV)/bin/fleetbench figures workloads --nproc 2 --rounds 3 --steps 3 --out $(FIGURES)/workloads.md --save $(FIGURES)/workloads-raw.json
	# the engine's own cost beside DDP: 60 rounds and on, until each ratio's interval is 0.05 wide (at most 160)
	$(VENV)/bin/fleetbench figures engine_cost --nproc 2 --rounds 60 --max-rounds 160 --steps 3 \
		--out $(FIGURES)/engine_cost.md --save $(FIGURES)/engine_cost-raw.json
	# gate.md and cluster.md are kept as measured: their generators left the package (gate.md and cluster.md say how
	# they were made; experiments/README.md)

clean-venv:
	rm -rf $(VENV)
