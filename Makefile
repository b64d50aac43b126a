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

# Two streams at once: the tests on the one shared platform (tests/conftest.py marks them shared_platform), which
# leave about a quarter of two cores idle while they wait on its jobs, and beside them every other test (unit,
# parallel, bench smoke, the tests that start a platform of their own). Both must pass; the second one's report
# is printed after the first's. A background command ignores Ctrl-C (POSIX, without job control): the second
# stream puts Python's handler back, so Ctrl-C stops both, each tearing its platforms down.
BESIDE := import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler); sys.exit(pytest.main(sys.argv[1:]))
test: $(STAMP) postgres
	$(BIN)/ruff check .
	@export TMPDIR=$${TMPDIR:-/tmp}; beside_log=$$(mktemp); trap : INT; \
	echo "make test: pytest -m shared_platform here; pytest -m 'not shared_platform' beside it, into $$beside_log"; \
	$(BIN)/python -c '$(BESIDE)' -v -rs --durations=15 -p no:cacheprovider -m "not shared_platform" \
	  > $$beside_log 2>&1 & beside=$$!; \
	$(BIN)/pytest -v -rs --durations=15 -m shared_platform; shared=$$?; \
	wait $$beside; rest=$$?; while kill -0 $$beside 2>/dev/null; do wait $$beside; rest=$$?; done; \
	echo "======== the tests beside the shared platform (pytest -m 'not shared_platform'): exit $$rest"; \
	cat $$beside_log; rm -f $$beside_log; \
	test $$shared = 0 && test $$rest = 0

unit: $(STAMP)
	$(BIN)/pytest -q -m "not e2e"

e2e: $(STAMP)
	$(BIN)/pytest -v -m e2e

down: $(STAMP)
	$(BIN)/insitu down

clean:
	rm -rf $(VENV) .insitu
