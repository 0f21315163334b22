"""Lesson 2: ``y = GELU(x + bias)`` in one kernel — four trips through HBM become two.

Eager PyTorch runs ``F.gelu(x + bias)`` as two kernels: read x (and bias), write t, read t, write y.
The fused kernel reads each element of x once, adds the bias and applies GELU in registers, and writes
y once: 2 x |x| (+ |bias|) instead of 4 x |x|.

Three forms of GELU, picked with ``approximate``:

- ``"none"``: the exact GELU, ``0.5 v (1 + erf(v / sqrt(2)))``, with ``tl.erf``.
- ``"tanh"``: PyTorch's tanh form, ``0.5 v (1 + tanh(sqrt(2/pi) (v + 0.044715 v^3)))``, written as
  ``v * sigmoid(2 sqrt(2/pi) (v + 0.044715 v^3))`` (the same number: 0.5 (1 + tanh z) = sigmoid(2z)),
  because the interpreter has no tanh and on a GPU the sigmoid form avoids a cancellation for v << 0.
- ``"erf_fast"``: the exact GELU with erf replaced by Abramowitz & Stegun's formula 7.1.26,
  ``erfc(z) ~= (a1 t + a2 t^2 + a3 t^3 + a4 t^4 + a5 t^5) exp(-z^2)``, ``t = 1 / (1 + p z)``, z >= 0,
  whose absolute error on erf is at most 1.5e-7. It costs one reciprocal (as rsqrt squared: one
  fast MUFU instruction, where ``1.0 / d`` compiles to a correctly rounded division), one exp2 and
  a handful of FMAs, where ``tl.erf`` calls an accurate erf that costs far more. In bf16, with 2 bytes
  per element, the exact erf makes the kernel compute-bound and erf_fast brings it back to the copy
  ceiling; the measurements are in ``benchmarks/NOTES.md`` (lesson 2) and the recorded suites.
  Accuracy: the formula's 1.5e-7 on erf is at most 0.75e-7 |v| on GELU. With fp32 rounding, over
  v in [-12, 12] (beyond, both give v or ~0), the max absolute error measured 3.3e-7 against the
  float64 exact GELU (torch's own fp32 exact GELU: 3.7e-7 on a CPU) and 4.8e-7 against torch's fp32
  exact GELU on the same device (one fp32 ulp for |y| in [4, 8]), in the interpreter and on an H200
  alike. tests/test_bias_gelu.py asserts <= 1e-6 for both. In fp16/bf16 the storage
  rounding is hundreds of times larger.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .._exercise import answer_key
from ..ledger import Ledger
from ._launch import (
    KernelInputError,
    Launcher,
    cdiv,
    check_block,
    check_choice,
    check_same,
    check_tensor,
    check_tile,
    elementwise_config,
    launch_kwargs,
)

#: the ``approximate`` values the kernel knows, mapped to the constexpr that selects the code path
APPROXIMATIONS = {"none": 0, "tanh": 1, "erf_fast": 2}

# Abramowitz & Stegun 7.1.26 (Handbook of Mathematical Functions, 1964): |error of erf| <= 1.5e-7.
#   erfc(z) ~= (a1 t + a2 t^2 + a3 t^3 + a4 t^4 + a5 t^5) exp(-z^2),  t = 1 / (1 + p z),  z >= 0
_AS_P = 0.3275911
_AS_A = (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
# The kernel takes z = |v| / sqrt(2) and the 1/2 of GELU's 0.5 v (...) into the constants, so none
# of them costs an instruction per element. tl.constexpr: a @triton.jit function may read only
# constexpr globals.
_P_OVER_SQRT2 = tl.constexpr(_AS_P * 0.7071067811865476)
_H1, _H2, _H3, _H4, _H5 = (tl.constexpr(a / 2) for a in _AS_A)
_NEG_HALF_LOG2E = tl.constexpr(-0.5 * 1.4426950408889634)  # exp(-v^2 / 2) = exp2(v^2 * this)


def _check_approximate(approximate, op: str) -> int:
    return check_choice(approximate, APPROXIMATIONS, "approximate", op=op)


@answer_key
def bias_gelu_reference(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """The spec: ``F.gelu(x + bias, approximate=...)`` computed in fp32, returned in ``x.dtype``.

    ``bias`` (shape ``(N,)``) broadcasts over every leading dimension of ``x`` (shape ``(..., N)``).
    The sum and the GELU are evaluated in fp32 (as the kernel does) and rounded to ``x.dtype`` once at
    the end, so in fp16/bf16 this differs from eager ``F.gelu(x + bias)``, which rounds ``x + bias``
    to the low precision first. ``approximate="erf_fast"`` is an implementation choice of the kernel,
    not a different function: its reference is the exact GELU (``approximate="none"``).
    """
    _check_approximate(approximate, "bias_gelu_reference")
    torch_approximate = "tanh" if approximate == "tanh" else "none"
    s = x.float() + bias.float()
    y = F.gelu(s, approximate=torch_approximate)
    # GELU(+inf) = +inf; torch's fp32 CPU GELU returns NaN there on some CPUs (its vectorised erf,
    # seen on an AMD EPYC with torch 2.13), and the spec must not depend on the CPU it runs on
    return torch.where(torch.isposinf(s), s, y).to(x.dtype)


def bias_gelu_eager(x: torch.Tensor, bias: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """What eager PyTorch runs: ``F.gelu(x + bias)``, two kernels (the add, then the GELU), rounding
    ``x + bias`` to x's dtype in between. ``"erf_fast"`` has no eager form: it runs the exact GELU."""
    _check_approximate(approximate, "bias_gelu_eager")
    return F.gelu(x + bias, approximate="tanh" if approximate == "tanh" else "none")


@answer_key
def bias_gelu_ledger(m: int, n: int, dtype, *, x: str = "x", bias: str = "bias") -> Ledger:
    """Eager ``F.gelu(x + bias)`` trip by trip: add reads x (m x n) and bias (n), writes t; gelu reads
    t, writes y. Fused (the kernel): read x and bias, write y. ``x``/``bias`` name the tensors as a
    lesson calls them (lesson 3 applies the op to a matmul's output h with bias b)."""
    led = Ledger(dtype_bytes=dtype)
    led.op("add", reads={x: m * n, bias: n}, writes={"t": m * n})
    led.op("gelu", reads={"t": m * n}, writes={"y": m * n})
    return led


def bias_gelu_flops(m: int, n: int, approximate: str = "none") -> int:
    """Nominal FLOPs: the add, and GELU counted as 8 per element (multiplies, adds and one special
    function; the exact count depends on the form and the compiler)."""
    _check_approximate(approximate, "bias_gelu_flops")
    return 9 * m * n


@triton.jit
def _bias_gelu_kernel(
    x_ptr,
    bias_ptr,
    y_ptr,
    n_rows,
    n_cols,
    stride_xm,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    APPROX: tl.constexpr,
    EVEN: tl.constexpr = False,
):
    # One program per BLOCK_M x BLOCK_N tile, numbered in row-major order: programs that run at the
    # same time read neighbouring stretches of memory, as a plain streaming copy does. (A 2D grid with
    # row blocks on the fast axis scattered them over 4 KiB pieces of distant rows and ran ~6% slower
    # on an H200.)
    pid = tl.program_id(axis=0)
    n_blocks_n = tl.cdiv(n_cols, BLOCK_N)
    pid_m = pid // n_blocks_n
    pid_n = pid % n_blocks_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < n_cols

    # The bias block is loaded once per program and broadcast down the tile's rows: no per-element
    # `offs % n_cols`, and BLOCK_M rows share one read of it.
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :]
    if EVEN:  # the tiles divide the tensor: no masks at all (the launcher checks on the host)
        b = tl.load(bias_ptr + offs_n).to(tl.float32)
        x = tl.load(x_ptrs)
    else:  # the last row and column blocks hang over the edges
        mask = (offs_m[:, None] < n_rows) & mask_n[None, :]
        b = tl.load(bias_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        x = tl.load(x_ptrs, mask=mask, other=0.0)
    # (No eviction hints: evict_first on x and evict_last on the bias measured 2-3% slower on an H200.)
    v = x.to(tl.float32) + b[None, :]  # math in fp32, whatever the storage

    if APPROX == 0:  # exact: resolved at compile time, one specialised kernel per form
        y = 0.5 * v * (1.0 + tl.erf(v * 0.7071067811865476))
    elif APPROX == 1:  # tanh form: 0.5 (1 + tanh z) = sigmoid(2z), 2 sqrt(2/pi) = 1.5957691216057308
        y = v * tl.sigmoid(1.5957691216057308 * (v + 0.044715 * v * v * v))
    else:  # erf_fast, A&S 7.1.26, written so that no digits cancel for v < 0
        # 1/d as rsqrt(d)^2: one approximate MUFU instruction and a multiply on a GPU, where `1.0 / d`
        # compiles to a correctly rounded division of several instructions; its few-ulp error is far
        # below the formula's own 1.5e-7. (Written inline: Triton's interpreter fails on tl.math
        # builtins called from a nested @triton.jit helper.)
        r = tl.math.rsqrt(tl.abs(v) * _P_OVER_SQRT2 + 1.0)  # tensor first: constexpr * tensor trips the interpreter
        t = r * r
        half_poly = t * (_H1 + t * (_H2 + t * (_H3 + t * (_H4 + t * _H5))))  # Horner: 5 FMAs
        half_q = half_poly * tl.exp2(v * v * _NEG_HALF_LOG2E)  # erfc(|v| / sqrt 2) / 2
        # 0.5 (1 + erf(v/sqrt2)) is 1 - q/2 for v >= 0 and q/2 for v < 0: using q directly for v < 0
        # keeps the small negative tail accurate instead of computing 1 + (q - 1) and losing digits.
        # v * (1 - q/2) rather than v - v q/2: at v = +inf, q/2 is 0 and inf * 0 would give NaN where
        # GELU gives inf (at v = -inf both give NaN, as torch does).
        y = tl.where(v >= 0, v * (1.0 - half_q), v * half_q)
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    if EVEN:
        tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty))
    else:
        tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=mask)


def bias_gelu_config(n_rows: int, n_cols: int, dtype: torch.dtype) -> dict:
    """The launch configuration the launcher picks: ``{"BLOCK_M", "BLOCK_N", "num_warps"}``.

    The shared element-wise tile (:func:`fusionlab.kernels._launch.elementwise_config`): on a GPU
    1 x 1024 tiles for 4-byte types, 2 x 1024 for 2-byte ones, 4 warps; 64 Ki-element tiles in the
    interpreter. The sweep behind it is in ``benchmarks/NOTES.md``.
    """
    return dict(elementwise_config(int(n_rows), int(n_cols), dtype))


_launch = Launcher(_bias_gelu_kernel)


@functools.lru_cache(maxsize=4096)
def _plan(n_rows: int, n_cols: int, dtype: torch.dtype) -> tuple:
    """(grid, launch keywords) for the default tile: derived once per shape, not on every call."""
    cfg = elementwise_config(n_rows, n_cols, dtype)
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    grid = (cdiv(n_rows, bm) * cdiv(n_cols, bn),)
    kwargs = {"BLOCK_M": bm, "BLOCK_N": bn, "EVEN": n_rows % bm == 0 and n_cols % bn == 0}
    return grid, kwargs | launch_kwargs(cfg["num_warps"])


def bias_gelu(
    x: torch.Tensor,
    bias: torch.Tensor,
    approximate: str = "none",
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """``GELU(x + bias)`` fused: one kernel, one read of x and bias, one write of y.

    ``x``: shape ``(M, N)``, or any shape ``(..., N)`` (leading dimensions are treated as rows);
    ``bias``: shape ``(N,)``, same dtype and device. ``approximate``: ``"none"`` (exact erf GELU),
    ``"tanh"`` or ``"erf_fast"`` (exact GELU through A&S 7.1.26, see the module docstring).
    ``block_m``, ``block_n``, ``num_warps``: override the tile (powers of two) for a tuning sweep;
    by default :func:`bias_gelu_config` picks them. Returns a new tensor like ``x``.
    """
    op = "bias_gelu"
    approx = APPROXIMATIONS.get(approximate) if isinstance(approximate, str) else None
    if approx is None:
        _check_approximate(approximate, op)  # raises with the list of choices
    check_tensor(x, "x", op=op)
    check_tensor(bias, "bias", op=op, ndim=1)
    if bias.dtype != x.dtype or bias.get_device() != x.get_device():
        check_same(x, bias, "x and bias", op=op, shape=False)
    if x.dim() < 1:
        raise KernelInputError(f"{op}: x must have at least one dimension (..., N), got a scalar.")
    n_cols = x.shape[-1]
    if bias.shape[0] != n_cols:
        raise KernelInputError(
            f"{op}: bias has {bias.shape[0]} elements but x has {n_cols} columns (shape {tuple(x.shape)}); "
            "bias must have shape (N,) where N is x's last dimension."
        )
    y = torch.empty_like(x)
    numel = x.numel()
    if numel == 0:
        return y
    n_rows = numel // n_cols
    # x and y are contiguous (checked), so a row of the (rows, N) view starts every N elements
    if block_m is None and block_n is None and num_warps is None:  # the hot path: nothing re-derived
        grid, kwargs = _plan(n_rows, n_cols, x.dtype)
        # everything Triton specialises this launch on: the plan follows from the shape and dtype, and
        # y, fresh from the caching allocator, is always 16-byte aligned
        key = (x.shape, x.dtype, approx, x.data_ptr() & 15, bias.data_ptr() & 15)
        _launch(grid, x, bias, y, n_rows, n_cols, n_cols, n_cols, APPROX=approx, key=key, **kwargs)
        return y
    cfg = bias_gelu_config(n_rows, n_cols, x.dtype)
    block_m = check_block(block_m, "block_m", op) if block_m is not None else cfg["BLOCK_M"]
    block_n = check_block(block_n, "block_n", op) if block_n is not None else cfg["BLOCK_N"]
    num_warps = check_block(num_warps, "num_warps", op, max_value=32) if num_warps is not None else cfg["num_warps"]
    check_tile(block_m, block_n, op=op)
    grid = (cdiv(n_rows, block_m) * cdiv(n_cols, block_n),)
    even = n_rows % block_m == 0 and n_cols % block_n == 0
    _launch(
        grid,
        x,
        bias,
        y,
        n_rows,
        n_cols,
        n_cols,
        n_cols,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        APPROX=approx,
        EVEN=even,
        **launch_kwargs(num_warps),
    )
    return y
