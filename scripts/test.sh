#!/usr/bin/env bash
# `make test`: the set-up, the whole suite on parallel workers, mypy --strict, ruff, every shipped scenario
# validated; each step timed, and the whole command's wall time printed at the end (pass or fail).
#
# MLCHAOS_TEST_WORKERS sets the pytest-xdist workers (default 3; 0 runs the suite in one process). On the
# 2-core VM: one process ~3200 s, 2 workers 1525 s, 3 workers 1222 s, 4 workers ~1290 s with load failures
# (docs/test-time.md). PYTEST_ADDOPTS adds pytest options as usual.
set -uo pipefail
cd "$(dirname "$0")/.."

start=$SECONDS
failed=()
timings=()

step() {  # step NAME COMMAND...: run it, note its time, remember a failure and go on
    local name=$1 began=$SECONDS
    shift
    "$@"
    local code=$?
    timings+=("$name $((SECONDS - began))s")
    [ "$code" -eq 0 ] || failed+=("$name (exit $code)")
    return 0
}

bash scripts/setup.sh || { echo "make test: the set-up failed after $((SECONDS - start))s"; exit 1; }
timings+=("setup $((SECONDS - start))s")

workers=${MLCHAOS_TEST_WORKERS:-3}
parallel=()
[ "$workers" -gt 0 ] && parallel=(-n "$workers" --dist loadfile)
step pytest .venv/bin/python -m pytest -q --durations=25 "${parallel[@]}" tests
step mypy .venv/bin/python -m mypy
step ruff .venv/bin/ruff check chaos injectors tests benchmarks scripts
step format .venv/bin/ruff format --check chaos injectors tests benchmarks scripts
step validate .venv/bin/mlchaos validate scenarios/*.yaml

echo
echo "make test: $(IFS=,; echo "${timings[*]}" | sed 's/,/, /g'); whole command $((SECONDS - start))s"
if [ ${#failed[@]} -gt 0 ]; then
    echo "make test: FAILED: ${failed[*]}"
    exit 1
fi
echo "make test: passed"
