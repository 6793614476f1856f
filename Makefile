# The two commands of the README: `make run` and `make test`. Everything they need is installed here.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
AZURITE := tools/node_modules/.bin/azurite
# The console's browser tests drive Debian's Chromium (Playwright's own download is not used).
CHROMIUM := /usr/bin/chromium
SUDO := $(if $(filter 0,$(shell id -u)),,sudo)

.PHONY: run test check bench bench-quick bench-smoke clean

# exec: the runner is make's own child, so the SIGTERM make passes on reaches it; --under-make:
# it also stops when make alone gets a SIGINT (which make passes on to no one). A start-up problem
# is its one `error:` line, then make's `*** [...] Error 2`: `make run` fails.
run: $(VENV)/.run-deps $(AZURITE)
	@exec $(BIN)/python -m outbox.local --under-make $(RUN_ARGS)

test: $(VENV)/.dev-deps $(AZURITE) $(CHROMIUM)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

check: $(VENV)/.dev-deps
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m tests.support.iac_scan   # checkov over infra/azuredeploy.json, in .venv-checkov
	$(BIN)/hadolint Dockerfile

# The benchmark against its peers (every section: most of an hour on 2 cores, not timed whole;
# results into docs/benchmarks/). BENCH_ARGS adds options.
bench: $(VENV)/.bench-deps $(AZURITE)
	$(BIN)/python -m bench --output-json docs/benchmarks/results.json \
		--plot docs/benchmarks/results.png $(BENCH_ARGS)

# The headline in one sitting (under 30 minutes on 2 cores): throughput, latency at rates, a new
# process against a warm one, WAL, each against pgqueuer as a median of per-round ratios.
bench-quick: $(VENV)/.bench-deps $(AZURITE)
	$(BIN)/python -m bench --quick --output-json docs/benchmarks/quick.json \
		--plot docs/benchmarks/quick.png $(BENCH_ARGS)

# The same with tiny sizes: checks every contender delivers every message, never timing (CI).
bench-smoke: $(VENV)/.bench-deps $(AZURITE)
	$(BIN)/python -m bench --smoke $(BENCH_ARGS)

$(BIN)/python:
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11 or newer is needed (set PYTHON=...)"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The package itself too, editable: `python -m outbox` works from any folder with this venv.
$(VENV)/.run-deps: requirements.txt requirements-local.txt pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -r requirements-local.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@

$(VENV)/.dev-deps: requirements.txt requirements-local.txt requirements-dev.txt pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q --no-deps -e .
	touch $@ $(VENV)/.run-deps

$(VENV)/.bench-deps: bench/requirements.txt $(VENV)/.dev-deps
	$(BIN)/pip install -q -r bench/requirements.txt
	touch $@

$(AZURITE): tools/package.json tools/package-lock.json
	npm ci --prefix tools --no-audit --no-fund --loglevel=error
	touch $@

$(CHROMIUM):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq chromium

clean:
	rm -rf $(VENV) tools/node_modules .local .pytest_cache .mypy_cache .ruff_cache
