"""Exact, in-place IEEE-754 corruption of tensors: bit flips, NaN/Inf/value writes and block scaling.

Pure tensor operations (torch only, nothing distributed), shared by the tensor and gradient injectors and
the SDC coverage campaign. Every operation returns a :class:`FlipRecord` holding the raw bytes of every
element it touched, and :func:`restore` writes those bytes back, so a heal is bit-exact (NaN payloads, -0.0
and subnormals included). When the tensor was updated in place after the change (an optimizer step on a
corrupted weight), :func:`undo_change` removes only the change and keeps the update.

Bits are numbered from 0 = least significant, IEEE style: for float32 bits 0-22 are the mantissa, 23-30 the
exponent and 31 the sign. Flips go through an integer view of the SAME storage (int32 for float32, int16 for
bfloat16/float16) and an XOR, never through a Python float, so no rounding or NaN canonicalisation can creep
in. Writes go through ``tensor.data``: a hardware upset does not bump autograd's version counter either, so
a corrupted activation that autograd saved for backward is used as-is instead of raising.

Element indices are flat indices in the tensor's logical row-major order (``tensor.reshape(-1)`` order),
which for a contiguous tensor is ``tensor.view(-1)``. Non-contiguous tensors (transposes, slices) are
supported: the index is mapped through the strides, and the write lands in the original storage.
Tensors with overlapping memory (``expand``, stride 0) are rejected, since one write would change several
logical elements.
"""

from __future__ import annotations

import ctypes
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch

BitClass = Literal["sign", "exponent", "mantissa"]
BIT_CLASSES: tuple[BitClass, ...] = get_args(BitClass)
SUPPORTED: tuple[torch.dtype, ...] = (torch.float32, torch.bfloat16, torch.float16)

# (total bits, exponent bits, mantissa bits); the sign is the one remaining bit.
_LAYOUT: dict[torch.dtype, tuple[int, int, int]] = {
    torch.float32: (32, 8, 23),
    torch.bfloat16: (16, 8, 7),
    torch.float16: (16, 5, 10),
}
# Same-width signed integer views: torch has no uint32 arithmetic on every build, and XOR is sign-agnostic.
_INT_VIEW: dict[torch.dtype, torch.dtype] = {
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}


def bit_layout(dtype: torch.dtype) -> tuple[int, int, int]:
    """``(total bits, exponent bits, mantissa bits)`` of ``dtype``; ValueError for an unsupported dtype."""
    try:
        return _LAYOUT[dtype]
    except KeyError:
        names = ", ".join(str(d) for d in SUPPORTED)
        raise ValueError(f"unsupported dtype {dtype}: bit flips support {names}") from None


def bits_in_class(dtype: torch.dtype, cls: BitClass) -> list[int]:
    """The bit indices (0 = least significant) of one class; the three classes partition all bits."""
    total, exponent, mantissa = bit_layout(dtype)
    if cls == "mantissa":
        return list(range(mantissa))
    if cls == "exponent":
        return list(range(mantissa, mantissa + exponent))
    if cls == "sign":
        return [total - 1]
    raise ValueError(f"unknown bit class {cls!r}: expected one of {', '.join(BIT_CLASSES)}")


def bit_class(dtype: torch.dtype, bit: int) -> BitClass:
    """Which class bit ``bit`` of ``dtype`` belongs to; ValueError when it is outside the width."""
    total, _exponent, mantissa = bit_layout(dtype)
    _check_bit(dtype, bit)
    if bit == total - 1:
        return "sign"
    return "mantissa" if bit < mantissa else "exponent"


@dataclass(frozen=True)
class Flip:
    """Flip bit ``bit`` (0 = LSB) of the element at flat index ``index`` (logical row-major order)."""

    index: int
    bit: int


@dataclass(frozen=True)
class FlipRecord:
    """What one operation changed: enough to put the exact original bytes back with :func:`restore`.

    ``indices`` are the distinct flat indices touched, ascending; ``original`` their raw bytes before the
    change, in that order (native byte order, ``itemsize`` bytes each); ``dtype`` the tensor's dtype as
    ``str(dtype)``; ``kind`` one of ``bitflip``, ``set``, ``scale``; ``detail`` a short human description.
    """

    indices: tuple[int, ...]
    original: bytes
    dtype: str
    kind: str
    detail: str


# -- choosing ---------------------------------------------------------------------------------------------------


def choose_flips(
    numel: int,
    dtype: torch.dtype,
    rng: random.Random,
    *,
    element: int | None = None,
    bit: int | BitClass | None = None,
    count: int = 1,
    min_magnitude: float | None = None,
    values: torch.Tensor | None = None,
) -> list[Flip]:
    """Choose ``count`` flips, deterministically for a given ``rng`` state.

    - ``element`` None: ``count`` DISTINCT elements drawn uniformly (without replacement), each with one bit.
      With ``min_magnitude`` (which needs ``values``, ``numel`` elements in flat order) the draw is among
      elements with ``|x| >= min_magnitude`` only (NaN never qualifies); ValueError when too few qualify.
    - ``element`` given: ``count`` DISTINCT bits of that one element (a multi-bit upset of one word).
    - ``bit``: an index (checked against the dtype's width), a class (a random bit of that class per flip),
      or None (any bit, uniformly).

    Result order is the draw order. Raises ValueError for impossible requests, never silently shrinks them.
    """
    if numel < 1:
        raise ValueError("cannot choose flips in an empty tensor")
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    pool = _bit_pool(dtype, bit)
    if element is not None:
        if not 0 <= element < numel:
            raise ValueError(f"element {element} is out of range for {numel} elements")
        if count > len(pool):
            raise ValueError(f"cannot flip {count} distinct bits of one element: only {len(pool)} allowed")
        bits = pool if len(pool) == 1 else rng.sample(pool, count)
        return [Flip(element, b) for b in bits]
    if min_magnitude is not None:
        if values is None:
            raise ValueError("min_magnitude needs the tensor's values")
        if values.numel() != numel:
            raise ValueError(f"values has {values.numel()} elements, expected {numel}")
        # NaN compares False, so NaN elements never qualify; >= keeps min_magnitude=0 meaning "any".
        candidates = torch.nonzero(values.detach().reshape(-1).abs() >= min_magnitude).reshape(-1)
        if candidates.numel() < count:
            raise ValueError(
                f"only {candidates.numel()} of {numel} elements have |x| >= {min_magnitude:g}, need {count}"
            )
        picks = rng.sample(range(candidates.numel()), count)
        indices = [int(candidates[p]) for p in picks]
    else:
        if count > numel:
            raise ValueError(f"cannot choose {count} distinct elements out of {numel}")
        # sample(range) is O(count), so choosing in a 10M-element tensor costs nothing.
        indices = rng.sample(range(numel), count)
    return [Flip(i, pool[0] if len(pool) == 1 else rng.choice(pool)) for i in indices]


def _bit_pool(dtype: torch.dtype, bit: int | BitClass | None) -> list[int]:
    if bit is None:
        return list(range(bit_layout(dtype)[0]))
    if isinstance(bit, str):
        return bits_in_class(dtype, bit)
    _check_bit(dtype, bit)
    return [bit]


def _check_bit(dtype: torch.dtype, bit: int) -> None:
    total = bit_layout(dtype)[0]
    if isinstance(bit, bool) or not isinstance(bit, int) or not 0 <= bit < total:
        raise ValueError(f"bit {bit!r} is outside {dtype} (bits 0..{total - 1}, 0 = least significant)")


# -- changing ---------------------------------------------------------------------------------------------------


def flip_bits(tensor: torch.Tensor, flips: Sequence[Flip]) -> FlipRecord:
    """Flip the given bits IN PLACE in ``tensor``'s storage and return the record that undoes it.

    Several flips of one element combine (two flips of the same bit cancel, as XOR does). Works on
    parameters that require grad and on non-contiguous tensors (see the module docstring).
    """
    words = _Words(tensor)
    total = bit_layout(tensor.dtype)[0]
    masks: dict[int, int] = {}
    for flip in flips:
        words.check(flip.index)
        _check_bit(tensor.dtype, flip.bit)
        masks[flip.index] = masks.get(flip.index, 0) ^ (1 << flip.bit)
    if not masks:
        raise ValueError("no flips given")
    indices = sorted(masks)
    # The sign bit's mask is 1 << (total-1), which does not fit a signed int of that width: wrap it.
    signed = [m - (1 << total) if m >= 1 << (total - 1) else m for m in (masks[i] for i in indices)]
    if words.few(indices):
        old = words.get_ints(indices)
        # XOR of two in-range signed ints stays in range (their sign extensions agree).
        words.put_ints(indices, [v ^ m for v, m in zip(old, signed, strict=True)])
        original = words.pack(old)
    else:
        before = words.get(indices)
        words.put(indices, before ^ torch.tensor(signed, dtype=before.dtype, device=before.device))
        original = tensor_bytes(before)
    detail = ", ".join(f"[{f.index}] bit {f.bit} ({bit_class(tensor.dtype, f.bit)})" for f in flips)
    return FlipRecord(tuple(indices), original, str(tensor.dtype), "bitflip", detail)


def set_values(tensor: torch.Tensor, indices: Sequence[int], value: float) -> FlipRecord:
    """Write ``value`` (NaN, ±Inf, anything; rounded to the dtype) into the given elements, in place."""
    words = _Words(tensor)
    unique = sorted(set(indices))
    if not unique:
        raise ValueError("no indices given")
    for index in unique:
        words.check(index)
    before = words.get(unique)
    # Write the value's bit pattern through the integer view too, so nothing on the way can touch it.
    pattern = torch.tensor([value], dtype=tensor.dtype, device=tensor.device).view(before.dtype)
    words.put(unique, pattern.expand(len(unique)))
    return FlipRecord(tuple(unique), tensor_bytes(before), str(tensor.dtype), "set", f"{len(unique)} x {value!r}")


def scale_block(tensor: torch.Tensor, start: int, length: int, factor: float) -> FlipRecord:
    """Multiply ``length`` consecutive elements from flat index ``start`` by ``factor``, in place.

    The published case is 32 consecutive parameters spiked by more than 1e7. The product is computed in the
    tensor's dtype, so it overflows to Inf where the dtype would (float16 overflows past 65504).
    """
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    if start < 0 or start + length > tensor.numel():
        raise ValueError(f"block [{start}, {start + length}) does not fit {tensor.numel()} elements")
    words = _Words(tensor)
    indices = list(range(start, start + length))
    before = words.get(indices)
    scaled = before.view(tensor.dtype) * factor
    words.put(indices, scaled.to(tensor.dtype).view(before.dtype))
    return FlipRecord(
        tuple(indices), tensor_bytes(before), str(tensor.dtype), "scale", f"[{start}:{start + length}] x {factor:g}"
    )


def restore(tensor: torch.Tensor, record: FlipRecord) -> None:
    """Write back the exact original bytes saved in ``record``. Idempotent.

    ValueError when the tensor's dtype differs from the record's or an index no longer fits: restoring into
    the wrong tensor would be a second corruption, so it refuses instead.
    """
    if str(tensor.dtype) != record.dtype:
        raise ValueError(f"record is for {record.dtype}, tensor is {tensor.dtype}")
    words = _Words(tensor)
    if len(record.original) != len(record.indices) * words.itemsize:
        raise ValueError("record is inconsistent: byte length does not match its indices")
    for index in record.indices:
        words.check(index)
    indices = list(record.indices)
    if words.few(indices):
        words.put_ints(indices, words.unpack(record.original))
    else:
        words.put(indices, torch.frombuffer(bytearray(record.original), dtype=words.ints.dtype))


@dataclass(frozen=True)
class UndoRecord:
    """What :func:`undo_change` did to each element of a change (flat indices, each in exactly one field).

    ``restored``: the original bytes were written back. ``delta_removed``: the element was changed after the
    fault wrote it, so it became ``original + (current - corrupted)``, rounded once: the fault's change is gone,
    the later changes stay. ``kept``: left as found, because what it holds is no longer the fault's doing.
    """

    restored: tuple[int, ...] = ()
    delta_removed: tuple[int, ...] = ()
    kept: tuple[int, ...] = ()

    def summary(self) -> str:
        """One line for the history, e.g. ``delta removed [12] (later updates kept); restored [3, 4]``."""
        parts = [
            f"{label} {_index_list(indices)}"
            for label, indices in (
                ("restored", self.restored),
                ("delta removed", self.delta_removed),
                ("kept", self.kept),
            )
            if indices
        ]
        return "; ".join(parts) if parts else "nothing to undo"


def undo_change(
    tensor: torch.Tensor, record: FlipRecord, written: bytes, *, keep_updates: bool, carry: float | None = 1.0
) -> UndoRecord:
    """Remove exactly the change ``record`` describes from ``tensor``, keeping what happened to it since.

    ``written`` holds the bytes the change wrote (:func:`element_bytes` of ``record.indices`` right after it).
    Per element, with ``o`` the original value, ``f`` the corrupted one and ``c`` the current one:

    - ``c`` still has exactly the bytes written: nothing touched it, the original bytes go back (``restored``).
    - ``keep_updates`` False (gradients, rewritten every step): anything else is someone else's value now and
      is left alone (``kept``).
    - ``o``, ``f``, ``c`` finite: ``o + (c - f)`` (``delta_removed``). The difference ``c - f`` is what was done
      to the element after the fault (an optimizer step); it is added to the original instead of the corrupted
      value. For an update ``u`` that does not read the element (Adam, SGD without weight decay)
      ``c = fl(f - u)``, and the result is the fault-free ``fl(o - u)`` bit for bit whenever ``f - o`` is a
      whole number of ulps of one grid that ``o``, ``f`` and both results share (a mantissa flip, the sign bit),
      except where ``o - u`` is a rounding tie and ``f - o`` an odd number of ulps (a bit-0 flip: about
      ``ulp(u) / ulp(o)`` of elements, ~1% for lr 1e-3 on weights ~0.1; round-half-even then goes the other
      way) or a result crosses a power of two; there it is one ulp off. Both steps are computed in float32,
      the precision optimizers compute updates in for all three dtypes (their opmath): ``fl32(c - f)`` is the
      update itself, stripped of the corrupted value's own rounding when the fault moved the value far (a tiny
      ``f`` after an exponent flip), and ``fl32(o + change)`` then rounded to the dtype is the optimizer's own
      ``fl(w + u)``. (float64 gives the same bits for mantissa flips and is worse after exponent flips, as
      measured in ``tests/unit/test_tensor_heal_exact.py``.) A result that overflows restores the original.
    - ``o`` and ``f`` finite, ``c`` not: the update itself went non-finite (the fault's effect on the rest of
      the step, e.g. an exploded gradient): ``kept``, since writing a finite value would hide that divergence.
    - ``f`` (or ``o``) not finite, so the change has no finite delta: ``restored`` when ``c`` is not finite
      either (arithmetic carried the Inf/NaN along; the original is the best value left), ``kept`` when ``f`` was
      non-finite and ``c`` is finite: arithmetic does not turn Inf/NaN finite, so something overwrote the
      element (a guard's repair, a reload from a healthy replica), and writing the stale original would
      itself corrupt the recovered value.

    ``carry`` is how the update since the fault carried the element's value along: ``c = carry * f + h``. 1 for
    weights (the rule above). An optimizer's moment decays it (Adam's ``exp_avg``: ``beta1``, ``exp_avg_sq``:
    ``beta2``, SGD's ``momentum_buffer``: ``momentum``): the fault-free value is ``c - carry * (f - o)``, computed
    in float64; where ``c``'s own rounding (``|c| * eps``) swamps a thousandth of ``carry * |o|`` (an exponent flip
    made ``f`` huge, so the update ``h`` drowned in it) the original is restored instead (``restored``: that
    step's update of the element is lost, a small and sane error, where the arithmetic would give noise, even a
    negative second moment). None: the way the value was carried is unknown, so a changed element gets its
    original back (``restored``).

    Raises ValueError for a record of another dtype, a ``written`` of the wrong length or indices out of range.
    """
    if str(tensor.dtype) != record.dtype:
        raise ValueError(f"record is for {record.dtype}, tensor is {tensor.dtype}")
    words = _Words(tensor)
    indices = list(record.indices)
    size = len(indices) * words.itemsize
    if len(record.original) != size or len(written) != size:
        raise ValueError("record is inconsistent: byte lengths do not match its indices")
    for index in indices:
        words.check(index)
    if element_bytes(tensor, indices) == written:
        # Nothing touched it (a served model, a skipped step): the common case of a stuck fault's every fire,
        # kept to a byte compare and a restore (microseconds on the scalar path).
        restore(tensor, record)
        return UndoRecord(restored=tuple(indices))
    int_dtype = words.ints.dtype
    current = words.get(indices).cpu()
    original = torch.frombuffer(bytearray(record.original), dtype=int_dtype)
    wrote = torch.frombuffer(bytearray(written), dtype=int_dtype)
    untouched = current == wrote
    restore_mask = untouched.clone()
    delta_mask = torch.zeros_like(untouched)
    result = original.clone()
    if keep_updates:
        o, f, c = (t.view(tensor.dtype).to(torch.float32) for t in (original, wrote, current))
        fin_o, fin_f, fin_c = o.isfinite(), f.isfinite(), c.isfinite()
        changed = ~untouched
        if carry == 1.0:
            rebased = (o + (c - f)).to(tensor.dtype)  # c - f first: the update since the fault (see above)
            usable = torch.ones_like(untouched)
        elif carry is None:
            rebased = o.to(tensor.dtype)
            usable = torch.zeros_like(untouched)
        else:
            o64, f64, c64 = o.double(), f.double(), c.double()
            rebased = (c64 - carry * (f64 - o64)).to(tensor.dtype)
            usable = c64.abs() * torch.finfo(tensor.dtype).eps <= 1e-3 * carry * o64.abs()
        fits = rebased.isfinite() & usable
        delta_mask = changed & fin_o & fin_f & fin_c & fits
        restore_mask |= changed & fin_o & fin_f & fin_c & ~fits
        restore_mask |= changed & ~(fin_o & fin_f) & ~(~fin_f & fin_c)
        result = torch.where(delta_mask, rebased.view(int_dtype), original)
    write = restore_mask | delta_mask
    if bool(write.any()):
        chosen = [i for i, w in zip(indices, write.tolist(), strict=True) if w]
        values = result[write]
        if words.few(chosen):
            words.put_ints(chosen, [int(v) for v in values.tolist()])
        else:
            words.put(chosen, values)

    def pick(mask: torch.Tensor) -> tuple[int, ...]:
        return tuple(i for i, m in zip(indices, mask.tolist(), strict=True) if m)

    return UndoRecord(pick(restore_mask), pick(delta_mask), pick(~(restore_mask | delta_mask)))


def element_bytes(tensor: torch.Tensor, indices: Sequence[int]) -> bytes:
    """The raw bytes of the given elements, in the given order (what a :class:`FlipRecord` stores)."""
    words = _Words(tensor)
    for index in indices:
        words.check(index)
    if words.few(indices):
        return words.pack(words.get_ints(indices))
    return tensor_bytes(words.get(indices))


def flipped_value(x: float, dtype: torch.dtype, bit: int) -> float:
    """The value ``x`` (first rounded to ``dtype``) becomes when bit ``bit`` flips, as a Python float.

    Exact for every result except signalling NaNs, which Python's float (a C double) quietens; compare
    NaN-ness, not bits, for those.
    """
    one = torch.tensor([x], dtype=dtype)
    flip_bits(one, [Flip(0, bit)])
    return float(one.item())


# -- internals --------------------------------------------------------------------------------------------------


_FEW = 8  # up to this many elements on the CPU, per-element scalar access beats building index tensors


class _Words:
    """``tensor``'s elements as same-width signed integers: a view of its storage, addressed by flat index.

    Two access paths with identical results: vectorised (index tensors; any size, any device) and per element
    through Python ints (few elements of a contiguous CPU tensor: the common single flip costs microseconds).
    """

    def __init__(self, tensor: torch.Tensor) -> None:
        int_dtype = _INT_VIEW.get(tensor.dtype)
        if int_dtype is None:
            bit_layout(tensor.dtype)  # raises the uniform "unsupported dtype" error
            raise AssertionError("unreachable")
        data = tensor.data  # shares storage, bypasses autograd (see the module docstring)
        if any(stride == 0 and size > 1 for stride, size in zip(data.stride(), data.shape, strict=True)):
            raise ValueError(
                f"tensor with shape {tuple(data.shape)} and strides {data.stride()} has overlapping memory "
                "(an expand or broadcast view): one write would change several elements; corrupt its base instead"
            )
        ints = data.view(int_dtype)  # same itemsize, so this is a view for any strides
        if ints.dim() == 0:
            ints = ints.unsqueeze(0)
        self.contiguous = ints.is_contiguous()
        self.ints = ints.view(-1) if self.contiguous else ints
        self.numel = ints.numel()
        self.itemsize = ints.element_size()
        self._scalar_ok = self.contiguous and ints.device.type == "cpu"

    def check(self, index: int) -> None:
        if not 0 <= index < self.numel:
            raise ValueError(f"element index {index} is out of range for {self.numel} elements")

    def few(self, indices: Sequence[int]) -> bool:
        return self._scalar_ok and len(indices) <= _FEW

    def _indexer(self, indices: Sequence[int]) -> torch.Tensor | tuple[torch.Tensor, ...]:
        flat = torch.tensor(list(indices), dtype=torch.long, device=self.ints.device)
        return flat if self.contiguous else tuple(torch.unravel_index(flat, tuple(self.ints.shape)))

    def get(self, indices: Sequence[int]) -> torch.Tensor:
        return self.ints[self._indexer(indices)].clone()

    def put(self, indices: Sequence[int], values: torch.Tensor) -> None:
        self.ints[self._indexer(indices)] = values.to(self.ints.device)

    def get_ints(self, indices: Sequence[int]) -> list[int]:
        return [int(self.ints[i]) for i in indices]

    def put_ints(self, indices: Sequence[int], values: Sequence[int]) -> None:
        for index, value in zip(indices, values, strict=True):
            self.ints[index] = value

    def pack(self, values: Sequence[int]) -> bytes:
        return b"".join(v.to_bytes(self.itemsize, sys.byteorder, signed=True) for v in values)

    def unpack(self, data: bytes) -> list[int]:
        size = self.itemsize
        return [int.from_bytes(data[i : i + size], sys.byteorder, signed=True) for i in range(0, len(data), size)]


def _index_list(indices: Sequence[int], limit: int = 8) -> str:
    shown = ", ".join(str(i) for i in indices[:limit])
    return f"[{shown}{', ...' if len(indices) > limit else ''}]"


def tensor_bytes(values: torch.Tensor) -> bytes:
    """The raw bytes of ``values`` (copied to the CPU, contiguous), without numpy: torch runs without it, so
    the agent must too."""
    flat = values.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    return ctypes.string_at(flat.data_ptr(), flat.numel()) if flat.numel() else b""


__all__ = [
    "BIT_CLASSES",
    "SUPPORTED",
    "BitClass",
    "Flip",
    "FlipRecord",
    "UndoRecord",
    "bit_class",
    "bit_layout",
    "bits_in_class",
    "choose_flips",
    "element_bytes",
    "flip_bits",
    "flipped_value",
    "restore",
    "scale_block",
    "set_values",
    "tensor_bytes",
    "undo_change",
]
