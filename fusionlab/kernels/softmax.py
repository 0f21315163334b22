"""Lesson 4: the row softmax — a reduction, so the whole row must be seen before any output is known.

``y[i, j] = exp(x[i, j] - m_i) / l_i``, ``m_i = max_j x[i, j]``, ``l_i = sum_j exp(x[i, j] - m_i)``,
over the last dimension of ``x`` (any leading shape). Subtracting the row maximum changes nothing
mathematically and keeps ``exp`` from overflowing (logits of 1e4 give ``exp(0) = 1`` at most).

Written in torch by hand (Triton's tutorial 02 counts it), softmax is five kernels: max, subtract,
exp, sum, divide — ``8MN + 4M`` elements through HBM for M rows of N. The fused kernel reads each row
once and writes it once, ``2MN``, *if the row fits on chip*. Three schedules:

- **one tile** (``SINGLE_TILE``): the row (or ``BLOCK_M`` short rows) is loaded once into registers;
  max, exp, sum and the scaling happen there. Trips: read x, write y. A row that fills three quarters
  of its power-of-two tile is held as a head of half the tile and a tail (``TAIL_N``); wide one-tile
  rows are walked by persistent programs, the next rows' loads in flight.
- **online softmax** (wider rows): one pass keeps a running max ``m`` and a running sum ``l`` of
  ``exp(x - m)``, rescaling the sum when a tile raises the max (Milakov & Gimelshein 2018); a second
  pass re-reads the row and writes ``exp(x - m) / l``. Trips: read x, **read x again**, write y (the
  ledger's re-read term; on a GPU the L2 hints serve the re-read from L2 while the rows in flight fit
  there). The same recurrence over blocks of keys is FlashAttention's (lesson 7):
  :func:`online_softmax_stats` exposes its ``(m, l)``, :func:`online_softmax_reference_blocks` runs
  it in float64 torch.
- **split rows** (``SPLIT``, GPU forward, ``_softmax_split``): ``SPLIT`` programs hold a part of the
  row each, swap their parts' max and sum, and write their part of y. Trips: read x, write y.

Which rows take which is :func:`softmax_config`'s table, measured in ``benchmarks/notes_softmax.md``.
Rows of a multiple of 16 bytes but not of 16 elements (17000 in bf16) are passed with lengths and
strides divided by the 16-byte unit (``UNIT``), so that they still move in 16-byte accesses.

Backward (one kernel, from the saved y): ``dx = y * (dy - sum_j(dy * y))``. Trips: read y, dy; write
dx (rows past its one-tile limit: y and dy twice).

Numerics, as torch: fp32 arithmetic whatever the storage; masked lanes load as ``-inf``; an all
``-inf`` row gives NaN, as ``torch.softmax`` does, and so does a row holding ``+inf`` or NaN. The
online recurrence measures against 0 while a row has seen only ``-inf`` (``exp(-inf - (-inf))`` would
poison the sum). Layout: the last dimension must have stride 1; the leading dimensions may be strided
(up to two strides: ``x[:, ::2]``, a transposed 3-D tensor, a slice of a wider buffer are read in
place). Row offsets are int64: rows x width past 2**31 works.

Reference: Triton tutorial 02; Liger-Kernel ``ops/softmax.py``; Milakov & Gimelshein (2018); Dao et
al., FlashAttention (2022), section 3.1.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from .. import runtime
from .._exercise import answer_key
from ..ledger import Ledger
from ._launch import (
    DEFAULT_SMS,
    INT32_LIMIT,
    MAX_TILE,
    KernelInputError,
    cdiv,
    check_block,
    check_tensor,
    check_tile,
    element_size,
    head_and_tail,
    launch_kwargs,
    next_pow2,
    row_config,
    sm_count,
    tail_warps,
)
from ._rows import (
    Rows,
    _row_offsets,
    _rows_times_unit,
    _times_unit,
    in_units,
    row_layouts,
)
from ._softmax_split import _forward_split, _padded_row_split
from ._tensors import upstream_grad

OP = "softmax"


# -- the reference, the baseline, the ledger ---------------------------------------------------------
@answer_key
def softmax_reference(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The spec: ``torch.softmax`` evaluated in fp32 (float64 stays float64), returned in ``x.dtype``."""
    return torch.softmax(x.to(torch.promote_types(x.dtype, torch.float32)), dim).to(x.dtype)


def softmax_eager(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """What eager PyTorch runs: ``torch.softmax(x, dim)`` — itself one fused kernel (read x, write y;
    for very wide rows PyTorch's kernel re-reads the row too)."""
    return torch.softmax(x, dim)


@answer_key
def softmax_ledger(rows: int, n: int, dtype, block: int | None = None, *, backward: bool = False) -> Ledger:
    """Softmax of ``rows`` rows of ``n``, trip by trip, as five torch ops written by hand.

    Forward (Triton tutorial 02's ``naive_softmax``): ``m = x.max(-1)`` (read x, write m),
    ``z = x - m`` (read x, m; write z), ``e = exp(z)``, ``s = e.sum(-1)``, ``y = e / s``:
    ``8 rows n + 4 rows`` elements. Fused: read x, write y (2 rows n), and a second read of x (the
    re-read term) when the row is wider than one tile (``n > block``: the online softmax). ``block``:
    the widest row held on chip (default: what this mode's launcher does). ``torch.softmax`` is itself
    one fused kernel, so eager PyTorch moves the fused total, not the five-op one.

    ``backward=True``: ``dx = y * (dy - sum(dy * y))`` by hand: ``t = dy * y``, ``s = t.sum(-1)``,
    ``u = dy - s``, ``dx = y * u``; fused: read y, dy, write dx (wide rows: y and dy read twice).
    """
    rows, n = int(rows), int(n)
    if block is None:
        cfg = softmax_config(rows, n, dtype, backward=backward)
        wide = not (cfg["SINGLE_TILE"] or cfg.get("SPLIT"))
    else:
        wide = n > int(block)
    mn = rows * n
    if not backward:
        led = Ledger(dtype_bytes=dtype, rereads={"x": mn} if wide else {})
        led.op("max", reads={"x": mn}, writes={"m": rows})
        led.op("sub", reads={"x": mn, "m": rows}, writes={"z": mn})
        led.op("exp", reads={"z": mn}, writes={"e": mn})
        led.op("sum", reads={"e": mn}, writes={"s": rows})
        led.op("div", reads={"e": mn, "s": rows}, writes={"y": mn})
    else:
        led = Ledger(dtype_bytes=dtype, rereads={"y": mn, "dy": mn} if wide else {})
        led.op("mul", reads={"dy": mn, "y": mn}, writes={"t": mn})
        led.op("sum", reads={"t": mn}, writes={"s": rows})
        led.op("sub", reads={"dy": mn, "s": rows}, writes={"u": mn})
        led.op("mul", reads={"y": mn, "u": mn}, writes={"dx": mn})
    return led


def softmax_flops(rows: int, n: int, *, backward: bool = False) -> int:
    """Nominal FLOPs: forward 5 per element (max, subtract, exp, sum, scale); backward 4 (multiply,
    sum, subtract, multiply)."""
    return (4 if backward else 5) * int(rows) * int(n)


# -- launch configuration --------------------------------------------------------------------------
#: The tuning table (fusionlab/kernels/tuning/softmax.json): what each key chooses, and the sweeps on an
#: H100 and an H200 behind it, are in benchmarks/notes_softmax.md ("2026-11-26: ... key by key").
_TUNING = json.loads((Path(__file__).parent / "tuning" / "softmax.json").read_text())
GPU_TUNING, INTERPRETER_TUNING = _TUNING["gpu"], _TUNING["interpreter"]


@functools.lru_cache(maxsize=4096)
def _config(
    n_rows: int, n_cols: int, max_single: int, wide_block: int, tile: int, thread_bytes: int, gpu: bool,
    dtype: torch.dtype = torch.float32, l2_hints: bool = False,
) -> dict:  # fmt: skip
    # the row tile from the shared helper: one tile up to max_single columns, else wide_block tiles
    single = row_config(n_cols, dtype, max_block=max_single, gpu=gpu)
    if single["SINGLE_TILE"]:
        block_n, single_tile = single["BLOCK_N"], True
    else:
        block_n, single_tile = row_config(n_cols, dtype, max_block=wide_block, gpu=gpu)["BLOCK_N"], False
    # narrow rows: several rows a program, so each program still moves a useful amount
    block_m = max(1, min(tile // block_n, next_pow2(max(n_rows, 1))))
    per_thread = max(1, thread_bytes // element_size(dtype))
    num_warps = max(1, min(32, next_pow2(block_m * block_n // per_thread) // 32)) if gpu else 4
    cfg = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": num_warps, "SINGLE_TILE": single_tile}
    if l2_hints and gpu and not single_tile:
        cfg.update(EVICT_1="evict_last", EVICT_2="evict_first")
    return cfg


def softmax_config(
    n_rows: int, n_cols: int, dtype: torch.dtype, *, backward: bool = False, gpu: bool | None = None, split: bool = True
) -> dict:
    """The launch configuration: ``{"BLOCK_M", "BLOCK_N", "num_warps", "SINGLE_TILE"}`` (and, for the
    online path on a GPU, the eviction hints ``EVICT_1``/``EVICT_2`` of its two passes; for a row that
    fits three quarters of its one tile, ``TAIL_N``: a head of half the tile and a tail).

    ``SINGLE_TILE``: the row fits one ``BLOCK_N`` tile and is read once; otherwise the online path
    walks it in ``BLOCK_N`` tiles and reads it twice, or (``SPLIT``, GPU forward) ``SPLIT`` programs
    hold ``BLOCK_N`` elements of the row each and swap their statistics: read once. ``BLOCK_M`` rows
    share a program when rows are narrow. ``gpu``: the GPU's configuration (default: this mode's), so
    a lesson on a CPU can ask what the GPU kernel does. ``split=False``: never ``SPLIT`` (wide rows
    take the online path). The table it reads: ``GPU_TUNING`` (``tuning/softmax.json``).
    """
    n_rows, n_cols = int(n_rows), int(n_cols)
    gpu = runtime.is_gpu() if gpu is None else gpu
    t = GPU_TUNING["backward" if backward else "forward"] if gpu else INTERPRETER_TUNING
    tile, thread_bytes = t["tile"], t["thread_bytes"]
    width = next_pow2(max(n_cols, 1))  # the one tile's width, for rows that fit one
    big = t.get("big_row")
    if element_size(dtype) == 2 and width in t.get("small_rows", ()):  # measured: bf16
        tile, thread_bytes = t["small_tile"], 2 * thread_bytes
    elif big and big <= width <= t["max_single"]:  # a wide row in one tile: 64 bytes a thread, half the warps
        thread_bytes = 2 * thread_bytes
    cfg = dict(
        _config(n_rows, n_cols, t["max_single"], t["wide_block"], tile, thread_bytes, bool(gpu), dtype, t["l2_hints"])
    )
    staged = cfg["BLOCK_M"] * cfg["BLOCK_N"] * element_size(dtype) * t.get("row_stages", 0)
    if big and cfg["SINGLE_TILE"] and cfg["BLOCK_N"] > big and staged <= t["stage_bytes"]:
        # past big_row: persistent programs whose loop loads the next row while this one reduces (sms
        # from this GPU, or an H100's when a CPU asks what the GPU does); bf16/fp16 only, since an fp32
        # row of 32768 would need 384 KiB of stages (OutOfResources) and keeps one program a row
        sms = sm_count() if runtime.is_gpu() else DEFAULT_SMS
        cfg.update(programs=t["per_sm"] * sms, row_stages=t["row_stages"])
        if n_cols < cfg["BLOCK_N"] and t.get("partial_warps_div"):  # the row does not fill its tile
            cfg["num_warps"] = max(1, cfg["num_warps"] // t["partial_warps_div"])
        if split and t.get("split"):
            cfg = _padded_row_split(n_cols, dtype, t, cfg)
    if split and t.get("split") and not cfg["SINGLE_TILE"] and not cfg.get("SPLIT"):
        chunk = t["split_bytes"] // element_size(dtype)
        parts = cdiv(n_cols, chunk)
        if parts <= t["max_split"] and n_rows * parts < INT32_LIMIT:
            warps = max(1, min(32, t["split_bytes"] // t["split_thread_bytes"] // 32))
            cfg = {"BLOCK_M": 1, "BLOCK_N": chunk, "num_warps": warps, "SINGLE_TILE": False, "SPLIT": parts}
    tail = t.get("tail_from") if not backward else None  # the backward kernel holds one tile
    if tail and cfg["SINGLE_TILE"] and not cfg.get("programs") and tail < cfg["BLOCK_N"]:
        split_tile = head_and_tail(n_cols, cfg["BLOCK_N"])
        if split_tile:
            cfg.update(BLOCK_N=split_tile[0], TAIL_N=split_tile[1])
            if t.get("tail_warps_div"):
                warps = max(1, cfg["num_warps"] // t["tail_warps_div"])
                cfg["num_warps"] = tail_warps(warps, *split_tile, dtype)
    return cfg


@functools.lru_cache(maxsize=1024)
def _stats_config(n_rows: int, n_cols: int, dtype: torch.dtype, block: int | None, gpu: bool) -> dict:
    t = GPU_TUNING["forward"] if gpu else INTERPRETER_TUNING
    if block is None:  # the forward kernel's tile: the whole row if it fits, else the online tile
        cfg = softmax_config(n_rows, n_cols, dtype)
        if not cfg.get("SPLIT"):
            return cfg
        block = t["wide_block"]  # the split schedule keeps no (m, l) a row: the online tile does
    block_m = max(1, min(t["tile"] // block, next_pow2(max(n_rows, 1))))
    per_thread = max(1, t["thread_bytes"] // element_size(dtype))
    num_warps = max(1, min(32, next_pow2(block_m * block // per_thread) // 32)) if gpu else 4
    check_tile(block_m, block, op="online_softmax_stats")
    return {"BLOCK_M": block_m, "BLOCK_N": block, "num_warps": num_warps, "SINGLE_TILE": False}


# -- the kernels -------------------------------------------------------------------------------------
@triton.jit
def _load_tile(ptrs, col_ok, OTHER: tl.constexpr, EVEN_N: tl.constexpr, EVICT: tl.constexpr):
    # EVEN_N: the tiles divide the row, so no column mask at all (checked on the host); rows need
    # none either, since rows past the end re-read the last row
    if EVEN_N:
        t = tl.load(ptrs, eviction_policy=EVICT)
    else:
        t = tl.load(ptrs, mask=col_ok[None, :], other=OTHER, eviction_policy=EVICT)
    return t.to(tl.float32)  # fp32 arithmetic whatever the storage


@triton.jit
def _store_tile(ptrs, val, row_ok, col_ok, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr):
    val = val.to(ptrs.dtype.element_ty)
    if EVEN_M and EVEN_N:
        tl.store(ptrs, val)
    elif EVEN_N:
        tl.store(ptrs, val, mask=row_ok[:, None])
    elif EVEN_M:
        tl.store(ptrs, val, mask=col_ok[None, :])
    else:
        tl.store(ptrs, val, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _row_ptrs(base, rows, n_rows, n_inner, stride_b, stride_m, TWO_LEVEL: tl.constexpr):
    # rows past the end re-read the last row instead of masking it: no row of -inf lanes, no NaN
    # computed for nothing, and a load mask only along the columns
    return base + _row_offsets(tl.minimum(rows, n_rows - 1), n_inner, stride_b, stride_m, TWO_LEVEL)


@triton.jit
def _nan_max(m, l):
    """The row max as torch's ``amax`` gives it: NaN when the row holds one. Triton's max (``fmax``) drops
    a NaN, but it reaches l through exp: a NaN l with a max below +inf (+inf alone makes l NaN too) marks
    the row. One select a row when the stats are written; the loop's max stays one fmax."""
    return tl.where((l != l) & (m < float("inf")), l, m)


@triton.jit
def _softmax_kernel(
    x_ptr, y_ptr, m_ptr, l_ptr, n_rows, n_cols, n_inner, stride_xb, stride_xm, stride_ym,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_TILE: tl.constexpr, TWO_LEVEL: tl.constexpr,
    WRITE_Y: tl.constexpr, WRITE_STATS: tl.constexpr, EVEN_M: tl.constexpr = False, EVEN_N: tl.constexpr = False,
    EVICT_1: tl.constexpr = "", EVICT_2: tl.constexpr = "", ROW_STAGES: tl.constexpr = 1, UNIT: tl.constexpr = 1,
    TAIL_N: tl.constexpr = 0,
):  # fmt: skip
    # one program per BLOCK_M rows (or, persistent, per BLOCK_M rows at a time: see the one-tile path);
    # row numbers fit int32 (the launcher checks), rows * stride may not: int64 offsets
    # lengths and strides may come divided by UNIT (16-byte rows, known as such: see unit_of)
    n_cols, stride_xb, stride_xm, stride_ym = _rows_times_unit(n_cols, stride_xb, stride_xm, stride_ym, UNIT)
    pid = tl.program_id(axis=0)
    offs_n = tl.arange(0, BLOCK_N)
    if SINGLE_TILE:  # the row is on chip: one read, one write
        # program pid takes row blocks pid, pid + P, pid + 2P, ... for P programs launched. The launcher
        # starts one program a block (one trip round this loop) unless tuned persistent: then P is a
        # few per SM and, with ROW_STAGES > 1, tl.range pipelines the loop, so the next block's loads
        # are in flight (through shared memory) while this block reduces and writes
        col_ok = offs_n < n_cols
        if TAIL_N > 0:  # the row's columns past the head (softmax_config's "tail")
            offs_t = BLOCK_N + tl.arange(0, TAIL_N)
            tail_ok = offs_t < n_cols
        for blk in tl.range(pid, tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0), num_stages=ROW_STAGES):
            rows = (blk * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # (BLOCK_M,)
            row_ok = rows < n_rows
            if TAIL_N > 0:  # a head of BLOCK_N (inside every row: no column mask) and a tail
                x_rows = _row_ptrs(x_ptr, rows, n_rows, n_inner, stride_xb, stride_xm, TWO_LEVEL)
                x = _load_tile(x_rows[:, None] + offs_n[None, :], col_ok, float("-inf"), True, EVICT_1)
                x_t = _load_tile(x_rows[:, None] + offs_t[None, :], tail_ok, float("-inf"), False, EVICT_1)
            else:
                x_rows = _row_ptrs(x_ptr, rows, n_rows, n_inner, stride_xb, stride_xm, TWO_LEVEL)
                x = _load_tile(x_rows[:, None] + offs_n[None, :], col_ok, float("-inf"), EVEN_N, EVICT_1)
            m = tl.max(x, axis=1)
            if TAIL_N > 0:
                m = tl.maximum(m, tl.max(x_t, axis=1))
            e = tl.exp(x - m[:, None])  # masked lanes: exp(-inf) = 0; an all -inf row: NaN, as torch
            l = tl.sum(e, axis=1)
            if TAIL_N > 0:
                e_t = tl.exp(x_t - m[:, None])
                l += tl.sum(e_t, axis=1)
            if WRITE_Y:
                # one reciprocal a row, then a multiply per element (a division per element costs
                # several instructions; the product is within an ulp of it)
                inv_l = (1.0 / l)[:, None]
                y = e * inv_l
                if TAIL_N > 0:
                    y_rows = y_ptr + rows[:, None] * stride_ym
                    _store_tile(y_rows + offs_n[None, :], y, row_ok, col_ok, EVEN_M, True)
                    _store_tile(y_rows + offs_t[None, :], e_t * inv_l, row_ok, tail_ok, EVEN_M, False)
                else:
                    y_ptrs = y_ptr + rows[:, None] * stride_ym + offs_n[None, :]
                    _store_tile(y_ptrs, y, row_ok, col_ok, EVEN_M, EVEN_N)
            if WRITE_STATS:
                tl.store(m_ptr + rows, _nan_max(m, l), mask=row_ok)
                tl.store(l_ptr + rows, l, mask=row_ok)
    else:  # online softmax: pass 1 finds (m, l) in one sweep, pass 2 re-reads x and writes y
        rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # (BLOCK_M,)
        row_ok = rows < n_rows
        x_rows = _row_ptrs(x_ptr, rows, n_rows, n_inner, stride_xb, stride_xm, TWO_LEVEL)
        y_rows = y_ptr + rows * stride_ym
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_M], tl.float32)
        for start in tl.range(0, n_cols, BLOCK_N):
            offs = start + offs_n
            x = _load_tile(x_rows[:, None] + offs[None, :], offs < n_cols, float("-inf"), EVEN_N, EVICT_1)
            m_new = tl.maximum(m, tl.max(x, axis=1))
            # a row that has seen only -inf keeps m = -inf; rescaling against it would compute
            # exp(-inf - (-inf)) = NaN, so measure against 0 until a finite value arrives
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            l = l * tl.exp(m - m_ref) + tl.sum(tl.exp(x - m_ref[:, None]), axis=1)
            m = m_new
        if WRITE_Y:
            inv_l = 1.0 / l
            for start in tl.range(0, n_cols, BLOCK_N):
                offs = start + offs_n
                col_ok = offs < n_cols
                x = _load_tile(x_rows[:, None] + offs[None, :], col_ok, float("-inf"), EVEN_N, EVICT_2)
                y = tl.exp(x - m[:, None]) * inv_l[:, None]
                _store_tile(y_rows[:, None] + offs[None, :], y, row_ok, col_ok, EVEN_M, EVEN_N)
        if WRITE_STATS:
            tl.store(m_ptr + rows, _nan_max(m, l), mask=row_ok)
            tl.store(l_ptr + rows, l, mask=row_ok)


@triton.jit
def _softmax_bwd_kernel(
    y_ptr, dy_ptr, dx_ptr, n_rows, n_cols, n_inner, stride_ym, stride_dyb, stride_dym, stride_dxm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_TILE: tl.constexpr, TWO_LEVEL: tl.constexpr,
    EVEN_M: tl.constexpr = False, EVEN_N: tl.constexpr = False, EVICT_1: tl.constexpr = "",
    EVICT_2: tl.constexpr = "", UNIT: tl.constexpr = 1,
):  # fmt: skip
    # dx = y * (dy - sum(dy * y)): a row's dot product first, then one element-wise pass
    n_cols, stride_dyb, stride_dym, stride_ym = _rows_times_unit(n_cols, stride_dyb, stride_dym, stride_ym, UNIT)
    stride_dxm = _times_unit(stride_dxm, UNIT)
    pid = tl.program_id(axis=0)
    rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # (BLOCK_M,)
    row_ok = rows < n_rows
    y_rows = y_ptr + tl.minimum(rows, n_rows - 1) * stride_ym
    # the incoming gradient may be strided (y and dx are the kernels' own)
    dy_rows = _row_ptrs(dy_ptr, rows, n_rows, n_inner, stride_dyb, stride_dym, TWO_LEVEL)
    dx_rows = dx_ptr + rows * stride_dxm
    offs_n = tl.arange(0, BLOCK_N)

    if SINGLE_TILE:  # read y and dy once, write dx once
        col_ok = offs_n < n_cols
        y = _load_tile(y_rows[:, None] + offs_n[None, :], col_ok, 0.0, EVEN_N, "")  # (BLOCK_M, BLOCK_N)
        dy = _load_tile(dy_rows[:, None] + offs_n[None, :], col_ok, 0.0, EVEN_N, "")
        dot = tl.sum(y * dy, axis=1)
        _store_tile(dx_rows[:, None] + offs_n[None, :], y * (dy - dot[:, None]), row_ok, col_ok, EVEN_M, EVEN_N)
    else:  # wide rows: the dot product in one sweep, then y and dy again
        dot = tl.zeros([BLOCK_M], tl.float32)
        for start in tl.range(0, n_cols, BLOCK_N):
            offs = start + offs_n
            y = _load_tile(y_rows[:, None] + offs[None, :], offs < n_cols, 0.0, EVEN_N, EVICT_1)
            dy = _load_tile(dy_rows[:, None] + offs[None, :], offs < n_cols, 0.0, EVEN_N, EVICT_1)
            dot += tl.sum(y * dy, axis=1)
        for start in tl.range(0, n_cols, BLOCK_N):
            offs = start + offs_n
            col_ok = offs < n_cols
            y = _load_tile(y_rows[:, None] + offs[None, :], col_ok, 0.0, EVEN_N, EVICT_2)
            dy = _load_tile(dy_rows[:, None] + offs[None, :], col_ok, 0.0, EVEN_N, EVICT_2)
            _store_tile(dx_rows[:, None] + offs[None, :], y * (dy - dot[:, None]), row_ok, col_ok, EVEN_M, EVEN_N)


# -- layouts and launches ----------------------------------------------------------------------------
def _rows_of(t: torch.Tensor) -> Rows | None:
    """t's rows (:func:`row_layouts`), or None if its leading dimensions need more than two strides."""
    layouts = row_layouts(t)
    return layouts[0] if layouts else None


def _check_input(x, dim, op: str, *, grad: bool) -> Rows:
    check_tensor(x, "x", op=op, contiguous=False, grad=grad, max_numel=None)
    ndim = max(x.dim(), 1)
    if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
        raise KernelInputError(f"{op}: dim={dim!r} is not a dimension of x (shape {tuple(x.shape)}).")
    if dim % ndim != ndim - 1:
        raise KernelInputError(
            f"{op}: this kernel takes the softmax over the last dimension only (dim=-1), got dim={dim} "
            f"for shape {tuple(x.shape)}. Move that dimension last: {op}(x.transpose({dim}, -1)).transpose({dim}, -1)."
        )
    if x.dim() and x.shape[-1] >= INT32_LIMIT:
        raise KernelInputError(f"{op}: rows of {x.shape[-1]} elements; the kernel takes rows of fewer than 2**31.")
    layout = _rows_of(x)
    if layout is not None and layout.n_rows >= INT32_LIMIT - MAX_TILE:
        raise KernelInputError(
            f"{op}: {layout.n_rows} rows; the kernel numbers rows in int32 (fewer than 2**31 - 2**20)."
        )
    if layout is None:
        raise KernelInputError(
            f"{op}: x's leading dimensions (shape {tuple(x.shape)}, strides {x.stride()}) do not merge into "
            f"two row strides, which is all the kernel takes. Pass x.contiguous()."
        )
    return layout


def _block_override(cfg: dict, block_m, block_n, num_warps, n_cols: int, op: str) -> dict:
    cfg = dict(cfg)
    if block_n is not None:  # a tile asked for is the whole tile: no head and tail
        cfg["BLOCK_N"] = check_block(block_n, "block_n", op)
        cfg["SINGLE_TILE"] = n_cols <= cfg["BLOCK_N"]
        cfg.pop("TAIL_N", None)
    if block_m is not None:
        cfg["BLOCK_M"] = check_block(block_m, "block_m", op)
    if num_warps is not None:
        cfg["num_warps"] = check_block(num_warps, "num_warps", op, max_value=32)
    check_tile(cfg["BLOCK_M"], cfg["BLOCK_N"], op=op)
    return cfg


def _launch_flags(r: Rows, cfg: dict) -> dict:
    """Constexprs that follow from the shape: the unmasked paths when the tiles divide the tensor."""
    return {"EVEN_M": r.n_rows % cfg["BLOCK_M"] == 0, "EVEN_N": r.n_cols % cfg["BLOCK_N"] == 0}


def _forward(x: torch.Tensor, r: Rows, cfg: dict) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous, whatever x's strides
    if x.numel() == 0:
        return y
    if cfg.get("SPLIT"):
        return _forward_split(x, y, r, cfg)
    blocks = cdiv(r.n_rows, cfg["BLOCK_M"])
    # persistent programs walk the one-tile path's rows; the online path takes one program a block
    programs = min(blocks, cfg.get("programs") or blocks) if cfg["SINGLE_TILE"] else blocks
    u, n_cols, stride_b, stride_m = in_units(x.dtype, r)
    _softmax_kernel[(programs,)](
        x, y, y, y, r.n_rows, n_cols, r.n_inner, stride_b, stride_m, n_cols,  # (m, l: no stats written)
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], SINGLE_TILE=cfg["SINGLE_TILE"], TWO_LEVEL=r.two_level,
        WRITE_Y=True, WRITE_STATS=False, EVICT_1=cfg.get("EVICT_1", ""), EVICT_2=cfg.get("EVICT_2", ""),
        ROW_STAGES=cfg.get("row_stages", 1), UNIT=u, TAIL_N=cfg.get("TAIL_N", 0) if cfg["SINGLE_TILE"] else 0,
        **_launch_flags(r, cfg), **launch_kwargs(cfg["num_warps"], cfg.get("num_stages"), cfg.get("maxnreg")),
    )  # fmt: skip
    return y


def _backward(y: torch.Tensor, dy: torch.Tensor, cfg: dict | None = None) -> torch.Tensor:
    dy = upstream_grad(dy, y.dtype)  # dtype, a negated view resolved, last stride 1
    layout = _rows_of(dy)
    if layout is None:  # e.g. an expanded gradient (stride 0 everywhere)
        dy = dy.contiguous()
        layout = _rows_of(dy)
    dx = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    if y.numel() == 0:
        return dx
    r = layout
    if cfg is None:
        cfg = softmax_config(r.n_rows, r.n_cols, y.dtype, backward=True)
    u, n_cols, stride_b, stride_m = in_units(y.dtype, r)
    _softmax_bwd_kernel[(cdiv(r.n_rows, cfg["BLOCK_M"]),)](
        y, dy, dx, r.n_rows, n_cols, r.n_inner, n_cols, stride_b, stride_m, n_cols,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], SINGLE_TILE=cfg["SINGLE_TILE"], TWO_LEVEL=r.two_level,
        EVICT_1=cfg.get("EVICT_1", ""), EVICT_2=cfg.get("EVICT_2", ""), UNIT=u, **_launch_flags(r, cfg),
        **launch_kwargs(cfg["num_warps"], cfg.get("num_stages")),
    )  # fmt: skip
    return dx


class SoftmaxFunction(torch.autograd.Function):
    """``softmax`` with its backward: saves y (not x), ``dx = y * (dy - sum(dy * y))`` in one kernel."""

    @staticmethod
    def forward(ctx, x, layout, cfg):
        y = _forward(x, layout, cfg)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return _backward(y, dy), None, None


def softmax(
    x: torch.Tensor, dim: int = -1, *, block_m: int | None = None, block_n: int | None = None,
    num_warps: int | None = None, split: bool = True,
) -> torch.Tensor:  # fmt: skip
    """``softmax(x)`` over the last dimension, fused: one kernel, forward and backward.

    ``y = exp(x - max(x)) / sum(exp(x - max(x)))`` row by row, fp32 arithmetic, y in x's dtype.
    ``x``: any shape ``(..., N)``, fp32/fp16/bf16 (fp32/fp16 in the interpreter), last dimension of
    stride 1, leading dimensions possibly strided. ``dim`` must name the last dimension.
    Trips: rows of up to ``BLOCK_N`` (:func:`softmax_config`): read x, write y; wider rows (online
    softmax): read x twice, write y — on a GPU, rows of up to 64 parts are split across programs
    instead (``SPLIT``), read once. Backward: read y, dy; write dx (wide rows: y, dy twice).
    ``block_m``, ``block_n``, ``num_warps``: override the tile (powers of two); a ``block_n`` below
    the row width forces the online path, and so does ``split=False`` with the online path's own
    tuning. Returns a new contiguous tensor of x's shape.
    """
    layout = _check_input(x, dim, OP, grad=True)
    # a tile asked for is one program a row: start from the schedule that is not split
    split = split and block_n is None
    cfg = softmax_config(layout.n_rows, layout.n_cols, x.dtype, split=split)
    if block_m is not None or block_n is not None or num_warps is not None:
        cfg = _block_override(cfg, block_m, block_n, num_warps, layout.n_cols, OP)
    if x.requires_grad and torch.is_grad_enabled():
        return SoftmaxFunction.apply(x, layout, cfg)
    return _forward(x, layout, cfg)


class SoftmaxStats(NamedTuple):
    m: torch.Tensor  # (...,) fp32/float64: the row max
    l: torch.Tensor  # (...,) the row's sum of exp(x - m)  # noqa: E741


def online_softmax_stats(x: torch.Tensor, block: int | None = None) -> SoftmaxStats:
    """``(m, l)`` per row from the one-pass online recurrence, in fp32, by the Triton kernel.

    For each tile of ``block`` columns: ``m_new = max(m, max(tile))``,
    ``l = l * exp(m - m_new) + sum(exp(tile - m_new))``, ``m = m_new`` (from m = -inf, l = 0). Then
    ``softmax(x) = exp(x - m) / l`` and ``logsumexp(x) = m + log(l)``. ``block``: the tile width (a
    power of two; default: the kernel's online tile); any block gives the same (m, l) up to rounding.
    Returns tensors of shape ``x.shape[:-1]``. No backward.
    """
    op = "online_softmax_stats"
    layout = _check_input(x, -1, op, grad=False)
    if block is not None:
        check_block(block, "block", op)
    cfg = _stats_config(layout.n_rows, layout.n_cols, x.dtype, block, runtime.is_gpu())
    lead = x.shape[:-1] if x.dim() else ()
    m = torch.empty(lead, dtype=torch.float32, device=x.device)
    l = torch.empty(lead, dtype=torch.float32, device=x.device)  # noqa: E741
    if layout.n_rows == 0 or x.numel() == 0:
        return SoftmaxStats(m.fill_(float("-inf")), l.zero_())
    r = layout
    _softmax_kernel[(cdiv(r.n_rows, cfg["BLOCK_M"]),)](
        x, m, m, l, r.n_rows, r.n_cols, r.n_inner, r.stride_b, r.stride_m, 0,
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], TWO_LEVEL=r.two_level, WRITE_Y=False,
        SINGLE_TILE=False, WRITE_STATS=True,  # the recurrence even when the row fits one tile
        **_launch_flags(r, cfg), **launch_kwargs(cfg["num_warps"]),
    )  # fmt: skip
    return SoftmaxStats(m, l)


@answer_key
def online_softmax_reference_blocks(x: torch.Tensor, block: int) -> SoftmaxStats:
    """The online recurrence in float64 torch, ``block`` columns at a time: ``(m, l)`` per row.

    The spec of :func:`online_softmax_stats`, written to be read: one loop step per tile, the running
    max and the rescaled running sum. ``exp(x - m[..., None]) / l[..., None]`` is then the softmax
    (compare it with :func:`softmax_reference` in float64), whatever the block.
    """
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a whole number >= 1, got {block!r}")
    x = x.double()
    lead = x.shape[:-1]
    m = torch.full(lead, float("-inf"), dtype=torch.float64, device=x.device)
    l = torch.zeros(lead, dtype=torch.float64, device=x.device)  # noqa: E741
    for start in range(0, x.shape[-1], block):
        tile = x[..., start : start + block]
        m_new = torch.maximum(m, tile.amax(-1))
        m_ref = torch.where(m_new == float("-inf"), 0.0, m_new)  # as the kernel: no -inf - -inf
        l = l * torch.exp(m - m_ref) + torch.exp(tile - m_ref[..., None]).sum(-1)  # noqa: E741
        m = m_new
    return SoftmaxStats(m, l)
