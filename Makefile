# The two commands in the README: `make demo` and `make test`. Both install what they need first.
PY := .venv/bin/python
export PYTHONUNBUFFERED := 1

.PHONY: setup demo test test-fast lint typecheck bench cleanup clean

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/mlchaos run scenarios/kill-rank.yaml

test: setup
	$(PY) -m pytest -q tests
	$(PY) -m mypy
	.venv/bin/ruff check chaos injectors tests benchmarks
	.venv/bin/mlchaos validate scenarios/*.yaml

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

clean:
	rm -rf .venv .mypy_cache .pytest_cache reports/*-*
