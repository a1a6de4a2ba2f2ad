# Every target uses the virtual environment in .venv (made by `make install`).
# Python caches bytecode in .venv even where the environment says not to: else every process (Ray's agents
# and workers, each test subprocess, each spawned shard worker) recompiles Ray, JAX and Levanter on import,
# ~20 s each on 2 cores, which is enough to time out Ray's node startup.
unexport PYTHONDONTWRITEBYTECODE
VENV := .venv
PY := $(VENV)/bin/python
PYTHON ?= $(shell infra/find_python312.sh)

.PHONY: install tools lock lock-tools lint-imports demo data-demo test test-quick test-demo durations-docs lint bench \
	bench-docs status dashboard docs docs-serve screenshots clean

# Installs exactly the versions in requirements.lock (what CI tested), then the project itself without
# dependencies. `make lock` re-resolves pyproject.toml's dependencies and extras into the lock file.
EXTRAS := --extra steps --extra train --extra bench --extra test --extra lint --extra docs
UV := $(VENV)/bin/uv

$(VENV)/.installed: pyproject.toml requirements.lock
	@test -n "$(PYTHON)" || { infra/find_python312.sh; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip uv
	$(UV) pip sync --quiet --compile-bytecode --python $(PY) requirements.lock
	$(UV) pip install --quiet --python $(PY) --no-deps -e .
	@touch $@

install: $(VENV)/.installed

# Tools kept out of requirements.lock, whose sha256 the tiny eval suite versions (infra/tools.in says why): their own
# environment, pinned in requirements-tools.lock. `make lock-tools` re-resolves infra/tools.in.
TOOLS := .venv-tools
$(TOOLS)/.installed: requirements-tools.lock $(VENV)/.installed
	$(UV) venv --quiet --allow-existing --python $(PYTHON) $(TOOLS)
	$(UV) pip sync --quiet --python $(TOOLS)/bin/python requirements-tools.lock
	@touch $@

tools: $(TOOLS)/.installed

lock-tools: $(VENV)/.installed
	$(UV) pip compile infra/tools.in --python-version 3.12 --python-platform x86_64-manylinux_2_28 --quiet \
		-o requirements-tools.lock

# The layout's import rules ([tool.importlinter] in pyproject.toml; docs/contributing.md says what they mean): the
# rooms of executor/, steps/ in pipeline order, the public API, no cycles. Static: nothing is imported.
lint-imports: tools
	PYTHONPATH=$(CURDIR) $(TOOLS)/bin/lint-imports --no-cache

lock: $(VENV)/.installed
	$(UV) pip compile pyproject.toml $(EXTRAS) --python-version 3.12 --python-platform x86_64-manylinux_2_28 \
		--quiet -o requirements.lock

# The 535B-A23B DAG at tiny scale, on a local Ray under ./outputs (or $EXECUTOR_PREFIX). Its steps share JAX's
# persistent compilation cache (an evaluate step loads programs its train step compiled; a forced rerun loads them all),
# small programs included: each step's process compiles ~130 programs of under a second (the data pipeline's
# per-dataset jits, optimizer schedules, checkpoint restores), most the same in every step.
JAX_COMPILATION_CACHE_DIR ?= $(CURDIR)/build/jax-compilation-cache
JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS ?= 0
demo: export JAX_COMPILATION_CACHE_DIR := $(JAX_COMPILATION_CACHE_DIR)
demo: export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS := $(JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS)
demo: install
	$(PY) experiments/hero_535b.py --scale tiny --backend ray $(ARGS)

data-demo: install
	$(PY) experiments/data_demo.py --backend ray $(ARGS)

# Three pytest-xdist workers on a 2-core machine: a test often waits (on Ray starting, a subprocess, a lease, a
# hang timeout), and a third worker uses that time (two left the CPUs idler, side by side in the same hour). Each
# test file is one unit of work, the tiny hero's first (tests/conftest.py). TEST_WORKERS=0 runs the suite in this
# one process. Where the time went, per test file, goes to build/test-durations.md and .json
# (tests/support/durations_table.py); `make durations-docs` commits that table to docs/benchmarks.md.
TEST_WORKERS ?= 3

test: install lint-imports
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder \
		--durations-table build/test-durations $(ARGS)

# The quick tier for the edit loop (tests/support/tiers.py): the unit tests of executor/ and steps/, without Ray,
# training or compile subprocesses, browsers, services or anything marked slow; CI's `make test` runs them all.
QUICK_WORKERS ?= 2

test-quick: install
	$(PY) -m pytest -q -n $(QUICK_WORKERS) --dist loadfile --quick --durations-table build/test-quick-durations \
		tests/executor tests/steps $(ARGS)

durations-docs: install
	$(PY) benchmarks/render.py --durations build/test-durations.json

# Only `make demo`'s whole DAG, SIGKILLed mid-training, resumed and rerun (tests/e2e/test_hero_tiny.py; part of `make test`).
test-demo: install
	$(PY) -m pytest -q -m demo tests/e2e/test_hero_tiny.py $(ARGS)

lint: install
	$(VENV)/bin/ruff check executor steps experiments tests benchmarks
	$(VENV)/bin/ruff format --check executor
	$(VENV)/bin/mypy executor steps experiments

# Each benchmark writes its figures to benchmarks/results/<bench>.json (benchmarks/results.py); `make bench-docs`
# renders docs/benchmarks.md's tables from those files (tests/project/test_benchmarks_page.py holds them together).
bench: install
	@for bench in benchmarks/bench_*.py; do echo "== $$bench"; $(PY) $$bench || exit 1; done
	$(PY) benchmarks/bench_train.py --comm

bench-docs: install
	$(PY) benchmarks/render.py

status: install
	$(PY) -m executor status $${EXECUTOR_PREFIX:-outputs}

dashboard: install
	$(PY) -m executor dashboard --prefix $${EXECUTOR_PREFIX:-outputs} $(ARGS)

# The docs site (mkdocs.yml: docs/, with README.md as its home page) into build/site, offline. --strict fails on a
# broken link or anchor and on a page the nav leaves out, as tests/project/test_docs.py does in `make test`.
docs: install
	$(VENV)/bin/mkdocs build --strict $(ARGS)

docs-serve: install
	$(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000 $(ARGS)

# The picture on the README and the docs' home page: the tiny hero's run view as the published site draws it, saved
# by the browser test that publishes `make demo`'s DAG (tests/e2e/test_hero_tiny.py, which runs the DAG first: minutes),
# then kept under 300 KB as a 128-colour PNG.
SCREENSHOTS := $(CURDIR)/build/screenshots
screenshots: install
	TEST_ARTIFACTS_DIR=$(SCREENSHOTS) $(PY) -m pytest -q tests/e2e/test_hero_tiny.py -k tiny_heros_prefix_published $(ARGS)
	$(PY) -c "from PIL import Image; Image.open('$(SCREENSHOTS)/dashboard/publish-hero-run-view.png').convert('RGB')\
		.quantize(128).save('docs/img/run-view.png', optimize=True)"

clean:
	rm -rf $(VENV) $(TOOLS) outputs build/jax-compilation-cache build/site build/screenshots .pytest_cache .mypy_cache .ruff_cache
