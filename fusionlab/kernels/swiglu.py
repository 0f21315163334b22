"""Lesson 5: the SwiGLU gate, ``h = silu(g) * u``, in one kernel forward and one backward.

A SwiGLU MLP computes ``down(silu(x @ W_gate) * (x @ W_up))``. Between the matmuls sit two small ops;
eager PyTorch runs them as two kernels:

- ``s = F.silu(g)`` reads g, writes s;
- ``h = s * u`` reads s and u, writes h.

That is 5N element trips; the fused kernel reads g and u and writes h: 3N. The prediction is 5/3, not
2 — the multiply has two inputs, and fusion removes only the round trip of s.

Backward: ``silu(g) = g σ(g)``, ``silu'(g) = σ(g) (1 + g (1 − σ(g)))``, so

    du = dh · silu(g),        dg = dh · u · σ(g) (1 + g (1 − σ(g))).

Eager autograd saved s (mul's input) in the forward and runs three kernels: ``du = dh * s``,
``ds = dh * u``, ``dg = silu_backward(ds, g)``: 9N trips. The fused backward saves only g and u (the
forward's inputs: no extra memory) and *recomputes* σ(g) in registers: it reads dh, g, u and writes
dg, du in one kernel, 5N trips. Recomputing a sigmoid costs a few instructions per element; storing s
would cost N elements of memory and a read.

All arithmetic is fp32 whatever the storage (bf16/fp16 are rounded once, on the store). Reference:
Shazeer, "GLU Variants Improve Transformer" (2020).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ..ledger import Ledger
from ._launch import (
    INT32_LIMIT,
    KernelInputError,
    Launcher,
    Plans,
    cdiv,
    check_same,
    check_tensor,
    elementwise_config,
    launch_kwargs,
    signature,
)
from ._tensors import upstream_grad


# -- spec, eager, ledger, flops -----------------------------------------------------------------------
def swiglu_reference(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The spec: ``silu(g) * u`` computed in fp32 (float64 for float64 inputs), returned in g's dtype."""
    wide = torch.float64 if g.dtype == torch.float64 else torch.float32
    return (F.silu(g.to(wide)) * u.to(wide)).to(g.dtype)


def swiglu_eager(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """What eager PyTorch runs: ``F.silu(g) * u``, two kernels, s rounded to g's dtype in between."""
    return F.silu(g) * u


def swiglu_ledger(n: int, dtype, *, backward: bool = False) -> Ledger:
    """Trips of N-element SwiGLU, as eager runs it and fused.

    Forward: silu reads g, writes s; mul reads s, u, writes h (5N); fused reads g, u, writes h (3N).
    Backward (``backward=True``): ``du = dh * s``, ``ds = dh * u``, ``dg = silu_backward(ds, g)`` (9N);
    fused reads dh, g, u, writes dg, du (5N): s is recomputed, never read.
    """
    if not backward:
        led = Ledger(dtype_bytes=dtype)
        led.op("silu", reads={"g": n}, writes={"s": n})
        led.op("mul", reads={"s": n, "u": n}, writes={"h": n})
        return led
    led = Ledger(dtype_bytes=dtype, outputs=("du", "dg"), recomputed=("s",))
    led.op("mul (du)", reads={"dh": n, "s": n}, writes={"du": n})
    led.op("mul (ds)", reads={"dh": n, "u": n}, writes={"ds": n})
    led.op("silu_bwd", reads={"ds": n, "g": n}, writes={"dg": n})
    return led


def swiglu_flops(n: int, *, backward: bool = False) -> int:
    """Nominal FLOPs: forward 5 per element (sigmoid as negate, exp, add, divide; two multiplies),
    backward 11 (the sigmoid again, silu, and the products of du and dg)."""
    return (11 if backward else 5) * n


def swiglu_config(n_rows: int, n_cols: int, dtype: torch.dtype) -> dict:
    """``{"BLOCK_M", "BLOCK_N", "num_warps"}``: the shared element-wise tile
    (:func:`fusionlab.kernels._launch.elementwise_config`), forward and backward alike."""
    return dict(elementwise_config(int(n_rows), int(n_cols), dtype))


# -- kernels --------------------------------------------------------------------------------------------
@triton.jit
def _tile(pid, n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INT64: tl.constexpr):
    # Row-major tile order (as bias_gelu): programs running together read neighbouring memory.
    n_blocks_n = tl.cdiv(n_cols, BLOCK_N)
    offs_m = (pid // n_blocks_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid % n_blocks_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < n_rows) & (offs_n[None, :] < n_cols)
    if INT64:  # row offsets past 2**31 elements: widen before multiplying by the stride
        offs_m = offs_m.to(tl.int64)
    return offs_m, offs_n, mask


@triton.jit
def _swiglu_kernel(
    g_ptr,
    u_ptr,
    h_ptr,
    n_rows,
    n_cols,
    stride_gm,
    stride_um,
    stride_hm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN: tl.constexpr,
    INT64: tl.constexpr,
):
    pid = tl.program_id(axis=0)
    offs_m, offs_n, mask = _tile(pid, n_rows, n_cols, BLOCK_M, BLOCK_N, INT64)
    g_ptrs = g_ptr + offs_m[:, None] * stride_gm + offs_n[None, :]
    u_ptrs = u_ptr + offs_m[:, None] * stride_um + offs_n[None, :]
    if EVEN:  # tiles divide the tensor: no masks
        g = tl.load(g_ptrs).to(tl.float32)
        u = tl.load(u_ptrs).to(tl.float32)
    else:
        g = tl.load(g_ptrs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(u_ptrs, mask=mask, other=0.0).to(tl.float32)
    h = g * tl.sigmoid(g) * u  # s = silu(g) never leaves the registers
    h_ptrs = h_ptr + offs_m[:, None] * stride_hm + offs_n[None, :]
    if EVEN:
        tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty))
    else:
        tl.store(h_ptrs, h.to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(
    dh_ptr,
    g_ptr,
    u_ptr,
    dg_ptr,
    du_ptr,
    n_rows,
    n_cols,
    stride_dhm,
    stride_gm,
    stride_um,
    stride_dgm,
    stride_dum,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    EVEN: tl.constexpr,
    INT64: tl.constexpr,
):
    pid = tl.program_id(axis=0)
    offs_m, offs_n, mask = _tile(pid, n_rows, n_cols, BLOCK_M, BLOCK_N, INT64)
    dh_ptrs = dh_ptr + offs_m[:, None] * stride_dhm + offs_n[None, :]
    g_ptrs = g_ptr + offs_m[:, None] * stride_gm + offs_n[None, :]
    u_ptrs = u_ptr + offs_m[:, None] * stride_um + offs_n[None, :]
    if EVEN:
        dh = tl.load(dh_ptrs).to(tl.float32)
        g = tl.load(g_ptrs).to(tl.float32)
        u = tl.load(u_ptrs).to(tl.float32)
    else:
        dh = tl.load(dh_ptrs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(g_ptrs, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(u_ptrs, mask=mask, other=0.0).to(tl.float32)
    # recompute sigma(g) instead of having stored silu(g): a few instructions, no memory
    sig = tl.sigmoid(g)
    du = dh * (g * sig)
    dg = dh * u * (sig * (1.0 + g * (1.0 - sig)))
    dg_ptrs = dg_ptr + offs_m[:, None] * stride_dgm + offs_n[None, :]
    du_ptrs = du_ptr + offs_m[:, None] * stride_dum + offs_n[None, :]
    if EVEN:
        tl.store(dg_ptrs, dg.to(dg_ptr.dtype.element_ty))
        tl.store(du_ptrs, du.to(du_ptr.dtype.element_ty))
    else:
        tl.store(dg_ptrs, dg.to(dg_ptr.dtype.element_ty), mask=mask)
        tl.store(du_ptrs, du.to(du_ptr.dtype.element_ty), mask=mask)


# -- launchers ------------------------------------------------------------------------------------------
def _rows(x: torch.Tensor, name: str, op: str) -> torch.Tensor:
    """x as a (rows, N) view with unit column stride (free for contiguous tensors and row slices)."""
    n = x.shape[-1]
    try:
        return x.view(-1, n) if x.dim() != 2 else x
    except RuntimeError:
        raise KernelInputError(
            f"{op}: {name} (shape {tuple(x.shape)}, strides {x.stride()}) cannot be viewed as rows of "
            f"{n} elements without a copy. Pass {name}.contiguous()."
        ) from None


def _needs_int64(n_rows: int, n_cols: int, *views: torch.Tensor) -> bool:
    # the largest element offset any program forms: (last row) * (row stride) + (last column)
    return any((n_rows - 1) * v.stride(0) + n_cols >= INT32_LIMIT for v in views)


_launch_fwd = Launcher(_swiglu_kernel)
_launch_bwd = Launcher(_swiglu_bwd_kernel)


@functools.lru_cache(maxsize=4096)
def _plan(n_rows: int, n_cols: int, dtype: torch.dtype) -> tuple:
    """(grid, launch keywords) for the shared element-wise tile: derived once per shape, not on every call."""
    cfg = elementwise_config(n_rows, n_cols, dtype)
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    grid = (cdiv(n_rows, bm) * cdiv(n_cols, bn),)
    return grid, {"BLOCK_M": bm, "BLOCK_N": bn, "EVEN": n_rows % bm == 0 and n_cols % bn == 0} | launch_kwargs(
        cfg["num_warps"]
    )


def _row_stride(x: torch.Tensor, name: str, op: str) -> int:
    """The stride between x's rows of ``x.shape[-1]`` elements, read off its strides where that is plain
    arithmetic (contiguous; 2-D; 3-D whose first dimension steps over whole second ones, as a slice of the
    last dimension does), else from a (rows, N) view (:func:`_rows`): a view costs a decode step's host
    more than the rest of the wrapper."""
    shape, stride = x.shape, x.stride()
    if x.is_contiguous():
        return shape[-1]
    if len(shape) == 2:
        return stride[0]
    if len(shape) == 3 and stride[0] == stride[1] * shape[1]:
        return stride[1]
    return _rows(x, name, op).stride(0)


def _forward_plan(g: torch.Tensor, u: torch.Tensor) -> tuple:
    """``(h's shape as a plain tuple, dtype, device, grid, int arguments, constexprs and launch options,
    interned launcher key)`` of the forward over g and u (grid None: nothing to compute). All of it follows
    from the tensors' :func:`~fusionlab.kernels._launch.signature`, so a call of a kept signature
    (:data:`_PLANS`) launches it again on its own tensors."""
    op = "swiglu"
    n_cols = g.shape[-1]
    sg, su = _row_stride(g, "g", op), _row_stride(u, "u", op)
    head = (tuple(g.shape), g.dtype, g.device)
    numel = g.numel()
    if numel == 0:
        return (*head, None, None, None, None)
    n_rows = numel // n_cols
    grid, kwargs = _plan(n_rows, n_cols, g.dtype)
    # the largest element offset any program forms: (last row) * (row stride) + (last column)
    int64 = (n_rows - 1) * max(sg, su, n_cols) + n_cols >= INT32_LIMIT
    # everything Triton specialises this launch on, cheaper than the launcher working it out: the plan
    # follows from the shape and dtype; the strides; the inputs' 16-byte alignment (h is fresh: aligned)
    key = (n_rows, n_cols, sg, su, g.dtype, int64, g.data_ptr() & 15, u.data_ptr() & 15)
    return (*head, grid, (n_rows, n_cols, sg, su, n_cols), {"INT64": int64, **kwargs}, _launch_fwd.intern(key))


def _swiglu_forward(g: torch.Tensor, u: torch.Tensor, plan: tuple | None = None, device=None) -> torch.Tensor:
    """h from one launch (``plan``: :func:`_forward_plan`'s, when the caller kept it; ``device``: the current
    CUDA device when the caller knows it)."""
    shape, dtype, dev, grid, ints, kwargs, key = plan or _forward_plan(g, u)
    h = torch.empty(size=shape, dtype=dtype, device=dev)
    if grid is not None:
        # the tensors themselves as the kernel's pointers: it indexes them as (rows, N) with these strides
        _launch_fwd.launch(grid, (g, u, h, *ints), kwargs, key, device)
    return h


def _swiglu_backward(
    dh: torch.Tensor, g: torch.Tensor, u: torch.Tensor, out: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(dg, du)`` from one kernel: reads dh, g, u; writes dg, du.

    ``out``: ``(dg, du)`` to write into (g's shape, rows that view as g's do), instead of two new tensors.
    They may be g and u themselves, or dh and one of them: every element is read before it is written, by
    the one program that writes it, so the gradient can take the saved activations' memory (the layer's
    MLP backward hands back its gate/up output's gradient that way, :class:`fusionlab.model.SwiGLULinearFunction`).
    """
    op = "swiglu backward"
    try:
        dh2 = _rows(dh, "dh", op)
    except KernelInputError:
        dh2 = dh.contiguous().view(-1, dh.shape[-1])
    g2, u2 = _rows(g, "g", op), _rows(u, "u", op)
    if out is None:
        dg = torch.empty(g.shape, dtype=g.dtype, device=g.device)
        du = torch.empty(u.shape, dtype=u.dtype, device=u.device)
    else:
        dg, du = out
    if dg.numel() == 0:
        return dg, du
    n_rows, n_cols = g2.shape
    dg2, du2 = _rows(dg, "dg", op), _rows(du, "du", op)
    grid, kwargs = _plan(n_rows, n_cols, g.dtype)
    _launch_bwd(grid, dh2, g2, u2, dg2, du2, n_rows, n_cols, dh2.stride(0), g2.stride(0), u2.stride(0),
                dg2.stride(0), du2.stride(0), INT64=_needs_int64(n_rows, n_cols, dh2, g2, u2, dg2, du2),
                **kwargs)  # fmt: skip
    return dg, du


class SwiGLUFunction(torch.autograd.Function):
    """Forward ``silu(g) * u``; saves g and u (the inputs, no new memory) and recomputes silu."""

    @staticmethod
    def forward(ctx, g, u, plan=None, device=None):
        h = _swiglu_forward(g, u, plan, device)
        ctx.save_for_backward(g, u)
        return h

    @staticmethod
    def backward(ctx, dh):
        g, u = ctx.saved_tensors
        dh = upstream_grad(dh, g.dtype)  # a negated view resolved, a transposed one copied
        dg, du = _swiglu_backward(dh, g, u)
        return dg, du, None, None


def swiglu(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``silu(g) * u`` fused, differentiable: one kernel forward (reads g, u; writes h: 3N trips), one
    backward (reads dh, g, u; writes dg, du: 5N trips), fp32 math.

    ``g``, ``u``: the same shape ``(..., N)``, dtype and device; rows may be strided (e.g. the two
    halves of one ``(T, 2F)`` projection, ``x.chunk(2, -1)``) but the last dimension must have stride 1.
    Returns a new contiguous tensor like g. Reference: :func:`swiglu_reference`.
    """
    key = device = None
    sig = signature(g, u)
    if sig is not None:
        key, device = sig, sig[1]
        kept = _PLANS.get(key)
        if kept is not None:  # a call of this signature passed every check: its plan
            grad, plan = kept
            return SwiGLUFunction.apply(g, u, plan, device) if grad else _swiglu_forward(g, u, plan, device)
    op = "swiglu"
    check_tensor(g, "g", op=op, contiguous=False, grad=True, max_numel=None)
    check_tensor(u, "u", op=op, contiguous=False, grad=True, max_numel=None)
    check_same(g, u, "g and u", op=op)
    if g.dim() < 1:
        raise KernelInputError(f"{op}: g and u must have at least one dimension (..., N), got scalars.")
    plan = _forward_plan(g, u)  # (its row strides are the last check)
    grad = torch.is_grad_enabled() and (g.requires_grad or u.requires_grad)
    if key is not None:
        _PLANS.put(key, (grad, plan))
    return SwiGLUFunction.apply(g, u, plan, device) if grad else _swiglu_forward(g, u, plan, device)


#: swiglu's forward plans by call signature (a decode step's gate: host time is its cost;
#: benchmarks/notes_lesson9.md, 2026-11-27, swiglu's and attention_decode's plans by signature)
_PLANS = Plans()
