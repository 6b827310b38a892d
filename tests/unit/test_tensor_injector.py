"""injectors.tensor (in-job tensor faults) and chaos.injob.pfi (the pytorchfi adapter and its measured quirks)."""

from __future__ import annotations

import logging
import math
import random
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from pytorchfi import core  # type: ignore[import-untyped]
from torch import nn

from chaos import strategies as cs
from chaos.injob.bitflip import SUPPORTED, Flip, bit_class, flip_bits, flipped_value
from chaos.injob.pfi import pfi_injector, pfi_layers, pfi_neuron_flip, pfi_weight_flip
from chaos.injob.tensor_faults import ArmedFault, TensorFaultError, arm
from injectors.tensor import BitFlipParams


def raw(t: torch.Tensor) -> bytes:
    return bytes(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy())


def mlp(dtype: torch.dtype = torch.float32, seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16)).to(dtype)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, dtype: torch.dtype = torch.float32) -> None:
    """One forward/backward/step; leaves gradients in place (no zero_grad after)."""
    optimizer.zero_grad()
    model(torch.ones(2, 8, dtype=dtype)).float().pow(2).mean().backward()
    optimizer.step()


def snapshot(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, bytes]:
    """Raw bytes of every parameter, gradient and optimizer-state tensor."""
    out: dict[str, bytes] = {}
    for name, p in model.named_parameters():
        out[name] = raw(p)
        if p.grad is not None:
            out[name + ".grad"] = raw(p.grad)
        if optimizer is not None:
            for key, value in optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    out[f"{name}.state.{key}"] = raw(value)
    return out


def grad(model: nn.Module, name: str) -> torch.Tensor:
    value = model.get_parameter(name).grad
    assert value is not None
    return value


def capture(module: nn.Module) -> list[torch.Tensor]:
    """Record the output of ``module`` as later hooks see it (after the fault's hook ran)."""
    seen: list[torch.Tensor] = []
    module.register_forward_hook(lambda _m, _i, out: seen.append(out.detach().clone()))
    return seen


# -- params ------------------------------------------------------------------------------------------------------


def test_params_defaults_and_phase_follow_where() -> None:
    assert BitFlipParams().phase == "forward"
    assert BitFlipParams(where="gradients").phase == "backward"
    assert BitFlipParams.model_validate({"where": "optimizer_state"}).phase == "optimizer_step"
    assert BitFlipParams(where="gradients", phase="optimizer_step").phase == "optimizer_step"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"wher": "weights"}, "Extra inputs"),
        ({"where": "activations", "phase": "backward"}, "phase must be forward"),
        ({"where": "gradients", "phase": "forward"}, "gradients do not exist"),
        ({"kind": "nan", "bit": 3}, "bit applies to kind=bitflip"),
        ({"bit": 32}, "bit must be in 0..31"),
        ({"bit": "exponents"}, "bit"),
        ({"steps": 3}, "transient fault fires once"),
        ({"probability": 1.5}, "probability"),
        ({"element": 1, "bit": 4, "count": 2}, "distinct bits"),
        ({"kind": "inf", "element": 1, "count": 2}, "count must be 1"),
        ({"state": "exp_avg"}, "needs where: optimizer_state, not where: weights"),
        ({"where": "gradients", "state": "exp_avg"}, "needs where: optimizer_state"),
        ({"where": "optimizer_state", "state": "step"}, "step counter"),
        ({"where": "optimizer_state", "state": ""}, "at least 1 character"),
    ],
)
def test_params_reject_nonsense(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        BitFlipParams.model_validate(fields)


@given(cs.bitflip_params())
def test_strategy_params_are_valid_and_round_trip(params: BitFlipParams) -> None:
    assert BitFlipParams.model_validate(params.model_dump()) == params


# -- weights ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", SUPPORTED, ids=str)
def test_weight_flip_changes_one_bit_and_heal_restores_raw_bytes(dtype: torch.dtype) -> None:
    model = mlp(dtype)
    before = snapshot(model)
    params = BitFlipParams(layer="2.weight", element=37, bit="exponent")
    fault = arm(model, None, params, random.Random(1))
    records = fault.fire(1)
    assert records is not None and len(records) == 1
    assert records[0].indices == (37,)
    assert bit_class(dtype, int(records[0].detail.split("bit ")[1].split()[0])) == "exponent"
    after = snapshot(model)
    assert [k for k in before if before[k] != after[k]] == ["2.weight"]
    assert fault.fire(2) is None  # transient: once
    assert fault.expired(1) and fault.expired(2)
    assert "2.weight" in fault.describe() and "[37]" in fault.describe()
    fault.heal()
    assert snapshot(model) == before
    fault.heal()  # idempotent
    assert snapshot(model) == before and fault.fire(3) is None


def test_latent_weight_flip_fires_once_never_expires_and_heal_leaves_what_the_job_holds() -> None:
    """A memory upset nobody undoes: training keeps the corrupted value; only the job's own overwrite (a reload,
    a rollback) removes it, and heal must not write the stale original over that."""
    model = mlp()
    before = snapshot(model)
    fault = arm(model, None, BitFlipParams(layer="2.weight", element=3, bit=25, persistence="latent"), random.Random(0))
    assert fault.fire(1) is not None and fault.fire(2) is None  # once
    corrupted = snapshot(model)
    assert corrupted["2.weight"] != before["2.weight"]
    assert not fault.expired(1) and not fault.expired(10**6)  # the agent never heals it at a step's end
    fault.heal()
    assert snapshot(model) == corrupted  # heal left it
    assert fault.expired(1) and "latent" in fault.describe() and "never undone" in fault.describe_heal()
    with torch.no_grad():  # the job's reload: heal afterwards must leave the reloaded value alone too
        model.get_parameter("2.weight").view(-1)[3] = 0.5
    fault.heal()
    assert float(model.get_parameter("2.weight").detach().view(-1)[3]) == 0.5


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"persistence": "latent", "steps": 3}, "fires once"),
        ({"persistence": "latent", "where": "gradients"}, "recomputed every step"),
        ({"persistence": "latent", "where": "activations"}, "recomputed every step"),
    ],
)
def test_latent_is_refused_where_it_means_nothing(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        BitFlipParams(**fields)


def test_stuck_weight_is_forced_back_every_step_then_healed_exactly() -> None:
    """Nobody updates the weight (a frozen or served model): the same corrupted value at every fire, never
    toggled back or compounded, and heal writes back the exact original bytes."""
    model = mlp()
    before = snapshot(model)
    fault = arm(
        model, None, BitFlipParams(layer="0.weight", element=5, bit=30, persistence="stuck", steps=3), random.Random(0)
    )
    corrupted: list[bytes] = []
    for step in range(10, 15):
        fired = fault.fire(step)
        assert (fired is not None) == (step < 13)
        assert fault.expired(step) == (step >= 12)
        corrupted.append(raw(model.get_parameter("0.weight").view(-1)[5]))
        with torch.no_grad():
            model(torch.ones(2, 8))
    assert corrupted[0] == corrupted[1] == corrupted[2]  # stuck at one value, not toggled or compounded
    assert corrupted[0] != before["0.weight"][20:24]
    fault.heal()
    assert snapshot(model) == before
    assert fault.healing is not None and fault.healing.restored == (5,)


def test_stuck_weight_under_training_reapplies_the_flip_to_the_updated_value() -> None:
    """Under SGD each fire first removes the previous application (keeping the update, as heal does), then flips
    the same bit again: the element always shows exactly that bit flipped relative to what it was undone to."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fault = arm(
        model, opt, BitFlipParams(layer="2.bias", element=3, bit=4, persistence="stuck", steps=3), random.Random(0)
    )
    shown: list[tuple[bytes, bytes]] = []
    for step in range(3):
        fault.fire(step)
        record = fault.records[-1].record
        now = raw(model.get_parameter("2.bias")[3])
        shown.append((record.original, now))
        train_step(model, opt)
    for original, now in shown:
        flipped = torch.frombuffer(bytearray(original), dtype=torch.float32).clone()
        flip_bits(flipped, [Flip(0, 4)])
        assert raw(flipped) == now  # one bit off the undone value: never toggled back, never compounded
    assert len({original for original, _ in shown}) == 3  # the updates were kept underneath
    fault.heal()
    assert fault.healing is not None and fault.healing.delta_removed == (3,)


@pytest.mark.parametrize(("kind", "check"), [("nan", math.isnan), ("inf", math.isinf)])
def test_nan_and_inf_in_weights(kind: str, check: Any) -> None:
    model = mlp()
    before = snapshot(model)
    fault = arm(model, None, BitFlipParams(layer="2.bias", kind=kind, count=3), random.Random(4))
    (record,) = fault.fire(0) or []
    assert len(record.indices) == 3
    assert all(check(model.get_parameter("2.bias")[i].item()) for i in record.indices)
    fault.heal()
    assert snapshot(model) == before


def test_block_scale_32_consecutive_times_1e7() -> None:
    model = mlp()
    before = model.get_parameter("0.weight").detach().clone().view(-1)
    fault = arm(model, None, BitFlipParams(layer="0.weight", kind="scale", element=64), random.Random(0))
    (record,) = fault.fire(0) or []
    assert record.indices == tuple(range(64, 96))
    ratio = model.get_parameter("0.weight").detach().view(-1)[64:96] / before[64:96]
    assert torch.allclose(ratio, torch.full((32,), 1e7), rtol=1e-5)
    fault.heal()
    assert raw(model.get_parameter("0.weight")) == raw(before.view(16, 8))


def test_intermittent_is_seeded_and_follows_probability() -> None:
    def fired_steps(seed: int, p: float) -> list[int]:
        fault = arm(mlp(), None, BitFlipParams(persistence="intermittent", probability=p, seed=seed), random.Random())
        return [s for s in range(200) if fault.fire(s) is not None]

    assert fired_steps(1, 0.3) == fired_steps(1, 0.3)
    assert fired_steps(1, 0.3) != fired_steps(2, 0.3)
    assert 30 < len(fired_steps(1, 0.3)) < 90
    assert fired_steps(1, 0.0) == [] and len(fired_steps(1, 1.0)) == 200


def test_choice_is_weighted_by_size_and_errors_are_clear() -> None:
    model = mlp()
    hits = {arm(model, None, BitFlipParams(), random.Random(s)).target for s in range(200)}
    assert "0.weight" in hits and "2.weight" in hits
    with pytest.raises(TensorFaultError, match=r"did you mean 2\.weight"):
        arm(model, None, BitFlipParams(layer="2.weigth"), random.Random(0))
    with pytest.raises(TensorFaultError, match="bit 20 is outside"):
        arm(mlp(torch.bfloat16), None, BitFlipParams(bit=20), random.Random(0))
    with pytest.raises(TensorFaultError, match="needs the optimizer"):
        arm(model, None, BitFlipParams(where="optimizer_state"), random.Random(0))


# -- activations ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("persistence", ["transient", "stuck"])
def test_activation_hook_flips_at_firing_steps_only(persistence: str) -> None:
    model = mlp()
    x = torch.randn(2, 8)
    clean = model[0](x).detach()
    fault = arm(
        model,
        None,
        BitFlipParams(where="activations", layer="0", element=9, bit=31, persistence=persistence),
        random.Random(0),
    )
    seen = capture(model[0])
    for step in range(1, 5):
        assert fault.fire(step) == ([] if persistence == "stuck" or step == 1 else None)
        model(x)
        model(torch.randn(3, 8))  # a forward without a fire (e.g. evaluation) is never corrupted
    flipped = [bool((out != clean).any()) for out in seen[0::2]]
    assert flipped == ([True] * 4 if persistence == "stuck" else [True, False, False, False])
    assert all(out.view(-1)[9] == -clean.view(-1)[9] for out, f in zip(seen[0::2], flipped, strict=True) if f)
    assert [c.step for c in fault.records] == ([1, 2, 3, 4] if persistence == "stuck" else [1])
    fault.heal()
    fault.fire(5)
    model(x)
    assert torch.equal(seen[-1], clean)  # hook removed


def test_activation_with_grad_backpropagates_the_corrupted_value() -> None:
    model = mlp()
    fault = arm(model, None, BitFlipParams(where="activations", layer="1", element=0, kind="nan"), random.Random(0))
    fault.fire(1)
    model(torch.ones(2, 8)).sum().backward()  # a NaN in a ReLU output that autograd saved: no version error
    assert bool(grad(model, "2.weight").isnan().any())
    fault.heal()


# -- gradients and optimizer state -----------------------------------------------------------------------------


def test_gradient_flip_and_exact_heal() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fault = arm(model, opt, BitFlipParams(where="gradients", layer="0.*", bit="sign", count=4), random.Random(0))
    with pytest.raises(TensorFaultError, match="no gradient"):
        fault.fire(0)
    model(torch.ones(2, 8)).pow(2).mean().backward()
    before = snapshot(model, opt)
    (record,) = fault.fire(1) or []
    after = snapshot(model, opt)
    assert [k for k in before if before[k] != after[k]] == [fault.target + ".grad"]
    fault.heal()
    assert snapshot(model, opt) == before


def test_stuck_gradient_never_writes_stale_bytes_into_fresh_gradients() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    fault = arm(
        model,
        opt,
        BitFlipParams(where="gradients", layer="2.bias", element=3, bit=31, persistence="stuck"),
        random.Random(0),
    )
    for step in range(3):
        opt.zero_grad()
        model(torch.full((2, 8), float(step))).pow(2).mean().backward()
        clean = grad(model, "2.bias").clone()
        fault.fire(step)
        assert grad(model, "2.bias")[3] == -clean[3]
    opt.zero_grad()
    model(torch.ones(2, 8)).pow(2).mean().backward()
    fresh = snapshot(model)
    fault.heal()  # the last flipped gradient is gone: heal must leave the new one alone
    assert snapshot(model) == fresh


@pytest.mark.parametrize(
    "make_opt", [lambda p: torch.optim.Adam(p, lr=1e-3), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)]
)
def test_optimizer_state_flip_and_exact_heal(make_opt: Any) -> None:
    model = mlp()
    opt = make_opt(model.parameters())
    fault = arm(model, opt, BitFlipParams(where="optimizer_state", layer="0.weight", bit="exponent"), random.Random(2))
    with pytest.raises(TensorFaultError, match="no float tensor yet"):
        fault.fire(0)
    train_step(model, opt)
    before = snapshot(model, opt)
    events: list[tuple[str, dict[str, Any]]] = []
    fault = arm(
        model,
        opt,
        BitFlipParams(where="optimizer_state", layer="0.weight", bit="exponent"),
        random.Random(2),
        emit=lambda kind, **data: events.append((kind, data)),
        rank=3,
    )
    fault.fire(1)
    after = snapshot(model, opt)
    changed = [k for k in before if before[k] != after[k]]
    assert len(changed) == 1 and changed[0].startswith("0.weight.state.") and not changed[0].endswith(".step")
    assert events and events[0][0] == "fault.tensor" and events[0][1]["rank"] == 3
    assert events[0][1]["where"] == "optimizer_state" and events[0][1]["step"] == 1
    fault.heal()
    assert snapshot(model, opt) == before


def test_state_names_the_optimizer_tensor_hit() -> None:
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_step(model, opt)
    before = snapshot(model, opt)
    params = BitFlipParams(where="optimizer_state", layer="0.weight", state="exp_avg_sq", bit="exponent", count=4)
    fault = arm(model, opt, params, random.Random(0))
    assert fault.state_key is None  # known from the first fire (the state may not exist before)
    fault.fire(1)
    after = snapshot(model, opt)
    assert [k for k in before if before[k] != after[k]] == ["0.weight.state.exp_avg_sq"]
    assert fault.state_key == "exp_avg_sq" and "optimizer_state[exp_avg_sq] of 0.weight" in fault.describe()
    fault.heal()
    assert snapshot(model, opt) == before
    assert "optimizer_state[exp_avg_sq]" in fault.describe_heal()


def test_a_missing_state_key_fails_with_the_available_keys() -> None:
    model = mlp()
    adam = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_step(model, adam)
    before = snapshot(model, adam)
    fault = arm(model, adam, BitFlipParams(where="optimizer_state", layer="2.bias", state="nope"), random.Random(0))
    with pytest.raises(TensorFaultError, match=r"has no 'nope': available exp_avg, exp_avg_sq \(.*: step\)"):
        fault.fire(1)
    assert snapshot(model, adam) == before and fault.fired == 0
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_step(model, sgd)
    with pytest.raises(TensorFaultError, match="available momentum_buffer"):
        arm(model, sgd, BitFlipParams(where="optimizer_state", state="exp_avg"), random.Random(0)).fire(1)
    momentum = arm(model, sgd, BitFlipParams(where="optimizer_state", state="momentum_buffer"), random.Random(0))
    momentum.fire(1)
    assert momentum.state_key == "momentum_buffer"
    momentum.heal()


def test_without_state_the_seeded_choice_is_stated_and_naming_it_changes_nothing() -> None:
    def fire(seed: int, state: str | None) -> tuple[str | None, tuple[int, ...], str]:
        model = mlp()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        train_step(model, opt)
        params = BitFlipParams(where="optimizer_state", layer="0.weight", state=state)
        events: list[dict[str, Any]] = []
        fault = arm(model, opt, params, random.Random(seed), emit=lambda _kind, **data: events.append(data))
        fault.fire(1)
        assert events[0]["state"] == fault.state_key
        return fault.state_key, fault.records[0].record.indices, fault.describe()

    drawn = {seed: fire(seed, None) for seed in range(12)}
    assert {key for key, _i, _d in drawn.values()} == {"exp_avg", "exp_avg_sq"}  # both happen: a real draw
    for seed, (key, indices, line) in drawn.items():
        assert fire(seed, None) == (key, indices, line)  # deterministic
        assert f"[{key}]" in line
        assert fire(seed, key)[:2] == (key, indices)  # naming the drawn key hits the same elements


# -- the acceptance property: heal restores every flipped bit, whatever the fault -----------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(params=cs.bitflip_params(latent=False), dtype=cs.dtypes(), seed=st.integers(0, 2**32))
def test_heal_restores_raw_bytes_for_any_fault(params: BitFlipParams, dtype: torch.dtype, seed: int) -> None:
    model = mlp(dtype)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_step(model, opt, dtype)  # gradients and optimizer state exist
    x = torch.ones(2, 8, dtype=dtype)
    with torch.no_grad():
        clean_out = raw(model(x))
    before = snapshot(model, opt)
    fault: ArmedFault = arm(model, opt, params, random.Random(seed))
    for step in range(3):
        fault.fire(step)
        with torch.no_grad():
            model(x)
    fault.heal()
    assert snapshot(model, opt) == before
    with torch.no_grad():
        assert raw(model(x)) == clean_out


# -- pytorchfi adapter ----------------------------------------------------------------------------------------


def cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3), nn.Flatten(), nn.Linear(4 * 4 * 4, 5)
    )


LAYER_WEIGHTS = {"0": 4 * 3 * 3 * 3, "3": 4 * 4 * 3 * 3, "5": 5 * 64}
LAYER_OUTPUTS = {"0": 2 * 4 * 6 * 6, "3": 2 * 4 * 4 * 4, "5": 2 * 5}


def test_pfi_layer_numbering() -> None:
    assert pfi_layers(cnn()) == ["0", "3", "5"]


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_pfi_weight_flip_matches_our_in_place_flip(data: st.DataObject) -> None:
    layer = data.draw(st.sampled_from(sorted(LAYER_WEIGHTS)))
    index = data.draw(st.integers(0, LAYER_WEIGHTS[layer] - 1))
    bit = data.draw(st.integers(0, 31))
    model = cnn().eval()
    original = raw(model.get_parameter(f"{layer}.weight"))
    corrupted = pfi_weight_flip(model, [3, 8, 8], layer, index, bit)
    assert corrupted is not model and raw(model.get_parameter(f"{layer}.weight")) == original  # a deep copy
    fault = arm(model, None, BitFlipParams(layer=f"{layer}.weight", element=index, bit=bit), random.Random(0))
    fault.fire(0)
    ours = model.get_parameter(f"{layer}.weight").detach().view(-1)[index]
    theirs = corrupted.get_parameter(f"{layer}.weight").detach().reshape(-1)[index]
    assert raw(ours) == raw(theirs) or bool(ours.isnan() and theirs.isnan())  # sNaN comes back quiet via float
    fault.heal()
    assert raw(model.get_parameter(f"{layer}.weight")) == original


@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_pfi_neuron_flip_matches_our_activation_fault_on_every_forward(data: st.DataObject) -> None:
    layer = data.draw(st.sampled_from(sorted(LAYER_OUTPUTS)))
    index = data.draw(st.integers(0, LAYER_OUTPUTS[layer] - 1))
    bit = data.draw(st.sampled_from([31, 30, 29, 22, 0]))
    model = cnn().eval()
    x = torch.randn(2, 3, 8, 8)
    corrupted = pfi_neuron_flip(model, [3, 8, 8], layer, index, bit, batch_size=2).eval()
    params = BitFlipParams(where="activations", layer=layer, element=index, bit=bit, persistence="stuck")
    fault = arm(model, None, params, random.Random(0))
    with torch.no_grad():
        for step in range(3):  # pytorchfi alone breaks on the second forward; the adapter resets its counter
            fault.fire(step)
            ours, theirs = model(x), corrupted(x)
            assert torch.equal(ours, theirs) or bool(torch.isnan(ours).any() and torch.isnan(theirs).any())
    fault.heal()


def test_pytorchfi_quirks_as_measured() -> None:
    """What pytorchfi 0.6.0 actually does (documented in chaos/injob/pfi.py); the adapter avoids each."""
    model = cnn()  # train mode, as in a training loop
    x = torch.randn(2, 3, 8, 8)
    running_mean = model.get_buffer("1.running_mean").clone()
    rng = torch.random.get_rng_state()
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers.clear()  # pytest configures the root logger; a plain script does not
    try:
        fi = core.fault_injection(model, 2, input_shape=[3, 8, 8], layer_types=[nn.Conv2d, nn.Linear])
        formats = [getattr(h.formatter, "_fmt", "") for h in root.handlers]
    finally:
        root.handlers[:] = saved
    # 1. Its profiling forward runs on the ORIGINAL model: BatchNorm stats move, the global RNG advances,
    #    and logging.basicConfig installs a format that needs fields no ordinary record has.
    assert not torch.equal(running_mean, model.get_buffer("1.running_mean"))
    assert not torch.equal(rng, torch.random.get_rng_state())
    assert any("%(clientip)s" in f for f in formats)
    # 2. Every declare deep-copies the model.
    model.eval()  # the copies inherit it, so outputs below are deterministic
    with torch.no_grad():
        clean = model(x)
        by_value = fi.declare_neuron_fi(batch=[0], layer_num=[0], dim1=[0], dim2=[0], dim3=[0], value=[1e6])
        assert by_value is not model and by_value[0].weight is not model.get_parameter("0.weight")
        by_value(x)
        # 3. The layer counter is never reset: the second forward indexes past the layer table.
        with pytest.raises(IndexError):
            by_value(x)

        def update_only(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
            if fi.get_current_layer() == 0:
                output[0, 0, 0, 0] = 1e6
            fi.updateLayer()

        by_function = fi.declare_neuron_fi(batch=[0], layer_num=[0], dim1=[0], dim2=[0], dim3=[0], function=update_only)
        first, second = by_function(x), by_function(x)
        # 4. With a custom function the second forward silently injects nothing.
        assert not torch.equal(first, clean) and torch.equal(second, clean)
    # The adapter: no side effects on the original, and it injects on every forward.
    model.train()
    running_mean = model.get_buffer("1.running_mean").clone()
    rng = torch.random.get_rng_state()
    corrupted = pfi_neuron_flip(model, [3, 8, 8], "0", 0, 30, batch_size=2).eval()
    assert torch.equal(running_mean, model.get_buffer("1.running_mean")) and torch.equal(
        rng, torch.random.get_rng_state()
    )
    assert model.training and model[1].training
    with torch.no_grad():
        a, b = corrupted(x), corrupted(x)
    assert torch.equal(a, b) and not torch.equal(a, clean)


def test_flipped_value_agrees_with_the_adapter_error_function() -> None:
    model = cnn().eval()
    corrupted = pfi_weight_flip(model, [3, 8, 8], "5", 17, 31)
    value = float(model.get_parameter("5.weight").detach().view(-1)[17])
    assert (
        float(corrupted.get_parameter("5.weight").detach().view(-1)[17])
        == flipped_value(value, torch.float32, 31)
        == -value
    )


class Swapped(nn.Module):
    """Defined in one order, run in the other: pytorchfi's two layer numberings disagree here."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.second = nn.Linear(6, 3)
        self.first = nn.Linear(4, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.second(torch.relu(self.first(x)))
        return out


def test_pfi_numbers_weights_by_definition_and_neurons_by_execution() -> None:
    model = Swapped()
    fi = pfi_injector(model, [4], 1)
    assert fi.get_weights_size(0) == model.second.weight.shape  # weight layer 0: defined first
    assert fi.get_layer_shape(0) == [1, 6]  # neuron layer 0: runs first (model.first's output)
    x = torch.randn(2, 4)
    for layer, index in (("second", 5), ("first", 11)):
        corrupted = pfi_neuron_flip(model, [4], layer, index, 31, batch_size=2)
        fault = arm(
            model, None, BitFlipParams(where="activations", layer=layer, element=index, bit=31), random.Random(0)
        )
        fault.fire(0)
        with torch.no_grad():
            assert torch.equal(model(x), corrupted(x))
        fault.heal()
        weight_copy = pfi_weight_flip(model, [4], layer, 2, 31)
        fault = arm(model, None, BitFlipParams(layer=f"{layer}.weight", element=2, bit=31), random.Random(0))
        fault.fire(0)
        assert torch.equal(model.get_parameter(f"{layer}.weight"), weight_copy.get_parameter(f"{layer}.weight"))
        fault.heal()
