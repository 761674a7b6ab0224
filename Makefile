# Each target bootstraps its own virtualenv (.venv) from pinned dependencies.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Test processes: most tests wait on subprocesses (workers, Spark, Postgres), so more than the
# cores pays. `--dist loadgroup` selects the suite's own scheduler (tests/support/scheduling.py):
# the longest tests first, by tests/durations.json (refresh it with `make durations`), and a
# module with module-scoped fixtures as one unit (measured on 2 cores: docs/benchmarks.md).
TEST_WORKERS ?= 4

.PHONY: demo test check lint bench up clean check-prereqs docs durations

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Python 3.11+ is required (found %s); install python3.11 and run: make PYTHON=python3.11 ..." % sys.version.split()[0])'
	@$(PYTHON) -m venv --help >/dev/null 2>&1 || { echo "python venv module missing: apt-get install python3-venv"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	@command -v npm >/dev/null 2>&1 || { echo "npm is missing (the devnet's anvil comes from npm): apt-get install nodejs npm"; exit 1; }
	npm install --silent --no-audit --no-fund --prefix $(VENV)/node @foundry-rs/anvil@1.7.1
	@touch $(STAMP)

check-prereqs:
	@command -v java >/dev/null 2>&1 || { echo "Java 17 is missing (Spark needs it): apt-get install openjdk-17-jre-headless"; exit 1; }
	@command -v node >/dev/null 2>&1 || { echo "Node.js is missing (the devnet's anvil is an npm package): apt-get install nodejs npm"; exit 1; }

demo: $(STAMP) check-prereqs
	$(BIN)/trace demo

test: $(STAMP) check-prereqs
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup --durations=30

# The loop to run while working (a few minutes on 2 cores): lint, the unit tests (the store
# conformance suite on the in-memory twin among them) and every test not marked slow (the slow
# ones start Spark, whole stacks or many processes: tests/conftest.py). make test runs them all.
check: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup -m "not slow" tests/unit tests/property tests/integration

# The whole suite, recording each test's seconds for the scheduler's longest-first order.
durations: $(STAMP) check-prereqs
	TRACE_TEST_DURATIONS_OUT=tests/durations.json $(BIN)/pytest -n $(TEST_WORKERS) --dist loadgroup

# Every bench at full size, one at a time; their figures, ratios, the machine and the date go to
# bench/results.md (the docs' benchmark page includes it). `make test` runs each at smoke size.
bench: $(STAMP) check-prereqs
	SPARK_LOCAL_IP=127.0.0.1 $(BIN)/python bench/run_all.py --out bench/results.md

# The user's manual: the reference pages regenerated from the code (python -m
# trace_platform.docs_gen), then the mkdocs-material site built offline into build/site; a
# broken link or anchor fails it. make test checks the same (tests/unit/test_docs.py).
docs: $(STAMP)
	$(BIN)/python -m trace_platform.docs_gen
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

up: $(STAMP)
	$(BIN)/trace up

clean:
	-$(BIN)/trace db stop
	rm -rf $(VENV) .trace
