# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv/ when missing.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test unit e2e lint down clean postgres

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# Every version is pinned (requirements.lock, torch 2.13.0 included), so no resolver picks another torch build.
	$(BIN)/pip install -q -r requirements.lock
	$(BIN)/pip install -q --no-deps -e .
	@touch $(STAMP)

# The control plane's database (Debian's `postgresql`; preinstalled on most of our machines). Installed when root
# and missing; without it the platform keeps Prefect's and MLflow's state in SQLite.
postgres:
	@command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || \
	  { test "$$(id -u)" = 0 && { apt-get install -y -q postgresql >/dev/null || \
	    { apt-get update -q >/dev/null && apt-get install -y -q postgresql >/dev/null; }; }; } || \
	  echo "PostgreSQL is not installed: the platform keeps its control plane on SQLite (see docs/operations.md)"

demo: $(STAMP) postgres
	$(BIN)/insitu demo

test: $(STAMP) postgres
	$(BIN)/ruff check .
	TMPDIR=$${TMPDIR:-/tmp} $(BIN)/pytest -v -rs --durations=15

unit: $(STAMP)
	$(BIN)/pytest -q -m "not e2e"

e2e: $(STAMP)
	$(BIN)/pytest -v -m e2e

down: $(STAMP)
	$(BIN)/insitu down

clean:
	rm -rf $(VENV) .insitu
