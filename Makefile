# policypipe: `make demo` runs the pipeline on generated sample recordings, `make test` runs the tests.
# Both build the virtual environment from the lock first (idempotent: a second call does nothing).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned here, not in the lock, so one lock serves CPU laptops and CUDA servers:
# pip picks the build that fits the machine (set PIP_INDEX_URL/PIP_FIND_LINKS for a special one).
TORCH := torch==2.13.0
STAMP := $(VENV)/.installed

# DVC must never phone home: there is no internet on the machines this runs on.
export DVC_NO_ANALYTICS := 1
export PYTHONUNBUFFERED := 1

.PHONY: setup demo test test-fast lint lock bench bench-gpu smoke clean-demo remote push check-lerobot

setup: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH)"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	$(BIN)/python -m pip check
	touch $(STAMP)

# Recompile the lock from pyproject.toml.
# Not after setup: setup checks the environment against pyproject.toml, which a new dependency
# changes before the lock has it.
lock:
	test -x $(BIN)/pip-compile || { $(PYTHON) -m venv $(VENV) && $(BIN)/python -m pip install --quiet pip-tools; }
	$(BIN)/pip-compile --quiet --extra dev --strip-extras --unsafe-package torch \
		--no-emit-index-url --no-emit-find-links --output-file requirements.lock pyproject.toml

# The demo export is deterministic, so the committed data/raw.dvc matches what `sample` writes.
# 480 recordings: what the demo's recipe needs to see the block (docs/rollout.md, "The demo policy
# in closed loop"); the committed data/raw.dvc is of this many.
DEMO_RECORDINGS := 480
demo: $(STAMP)
	@if [ ! -d data/raw ]; then \
		$(BIN)/policypipe sample --recordings $(DEMO_RECORDINGS) data/raw && PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc add --quiet data/raw; \
	fi
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc repro

# Tests run in TEST_WORKERS processes (pytest-xdist): much of the suite waits on subprocesses,
# servers and Slurm, so two processes keep 2 cores busy, each computing on one thread
# (tests/conftest.py). A session fixture is built in each process that needs it, except those the
# tests that use them share in one process (conftest's SHARED_IN_ONE_PROCESS, --dist loadgroup),
# as a module's tests do where it has a module-scoped fixture (conftest's process_group).
# TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
PYTEST := PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# The whole suite, end-to-end, Slurm and SSH tests included: what CI runs.
test: $(STAMP)
	$(PYTEST)

# Unit tests only, for the edit-run loop: no DVC pipeline runs, no servers, no Slurm.
test-fast: $(STAMP)
	$(PYTEST) -m "not slow and not slurm"

# ruff's lint and format checks (pyproject.toml, [tool.ruff]); `ruff format .` applies the format.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean-demo:
	rm -rf data/raw data/manifest.json

# Benchmarks print ratios against baselines measured in the same run (these machines are noisy).
bench: $(STAMP)
	$(BIN)/python -m tests.benchmarks.bench_convert
	$(BIN)/python -m tests.benchmarks.bench_import_hdf5
	$(BIN)/python -m tests.benchmarks.bench_stats
	$(BIN)/python -m tests.benchmarks.bench_train
	$(BIN)/python -m tests.benchmarks.bench_serve
	$(BIN)/python -m tests.benchmarks.bench_monitor

# The real-robot recipe on one GPU (docs/training.md, "The real-robot recipe"): a fixed number of
# steps, samples/s, peak GPU memory and the loss. Refuses in one line on a machine without CUDA.
bench-gpu: $(STAMP)
	$(BIN)/python -m tests.benchmarks.bench_train --gpu

# The LeRobot export loaded by the real lerobot package, in an environment of its own (lerobot 0.6.1
# needs Python 3.12 and a torch older than this project's; a few GB of downloads, once): every
# frame it returns against the export's own files (docs/interop.md, "Checked with lerobot").
LEROBOT_PYTHON ?= python3.12
LEROBOT_VENV := .venv-lerobot
LEROBOT_CHECK := build/lerobot-check
check-lerobot: $(STAMP)
	test -x $(LEROBOT_VENV)/bin/python || $(LEROBOT_PYTHON) -m venv $(LEROBOT_VENV)
	$(LEROBOT_VENV)/bin/pip install -q 'lerobot[dataset]==0.6.1'
	rm -rf $(LEROBOT_CHECK)
	$(BIN)/python tests/interop/check_with_lerobot.py write $(LEROBOT_CHECK)
	$(LEROBOT_VENV)/bin/python tests/interop/check_with_lerobot.py load $(LEROBOT_CHECK)

# Before committing GPUs: the machine checked (policypipe doctor), then a few real steps,
# interrupted and resumed in a fresh process.
smoke: $(STAMP)
	$(BIN)/policypipe doctor
	$(BIN)/policypipe smoke

# An SSH remote for dvc push/pull, made the default (docs/lineage.md, "Remotes"):
#   make remote HOST=user@server DIR=/srv/dvc/policypipe KEY=~/.ssh/id_ed25519 [PORT=22] [NAME=server]
# DIR rather than PATH: PATH=... on make's command line would replace the shell's search path.
NAME ?= server
PORT ?= 22
remote: $(STAMP)
	@test -n "$(HOST)" && test -n "$(DIR)" || \
		{ echo "usage: make remote HOST=user@server DIR=/absolute/path [KEY=~/.ssh/id_ed25519] [PORT=22] [NAME=server]"; exit 2; }
	$(BIN)/policypipe remote add $(NAME) ssh://$(HOST):$(PORT)$(DIR) $(if $(KEY),--keyfile $(KEY))
	$(BIN)/policypipe remote check $(NAME)

# Push to the default remote, once its server's host key checks out (dvc-ssh does not check it).
push: $(STAMP)
	$(BIN)/policypipe remote check
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/dvc push
