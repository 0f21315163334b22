"""Lesson 5: the output layer and its loss, ``cross_entropy(h @ W.T, y)``, without the (T, V) logits.

A language model's last matmul turns hidden states ``h`` (T, D) into logits (T, V) with the
vocabulary matrix ``W`` (V, D) (``F.linear`` layout), and the loss reads them once. At 8k tokens ×
128k vocabulary the logits alone are 2 GiB in bf16, and eager autograd adds the log-probabilities and
two gradients of the same size: the loss, not the model, sets the peak memory.

Chunked over tokens, the logits never exist whole. For each chunk of rows c (forward, with autograd):

    logits_c = h_c @ W.T                         (cuBLAS; chunk × V)
    grad_c   = cross_entropy gradient, in place   (the fused kernel: logits_c is overwritten)
    grad_h_c = grad_c @ W                         (cuBLAS)
    grad_W  += grad_c.T @ h_c                     (cuBLAS, accumulated in ``accum_dtype``)

Both gradients are computed in the forward and stored (as Liger-Kernel's fused linear cross-entropy
does); the backward multiplies them by grad_output, skipping the pass when it is exactly 1. Peak
memory: one chunk of logits plus the gradients themselves, instead of four (T, V) tensors. Time: the
same three matmuls as eager (2·T·V·D FLOPs each) plus one pass of the fused kernel over each chunk;
the cost of chunking is that ``grad_W`` (V × D) is read and written once per chunk.

``reduction="none"`` cannot be scaled afterwards (grad_W mixes the rows), so it computes only the
losses in the forward and recomputes each chunk's logits in the backward, where the per-row
grad_output is known: one matmul more, no memory more.
"""

from __future__ import annotations

import torch

from .. import runtime
from ._cross_entropy_kernels import _check_args, _launch_backward, _prologue, _reduce
from ._launch import KernelInputError, check_tensor, element_size
from ._tensors import check_targets, upstream_grad
from .cross_entropy import cross_entropy_config, cross_entropy_rows

# The loss is cross_entropy's, composed through its public parts (cross_entropy_config, and
# cross_entropy_rows: the row kernels' launcher, which lesson 5's kernel module keeps beside its kernel);
# what both ops launch around it (the prologue's count, the finish, the backward's scale, the argument
# checks) has one private home that both import, _cross_entropy_kernels.


def linear_cross_entropy_reference(
    h: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """The spec: ``F.cross_entropy(h @ W.T, target)`` in float64 (differentiable), in h's dtype."""
    logits = h.double() @ weight.double().T
    loss = torch.nn.functional.cross_entropy(
        logits, target, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing
    )
    return loss.to(h.dtype)


def linear_cross_entropy_eager(
    h: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """What eager PyTorch runs: the whole (T, V) logits, then ``F.cross_entropy``."""
    return torch.nn.functional.cross_entropy(
        h @ weight.T, target, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing
    )


def linear_cross_entropy_flops(tokens: int, hidden: int, vocab: int, *, backward: bool = True) -> int:
    """The three matmuls (logits, grad_h, grad_W), 2·T·V·D FLOPs each; the loss itself is noise."""
    return (6 if backward else 2) * tokens * hidden * vocab


def linear_cross_entropy_memory(
    tokens: int, hidden: int, vocab: int, dtype, *, chunk: int | None = None, accum_dtype=None
) -> dict:
    """Predicted extra memory (bytes) of fwd + bwd beyond the inputs, eager against chunked.

    Eager: logits, log-probabilities, and in the backward their gradient and the logits' gradient
    (four (T, V) tensors alive at the peak, less one: the logits are freed after log_softmax), then
    grad_W and grad_h. Chunked: one (chunk, V) logits buffer, grad_W (in ``accum_dtype``, plus its
    cast to the weight's dtype when they differ) and grad_h.
    """
    e = element_size(dtype)
    acc = element_size(accum_dtype or dtype)
    chunk = chunk or linear_cross_entropy_chunk(tokens, vocab, hidden)
    tv = tokens * vocab * e
    eager = max(2 * tv, 3 * tv, tv + vocab * hidden * e + tokens * hidden * e)
    fused = min(chunk, tokens) * vocab * e + vocab * hidden * acc + tokens * hidden * e
    if acc != e:
        fused += vocab * hidden * e
    return {"eager": eager, "chunked": fused}


def linear_cross_entropy_chunk(tokens: int, vocab: int, hidden: int) -> int:
    """Default rows per chunk: about an eighth of the tokens (so one chunk of logits is an eighth of
    the whole), a multiple of 256 rows and at least 256 on a GPU (a matmul with fewer rows than that
    leaves SMs idle, and grad_W's read-modify-write is paid once per chunk); 64 in the interpreter."""
    step = 256 if runtime.is_gpu() else 64
    return max(step, -(-tokens // 8 // step) * step)


def _addmm_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b, in acc's dtype; bf16/fp16 operands into an fp32 accumulator use cuBLAS's fp32
    output (torch >= 2.8: ``out_dtype``), otherwise the product is formed in fp32 first."""
    if acc.dtype == a.dtype:
        acc.addmm_(a, b)
        return
    try:
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    except (TypeError, RuntimeError, NotImplementedError):
        acc.addmm_(a.to(acc.dtype), b.to(acc.dtype))


def _chunks(n_rows: int, chunk: int):
    for start in range(0, n_rows, chunk):
        yield start, min(start + chunk, n_rows)


def _forward_chunks(
    h, weight, target, ignore_index, reduction, label_smoothing, chunk, *, grad_out, grad_h, grad_w, row_scale=None
):
    """The chunk loop. Writes per-row losses (fp32); when ``grad_h`` / ``grad_w`` are given, the
    gradients too (scaled for "mean" by the batch's count, and by ``row_scale`` per row if given).
    Returns the losses and the prologue's ``sync`` (its count, for "mean"; else None)."""
    n_rows = h.shape[0]
    vocab = weight.shape[0]
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=h.device)
    mean = reduction == "mean"
    want_grad = grad_h is not None or grad_w is not None
    cfg = cross_entropy_config(vocab, h.dtype, grad=want_grad)  # the chunk buffer is contiguous: stride V
    # sync[0]: the mean's denominator, over the whole batch; split rows need their ticket and counts
    # zeroed for every chunk, so they get a fresh buffer (one more small launch) a chunk
    split = want_grad and bool(cfg.get("SPLIT"))
    sync = _prologue(target, ignore_index, count=True) if mean else None
    chunk_sync = sync
    buf = torch.empty((min(chunk, n_rows), vocab), dtype=h.dtype, device=h.device)
    for start, end in _chunks(n_rows, chunk):
        if split:
            chunk_sync = _prologue(target, ignore_index, count=mean, n_rows_split=end - start)
        h_c = h[start:end]
        logits = buf[: end - start]
        torch.mm(h_c, weight.T, out=logits)  # (c, V)
        # the fused kernel, gradient in place of the chunk's logits (forward only: no gradient sweep)
        cross_entropy_rows(
            logits,
            target[start:end],
            logits if want_grad else None,
            loss_rows[start:end],
            chunk_sync,
            ignore_index,
            label_smoothing,
            cfg,
            mean=mean,
        )
        if not want_grad:
            continue
        if row_scale is not None:  # reduction "none": each row times its grad_output
            _launch_backward(logits, target[start:end], row_scale[start:end], ignore_index, cfg)
        if grad_h is not None:
            torch.mm(logits, weight, out=grad_h[start:end])  # (c, D)
        if grad_w is not None:
            _addmm_(grad_w, logits.T, h_c)  # (V, D) += (V, c) @ (c, D)
    return loss_rows, sync


def _scale_(t: torch.Tensor, grad_output: torch.Tensor, target_dummy: torch.Tensor) -> None:
    """t *= grad_output (a scalar) in place, rows of t; a no-op pass when grad_output is exactly 1."""
    if t is None or t.numel() == 0:
        return
    t2 = t.view(-1, t.shape[-1])
    # every row is "not ignored": a target tensor of the right length with values != ignore_index
    _launch_backward(t2, target_dummy[: t2.shape[0]], grad_output, -1, cross_entropy_config(t2.shape[1], t2.dtype))


class LinearCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, target, ignore_index, reduction, label_smoothing, chunk, accum_dtype):
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        ctx.args = (ignore_index, reduction, label_smoothing, chunk, accum_dtype)
        ctx.used = False
        ctx.dtype = h.dtype  # the loss's, and so grad_output's
        if reduction == "none":  # gradients in the backward, once grad_output is known
            loss_rows, _ = _forward_chunks(
                h,
                weight,
                target,
                ignore_index,
                reduction,
                label_smoothing,
                chunk,
                grad_out=None,
                grad_h=None,
                grad_w=None,
            )
            ctx.save_for_backward(h, weight, target)
            return loss_rows.to(h.dtype)
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=accum_dtype, device=weight.device) if need_w else None
        loss_rows, sync = _forward_chunks(
            h,
            weight,
            target,
            ignore_index,
            reduction,
            label_smoothing,
            chunk,
            grad_out=None,
            grad_h=grad_h,
            grad_w=grad_w,
        )
        if grad_w is not None and grad_w.dtype != weight.dtype:
            grad_w = grad_w.to(weight.dtype)
        ctx.save_for_backward(grad_h, grad_w)
        return _reduce(loss_rows, sync, reduction, h.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        if ctx.used:
            raise RuntimeError(
                "linear_cross_entropy: backward ran twice through the same graph (retain_graph=True); the "
                "gradients are stored once and scaled in place. Run the forward again instead."
            )
        ctx.used = True
        grad_output = upstream_grad(grad_output, ctx.dtype, unit_last=False)  # a negated view resolved
        ignore_index, reduction, label_smoothing, chunk, accum_dtype = ctx.args
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if reduction == "none":
            h, weight, target = ctx.saved_tensors
            grad_h = torch.empty_like(h) if need_h else None
            grad_w = torch.zeros(weight.shape, dtype=accum_dtype, device=weight.device) if need_w else None
            _forward_chunks(
                h,
                weight,
                target,
                ignore_index,
                reduction,
                label_smoothing,
                chunk,
                grad_out=None,
                grad_h=grad_h,
                grad_w=grad_w,
                row_scale=grad_output,
            )
            if grad_w is not None and grad_w.dtype != weight.dtype:
                grad_w = grad_w.to(weight.dtype)
            return grad_h, grad_w, None, None, None, None, None, None
        grad_h, grad_w = ctx.saved_tensors
        rows = max(grad_h.shape[0] if grad_h is not None else 0, grad_w.shape[0] if grad_w is not None else 0)
        dummy = torch.zeros(rows, dtype=torch.int64, device=grad_output.device)
        _scale_(grad_h, grad_output, dummy)
        _scale_(grad_w, grad_output, dummy)
        return grad_h, grad_w, None, None, None, None, None, None


def linear_cross_entropy(
    h: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    chunk: int | None = None,
    *,
    accum_dtype: torch.dtype | None = None,
    check_target: bool | None = None,
) -> torch.Tensor:
    """``F.cross_entropy(h @ weight.T, target, ...)`` chunked over tokens: the (T, V) logits never exist.

    ``h``: (T, D); ``weight``: (V, D) (``F.linear``'s layout), same dtype; ``target``: (T,) int64.
    ``ignore_index``, ``reduction``, ``label_smoothing``: as ``F.cross_entropy``; ``check_target``: an
    out-of-range target's error, as in :func:`fusionlab.kernels.cross_entropy.cross_entropy`.
    ``chunk``: rows per chunk (default :func:`linear_cross_entropy_chunk`). ``accum_dtype``: the dtype grad_W is
    accumulated in across chunks. Each chunk's product is formed in fp32 by cuBLAS either way; the
    default (``None``) adds it to grad_W in the weight's dtype, one rounding per chunk (8 by default),
    as Liger-Kernel does. ``torch.float32`` keeps an fp32 accumulator: one rounding in all, at the
    price of V × D × 4 bytes more (twice the weight's size in bf16: at a 128k vocabulary that alone is
    more than a quarter of eager's peak) and an fp32 read-modify-write per chunk. The measured memory,
    time and error of both are in ``benchmarks/notes_lesson5.md``. Returns the loss in h's dtype.
    Reference: :func:`linear_cross_entropy_reference`.
    """
    op = "linear_cross_entropy"
    label_smoothing = _check_args(ignore_index, reduction, label_smoothing, op)
    check_tensor(h, "h", op=op, ndim=2, grad=True, max_numel=None)
    check_tensor(weight, "weight", op=op, ndim=2, contiguous=False, grad=True, max_numel=None)
    if weight.dtype != h.dtype or weight.device != h.device:
        raise KernelInputError(
            f"{op}: h and weight must share dtype and device, got {h.dtype}/{h.device} and "
            f"{weight.dtype}/{weight.device}."
        )
    if weight.shape[1] != h.shape[1]:
        raise KernelInputError(
            f"{op}: h is (T, D) = {tuple(h.shape)} and weight must be (V, D) (F.linear's layout), got "
            f"{tuple(weight.shape)}. Pass weight.T if yours is (D, V)."
        )
    check_tensor(target, "target", op=op, dtypes=(torch.int64,), ndim=1)
    n_rows = h.shape[0]
    if target.shape[0] != n_rows or target.device != h.device:
        raise KernelInputError(
            f"{op}: target must be one class index per row of h, on h's device: h is {tuple(h.shape)} on "
            f"{h.device}, target {tuple(target.shape)} on {target.device}."
        )
    if weight.shape[0] < 1:
        raise KernelInputError(f"{op}: weight has no rows (an empty vocabulary).")
    check_targets(target, weight.shape[0], ignore_index, op=op, check=check_target)
    if chunk is None:
        chunk = linear_cross_entropy_chunk(n_rows, weight.shape[0], h.shape[1])
    elif isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise KernelInputError(f"{op}: chunk must be a positive int (rows per chunk), got {chunk!r}.")
    accum_dtype = weight.dtype if accum_dtype is None else accum_dtype
    if accum_dtype not in (torch.float32, weight.dtype):
        raise KernelInputError(f"{op}: accum_dtype must be torch.float32 or the weight's dtype, got {accum_dtype}.")
    chunk = max(1, min(chunk, max(n_rows, 1)))
    needs_grad = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
    if needs_grad:
        return LinearCrossEntropyFunction.apply(
            h, weight, target, ignore_index, reduction, label_smoothing, chunk, accum_dtype
        )
    loss_rows, sync = _forward_chunks(
        h, weight, target, ignore_index, reduction, label_smoothing, chunk, grad_out=None, grad_h=None, grad_w=None
    )
    return _reduce(loss_rows, sync, reduction, h.dtype)


__all__ = [
    "LinearCrossEntropyFunction",
    "linear_cross_entropy",
    "linear_cross_entropy_chunk",
    "linear_cross_entropy_eager",
    "linear_cross_entropy_flops",
    "linear_cross_entropy_memory",
    "linear_cross_entropy_reference",
]
