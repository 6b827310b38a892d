# The two commands in the README: `make demo` and `make test`. Both install what they need first.
PY := .venv/bin/python
export PYTHONUNBUFFERED := 1

.PHONY: setup demo test test-fast lint typecheck bench cleanup clean

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/mlchaos run scenarios/kill-rank.yaml

# The suite (on 3 pytest-xdist workers; MLCHAOS_TEST_WORKERS=N for N, 0 for one process), mypy, ruff, validate; prints its wall time.
test:
	@bash scripts/test.sh

test-fast: setup
	$(PY) -m pytest -q tests -m "not slow"

lint: setup
	.venv/bin/ruff check chaos injectors tests

typecheck: setup
	$(PY) -m mypy

bench: setup
	$(PY) benchmarks/run.py

cleanup: setup
	.venv/bin/mlchaos cleanup

# Everything the project made in this folder: the venv, tool caches, build metadata, bytecode, and all of
# reports/ but its .gitkeep (run folders, the golden-run cache reports/.golden, the run history, sdc-coverage).
# Outside this folder it leaves the fault journal (<state dir>/journal, run `make cleanup` first if a run
# died) and what scripts/setup.sh installed system-wide (Debian packages, dockerd and its log).
clean:
	rm -rf .venv .mypy_cache .pytest_cache .ruff_cache .hypothesis build dist *.egg-info
	find reports -mindepth 1 -maxdepth 1 ! -name .gitkeep -exec rm -rf {} +
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
