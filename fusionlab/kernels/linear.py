"""Lesson 6: ``y = act(x W^T + b) + r`` — the small ops welded onto the matmul as its epilogue.

Eager PyTorch runs a linear layer with a GELU as separate kernels: the matmul writes h (M x N), the
bias add reads h and writes t, the GELU reads t and writes y. Lessons 2 and 3 fused the two small ops
into one pass; here they disappear into the matmul itself. When the last K step is done, the
BLOCK_M x BLOCK_N output tile is still in registers as an fp32 accumulator: the kernel adds the bias
(one number per output feature, i.e. per *column* of the tile), applies the activation, adds the
residual, and writes y once. The bytes moved are those of the matmul alone plus the bias (N numbers)
and the residual, and the extra arithmetic rides on a tile that is already on chip.

This is the matmul kernel of :mod:`fusionlab.kernels.matmul` with constexpr epilogue flags (one kernel,
compiled once per combination of flags), not a second kernel: ``weight`` is passed as its transposed
view ``weight.t()`` (K x N, no copy), or, on the Hopper TMA path, read as it lies, (N, K), with the
transpose folded into ``tl.dot(a, b.T)``.

Order of operations in the epilogue: ``y = act(acc + b) + r``, all in fp32, one rounding to the
output dtype at the end; eager PyTorch rounds h, t and y to the storage dtype after each op, so in
fp16/bf16 the two differ by a few units of the last place (the reference computes in float64).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .._exercise import answer_key
from ..ledger import Ledger
from ._launch import KernelInputError, Plans, check_same, check_tensor, plain_choices, signature
from .matmul import ACTIVATIONS, _check_activation, _gemm_plan, _run_gemm, _tiles, check_operand, matmul_config


def _activate(h: torch.Tensor, activation) -> torch.Tensor:
    if activation is None:
        return h
    if activation == "gelu":
        return F.gelu(h)
    if activation == "gelu_tanh":
        return F.gelu(h, approximate="tanh")
    return F.silu(h)  # "silu"


@answer_key
def linear_reference(x, weight, bias=None, activation=None, residual=None) -> torch.Tensor:
    """The spec: ``act(x @ weight.T + bias) + residual`` in float64, returned in ``x.dtype``.

    ``x`` (..., K), ``weight`` (N, K) as F.linear takes it, ``bias`` (N,), ``residual`` (..., N);
    ``activation`` in None, ``"gelu"`` (exact, erf), ``"gelu_tanh"``, ``"silu"``.
    """
    _check_activation(activation, "linear_reference")
    h = x.double() @ weight.double().t()
    if bias is not None:
        h = h + bias.double()
    y = _activate(h, activation)
    if residual is not None:
        y = y + residual.double()
    return y.to(x.dtype)


def linear_eager(x, weight, bias=None, activation=None, residual=None) -> torch.Tensor:
    """What eager PyTorch runs: ``F.gelu(F.linear(x, weight, bias))`` (+ residual): cuBLAS (its
    own epilogue adds the bias), then one kernel for the activation and one for the residual add."""
    _check_activation(activation, "linear_eager")
    y = _activate(F.linear(x, weight, bias), activation)
    return y if residual is None else y + residual


@answer_key
def linear_ledger(
    M: int,
    K: int,
    N: int,
    dtype=torch.bfloat16,
    *,
    bias: bool = True,
    activation: str | None = "gelu",
    residual: bool = False,
    block_m: int | None = None,
    block_n: int | None = None,
) -> Ledger:
    """The layer op by op, unfused: the matmul reads x (M x K) and w (N x K) and writes h (M x N);
    the bias add reads h and b (N) and writes t; the activation reads t and writes u; the residual add
    reads u and r and writes y. Fused (the kernel): read x, w, b, r; write y.

    ``block_m``/``block_n``: count the matmul's own re-reads by tile as :func:`matmul_ledger` does
    (x read ``ceil(N / block_n)`` times, w ``ceil(M / block_m)`` times); None: each read once.
    """
    _check_activation(activation, "linear_ledger")
    led = Ledger(dtype_bytes=dtype)
    steps = ["matmul"] + (["add"] if bias else []) + ([activation] if activation else [])
    steps += ["add_residual"] if residual else []
    names = {s: ("y" if i == len(steps) - 1 else f"h{i}" if i else "h") for i, s in enumerate(steps)}
    reads_x, reads_w = M * K * _tiles(N, block_n), N * K * _tiles(M, block_m)
    led.op("matmul", reads={"x": reads_x, "w": reads_w}, writes={names["matmul"]: M * N})
    prev = names["matmul"]
    if bias:
        led.op("add", reads={prev: M * N, "b": N}, writes={names["add"]: M * N})
        prev = names["add"]
    if activation:
        led.op(activation, reads={prev: M * N}, writes={names[activation]: M * N})
        prev = names[activation]
    if residual:
        led.op("add_residual", reads={prev: M * N, "r": M * N}, writes={"y": M * N})
    return led


def linear_flops(
    M: int, K: int, N: int, *, bias: bool = True, activation: str | None = "gelu", residual: bool = False
) -> int:
    """Nominal FLOPs: ``2 M N K`` for the matmul, plus one per output for the bias and the residual
    and eight for an activation (as :func:`fusionlab.kernels.bias_gelu.bias_gelu_flops` counts)."""
    _check_activation(activation, "linear_flops")
    return 2 * M * N * K + M * N * (int(bias) + 8 * int(activation is not None) + int(residual))


def linear_config(M: int, K: int, N: int, dtype: torch.dtype) -> dict:
    """The launch configuration: that of the matmul it runs (:func:`fusionlab.kernels.matmul.matmul_config`)."""
    return matmul_config(M, N, K, dtype)


def _rows(t: torch.Tensor, name: str, width: int, op: str) -> torch.Tensor:
    """(..., width) -> (rows, width) as a view: no copy inside the launcher."""
    if t.dim() == 2:
        return t
    try:
        return t.view(-1, width)
    except RuntimeError:
        raise KernelInputError(
            f"{op}: {name} of shape {tuple(t.shape)} and strides {t.stride()} cannot be viewed as rows of "
            f"{width} without a copy. Pass {name}.contiguous()."
        ) from None


def check_linear_args(x, weight, bias, residual, op: str) -> tuple[torch.Tensor, torch.Tensor | None, tuple]:
    """Validate ``linear``'s arguments; returns x as (M, K) rows, residual as (M, N) rows (or None) and
    the output shape."""
    if not isinstance(x, torch.Tensor):
        check_tensor(x, "x", op=op)  # raises: not a tensor
    if x.dim() < 1:
        raise KernelInputError(f"{op}: x must have at least one dimension (..., K), got a scalar.")
    x2 = x.view(1, x.shape[0]) if x.dim() == 1 else _rows(x, "x", x.shape[-1], op)
    check_operand(x2, "x", op)
    check_operand(weight, "weight", op)
    check_same(x, weight, "x and weight", op=op, shape=False)
    N, K = weight.shape
    if x.shape[-1] != K:
        raise KernelInputError(
            f"{op}: x has {x.shape[-1]} features (shape {tuple(x.shape)}) but weight is {tuple(weight.shape)}; "
            "weight must be (N, K) as F.linear takes it, with K = x.shape[-1]."
        )
    if bias is not None:
        check_tensor(bias, "bias", op=op, ndim=1)
        check_same(x, bias, "x and bias", op=op, shape=False)
        if bias.shape[0] != N:
            raise KernelInputError(
                f"{op}: bias has {bias.shape[0]} elements but weight has N={N} output features; bias is (N,)."
            )
    out_shape = (*x.shape[:-1], N)
    r2 = None
    if residual is not None:
        check_tensor(residual, "residual", op=op, contiguous=False, max_numel=None)
        check_same(x, residual, "x and residual", op=op, shape=False)
        if tuple(residual.shape) != out_shape:
            raise KernelInputError(
                f"{op}: residual has shape {tuple(residual.shape)}; it must match the output, {out_shape}."
            )
        r2 = residual.view(1, N) if residual.dim() == 1 else _rows(residual, "residual", N, op)
    return x2, r2, out_shape


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
    *,
    variant: str | None = None,
    config: dict | None = None,
    input_precision: str | None = None,
) -> torch.Tensor:
    """``act(x @ weight.T + bias) + residual`` in one kernel: the epilogue runs on the fp32 tile in
    registers and y is written once.

    ``x``: (..., K) (rows need not be contiguous for a 2-D x); ``weight``: (N, K), F.linear's layout;
    ``bias``: (N,) or None; ``activation``: None, ``"gelu"`` (exact, erf), ``"gelu_tanh"`` or
    ``"silu"``; ``residual``: (..., N) like the output, or None (added after the activation). Any M
    (M = 1 is a GEMV), N, K. ``variant``, ``config``, ``input_precision``: as for
    :func:`fusionlab.kernels.matmul.matmul`. Trips: :func:`linear_ledger`. Reference:
    :func:`linear_reference`. Returns a new tensor of shape (..., N) in x's dtype.
    """
    op = "linear"
    key = device = None
    if config is None and plain_choices(activation, variant, input_precision):
        sig = signature(x, weight, bias, residual)
        if sig is not None:
            key, device = (sig, activation, variant, input_precision), sig[1]
            plan = _PLANS.get(key)
            if plan is not None:  # a call of this signature passed every check: its plan, on these tensors
                return _run_gemm(plan, x, weight, bias, residual, None, device)
    act = _check_activation(activation, op)
    x2, r2, out_shape = check_linear_args(x, weight, bias, residual, op)
    w_t = weight.t()
    plan = _gemm_plan(x2, w_t, bias, act, r2, None, variant, config, input_precision, op, out_shape)
    if key is not None and plan.reusable:
        _PLANS.put(key, plan)
    return _run_gemm(plan, x2, w_t, bias, r2, None, device)


#: linear's plans by call signature (a decode step calls it with the same few signatures every token:
#: host time there is the whole cost; benchmarks/notes_lesson9.md, 2026-11-27, plans by signature)
_PLANS = Plans()


__all__ = [
    "ACTIVATIONS",
    "linear",
    "linear_config",
    "linear_eager",
    "linear_flops",
    "linear_ledger",
    "linear_reference",
]
