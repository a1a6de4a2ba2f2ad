# Every target uses the virtual environment in .venv (made by `make install`).
VENV := .venv
PY := $(VENV)/bin/python
PYTHON ?= $(shell infra/find_python312.sh)

.PHONY: install demo test lint bench status dashboard clean

$(VENV)/.installed: pyproject.toml
	@test -n "$(PYTHON)" || { infra/find_python312.sh; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[steps,test,lint]'
	@touch $@

install: $(VENV)/.installed

demo: install
	$(PY) experiments/data_demo.py --backend ray $(ARGS)

test: install
	$(PY) -m pytest -q $(ARGS)

lint: install
	$(VENV)/bin/ruff check executor steps experiments tests benchmarks
	$(VENV)/bin/ruff format --check executor
	$(VENV)/bin/mypy executor steps experiments

bench: install
	@for bench in benchmarks/bench_*.py; do echo "== $$bench"; $(PY) $$bench || exit 1; done

status: install
	$(PY) -m executor status $${EXECUTOR_PREFIX:-outputs}

dashboard: install
	$(PY) -m executor dashboard --prefix $${EXECUTOR_PREFIX:-outputs} $(ARGS)

clean:
	rm -rf $(VENV) outputs .pytest_cache .mypy_cache .ruff_cache
