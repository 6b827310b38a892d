"""Plans: seeded, replayable expansion of triggers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from chaos.plan.build import make_plan
from chaos.spec.scenario import parse_scenario

BASE = """\
name: p
seed: {seed}
allow_no_checks: true  # plan tests judge nothing
target: {{type: command, command: [sleep, "1"]}}
faults:
  - type: freeze
    params: {{pid: 1234}}
    duration: 1s
    trigger: {trigger}
"""


def _plan(trigger: str, seed: int = 1):
    return make_plan(parse_scenario(BASE.format(seed=seed, trigger=trigger)))


def test_every_expands_to_evenly_spaced_ops() -> None:
    plan = _plan("{every: {interval: 5s, count: 3}}")
    assert [op.at_s for op in plan.ops] == [5.0, 10.0, 15.0]
    assert [op.op_id for op in plan.ops] == ["freeze-1#1", "freeze-1#2", "freeze-1#3"]


def test_step_and_event_triggers_stay_symbolic() -> None:
    op = _plan("{at_step: 25, rank: 1}").ops[0]
    assert (op.at_step, op.rank, op.at_s) == (25, 1, None)
    op = _plan("{on_event: {kind: detect.*, nth: 2}}").ops[0]
    assert (op.event_kind, op.event_nth) == ("detect.*", 2)


@given(seed=st.integers(0, 2**32), count=st.integers(1, 20))
def test_poisson_replays_exactly_from_its_seed(seed: int, count: int) -> None:
    trigger = f"{{poisson: {{mtbf: 30s, count: {count}}}}}"
    first, again = _plan(trigger, seed), _plan(trigger, seed)
    assert first == again
    times = [op.at_s for op in first.ops]
    assert len(times) == count and all(t is not None and t > 0 for t in times)
    assert times == sorted(times)  # type: ignore[type-var]


def test_poisson_mean_gap_is_near_mtbf() -> None:
    plan = _plan("{poisson: {mtbf: 10s, count: 2000}}", seed=3)
    last = plan.ops[-1].at_s
    assert last is not None and 9.0 < last / 2000 < 11.0


def test_fault_params_expand_run_placeholders() -> None:
    from chaos.plan.build import fault_op

    scenario = parse_scenario(
        BASE.format(seed=4, trigger="{after: 1s}").replace(
            "params: {pid: 1234}", "params: {name: 'job {seed} {run_dir}'}"
        )
    )
    op = fault_op(make_plan(scenario).ops[0], scenario, {"run_dir": "/r/run-1", "seed": "4"})
    assert op.params.name == "job 4 /r/run-1"  # type: ignore[attr-defined]
    assert scenario.faults[0].params.name == "job {seed} {run_dir}"  # type: ignore[attr-defined]
