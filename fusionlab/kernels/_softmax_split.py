"""Lesson 4's split softmax: a row too wide for one program's registers, held by several programs.

``SPLIT`` programs hold ``BLOCK_N`` elements of a row each: each finds its part's max and sum,
publishes them, waits for the row's other parts (the ticket and count of :mod:`._rows`), merges the
statistics as the online softmax does and writes its part of y from registers. Trips: read x, write
y, against the online path's read, read again, write. GPU forward only: the interpreter runs programs
one at a time, so the first would wait for ever. :func:`fusionlab.kernels.softmax.softmax_config`
decides which rows take it (``SPLIT``); this module is its kernel, its launch and the one rule it adds
to the configuration (:func:`_padded_row_split`). Measurements: ``benchmarks/notes_softmax.md``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._launch import cdiv, element_size, launch_kwargs, next_pow2
from ._rows import (
    Rows,
    _fragments,
    _row_body,
    _row_offsets,
    _rows_times_unit,
    _split_merge,
    _split_ticket,
    _split_wait,
    in_units,
)


def _padded_row_split(n_cols: int, dtype: torch.dtype, t: dict, cfg: dict) -> dict:
    """``cfg`` (a persistent one-tile row), or the split schedule when its parts fill their tiles by at
    least ``t["split_fill_gain"]`` more than the one tile does (a power of two, padded)."""

    def fill(tile: int) -> float:
        return n_cols / (cdiv(n_cols, tile) * tile)

    big = t["split_bytes"] // element_size(dtype)
    part = max((big, big // 2), key=fill)  # the larger part on a tie
    if fill(part) - fill(cfg["BLOCK_N"]) < t["split_fill_gain"] or cdiv(n_cols, part) > t["max_split"]:
        return cfg
    return {"BLOCK_M": 1, "BLOCK_N": part, "num_warps": 4, "SINGLE_TILE": False, "SPLIT": cdiv(n_cols, part)}


@triton.jit
def _softmax_split_kernel(
    x_ptr, y_ptr, sync_ptr, part_ptr, n_cols, n_inner, stride_xb, stride_xm, stride_ym,
    SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr, BLOCK_N: tl.constexpr, TWO_LEVEL: tl.constexpr,
    EVEN_N: tl.constexpr = False, UNIT: tl.constexpr = 1, VEC: tl.constexpr = 1,
):  # fmt: skip
    # A row too wide for one program's registers, held by SPLIT programs instead: each loads its
    # BLOCK_N elements once, finds their max m and sum d of exp(x - m), publishes (m, d), waits for
    # the row's other parts, combines them (the online softmax's merge) and writes its part of y from
    # registers. Trips: read x, write y — no re-read. GPU only (why the wait cannot hang: _rows.py).
    n_cols, stride_xb, stride_xm, stride_ym = _rows_times_unit(n_cols, stride_xb, stride_xm, stride_ym, UNIT)
    row, part = _split_ticket(sync_ptr, SPLIT)
    offs = part * BLOCK_N + tl.arange(0, BLOCK_N)
    start = _row_offsets(row, n_inner, stride_xb, stride_xm, TWO_LEVEL)
    if VEC > 1:
        # Rows that do not start on 16-byte boundaries (an odd width, contiguous: x and y rows start
        # at the same offsets; the launcher sees to it): the parts cover a body from the row's first
        # boundary, a multiple of VEC long, so that every access is 16 bytes; the fewer than VEC
        # elements before it and after it go to part 0, in one tile of 2 VEC lanes (cross-entropy's
        # kernel does the same).
        lo, body_len = _row_body(start, n_cols, VEC)
        start_body = tl.multiple_of(start + lo, VEC)
        col_f, mask_f = _fragments(lo, body_len, n_cols, VEC)
        mask_f = mask_f & (part == 0)
        x_f = tl.load(x_ptr + start + col_f, mask=mask_f, other=float("-inf")).to(tl.float32)
    else:
        body_len = n_cols
        start_body = start
    col_ok = offs < body_len
    x_row = x_ptr + start_body
    if EVEN_N:
        x = tl.load(x_row + offs).to(tl.float32)
    else:
        x = tl.load(x_row + offs, mask=col_ok, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    if VEC > 1:
        m = tl.maximum(m, tl.max(x_f, axis=0))
    ref = tl.where(m == float("-inf"), 0.0, m)  # a part of only -inf: d = 0, not exp(-inf - -inf)
    e = tl.exp(x - ref)
    d = tl.sum(e, axis=0)
    if VEC > 1:
        e_f = tl.exp(x_f - ref)
        d += tl.sum(e_f, axis=0)
    # publish (m, d): the stores, then a barrier (every thread's store is done), then the count with
    # release semantics; the last of the row's parts to count sees SPLIT at once, the others wait
    parts = part_ptr + row * (2 * SPLIT)
    tl.store(parts + part, m)
    tl.store(parts + SPLIT + part, d)
    _split_wait(sync_ptr, row, SPLIT)
    big, l = _split_merge(parts, SPLIT, SPLIT_P2)  # an all -inf row: l = 0, y = 0 * (1 / 0): NaN, as torch
    scale = tl.exp(ref - big) / l
    y = e * scale
    if VEC > 1:
        y_row = y_ptr + row * stride_ym  # the same offsets as x's rows (contiguous)
        tl.store(y_row + col_f, (e_f * scale).to(y_ptr.dtype.element_ty), mask=mask_f)
        y_ptrs = y_ptr + tl.multiple_of(row * stride_ym + lo, VEC) + offs
    else:
        y_ptrs = y_ptr + row * stride_ym + offs
    if EVEN_N:
        tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty))
    else:
        tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=col_ok)


def _packed(x: torch.Tensor) -> bool:
    """x's rows lie end to end from a 16-byte boundary (and so will a fresh y's): the split's fragments."""
    return x.is_contiguous() and x.data_ptr() % 16 == 0


def _forward_split(x: torch.Tensor, y: torch.Tensor, r: Rows, cfg: dict) -> torch.Tensor:
    parts = cfg["SPLIT"]
    sync = torch.zeros(r.n_rows + 1, dtype=torch.int32, device=x.device)  # the ticket, then a count a row
    stats = torch.empty(r.n_rows * 2 * parts, dtype=torch.float32, device=x.device)  # (m, d) of every part
    u, n_cols, stride_b, stride_m = in_units(x.dtype, r)
    # rows off 16-byte boundaries: the fragments path, when x is contiguous (y's rows then start at the
    # same offsets) and starts on a boundary itself
    vec = 16 // x.element_size()
    frag = vec > 1 and r.n_cols % vec != 0 and _packed(x)
    _softmax_split_kernel[(r.n_rows * parts,)](
        x, y, sync, stats, n_cols, r.n_inner, stride_b, stride_m, n_cols,
        SPLIT=parts, SPLIT_P2=next_pow2(parts), BLOCK_N=cfg["BLOCK_N"], TWO_LEVEL=r.two_level,
        EVEN_N=r.n_cols % cfg["BLOCK_N"] == 0 and not frag, UNIT=u, VEC=vec if frag else 1,
        **launch_kwargs(cfg["num_warps"]),
    )  # fmt: skip
    return y
