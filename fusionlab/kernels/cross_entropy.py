"""Lesson 5: cross-entropy over a huge vocabulary — loss and gradient in one pass, no probabilities.

For logits ``x`` of shape ``(T, V)`` (tokens, vocabulary) and targets ``y``, with label smoothing ε:

    lse_t  = log Σ_j exp(x_tj)                                   (the log-sum-exp of the row)
    loss_t = (1 − ε) (lse_t − x_t,y_t) + ε (lse_t − mean_j x_tj)    (0 for a row with y_t = ignore_index)
    dloss_t/dx_tj = softmax(x_t)_j − (1 − ε) [j = y_t] − ε / V

and ``reduction`` "mean" divides by the rows not ignored (so does the gradient), "sum" does not, "none"
returns loss_t: ``F.cross_entropy`` on 2-D logits. Eager PyTorch makes six (T, V) trips through memory
(log-probabilities, their gradient, the logits' gradient), each 2 GiB at 8k × 128k in bf16.

The kernel (:func:`_cross_entropy_fwd_kernel`, the lesson's grown up) gives each row one program.
Sweep 1 sums d = Σ exp(x − ref) against a reference near the row's maximum: lse = ref + log d and the
loss after one read. The lesson keeps an online maximum (``REF_TARGET=False`` here); the default
reference is the target's logit, known before the row is read: no maximum, no rescaling, and a range
check on d (a row whose logits sit more than e**60 above the target's is summed again). Sweep 2 writes
``exp(x − lse) − (1 − ε)[j = y] − ε/V`` (times the reduction's scale) into a gradient buffer, or
**over the logits** (``inplace_grad=True``). The row's first tile, the head, stays in registers
between the sweeps; the rest is read again newest first, from L2 (the ledger's ``rereads``). A row off
16-byte boundaries (V = 50257) is cut at them, so that its body still moves in 16-byte accesses. On a
GPU, with a gradient, wide rows are read once by the split or persistent schedules of lesson 4's
softmax (``_cross_entropy_kernels``), as :func:`cross_entropy_config` decides from the measurements in
``benchmarks/notes_lesson5.md``.

Around the kernel nothing runs in torch: a prologue counts the rows not ignored, a finish sums the losses
in a fixed order, the backward scales the stored gradient by grad_output (skipped where it is 1). On
Hopper each is launched dependent on the kernel before it (programmatic dependent launch).

Numerics: fp32 arithmetic for any storage dtype, a reference subtracted (logits of 1e4 do not
overflow), padded lanes −inf, 64-bit row offsets, any V ≥ 1. A target outside [0, V) that is not
``ignore_index`` raises where the check is free (the interpreter); on a GPU its row gets a NaN loss and
gradient (never a read out of bounds) unless ``check_target=True`` asks for the check's host sync.

References: Milakov & Gimelshein, "Online normalizer calculation for softmax" (2018); Liger-Kernel's
``cross_entropy`` (Hsu et al., 2024), whose in-place gradient this follows.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # PDL (sm_90): see pdl_supported

from .. import runtime
from ..ledger import Ledger
from ._cross_entropy_kernels import (
    _LN2,
    _LOG2E,
    _check_args,
    _check_inputs,
    _launch_backward,
    _launch_rows,
    _launch_split,
    _prologue,
    _reduce,
    _sum_against_max,
    _zero_row,
)
from ._launch import (
    KernelInputError,
    cdiv,
    check_block,
    dram_gbps,
    element_size,
    launch_kwargs,
    pdl_supported,
    row_config,
)
from ._rows import _fragments, _row_body
from ._tensors import check_targets, check_writable, output_like, upstream_grad


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


def cross_entropy_ledger(
    tokens: int,
    vocab: int,
    dtype,
    *,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    backward: bool = True,
    head: int | None = None,
    gpu: bool | None = None,
    device: str | None = None,
) -> Ledger:
    """Trips of cross-entropy on (tokens, vocab) logits, forward + backward, as eager runs it and fused.

    Eager, op by op: ``log_softmax`` reads the logits, writes lsm; ``nll_loss`` gathers one lsm a row;
    ``nll_bwd`` writes a (T, V) gradient of lsm (zeros, one entry a row); ``lsm_bwd`` reads it and lsm,
    writes the logits' gradient: six (T, V) trips (label smoothing adds a ``sum`` over lsm and the
    ``add`` of its gradient). Fused: read the logits and targets, write the gradient and the loss, and
    (``rereads``) sweep 2's re-read of each row past the ``head`` kept on chip (default: the launcher's,
    as :func:`cross_entropy_config` gives it for ``gpu`` and ``device``; nothing for rows split or held
    whole). ``backward=False``: the forward alone. Targets count as int64, losses as fp32; the prologue's
    second read of the targets and the finish's of the losses (T × 12 bytes) are not counted.
    """
    n = tokens * vocab
    out_loss = tokens if reduction == "none" else 1
    outputs = ("loss", "grad_logits") if backward else ("loss",)
    reread = 0
    if backward:
        if head is None:
            dt = dtype if isinstance(dtype, torch.dtype) else {2: torch.bfloat16}.get(int(dtype), torch.float32)
            cfg = cross_entropy_config(vocab, dt, gpu=gpu, device=device)
            whole = cfg.get("SPLIT") or _takes_rows(cfg, label_smoothing)
            head = vocab if whole else cfg["HEAD"]  # split rows and whole rows are read once
        reread = tokens * max(0, vocab - head)
    sizes = {"target": 8, "loss": 4, "smooth": 4}
    led = Ledger(dtype_bytes=dtype, outputs=outputs, rereads={"logits": reread}, sizes=sizes)
    led.op("log_softmax", reads={"logits": n}, writes={"lsm": n})
    led.op("nll_loss", reads={"lsm": tokens, "target": tokens}, writes={"loss": out_loss})
    if label_smoothing:
        led.op("sum", reads={"lsm": n}, writes={"smooth": tokens})
    if not backward:
        return led
    led.op("nll_bwd", reads={"target": tokens}, writes={"grad_lsm": n})
    if label_smoothing:
        led.op("add", reads={"grad_lsm": n, "smooth": tokens}, writes={"grad_lsm2": n})
        led.op("lsm_bwd", reads={"grad_lsm2": n, "lsm": n}, writes={"grad_logits": n})
    else:
        led.op("lsm_bwd", reads={"grad_lsm": n, "lsm": n}, writes={"grad_logits": n})
    return led


def cross_entropy_flops(tokens: int, vocab: int, *, backward: bool = True) -> int:
    """Nominal FLOPs: forward 4 per logit (max, subtract, exp, add), backward 4 more (exp, multiply,
    subtract, the target's compare); the special-function rate, not the FLOPs, is what can bind."""
    return (8 if backward else 4) * tokens * vocab


# -- configuration ------------------------------------------------------------------------------------
# The tuning table (what each value chooses, and the sweeps on an H100 and an H200 behind it:
# benchmarks/notes_lesson5.md, "2026-11-26: cross-entropy's configuration, constant by constant").
NARROW_MAX = 65536  # rows up to this: 8 warps, a head of 8192, tiles of 4096; wider: 32 warps, 64 KiB
SPLIT_MIN = NARROW_MAX + 1  # with a gradient, fp32 rows from here are split across programs...
SPLIT_MIN_16 = 28000  # ...and 16-bit rows from here
SPLIT_BYTES = 32768  # of row a part (4 warps)
MAX_SPLIT = 64  # parts a row at most
SPLIT_MAXNREG = 96  # registers a thread, 16-bit parts (five programs a SM)
SPLIT_TAIL = 64  # columns past the whole parts that the last part's fragment takes...
SPLIT_EXTRA = 4096  # ...past that (16-bit), an extra tile a part, up to this many columns
FORWARD_TILE = 4096  # the loss alone (no gradient): tiles of this, 8 warps, four stages
ROWS_MIN, ROWS_MAX = 28673, 32767  # aligned 16-bit rows walked whole by persistent programs...
ROWS_MIN_DRAM_GBPS = 4000.0  # ...on a GPU of this DRAM bandwidth (an H200, not an H100)


@functools.lru_cache(maxsize=4096)
def _config(n_cols: int, dtype: torch.dtype, gpu: bool, grad: bool = True, rows: bool = False) -> dict:
    cfg = {"PREFETCH": False, "PREFETCH2": False, "LOOP_STAGES": 1, "EVICT": False, "REF_TARGET": True}
    cfg["num_stages"] = None
    if not gpu:  # the interpreter: 4096-element tiles (numpy arrays: memory, not registers, limits)
        head = row_config(n_cols, dtype, gpu=False)["BLOCK_N"]
        return {**cfg, "HEAD": head, "BLOCK_N": min(head, 2048), "num_warps": 4}
    if not grad and n_cols > FORWARD_TILE:
        return {**cfg, "HEAD": FORWARD_TILE, "BLOCK_N": FORWARD_TILE, "num_warps": 8, "LOOP_STAGES": 4}
    sixteen = element_size(dtype) == 2
    if n_cols <= NARROW_MAX:
        head = row_config(n_cols, dtype, max_block=8192, gpu=True)["BLOCK_N"]
        narrow = {"num_warps": 8, "LOOP_STAGES": 3, "PREFETCH2": True, "EVICT": True}
        cfg = {**cfg, "HEAD": head, "BLOCK_N": min(head, 4096), **narrow}
        if rows and grad and sixteen and ROWS_MIN <= n_cols <= ROWS_MAX:
            cfg.update(ROWS=True, ROWS_WARPS=16, ROW_STAGES=3)  # persistent whole rows
    else:
        head = row_config(n_cols, dtype, gpu=True)["BLOCK_N"]  # 64 KiB of row, the largest single tile
        vec = 16 // element_size(dtype)
        # 32 * 32 * vec: one 16-byte access a thread; the L2 hints keep the streamed tiles for sweep 2
        cfg = {**cfg, "HEAD": head, "BLOCK_N": 32 * 32 * vec, "num_warps": 32, "EVICT": True}
    part = SPLIT_BYTES // element_size(dtype)
    # the remainder past the whole parts: up to SPLIT_TAIL columns go to the last part's fragment, more
    # (16-bit, up to SPLIT_EXTRA columns a part) are shared by the whole parts, or else get a part of their own
    whole, rest = divmod(n_cols, part)
    parts = whole if whole and rest <= SPLIT_TAIL else whole + 1
    share = cdiv(rest, 16 * max(whole, 1)) * 16  # the remainder's share of each whole part, 16 columns a step
    extra = sixteen and rest > SPLIT_TAIL and share <= SPLIT_EXTRA
    split_min = SPLIT_MIN_16 if sixteen else SPLIT_MIN
    if grad and n_cols >= split_min and parts <= MAX_SPLIT and not cfg.get("ROWS"):
        cfg.update(SPLIT=parts, SPLIT_BLOCK=part, SPLIT_WARPS=4)
        if sixteen:
            cfg["SPLIT_MAXNREG"] = SPLIT_MAXNREG
        if extra:  # the remainder shared by the whole parts, in their extra tiles
            cfg.update(SPLIT=whole, SPLIT_PART=part + share)
    return cfg


def cross_entropy_config(
    n_cols: int,
    dtype: torch.dtype,
    *,
    stride: int | None = None,
    grad: bool = True,
    gpu: bool | None = None,
    device: str | None = None,
) -> dict:
    """The launch configuration for rows of ``n_cols`` logits at row ``stride`` (default ``n_cols``).

    The head-and-tail kernel's keys: ``HEAD`` elements of a row stay in registers between the sweeps,
    the rest streams in ``BLOCK_N`` tiles (``num_warps``; ``PREFETCH``, ``PREFETCH2``: sweep 1's, sweep
    2's next tile loaded ahead; ``LOOP_STAGES``: sweep 1 pipelined that deep through shared memory;
    ``EVICT``: L2 hints; ``REF_TARGET``: sums against the target's logit); ``VEC`` > 1 cuts rows whose
    length or stride is off 16 bytes at their 16-byte boundaries.
    On a GPU with a gradient, rows from ``SPLIT_MIN_16`` (16-bit) or ``SPLIT_MIN`` (fp32) columns get
    ``SPLIT`` parts of ``SPLIT_BLOCK`` columns (``SPLIT_WARPS``, ``SPLIT_MAXNREG``;
    ``SPLIT_PART`` when a remainder past ``SPLIT_TAIL`` columns is shared by the parts in extra tiles),
    and on a GPU of at least ``ROWS_MIN_DRAM_GBPS`` (:func:`~fusionlab.kernels._launch.dram_gbps`: what
    the GPU can do, not its name) aligned 16-bit rows of ``ROWS_MIN``-``ROWS_MAX`` get ``ROWS``
    (persistent programs, ``ROWS_WARPS``, ``ROW_STAGES``; not with label smoothing). ``grad=False``:
    the loss alone, in ``FORWARD_TILE`` tiles. ``gpu``: the GPU's configuration (default: this mode's),
    so that a lesson on a CPU can ask what the GPU runs; ``device``: that GPU's name (default: this one).
    """
    stride = n_cols if stride is None else stride
    vec = 16 // element_size(dtype)
    split = (stride % 16 != 0 or n_cols % 16 != 0) and vec > 1
    gpu = runtime.is_gpu() if gpu is None else gpu
    rows = bool(gpu) and dram_gbps(device) >= ROWS_MIN_DRAM_GBPS
    cfg = dict(_config(int(n_cols), dtype, bool(gpu), bool(grad), rows))
    cfg["VEC"] = vec if split else 1
    if split:  # the rows kernel does not cut rows at 16 bytes (the split and head-and-tail kernels do)
        cfg = {k: v for k, v in cfg.items() if not k.startswith("ROW")}
    return cfg


def _takes_rows(cfg: dict, label_smoothing: float) -> bool:
    """Whether the rows kernel computes the loss and gradient (it has no label smoothing)."""
    return bool(cfg.get("ROWS")) and not label_smoothing


# -- the kernel: a row in one program, its head kept on chip -------------------------------------------
@triton.jit
def _cross_entropy_fwd_kernel(
    x_ptr, target_ptr, grad_ptr, loss_ptr, sync_ptr, n_cols, stride_xm, stride_gm, ignore_index, label_smoothing,
    HEAD: tl.constexpr, BLOCK_N: tl.constexpr, VEC: tl.constexpr, WRITE_GRAD: tl.constexpr, MEAN: tl.constexpr,
    SMOOTH: tl.constexpr, PREFETCH: tl.constexpr, SINGLE: tl.constexpr = False, KEEP: tl.constexpr = "",
    DROP: tl.constexpr = "", REF_TARGET: tl.constexpr = False, LOOP_STAGES: tl.constexpr = 1,
    PREFETCH2: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    # exp(v) is exp2(v log2 e): a multiply and one MUFU ex2, on differences x - ref formed in natural
    # units first (exact near ref, also at 1e4: multiplying by log2 e first rounds each logit by 1e-3).
    row = tl.program_id(axis=0).to(tl.int64)  # row * stride passes 2**31 past 16384 x 131072
    y = tl.load(target_ptr + row)
    x_row = x_ptr + row * stride_xm
    g_row = grad_ptr + row * stride_gm
    if VEC > 1:
        # A row off 16-byte boundaries: a 16-byte aligned body and two fragments in one tile of 2 VEC
        # lanes (_rows._row_body says why). The gradient has the logits' row stride (the launcher's doing).
        x_start = row * stride_xm
        lo, body_len = _row_body(x_start, n_cols, VEC)
        body_len = tl.multiple_of(body_len, VEC)
        x_body = x_ptr + tl.multiple_of(x_start + lo, VEC)
        g_body = grad_ptr + tl.multiple_of(row * stride_gm + lo, VEC)
        col_f, mask_f = _fragments(lo, body_len, n_cols, VEC)
    else:
        lo = 0
        body_len = n_cols
        x_body = x_row
        g_body = g_row

    offs_h = tl.arange(0, HEAD)
    mask_h = offs_h < body_len
    if PDL:
        # launched while the prologue ran (the mean's count: sync[0]); every program waits, so that this
        # kernel's end is also the prologue's (the finish kernel waits on this one only)
        gdc_wait()
        gdc_launch_dependents()
    if y == ignore_index:
        # zero loss, zero gradient (and the mean's denominator never counted this row)
        tl.store(loss_ptr + row, 0.0)
        if WRITE_GRAD:
            col_f0 = col_f if VEC > 1 else 0  # (only a row off 16 bytes has fragments)
            _zero_row(grad_ptr, g_body, body_len, g_row, col_f0, mask_f if VEC > 1 else 0, BLOCK_N, VEC)
    else:
        valid = (y >= 0) & (y < n_cols)  # an out-of-range target: NaN, never a stray read
        x_y = tl.load(x_row + y, mask=valid, other=float("nan")).to(tl.float32)

        # -- sweep 1: the log-sum-exp. The head tile stays in registers (storage dtype) for sweep 2.
        # (the head is never read again: DROP may mark it evict-first in L2; streamed tiles are read
        # again in sweep 2: KEEP may mark them evict-last)
        x_h_raw = tl.load(x_body + offs_h, mask=mask_h, other=float("-inf"), eviction_policy=DROP)
        n_tail = tl.maximum(tl.cdiv(body_len - HEAD, BLOCK_N), 0)
        if PREFETCH:  # the first streamed tile's load before the head's reduction: two tiles in flight
            if not SINGLE:
                offs = HEAD + tl.arange(0, BLOCK_N)
                x_next = tl.load(x_body + offs, mask=offs < body_len, other=float("-inf"), eviction_policy=KEEP)
        x_h = x_h_raw.to(tl.float32)
        if VEC > 1:
            x_f_raw = tl.load(x_row + col_f, mask=mask_f, other=float("-inf"))
            x_f = x_f_raw.to(tl.float32)
        if REF_TARGET:
            # A fixed reference, the target's logit: no maximum, no rescaling (a subtract, a multiply,
            # an exp2 and an add an element). lse = ref + log(d) is exact while 1 <= d <= 1e26 (no term
            # past e**60); a row outside that range is summed again against its maximum below (rare).
            ref = tl.where(tl.abs(x_y) < float("inf"), x_y, 0.0)  # NaN (bad target) or ±inf: 0
        else:
            # exponentials against the head's maximum, then a running maximum per lane
            if VEC > 1:
                m = tl.maximum(tl.max(x_h, axis=0), tl.max(x_f, axis=0))
            else:
                m = tl.max(x_h, axis=0)
            # a tile of only -inf (masked lanes, or -inf logits) has max -inf: exponentiate against 0
            # instead, or exp(-inf - -inf) would be NaN
            ref = tl.where(m == float("-inf"), 0.0, m)
        d = tl.sum(tl.math.exp2((x_h - ref) * _LOG2E), axis=0)
        if SMOOTH:
            s = tl.sum(tl.where(mask_h, x_h, 0.0), axis=0)
        if VEC > 1:
            d += tl.sum(tl.math.exp2((x_f - ref) * _LOG2E), axis=0)
            if SMOOTH:
                s += tl.sum(tl.where(mask_f, x_f, 0.0), axis=0)
        if not SINGLE:
            if not REF_TARGET:
                m_v = tl.full([BLOCK_N], float("-inf"), tl.float32)
            d_v = tl.zeros([BLOCK_N], tl.float32)
            if SMOOTH:
                s_v = tl.zeros([BLOCK_N], tl.float32)
            # LOOP_STAGES > 1: Triton's pipeliner keeps the next tiles' loads in flight through shared
            # memory (in place of the PREFETCH registers)
            for i in tl.range(0, n_tail, num_stages=LOOP_STAGES):
                offs = HEAD + i * BLOCK_N + tl.arange(0, BLOCK_N)
                mask = offs < body_len
                if PREFETCH:
                    x = x_next.to(tl.float32)
                    offs_next = offs + BLOCK_N
                    x_next = tl.load(
                        x_body + offs_next, mask=offs_next < body_len, other=float("-inf"), eviction_policy=KEEP
                    )
                else:
                    x = tl.load(x_body + offs, mask=mask, other=float("-inf"), eviction_policy=KEEP).to(tl.float32)
                if REF_TARGET:
                    d_v += tl.math.exp2((x - ref) * _LOG2E)
                else:
                    # A running max and sum *per lane* (no reduction across threads, no barrier, one
                    # exp2 an element): for t = x - m_lane, either x is no larger (add e^t) or it is
                    # the new maximum (rescale the sum by e^-t, add 1). Lanes are combined once, at
                    # the end.
                    t = x - m_v
                    e = tl.where(x == float("-inf"), 0.0, tl.math.exp2(tl.abs(t) * -_LOG2E))  # -inf - -inf: NaN
                    new_max = t > 0
                    d_v = tl.where(new_max, d_v * e + 1.0, d_v + e)
                    m_v = tl.where(new_max, x, m_v)
                if SMOOTH:
                    s_v += tl.where(mask, x, 0.0)
            if REF_TARGET:
                d += tl.sum(d_v, axis=0)
            else:
                big = tl.maximum(m, tl.max(m_v, axis=0))
                big_safe = tl.where(big == float("-inf"), 0.0, big)
                # exp(m - big) is 0 for an all -inf head (m = -inf), never 0 * inf
                d = d * tl.math.exp2((m - big_safe) * _LOG2E) + tl.sum(
                    d_v * tl.math.exp2((m_v - big_safe) * _LOG2E), axis=0
                )
                ref = big_safe
            if SMOOTH:
                s += tl.sum(s_v, axis=0)
        if REF_TARGET:
            if not ((d >= 1e-20) & (d <= 1e26)):  # (NaN fails both)
                # the reference was too far from the row's maximum: sum again against the maximum
                x_f_or_h = x_f if VEC > 1 else x_h
                ref, d = _sum_against_max(x_h, x_f_or_h, x_body, body_len, n_tail, HEAD, BLOCK_N, VEC, SINGLE)
        lse = ref + tl.math.log2(d) * _LN2  # a row of only -inf: d = 0, lse = -inf, loss NaN (as torch)
        loss = lse - x_y
        if SMOOTH:
            loss = (1.0 - label_smoothing) * loss + label_smoothing * (lse - s / n_cols)
        tl.store(loss_ptr + row, loss)

        if WRITE_GRAD:
            # -- sweep 2: grad = (softmax - eps/V - (1 - eps) onehot) * scale, scale = 1/n_valid for "mean"
            # (from the device: no host sync), else 1. softmax * scale = exp(x - ref) * scale / d
            # = exp2((x - ref) log2 e + log2(scale / d)): a subtract, an FMA and an exp2 an element.
            if MEAN:
                scale = 1.0 / tl.load(sync_ptr).to(tl.float32)
            else:
                scale = 1.0
            log2_c = tl.where(valid, tl.math.log2(scale / d), float("nan"))
            c_s = label_smoothing / n_cols * scale
            if not SINGLE:
                # the streamed tiles newest first: the last ones read are the likeliest still in L2
                if PREFETCH2:
                    offs = HEAD + (n_tail - 1) * BLOCK_N + tl.arange(0, BLOCK_N)
                    mask_next = (offs >= HEAD) & (offs < body_len)
                    x_next = tl.load(x_body + offs, mask=mask_next, other=float("-inf"), eviction_policy=DROP)
                # not pipelined through shared memory: 2-3 stages measured slower here (the re-read
                # comes from L2; benchmarks/notes_lesson5.md), PREFETCH2 holds the next tile instead
                for i in tl.range(0, n_tail, num_stages=1):
                    offs = HEAD + (n_tail - 1 - i) * BLOCK_N + tl.arange(0, BLOCK_N)
                    mask = offs < body_len
                    if PREFETCH2:
                        x = x_next
                        offs_next = offs - BLOCK_N
                        mask_next = (offs_next >= HEAD) & (offs_next < body_len)
                        x_next = tl.load(x_body + offs_next, mask=mask_next, other=float("-inf"), eviction_policy=DROP)
                    else:
                        x = tl.load(x_body + offs, mask=mask, other=float("-inf"), eviction_policy=DROP)
                    grad = tl.math.exp2((x.to(tl.float32) - ref) * _LOG2E + log2_c)
                    if SMOOTH:
                        grad -= c_s
                    tl.store(g_body + offs, grad.to(grad_ptr.dtype.element_ty), mask=mask, eviction_policy=DROP)
            # the head from registers: read once
            grad = tl.math.exp2((x_h_raw.to(tl.float32) - ref) * _LOG2E + log2_c)
            if SMOOTH:
                grad -= c_s
            tl.store(g_body + offs_h, grad.to(grad_ptr.dtype.element_ty), mask=mask_h, eviction_policy=DROP)
            if VEC > 1:
                grad = tl.math.exp2((x_f_raw.to(tl.float32) - ref) * _LOG2E + log2_c)
                if SMOOTH:
                    grad -= c_s
                tl.store(g_row + col_f, grad.to(grad_ptr.dtype.element_ty), mask=mask_f)
            # the target's element also gets -(1 - eps) * scale: one scalar store, after a barrier so
            # that it lands after the tile store of the same element (by another thread)
            tl.debug_barrier()
            grad_y = tl.math.exp2((x_y - ref) * _LOG2E + log2_c) - c_s - (1.0 - label_smoothing) * scale
            tl.store(g_row + y, grad_y.to(grad_ptr.dtype.element_ty), mask=valid)


# -- launchers ------------------------------------------------------------------------------------------
def cross_entropy_rows(
    logits, target, grad, loss_rows, sync, ignore_index, label_smoothing, cfg, *, mean, after_prologue=False
):
    """Each row's loss into ``loss_rows`` (in its dtype) and its gradient into ``grad`` (None: none;
    ``logits``: in place), by the kernel ``cfg`` picks: the building block of :func:`cross_entropy` and
    of ops built on it (``linear_cross_entropy`` runs it chunk by chunk). ``sync``: the prologue's
    buffer (its count read when ``mean``; split rows need its room). ``after_prologue``: the prologue
    was the stream's last launch, so this one may overlap it (PDL)."""
    n_rows, n_cols = logits.shape
    if n_rows == 0:
        return
    pdl = after_prologue and sync is not None and pdl_supported()
    if grad is not None and cfg.get("SPLIT"):
        return _launch_split(logits, target, grad, loss_rows, sync, ignore_index, label_smoothing, cfg, mean, pdl)
    if grad is not None and _takes_rows(cfg, label_smoothing):
        return _launch_rows(logits, target, grad, loss_rows, sync, ignore_index, cfg, mean, pdl)
    g = logits if grad is None else grad
    return _cross_entropy_fwd_kernel[(n_rows,)](
        logits, target, g, loss_rows, target if sync is None else sync, n_cols, logits.stride(0), g.stride(0),
        ignore_index, label_smoothing,
        HEAD=cfg["HEAD"], BLOCK_N=cfg["BLOCK_N"], VEC=cfg["VEC"], WRITE_GRAD=grad is not None, MEAN=mean,
        SMOOTH=label_smoothing != 0.0, PREFETCH=cfg["PREFETCH"], SINGLE=n_cols <= cfg["HEAD"],
        KEEP="evict_last" if cfg.get("EVICT") else "", DROP="evict_first" if cfg.get("EVICT") else "",
        REF_TARGET=cfg.get("REF_TARGET", False), LOOP_STAGES=cfg.get("LOOP_STAGES", 1),
        PREFETCH2=cfg.get("PREFETCH2", cfg["PREFETCH"]), PDL=pdl,
        **launch_kwargs(cfg["num_warps"], cfg.get("num_stages"), pdl=pdl),
    )  # fmt: skip


def _loss(logits, target, grad, ignore_index, reduction, label_smoothing, cfg):
    """The loss as ``F.cross_entropy`` returns it (and, given ``grad``, the gradient written there), with
    no torch op: the prologue when needed (the mean's count; the split's zeros), the loss kernel, the finish."""
    n_rows = logits.shape[0]
    if n_rows == 0:
        return _reduce(logits.new_empty(0, dtype=torch.float32), None, reduction, logits.dtype)
    split = grad is not None and bool(cfg.get("SPLIT"))
    mean = reduction == "mean"
    sync = (
        _prologue(target, ignore_index, count=mean, n_rows_split=n_rows if split else None) if mean or split else None
    )
    none = reduction == "none"
    loss_rows = torch.empty(n_rows, dtype=logits.dtype if none else torch.float32, device=logits.device)
    cross_entropy_rows(
        logits, target, grad, loss_rows, sync, ignore_index, label_smoothing, cfg, mean=mean, after_prologue=True
    )
    return loss_rows if none else _reduce(loss_rows, sync, reduction, logits.dtype, after_loss=True)


def _increment_version(t: torch.Tensor) -> None:
    # t's memory changed: an op that saved t for its backward raises instead of using gradients as logits
    bump = getattr(torch.autograd.graph, "increment_version", None)
    bump is not None and bump(t)


class CrossEntropyFunction(torch.autograd.Function):
    """Forward computes the loss and the gradient (scaled for the reduction) in one kernel (after the
    prologue's count) and stores the gradient; backward multiplies it by grad_output, row by row, in
    place."""

    @staticmethod
    def forward(ctx, logits, target, ignore_index, reduction, label_smoothing, inplace_grad, cfg):
        # the gradient gets the logits' row stride, so both split a row at the same 16-byte boundaries
        # (contiguous where the logits' rows overlap: expanded logits would have every row write one)
        grad = logits if inplace_grad else output_like(logits)
        loss = _loss(logits, target, grad, ignore_index, reduction, label_smoothing, cfg)
        if inplace_grad:
            _increment_version(logits)
        ctx.save_for_backward(grad.detach(), target)
        ctx.ignore_index = ignore_index
        ctx.used = False
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        if ctx.used:
            raise RuntimeError(
                "cross_entropy: backward ran twice through the same graph (retain_graph=True). The "
                "gradient is stored once and scaled in place; run the forward again instead."
            )
        ctx.used = True
        grad, target = ctx.saved_tensors
        # a negated view resolved, not read raw; any stride kept (the kernel takes it: 0 is the shared path)
        grad_output = upstream_grad(grad_output, grad.dtype, unit_last=False)
        _launch_backward(
            grad, target, grad_output, ctx.ignore_index, _config(grad.shape[1], grad.dtype, runtime.is_gpu())
        )
        return grad, None, None, None, None, None, None


def cross_entropy(
    logits: torch.Tensor,
    target: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    *,
    inplace_grad: bool = False,
    check_target: bool | None = None,
    head_n: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """``F.cross_entropy(logits, target, ...)`` fused: loss and gradient in one kernel, one pass a row.

    ``logits``: ``(T, V)``, fp32/bf16/fp16 (math in fp32), rows may be strided (last dim contiguous);
    ``target``: ``(T,)`` int64 class indices, or ``ignore_index`` (zero loss, zero gradient, not in the
    mean's denominator). A target outside ``[0, V)`` raises ``fusionlab.kernels.TargetOutOfRange`` where
    the check is free (the interpreter); on a GPU it would cost a host sync, so there that row gets a NaN
    loss and gradient unless ``check_target=True`` (see :func:`fusionlab.kernels._tensors.check_targets`).
    ``reduction``: "mean" (all rows ignored: NaN, as torch), "sum" or "none". ``label_smoothing`` in
    [0, 1], never applied to ignored rows. Returns the loss in the logits' dtype.

    With autograd on, the forward also writes the gradient, to a new buffer or, ``inplace_grad=True``,
    **over the logits**: they are then destroyed (``logits.grad``, for a leaf, is the same memory), no
    (T, V) memory is added, and any other op that saved the logits for its backward raises when it runs.
    Without autograd only the loss is computed, in one read. ``head_n``, ``block_n``, ``num_warps``
    override :func:`cross_entropy_config` (powers of two) for a tuning sweep.
    Reference: :func:`cross_entropy_reference`.
    """
    op = "cross_entropy"
    label_smoothing = _check_args(ignore_index, reduction, label_smoothing, op)
    _check_inputs(logits, target, op)
    n_cols = logits.shape[1]
    check_targets(target, n_cols, ignore_index, op=op, check=check_target)
    need_grad = torch.is_grad_enabled() and logits.requires_grad
    cfg = cross_entropy_config(n_cols, logits.dtype, stride=logits.stride(0), grad=need_grad)
    if head_n is not None or block_n is not None or num_warps is not None:
        cfg = {k: v for k, v in cfg.items() if not k.startswith(("SPLIT", "ROW"))}  # a tuning run: head and tail
        if head_n is not None:
            cfg["HEAD"] = check_block(head_n, "head_n", op)
        if block_n is not None:
            cfg["BLOCK_N"] = check_block(block_n, "block_n", op)
        if num_warps is not None:
            cfg["num_warps"] = check_block(num_warps, "num_warps", op, max_value=32)
        if cfg["HEAD"] < cfg["VEC"]:
            raise KernelInputError(f"{op}: head_n={cfg['HEAD']} is below the alignment window of {cfg['VEC']}.")
    if need_grad:
        if inplace_grad:
            check_writable(logits, "logits", op=op)
        return CrossEntropyFunction.apply(logits, target, ignore_index, reduction, label_smoothing, inplace_grad, cfg)
    return _loss(logits, target, None, ignore_index, reduction, label_smoothing, cfg)


__all__ = [
    "CrossEntropyFunction",
    "cross_entropy",
    "cross_entropy_config",
    "cross_entropy_eager",
    "cross_entropy_flops",
    "cross_entropy_ledger",
    "cross_entropy_reference",
    "cross_entropy_rows",
]
