# The README's quick start: `make run` does the main job, `make test` runs the project's own tests.
# Both do all set-up first: system packages (installed when root, printed otherwise), the venv, the project.
VENV := .venv
PY := $(VENV)/bin/python
# Debian's interpreter, not a per-user one (pyenv under a 0700 /root): the unprivileged test user
# must be able to execute the venv's python too.
SYSTEM_PYTHON := $(firstword $(wildcard /usr/bin/python3) python3)
# The slowest tests, named at the end of every run: where CI's time goes (its target: well under 30 min).
PYTEST_ARGS ?= --durations=25

.PHONY: run test setup system-deps lint clean

system-deps:
	@scripts/system-deps

$(VENV)/.installed: pyproject.toml scripts/system-deps
	@scripts/system-deps
	$(SYSTEM_PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@# Bytecode now, even under PYTHONDONTWRITEBYTECODE: every witness launch ships inside.py compiled
	@# (conformance/plan.py), read from its .pyc rather than compiled per process.
	$(PY) -m compileall -q sandbox_conformance kernel processes probes conformance runners mrcheck commands
	touch $@

setup: $(VENV)/.installed

run: setup
	$(VENV)/bin/sandbox-conformance run

lint: setup
	$(VENV)/bin/ruff check kernel processes probes conformance runners mrcheck commands sandbox_conformance tests bench fleet
	$(VENV)/bin/mypy

test: setup lint
	@scripts/test-host-setup
	$(VENV)/bin/pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
