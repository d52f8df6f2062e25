# Developer entry points. `make` alone lists the targets.
# Installs are stamp-file driven: `make install` is a no-op until pyproject.toml,
# package.json or package-lock.json change (or .venv / node_modules are removed).

SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help
MAKEFLAGS += --no-print-directory

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEVDATA := .devdata
DAEMON_PID := $(DEVDATA)/daemon.pid
DAEMON_LOG := $(DEVDATA)/daemon.log
DEV_ENV := $(DEVDATA)/relayer.env
DEV := $(BIN)/python -m relayer_dev
PY_STAMP := $(VENV)/.installed
NODE_STAMP := node_modules/.installed
# Directories git does not keep while empty: lint only those that exist.
LINT_PATHS := $(wildcard relayer relayer_dev tests bench)
PYTEST_ARGS ?=
# pytest-xdist workers for the parallel part of `make test` (each file's tests stay on one worker)
# (4 on 2 cores: the integration tests mostly wait on blocks and sockets; measured 436 s against 561 s for 2)
TEST_WORKERS ?= 4
TPS ?= 150
BENCH_ARGS ?=

# True when pid $1 is a live `relayer all` (judged by its command line, so a recycled pid is left alone).
define is_daemon
[ -n "$$1" ] && [ -r "/proc/$$1/cmdline" ] && \
case "$$(tr '\0' ' ' <"/proc/$$1/cmdline")" in *"bin/relayer all"*) true ;; *) false ;; esac
endef

.PHONY: help install demo test check devnet devnet-down traffic compile lint docs pictures bench-facilitator bench-soak

help: ## List the targets
	@echo "usage: make <target>"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{ printf "  %-18s %s\n", $$1, $$2 }'

install: $(PY_STAMP) $(NODE_STAMP) ## Create .venv, install Python (editable, with dev extras) and npm deps; as root, chromium and promtool
	@scripts/test-tools install

$(PY_STAMP): pyproject.toml
	@if ! $(BIN)/python -c '' 2>/dev/null; then \
		echo "creating $(VENV) with $(PYTHON)"; \
		$(PYTHON) -m venv --clear $(VENV); \
	fi
	@echo "installing the Python packages into $(VENV) (about a minute on a fresh clone)"
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[dev]'
	@touch $@

# npm ci removes node_modules first, the stamp with it; optional deps carry anvil's binary.
# Fallback: when the lock lacks only anvil's other-platform packages (a registry without
# them cannot lock them), npm ci refuses; npm install --no-save then installs from the
# same lock without rewriting it. Any other npm ci failure stops here.
$(NODE_STAMP): package.json package-lock.json
	@mkdir -p $(DEVDATA)
	@echo "installing the npm packages (anvil, solc, OpenZeppelin) into node_modules"
	@if npm ci --no-audit --no-fund 2>$(DEVDATA)/npm-ci.err; then :; \
	elif awk '/^npm error Missing: / { m = 1; if ($$0 !~ /Missing: @foundry-rs\/anvil-/) bad = 1 } \
		END { exit !(m && !bad) }' $(DEVDATA)/npm-ci.err; then \
		echo "npm ci: lock lacks anvil's other-platform packages; falling back to npm install --no-save"; \
		npm install --no-audit --no-fund --no-save; \
	else \
		cat $(DEVDATA)/npm-ci.err >&2; exit 1; \
	fi
	@rm -f $(DEVDATA)/npm-ci.err
	@touch $@

demo: install ## Bring up devnet, database and daemon as needed and run one gasless retirement
	$(DEV) demo

# Two runs: every test but those marked `alone` on TEST_WORKERS pytest-xdist workers (a file's
# tests and module fixtures stay together: --dist loadfile; handed out in collection order, the
# slowest first: --no-loadscope-reorder and tests/conftest.py), then the `alone` ones (process kills,
# whole-machine load) one at a time. Exit status 5 (nothing collected, e.g. PYTEST_ARGS named
# files with no `alone` test) is not a failure. Ends by naming each system tool whose tests
# were skipped, and the command that installs it.
test: install ## Run the whole test suite: in parallel, then the `alone` tests (PYTEST_ARGS=... to pass options)
	@status=0; \
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m 'not alone' $(PYTEST_ARGS) || { rc=$$?; [ $$rc -eq 5 ] || status=$$rc; }; \
	$(BIN)/pytest -m alone $(PYTEST_ARGS) || { rc=$$?; [ $$rc -eq 5 ] || status=$$rc; }; \
	scripts/test-tools check; exit $$status

devnet: install ## Start devnet (anvil + contracts) and the daemon (`relayer all`) in the background
	$(DEV) devnet up
	@mkdir -p $(DEVDATA)
	@set -- "$$(cat $(DAEMON_PID) 2>/dev/null || true)"; \
	if $(is_daemon); then \
		echo "daemon already running (pid $$1), logs in $(DAEMON_LOG)"; \
		exit 0; \
	fi; \
	set -a; . $(DEV_ENV); set +a; \
	nohup $(BIN)/relayer all >>$(DAEMON_LOG) 2>&1 </dev/null & \
	pid=$$!; echo "$$pid" >$(DAEMON_PID); \
	sleep 2; \
	if ! kill -0 "$$pid" 2>/dev/null; then \
		echo "daemon exited at once; last lines of $(DAEMON_LOG):" >&2; \
		tail -n 30 $(DAEMON_LOG) >&2; rm -f $(DAEMON_PID); exit 1; \
	fi; \
	echo "daemon started (pid $$pid), logs in $(DAEMON_LOG)"

devnet-down: ## Stop the daemon started by `make devnet`, then the devnet
	@set -- "$$(cat $(DAEMON_PID) 2>/dev/null || true)"; \
	if $(is_daemon); then \
		echo "stopping daemon (pid $$1)"; \
		kill -TERM "$$1"; \
		for _ in $$(seq 100); do kill -0 "$$1" 2>/dev/null || break; sleep 0.1; done; \
		if kill -0 "$$1" 2>/dev/null; then echo "daemon ignored SIGTERM for 10 s; killing" >&2; kill -KILL "$$1"; fi; \
	elif [ -n "$$1" ]; then \
		echo "pid $$1 in $(DAEMON_PID) is not a running daemon; leaving it alone"; \
	fi; \
	rm -f $(DAEMON_PID)
	@if [ -x $(BIN)/python ]; then $(DEV) devnet down; else echo "$(BIN)/python missing: nothing to stop"; fi

traffic: install ## Other senders' token transfers on the running devnet at TPS a second (default 150) until Ctrl-C
	$(DEV) traffic --tps $(TPS)

SOAK_MINUTES ?= 10
bench-soak: install ## Soak: SOAK_MINUTES (default 10) at 200 ms blocks, 150 tx/s background, 20 retirements/s
	$(BIN)/python bench/soak.py --minutes $(SOAK_MINUTES)

compile: $(NODE_STAMP) ## Compile contracts/src into contracts_abi/ with the pinned solc
	node contracts/compile.js

lint: install ## ruff check, ruff format --check, mypy --strict, import-linter contracts
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/mypy --strict relayer relayer_dev
	$(BIN)/lint-imports

check: install ## The inner loop: lint, then the tests that need no chain and no database (tests/unit, tests/deploy)
	@$(MAKE) lint
	$(BIN)/pytest -q -p no:cacheprovider -n $(TEST_WORKERS) tests/unit tests/deploy $(PYTEST_ARGS)

docs: install ## Regenerate the settings reference in docs/configuration.md from relayer/config.py
	$(DEV) config-doc

pictures: install ## Render the certificate's pictures in docs/images (needs chromium and poppler-utils)
	$(DEV) pictures

bench-facilitator: install ## Our /facilitator/settle vs the x402 SDK's facilitator (BENCH_ARGS=--scenario dropped ...)
	$(BIN)/python bench/facilitator_vs_reference.py $(BENCH_ARGS)
