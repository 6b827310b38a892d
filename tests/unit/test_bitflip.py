"""chaos.injob.bitflip: exact IEEE-754 flips, value writes and block scaling, and byte-exact restore."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos import strategies as cs
from chaos.injob.bitflip import (
    BIT_CLASSES,
    SUPPORTED,
    Flip,
    bit_class,
    bit_layout,
    bits_in_class,
    choose_flips,
    element_bytes,
    flip_bits,
    flipped_value,
    restore,
    scale_block,
    set_values,
    undo_change,
)

DTYPES = pytest.mark.parametrize("dtype", SUPPORTED, ids=str)
INT = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}


def raw(t: torch.Tensor) -> bytes:
    """The tensor's raw bytes in logical order (the acceptance criterion compares exactly these)."""
    return bytes(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy())


def awkward(dtype: torch.dtype) -> torch.Tensor:
    """Ordinary values plus every special: ±0, subnormals, ±max, ±Inf and a NaN with a payload."""
    values = torch.randn(48, generator=torch.Generator().manual_seed(7)).to(dtype)
    info = torch.finfo(dtype)
    special = torch.tensor(
        [0.0, -0.0, info.tiny, -info.tiny, info.tiny / 4, info.max, -info.max, math.inf, -math.inf, 1.0, -1.0],
        dtype=torch.float32,
    ).to(dtype)
    payload_nan = torch.tensor([-1], dtype=INT[dtype]).view(dtype)  # all ones: a NaN with a full payload
    return torch.cat([values, special, payload_nan])


# -- layouts and classes ---------------------------------------------------------------------------------------


def test_layouts_follow_ieee() -> None:
    assert bit_layout(torch.float32) == (32, 8, 23)
    assert bit_layout(torch.bfloat16) == (16, 8, 7)
    assert bit_layout(torch.float16) == (16, 5, 10)
    for bad in (torch.float64, torch.int32, torch.uint8):
        with pytest.raises(ValueError, match="unsupported dtype"):
            bit_layout(bad)


@DTYPES
def test_classes_partition_all_bits(dtype: torch.dtype) -> None:
    total = bit_layout(dtype)[0]
    seen = [b for cls in BIT_CLASSES for b in bits_in_class(dtype, cls)]
    assert sorted(seen) == list(range(total))
    assert bits_in_class(dtype, "sign") == [total - 1]
    for cls in BIT_CLASSES:
        assert all(bit_class(dtype, b) == cls for b in bits_in_class(dtype, cls))
    with pytest.raises(ValueError):
        bit_class(dtype, total)
    with pytest.raises(ValueError):
        bit_class(dtype, -1)


# -- flip and restore --------------------------------------------------------------------------------------------


@DTYPES
def test_every_bit_flips_exactly_one_bit_and_restores_byte_identical(dtype: torch.dtype) -> None:
    t = awkward(dtype)
    before = raw(t)
    ints_before = t.view(INT[dtype]).clone()
    for bit in range(bit_layout(dtype)[0]):
        record = flip_bits(t, [Flip(i, bit) for i in range(t.numel())])
        diff = t.view(INT[dtype]) ^ ints_before
        expected = (1 << bit) - (1 << bit_layout(dtype)[0]) * (bit == bit_layout(dtype)[0] - 1)
        assert bool((diff == expected).all()), f"bit {bit} changed other bits"
        restore(t, record)
        assert raw(t) == before, f"bit {bit} did not restore exactly"


@DTYPES
def test_sign_bit_negates_and_top_exponent_bit_is_ieee(dtype: torch.dtype) -> None:
    total, _exponent, mantissa = bit_layout(dtype)
    sign, top = total - 1, total - 2
    for x in (1.0, -3.5, 0.0, 1e-3, math.inf):
        assert math.copysign(1.0, flipped_value(x, dtype, sign)) == -math.copysign(1.0, x)
        assert abs(flipped_value(x, dtype, sign)) == abs(torch.tensor(x, dtype=dtype).item())
    # 1.0 has the exponent 0111…1; flipping its top bit gives 1111…1 with a zero mantissa: +Inf.
    assert flipped_value(1.0, dtype, top) == math.inf
    # 0.5 has the exponent 0111…10; flipping the top bit gives the largest finite power of two.
    assert flipped_value(0.5, dtype, top) == 2.0 ** (2 ** (total - 1 - mantissa - 1) - 1)
    # 2.0 has the exponent 100…0; flipping the top bit gives exactly zero.
    assert flipped_value(2.0, dtype, top) == 0.0
    # The mantissa's lowest bit of 1.0 is one ulp.
    assert flipped_value(1.0, dtype, 0) == 1.0 + 2.0**-mantissa


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_flip_restore_roundtrip_property(data: st.DataObject) -> None:
    dtype = data.draw(cs.dtypes())
    t = data.draw(cs.float_tensors(dtype, (6, 5), allow_nan=True, allow_infinity=True))
    flips = data.draw(cs.flips(t.numel(), dtype, max_size=6))
    before = raw(t)
    record = flip_bits(t, flips)
    assert raw(t) != before
    assert record.indices == tuple(sorted({f.index for f in flips}))
    restore(t, record)
    assert raw(t) == before
    restore(t, record)  # idempotent
    assert raw(t) == before


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_scalar_and_vector_paths_agree(data: st.DataObject) -> None:
    """Few flips on a contiguous CPU tensor go element by element; others through index tensors: same result."""
    dtype = data.draw(cs.dtypes())
    t = data.draw(cs.float_tensors(dtype, (4, 5), allow_nan=True, allow_infinity=True))
    strided = t.t().contiguous().t()  # the same logical values, non-contiguous: always the vector path
    flips = data.draw(cs.flips(t.numel(), dtype, min_size=1, max_size=12))
    a, b = flip_bits(t, flips), flip_bits(strided, flips)
    assert a == b and raw(t) == raw(strided)
    assert element_bytes(t, a.indices) == element_bytes(strided, a.indices)
    restore(t, a)
    restore(strided, b)
    assert raw(t) == raw(strided)


@settings(max_examples=40, deadline=None)
@given(dtype=st.sampled_from([torch.bfloat16, torch.float16]), x=st.floats(-1e4, 1e4, width=16), bit=st.integers(0, 15))
def test_flipped_value_is_one_bit_of_the_rounded_value(dtype: torch.dtype, x: float, bit: int) -> None:
    rounded = torch.tensor([x], dtype=dtype)
    expected = rounded.view(INT[dtype]) ^ torch.tensor([(1 << bit) - (1 << 16) * (bit == 15)], dtype=INT[dtype])
    result = torch.tensor([flipped_value(x, dtype, bit)], dtype=dtype)
    # Through a Python float only a signalling NaN can change (it comes back quiet); everything else is exact.
    assert torch.equal(result.view(INT[dtype]), expected) or bool(result.isnan().all())


def test_repeated_flips_of_one_element_combine_like_xor() -> None:
    t = torch.ones(4)
    before = raw(t)
    flip_bits(t, [Flip(1, 3), Flip(1, 3)])
    assert raw(t) == before  # the same bit twice cancels
    record = flip_bits(t, [Flip(1, 31), Flip(1, 0)])
    assert record.indices == (1,)
    assert t[1].item() == -(1.0 + 2.0**-23)
    restore(t, record)
    assert raw(t) == before


def test_non_contiguous_views_write_the_logical_element_of_the_base() -> None:
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    view = base.t()  # logical element 1 of the view is base[1, 0] = 4.0
    before = raw(base)
    record = flip_bits(view, [Flip(1, 31)])
    assert base[1, 0].item() == -4.0
    assert element_bytes(view, [1]) == raw(torch.tensor([-4.0]))
    restore(view, record)
    assert raw(base) == before
    sliced = base[:, 1::2]
    flip_bits(sliced, [Flip(3, 31)])  # row 1, second kept column: base[1, 3] = 7.0
    assert base[1, 3].item() == -7.0
    with pytest.raises(ValueError, match="overlapping memory"):
        flip_bits(torch.ones(1).expand(5), [Flip(0, 3)])


def test_parameters_flip_in_place_without_breaking_autograd() -> None:
    layer = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)
    out = layer(x)
    before = raw(layer.weight)
    record = flip_bits(layer.weight, [Flip(2, 30)])
    out.sum().backward()  # the weight was saved for backward; a hardware flip does not make that raise
    assert raw(layer.weight) != before and layer.weight.requires_grad
    restore(layer.weight, record)
    assert raw(layer.weight) == before
    scalar = torch.tensor(2.0)
    flip_bits(scalar, [Flip(0, 31)])
    assert scalar.item() == -2.0


def test_restore_refuses_a_record_for_another_tensor() -> None:
    record = flip_bits(torch.ones(4), [Flip(3, 1)])
    with pytest.raises(ValueError, match="record is for"):
        restore(torch.ones(4, dtype=torch.float16), record)
    with pytest.raises(ValueError, match="out of range"):
        restore(torch.ones(2), record)


# -- NaN / Inf / scale -----------------------------------------------------------------------------------------


@DTYPES
def test_set_values_writes_nan_and_inf_and_restores(dtype: torch.dtype) -> None:
    t = awkward(dtype)
    before = raw(t)
    nan = set_values(t, [0, 5, 5], math.nan)
    assert nan.indices == (0, 5) and nan.kind == "set"
    assert bool(t[[0, 5]].isnan().all())
    inf = set_values(t, [7], -math.inf)
    assert t[7].item() == -math.inf
    restore(t, inf)
    restore(t, nan)
    assert raw(t) == before


@DTYPES
def test_scale_block_32_consecutive_by_1e7(dtype: torch.dtype) -> None:
    t = torch.full((100,), 0.5, dtype=dtype)
    before = raw(t)
    record = scale_block(t, 40, 32, 1e7)
    assert record.indices == tuple(range(40, 72))
    scaled = t[40:72].float()
    if dtype == torch.float16:
        assert bool(torch.isinf(scaled).all())  # 5e6 overflows float16 (max 65504), as on real hardware
    else:
        assert torch.allclose(scaled, torch.full((32,), 5e6), rtol=1e-2)
    assert bool((t[:40] == 0.5).all()) and bool((t[72:] == 0.5).all())
    restore(t, record)
    assert raw(t) == before
    with pytest.raises(ValueError, match="does not fit"):
        scale_block(t, 90, 32, 1e7)


# -- undo: remove the change, keep what happened since -------------------------------------------------------


def ulp(x: float, dtype: torch.dtype) -> float:
    one = torch.tensor([x], dtype=dtype)
    return float(torch.nextafter(one, torch.tensor([math.inf], dtype=dtype)).item() - one.item())


@DTYPES
def test_undo_change_follows_its_decision_table(dtype: torch.dtype) -> None:
    """One element per row of undo_change's table; each row would be wrong under any other row's rule."""
    info = torch.finfo(dtype)
    t = torch.tensor([1.0, 1.0, info.max, 1.0, 1.0, 1.0, math.inf, 2.0], dtype=dtype)
    original = raw(t)
    record = flip_bits(t, [Flip(0, 0), Flip(1, 0), Flip(2, 0), Flip(3, 0), Flip(7, 0)])  # one ulp each
    record_set = set_values(t, [4, 5], math.nan)
    record_inf = flip_bits(t, [Flip(6, bit_layout(dtype)[2])])  # lowest exponent bit of +Inf: a finite value
    assert math.isfinite(t[6].item())
    # one record over all eight elements, as a stuck fault's application would hold it
    indices = list(range(8))
    merged = type(record)(tuple(indices), original, str(dtype), "bitflip", "test")
    written = element_bytes(t, indices)
    assert record_set.indices == (4, 5) and record_inf.indices == (6,)
    step = 0.25
    with torch.no_grad():
        # 0: untouched. 1: updated by a representable step. 2: updated so original + change overflows.
        t[1] -= step
        t[2] = torch.tensor(info.max, dtype=dtype)  # the corrupted max - ulp moved up one ulp
        t[3] = math.nan  # 3: the update went non-finite
        # 4: NaN stayed NaN (arithmetic carried it). 5: NaN replaced by a finite value (a repair/reload).
        t[5] = 0.5
        t[6] += 4 * ulp(t[6].item(), dtype)  # 6: original +Inf, corrupted finite, then updated
        t[7] = t[7] * 1.0  # 7: rewritten with its own bytes: indistinguishable from untouched
    result = undo_change(t, merged, written, keep_updates=True)
    assert result.restored == (0, 2, 4, 6, 7)
    assert result.delta_removed == (1,)
    assert result.kept == (3, 5)
    assert t[1].item() == 1.0 - step  # the fault's ulp removed, the update kept
    assert raw(t[[0, 2, 4, 6, 7]]) == raw(torch.tensor([1.0, info.max, 1.0, math.inf, 2.0], dtype=dtype))
    assert math.isnan(t[3].item()) and t[5].item() == 0.5
    assert "restored [0, 2, 4, 6, 7]" in result.summary() and "delta removed [1]" in result.summary()


def test_undo_change_without_updates_restores_only_untouched_elements() -> None:
    """The gradient rule: an element no longer holding the bytes written is a fresh value and is kept."""
    t = torch.tensor([1.0, 2.0, 3.0])
    record = flip_bits(t, [Flip(0, 31), Flip(1, 31), Flip(2, 31)])
    written = element_bytes(t, record.indices)
    t[1] = 9.0
    result = undo_change(t, record, written, keep_updates=False)
    assert (result.restored, result.delta_removed, result.kept) == ((0, 2), (), (1,))
    assert t.tolist() == [1.0, 9.0, 3.0]


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_undo_change_scalar_and_vector_paths_agree(data: st.DataObject) -> None:
    dtype = data.draw(cs.dtypes())
    t = data.draw(cs.float_tensors(dtype, (4, 5), allow_nan=True, allow_infinity=True))
    strided = t.t().contiguous().t()  # same logical values, non-contiguous: the vector path
    flips = data.draw(cs.flips(t.numel(), dtype, min_size=1, max_size=12))
    delta = data.draw(cs.float_tensors(dtype, (4, 5), allow_nan=False, allow_infinity=False))
    results = []
    for tensor in (t, strided):
        record = flip_bits(tensor, flips)
        written = element_bytes(tensor, record.indices)
        with torch.no_grad():
            tensor.add_(delta * 0.001)
        results.append((undo_change(tensor, record, written, keep_updates=True), raw(tensor)))
    assert results[0] == results[1]


def test_undo_change_refuses_inconsistent_input() -> None:
    t = torch.ones(4)
    record = flip_bits(t, [Flip(1, 3)])
    written = element_bytes(t, record.indices)
    with pytest.raises(ValueError, match="record is for"):
        undo_change(torch.ones(4, dtype=torch.float16), record, written, keep_updates=True)
    with pytest.raises(ValueError, match="byte lengths"):
        undo_change(t, record, written + b"\0", keep_updates=True)
    with pytest.raises(ValueError, match="out of range"):
        undo_change(torch.ones(1), record, written, keep_updates=True)


# -- choosing ----------------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    dtype=cs.dtypes(),
    seed=st.integers(0, 2**32),
    numel=st.integers(1, 5000),
    count=st.integers(1, 8),
    bit=st.none() | cs.bit_classes() | st.integers(0, 15),
)
def test_choose_flips_is_seeded_and_respects_its_arguments(
    dtype: torch.dtype, seed: int, numel: int, count: int, bit: int | str | None
) -> None:
    count = min(count, numel)
    a = choose_flips(numel, dtype, random.Random(seed), bit=bit, count=count)  # type: ignore[arg-type]
    b = choose_flips(numel, dtype, random.Random(seed), bit=bit, count=count)  # type: ignore[arg-type]
    assert a == b
    assert len(a) == count and len({f.index for f in a}) == count
    assert all(0 <= f.index < numel for f in a)
    for flip in a:
        if isinstance(bit, int):
            assert flip.bit == bit
        elif bit is not None:
            assert bit_class(dtype, flip.bit) == bit


@DTYPES
def test_choose_flips_element_min_magnitude_and_errors(dtype: torch.dtype) -> None:
    rng = random.Random(3)
    multi = choose_flips(10, dtype, rng, element=4, bit="exponent", count=3)
    assert [f.index for f in multi] == [4, 4, 4] and len({f.bit for f in multi}) == 3
    values = torch.zeros(1000, dtype=dtype)
    big = [3, 77, 500, 999]
    values[big] = torch.tensor([5.0, -6.0, 7.0, math.nan], dtype=dtype)  # NaN never qualifies
    for _ in range(20):
        chosen = choose_flips(1000, dtype, rng, count=3, min_magnitude=1.0, values=values, bit="sign")
        assert {f.index for f in chosen} == {3, 77, 500}
    with pytest.raises(ValueError, match="only 3 of 1000"):
        choose_flips(1000, dtype, rng, count=4, min_magnitude=1.0, values=values)
    with pytest.raises(ValueError, match="needs the tensor's values"):
        choose_flips(1000, dtype, rng, min_magnitude=1.0)
    with pytest.raises(ValueError, match="outside"):
        choose_flips(10, dtype, rng, bit=bit_layout(dtype)[0])
    with pytest.raises(ValueError, match="out of range"):
        choose_flips(10, dtype, rng, element=10)
    with pytest.raises(ValueError, match="distinct elements"):
        choose_flips(3, dtype, rng, count=4)
    with pytest.raises(ValueError, match="distinct bits"):
        choose_flips(10, dtype, rng, element=1, bit="sign", count=2)
