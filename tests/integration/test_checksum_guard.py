"""Checksummed all-reduce guard: no false positives, detection, localization, retry, policies, DDP parity.

Distributed tests run 2 real gloo ranks in fresh processes (``run_group``: spawn, a deadline, results back);
the rounding bounds are also checked on their own, against exact sums.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
import torch
import torch.distributed as dist
from support import Recorder
from torch import nn
from torch._C._distributed_c10d import GradBucket
from torch.nn.parallel import DistributedDataParallel

from chaos.guards._dist import Report, run_group
from chaos.guards.checksum import (
    ChecksumConfig,
    ChecksumState,
    SdcDetected,
    checksum_hook,
    checksummed_all_reduce,
)
from chaos.guards.rounding import (
    SUB_BLOCK,
    BlockLayout,
    abs_sum_bounds,
    carried_sums_term,
    pack_declared,
    sums_and_lower_bounds,
    tolerance_coefficients,
    unpack_reduced,
)
from chaos.injob.bitflip import Flip, flip_bits

TIMEOUT_S = 180.0


class OneFlip:
    """Flip ``bit`` of element ``index`` on ``rank`` at ``site``: once (transient) or on every attempt."""

    def __init__(self, rank: int, site: str, index: int, bit: int, *, persistent: bool = False) -> None:
        self.rank, self.site, self.index, self.bit, self.persistent = rank, site, index, bit, persistent
        self.fired = 0

    def __call__(self, site: str, bucket_index: int, tensor: torch.Tensor) -> None:
        if site == self.site and dist.get_rank() == self.rank and (self.persistent or not self.fired):
            self.fired += 1
            flip_bits(tensor, [Flip(self.index, self.bit)])


def _gradient_like(n: int, seed: int, scale: float = 1e-3) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed)) * scale


# -- the bounds alone --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_lower_and_upper_bounds_bracket_the_exact_abs_sum(dtype: torch.dtype) -> None:
    rng = torch.Generator().manual_seed(3)
    for trial in range(20):
        n = 5000 + trial * 37
        x = (torch.randn(n, generator=rng) * 10 ** (trial % 7 - 3)).to(dtype)
        if trial % 3 == 0:
            x[1::2] = -x[: n // 2]  # pairwise cancellation: sub-block sums near zero
        layout = BlockLayout(n, 256 if dtype != torch.float32 else 2048, 64)
        declared = sums_and_lower_bounds(x, layout)
        upper = abs_sum_bounds(x, layout, torch.arange(layout.n_blocks))
        for b in range(layout.n_blocks):
            start, stop = layout.span(b)
            values = x[start:stop].double().tolist()
            exact_abs = math.fsum(abs(v) for v in values)
            assert declared[1, b].item() <= exact_abs <= upper[b].item()
            assert abs(declared[0, b].item() - math.fsum(values)) <= 1e-5 * exact_abs + 1e-30


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_declaring_fused_with_the_copy_copies_exactly_and_declares_the_same(dtype: torch.dtype) -> None:
    for n, chunk in ((10_000, 4096), (2048 * 3, 2048), (100, 64), (5, 64)):
        x = (torch.randn(n, generator=torch.Generator().manual_seed(n)) * 1e-3).to(dtype)
        layout = BlockLayout(n, 2048 if dtype == torch.float32 else 64, 64)
        for scale in (None, 0.5, 1 / 3):
            out = torch.full((n,), float("nan"), dtype=dtype)
            fused = sums_and_lower_bounds(x, layout, copy_to=out, scale=scale, chunk=chunk)
            expected = x.clone() if scale is None else torch.mul(x, scale)
            assert torch.equal(out, expected)  # what the hook and the standalone send: bit for bit
            assert torch.equal(fused, sums_and_lower_bounds(x, layout))
            # In place (the DDP hook's path): the sums are of x as it was, and x ends scaled bit for bit.
            inplace = x.clone()
            assert torch.equal(sums_and_lower_bounds(inplace, layout, copy_to=inplace, scale=scale, chunk=chunk), fused)
            assert torch.equal(inplace, expected)


@pytest.mark.parametrize("world", [2, 3, 8])
def test_checksums_carried_in_float32_keep_the_bound(world: int) -> None:
    """Steps 5-6 of the derivation: declared sums rounded to float32 and reduced in float32 stay within the
    carried term, and the carried lower bound stays below the exact sum of |x| over the ranks."""
    gen = torch.Generator().manual_seed(world)
    layout = BlockLayout(4 * 2048 + 100, 2048, 64)
    rel, absolute = carried_sums_term(layout, torch.float32, world, torch.float32)
    for trial in range(30):
        ranks = []
        for _ in range(world):
            x = torch.randn(layout.numel, generator=gen) * 10.0 ** (trial % 9 - 40 if trial % 5 == 0 else trial % 9 - 4)
            if trial % 3 == 0:
                x = x.abs()  # every sub-block sum is as large as it gets: L as tight as it gets
            ranks.append(x)
        declared = [sums_and_lower_bounds(x, layout) for x in ranks]
        reduced = pack_declared(declared[0], torch.float32)
        for d in declared[1:]:  # the reduction, in float32, in one of its orders
            reduced += pack_declared(d, torch.float32)
        got = unpack_reduced(reduced, world)
        for b in range(layout.n_blocks):
            start, stop = layout.span(b)
            exact_abs = math.fsum(math.fsum(abs(v) for v in x[start:stop].double().tolist()) for x in ranks)
            declared_sum = math.fsum(float(d[0, b]) for d in declared)
            assert got[1, b].item() <= exact_abs
            assert abs(got[0, b].item() - declared_sum) <= rel * exact_abs + absolute * (stop - start)
    # The carried term is what tolerance_coefficients adds, and it is small next to the rest of the bound.
    base = tolerance_coefficients(layout, torch.float32, world, 1.0, None)
    carried = tolerance_coefficients(layout, torch.float32, world, 1.0, None, torch.float32)
    assert carried[0] == pytest.approx(base[0] + rel) and rel < 0.1 * base[0]


# -- clean reductions ---------------------------------------------------------------------------------------------


def _clean_worker(rank: int, world: int, report: Report, trials: int) -> dict[str, Any]:
    rng = random.Random(1000 + rank)
    shared = random.Random(7)  # sizes and dtypes must match across ranks
    states = {d: ChecksumState(config=ChecksumConfig(emit=Recorder())) for d in ("float32", "bfloat16", "float16")}
    # Every other float32 trial carries its checksums in the reduced buffer itself (rounded to float32).
    states["carried"] = ChecksumState(config=ChecksumConfig(emit=Recorder(), carry_checksums=True))
    mismatched_results = 0
    for t in range(trials):
        dtype_name = shared.choice(["float32"] * 6 + ["bfloat16", "float16"])
        dtype = getattr(torch, dtype_name)
        n = shared.choice([1, 63, 2048, 4097, 20_000, 100_003])
        kind = t % 5
        if dtype == torch.float32:
            scale = 10.0 ** rng.uniform(-8, 4)  # independent per rank: 1e-8 on one, 1e4 on the other
        else:
            scale = 10.0 ** rng.uniform(-3, 2)  # inside float16's range either way
        x = _gradient_like(n, rng.randrange(2**31), scale)
        if kind == 1:
            x.fill_(scale * rng.choice([1.0, -1.0, 3.0, 1 / 3]))  # constant blocks: every error the same sign
        elif kind == 2:
            x[1::2] = -x[: n // 2] * (1 + 2.0**-20)  # cancellation inside every sub-block
        elif kind == 3:
            x[: n // 2] = 0.0
        elif kind == 4:
            x *= torch.pow(10.0, torch.randn(n, generator=torch.Generator().manual_seed(t)) * 2)  # heavy tails
        x = x.to(dtype)
        ref = x.clone()
        dist.all_reduce(ref)
        state = states["carried" if dtype == torch.float32 and t % 2 else dtype_name]
        ok = checksummed_all_reduce(x, state=state, bucket_index=n)
        assert ok
        ints = torch.int32 if dtype == torch.float32 else torch.int16
        mismatched_results += int(not torch.equal(x.view(ints), ref.view(ints)))
    return {
        "mismatches": sum(s.stats.mismatches for s in states.values()),
        "second_checks": sum(s.stats.second_checks for s in states.values()),
        "events": sum(len(s.config.emit.events) for s in states.values()),
        "result_differs": mismatched_results,
    }


def _cancellation_worker(rank: int, world: int, report: Report) -> dict[str, int]:
    """Data built so the cheap first tier cannot clear it: the exact second tier must, without a flag."""
    state = ChecksumState(config=ChecksumConfig(emit=Recorder()))
    # A block's partial j sums its elements j, j + stride, j + 2 stride, ... (rounding._partials): signs that
    # alternate every ``stride`` elements make every partial cancel.
    stride = ChecksumConfig().block_elems // SUB_BLOCK
    signs = torch.tensor([1.0, -1.0]).repeat_interleave(stride).repeat(10_240 // stride)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(20):
        noise = torch.rand(signs.numel(), generator=gen)
        x = signs * (1.0 + noise * 2.0**-20) if rank == 0 else signs * 0.125 * (1.0 + noise * 2.0**-20)
        assert checksummed_all_reduce(x, state=state)
    return {"mismatches": state.stats.mismatches, "second_checks": state.stats.second_checks}


def test_clean_reductions_never_flag_and_are_untouched() -> None:
    results = run_group(_clean_worker, 2, 400, timeout_s=TIMEOUT_S)
    for r in results:
        assert r == {"mismatches": 0, "second_checks": r["second_checks"], "events": 0, "result_differs": 0}


def test_heavy_cancellation_goes_to_the_exact_tier_and_still_passes() -> None:
    for r in run_group(_cancellation_worker, 2, timeout_s=TIMEOUT_S):
        assert r["mismatches"] == 0
        assert r["second_checks"] == 20  # every reduction needed the exact bound, none was flagged


# -- injected faults ---------------------------------------------------------------------------------------------


def _fault_worker(
    rank: int, world: int, report: Report, site: str, bit: int, policy: str, persistent: bool, carry: bool | None = None
) -> dict[str, Any]:
    recorder = Recorder()
    state = ChecksumState(config=ChecksumConfig(policy=policy, emit=recorder, carry_checksums=carry))
    x = _gradient_like(300_000, 11 + rank)
    index = int(torch.argmax(x.abs()))  # |x| >= RMS for sure (the post_reduce flip hits the reduced value)
    ref = x.clone()
    dist.all_reduce(ref)
    state.corrupt = OneFlip(1, site, index, bit, persistent=persistent)
    state.step = 42
    outcome: dict[str, Any] = {}
    try:
        outcome["ok"] = checksummed_all_reduce(x, state=state)
    except SdcDetected as exc:
        outcome["raised"] = exc.detection
    outcome["identical"] = torch.equal(x.view(torch.int32), ref.view(torch.int32))
    outcome["detections"] = state.detections
    outcome["events"] = recorder.events
    outcome["stats"] = state.stats
    outcome["skip"] = state.consume_skip()
    return outcome


@pytest.mark.parametrize(("bit", "carry"), [(23, None), (27, None), (30, None), (31, None), (30, True)])
def test_in_transit_flip_is_detected_everywhere_localized_and_retried_bit_exact(bit: int, carry: bool | None) -> None:
    # None: the standalone's default (a separate checksum collective); True: appended to the reduced buffer.
    results = run_group(_fault_worker, 2, "in_transit", bit, "retry", False, carry, timeout_s=TIMEOUT_S)
    for rank, r in enumerate(results):
        assert r["ok"] and r["identical"] and not r["skip"]  # one retry, then bit-for-bit the clean result
        [detection] = r["detections"]
        assert detection.ranks == (0, 1) and detection.site_hint == "in_transit" and detection.culprit_rank == 1
        assert detection.action == "retry" and detection.step == 42
        [(kind, emitted_rank, data)] = r["events"]
        assert kind == "detect.sdc" and emitted_rank == rank
        assert data["detector"] == "checksum" and data["culprit_rank"] == 1 and data["attempt"] == 0
        assert data["bucket"] == 0 and len(data["blocks"]) == 1
        assert r["stats"].retries == 1 and r["stats"].repaired == 1


def test_post_reduce_flip_is_detected_on_the_hit_rank_and_every_rank_retries() -> None:
    results = run_group(_fault_worker, 2, "post_reduce", 29, "retry", False, timeout_s=TIMEOUT_S)
    for r in results:
        assert r["ok"] and r["identical"]
        [detection] = r["detections"]
        assert detection.ranks == (1,) and detection.site_hint == "post_reduce" and detection.culprit_rank == 1
        assert r["stats"].retries == 1
    assert results[0]["events"] == []  # rank 0's own result verified; only the hit rank reports
    assert [e[1] for e in results[1]["events"]] == [1]


def test_policy_raise_raises_on_every_rank() -> None:
    for r in run_group(_fault_worker, 2, "in_transit", 30, "raise", False, timeout_s=TIMEOUT_S):
        assert r["raised"].culprit_rank == 1 and r["raised"].action == "raise"
        assert "ok" not in r and r["stats"].raised == 1


def test_policy_skip_and_exhausted_retries_skip_the_step_on_every_rank() -> None:
    for r in run_group(_fault_worker, 2, "in_transit", 30, "skip", False, timeout_s=TIMEOUT_S):
        assert r["ok"] is False and r["skip"] and not r["identical"]
    # A fault that hits every attempt: the retry mismatches too, and the step is skipped.
    for r in run_group(_fault_worker, 2, "in_transit", 30, "retry", True, timeout_s=TIMEOUT_S):
        assert r["ok"] is False and r["skip"]
        assert [d.action for d in r["detections"]] == ["retry", "skip"]
        assert r["stats"].skipped_steps == 1 and r["stats"].repaired == 0


def test_local_corruption_is_invisible_to_the_checksum() -> None:
    for r in run_group(_fault_worker, 2, "local", 30, "retry", False, timeout_s=TIMEOUT_S):
        assert r["ok"] and not r["identical"] and r["detections"] == []  # the anomaly guard's job


def _float64_and_sampling_worker(rank: int, world: int, report: Report) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # float64 buckets carry float64 checksums: clean reductions pass, an exponent flip in transit is repaired.
    state = ChecksumState(config=ChecksumConfig(emit=Recorder()))
    gen = torch.Generator().manual_seed(rank)
    for k in range(20):
        x = torch.randn(50_000, generator=gen, dtype=torch.float64) * 10.0 ** (k - 10)
        assert checksummed_all_reduce(x, state=state)
    x = _gradient_like(50_000, 3 + rank).double()
    ref = x.clone()
    dist.all_reduce(ref)
    index = int(torch.argmax(x.abs()))
    fired: list[int] = []

    def blow_up(site: str, bucket_index: int, tensor: torch.Tensor) -> None:  # bit flips are 16/32-bit only
        if site == "in_transit" and rank == 1 and not fired:
            fired.append(1)
            tensor[index] *= -(2.0**40)  # a sign and exponent change of one element

    state.corrupt = blow_up
    out["f64_ok"] = checksummed_all_reduce(x, state=state)
    out["f64_identical"] = torch.equal(x, ref)
    out["f64_stats"] = state.stats
    # verify_every=4: a flip injected into every reduction is caught exactly in the verified ones (1 in 4).
    sampled = ChecksumState(config=ChecksumConfig(emit=Recorder(), verify_every=4, policy="skip"))
    caught = []
    for k in range(12):
        sampled.corrupt = OneFlip(1, "in_transit", 17, 30)
        y = _gradient_like(30_000, 100 + k + rank)
        caught.append(not checksummed_all_reduce(y, state=sampled, bucket_index=5))
    out["caught"] = caught
    out["sampled_stats"] = sampled.stats
    return out


def test_float64_carried_checksums_and_verify_every() -> None:
    for r in run_group(_float64_and_sampling_worker, 2, timeout_s=TIMEOUT_S):
        assert r["f64_ok"] and r["f64_identical"]
        assert r["f64_stats"].mismatches == 1 and r["f64_stats"].repaired == 1
        assert r["caught"] == [k % 4 == 0 for k in range(12)]  # the declared coverage: 1/4, on schedule
        assert r["sampled_stats"].unverified_reductions == 9 and r["sampled_stats"].buckets_checked == 3


# -- one global checksum vs blocks --------------------------------------------------------------------------------


def _global_vs_blocks_worker(rank: int, world: int, report: Report, trials: int) -> dict[str, int]:
    n = 25 * 2**20 // 4
    pool = _gradient_like(n + 65_536, 5 + rank)
    rms = float(pool.norm()) / math.sqrt(pool.numel())
    x = torch.empty(n)
    blocks = ChecksumState(config=ChecksumConfig(policy="skip", localize=False, emit=Recorder()))
    whole = ChecksumState(config=ChecksumConfig(block_elems=n, policy="skip", localize=False, emit=Recorder()))
    rng = random.Random(99)  # the same flips on both ranks
    caught = {"blocks": 0, "global": 0}
    for _ in range(trials):
        offset, bit = rng.randrange(65_536), rng.randrange(32)
        index = rng.randrange(n)
        while abs(float(pool[offset + index])) < rms:
            index = rng.randrange(n)
        for name, state in (("blocks", blocks), ("global", whole)):
            x.copy_(pool[offset : offset + n])
            state.corrupt = OneFlip(1, "in_transit", index, bit)
            caught[name] += int(not checksummed_all_reduce(x, state=state))
    return caught


def test_one_checksum_over_a_25mb_bucket_misses_most_single_bit_flips() -> None:
    trials = 64
    caught = run_group(_global_vs_blocks_worker, 2, trials, timeout_s=TIMEOUT_S)[0]
    # Measured: a single checksum only sees flips that blow a value up by ~2^64 or more (a few %); blocks of
    # 2048 see every sign/exponent flip and the upper mantissa bits of these |x| >= RMS elements (~half).
    assert caught["global"] / trials < 0.15
    assert caught["blocks"] / trials > 0.4
    assert caught["blocks"] >= 4 * max(caught["global"], 1)


# -- the DDP communication hook -----------------------------------------------------------------------------------


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 1))


def _train(
    rank: int, hook: str, steps: int, as_view: bool, fault_step: int | None, policy: str, every: int = 1
) -> dict[str, Any]:
    model = _model()
    # Small buckets, so several buckets (and bucket rebuilding after step 1) are exercised.
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.05, gradient_as_bucket_view=as_view)
    state = None
    if hook == "checksum":
        state = ChecksumState(config=ChecksumConfig(policy=policy, emit=Recorder(), verify_every=every))
        ddp.register_comm_hook(state, checksum_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    raised = None
    for step in range(steps):
        x = torch.randn(16, 32, generator=gen)
        y = x.sum(1, keepdim=True).sin()
        if state is not None:
            state.step = step
            state.corrupt = OneFlip(1, "in_transit", 7, 30) if step == fault_step else None
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        try:
            loss.backward()
        except RuntimeError as exc:  # DDP re-raises the hook's SdcDetected wrapped in its own error
            raised = str(exc)
            break
        if state is not None and state.consume_skip():
            continue
        opt.step()
    params = [p.detach().clone() for p in model.parameters()]
    return {
        "params": params,
        "raised": raised,
        "stats": state.stats if state else None,
        "send_buffers": state is not None and any(k[0] == "send" for k in state._buffers),
    }


def _ddp_worker(
    rank: int, world: int, report: Report, as_view: bool, fault_step: int | None, policy: str, every: int = 1
) -> dict[str, Any]:
    default = _train(rank, "default", 12, as_view, None, policy)
    guarded = _train(rank, "checksum", 12, as_view, fault_step, policy, every)
    same = all(
        torch.equal(a.view(torch.int32), b.view(torch.int32))
        for a, b in zip(default["params"], guarded["params"], strict=True)
    )
    return {
        "same": same,
        "raised": guarded["raised"],
        "stats": guarded["stats"],
        "send_buffers": guarded["send_buffers"],
    }


@pytest.mark.parametrize(("as_view", "every"), [(False, 1), (True, 1), (False, 3)])
def test_ddp_hook_trains_bit_identically_to_default_ddp(as_view: bool, every: int) -> None:
    for r in run_group(_ddp_worker, 2, as_view, None, "retry", every, timeout_s=TIMEOUT_S):
        assert r["same"], "a clean checksummed step must equal default DDP bit for bit"
        assert r["stats"].buckets_checked > 12 // every and r["stats"].mismatches == 0
        assert (r["stats"].unverified_reductions > 0) == (every > 1)


@pytest.mark.parametrize("as_view", [False, True])
def test_ddp_hook_retries_an_in_transit_fault_and_still_ends_bit_identical(as_view: bool) -> None:
    # False: the bucket is averaged in place and the retry rebuilds it from the parameters' .grad; True: the
    # .grad tensors are the bucket, so it stays intact and the average goes into the state's send buffer.
    for r in run_group(_ddp_worker, 2, as_view, 5, "retry", timeout_s=TIMEOUT_S):
        assert r["same"] and r["stats"].mismatches == 1 and r["stats"].repaired == 1
        assert r["send_buffers"] == as_view


def test_ddp_hook_policy_raise_surfaces_from_backward() -> None:
    for r in run_group(_ddp_worker, 2, False, 5, "raise", timeout_s=TIMEOUT_S):
        assert r["raised"] is not None and "silent data corruption" in r["raised"]


def _grads_during_hook_worker(rank: int, world: int, report: Report, as_view: bool) -> list[tuple[bool, bool, bool]]:
    """Per bucket seen by a hook: (every .grad outside the bucket's storage, every .grad equal to its slot of the
    bucket, every .grad unchanged after the bucket was overwritten in place), then the same after backward."""
    seen: list[tuple[bool, bool, bool]] = []

    def hook(_: None, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        grads = [p.grad for p in bucket.parameters()]
        views = bucket.gradients()
        outside = all(
            g is not None and g.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr() for g in grads
        )
        equal = all(g is not None and torch.equal(g, v) for g, v in zip(grads, views, strict=True))
        before = [None if g is None else g.clone() for g in grads]
        buffer.mul_(0.5)
        dist.all_reduce(buffer)  # what the in-place path does to the bucket
        kept = all(g is not None and b is not None and torch.equal(g, b) for g, b in zip(grads, before, strict=True))
        seen.append((outside, equal, kept))
        future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        future.set_result(buffer)
        return future

    hook.__annotations__.update({"bucket": GradBucket, "return": torch.futures.Future[torch.Tensor]})
    model = _model()
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.05, gradient_as_bucket_view=as_view)
    ddp.register_comm_hook(None, hook)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(3):  # the first step runs with the initial buckets, later ones with the rebuilt ones
        x = torch.randn(16, 32, generator=gen)
        ddp.zero_grad()
        ddp(x).square().mean().backward()
    return seen


@pytest.mark.parametrize("as_view", [False, True])
def test_param_grads_hold_the_local_gradient_while_the_hook_runs(as_view: bool) -> None:
    # The DDP hook's in-place path rests on this reducer behaviour (torch 2.13): with
    # gradient_as_bucket_view=False each .grad is a separate copy of its bucket slot, untouched until the
    # hook's future completes; with True, the .grad tensors are views of the bucket (the hook must keep a copy).
    for seen in run_group(_grads_during_hook_worker, 2, as_view, timeout_s=TIMEOUT_S):
        assert len(seen) >= 3  # a bucket per step at least (several once buckets are rebuilt)
        if as_view:
            assert not any(outside for outside, _, _ in seen[len(seen) // 2 :])  # views once buckets are rebuilt
        else:
            assert all(all(flags) for flags in seen)


def _no_intact_worker(rank: int, world: int, report: Report, policy: str) -> dict[str, Any]:
    """The standalone with nothing to redo or localize (policy skip/raise, localize=False): no intact copy."""
    config = ChecksumConfig(policy=policy, localize=False, emit=Recorder())  # type: ignore[arg-type]
    state = ChecksumState(config=config)
    out: dict[str, Any] = {"differs": 0}
    # A block's partial j sums its elements j, j + stride, j + 2 stride, ... (rounding._partials): signs that
    # alternate every ``stride`` elements make every partial cancel.
    stride = ChecksumConfig().block_elems // SUB_BLOCK
    signs = torch.tensor([1.0, -1.0]).repeat_interleave(stride).repeat(10_240 // stride)
    for k in range(12):
        if k % 3 == 0:  # cancellation in every sub-block: only the exact bound clears it
            x = signs * (1.0 + torch.rand(signs.numel(), generator=torch.Generator().manual_seed(k)) * 2.0**-20)
            x = x * (0.125 if rank else 1.0)
        else:
            x = _gradient_like(50_001, 10 * k + rank, 10.0 ** (k % 5 - 3))
        ref = x.clone()
        dist.all_reduce(ref)
        assert checksummed_all_reduce(x, state=state)
        out["differs"] += int(not torch.equal(x, ref))
    out["clean"] = (state.stats.mismatches, state.stats.second_checks)
    x = _gradient_like(300_000, 11 + rank)
    state.corrupt = OneFlip(1, "in_transit", int(torch.argmax(x.abs())), 30)
    try:
        out["ok"] = checksummed_all_reduce(x, state=state)
    except SdcDetected as exc:
        out["raised"] = exc.detection
    out["skip"] = state.consume_skip()
    out["stats"] = state.stats
    out["buffers"] = list(state._buffers)
    return out


@pytest.mark.parametrize("policy", ["skip", "raise"])
def test_standalone_without_an_intact_copy_passes_clean_data_and_catches_a_flip(policy: str) -> None:
    for r in run_group(_no_intact_worker, 2, policy, timeout_s=TIMEOUT_S):
        assert r["differs"] == 0 and r["clean"] == (0, 4)  # 4 cancellation reductions went to the exact tier
        assert r["buffers"] == []  # no copy of the input was ever made
        if policy == "skip":
            assert r["ok"] is False and r["skip"] and r["stats"].skipped_steps == 1
        else:
            assert r["raised"].action == "raise" and r["raised"].site_hint == "unknown" and r["stats"].raised == 1
