"""Lesson 6: ``y = act(RMSNorm(x) W^T + b)`` with the normalisation folded into the matmul.

``RMSNorm(x) = x * rstd * gamma`` with ``rstd = 1 / sqrt(mean(x^2) + eps)`` over each row's K
features. Unfused, a norm kernel (lesson 4) reads x and writes the normalised xn (M x K), and the
matmul reads xn back. The statistic needs the whole row, while a matmul program sees only BLOCK_K
columns at a time, so the normalisation cannot simply be applied to each A tile as it is loaded.
Two pieces of algebra remove the xn round trip instead:

- ``(x * rstd) W^T = rstd * (x W^T)``: rstd is one number per row, so it commutes with the matmul
  and becomes a *row scale* in the epilogue, applied to the fp32 accumulator.
- ``(x * gamma) W^T = x (W * gamma)^T``: gamma scales the K axis, which the matmul sums over, so it
  folds into the weight once (:func:`fold_rmsnorm_weight`), as a model would do at load time.

What remains is a cheap pre-pass (``_rmsnorm_rstd_kernel``: read x, write M fp32 numbers) and the
matmul of :mod:`fusionlab.kernels.matmul` on x itself with the row-scale epilogue. x is read twice
(once by each launch) and xn never exists.

Where it is exact and where rounding differs. In exact arithmetic both forms are the same function.
In floating point the unfused path rounds xn = x * rstd * gamma to the storage dtype (fp16/bf16)
before the matmul; the folded path instead rounds W' = W * gamma once, keeps x as given and applies
rstd in fp32 to the fp32 accumulator. Each path rounds one operand once, so both are as accurate
(the error is that of one storage rounding of an operand, ~2^-9 relative for bf16 per element,
averaging out across the K sum), but they are not bit-identical. The folded product is exact, and the
fused result then differs from the float64 reference only by fp32 accumulation, when gamma holds
powers of two (the fold then only shifts exponents, unless a product falls below the dtype's smallest
normal number) or when the weight is kept in fp32
(``tests/test_rmsnorm_linear.py`` checks both).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .. import runtime
from .._exercise import answer_key
from ..ledger import Ledger
from ._launch import KernelInputError, Launcher, cdiv, check_same, check_tensor, launch_kwargs, next_pow2
from ._norms import check_eps
from .linear import _activate, _rows
from .matmul import _check_activation, _tiles, check_operand, gemm, matmul_config


@answer_key
def rmsnorm_linear_reference(x, gamma, weight, eps: float = 1e-6, bias=None, activation=None) -> torch.Tensor:
    """The spec: ``act((x * rstd * gamma) @ weight.T + bias)``, ``rstd = 1/sqrt(mean(x^2) + eps)`` over
    the last dimension, all in float64, returned in ``x.dtype``."""
    _check_activation(activation, "rmsnorm_linear_reference")
    xd = x.double()
    xn = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * gamma.double()
    h = xn @ weight.double().t()
    if bias is not None:
        h = h + bias.double()
    return _activate(h, activation).to(x.dtype)


def rmsnorm_linear_eager(x, gamma, weight, eps: float = 1e-6, bias=None, activation=None) -> torch.Tensor:
    """What eager PyTorch runs: ``F.rms_norm`` (writes xn in x's dtype), then ``F.linear`` (cuBLAS),
    then the activation."""
    _check_activation(activation, "rmsnorm_linear_eager")
    xn = F.rms_norm(x, (x.shape[-1],), gamma, eps)
    return _activate(F.linear(xn, weight, bias), activation)


@answer_key
def rmsnorm_linear_ledger(
    M: int,
    K: int,
    N: int,
    dtype=torch.bfloat16,
    *,
    bias: bool = False,
    activation: str | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
) -> Ledger:
    """The layer op by op as it runs unfused with a one-kernel RMSNorm (lesson 4): the norm reads x
    (M x K) and gamma (K) and writes xn (M x K); the matmul reads xn and w (N x K) and writes h; then
    the bias add and the activation, as in :func:`fusionlab.kernels.linear.linear_ledger`.

    The fused schedule is what the two launches move: the pre-pass reads x and writes M fp32 rstd; the
    matmul reads x again, W' (N x K, gamma folded in, so gamma itself is not read), rstd and b, and
    writes y.
    """
    _check_activation(activation, "rmsnorm_linear_ledger")
    led = Ledger(dtype_bytes=dtype, sizes={"rstd": torch.float32})
    led.fused("rstd pre-pass", reads={"x": M * K}, writes={"rstd": M})
    led.fused(
        "matmul + epilogue",
        reads={"x": M * K, "w'": N * K, "rstd": M, **({"b": N} if bias else {})},
        writes={"y": M * N},
    )
    led.op("rmsnorm", reads={"x": M * K, "gamma": K}, writes={"xn": M * K})
    last = "h" if (bias or activation) else "y"
    led.op("matmul", reads={"xn": M * K * _tiles(N, block_n), "w": N * K * _tiles(M, block_m)}, writes={last: M * N})
    prev = last
    if bias:
        out = "t" if activation else "y"
        led.op("add", reads={prev: M * N, "b": N}, writes={out: M * N})
        prev = out
    if activation:
        led.op(activation, reads={prev: M * N}, writes={"y": M * N})
    return led


def rmsnorm_linear_bytes(M: int, K: int, N: int, dtype=torch.bfloat16, *, bias: bool = False) -> int:
    """Bytes the two launches move (each input read once per launch): the ledger's fused schedule."""
    return rmsnorm_linear_ledger(M, K, N, dtype, bias=bias).fused_bytes


def rmsnorm_linear_flops(M: int, K: int, N: int, *, bias: bool = False, activation: str | None = None) -> int:
    """Nominal FLOPs: ``2 M N K`` for the matmul, ``2 M K`` for the sums of squares, one per output
    for the row scale (and the bias), eight for an activation."""
    _check_activation(activation, "rmsnorm_linear_flops")
    return 2 * M * N * K + 2 * M * K + M * N * (1 + int(bias) + 8 * int(activation is not None))


@triton.jit
def _rmsnorm_rstd_kernel(x_ptr, rstd_ptr, n_rows, n_cols, stride_xm, eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # The pre-pass: rstd[m] = 1 / sqrt(mean(x[m, :]^2) + eps) in fp32, over the WHOLE row, walked in
    # BLOCK_N pieces. One read of x, M numbers written.
    pid = tl.program_id(axis=0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < n_rows
    row_ptrs = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # sums of squares overflow fp16: fp32
    for start in range(0, n_cols, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        x = tl.load(row_ptrs + offs_n[None, :], mask=mask_m[:, None] & (offs_n[None, :] < n_cols), other=0.0)
        x = x.to(tl.float32)
        acc += x * x
    mean_sq = tl.sum(acc, axis=1) / n_cols
    tl.store(rstd_ptr + offs_m, 1.0 / tl.sqrt(mean_sq + eps), mask=mask_m)


@functools.lru_cache(maxsize=4096)
def _rstd_config(n_rows: int, n_cols: int, gpu: bool) -> dict:
    # A tile of ~4096 elements (GPU; 64 Ki in the interpreter, where programs cost Python time), at
    # most 2048 columns wide: short rows get several rows per program.
    tile, max_n = (4096, 2048) if gpu else (65536, 4096)
    block_n = max(16, min(next_pow2(n_cols), max_n))
    block_m = max(1, min(tile // block_n, next_pow2(n_rows)))
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": 8 if block_m * block_n >= 4096 else 4}


def rmsnorm_linear_config(M: int, K: int, N: int, dtype: torch.dtype) -> dict:
    """``{"rstd": {BLOCK_M, BLOCK_N, num_warps}, "matmul": matmul_config(...)}``: the pre-pass walks
    each row in up to 2048-column pieces (a ~4096-element tile on a GPU); the matmul's configuration
    is :func:`fusionlab.kernels.matmul.matmul_config`'s."""
    return {"rstd": dict(_rstd_config(int(M), int(K), runtime.is_gpu())), "matmul": matmul_config(M, N, K, dtype)}


_launch_rstd = Launcher(_rmsnorm_rstd_kernel)


def rmsnorm_rstd(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The pre-pass alone: ``1 / sqrt(mean(x^2, -1) + eps)`` in fp32 for each row of x (..., K).
    Returns shape ``x.shape[:-1]``, fp32."""
    op = "rmsnorm_rstd"
    eps = check_eps(eps, op)
    check_tensor(x, "x", op=op, contiguous=False, max_numel=None)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise KernelInputError(f"{op}: x must have a last dimension of at least one feature, got {tuple(x.shape)}.")
    x2 = _rows(x, "x", x.shape[-1], op) if x.dim() != 1 else x.view(1, -1)
    return _rstd(x2, eps).view(x.shape[:-1])


def _rstd(x2: torch.Tensor, eps: float) -> torch.Tensor:
    M, K = x2.shape
    rstd = torch.empty(M, device=x2.device, dtype=torch.float32)
    if M == 0:
        return rstd
    cfg = _rstd_config(M, K, runtime.is_gpu())
    grid = (cdiv(M, cfg["BLOCK_M"]),)
    _launch_rstd(
        grid,
        x2,
        rstd,
        M,
        K,
        x2.stride(0),
        eps,
        BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"],
        **launch_kwargs(cfg["num_warps"]),
    )
    return rstd


def fold_rmsnorm_weight(weight: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """``W' = W * gamma[None, :]``: RMSNorm's gamma folded into F.linear's (N, K) weight, computed in
    fp32 and rounded once to ``weight.dtype``. A model does this once, when it loads its weights."""
    op = "fold_rmsnorm_weight"
    check_operand(weight, "weight", op)
    check_tensor(gamma, "gamma", op=op, ndim=1)
    check_same(weight, gamma, "weight and gamma", op=op, shape=False)
    if gamma.shape[0] != weight.shape[1]:
        raise KernelInputError(
            f"{op}: gamma has {gamma.shape[0]} elements but weight is {tuple(weight.shape)}; gamma is (K,)."
        )
    return (weight.float() * gamma.float()[None, :]).to(weight.dtype)


def rmsnorm_linear(
    x: torch.Tensor,
    gamma: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    *,
    folded_weight: torch.Tensor | None = None,
    variant: str | None = None,
    config: dict | None = None,
    input_precision: str | None = None,
) -> torch.Tensor:
    """``act(RMSNorm(x; gamma, eps) @ weight.T + bias)`` without writing the normalised x.

    Two launches: the rstd pre-pass (fp32, one number per row) and the matmul on x with W' = W * gamma
    and the epilogue ``act(rstd[m] * acc + b)``. ``x``: (..., K), rows contiguous; ``gamma``: (K,);
    ``weight``: (N, K); ``bias``: (N,) or None; ``activation`` as for
    :func:`fusionlab.kernels.linear.linear`. ``folded_weight``: W' precomputed by
    :func:`fold_rmsnorm_weight` (pass it: otherwise each call folds gamma into the weight again, an
    extra pass over W in torch). ``variant``, ``config``, ``input_precision``: as for
    :func:`fusionlab.kernels.matmul.matmul`. Trips: :func:`rmsnorm_linear_ledger`,
    :func:`rmsnorm_linear_bytes`. Reference: :func:`rmsnorm_linear_reference`.
    """
    op = "rmsnorm_linear"
    act = _check_activation(activation, op)
    eps = check_eps(eps, op)
    check_tensor(x, "x", op=op, contiguous=False, max_numel=None)
    if x.dim() < 1:
        raise KernelInputError(f"{op}: x must have at least one dimension (..., K), got a scalar.")
    check_operand(weight, "weight", op)
    check_tensor(gamma, "gamma", op=op, ndim=1)
    check_same(x, weight, "x and weight", op=op, shape=False)
    check_same(x, gamma, "x and gamma", op=op, shape=False)
    N, K = weight.shape
    if x.shape[-1] != K or gamma.shape[0] != K:
        raise KernelInputError(
            f"{op}: x {tuple(x.shape)}, gamma {tuple(gamma.shape)} and weight {tuple(weight.shape)} disagree: "
            "x is (..., K), gamma (K,), weight (N, K)."
        )
    if K == 0:
        raise KernelInputError(f"{op}: an RMSNorm over zero features has no mean (x has shape {tuple(x.shape)}).")
    if bias is not None:
        check_tensor(bias, "bias", op=op, ndim=1)
        check_same(x, bias, "x and bias", op=op, shape=False)
        if bias.shape[0] != N:
            raise KernelInputError(f"{op}: bias has {bias.shape[0]} elements but weight has N={N}; bias is (N,).")
    if folded_weight is None:
        folded_weight = fold_rmsnorm_weight(weight, gamma)
    else:
        check_operand(folded_weight, "folded_weight", op)
        check_same(weight, folded_weight, "weight and folded_weight", op=op)
    x2 = x.view(1, K) if x.dim() == 1 else _rows(x, "x", K, op)
    rstd = _rstd(x2, eps)
    y = gemm(
        x2,
        folded_weight.t(),
        bias=bias,
        activation=act,
        row_scale=rstd,
        variant=variant,
        config=config,
        input_precision=input_precision,
        op=op,
        checked=True,
    )
    return y.view(*x.shape[:-1], N)
