# The README's two commands: `make main` (set up, then run the smoke suite and print its leaderboard) and `make test` (set up, then test).
# Both bootstrap themselves on a fresh Linux machine with Python 3.11: uv comes from PyPI into .tools/, the
# environment (.venv) comes from uv.lock, and Debian packages that tasks need are installed when run as root.

PYTHON ?= python3
UV_VERSION := 0.13.9
UV := .tools/bin/uv
VENV_PY := .venv/bin/python
# Debian packages: espeak-ng synthesizes the speech tasks' default data; chromium-headless-shell checks the leaderboard page.
APT_PACKAGES := espeak-ng chromium-headless-shell

.PHONY: main test test-fast bench gpu-check setup apt

main: setup
	.venv/bin/quest-bench sweep --suite smoke
	.venv/bin/quest-bench leaderboard --suite smoke
	$(VENV_PY) -m quest_bench.pagecheck results/smoke/leaderboard/index.html

test: setup
	$(VENV_PY) -m pytest -q

test-fast: setup  # skips the end-to-end Ray runs
	$(VENV_PY) -m pytest -q -m "not slow"

bench: setup
	$(VENV_PY) benchmarks/attention_speed.py --out benchmarks/results-cpu.md
	$(VENV_PY) benchmarks/attention_speed.py --tables vit --out benchmarks/results-cpu-memory.md

gpu-check: setup  # on a GPU machine (no datasets): the CUDA tests, then lm at paper size (docs/gpu-check.md)
	$(VENV_PY) benchmarks/gpu_check.py --out docs/gpu-check.md

setup: apt .venv/.synced

$(UV):
	$(PYTHON) -m venv .tools
	.tools/bin/pip install --quiet "uv==$(UV_VERSION)"

.venv/.synced: $(UV) uv.lock pyproject.toml packages/*/pyproject.toml tasks/*/pyproject.toml
	$(UV) sync --locked --python $(PYTHON)
	touch $@

apt:
ifneq ($(strip $(APT_PACKAGES)),)
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq $$missing; \
		else echo "missing Debian packages: $$missing (run as root, or: sudo apt-get install $$missing)"; exit 1; fi; \
	fi
endif
