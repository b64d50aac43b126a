# Two commands on a fresh machine: `make demo` and `make test`. Both create .venv/ when missing.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test unit e2e lint down clean

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# Every version is pinned (requirements.lock, torch 2.13.0 included), so no resolver picks another torch build.
	$(BIN)/pip install -q -r requirements.lock
	$(BIN)/pip install -q --no-deps -e .
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/insitu demo

test: $(STAMP)
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
