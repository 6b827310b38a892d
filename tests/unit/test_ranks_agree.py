"""``ranks_agree`` on hand-made histories (violations fail, agreement with evidence passes, no evidence is
unknown), and the pure parts of the consistency guard: ``judge`` (who is odd) and the digest sums (bit-exact)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from test_checks import ev, judge

from chaos.guards.consistency import TensorSums, hex_digest
from chaos.guards.consistency import judge as judge_ranks
from chaos.history.timeline import Event

FLIP = "flip-momentum"
A, B, C = "a" * 32, "b" * 32, "c" * 32


def fault(t: float = 1.0, name: str = FLIP) -> Event:
    return ev(t, "fault.applied", 1, fault=name, op=f"{name}#1", step=12)


def guard_ran(t: float, step: int, *, agree: bool = True, odd: list[int] | None = None) -> Event:
    return ev(t, "guard.consistency", 0, detector="consistency", step=step, agree=agree, digest=A, odd_ranks=odd or [])


def digest(t: float, rank: int, value: str) -> Event:
    return ev(t, "target.digest", rank, digest=value, step=30, attempt=0)


# ---------------------------------------------------------------------------------------------------------
# violations fail, naming the ranks and the step


def test_a_divergence_fails_naming_the_odd_rank_and_step() -> None:
    divergence = ev(
        2.0,
        "detect.divergence",
        1,
        detector="consistency",
        step=20,
        odd_ranks=[1],
        culprit_rank=1,
        groups=[[0, 2], [1]],
        tensors=["4.weight"],
        message="rank 1 diverged",
    )
    result = judge("ranks_agree", [fault(), guard_ran(1.5, 10), divergence, guard_ran(3.0, 30)])
    assert result.status == "fail"
    assert "rank 1 diverged from the others at step 20 (in 4.weight)" in result.reason
    assert result.measured == 1.0


def test_a_split_without_majority_fails_and_counts_every_rank() -> None:
    divergence = ev(2.0, "detect.divergence", 0, step=20, odd_ranks=[], culprit_rank=None, groups=[[0], [1]])
    result = judge("ranks_agree", [fault(), divergence])
    assert result.status == "fail" and "no majority (groups 0 | 1)" in result.reason
    assert result.measured == 2.0


def test_non_finite_parameters_fail_even_when_the_digests_agree() -> None:
    nonfinite = ev(2.0, "detect.nonfinite", 1, detector="consistency", step=20, tensors=["0.weight"], count=3)
    events = [fault(), nonfinite, guard_ran(2.5, 20), digest(3.0, 0, A), digest(3.0, 1, A)]
    result = judge("ranks_agree", events)
    assert result.status == "fail" and "rank 1 held 3 non-finite value(s) in its parameters at step 20" in result.reason


def test_final_digests_that_differ_fail_naming_the_minority() -> None:
    # the guard was off (no guard events): the final digests alone show the split
    events = [fault(), digest(3.0, 0, A), digest(3.0, 1, B), digest(3.0, 2, A)]
    result = judge("ranks_agree", events)
    assert result.status == "fail" and "different models" in result.reason and "rank 1 bbbbbbbbbbbb" in result.reason
    assert result.measured == 1.0


def test_final_digests_are_each_ranks_highest_attempt() -> None:
    # rank 1 differed in attempt 0, then the restarted job (attempt 1) ended with equal models: that passes;
    # the reverse fails.
    old = ev(2.0, "target.digest", 1, digest=B, step=30, attempt=0)
    new = [ev(4.0, "target.digest", r, digest=A, step=30, attempt=1) for r in (0, 1)]
    assert judge("ranks_agree", [fault(), old, *new]).status == "pass"
    worse = [ev(2.0, "target.digest", r, digest=A, step=30, attempt=0) for r in (0, 1)]
    late = ev(4.0, "target.digest", 1, digest=C, step=30, attempt=1)
    assert judge("ranks_agree", [fault(), *worse, late]).status == "fail"


def test_a_disagreeing_guard_check_fails_even_without_its_detection() -> None:
    result = judge("ranks_agree", [fault(), guard_ran(2.0, 20, agree=False, odd=[1])])
    assert result.status == "fail" and "disagree at step 20" in result.reason


def test_a_divergence_before_the_fault_still_fails() -> None:
    # failures count anywhere in the run: ranks that were apart before the fault did not "agree"
    early = ev(0.5, "detect.divergence", 1, step=10, odd_ranks=[1], culprit_rank=1, groups=[[0, 2], [1]])
    result = judge("ranks_agree", [early, fault(), guard_ran(2.0, 20)])
    assert result.status == "fail"


# ---------------------------------------------------------------------------------------------------------
# agreement passes, with evidence


def test_an_agreeing_check_after_the_fault_passes() -> None:
    result = judge("ranks_agree", [guard_ran(0.5, 10), fault(), guard_ran(2.0, 20)])
    assert result.status == "pass" and result.measured == 0.0
    assert "1 consistency check(s) after the last fault agreed" in result.reason


def test_equal_final_digests_from_two_ranks_pass_without_the_guard() -> None:
    result = judge("ranks_agree", [fault(), digest(3.0, 0, A), digest(3.0, 1, A)])
    assert result.status == "pass" and "2 ranks finished with the same model" in result.reason


def test_a_run_without_faults_passes_on_an_agreeing_check() -> None:
    assert judge("ranks_agree", [guard_ran(1.0, 10)]).status == "pass"


# ---------------------------------------------------------------------------------------------------------
# missing evidence is unknown


def test_no_guard_and_one_rank_digest_is_unknown() -> None:
    result = judge("ranks_agree", [fault(), digest(3.0, 0, A)])
    assert result.status == "unknown" and "final digests from 1 rank(s)" in result.reason


def test_checks_only_before_the_fault_are_not_evidence() -> None:
    result = judge("ranks_agree", [guard_ran(0.5, 10), fault(2.0)])
    assert result.status == "unknown" and "hashed the state before it" in result.reason


def test_a_check_reported_after_the_fault_but_hashed_before_it_is_not_evidence() -> None:
    # The guard reports a check one step late (pipelined): the step-10 check arrives after a fault fired in
    # step 11, but it hashed the state of step 10. Only a check of step 11 or later speaks for the fault.
    late = ev(1.1, "fault.applied", 1, fault=FLIP, op=f"{FLIP}#1", step=11)
    assert judge("ranks_agree", [late, guard_ran(1.2, 10)]).status == "unknown"
    assert judge("ranks_agree", [late, guard_ran(1.2, 10), guard_ran(2.0, 20)]).status == "pass"


def test_an_outside_fault_counts_from_the_step_after_the_last_reported_one() -> None:
    # a fault with no step (a signal, a partition): step 14 was reported before it, so the check of step 14
    # (reported after it) hashed the state before it; a check of step 15 came after
    steps = [ev(0.1 * s, "target.step", 0, step=s) for s in range(1, 15)]
    kill = ev(1.45, "fault.applied", None, fault="kill", op="kill#1")
    assert judge("ranks_agree", [*steps, kill, guard_ran(1.5, 14)]).status == "unknown"
    assert judge("ranks_agree", [*steps, kill, guard_ran(1.5, 14), guard_ran(1.7, 15)]).status == "pass"


def test_nothing_at_all_is_unknown() -> None:
    assert judge("ranks_agree", []).status == "unknown"


def test_fault_scopes_the_evidence_to_that_fault() -> None:
    events = [fault(1.0, "first"), guard_ran(2.0, 20), fault(3.0, "second")]
    assert judge("ranks_agree", events).status == "unknown"  # nothing after the last fault (second)
    assert judge("ranks_agree", events, fault="first").status == "pass"
    missing = judge("ranks_agree", events, fault="typo")
    assert missing.status == "unknown" and "never applied" in missing.reason


# ---------------------------------------------------------------------------------------------------------
# judge: who is odd


def test_judge_agreement() -> None:
    verdict = judge_ranks(10, [A, A, A], [0, 0, 0])
    assert verdict.agree and verdict.reference == A and verdict.odd_ranks == () and verdict.culprit is None


def test_judge_majority_names_the_odd_rank() -> None:
    verdict = judge_ranks(20, [A, B, A], [0, 0, 0])
    assert not verdict.agree and verdict.reference == A and verdict.odd_ranks == (1,) and verdict.culprit == 1
    assert verdict.groups == ((0, 2), (1,))
    two_odd = judge_ranks(20, [A, B, A, C, A], [0] * 5)
    assert two_odd.odd_ranks == (1, 3) and two_odd.culprit is None


def test_judge_without_majority_names_nobody() -> None:
    for digests in ([A, B], [A, A, B, B], [A, B, C]):
        verdict = judge_ranks(20, digests, [0] * len(digests))
        assert verdict.reference is None and verdict.odd_ranks == () and verdict.culprit is None
    assert "no majority" in judge_ranks(20, [A, B], [0, 0]).describe()


def test_judge_takes_the_finite_ranks_when_there_is_no_majority() -> None:
    verdict = judge_ranks(20, [A, B], [0, 5])
    assert verdict.reference == A and verdict.culprit == 1 and verdict.nonfinite_ranks == (1,)
    assert "(non-finite)" in verdict.describe()
    # every rank non-finite, or the finite ones split: no reference
    assert judge_ranks(20, [A, B], [1, 5]).reference is None
    assert judge_ranks(20, [A, B, C, C], [0, 0, 3, 3]).reference is None


# ---------------------------------------------------------------------------------------------------------
# the digest: bit-exact


def _digest(t: torch.Tensor) -> tuple[int, int]:
    s1, s2 = TensorSums().sums(t)
    return int(s1), int(s2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_every_single_bit_flip_changes_the_digest(dtype: torch.dtype) -> None:
    x = torch.randn(48, generator=torch.Generator().manual_seed(1)).to(dtype)
    ints = {2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()]
    clean = _digest(x)
    assert _digest(x.clone()) == clean  # identical tensors, identical digest
    width = x.element_size() * 8
    for index in range(x.numel()):
        for bit in range(width):
            y = x.clone()
            view = y.view(ints)
            mask = (1 << bit) - (1 << width) if bit == width - 1 else 1 << bit
            view[index] ^= mask
            assert _digest(y) != clean, (index, bit)


def test_opposite_flips_of_one_bit_cancel_a_plain_sum_but_not_the_digest() -> None:
    # Two elements, bit 22 clear in one and set in the other: flipping both moves the integer sum by
    # +2^22 - 2^22 = 0 (1.0 -> 1.5 and 1.75 -> 1.25). The sum of squares is why the digest still sees it.
    x = torch.tensor([1.0, 1.75, 3.0], dtype=torch.float32)
    y = x.clone()
    y.view(torch.int32)[0] ^= 1 << 22
    y.view(torch.int32)[1] ^= 1 << 22
    assert y.tolist() == [1.5, 1.25, 3.0]
    (s1, s2), (t1, t2) = _digest(x), _digest(y)
    assert s1 == t1 and s2 != t2
    # The one blind spot, by design: swapping two values (here 1.0 <-> 1.5) keeps both sums.
    swapped = torch.tensor([1.5, 1.0, 3.0])
    assert _digest(swapped) == _digest(torch.tensor([1.0, 1.5, 3.0]))


def test_sums_are_exact_and_chunking_and_layout_do_not_matter() -> None:
    n = (1 << 18) * 2 + 12345  # three chunks on the CPU
    x = torch.randn(n, generator=torch.Generator().manual_seed(3)) * 1e3
    ints = x.numpy().view(np.int32).astype(np.int64)
    with np.errstate(over="ignore"):
        expected = (int(ints.sum()), int((ints * ints).sum()))  # numpy wraps int64 like torch
    assert _digest(x) == expected
    m = torch.randn(64, 96, generator=torch.Generator().manual_seed(4))
    assert _digest(m.t()) == _digest(m.t().contiguous()) == _digest(m)  # the sums do not depend on the order


def test_a_random_change_of_many_elements_changes_the_digest() -> None:
    rng = random.Random(5)
    x = torch.randn(4096, generator=torch.Generator().manual_seed(5))
    clean = _digest(x)
    for _ in range(200):
        y = x.clone()
        for index in rng.sample(range(4096), rng.randint(2, 8)):
            y[index] = y[index] * (1 + 2**-20)
        assert _digest(y) != clean


def test_hex_digest_is_two_fixed_width_words() -> None:
    assert hex_digest([1, -1]) == "0000000000000001" + "f" * 16
