# Two commands do all set-up on a fresh machine: `make serve` and `make test`.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install serve test test-slow lint clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/tokenledger serve $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(PY) -m pytest -q -m slow $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,lint]'
	$(VENV)/bin/ruff check server commitlog ops kernels tests
	$(PY) -m mypy server commitlog ops kernels

clean:
	rm -rf $(VENV) build *.egg-info
