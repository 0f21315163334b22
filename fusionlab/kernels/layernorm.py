"""Lesson 4: LayerNorm in one kernel, forward and backward.

``y = (x - mean) * rsqrt(var + eps) * w + b`` over the last dimension, ``mean`` and the biased
``var`` of each row. Eager PyTorch's ``F.layer_norm`` is itself one fused kernel (read x, w, b; write
y); written out in torch ops it is about nine (``layernorm_ledger(..., naive=True)``). Fused trips:
read x (and w, b, shared by every row and served from L2), write y — plus mean and rstd (one fp32
each a row) when autograd needs them.

**Numerics.** Statistics in fp32 whatever the storage, y rounded once. The variance is never
``E[x²] - E[x]²``: for ``x = 1e4 + randn`` both terms are ~1e8 and fp32 keeps ~7 digits of each, so
the difference (~1) is lost to rounding. Every row is first shifted by its own first element ``x0``
(``x - x0`` is exact for values near x0, so a row far from 0 keeps its small digits even in the
mean: summing ~1e4-sized values in fp32 would lose ~1e-3 of the mean); then a row held in one tile
is centred (two passes over registers: the mean, then the mean of ``(x - mean)²``). A row wider than
one tile is walked in tiles, each tile centred on its own mean, and the tiles' ``(count, mean, M2)``
are combined with Chan, Golub & LeVeque's parallel formula (``delta = mean_b - mean_a``,
``M2 = M2_a + M2_b + delta² n_a n_b / n``): numerically the two-pass result, in one pass; pass 2 then
re-reads x to write y (the ledger's re-read term). ``eps`` is added to the variance, inside the root.
The saved "mean" is ``mean - x0`` (one fp32 a row, as a mean): backward computes
``(x - x0) - (mean - x0)`` and keeps those digits too. Measured on the CPU (x = 1e4 + randn, fp32):
max error of y against float64 5e-7, where ``F.layer_norm`` in fp32 gives 1e-3 to 0.3 (three-element
rows) and ``E[x²] - E[x]²`` gives 1e3.

**Backward** (saved: x, w, mean (as ``mean - x0``) and rstd; ``xhat = (x - mean) rstd``, ``g = dy w``)::

    dx = rstd (g - mean(g) - xhat mean(g xhat));   dw = sum over rows of dy xhat;   db = sum of dy

dx in one kernel per block of rows (read dy, x, w, mean, rstd; write dx); dw and db as in
:mod:`fusionlab.kernels.rmsnorm`: each of P programs writes its rows' partial sums into a
``(2, P, N)`` fp32 buffer and a second small kernel sums the P rows in a fixed order —
deterministic, no atomics (their order of arrival would change the rounding from run to run).

Layout, int64 row offsets, wide rows and the few-rows limit: as :mod:`fusionlab.kernels.rmsnorm`.
``weight`` is required, ``bias`` may be None; both in x's dtype or fp32 (the same dtype).

References: Ba, Kiros & Hinton, "Layer Normalization" (2016); Triton tutorial 05 (layer norm);
Chan, Golub & LeVeque, "Algorithms for computing the sample variance" (1983); Welford (1962).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents  # PDL (sm_90): see pdl_supported

from .._exercise import answer_key
from ..ledger import Ledger
from ._launch import KernelInputError, Launcher, cdiv, check_tensor, pdl_supported
from ._norms import INTERPRETER_TUNING as NORM_INTERPRETER_TUNING
from ._norms import (
    backward_buffers,
    backward_flags,
    cached_config,
    check_norm,
    configs_with_overrides,
    eager_steps,
    forward_flags,
    gpu_and_sms,
    sum_partials,
    wants_grad,
)
from ._rows import _row_offsets, grad_rows

OP = "layernorm"


# -- spec, eager, ledger, flops ------------------------------------------------------------------------
@answer_key
def layernorm_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5):
    """The spec: ``F.layer_norm`` over the last dimension in float64 arithmetic, returned in x's dtype
    (on float64 inputs: the exact LayerNorm, differentiable, for gradient checks)."""
    n = x.shape[-1]
    b = None if bias is None else bias.double()
    return F.layer_norm(x.double(), (n,), weight.double(), b, eps).to(x.dtype)


def layernorm_eager(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, eps: float = 1e-5):
    """What eager PyTorch runs: ``F.layer_norm(x, (N,), weight, bias, eps)``, one fused kernel (a
    weight of another dtype than x is cast to x's dtype first, as a model in that dtype holds it)."""
    if weight.dtype != x.dtype:
        weight = weight.to(x.dtype)
        bias = None if bias is None else bias.to(x.dtype)
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


@answer_key
def layernorm_ledger(
    rows: int,
    n: int,
    dtype,
    weight_dtype=None,
    *,
    bias: bool = True,
    naive: bool = False,
    block: int | None = None,
    stats: bool = False,
    backward: bool = False,
    programs: int | None = None,
) -> Ledger:
    """LayerNorm of ``rows`` rows of ``n``, trip by trip.

    Eager: ``F.layer_norm`` is one kernel (read x, w, b; write y, and mean and rstd in training) —
    unfused and fused move the same bytes. ``naive=True``: the op-by-op torch version a lesson writes
    first (``mean``, ``x - mean``, ``pow``, ``mean``, ``+ eps``, ``rsqrt``, ``* rstd``, ``* w``,
    ``+ b``), all in x's dtype.

    Fused: read x (``rows n``), w, b (``n`` each, once: they stay in L2); write y (``rows n``);
    ``stats=True``: write mean and rstd (``rows`` fp32 each). A row wider than ``block`` (default:
    the GPU kernel's one-tile limit) re-reads x in pass 2.

    ``backward=True``: eager ``layer_norm_backward`` is one kernel (nominally: read dy, x, w, mean,
    rstd; write dx, dw, db); fused: the same reads, write dx, write then read the ``(2, programs, n)``
    fp32 partial sums, write dw, db; rows wider than ``block`` read dy and x twice and write and
    read two fp32 a row.
    """
    rows, n = int(rows), int(n)
    weight_dtype = dtype if weight_dtype is None else weight_dtype
    f32 = torch.float32
    rn = rows * n
    nb = n if bias else 0
    sizes = {"w": weight_dtype, "b": weight_dtype, "dw": weight_dtype, "db": weight_dtype}
    sizes.update({k: f32 for k in ("mean", "rstd", "c", "dwb_partial")})
    if block is None:
        wide = not layernorm_config(rows, n, dtype, backward=backward, gpu=True)["SINGLE_TILE"]
    else:
        wide = n > int(block)
    led = Ledger(dtype_bytes=dtype, sizes=sizes)
    if not backward:
        if naive:
            steps = [
                "mean: x -> mu", "sub: x mu -> xc", "pow: xc -> sq", "mean: sq -> var", "add eps: var -> t",
                "rsqrt: t -> rs", "mul rstd: xc rs -> xhat", "mul w: xhat w -> yw", bias and "add b: yw b -> y",
            ]  # fmt: skip
            eager_steps(led, steps, rows, n, per_row=("mu", "var", "t", "rs"))
        else:
            writes = {"y": rn, **({"mean": rows, "rstd": rows} if stats else {})}
            led.op("layer_norm", reads={"x": rn, "w": n, **({"b": n} if bias else {})}, writes=writes)
        led.fused("layernorm", reads={"x": rn, "w": n, "b": nb})
        if wide:
            led.fused("pass 2", reads={"x": rn})
        led.fused("layernorm", writes={"y": rn, "mean": rows if stats else 0, "rstd": rows if stats else 0})
        return led
    k = 2 if bias else 1
    writes = {"dx": rn, "dw": n, **({"db": n} if bias else {})}
    led.op("layer_norm_bwd", reads={"dy": rn, "x": rn, "w": n, "mean": rows, "rstd": rows}, writes=writes)
    if programs is None:
        programs = layernorm_config(rows, n, dtype, backward=True, gpu=True)["programs"]
    step = "layernorm bwd"
    led.fused(step, reads={"dy": rn, "x": rn, "w": n, "mean": rows, "rstd": rows})
    if wide:
        led.fused("phase 1", writes={"c": 2 * rows})
        led.fused("phase 2", reads={"dy": rn, "x": rn, "c": 2 * rows})
    led.fused(step, writes={"dx": rn, "dwb_partial": k * programs * n})
    led.fused("sum partials", reads={"dwb_partial": k * programs * n}, writes={"dw": n, "db": nb})
    return led


def layernorm_flops(rows: int, n: int, *, backward: bool = False) -> int:
    """Nominal FLOPs per element: forward 8 (sum for the mean, centre, square and sum, times rstd,
    times w, plus b); backward 12 (xhat 2, g 1, the two row sums 3, dx 3, dw 2, db 1)."""
    return (12 if backward else 8) * int(rows) * int(n)


# -- launch configuration ----------------------------------------------------------------------------
#: GPU tuning, as :data:`fusionlab.kernels.rmsnorm.GPU_TUNING`; the measurements behind each value:
#: benchmarks/notes_norms.md ("2026-11-26: the norms' tuning tables, key by key"). The backward's row
#: prefetch is off (``prefetch_tile`` 0); ``warps_by_tile``: tiles of these sizes (elements) take this
#: many warps; ``max_single`` (backward): the widest row in one tile, in elements.
GPU_TUNING = {
    "forward": {
        "max_single_bytes": 65536,
        "wide_block": 4096,
        "tile": 2048,
        "per_thread": 16,
        "warps_by_tile": {8192: 8, 16384: 16},
        "tail_from": 2048,
        "tail_max": 16384,
        "tail_warps": 8,
    },
    "backward": {
        "max_single": 8192,
        "wide_block": 4096,
        "tile": 2048,
        "per_thread": 16,
        "warps_per_sm": 16,
        "prefetch_tile": 0,
        "tail_from": 4096,
        "tail_max": 8192,
        "tail_warps": 4,
        "tail_per_sm": 2,
        "tail_stages": 2,
        "stage_bytes": 65536,
    },
}
#: the interpreter's tiles are RMSNorm's (its backward has no halves read twice: no ``reread_tile``)
INTERPRETER_TUNING = {k: v for k, v in NORM_INTERPRETER_TUNING.items() if not k.startswith("reread")}


_config = cached_config(GPU_TUNING, INTERPRETER_TUNING)


def layernorm_config(
    n_rows: int, n_cols: int, dtype: torch.dtype, *, backward: bool = False, gpu: bool | None = None
) -> dict:
    """The launch configuration, as :func:`fusionlab.kernels.rmsnorm.rmsnorm_config`:
    ``{"BLOCK_M", "BLOCK_N", "num_warps", "SINGLE_TILE"}`` (backward: and ``"programs"``)."""
    gpu, sms = gpu_and_sms(gpu)
    return dict(_config(int(n_rows), int(n_cols), dtype, bool(backward), gpu, sms))


# -- kernels --------------------------------------------------------------------------------------------
@triton.jit
def _ln_tile_shifted(x_rows, offs, mask_m, n_cols, k, EVEN: tl.constexpr):
    """One tile of the forward's rows, in fp32, less the rows' first elements k (0 where masked).
    EVEN: the tile covers the row and the row blocks divide the rows."""
    if EVEN:
        return tl.load(x_rows[:, None] + offs[None, :]).to(tl.float32) - k[:, None]
    mask = mask_m[:, None] & (offs < n_cols)[None, :]
    x = tl.load(x_rows[:, None] + offs[None, :], mask=mask, other=0.0).to(tl.float32)
    return tl.where(mask, x - k[:, None], 0.0)


@triton.jit
def _ln_tile_centred(xs, d, offs, mask_m, n_cols, EVEN: tl.constexpr):
    """The shifted tile less the rows' shifted means d; padding lanes stay 0 (each would add d²)."""
    xc = xs - d[:, None]
    if EVEN:
        return xc
    return tl.where(mask_m[:, None] & (offs < n_cols)[None, :], xc, 0.0)


@triton.jit
def _ln_rstd(m2, d, n_cols, eps):
    """1 / sqrt(variance + eps) from the rows' centred sums of squares m2. A row of finite values whose
    m2 overflows fp32 (values near 1e19 and past, e.g. one 1e38 among zeros) would get rstd = 0 and a
    row of zeros — silently wrong. Its variance cannot be formed in fp32, so it gets NaN, as eager's
    fp32 LayerNorm gives (a second, rescaled pass would cost every row a reduction for inputs no model
    makes). A row with inf or NaN in it has a non-finite d and is left to IEEE arithmetic, as eager.
    One compare a row, after the reductions: nothing in the loop over the elements."""
    rstd = tl.math.rsqrt(m2 / n_cols + eps)
    overflow = (m2 == float("inf")) & (tl.abs(d) < float("inf"))
    return tl.where(overflow, float("nan"), rstd)


@triton.jit
def _ln_tile_y(y_rows, w_ptr, b_ptr, offs, mask_m, n_cols, xc, rstd, EVEN: tl.constexpr, HAS_BIAS: tl.constexpr):
    """y = xc rstd w (+ b) on one tile of the rows. w and b are loaded only now: a row of 16384 is 16
    fp32 registers a thread at 32 warps, and x, its centred copy and w live at once would not fit."""
    mask_n = offs < n_cols
    if EVEN:
        w = tl.load(w_ptr + offs).to(tl.float32)
    else:
        w = tl.load(w_ptr + offs, mask=mask_n, other=0.0).to(tl.float32)
    y = xc * rstd[:, None] * w[None, :]
    if HAS_BIAS:
        if EVEN:
            y += tl.load(b_ptr + offs).to(tl.float32)[None, :]
        else:
            y += tl.load(b_ptr + offs, mask=mask_n, other=0.0).to(tl.float32)[None, :]
    if EVEN:
        tl.store(y_rows[:, None] + offs[None, :], y.to(y_rows.dtype.element_ty))
    else:
        tl.store(y_rows[:, None] + offs[None, :], y.to(y_rows.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _layernorm_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, dmean_ptr, rstd_ptr, n_rows, n_cols, n_inner, stride_xb, stride_xm, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_TILE: tl.constexpr, EVEN: tl.constexpr,
    TWO_LEVEL: tl.constexpr, HAS_BIAS: tl.constexpr, STORE_STATS: tl.constexpr, TAIL_N: tl.constexpr = 0,
):  # fmt: skip
    # One program per BLOCK_M rows; y is contiguous (rows, N), x is read through its strides.
    pid = tl.program_id(axis=0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < n_rows
    rows = offs_m.to(tl.int64)
    x_rows = x_ptr + _row_offsets(rows, n_inner, stride_xb, stride_xm, TWO_LEVEL)
    y_rows = y_ptr + rows * n_cols
    offs_n = tl.arange(0, BLOCK_N)
    if SINGLE_TILE:  # the row in registers: centre it first, then the variance (two passes, no re-read)
        # one BLOCK_N tile, or (TAIL_N > 0) a BLOCK_N head and a TAIL_N tail: 5120 in 4096 + 1024 lanes
        # shifted by the row's first element k: x - k is exact for values near k, so the mean of a row
        # far from 0 (1e4 + randn) keeps its small digits; then the centred variance
        k = tl.load(x_rows, mask=mask_m, other=0.0).to(tl.float32)
        # both loads issued before the first reduction: a load written after one waits for its barrier,
        # so the tail's trip to memory would follow the head's (H200, 32768 x 11008 bf16: 75% of copy
        # that way, 94% this way; benchmarks/notes_norms.md, 2026-11-24, LayerNorm's forward at 5120 and 11008)
        xs = _ln_tile_shifted(x_rows, offs_n, mask_m, n_cols, k, EVEN)
        if TAIL_N > 0:
            offs_t = BLOCK_N + tl.arange(0, TAIL_N)
            xs_t = _ln_tile_shifted(x_rows, offs_t, mask_m, n_cols, k, False)
        s = tl.sum(xs, axis=1)
        if TAIL_N > 0:
            s += tl.sum(xs_t, axis=1)
        d = s / n_cols
        # (tried: both sums, of x - x0 and its square, in one pass, rows whose x0 lies far from their
        # mean summed again centred: behind these two passes at every padded width, 5120 74% of copy
        # against 96%, H200 32768 rows bf16; benchmarks/notes_norms.md, 2026-11-24, LayerNorm's forward)
        xc = _ln_tile_centred(xs, d, offs_n, mask_m, n_cols, EVEN)
        m2 = tl.sum(xc * xc, axis=1)
        if TAIL_N > 0:
            xc_t = _ln_tile_centred(xs_t, d, offs_t, mask_m, n_cols, False)
            m2 += tl.sum(xc_t * xc_t, axis=1)
        rstd = _ln_rstd(m2, d, n_cols, eps)
        # (padding lanes of xs - d are never stored)
        _ln_tile_y(y_rows, w_ptr, b_ptr, offs_n, mask_m, n_cols, xs - d[:, None], rstd, EVEN, HAS_BIAS)
        if TAIL_N > 0:
            _ln_tile_y(y_rows, w_ptr, b_ptr, offs_t, mask_m, n_cols, xs_t - d[:, None], rstd, False, HAS_BIAS)
    else:
        # pass 1: shifted by the row's first element k (as above); each tile centred on its own mean,
        # tiles merged by Chan et al.'s formula
        k = tl.load(x_rows, mask=mask_m, other=0.0).to(tl.float32)
        d = tl.zeros([BLOCK_M], dtype=tl.float32)  # mean - k of the tiles merged so far
        m2 = tl.zeros([BLOCK_M], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            offs = start + offs_n
            mask = mask_m[:, None] & (offs < n_cols)[None, :]
            x = tl.load(x_rows[:, None] + offs[None, :], mask=mask, other=0.0).to(tl.float32)
            x = tl.where(mask, x - k[:, None], 0.0)
            n_a = start * 1.0  # elements merged so far (every earlier tile is full)
            n_b = tl.minimum(n_cols - start, BLOCK_N).to(tl.float32)
            mean_b = tl.sum(x, axis=1) / n_b
            xc = tl.where(mask, x - mean_b[:, None], 0.0)
            m2_b = tl.sum(xc * xc, axis=1)
            delta = mean_b - d
            n_ab = n_a + n_b
            d += delta * (n_b / n_ab)
            m2 += m2_b + delta * delta * (n_a * n_b / n_ab)
        rstd = _ln_rstd(m2, d, n_cols, eps)
        for start in range(0, n_cols, BLOCK_N):  # pass 2: re-read x, write y
            offs = start + offs_n
            mask_n = offs < n_cols
            mask = mask_m[:, None] & mask_n[None, :]
            x = tl.load(x_rows[:, None] + offs[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + offs, mask=mask_n, other=0.0).to(tl.float32)
            y = ((x - k[:, None]) - d[:, None]) * rstd[:, None] * w[None, :]
            if HAS_BIAS:
                y += tl.load(b_ptr + offs, mask=mask_n, other=0.0).to(tl.float32)[None, :]
            tl.store(y_rows[:, None] + offs[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
    if STORE_STATS:  # the mean is saved as its offset from the row's first element: backward's
        # (x - x0) - d keeps the digits that x - (x0 + d) in fp32 would lose
        tl.store(dmean_ptr + offs_m, d, mask=mask_m)
        tl.store(rstd_ptr + offs_m, rstd, mask=mask_m)


@triton.jit
def _ln_bwd_tile(dy_ptr, x_rows, rows, offs, mask_m, mask_n, k, d, rstd, stride_dym):
    """One tile of the backward's rows: dy and xhat = ((x - k) - d) rstd in fp32 (0 where masked)."""
    mask = mask_m[:, None] & mask_n[None, :]
    dy = tl.load(dy_ptr + rows[:, None] * stride_dym + offs[None, :], mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_rows[:, None] + offs[None, :], mask=mask, other=0.0).to(tl.float32)
    xhat = tl.where(mask, ((x - k[:, None]) - d[:, None]) * rstd[:, None], 0.0)
    return dy, xhat


@triton.jit
def _ln_bwd_store_dx(dx_ptr, rows, offs, mask_m, mask_n, g, xhat, c1, c2, rstd, n_cols):
    """dx = rstd (g - xhat mean(g xhat) - mean(g)) on one tile of the rows (dx contiguous)."""
    dx = (g - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
    mask = mask_m[:, None] & mask_n[None, :]
    tl.store(dx_ptr + rows[:, None] * n_cols + offs[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _layernorm_bwd_kernel(
    dy_ptr, x_ptr, w_ptr, dmean_ptr, rstd_ptr, dx_ptr, part_ptr, c_ptr, n_rows, n_cols, n_inner, rows_per_program,
    n_programs, stride_dym, stride_xb, stride_xm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_TILE: tl.constexpr, TWO_LEVEL: tl.constexpr,
    COMPUTE_DX: tl.constexpr, COMPUTE_DW: tl.constexpr, COMPUTE_DB: tl.constexpr, DB_SLOT: tl.constexpr,
    NUM_STAGES: tl.constexpr, TAIL_N: tl.constexpr = 0, PDL: tl.constexpr = False,
):  # fmt: skip
    # Program pid walks rows [row_start, row_end); partial sums go to part[slot, pid, :] (slot 0: dw,
    # slot DB_SLOT: db), fp32, summed later by _sum_partials_kernel (PDL: which may be placed now; it
    # waits for this kernel before it reads them).
    if PDL:
        gdc_launch_dependents()
    pid = tl.program_id(axis=0)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    offs_n = tl.arange(0, BLOCK_N)
    dw_row = part_ptr + pid.to(tl.int64) * n_cols
    db_row = part_ptr + (DB_SLOT * n_programs + pid).to(tl.int64) * n_cols
    if SINGLE_TILE:
        # the row on chip: one BLOCK_N tile, or (TAIL_N > 0) a BLOCK_N head and a TAIL_N tail, so a row
        # of 5120 takes 4096 + 1024 lanes, not 8192 (layernorm_config's "tail")
        mask_n = offs_n < n_cols
        w = tl.load(w_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        acc_w = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc_b = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if TAIL_N > 0:
            offs_t = BLOCK_N + tl.arange(0, TAIL_N)
            mask_t = offs_t < n_cols
            w_t = tl.load(w_ptr + offs_t, mask=mask_t, other=0.0).to(tl.float32)
            acc_w_t = tl.zeros([BLOCK_M, TAIL_N], dtype=tl.float32)
            acc_b_t = tl.zeros([BLOCK_M, TAIL_N], dtype=tl.float32)
        for m0 in tl.range(row_start, row_end, BLOCK_M, num_stages=NUM_STAGES):  # >1: prefetch next rows
            offs_m = m0 + tl.arange(0, BLOCK_M)
            mask_m = offs_m < row_end
            rows = offs_m.to(tl.int64)
            x_rows = x_ptr + _row_offsets(rows, n_inner, stride_xb, stride_xm, TWO_LEVEL)
            k = tl.load(x_rows, mask=mask_m, other=0.0).to(tl.float32)  # the shift (same cache line)
            d = tl.load(dmean_ptr + offs_m, mask=mask_m, other=0.0)  # mean - k
            rstd = tl.load(rstd_ptr + offs_m, mask=mask_m, other=0.0)
            # every load of the row before the first reduction (a load after one waits for it)
            dy, xhat = _ln_bwd_tile(dy_ptr, x_rows, rows, offs_n, mask_m, mask_n, k, d, rstd, stride_dym)
            if TAIL_N > 0:
                dy_t, xhat_t = _ln_bwd_tile(dy_ptr, x_rows, rows, offs_t, mask_m, mask_t, k, d, rstd, stride_dym)
            if COMPUTE_DX:
                g = dy * w[None, :]
                c1 = tl.sum(g * xhat, axis=1)
                c2 = tl.sum(g, axis=1)
                if TAIL_N > 0:
                    g_t = dy_t * w_t[None, :]
                    c1 += tl.sum(g_t * xhat_t, axis=1)
                    c2 += tl.sum(g_t, axis=1)
                c1 = c1 / n_cols
                c2 = c2 / n_cols
                _ln_bwd_store_dx(dx_ptr, rows, offs_n, mask_m, mask_n, g, xhat, c1, c2, rstd, n_cols)
                if TAIL_N > 0:
                    _ln_bwd_store_dx(dx_ptr, rows, offs_t, mask_m, mask_t, g_t, xhat_t, c1, c2, rstd, n_cols)
            if COMPUTE_DW:
                acc_w += dy * xhat
                if TAIL_N > 0:
                    acc_w_t += dy_t * xhat_t
            if COMPUTE_DB:
                acc_b += dy
                if TAIL_N > 0:
                    acc_b_t += dy_t
        if COMPUTE_DW:
            tl.store(dw_row + offs_n, tl.sum(acc_w, axis=0), mask=mask_n)
            if TAIL_N > 0:
                tl.store(dw_row + offs_t, tl.sum(acc_w_t, axis=0), mask=mask_t)
        if COMPUTE_DB:
            tl.store(db_row + offs_n, tl.sum(acc_b, axis=0), mask=mask_n)
            if TAIL_N > 0:
                tl.store(db_row + offs_t, tl.sum(acc_b_t, axis=0), mask=mask_t)
    else:
        if COMPUTE_DX:  # phase 1: each row's mean(g xhat) and mean(g), two fp32 a row
            for m0 in range(row_start, row_end, BLOCK_M):
                offs_m = m0 + tl.arange(0, BLOCK_M)
                mask_m = offs_m < row_end
                rows = offs_m.to(tl.int64)
                x_rows = x_ptr + _row_offsets(rows, n_inner, stride_xb, stride_xm, TWO_LEVEL)
                k = tl.load(x_rows, mask=mask_m, other=0.0).to(tl.float32)
                d = tl.load(dmean_ptr + offs_m, mask=mask_m, other=0.0)
                rstd = tl.load(rstd_ptr + offs_m, mask=mask_m, other=0.0)
                acc1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                for start in range(0, n_cols, BLOCK_N):
                    offs = start + offs_n
                    mask_n = offs < n_cols
                    mask = mask_m[:, None] & mask_n[None, :]
                    dy = tl.load(dy_ptr + rows[:, None] * stride_dym + offs[None, :], mask=mask, other=0.0)
                    x = tl.load(x_rows[:, None] + offs[None, :], mask=mask, other=0.0).to(tl.float32)
                    w = tl.load(w_ptr + offs, mask=mask_n, other=0.0).to(tl.float32)
                    g = dy.to(tl.float32) * w[None, :]
                    xhat = tl.where(mask, ((x - k[:, None]) - d[:, None]) * rstd[:, None], 0.0)
                    acc1 += g * xhat
                    acc2 += g
                tl.store(c_ptr + offs_m, tl.sum(acc1, axis=1) / n_cols, mask=mask_m)
                tl.store(c_ptr + n_rows + offs_m, tl.sum(acc2, axis=1) / n_cols, mask=mask_m)
            tl.debug_barrier()  # phase 2's threads read values other threads stored
        for start in range(0, n_cols, BLOCK_N):  # phase 2: tiles outside, rows inside
            offs = start + offs_n
            mask_n = offs < n_cols
            w = tl.load(w_ptr + offs, mask=mask_n, other=0.0).to(tl.float32)
            acc_w = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            acc_b = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for m0 in range(row_start, row_end, BLOCK_M):
                offs_m = m0 + tl.arange(0, BLOCK_M)
                mask_m = offs_m < row_end
                rows = offs_m.to(tl.int64)
                mask = mask_m[:, None] & mask_n[None, :]
                x_rows = x_ptr + _row_offsets(rows, n_inner, stride_xb, stride_xm, TWO_LEVEL)
                dy = tl.load(dy_ptr + rows[:, None] * stride_dym + offs[None, :], mask=mask, other=0.0).to(tl.float32)
                x = tl.load(x_rows[:, None] + offs[None, :], mask=mask, other=0.0).to(tl.float32)
                k = tl.load(x_rows, mask=mask_m, other=0.0).to(tl.float32)
                d = tl.load(dmean_ptr + offs_m, mask=mask_m, other=0.0)
                rstd = tl.load(rstd_ptr + offs_m, mask=mask_m, other=0.0)
                xhat = tl.where(mask, ((x - k[:, None]) - d[:, None]) * rstd[:, None], 0.0)
                if COMPUTE_DX:
                    c1 = tl.load(c_ptr + offs_m, mask=mask_m, other=0.0)
                    c2 = tl.load(c_ptr + n_rows + offs_m, mask=mask_m, other=0.0)
                    dx = (dy * w[None, :] - xhat * c1[:, None] - c2[:, None]) * rstd[:, None]
                    tl.store(dx_ptr + rows[:, None] * n_cols + offs[None, :], dx.to(dx_ptr.dtype.element_ty), mask=mask)
                if COMPUTE_DW:
                    acc_w += dy * xhat
                if COMPUTE_DB:
                    acc_b += dy
            if COMPUTE_DW:
                tl.store(dw_row + offs, tl.sum(acc_w, axis=0), mask=mask_n)
            if COMPUTE_DB:
                tl.store(db_row + offs, tl.sum(acc_b, axis=0), mask=mask_n)


# -- launchers ------------------------------------------------------------------------------------------
_launch_fwd = Launcher(_layernorm_kernel)
_launch_bwd = Launcher(_layernorm_bwd_kernel)


def _forward(x, weight, bias, eps, layout, cfg, store_stats):
    """``(y, mean, rstd)`` (the statistics only when asked)."""
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    stats = torch.empty((2, layout.n_rows), dtype=torch.float32, device=x.device) if store_stats else None
    mean, rstd = (stats[0], stats[1]) if stats is not None else (None, None)
    if x.numel() == 0:
        return y, mean, rstd
    _launch_fwd(
        (cdiv(layout.n_rows, cfg["BLOCK_M"]),), x, weight, bias if bias is not None else weight, y,
        mean if mean is not None else y, rstd if rstd is not None else y, layout.n_rows, layout.n_cols,
        layout.n_inner, layout.stride_b, layout.stride_m, eps,
        HAS_BIAS=bias is not None, STORE_STATS=store_stats, **forward_flags(cfg, layout),
    )  # fmt: skip
    return y, mean, rstd


def _backward(dy, x, layout, weight, mean, rstd, cfg, need_dx, need_dw, need_db):
    """``(dx, dw, db)``: one kernel for dx and the partial sums, one for their sums."""
    n_rows, n_cols = layout.n_rows, layout.n_cols
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device) if need_dx else None
    k = int(need_dw) + int(need_db)
    if n_rows == 0 or n_cols == 0:
        zeros = torch.zeros(n_cols, dtype=weight.dtype, device=weight.device)
        return dx, (zeros if need_dw else None), (zeros.clone() if need_db else None)
    cfg = cfg or layernorm_config(n_rows, n_cols, x.dtype, backward=True)
    dy, stride_dy = grad_rows(dy.to(x.dtype))
    programs, rows_per_program, part, c = backward_buffers(cfg, n_rows, n_cols, k, 2 * need_dx, x.device)
    _launch_bwd(
        (programs,), dy, x, weight, mean, rstd, dx if dx is not None else rstd, part if part is not None else rstd,
        c if c is not None else rstd, n_rows, n_cols, layout.n_inner, rows_per_program, programs, stride_dy,
        layout.stride_b, layout.stride_m,
        COMPUTE_DX=need_dx, COMPUTE_DW=need_dw, COMPUTE_DB=need_db, DB_SLOT=1 if need_dw else 0,
        PDL=bool(k) and pdl_supported(), **backward_flags(cfg, layout),
    )  # fmt: skip
    dw = db = None
    if k:
        sums = sum_partials(part, weight.dtype, pdl=True, checked=True)
        dw = sums[0] if need_dw else None
        db = sums[k - 1] if need_db else None
    return dx, dw, db


class LayerNormFunction(torch.autograd.Function):
    """LayerNorm with its backward. Saves x, w, and mean and rstd (fp32, one each a row)."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, layout, fwd_cfg, bwd_cfg):
        y, mean, rstd = _forward(x, weight, bias, eps, layout, fwd_cfg, store_stats=True)
        ctx.layout, ctx.bwd_cfg = layout, bwd_cfg
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        need = ctx.needs_input_grad
        dx, dw, db = _backward(dy, x, ctx.layout, weight, mean, rstd, ctx.bwd_cfg, need[0], need[1], need[2])
        return dx, dw, db, None, None, None, None


def layernorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float = 1e-5,
    *,
    fwd_config: dict | None = None,
    bwd_config: dict | None = None,
) -> torch.Tensor:
    """LayerNorm over the last dimension, fused, differentiable:
    ``y = (x - mean) * rsqrt(var + eps) * weight + bias`` (biased variance, fp32 statistics).

    ``x``: any shape ``(..., N)``, fp32/fp16/bf16 (no bf16 in the interpreter), last dimension of
    stride 1, leading dimensions possibly strided (up to two merged strides). ``weight``, ``bias``
    (or None): shape ``(N,)``, contiguous, one dtype (x's, or fp32 beside fp16/bf16 x). Returns a new
    contiguous y in x's dtype. Trips: :func:`layernorm_ledger`; numerics and backward: the module
    docstring; reference: :func:`layernorm_reference`. ``fwd_config``/``bwd_config``: overrides as in
    :func:`fusionlab.kernels.rmsnorm.rmsnorm`.
    """
    op = OP
    (layout,), eps = check_norm(x, weight, eps, {}, op)
    if bias is not None:
        check_tensor(bias, "bias", op=op, ndim=1, grad=True, max_numel=None)
        if bias.dtype != weight.dtype or bias.shape != weight.shape or bias.device != weight.device:
            raise KernelInputError(
                f"{op}: bias must match weight's shape, dtype and device, got {tuple(bias.shape)} {bias.dtype} "
                f"{bias.device} for weight {tuple(weight.shape)} {weight.dtype} {weight.device}."
            )
    fwd_cfg, bwd_cfg = configs_with_overrides(
        layernorm_config, layout.n_rows, layout.n_cols, x.dtype, fwd_config, bwd_config, op
    )
    if wants_grad(x, weight, bias):
        return LayerNormFunction.apply(x, weight, bias, eps, layout, fwd_cfg, bwd_cfg)
    return _forward(x, weight, bias, eps, layout, fwd_cfg, store_stats=False)[0]
