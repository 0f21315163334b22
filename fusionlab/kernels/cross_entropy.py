"""Lesson 5: cross-entropy over a huge vocabulary — loss and gradient in one pass, no probabilities.

For logits ``x`` of shape ``(T, V)`` (tokens, vocabulary) and targets ``y``, with label smoothing ε:

    lse_t  = log Σ_j exp(x_tj)                                   (the log-sum-exp of the row)
    loss_t = (1 − ε) (lse_t − x_t,y_t) + ε (lse_t − mean_j x_tj)    (0 for a row with y_t = ignore_index)
    dloss_t/dx_tj = softmax(x_t)_j − (1 − ε) [j = y_t] − ε / V

and ``reduction`` "mean" divides by the number of rows not ignored (so does the gradient), "sum" does
not, "none" returns loss_t per row. This is ``F.cross_entropy`` on 2-D logits.

Eager PyTorch materialises the log-probabilities (``log_softmax``: a (T, V) tensor), then in the
backward a (T, V) gradient of them (``nll_loss_backward``: zeros with one entry a row), then the
gradient of the logits: three (T, V) tensors besides the logits, and six (T, V) trips through memory.
At 8k tokens × 128k vocabulary in bf16 each of them is 2 GiB.

The fused kernel (:func:`_cross_entropy_fwd_kernel`) gives each row one program. It walks the row in
tiles keeping a running maximum m and a running sum d = Σ exp(x − m) (the online log-sum-exp: when
a tile raises the maximum, d is rescaled by exp(m_old − m_new)), picks out x_y, and so has the loss
after one read. The gradient needs the row's final lse, so a second sweep over the row computes
``exp(x − lse) − (1 − ε)[j = y] − ε/V`` (times the reduction's scale) and writes it — into a gradient
buffer, or **over the logits** (``inplace_grad=True``). No probability tensor ever exists. The first
tile of the row (up to 64 KiB) stays in registers from the first sweep to the second, so a row that
fits in it is read once; a wider row's remaining tiles are read again, newest first, so that the
second sweep finds what it read last still in L2 (the ledger counts the re-read honestly, as
``rereads``). The backward of the autograd function only multiplies the stored gradient by
grad_output — and skips rows whose grad_output is exactly 1, the usual case, without a host sync.

Numerics: fp32 arithmetic for any storage dtype, max subtraction (logits of 1e4 do not overflow),
padded lanes masked to −inf (never counted as probability mass), 64-bit row offsets (T × V past
2**31 elements is fine), any V ≥ 1 (no block-size limit: the row is tiled). A target outside
[0, V) that is not ``ignore_index`` gives a NaN loss and a NaN gradient row (never a read out of
bounds; torch raises instead, and on a GPU that needs a host sync we avoid).

References: Milakov & Gimelshein, "Online normalizer calculation for softmax" (2018); Liger-Kernel's
``cross_entropy`` (Hsu et al., 2024), whose in-place gradient this follows.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .. import runtime
from ._launch import KernelInputError, check_block, check_tensor, element_size, launch_kwargs, next_pow2, row_config
from .swiglu import FusedLedger

REDUCTIONS = ("mean", "sum", "none")


# -- spec, eager, ledger, flops -----------------------------------------------------------------------
def cross_entropy_reference(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """The spec: ``F.cross_entropy`` computed in float64 (differentiable: its autograd gradient is the
    gradient reference), returned in the logits' dtype."""
    loss = F.cross_entropy(
        logits.double(), target, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing
    )
    return loss.to(logits.dtype)


def cross_entropy_eager(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """What eager PyTorch runs: ``F.cross_entropy`` (log_softmax, then nll_loss; autograd keeps the
    log-probabilities for the backward)."""
    return F.cross_entropy(
        logits, target, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing
    )


def _rows_as(n_rows: int, nbytes_each: int, dtype) -> int:
    # The ledger counts one element size; per-row tensors of another dtype (int64 targets, fp32 losses)
    # are counted in logits-sized units so that the byte totals stay exact.
    return -(-n_rows * nbytes_each // element_size(dtype))


def cross_entropy_ledger(
    tokens: int,
    vocab: int,
    dtype,
    *,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    backward: bool = True,
    head: int | None = None,
) -> FusedLedger:
    """Trips of cross-entropy on (tokens, vocab) logits, forward + backward, as eager runs it and fused.

    Eager (``backward=True``), op by op: ``log_softmax`` reads the logits, writes lsm; ``nll_loss``
    gathers one lsm per row; ``nll_loss_backward`` writes a (T, V) gradient of lsm (zeros and one entry
    per row); ``log_softmax_backward`` reads it and lsm, writes the gradient of the logits: six (T, V)
    trips. Label smoothing adds ``sum`` over lsm and, backward, the ``add`` of its broadcast gradient.
    Fused: read the logits (and targets), write the gradient (and per-row losses); ``rereads`` holds
    the second sweep's re-read of the part of each row beyond the ``head`` elements kept on chip
    (default: the launcher's configuration for this vocabulary; 0 re-read when the row fits).
    ``backward=False``: the forward alone (eager: log_softmax + nll_loss; fused: read once, no gradient).
    Per-row int64 targets and fp32 losses are counted in logits-sized units.
    """
    n = tokens * vocab
    tgt = _rows_as(tokens, 8, dtype)
    rowf = _rows_as(tokens, 4, dtype)
    out_loss = rowf if reduction == "none" else _rows_as(1, 4, dtype)
    outputs = ("loss", "grad_logits") if backward else ("loss",)
    reread = 0
    if backward:
        if head is None:
            head = cross_entropy_config(vocab, _dtype_of(dtype))["HEAD"]
        reread = tokens * max(0, vocab - head)
    led = FusedLedger(dtype_bytes=dtype, outputs=outputs, rereads={"logits": reread})
    led.op("log_softmax", reads={"logits": n}, writes={"lsm": n})
    led.op("nll_loss", reads={"lsm": tokens, "target": tgt}, writes={"loss": out_loss})
    if label_smoothing:
        led.op("sum", reads={"lsm": n}, writes={"smooth": rowf})
    if not backward:
        return led
    led.op("nll_bwd", reads={"target": tgt}, writes={"grad_lsm": n})
    if label_smoothing:
        led.op("add", reads={"grad_lsm": n, "smooth": rowf}, writes={"grad_lsm2": n})
        led.op("lsm_bwd", reads={"grad_lsm2": n, "lsm": n}, writes={"grad_logits": n})
    else:
        led.op("lsm_bwd", reads={"grad_lsm": n, "lsm": n}, writes={"grad_logits": n})
    return led


def _dtype_of(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    return {4: torch.float32, 2: torch.bfloat16}.get(int(dtype), torch.float32)


def cross_entropy_flops(tokens: int, vocab: int, *, backward: bool = True) -> int:
    """Nominal FLOPs: forward 4 per logit (max, subtract, exp, add), backward 4 more (exp, multiply,
    subtract, the target's compare); the special-function rate, not the FLOPs, is what can bind."""
    return (8 if backward else 4) * tokens * vocab


def cross_entropy_peak_memory(fn, *args, **kwargs) -> int:
    """Peak bytes allocated while ``fn(*args, **kwargs)`` runs, beyond what was allocated before it
    (``torch.cuda.max_memory_allocated``; GPU only). The result of ``fn`` counts, since it is alive at
    the end; call ``fn`` once before to keep compilation out of the number."""
    if not runtime.is_gpu():
        raise RuntimeError("cross_entropy_peak_memory measures CUDA memory; this is interpreter mode.")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn(*args, **kwargs)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak


# -- configuration ------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def _config(n_cols: int, dtype: torch.dtype, align: bool, gpu: bool) -> dict:
    # HEAD: the first tile of a row, kept on chip between the sweeps (64 KiB of row on a GPU, as
    # row_config's largest single tile; 4096 elements in the interpreter). BLOCK_N: the tiles that
    # stream the rest. An aligned window may start up to VEC - 1 elements before the row.
    vec = 16 // element_size(dtype)
    span = n_cols + (vec - 1 if align else 0)
    base = row_config(span, dtype, gpu=gpu)
    head = base["BLOCK_N"]
    if gpu:
        block_n = min(head, 32 * 32 * vec)  # one 16-byte access per thread of 32 warps
        num_warps = max(base["num_warps"], min(32, next_pow2(head // (32 * 16))))
    else:
        block_n = min(head, 2048)
        num_warps = 4
    return {"HEAD": head, "BLOCK_N": block_n, "num_warps": num_warps, "PREFETCH": False, "num_stages": None}


def cross_entropy_config(n_cols: int, dtype: torch.dtype, *, stride: int | None = None) -> dict:
    """The launch configuration for rows of ``n_cols`` logits: ``{"HEAD", "BLOCK_N", "num_warps",
    "VEC"}``. HEAD elements of a row stay in registers between the two sweeps; the rest is streamed in
    BLOCK_N tiles. VEC > 1 when the row stride (default ``n_cols``) is not a multiple of 16: each row's
    tile window then starts at the 16-byte boundary before the row, so loads stay 16 bytes wide.
    """
    stride = n_cols if stride is None else stride
    vec = 16 // element_size(dtype)
    align = stride % 16 != 0 and vec > 1
    cfg = dict(_config(int(n_cols), dtype, align, runtime.is_gpu()))
    cfg["VEC"] = vec if align else 1
    return cfg


# -- kernels --------------------------------------------------------------------------------------------
@triton.jit
def _cross_entropy_fwd_kernel(
    x_ptr,
    target_ptr,
    grad_ptr,
    loss_ptr,
    n_valid_ptr,
    n_cols,
    stride_xm,
    stride_gm,
    ignore_index,
    label_smoothing,
    HEAD: tl.constexpr,
    BLOCK_N: tl.constexpr,
    VEC: tl.constexpr,
    WRITE_GRAD: tl.constexpr,
    MEAN: tl.constexpr,
    SMOOTH: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    row = tl.program_id(axis=0).to(tl.int64)  # row * stride passes 2**31 at 16k x 128k
    y = tl.load(target_ptr + row)
    x_start = row * stride_xm
    g_start = row * stride_gm
    if VEC > 1:
        # Rows of odd length start anywhere: open the tile window at the 16-byte boundary before the
        # row so every tile load is 16 bytes wide. Lanes before the row (lead) are masked. The
        # launcher sets VEC > 1 only when the gradient has the logits' stride (same lead).
        lead = (x_start % VEC).to(tl.int32)
        x_win = tl.multiple_of(x_start - lead, VEC)
        g_win = tl.multiple_of(g_start - lead, VEC)
    else:
        lead = 0
        x_win = x_start
        g_win = g_start
    span = n_cols + lead  # window lanes that cover the row

    if y == ignore_index:
        # zero loss, zero gradient (and the mean's denominator never counted this row)
        if WRITE_GRAD:
            zero = tl.zeros([BLOCK_N], dtype=grad_ptr.dtype.element_ty)
            for start in range(0, span, BLOCK_N):
                offs = start + tl.arange(0, BLOCK_N)
                tl.store(grad_ptr + g_win + offs, zero, mask=(offs >= lead) & (offs < span))
        tl.store(loss_ptr + row, 0.0)
    else:
        valid = (y >= 0) & (y < n_cols)  # an out-of-range target: NaN, never a stray read
        x_y = tl.load(x_ptr + x_start + y, mask=valid, other=float("nan")).to(tl.float32)

        # sweep 1: online log-sum-exp. The head tile stays in registers (in its storage dtype) for sweep 2.
        offs_h = tl.arange(0, HEAD)
        mask_h = (offs_h >= lead) & (offs_h < span)
        x_h_raw = tl.load(x_ptr + x_win + offs_h, mask=mask_h, other=float("-inf"))
        n_tail = tl.maximum(tl.cdiv(span - HEAD, BLOCK_N), 0)
        if PREFETCH:  # issue the next tile's load before reducing this one: two tiles in flight
            offs = HEAD + tl.arange(0, BLOCK_N)
            x_next = tl.load(x_ptr + x_win + offs, mask=offs < span, other=float("-inf"))
        x_h = x_h_raw.to(tl.float32)
        m = tl.max(x_h, axis=0)
        # a tile of only -inf (masked lanes, or -inf logits) has max -inf: exponentiate against 0
        # instead, or exp(-inf - -inf) would be NaN
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        d = tl.sum(tl.exp(x_h - m_safe), axis=0)
        if SMOOTH:
            sum_x = tl.sum(tl.where(mask_h, x_h, 0.0), axis=0)
        for i in range(0, n_tail):
            offs = HEAD + i * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = offs < span
            if PREFETCH:
                x = x_next.to(tl.float32)
                offs_next = offs + BLOCK_N
                x_next = tl.load(x_ptr + x_win + offs_next, mask=offs_next < span, other=float("-inf"))
            else:
                x = tl.load(x_ptr + x_win + offs, mask=mask, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            d = d * tl.exp(m - m_safe) + tl.sum(tl.exp(x - m_safe), axis=0)
            m = m_new
            if SMOOTH:
                sum_x += tl.sum(tl.where(mask, x, 0.0), axis=0)
        # lse = m + log d; a row of only -inf gives d = 0 and lse = -inf (loss NaN, as torch)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        lse = m_safe + tl.log(d)
        loss = lse - x_y
        if SMOOTH:
            loss = (1.0 - label_smoothing) * loss + label_smoothing * (lse - sum_x / n_cols)
        tl.store(loss_ptr + row, loss)

        if WRITE_GRAD:
            # sweep 2: grad = (softmax - (1 - eps) onehot - eps / V) * scale, scale = 1/n_valid for
            # "mean" (loaded from the device: no host sync), 1 otherwise (backward multiplies).
            if MEAN:
                scale = 1.0 / tl.load(n_valid_ptr).to(tl.float32)
            else:
                scale = 1.0
            scale = tl.where(valid, scale, float("nan"))
            c_p = scale / d  # exp(x - m) * scale / d = softmax * scale
            c_t = (1.0 - label_smoothing) * scale
            c_s = label_smoothing / n_cols * scale
            # the streamed tiles newest first: the last ones read are the likeliest still in L2
            if PREFETCH:
                offs = HEAD + (n_tail - 1) * BLOCK_N + tl.arange(0, BLOCK_N)
                x_next = tl.load(x_ptr + x_win + offs, mask=(offs >= HEAD) & (offs < span), other=float("-inf"))
            for i in range(0, n_tail):
                offs = HEAD + (n_tail - 1 - i) * BLOCK_N + tl.arange(0, BLOCK_N)
                mask = offs < span
                if PREFETCH:
                    x = x_next.to(tl.float32)
                    offs_next = offs - BLOCK_N
                    mask_next = (offs_next >= HEAD) & (offs_next < span)
                    x_next = tl.load(x_ptr + x_win + offs_next, mask=mask_next, other=float("-inf"))
                else:
                    x = tl.load(x_ptr + x_win + offs, mask=mask, other=float("-inf")).to(tl.float32)
                grad = tl.exp(x - m_safe) * c_p - c_s - tl.where(offs - lead == y, c_t, 0.0)
                tl.store(grad_ptr + g_win + offs, grad.to(grad_ptr.dtype.element_ty), mask=mask)
            # the head from registers: read once
            x_h = x_h_raw.to(tl.float32)
            grad = tl.exp(x_h - m_safe) * c_p - c_s - tl.where(offs_h - lead == y, c_t, 0.0)
            tl.store(grad_ptr + g_win + offs_h, grad.to(grad_ptr.dtype.element_ty), mask=mask_h)


@triton.jit
def _cross_entropy_bwd_kernel(
    grad_ptr,
    target_ptr,
    grad_out_ptr,
    n_cols,
    stride_gm,
    stride_go,
    ignore_index,
    BLOCK_N: tl.constexpr,
):
    # grad *= grad_output[row] in place, skipping rows whose grad_output is exactly 1 (a loss that is
    # the last op: the common case costs one launch and no pass) and ignored rows (their gradient is
    # 0 whatever grad_output is; 0 * inf would be NaN)
    row = tl.program_id(axis=0).to(tl.int64)
    y = tl.load(target_ptr + row)
    go = tl.load(grad_out_ptr + row * stride_go).to(tl.float32)
    if (y != ignore_index) & (go != 1.0):
        base = grad_ptr + row * stride_gm
        for start in range(0, n_cols, BLOCK_N):
            offs = start + tl.arange(0, BLOCK_N)
            mask = offs < n_cols
            g = tl.load(base + offs, mask=mask).to(tl.float32)
            tl.store(base + offs, (g * go).to(grad_ptr.dtype.element_ty), mask=mask)


# -- launchers ------------------------------------------------------------------------------------------
def _check_args(ignore_index, reduction, label_smoothing, op):
    if reduction not in REDUCTIONS:
        raise KernelInputError(f"{op}: reduction={reduction!r}; choose one of {', '.join(map(repr, REDUCTIONS))}.")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        raise KernelInputError(f"{op}: ignore_index must be an int, got {ignore_index!r}.")
    if (
        isinstance(label_smoothing, bool)
        or not isinstance(label_smoothing, (int, float))
        or not (0.0 <= float(label_smoothing) <= 1.0)
    ):
        raise KernelInputError(f"{op}: label_smoothing must be a number in [0, 1], got {label_smoothing!r}.")
    return float(label_smoothing)


def _check_inputs(logits, target, op, *, logits_name="logits"):
    check_tensor(logits, logits_name, op=op, ndim=2, contiguous=False, grad=True, max_numel=None)
    check_tensor(target, "target", op=op, dtypes=(torch.int64,), ndim=1)
    if target.device != logits.device:
        raise KernelInputError(f"{op}: target is on {target.device}, {logits_name} on {logits.device}.")
    if target.shape[0] != logits.shape[0]:
        raise KernelInputError(
            f"{op}: target has {target.shape[0]} entries but {logits_name} has {logits.shape[0]} rows "
            f"(shape {tuple(logits.shape)}); give one class index per row. Reshape (B, T, V) logits to "
            "(B*T, V) and (B, T) targets to (B*T,)."
        )
    if logits.shape[1] < 1:
        raise KernelInputError(f"{op}: {logits_name} has no classes (shape {tuple(logits.shape)}).")
    if logits.shape[1] >= 2**31:
        raise KernelInputError(f"{op}: a vocabulary of {logits.shape[1]} is past the kernel's int32 columns.")


def _launch_forward(logits, target, grad, loss_rows, n_valid, ignore_index, label_smoothing, cfg):
    """One program per row. ``grad``: the gradient's destination (None: forward only; ``logits``
    itself: in place). ``n_valid``: device count of rows not ignored ("mean"), else None."""
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        return
    g = logits if grad is None else grad
    _cross_entropy_fwd_kernel[(n_rows,)](
        logits,
        target,
        g,
        loss_rows,
        target if n_valid is None else n_valid,
        n_cols,
        logits.stride(0),
        g.stride(0),
        ignore_index,
        label_smoothing,
        HEAD=cfg["HEAD"],
        BLOCK_N=cfg["BLOCK_N"],
        VEC=cfg["VEC"],
        WRITE_GRAD=grad is not None,
        MEAN=n_valid is not None,
        SMOOTH=label_smoothing != 0.0,
        PREFETCH=cfg["PREFETCH"],
        **launch_kwargs(cfg["num_warps"], cfg.get("num_stages")),
    )


def _launch_backward(grad, target, grad_output, ignore_index):
    n_rows, n_cols = grad.shape
    if n_rows == 0:
        return
    stride_go = grad_output.stride(0) if grad_output.dim() else 0
    cfg = _config(n_cols, grad.dtype, False, runtime.is_gpu())
    _cross_entropy_bwd_kernel[(n_rows,)](
        grad,
        target,
        grad_output,
        n_cols,
        grad.stride(0),
        stride_go,
        ignore_index,
        BLOCK_N=cfg["BLOCK_N"],
        **launch_kwargs(min(cfg["num_warps"], 8)),
    )


def _reduce(loss_rows, n_valid, reduction, dtype):
    if reduction == "none":
        return loss_rows.to(dtype)
    total = loss_rows.sum()
    if reduction == "mean":
        total = total / n_valid  # all rows ignored: 0 / 0 = NaN, as torch
    return total.to(dtype)


def _increment_version(t: torch.Tensor) -> None:
    # Tell autograd that t's memory changed: any other op that saved t for its backward then raises
    # "modified by an inplace operation" instead of silently using gradients as logits.
    bump = getattr(torch.autograd.graph, "increment_version", None)
    if bump is not None:
        bump(t)


class CrossEntropyFunction(torch.autograd.Function):
    """Forward computes the loss and the gradient (scaled for the reduction) in one kernel and stores
    the gradient; backward multiplies it by grad_output, row by row, in place."""

    @staticmethod
    def forward(ctx, logits, target, ignore_index, reduction, label_smoothing, inplace_grad, cfg):
        grad = logits if inplace_grad else torch.empty_like(logits)
        loss_rows = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        n_valid = (target != ignore_index).sum() if reduction == "mean" else None
        _launch_forward(logits, target, grad, loss_rows, n_valid, ignore_index, label_smoothing, cfg)
        if inplace_grad:
            _increment_version(logits)
        ctx.save_for_backward(grad.detach(), target)
        ctx.ignore_index = ignore_index
        ctx.used = False
        return _reduce(loss_rows, n_valid, reduction, logits.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        if ctx.used:
            raise RuntimeError(
                "cross_entropy: backward ran twice through the same graph (retain_graph=True). The "
                "gradient is stored once and scaled in place; run the forward again instead."
            )
        ctx.used = True
        grad, target = ctx.saved_tensors
        _launch_backward(grad, target, grad_output, ctx.ignore_index)
        return grad, None, None, None, None, None, None


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    inplace_grad: bool = False,
    head_n: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """``F.cross_entropy(logits, target, ...)`` fused: loss and gradient in one kernel, one pass a row.

    ``logits``: ``(T, V)``, fp32/bf16/fp16 (math in fp32), rows may be strided (last dim contiguous);
    ``target``: ``(T,)`` int64 class indices, or ``ignore_index`` (zero loss, zero gradient, not in the
    mean's denominator). ``reduction``: "mean" (all rows ignored: NaN, as torch), "sum" or "none"
    (per row). ``label_smoothing`` in [0, 1], never applied to ignored rows. Returns the loss in the
    logits' dtype, differentiable when ``logits.requires_grad``.

    With autograd on, the forward also writes the gradient (trips: read the logits, write the
    gradient; a row wider than the on-chip head is read twice, see the module docstring). It is
    written to a new buffer, or with ``inplace_grad=True`` **over the logits**: the logits are then
    destroyed (they hold the gradient; ``logits.grad``, for a leaf, is the same memory), no (T, V)
    memory is added, and any other op that saved the logits for its backward raises when it runs.
    Without autograd (``torch.no_grad()`` or logits not requiring grad) only the loss is computed, in
    one read, and the logits are left as they are.

    ``head_n``, ``block_n``, ``num_warps`` override :func:`cross_entropy_config` (powers of two) for a
    tuning sweep. Reference: :func:`cross_entropy_reference`.
    """
    op = "cross_entropy"
    label_smoothing = _check_args(ignore_index, reduction, label_smoothing, op)
    _check_inputs(logits, target, op)
    n_rows, n_cols = logits.shape
    need_grad = torch.is_grad_enabled() and logits.requires_grad
    # VEC alignment needs the gradient at the logits' stride: true in place and for a contiguous
    # logits tensor (its empty_like is contiguous too)
    same_stride = (not need_grad) or inplace_grad or logits.is_contiguous()
    cfg = cross_entropy_config(n_cols, logits.dtype, stride=logits.stride(0) if same_stride else 16)
    if head_n is not None or block_n is not None or num_warps is not None:
        cfg = dict(cfg)
        if head_n is not None:
            cfg["HEAD"] = check_block(head_n, "head_n", op)
        if block_n is not None:
            cfg["BLOCK_N"] = check_block(block_n, "block_n", op)
        if num_warps is not None:
            cfg["num_warps"] = check_block(num_warps, "num_warps", op, max_value=32)
        if cfg["HEAD"] < cfg["VEC"]:
            raise KernelInputError(f"{op}: head_n={cfg['HEAD']} is below the alignment window of {cfg['VEC']}.")
    if need_grad:
        return CrossEntropyFunction.apply(logits, target, ignore_index, reduction, label_smoothing, inplace_grad, cfg)
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    n_valid = (target != ignore_index).sum() if reduction == "mean" else None
    _launch_forward(logits, target, None, loss_rows, n_valid, ignore_index, label_smoothing, cfg)
    return _reduce(loss_rows, n_valid, reduction, logits.dtype)


__all__ = [
    "REDUCTIONS",
    "CrossEntropyFunction",
    "cross_entropy",
    "cross_entropy_config",
    "cross_entropy_eager",
    "cross_entropy_flops",
    "cross_entropy_ledger",
    "cross_entropy_peak_memory",
    "cross_entropy_reference",
]
