"""Lesson 4b: residual + dropout + LayerNorm (or RMSNorm) in one kernel, the mask never stored.

A transformer block ends each sub-layer with ``h = residual + dropout(x, p)`` (the residual stream, an
output) and ``y = norm(h) * w (+ b)`` (LayerNorm or RMSNorm: the next sub-layer's input). Eager PyTorch
runs dropout as a kernel that **writes the keep mask** (a byte an element) and reads it again in the
backward, then an add, then the norm. Fused, a row costs read x, residual; write h, y.

**Randomness without memory.** Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
3", SC 2011) is counter-based: ``philox(seed, counter)`` is a pure function (ten rounds of multiply and
xor), so any program can make any element's number, as often as wanted: the backward *regenerates* the
mask. One ``tl.randint4x(seed, counter)`` call gives four 32-bit words, one for each of four neighbouring
elements (ten rounds an element would cost as much time as the bytes on an H100).

**The stream.** Element ``(row, col)`` takes word ``col % 4`` of counter ``offset + row * ceil(N / 4) +
col // 4``: its mask depends on the seed, the offset and its position, never on the tiling. It is kept
when ``(bits >> 1) >= round(p * 2**31)`` (integers: p = 0 keeps everything, exactly) and scaled by
``1 / (1 - p)``. A call uses :func:`philox_counters` counters from ``offset``; two layers (or steps) must
not share a stream. ``seed=None`` draws a fresh 62-bit seed from torch's CPU generator (repeatable under
``torch.manual_seed``; no GPU sync); with an explicit seed, give each layer its own ``offset`` (advanced
by :func:`philox_counters`) or seed. :func:`philox_reference` (``_philox.py``) is Philox in numpy, the tests' spec.

**Numerics.** h is rounded to x's dtype (it is stored, and eager adds in that dtype); the statistics are
fp32 from the rounded h; ``y = (h - mean) * rstd * w + b`` (RMSNorm: ``h * rstd * w``, ``eps`` inside the
square root) in fp32, rounded once. In eval or at p = 0 no number is drawn and h = residual + x exactly.

**Backward** (saved: h, w, one fp32 mean and rstd a row; ``n̂ = (h - mean) rstd``, ``g = dy w``)::

    dh = rstd (g - mean(g) - n̂ mean(g n̂))   (RMSNorm: rstd (g - n̂ mean(g n̂)))  (+ grad_h)
    dresidual = dh;   dx = dh * keep / (1 - p)   (keep regenerated from the seed)
    dw = sum over rows of dy n̂;   db = sum over rows of dy

one kernel reads dy, h (and grad_h), writes dresidual and dx; dw and db are per-program partial sums
added in a fixed order (:func:`fusionlab.kernels._norms.sum_partials`, no atomics). Rows wider than a
tile are walked in tiles: the forward re-reads h twice (variance, then y), the backward dy and h once.

References: Salmon et al.; Triton tutorial 04 (low-memory dropout); flash-attention's
``dropout_add_layer_norm``; apex ``FusedLayerNorm``.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .. import runtime
from ..ledger import Ledger
from ._launch import (
    INT32_LIMIT,
    KernelInputError,
    Launcher,
    Plans,
    _key,
    cdiv,
    check_choice,
    check_overrides,
    check_tensor,
    dram_gbps,
    element_size,
    launch_kwargs,
    next_pow2,
    signature,
    sm_count,
)
from ._norms import check_eps, overridden, sum_partials, wants_grad
from ._philox import dropout_keep_reference, philox_reference  # noqa: F401  (the lesson's and tests' names here)
from ._philox import keep_threshold as _threshold
from ._tensors import upstream_grad

OP = "dropout_norm"
NORMS = ("layernorm", "rmsnorm")


# -- launch configuration ----------------------------------------------------------------------------------
#: The tuning table (tuning/dropout_norm.json): what each key chooses is in its "about", the measurements
#: behind it in benchmarks/notes_lesson4b.md. ``fast_bwd`` is keyed by BLOCK_N.
_TUNING = json.loads((Path(__file__).parent / "tuning" / "dropout_norm.json").read_text())
GPU_TUNING, INTERPRETER_TUNING = _TUNING["gpu"], _TUNING["interpreter"]
GPU_TUNING["fast_bwd"] = {int(n): launch for n, launch in GPU_TUNING["fast_bwd"].items()}


def dropout_norm_config(
    n_rows: int, n_cols: int, dtype: torch.dtype, *, backward: bool = False, gpu=None, device: str | None = None
) -> dict:
    """``{"BLOCK_M", "BLOCK_N", "SINGLE_TILE", "num_warps"(, "programs", "row_stages")}``. BLOCK_N is a
    multiple of 4 (four elements share a Philox call). ``device``: a GPU asked about by name (default: this
    one; :func:`~fusionlab.kernels._launch.dram_gbps`). A copy of a cached answer: a call's host time is
    part of a small call's cost."""
    gpu = runtime.is_gpu() if gpu is None else gpu
    # the backward's special case is chosen by what the GPU can do (its DRAM bandwidth), not by its name
    fast = bool(gpu and backward) and dram_gbps(device) >= GPU_TUNING["fast_dram_gbps"]
    return dict(_config(int(n_rows), int(n_cols), dtype, bool(backward), gpu, fast))


@functools.lru_cache(maxsize=1024)
def _config(n_rows: int, n_cols: int, dtype: torch.dtype, backward: bool, gpu: bool, fast: bool) -> dict:
    t = GPU_TUNING if gpu else INTERPRETER_TUNING
    single = n_cols <= t["max_single"]
    block_n = max(16, next_pow2(n_cols)) if single else t["wide_block"]
    if gpu:
        block_m = 1
        num_warps = max(1, min(32, next_pow2(block_n // t["per_thread"]) // 32))
    else:
        block_m = max(1, min(t["tile"] // block_n, next_pow2(max(n_rows, 1)))) if single else 1
        num_warps = 4
    cfg = {"BLOCK_M": block_m, "BLOCK_N": block_n, "SINGLE_TILE": single, "num_warps": num_warps}
    if fast and single and element_size(dtype) == 2:  # measured with 16-bit rows (fp32 ones stage fewer)
        cfg.update(t["fast_bwd"].get(block_n, {}))
        block_m, num_warps = cfg["BLOCK_M"], cfg["num_warps"]
    if backward:
        cap = sm_count() * max(1, t["warps_per_sm"] // num_warps) if gpu else t["programs"]
        cfg["programs"] = max(1, min(cdiv(max(n_rows, 1), block_m), cap))
        stages = cfg.get("row_stages", t.get("row_stages", 1)) if single else 1
        while stages > 1 and 3 * block_m * block_n * element_size(dtype) * (stages - 1) > t.get("stage_bytes", 0):
            stages -= 1
        cfg["row_stages"] = stages
    return cfg


def _with_overrides(cfg: dict, override, n_cols: int, op: str) -> dict:
    if not check_overrides(override, "fwd_config/bwd_config", op=op):
        return cfg
    cfg = overridden(cfg, override, ("BLOCK_M", "BLOCK_N", "programs", "row_stages"), op)
    if cfg["BLOCK_N"] < 4:
        raise KernelInputError(f"{op}: BLOCK_N={cfg['BLOCK_N']} must be at least 4 (a Philox call serves four).")
    cfg["SINGLE_TILE"] = n_cols <= cfg["BLOCK_N"]
    if not cfg["SINGLE_TILE"]:
        cfg["BLOCK_M"] = 1  # the wide path walks one row at a time
    return cfg


# -- kernels -------------------------------------------------------------------------------------------------
@triton.jit
def _keep(seed, rows, start_q, n_q, offset, threshold, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr,
          INT64: tl.constexpr):  # fmt: skip
    """The keep mask of a ``[BLOCK_M, 4 BLOCK_Q]`` tile of ``rows`` from quad ``start_q``: element
    ``(row, col)`` takes word ``col % 4`` of Philox counter ``offset + row n_q + col // 4``. One
    ``tl.randint4x`` call on a ``[BLOCK_M, BLOCK_Q]`` tile of counters, its words laid into the row as
    r0 r1 r2 r3 by ``join`` + ``reshape``: the row stays a plain 2-D tile of 16-byte vectors (a
    ``[BLOCK_M, BLOCK_Q, 4]`` tile would show the compiler runs of four elements: 8 bytes of bf16)."""
    r = rows[:, None]
    if INT64:
        r = r.to(tl.int64)
    ctr = offset + r * n_q + start_q + tl.arange(0, BLOCK_Q)[None, :]
    r0, r1, r2, r3 = tl.randint4x(seed, ctr)
    bits = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), [BLOCK_M, 4 * BLOCK_Q])
    # (bits >> 1) >= round(p 2**31) as one unsigned compare, bits >= 2 round(p 2**31) (< 2**32): p = 0 keeps all
    return bits >= threshold.to(tl.uint32) * 2


@triton.jit
def _h_tile(x_ptr, r_ptr, h_ptr, rows, rows2, start_q, cols, mask, n_q, offset, stride_x, stride_r, stride_h,
            seed, threshold, scale, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, DROPOUT: tl.constexpr,
            INT64: tl.constexpr):  # fmt: skip
    """One tile of ``h = residual + dropout(x)``, stored in h's dtype and returned in fp32."""
    x = tl.load(x_ptr + rows2 * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + rows2 * stride_r + cols, mask=mask, other=0.0).to(tl.float32)
    if DROPOUT:
        x = tl.where(_keep(seed, rows, start_q, n_q, offset, threshold, BLOCK_M, BLOCK_Q, INT64), x * scale, 0.0)
    h = (r + x).to(h_ptr.dtype.element_ty)  # h is stored: statistics come from the rounded value
    tl.store(h_ptr + rows2 * stride_h + cols, h, mask=mask)
    return h.to(tl.float32)


@triton.jit(do_not_specialize=["seed", "offset"])  # a fresh seed every call: never a recompile
def _dropout_norm_fwd_kernel(
    x_ptr, r_ptr, w_ptr, b_ptr, h_ptr, y_ptr, mean_ptr, rstd_ptr,
    n_rows, n_cols, stride_x, stride_r, seed, offset, threshold, scale, eps,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, SINGLE_TILE: tl.constexpr, RMS: tl.constexpr,
    HAS_BIAS: tl.constexpr, DROPOUT: tl.constexpr, INT64: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < n_rows
    rows2 = rows[:, None]
    if INT64:
        rows2 = rows2.to(tl.int64)
    n_q = (n_cols + 3) // 4
    tile = tl.arange(0, 4 * BLOCK_Q)[None, :]
    if SINGLE_TILE:
        cols = tile
        mask = row_ok[:, None] & (cols < n_cols)
        h = _h_tile(x_ptr, r_ptr, h_ptr, rows, rows2, 0, cols, mask, n_q, offset, stride_x, stride_r, n_cols,
                    seed, threshold, scale, BLOCK_M, BLOCK_Q, DROPOUT, INT64)  # fmt: skip
        mean = tl.zeros([BLOCK_M], dtype=tl.float32) if RMS else tl.sum(h, axis=1) / n_cols
        d = h if RMS else tl.where(mask, h - mean[:, None], 0.0)
        rstd = tl.rsqrt(tl.sum(d * d, axis=1) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        y = d * rstd[:, None] * w
        if HAS_BIAS:
            y += tl.load(b_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        tl.store(y_ptr + rows2 * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        # a row wider than a tile: pass 1 writes h and sums it; pass 2 re-reads h for the variance
        # (two passes, not E[h²] - mean²: no cancellation); pass 3 re-reads h and writes y
        acc = tl.zeros([BLOCK_M, 4 * BLOCK_Q], dtype=tl.float32)
        for start_q in range(0, n_q, BLOCK_Q):
            cols = start_q * 4 + tile
            mask = row_ok[:, None] & (cols < n_cols)
            acc += _h_tile(x_ptr, r_ptr, h_ptr, rows, rows2, start_q, cols, mask, n_q, offset, stride_x, stride_r,
                           n_cols, seed, threshold, scale, BLOCK_M, BLOCK_Q, DROPOUT, INT64)  # fmt: skip
        mean = tl.zeros([BLOCK_M], dtype=tl.float32) if RMS else tl.sum(acc, axis=1) / n_cols
        acc = tl.zeros([BLOCK_M, 4 * BLOCK_Q], dtype=tl.float32)
        for start_q in range(0, n_q, BLOCK_Q):
            cols = start_q * 4 + tile
            mask = row_ok[:, None] & (cols < n_cols)
            h = tl.load(h_ptr + rows2 * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
            d = tl.where(mask, h - mean[:, None], 0.0)
            acc += d * d
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / n_cols + eps)
        for start_q in range(0, n_q, BLOCK_Q):
            cols = start_q * 4 + tile
            mask = row_ok[:, None] & (cols < n_cols)
            h = tl.load(h_ptr + rows2 * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            y = (h - mean[:, None]) * rstd[:, None] * w
            if HAS_BIAS:
                y += tl.load(b_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
            tl.store(y_ptr + rows2 * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(mean_ptr + rows, mean, mask=row_ok)
    tl.store(rstd_ptr + rows, rstd, mask=row_ok)


@triton.jit(do_not_specialize=["seed", "offset"])
def _dropout_norm_bwd_kernel(
    dy_ptr, gh_ptr, h_ptr, w_ptr, mean_ptr, rstd_ptr, dr_ptr, dx_ptr, part_ptr,
    n_rows, n_cols, rows_per_program, seed, offset, threshold, scale,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, SINGLE_TILE: tl.constexpr, RMS: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_GH: tl.constexpr, DROPOUT: tl.constexpr, INT64: tl.constexpr,
    NUM_STAGES: tl.constexpr, EVEN: tl.constexpr,
):  # fmt: skip
    # EVEN: N fills the tile, so the column test is against a constant and folds away; HAS_BIAS: db summed
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    n_q = (n_cols + 3) // 4
    tile = tl.arange(0, 4 * BLOCK_Q)
    if SINGLE_TILE:
        cols = tile[None, :]
        col_ok = cols < (4 * BLOCK_Q if EVEN else n_cols)
        w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK_M, 4 * BLOCK_Q], dtype=tl.float32)
        db = tl.zeros([BLOCK_M, 4 * BLOCK_Q], dtype=tl.float32)
        # NUM_STAGES > 1: the next rows' dy, h (and grad_h) are loaded while this row computes
        for m0 in tl.range(row_start, row_end, BLOCK_M, num_stages=NUM_STAGES):
            rows = m0 + tl.arange(0, BLOCK_M)
            row_ok = rows < row_end
            rows2 = rows[:, None]
            if INT64:
                rows2 = rows2.to(tl.int64)
            mask = row_ok[:, None] & col_ok
            at = rows2 * n_cols + cols  # one offset for all five row-contiguous tensors (fewer registers)
            dy = tl.load(dy_ptr + at, mask=mask, other=0.0).to(tl.float32)
            h = tl.load(h_ptr + at, mask=mask, other=0.0).to(tl.float32)
            mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)[:, None]
            rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)[:, None]
            nh = tl.where(mask, (h - mean) * rstd, 0.0)
            g = dy * w
            c1 = (tl.sum(g * nh, axis=1) / n_cols)[:, None]
            if RMS:
                dh = rstd * (g - nh * c1)
            else:
                c2 = (tl.sum(g, axis=1) / n_cols)[:, None]
                dh = rstd * (g - c2 - nh * c1)
            if HAS_GH:
                dh += tl.load(gh_ptr + at, mask=mask, other=0.0).to(tl.float32)
            tl.store(dr_ptr + at, dh.to(dr_ptr.dtype.element_ty), mask=mask)
            if DROPOUT:  # the forward's mask, regenerated from (seed, offset, position): never read
                keep = _keep(seed, rows, 0, n_q, offset, threshold, BLOCK_M, BLOCK_Q, INT64)
                dh = tl.where(keep, dh * scale, 0.0)
            tl.store(dx_ptr + at, dh.to(dx_ptr.dtype.element_ty), mask=mask)
            dw += dy * nh
            if HAS_BIAS:
                db += dy
        tl.store(part_ptr + pid * n_cols + tile, tl.sum(dw, axis=0), mask=tile < n_cols)
        if HAS_BIAS:
            tl.store(part_ptr + (n_programs + pid) * n_cols + tile, tl.sum(db, axis=0), mask=tile < n_cols)
    else:
        # rows wider than a tile, one at a time: pass 1 sums g n̂ (and g), pass 2 writes dh and dx and
        # adds dy n̂, dy into this program's own (zeroed) rows of the partial-sum buffer
        for row in range(row_start, row_end):
            rows = row + tl.arange(0, 1)
            rows2 = rows[:, None]
            if INT64:
                rows2 = rows2.to(tl.int64)
            mean = tl.load(mean_ptr + rows)[:, None]
            rstd = tl.load(rstd_ptr + rows)[:, None]
            a1 = tl.zeros([1, 4 * BLOCK_Q], dtype=tl.float32)
            a2 = tl.zeros([1, 4 * BLOCK_Q], dtype=tl.float32)
            for start_q in range(0, n_q, BLOCK_Q):
                cols = start_q * 4 + tile[None, :]
                mask = cols < n_cols
                dy = tl.load(dy_ptr + rows2 * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
                h = tl.load(h_ptr + rows2 * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
                g = dy * w
                a1 += g * tl.where(mask, (h - mean) * rstd, 0.0)
                a2 += g
            c1 = (tl.sum(a1, axis=1) / n_cols)[:, None]
            c2 = (tl.sum(a2, axis=1) / n_cols)[:, None]
            for start_q in range(0, n_q, BLOCK_Q):
                cols = start_q * 4 + tile[None, :]
                mask = cols < n_cols
                dy = tl.load(dy_ptr + rows2 * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
                h = tl.load(h_ptr + rows2 * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
                nh = tl.where(mask, (h - mean) * rstd, 0.0)
                g = dy * w
                dh = rstd * (g - nh * c1) if RMS else rstd * (g - c2 - nh * c1)
                if HAS_GH:
                    dh += tl.load(gh_ptr + rows2 * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
                tl.store(dr_ptr + rows2 * n_cols + cols, dh.to(dr_ptr.dtype.element_ty), mask=mask)
                if DROPOUT:
                    keep = _keep(seed, rows, start_q, n_q, offset, threshold, 1, BLOCK_Q, INT64)
                    dh = tl.where(keep, dh * scale, 0.0)
                tl.store(dx_ptr + rows2 * n_cols + cols, dh.to(dx_ptr.dtype.element_ty), mask=mask)
                pw = part_ptr + pid * n_cols + cols
                pb = part_ptr + (n_programs + pid) * n_cols + cols
                tl.store(pw, tl.load(pw, mask=mask, other=0.0) + dy * nh, mask=mask)
                if HAS_BIAS:
                    tl.store(pb, tl.load(pb, mask=mask, other=0.0) + dy, mask=mask)


# -- launchers ----------------------------------------------------------------------------------------------
_launch_fwd = Launcher(_dropout_norm_fwd_kernel)
_launch_bwd = Launcher(_dropout_norm_bwd_kernel)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """t as (rows, N) with unit column stride: a view where one exists (row-strided, expanded), else a copy."""
    n = t.shape[-1]
    if t.dim() and n > 1 and t.stride(-1) != 1:
        t = t.contiguous()
    try:
        return t.view(-1, n) if t.dim() != 2 else t
    except RuntimeError:
        return t.contiguous().view(-1, n)


def _needs_int64(n_rows: int, n_cols: int, offset: int, *strides: int) -> bool:
    last = max(n_cols, *strides) * max(n_rows, 1) + n_cols
    return last >= INT32_LIMIT or offset + n_rows * cdiv(n_cols, 4) >= INT32_LIMIT


def _widths(args, seed_at) -> list:
    """``args`` with the seed's and offset's values (``args[seed_at]``, ``args[seed_at + 1]``) replaced by
    ones of their width (int32 or int64): what the launcher's key sees of them, so that a fresh seed every
    call hits the compiled kernel."""
    rep = list(args)
    for i in (seed_at, seed_at + 1):
        rep[i] = 2**40 if args[i] >= 2**31 else 2
    return rep


def _call(launcher, grid, args, seed_at, kwargs):
    """Launch with a cache key that ignores the seed's and offset's values but not their width
    (:func:`_widths`)."""
    launcher(grid, *args, key=(_key(_widths(args, seed_at)), tuple(kwargs.items())), **kwargs)


def _row_stride(t: torch.Tensor) -> int | None:
    """The row stride of a checked ``t`` (its last dimension of stride 1, or of size 1) seen as (rows, N)
    as :func:`_rows` sees it, or None where no view exists (rows that do not merge): :func:`_rows` copies
    it then, into rows of N."""
    if t.dim() == 2:
        return t.stride(0)
    try:
        return t.view(-1, t.shape[-1]).stride(0)
    except RuntimeError:
        return None


class _Plan:
    """What :func:`dropout_norm` works out for a checked call before its forward launches: the outputs'
    shape (a plain tuple: ``torch.empty(size=...)`` takes it fastest), dtype and device; the rows (x and
    the residual copied where no (rows, N) view exists, ``copies``), the grid and int arguments; the
    threshold and scale of p; the constexprs for int32 and int64 offsets (``kwargs[int64]``) and the
    launcher's interned key by the seed's and offset's widths (``keys``); what the backward needs. The
    forward reads nothing of its tensors but their data pointers (x and the residual as they came, their
    row strides planned), so a call of the same signature (:data:`_PLANS`) runs it on its own tensors with
    its own eps, seed and offset. ``bwd_cfg``: the backward's configuration when an override gave one
    (None: the default, looked up when a gradient is asked for)."""

    __slots__ = ("shape", "dtype", "device", "n_rows", "n_cols", "grid", "copies", "ints", "scale", "kwargs", "keys",
                 "wide", "counters", "grad", "p", "norm", "dropout", "has_bias", "bwd_cfg")  # fmt: skip


def _fwd_kwargs(cfg: dict, norm: str, has_bias: bool, dropout: bool, int64: bool) -> dict:
    return dict(
        BLOCK_M=cfg["BLOCK_M"], BLOCK_Q=cfg["BLOCK_N"] // 4, SINGLE_TILE=cfg["SINGLE_TILE"],
        RMS=norm == "rmsnorm", HAS_BIAS=has_bias, DROPOUT=dropout, INT64=int64, **launch_kwargs(cfg["num_warps"]),
    )  # fmt: skip


def _plan(x, residual, weight, bias, p, norm, dropout, fwd_config, bwd_config, op) -> _Plan:
    """The :class:`_Plan` of a call whose arguments passed :func:`dropout_norm`'s checks (x with N > 0)."""
    n_cols = x.shape[-1]
    n_rows = x.numel() // n_cols
    cfg = _with_overrides(dropout_norm_config(n_rows, n_cols, x.dtype), fwd_config, n_cols, op)
    plan = _Plan()
    # an override of the backward's configuration is checked now, as the forward's is
    plan.bwd_cfg = None
    if bwd_config is not None:
        plan.bwd_cfg = _with_overrides(
            dropout_norm_config(n_rows, n_cols, x.dtype, backward=True), bwd_config, n_cols, op
        )
    stride_x, stride_r = _row_stride(x), _row_stride(residual)
    plan.copies = (stride_x is None, stride_r is None)
    stride_x = n_cols if stride_x is None else stride_x
    stride_r = n_cols if stride_r is None else stride_r
    plan.shape, plan.dtype, plan.device = tuple(x.shape), x.dtype, x.device
    plan.n_rows, plan.n_cols = n_rows, n_cols
    plan.grid = (cdiv(n_rows, cfg["BLOCK_M"]),) if n_rows else None
    plan.ints = (n_rows, n_cols, stride_x, stride_r)
    plan.scale = (_threshold(p), 1.0 / (1.0 - p))
    plan.kwargs = tuple(_fwd_kwargs(cfg, norm, bias is not None, dropout, int64) for int64 in (False, True))
    plan.keys = {}
    # int64 offsets: _needs_int64 with the offset split off (the offset's part is the call's, below)
    plan.wide = _needs_int64(n_rows, n_cols, 0, stride_x, stride_r)
    plan.counters = n_rows * cdiv(n_cols, 4)
    plan.grad = wants_grad(x, residual, weight, bias)
    plan.p, plan.norm, plan.dropout, plan.has_bias = p, norm, dropout, bias is not None
    return plan


def _forward(plan: _Plan, x, residual, weight, bias, eps, seed, offset, device=None, stats: bool = True):
    """``(y, h, mean, rstd)`` of ``plan``'s forward on these tensors (y, h in x's shape), its stream at
    ``seed`` and ``offset``. ``device``: the current CUDA device when the caller knows it. ``stats=False``
    (no backward will read them): mean and rstd are one buffer, each row's two values stored to one place
    and never read (one allocation less: a ``torch.empty`` costs a GPU host 2.6-2.8 us,
    benchmarks/notes_lesson9.md, 2026-11-27, the decode ops' host time on the GPU)."""
    y = torch.empty(size=plan.shape, dtype=plan.dtype, device=plan.device)
    h = torch.empty(size=plan.shape, dtype=plan.dtype, device=plan.device)
    mean = torch.empty(plan.n_rows, dtype=torch.float32, device=plan.device)
    rstd = torch.empty(plan.n_rows, dtype=torch.float32, device=plan.device) if stats else mean
    if plan.grid is None:  # no row
        return y, h, mean, rstd
    copy_x, copy_r = plan.copies
    args = (
        x.contiguous() if copy_x else x, residual.contiguous() if copy_r else residual, weight,
        bias if bias is not None else weight, h, y, mean, rstd, *plan.ints, seed, offset, *plan.scale, eps,
    )  # fmt: skip
    int64 = plan.wide or offset + plan.counters >= INT32_LIMIT
    kwargs = plan.kwargs[int64]
    # the launcher's key by what the plan leaves to the call (the seed's and offset's widths); the fresh
    # outputs are aligned, as are copies (torch's allocators: 64 bytes and more)
    widths = (seed >= 2**31, offset >= 2**31, int64)
    key = plan.keys.get(widths)
    if key is None:
        key = plan.keys[widths] = _launch_fwd.spec_key(_widths(args, 12), kwargs)
    _launch_fwd.launch(plan.grid, args, kwargs, key, device)
    return y, h, mean, rstd


def _backward(dy, gh, h, weight, mean, rstd, p, norm, dropout, seed, offset, cfg, has_bias):
    n_rows, n_cols = h.shape
    dr, dx = torch.empty_like(h), torch.empty_like(h)
    if h.numel() == 0:
        z = torch.zeros(n_cols, dtype=weight.dtype, device=h.device)
        return dx, dr, z, z.clone()
    # dy and grad_h row-contiguous, as h, dr and dx are: the kernel addresses all five with one offset
    dy2 = torch.zeros_like(h) if dy is None else _rows(upstream_grad(dy, h.dtype)).contiguous()
    gh2 = _rows(upstream_grad(gh, h.dtype)).contiguous() if gh is not None else None
    bm = cfg["BLOCK_M"]
    rows_per_program = cdiv(cdiv(n_rows, cfg["programs"]), bm) * bm
    programs = cdiv(n_rows, rows_per_program)
    alloc = torch.empty if cfg["SINGLE_TILE"] else torch.zeros  # the wide path adds into its rows
    part = alloc((2 if has_bias else 1, programs, n_cols), dtype=torch.float32, device=h.device)
    args = (
        dy2, gh2 if gh2 is not None else dy2, h, weight, mean, rstd, dr, dx, part,
        n_rows, n_cols, rows_per_program, seed, offset, _threshold(p), 1.0 / (1.0 - p),
    )  # fmt: skip
    kwargs = dict(
        BLOCK_M=bm, BLOCK_Q=cfg["BLOCK_N"] // 4, SINGLE_TILE=cfg["SINGLE_TILE"], RMS=norm == "rmsnorm",
        HAS_BIAS=has_bias, HAS_GH=gh2 is not None, DROPOUT=dropout, INT64=_needs_int64(n_rows, n_cols, offset, n_cols),
        NUM_STAGES=cfg.get("row_stages", 1) if runtime.is_gpu() else 1, EVEN=n_cols == cfg["BLOCK_N"],
        **launch_kwargs(cfg["num_warps"]),
    )  # fmt: skip
    _call(_launch_bwd, (programs,), args, 12, kwargs)
    sums = sum_partials(part, weight.dtype, checked=True)
    return dx, dr, sums[0], (sums[1] if has_bias else None)


# -- the autograd Function and the entry ---------------------------------------------------------------------
class DropoutNormFunction(torch.autograd.Function):
    """Saves h, w, mean and rstd, and the seed and offset: the mask is regenerated, never saved."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, call):
        plan, eps, seed, offset, device = call
        y, h, mean, rstd = _forward(plan, x, residual, weight, bias, eps, seed, offset, device)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(h, weight, mean, rstd)
        ctx.stream = (plan, seed, offset)
        return y, h

    @staticmethod
    def backward(ctx, dy, gh):
        h, weight, mean, rstd = ctx.saved_tensors
        plan, seed, offset = ctx.stream
        if dy is None and gh is None:
            return None, None, None, None, None
        rows, n = plan.n_rows, plan.n_cols
        # the backward's configuration, looked up only now that a gradient is asked for
        cfg = plan.bwd_cfg if plan.bwd_cfg is not None else dropout_norm_config(rows, n, h.dtype, backward=True)
        dx, dr, dw, db = _backward(dy, gh, h.view(rows, n), weight, mean, rstd, plan.p, plan.norm, plan.dropout, seed,
                                   offset, cfg, plan.has_bias)  # fmt: skip
        return dx.view(plan.shape), dr.view(plan.shape), dw, db, None


def philox_counters(shape) -> int:
    """Philox counters one call on a tensor of ``shape`` uses: ``rows * ceil(N / 4)``. The next layer's
    stream starts that far on (its ``offset``) when the seed is shared."""
    shape = tuple(shape)
    n = shape[-1] if shape else 1
    rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
    return rows * cdiv(n, 4)


def new_seed() -> int:
    """A fresh 62-bit Philox seed from torch's default CPU generator (repeatable under ``torch.manual_seed``;
    no GPU sync)."""
    return int(torch.randint(0, 2**62, (1,), dtype=torch.int64).item())


def _check_p(p, op: str) -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p) or not 0 <= p < 1:
        raise KernelInputError(
            f"{op}: p={p!r} must be a number in [0, 1): the probability of dropping an element (p = 1 would "
            "drop everything and scale by 1 / 0)."
        )
    return float(p)


def _check_int(v, name: str, op: str, limit: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < limit:
        raise KernelInputError(f"{op}: {name}={v!r} must be a whole number in [0, {limit}).")
    return v


def _stream(seed, offset, op: str) -> tuple[int, int]:
    """The call's ``(seed, offset)``: a fresh seed for None, each checked (on every call: no plan keeps them)."""
    seed = new_seed() if seed is None else _check_int(seed, "seed", op, 2**63)
    return seed, _check_int(offset, "offset", op, 2**62)


def _run(plan: _Plan, x, residual, weight, bias, eps, seed, offset, device=None):
    """``(y, h)``: ``plan`` on these tensors, through autograd where the plan's call records a gradient.
    The kernels index vectors with unit stride: a strided weight or bias is copied (N elements; through
    autograd, so its gradient reaches the caller's tensor)."""
    if not weight.is_contiguous():
        weight = weight.contiguous()
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()
    if plan.grad:
        return DropoutNormFunction.apply(x, residual, weight, bias, (plan, eps, seed, offset, device))
    y, h, _, _ = _forward(plan, x, residual, weight, bias, eps, seed, offset, device, stats=False)
    return y, h


def dropout_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, p: float = 0.1,
    *, norm: str = "layernorm", eps: float = 1e-5, training: bool = True, seed: int | None = None, offset: int = 0,
    fwd_config: dict | None = None, bwd_config: dict | None = None,
):  # fmt: skip
    """``h = residual + dropout(x, p)``, ``y = norm(h) * w (+ b)`` in one kernel; returns ``(y, h)``.

    ``x``, ``residual``: the same shape ``(..., N)`` and dtype (fp32/fp16/bf16; no bf16 in the
    interpreter), last dimension of stride 1. ``weight`` (and ``bias``, LayerNorm only): ``(N,)``.
    ``norm``: ``"layernorm"`` or ``"rmsnorm"``. ``p`` in [0, 1). ``training=False`` (or p = 0): no
    dropout, ``h = residual + x``. ``seed=None`` draws a fresh stream (:func:`new_seed`); pass
    ``seed``/``offset`` to choose it (the module docstring says how streams are laid out and how to keep
    two layers apart). Differentiable in x, residual, weight, bias; the backward regenerates the mask.
    ``fwd_config``/``bwd_config``: overrides of :func:`dropout_norm_config` (``BLOCK_M``, ``BLOCK_N``,
    ``programs``) for tests and tuning; the mask does not depend on them.

    A call whose tensors' signature (:func:`~fusionlab.kernels._launch.signature`), p, eps, norm and
    training equal those of a call that passed every check, without overrides, skips the checks and
    launches that call's plan (:data:`_PLANS`); its seed and offset are its own, checked every call.
    """
    op = OP
    key = device = None
    # options exactly of their types (a bool p or eps, a str subclass, a list go the full path, which says
    # what is wrong); p 0 and 0.0, eps 1 and 1.0 may share a plan: the launch takes them as floats either way
    if (fwd_config is None and bwd_config is None and type(norm) is str and type(training) is bool
            and type(p) in (float, int) and type(eps) in (float, int)):  # fmt: skip
        sig = signature(x, residual, weight, bias)
        if sig is not None:
            key, device = (sig, p, eps, norm, training), sig[1]
            plan = _PLANS.get(key)
            if plan is not None:  # a call of this signature and these options passed every check: its plan
                seed, offset = _stream(seed, offset, op)
                return _run(plan, x, residual, weight, bias, float(eps), seed, offset, device)
    norm = check_choice(norm, NORMS, "norm", op=op)
    p = _check_p(p, op)
    eps = check_eps(eps, op)
    if not isinstance(training, bool):
        raise KernelInputError(f"{op}: training={training!r} must be True or False.")
    check_tensor(x, "x", op=op, contiguous=False, grad=True, max_numel=None)
    check_tensor(residual, "residual", op=op, contiguous=False, grad=True, max_numel=None)
    if x.dim() < 1:
        raise KernelInputError(f"{op}: x must have at least one dimension (..., N), got a scalar.")
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise KernelInputError(
            f"{op}: residual must have x's shape and dtype, got {tuple(residual.shape)} {residual.dtype} for x "
            f"{tuple(x.shape)} {x.dtype}."
        )
    n = x.shape[-1]
    if bias is not None and norm == "rmsnorm":
        raise KernelInputError(f"{op}: RMSNorm takes no bias.")
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            check_tensor(t, name, op=op, ndim=1, contiguous=False, grad=True, max_numel=None)
            if t.shape[0] != n:
                raise KernelInputError(f"{op}: {name} has {t.shape[0]} elements; x's rows have {n}.")
    seed, offset = _stream(seed, offset, op)
    if n == 0:
        e = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        return e, e.clone()
    plan = _plan(x, residual, weight, bias, p, norm, training and p > 0, fwd_config, bwd_config, op)
    if key is not None:
        _PLANS.put(key, plan)
    return _run(plan, x, residual, weight, bias, eps, seed, offset, device)


#: dropout_norm's plans by call signature and options (a training step calls it with the same few every
#: step; at 4096 rows its host path cost more than its kernel: benchmarks/notes_lesson4b.md, 2026-11-27,
#: the forward's plans by signature)
_PLANS = Plans()


# -- references: the op in fp32 (its mask from Philox in numpy, _philox.py), eager PyTorch; the ledger ------
def dropout_norm_reference(
    x, residual, weight, bias=None, p: float = 0.1, *, norm="layernorm", eps=1e-5, training=True, seed=0, offset=0
):
    """The spec in fp32 (float64 for float64 inputs): ``(y, h)`` with the kernel's mask for ``seed``."""
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf, rf = x.to(wide), residual.to(wide)
    if training and p > 0:
        keep = dropout_keep_reference(x.shape, p, seed, offset).to(x.device)
        xf = torch.where(keep, xf / (1 - p), torch.zeros((), dtype=wide, device=x.device))
    h = (rf + xf).to(x.dtype)
    hf = h.to(wide)
    if norm == "rmsnorm":
        y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps) * weight.to(wide)
    else:
        b = bias.to(wide) if bias is not None else None
        y = F.layer_norm(hf, (x.shape[-1],), weight.to(wide), b, eps)
    return y.to(x.dtype), h


def dropout_norm_eager(x, residual, weight, bias=None, p: float = 0.1, *, norm="layernorm", eps=1e-5, training=True):
    """What eager PyTorch runs: ``F.dropout`` (a kernel that writes the mask), an add, then the norm
    (``F.layer_norm``, or the op-by-op RMSNorm of Hugging Face's ``LlamaRMSNorm``)."""
    h = residual + F.dropout(x, p, training)
    if norm == "rmsnorm":
        hf = h.float()
        y = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(h.dtype) * weight
        return y.to(h.dtype), h
    return F.layer_norm(h, (h.shape[-1],), weight, bias, eps), h


def dropout_norm_ledger(
    rows: int, n: int, dtype, *, norm="layernorm", backward: bool = False, grad_h: bool = True
) -> Ledger:
    """Trips of a training step's residual + dropout + norm, eager and fused (w, b: ``n`` each).

    Eager forward: dropout reads x, writes its output and the keep mask (1 byte); the add reads it and
    the residual, writes h; the norm reads h, writes y (LayerNorm one kernel; RMSNorm's op-by-op
    kernels counted as one here, a lower bound). Fused: read x, residual; write h, y, and fp32 mean
    and rstd a row. Backward, eager: the norm's backward reads dy, h, writes dh; dropout's backward
    reads dh and the mask, writes dx (dresidual is dh itself). Fused: read dy, h, mean, rstd; write
    dresidual, dx — the mask regenerated, never read. ``grad_h``: h feeds the next block too (the
    residual stream), so its own gradient arrives and is added to dh (eager: one more add kernel)."""
    rows, n = int(rows), int(n)
    rn = rows * n
    sizes = {"mask": 1, "mean": 4, "rstd": 4}
    if not backward:
        led = Ledger(dtype_bytes=dtype, sizes=sizes, outputs=("h", "y", "mean", "rstd"))
        led.op("dropout", reads={"x": rn}, writes={"xd": rn, "mask": rn})
        led.op("add", reads={"xd": rn, "residual": rn}, writes={"h": rn})
        b = n if norm == "layernorm" else 0
        led.op(norm, reads={"h": rn, "w": n, "b": b}, writes={"y": rn, "mean": rows, "rstd": rows})
        return led
    out = "dh2" if grad_h else "dh"
    led = Ledger(dtype_bytes=dtype, sizes=sizes, outputs=(out, "dx"), recomputed=("mask",))
    led.op(f"{norm}_bwd", reads={"dy": rn, "h": rn, "w": n, "mean": rows, "rstd": rows}, writes={"dh": rn})
    if grad_h:
        led.op("add grad_h", reads={"dh": rn, "grad_h": rn}, writes={"dh2": rn})
    led.op("dropout_bwd", reads={out: rn, "mask": rn}, writes={"dx": rn})
    return led
