# Two commands do everything (see README.md):
#   make run    runs the broker on embedded defaults (./data, local-directory object store, SQLite catalog)
#   make test   runs the whole test suite (bootstraps PostgreSQL server binaries and Java when missing)
# Both create .venv and install the package into it first.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
ARGS   ?=
# Test processes (pytest-xdist): each has its own ports, PostgreSQL cluster and moto server; 0 runs in one process.
TEST_WORKERS ?= 2

.PHONY: run test bench system-deps venv clean

venv: $(STAMP)

# Native modules are compiled by the install: a changed C source or header reinstalls.
$(STAMP): pyproject.toml $(wildcard tiered/spark/_decode*.[ch] tiered/protocol/_*.[ch] tiered/storage/_*.[ch] tiered/server/_*.[ch] tiered/tiering/blocks/_*.[ch])
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "tiered needs Python 3.11 or newer (found %s)" % sys.version.split()[0])'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV) || { echo "could not create a virtual environment: install the python3-venv package" >&2; exit 1; }
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	@# setuptools calls [tool.setuptools.ext-modules] experimental on every build: a notice, not a problem.
	PYTHONWARNINGS=ignore::UserWarning $(PY) -m pip install -q --disable-pip-version-check -e '.[test,spark]'
	@rm -f $(VENV)/.installed-*
	@touch $@

system-deps:
	@sh .ci/system-deps

run: $(STAMP)
	$(VENV)/bin/tiered serve $(ARGS)

test: $(STAMP) system-deps
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal $(ARGS)

bench: $(STAMP)
	$(PY) -m bench $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis tiered/spark/_decode.*.so tiered/protocol/_bundlescan.*.so tiered/storage/_appender.*.so
