"""What the row-wise kernels share: where a tensor's rows are, how a row is read in 16-byte accesses,
and how the programs of a row split across programs meet.

- **Row layouts** (:func:`row_layouts`): the leading dimensions of a ``(..., N)`` tensor merged into at
  most two (size, stride) levels, so a kernel finds row r at ``(r // n_inner) * stride_b + (r %
  n_inner) * stride_m`` (:func:`_row_offsets`) and reads slices and transposes in place.
- **The 16-byte unit** (:func:`unit_of`, :func:`_times_unit`): Triton tells its compiler which integer
  arguments are multiples of 16, not of 8; lengths and strides that are multiples of 16 bytes but not
  of 16 elements are passed divided by the unit and multiplied back in the kernel.
- **Body and fragments** (:func:`_row_body`, :func:`_fragments`): a row that starts or ends off a
  16-byte boundary is read as a body from its first boundary, a multiple of VEC elements long, and
  the fewer than VEC elements before and after it in one small tile.
- **Split rows** (:func:`_split_ticket`, :func:`_split_wait`, :func:`_split_merge`): a row held by
  SPLIT programs, which publish their statistics, wait for each other and merge them (lesson 4's
  split softmax, lesson 5's split cross-entropy).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._launch import INT32_LIMIT, KernelInputError, element_size
from ._tensors import resolved


# -- layouts ------------------------------------------------------------------------------------------
class Rows(NamedTuple):
    """Where a tensor's rows are: row r starts at ``(r // n_inner) * stride_b + (r % n_inner) * stride_m``."""

    n_rows: int
    n_cols: int
    n_inner: int
    stride_b: int
    stride_m: int
    two_level: bool


def _levels(shape, stride) -> list[list[int]] | None:
    """The leading dimensions merged into (size, stride) levels, innermost first; None for more than two."""
    levels: list[list[int]] = []
    for size, st in zip(reversed(shape[:-1]), reversed(stride[:-1]), strict=True):
        if size == 1:
            continue  # a size-1 dim has no stride worth keeping
        if levels and st == levels[-1][0] * levels[-1][1]:
            levels[-1][0] *= size  # this dim steps over the whole level inside it: one level
        else:
            levels.append([size, st])
    return levels if len(levels) <= 2 else None


@functools.lru_cache(maxsize=4096)
def _layouts(shape: tuple, strides: tuple) -> tuple[Rows, ...] | None:
    n_cols = shape[-1] if shape else 1
    n_rows = math.prod(shape[:-1])
    levels = [_levels(shape, st) for st in strides]
    if any(lv is None for lv in levels):
        return None
    inner = {lv[0][0] for lv in levels if len(lv) == 2}
    if len(inner) > 1:
        return None
    if not inner:  # one stride each
        return tuple(Rows(n_rows, n_cols, max(n_rows, 1), 0, lv[0][1] if lv else n_cols, False) for lv in levels)
    (n_inner,) = inner
    out = []
    for lv in levels:
        if len(lv) == 2:
            out.append(Rows(n_rows, n_cols, n_inner, lv[1][1], lv[0][1], True))
        else:
            st = lv[0][1] if lv else n_cols
            out.append(Rows(n_rows, n_cols, n_inner, n_inner * st, st, True))
    return tuple(out)


def row_layouts(*tensors: torch.Tensor) -> tuple[Rows, ...] | None:
    """One :class:`Rows` per tensor (all of one shape ``(..., N)``), sharing ``n_inner`` so that one
    kernel can walk them together; None if a tensor needs three strides or two need different splits.
    Cached by shape and strides: a launcher works it out once per layout."""
    return _layouts(tuple(tensors[0].shape), tuple(tuple(t.stride()) for t in tensors))


def grad_rows(g: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A gradient as ``(tensor, row stride)`` with unit column stride and one row stride, copying it
    when autograd handed over another layout (an expanded ``y.sum()`` gradient, a transposed view)."""
    g = resolved(g)  # a negated view (what autograd hands over for -y) made real
    if g.dim() == 0 or (g.shape[-1] > 1 and g.stride(-1) != 1):
        g = g.contiguous()
    lv = _levels(g.shape, g.stride())
    if lv is None or len(lv) == 2:
        g = g.contiguous()
        lv = _levels(g.shape, g.stride())
    return g, (lv[0][1] if lv else g.shape[-1])


def check_rows(x: torch.Tensor, name: str, others: dict, op: str) -> tuple[Rows, ...]:
    """Validate the layout of ``x`` and same-shaped ``others`` ({name: tensor}); their Rows."""
    if x.dim() < 1:
        raise KernelInputError(f"{op}: {name} must have at least one dimension (..., N), got a scalar.")
    if x.shape[-1] >= INT32_LIMIT:
        raise KernelInputError(f"{op}: rows of {x.shape[-1]} elements; the kernel takes rows of fewer than 2**31.")
    layouts = row_layouts(x, *others.values())
    if layouts is None:
        names = " and ".join([name, *others])
        raise KernelInputError(
            f"{op}: the leading dimensions of {names} (shape {tuple(x.shape)}, strides "
            f"{[tuple(t.stride()) for t in (x, *others.values())]}) do not merge into the (at most two, shared) "
            f"row strides the kernel takes. Pass .contiguous()."
        )
    if layouts[0].n_rows >= INT32_LIMIT:
        raise KernelInputError(f"{op}: {layouts[0].n_rows} rows; the kernel numbers rows in int32 (fewer than 2**31).")
    return layouts


@triton.jit
def _row_offsets(rows, n_inner, stride_b, stride_m, TWO_LEVEL: tl.constexpr):
    # rows: int64. Row r starts at (r // n_inner) * stride_b + (r % n_inner) * stride_m (two levels of
    # leading dimensions), or r * stride_m when they merge into one stride.
    if TWO_LEVEL:
        return (rows // n_inner) * stride_b + (rows % n_inner) * stride_m
    else:
        return rows * stride_m


# -- the 16-byte unit ---------------------------------------------------------------------------------
def unit_of(dtype: torch.dtype, *values: int) -> int:
    """The 16-byte unit in elements (8 in 16 bits, 4 in fp32) when every length and stride in
    ``values`` is a multiple of it, but not all of 16 elements, else 1. Triton tells its compiler which
    integer arguments are multiples of 16, not of 8: rows of, say, 17000 bf16 start on 16-byte
    boundaries, but the compiler cannot know it and moves them 2 bytes at a time. The launchers pass
    such values divided by the unit, and the kernels multiply them back (:func:`_times_unit`): a
    product by a constant the compiler can see through."""
    vec = 16 // element_size(dtype)
    if vec == 1 or any(v % vec for v in values) or all(v % 16 == 0 for v in values):
        return 1
    return vec


def in_units(dtype: torch.dtype, r: Rows) -> tuple[int, int, int, int]:
    """``(UNIT, n_cols, stride_b, stride_m)`` for a launch: the row's length and strides divided by
    :func:`unit_of`'s unit, which the kernel multiplies back."""
    u = unit_of(dtype, r.n_cols, r.stride_b, r.stride_m)
    return u, r.n_cols // u, r.stride_b // u, r.stride_m // u


@triton.jit
def _times_unit(v, UNIT: tl.constexpr):
    """A length or stride that came divided by UNIT (:func:`unit_of`), multiplied back."""
    if UNIT > 1:
        v = v * UNIT
    return v


@triton.jit
def _rows_times_unit(n_cols, stride_a, stride_b, stride_c, UNIT: tl.constexpr):
    """A row length and three row strides that came divided by UNIT, multiplied back."""
    return (
        _times_unit(n_cols, UNIT),
        _times_unit(stride_a, UNIT),
        _times_unit(stride_b, UNIT),
        _times_unit(stride_c, UNIT),
    )


# -- body and fragments -------------------------------------------------------------------------------
@triton.jit
def _row_body(start, n_cols, VEC: tl.constexpr):
    """``(lo, body_len)`` of a row that starts at element offset ``start``: ``lo`` elements up to its
    first 16-byte boundary (VEC elements a unit), then a body of a multiple of VEC elements, read in
    16-byte accesses; masks at the row's ends would otherwise stop the compiler from using them for
    the whole row."""
    lo = tl.minimum(((VEC - start % VEC) % VEC).to(tl.int32), n_cols)
    return lo, ((n_cols - lo) // VEC) * VEC


@triton.jit
def _fragments(lo, body_len, n_cols, VEC: tl.constexpr):
    """The columns and mask of a row's two fragments in one tile of 2 VEC lanes: lanes [0, VEC) the
    ``lo`` columns before the body, lanes [VEC, 2 VEC) the fewer than VEC columns after it."""
    lane = tl.arange(0, 2 * VEC)
    hi = lane >= VEC
    col_f = tl.where(hi, lo + body_len + lane - VEC, lane)
    return col_f, tl.where(hi, col_f < n_cols, lane < lo)


# -- split rows ---------------------------------------------------------------------------------------
# A row too wide for one program's registers is held by SPLIT programs. A program takes its (row,
# part) from an atomic ticket (zeroed by the launcher), not from its program id: a program holding
# ticket t is running, and it waits only for tickets of its own row, which are taken by programs
# already running or by the next ones to start. The GPU holds far more than SPLIT (at most 64) of
# these programs at once, so those start, whatever order the hardware starts programs in. GPU only:
# the interpreter runs programs one at a time, so the first would wait for ever.
@triton.jit
def _split_ticket(sync_ptr, SPLIT: tl.constexpr):
    """(row, part) of a program of a split row, from the atomic ticket at ``sync_ptr[0]``."""
    ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed")
    return (ticket // SPLIT).to(tl.int64), ticket % SPLIT


@triton.jit
def _split_wait(sync_ptr, row, SPLIT: tl.constexpr):
    """Count this part of ``row`` as published (its stores done: a barrier first, then the count with
    release semantics) and wait until all SPLIT parts are; then their stores are visible (acquire)."""
    tl.debug_barrier()
    count = sync_ptr + 1 + row
    arrived = tl.atomic_add(count, 1, sem="acq_rel") + 1
    while arrived < SPLIT:
        arrived = tl.atomic_add(count, 0, sem="acquire")  # a read with acquire semantics


@triton.jit
def _split_merge(parts, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr):
    """The row's (max, sum of exp(x - max)) from its parts' pairs at ``parts[:SPLIT]`` (maxima) and
    ``parts[SPLIT:2 SPLIT]`` (sums), merged as the online softmax merges tiles. The max is 0 for a row
    of only -inf (its sum is then 0)."""
    p = tl.arange(0, SPLIT_P2)
    m_all = tl.load(parts + p, mask=p < SPLIT, other=float("-inf"), volatile=True)
    d_all = tl.load(parts + SPLIT + p, mask=p < SPLIT, other=0.0, volatile=True)
    big = tl.max(m_all, axis=0)
    big = tl.where(big == float("-inf"), 0.0, big)
    return big, tl.sum(d_all * tl.exp(m_all - big), axis=0)
