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
tiles summing d = Σ exp(x − ref), picks out x_y, and so has lse = ref + log d and the loss after one
read. The reference can be any number near the row's maximum: the lesson's kernel uses the online
log-sum-exp (a running maximum m, d rescaled by exp(m_old − m_new) when a tile raises it; the
package's ``REF_TARGET=False`` path, which keeps a running max and sum per lane). The default uses
the target's logit, known before the row is read: no maximum and no rescaling, four operations an
element beside the exp2, and a range check on d at the end (a row whose logits sit more than e**60
above the target's is summed again against its true maximum). The gradient needs the row's final lse,
so a second sweep over the row computes ``exp(x − lse) − (1 − ε)[j = y] − ε/V`` (times the
reduction's scale) and writes it — into a gradient buffer, or **over the logits**
(``inplace_grad=True``). No probability tensor ever exists. The first tile of the row (the "head":
8192 elements for rows up to 32 Ki, the whole row for 16-bit rows up to 64 Ki, 64 KiB of row for
wider ones) stays in registers from the first sweep to the second, so a row that fits in it is read
once; a wider row's other tiles are read again, newest first, so that the second sweep finds what it
read last still in L2 (the ledger counts the re-read honestly, as ``rereads``); on a GPU, with a
gradient, 16-bit rows of 28000 logits and more (fp32 rows past 65536) are instead split across
programs that hold 32 KiB of the row each and swap their sums (lesson 4's split softmax), read once;
but aligned 16-bit rows of 28673-32767 logits (Llama 2's 32000) may go to persistent programs
that hold whole rows, the next rows' loads in flight while one is written (lesson 4's persistent
softmax, ``_cross_entropy_rows_kernel``), read once too: on a GPU of at least ``ROWS_MIN_DRAM_GBPS``
of DRAM bandwidth (an H200; an H100's head of 8192 is faster). A row whose
start or length is not a multiple of 16 bytes (V = 50257) is split at its 16-byte boundaries so its
body still moves in 16-byte accesses. The
backward of the autograd function only multiplies the stored gradient by grad_output — and skips
rows whose grad_output is exactly 1, the usual case, without a host sync.

Around the kernel, nothing runs in torch: a one-program prologue counts the rows not ignored (the
mean's denominator, needed before any gradient is written), and a one-program finish kernel sums the
rows' losses in a fixed order, divides and casts. Before, torch's compare, sum, sum, divide and cast
were five kernels and five host calls around every call. On Hopper each kernel is launched dependent on
the one before (programmatic dependent launch): it is placed on the SMs while that one still runs and
waits on the SM, just before it first reads what that one wrote (the prologue and the backward, whose
kernel before is not ours: before any read), instead of being launched when it ends
(benchmarks/notes_lesson5.md, 2026-11-25, programmatic dependent launch).

Numerics: fp32 arithmetic for any storage dtype, a reference subtracted (logits of 1e4 do not overflow),
padded lanes masked to −inf (never counted as probability mass), 64-bit row offsets (T × V past
2**31 elements is fine), any V ≥ 1 (no block-size limit: the row is tiled). A target outside
[0, V) that is not ``ignore_index`` is refused by the launcher where that is free (the interpreter:
``TargetOutOfRange``, as torch raises); the kernel itself gives such a row a NaN loss and a NaN
gradient (never a read out of bounds), which is what a GPU call returns unless ``check_target=True``
asks for the check's host sync.

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
from ._launch import (
    KernelInputError,
    cdiv,
    check_block,
    check_tensor,
    dram_gbps,
    element_size,
    launch_kwargs,
    next_pow2,
    pdl_supported,
    row_config,
    sm_count,
)
from ._rows import _fragments, _row_body, _split_merge, _split_ticket, _split_wait
from ._tensors import check_targets, check_writable, output_like, upstream_grad

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

    Eager (``backward=True``), op by op: ``log_softmax`` reads the logits, writes lsm; ``nll_loss``
    gathers one lsm per row; ``nll_bwd`` writes a (T, V) gradient of lsm (zeros and one entry per
    row); ``lsm_bwd`` reads it and lsm, writes the gradient of the logits: six (T, V) trips. Label
    smoothing adds ``sum`` over lsm and, backward, the ``add`` of its broadcast gradient. Fused: read
    the logits (and the int64 targets), write the gradient (and the loss); ``rereads`` holds the second
    sweep's re-read of the part of each row beyond the ``head`` elements kept on chip (default: the
    launcher's configuration for this vocabulary, the GPU's when ``gpu``, else this mode's; nothing
    when the row fits or is split or held whole; ``device``: the GPU named so, default this one, see
    :func:`cross_entropy_config`). ``backward=False``: the forward alone (eager: log_softmax +
    nll_loss; fused: one read, no gradient). Targets are counted as int64 and losses as fp32
    (``Ledger.sizes``); the fused kernel writes one fp32 loss per row, which a one-program kernel then
    sums (T × 4 bytes, not in the ledger), after a prologue that reads the targets once more to count
    the rows not ignored (T × 8 bytes, not in the ledger either).
    """
    n = tokens * vocab
    out_loss = tokens if reduction == "none" else 1
    outputs = ("loss", "grad_logits") if backward else ("loss",)
    reread = 0
    if backward:
        if head is None:
            cfg = cross_entropy_config(vocab, _dtype_of(dtype), gpu=gpu, device=device)
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


def _dtype_of(dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    return {4: torch.float32, 2: torch.bfloat16}.get(int(dtype), torch.float32)


def cross_entropy_flops(tokens: int, vocab: int, *, backward: bool = True) -> int:
    """Nominal FLOPs: forward 4 per logit (max, subtract, exp, add), backward 4 more (exp, multiply,
    subtract, the target's compare); the special-function rate, not the FLOPs, is what can bind."""
    return (8 if backward else 4) * tokens * vocab


# -- configuration ------------------------------------------------------------------------------------------
# From sweeps on an H100 and an H200 (fwd+bwd bf16); what each constant chooses and the measurements
# behind its value: benchmarks/notes_lesson5.md ("2026-11-26: cross-entropy's configuration, constant
# by constant"). Rows up to NARROW_MAX run in small programs (8 warps, a head of 8192, tiles of 4096,
# sweep 1 pipelined three tiles deep, sweep 2's next tile loaded ahead), wider rows in one 32-warp
# program per SM with a 64 KiB head; both with L2 hints and the target's logit as the reference.
NARROW_MAX = 65536
#: with a gradient, rows from SPLIT_MIN (fp32) or SPLIT_MIN_16 (16-bit) columns are split across
#: programs, SPLIT_BYTES of row each (4 warps), at most MAX_SPLIT a row; each part's load is issued before
#: its target's (SPLIT_EARLY), and a 16-bit part's registers are capped at SPLIT_MAXNREG a thread
SPLIT_MIN = NARROW_MAX + 1
SPLIT_BYTES = 32768
MAX_SPLIT = 64
SPLIT_MIN_16 = 28000
SPLIT_MAXNREG = 96
#: a remainder of at most SPLIT_TAIL columns past the last whole part goes to the last part's fragment; a
#: larger one (16-bit) is shared by the whole parts, in extra tiles of up to SPLIT_EXTRA lanes each
SPLIT_TAIL = 64
SPLIT_EXTRA = 4096
#: the loss alone (no gradient) keeps nothing for a second sweep: rows wider than FORWARD_TILE walk tiles
#: of that many elements, 8 warps, three tiles in flight
FORWARD_TILE = 4096
#: 16-bit rows of ROWS_MIN to ROWS_MAX logits, with a gradient and no label smoothing, on a GPU of at least
#: ROWS_MIN_DRAM_GBPS of DRAM bandwidth: persistent programs (one a SM, 16 warps) walk whole rows, the next
#: two rows' loads in flight through shared memory (lesson 4's persistent softmax; each row read once).
#: Measured faster on an H200 (4.8 TB/s) and slower on an H100 (3.35 TB/s) than the head of 8192
#: (benchmarks/notes_lesson5.md, 2026-11-24, the H200's rows kernel). Both have 132 SMs and 50 MB of L2:
#: DRAM bandwidth is what tells them apart; a GPU between the two is not measured.
ROWS_MIN_DRAM_GBPS = 4000.0
ROWS_MIN = 28673  # past 7/8 of the tile of 32768
ROWS_MAX = 32767
#: at most this many rows a program (its targets, target logits and losses are vectors of this size):
#: more rows than SMs x this take more programs, one after another on each SM
ROWS_PER_PROGRAM = 128


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
            cfg.update(ROWS=True, ROWS_WARPS=16, ROW_STAGES=3)  # persistent whole rows (ROWS_MIN_DRAM_GBPS)
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
        cfg.update(SPLIT=parts, SPLIT_BLOCK=part, SPLIT_WARPS=4, SPLIT_EARLY=True)
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
    """The launch configuration for rows of ``n_cols`` logits at row ``stride`` (default ``n_cols``):
    ``{"HEAD", "BLOCK_N", "num_warps", "VEC", "PREFETCH", "PREFETCH2", "LOOP_STAGES", "EVICT", "REF_TARGET",
    "num_stages"}``. HEAD elements of a row stay in registers between the two sweeps; the rest is streamed
    in BLOCK_N tiles (PREFETCH, PREFETCH2: sweep 1's, sweep 2's next tile loaded before this one is used;
    LOOP_STAGES: sweep 1's tiles pipelined that deep by Triton through shared memory; EVICT: L2 eviction
    hints, evict-last for tiles read again, evict-first for the rest; REF_TARGET: sums against the target's
    logit instead of a running maximum). VEC > 1 when the row length or stride is not a multiple of 16
    elements: each row is then split at its 16-byte boundaries (see the kernels) so that its body still
    moves in 16-byte accesses. On a GPU,
    with a gradient, rows from ``SPLIT_MIN_16`` columns (16-bit) or ``SPLIT_MIN`` (fp32) also get ``SPLIT``
    (parts of ``SPLIT_BLOCK`` columns, ``SPLIT_WARPS`` warps each, ``SPLIT_EARLY``: the part loaded before
    the target; 16-bit: ``SPLIT_MAXNREG``, a cap on the registers a thread; a remainder of up to
    ``SPLIT_TAIL`` columns past the whole parts, and an unaligned row's ends, go to the last part's
    fragment; a larger one (16-bit, up to ``SPLIT_EXTRA`` columns a part) is shared by them: parts of
    ``SPLIT_PART`` columns, each with an extra tile): the loss and gradient then come from the split kernel,
    one program a part, each row read once. ``grad=False``: the configuration of the loss alone (no
    gradient), which walks rows wider than ``FORWARD_TILE`` in small pipelined tiles. ``gpu``: the GPU's
    configuration (default: this mode's), so that a lesson on a CPU can ask what the GPU kernel does.
    ``device``: a GPU's name (default: this GPU); on a GPU of at least ``ROWS_MIN_DRAM_GBPS`` of DRAM
    bandwidth (:func:`~fusionlab.kernels._launch.dram_gbps`), aligned 16-bit rows of
    ``ROWS_MIN``-``ROWS_MAX`` logits with a gradient also get ``ROWS`` (``ROWS_WARPS``, ``ROW_STAGES``):
    persistent programs walking whole rows, the loss and gradient from the rows kernel unless label
    smoothing is asked for.
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


def _head_and_tail(cfg: dict) -> dict:
    """``cfg`` without the split and rows kernels' keys: the head-and-tail kernel's configuration."""
    return {k: v for k, v in cfg.items() if not k.startswith(("SPLIT", "ROW"))}


def _takes_rows(cfg: dict, label_smoothing: float) -> bool:
    """Whether the rows kernel computes the loss and gradient (it has no label smoothing)."""
    return bool(cfg.get("ROWS")) and not label_smoothing


# -- kernels --------------------------------------------------------------------------------------------
_LOG2E = tl.constexpr(1.4426950408889634)
_LN2 = tl.constexpr(0.6931471805599453)
# The loss kernels share a small int32 buffer, ``sync``: [0] the rows not ignored (the mean's
# denominator, counted by the prologue), [1:] the split kernel's ticket and per-row counts. The
# prologue writes all of it, so nothing else clears it.
_COUNT_BLOCK = 16384
#: the prologue's step is the targets' count (or sync's length) up to _COUNT_BLOCK, at least this
COUNT_BLOCK_MIN = 1024


@triton.jit
def _cross_entropy_prologue_kernel(
    target_ptr,
    sync_ptr,
    n_rows,
    n_sync,
    ignore_index,
    COUNT: tl.constexpr,
    BLOCK: tl.constexpr = _COUNT_BLOCK,
    PDL: tl.constexpr = False,
):
    # One program: sync[0] = rows whose target is not ignore_index (COUNT: "mean"), sync[1:] = 0. It
    # replaces torch's compare and sum (and the split's zeros): one launch, and up to 16 Ki targets a
    # step (16-byte loads, 16 of them in flight a thread) so that 16k tokens take one step; fewer
    # targets take a step of their own size (the loss kernel waits for this one: its time is the call's).
    if PDL:
        # launched dependent on whatever came before: it waits for it before reading the targets, and
        # only then lets the loss kernel be placed (which waits for this one before it reads sync). That
        # order is what lets the loss kernel read the logits before its own wait: whatever wrote them
        # has finished by the time it starts.
        gdc_wait()
        gdc_launch_dependents()
    if COUNT:
        acc = tl.zeros([BLOCK], tl.int32)
        for start in range(0, n_rows, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            y = tl.load(target_ptr + offs, mask=offs < n_rows, other=ignore_index)
            acc += (y != ignore_index).to(tl.int32)
        tl.store(sync_ptr, tl.sum(acc, axis=0))
    for start in range(1, n_sync, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(sync_ptr + offs, tl.zeros([BLOCK], tl.int32), mask=offs < n_sync)


@triton.jit
def _cross_entropy_finish_kernel(loss_ptr, out_ptr, sync_ptr, n_rows, MEAN: tl.constexpr, PDL: tl.constexpr = False):
    # One program: out[0] = the rows' fp32 losses summed (divided by sync[0] for MEAN: all rows
    # ignored gives 0 / 0 = NaN, as torch) and cast to the logits' dtype; replaces torch's sum, divide
    # and cast. A kernel of its own, not the loss kernel's last program: that needs each program to
    # count its row with release semantics, which waits until the program's stores are visible, and
    # cost 1-17% on an H100 (benchmarks/notes_lesson5.md, 2026-11-24, the small kernels around the fused call).
    if PDL:  # launched while the loss kernel ran: its losses are visible after the wait
        gdc_wait()
    acc = tl.zeros([4096], tl.float32)
    for start in range(0, n_rows, 4096):
        offs = start + tl.arange(0, 4096)
        acc += tl.load(loss_ptr + offs, mask=offs < n_rows, other=0.0)
    total = tl.sum(acc, axis=0)
    if MEAN:
        total = total / tl.load(sync_ptr).to(tl.float32)
    tl.store(out_ptr, total.to(out_ptr.dtype.element_ty))


@triton.jit
def _cross_entropy_fwd_kernel(
    x_ptr, target_ptr, grad_ptr, loss_ptr, sync_ptr, n_cols, stride_xm, stride_gm, ignore_index, label_smoothing,
    HEAD: tl.constexpr, BLOCK_N: tl.constexpr, VEC: tl.constexpr, WRITE_GRAD: tl.constexpr, MEAN: tl.constexpr,
    SMOOTH: tl.constexpr, PREFETCH: tl.constexpr, SINGLE: tl.constexpr = False, KEEP: tl.constexpr = "",
    DROP: tl.constexpr = "", REF_TARGET: tl.constexpr = False, LOOP_STAGES: tl.constexpr = 1,
    PREFETCH2: tl.constexpr = False, PDL: tl.constexpr = False,
):  # fmt: skip
    # exp(v) is computed as exp2(v log2 e): one multiply and one MUFU ex2. Differences x - max are
    # formed in natural units first: they are exact for logits near the max, also at 1e4 (multiplying
    # by log2 e first would round each logit, an error of 1e-3 at that size).
    row = tl.program_id(axis=0).to(tl.int64)  # row * stride passes 2**31 past 16384 x 131072
    y = tl.load(target_ptr + row)
    x_row = x_ptr + row * stride_xm
    g_row = grad_ptr + row * stride_gm
    if VEC > 1:
        # A row whose start or length is not a multiple of 16 bytes: masks at its ends would stop the
        # compiler from using 16-byte accesses for the whole row. Split it: `lo` elements up to the first
        # 16-byte boundary, a body of a multiple of VEC elements (16-byte aligned, its mask constant
        # over each VEC group), and fewer than VEC elements after it. The two fragments share one
        # tiny tile of 2 VEC lanes. The gradient has the logits' row stride (the launcher sees to it).
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
            zero = tl.zeros([BLOCK_N], dtype=grad_ptr.dtype.element_ty)
            for start in range(0, body_len, BLOCK_N):
                offs = start + tl.arange(0, BLOCK_N)
                tl.store(g_body + offs, zero, mask=offs < body_len)
            if VEC > 1:
                tl.store(g_row + col_f, tl.zeros([2 * VEC], dtype=grad_ptr.dtype.element_ty), mask=mask_f)
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
            # Exponentials against a *fixed* reference, the target's logit, known before the row is
            # read: no maximum, no rescaling, no reduction before the sums start (a subtract, a
            # multiply, an exp2 and an add an element). lse = ref + log(d) whatever the reference, as
            # long as d stays in fp32's range: d >= 1 (the target's own term), and d <= 1e26 means no
            # term passed e**60, so nothing overflowed here or will in sweep 2. A row outside that
            # range (logits 60 above the target's, or a target logit of ±inf) is summed again against
            # its true maximum below (slow, and rare).
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
                # the reference was too far from the row's maximum: find the maximum, sum again
                # against it (the head from registers, the rest read twice more)
                big = tl.max(x_h, axis=0)
                if VEC > 1:
                    big = tl.maximum(big, tl.max(x_f, axis=0))
                if not SINGLE:
                    m_w = tl.full([BLOCK_N], float("-inf"), tl.float32)
                    for i in range(0, n_tail):
                        offs = HEAD + i * BLOCK_N + tl.arange(0, BLOCK_N)
                        x = tl.load(x_body + offs, mask=offs < body_len, other=float("-inf")).to(tl.float32)
                        m_w = tl.maximum(m_w, x)
                    big = tl.maximum(big, tl.max(m_w, axis=0))
                ref = tl.where(big == float("-inf"), 0.0, big)
                d = tl.sum(tl.math.exp2((x_h - ref) * _LOG2E), axis=0)
                if VEC > 1:
                    d += tl.sum(tl.math.exp2((x_f - ref) * _LOG2E), axis=0)
                if not SINGLE:
                    d_w = tl.zeros([BLOCK_N], tl.float32)
                    for i in range(0, n_tail):
                        offs = HEAD + i * BLOCK_N + tl.arange(0, BLOCK_N)
                        x = tl.load(x_body + offs, mask=offs < body_len, other=float("-inf")).to(tl.float32)
                        d_w += tl.math.exp2((x - ref) * _LOG2E)
                    d += tl.sum(d_w, axis=0)
        lse = ref + tl.math.log2(d) * _LN2  # a row of only -inf: d = 0, lse = -inf, loss NaN (as torch)
        loss = lse - x_y
        if SMOOTH:
            loss = (1.0 - label_smoothing) * loss + label_smoothing * (lse - s / n_cols)
        tl.store(loss_ptr + row, loss)

        if WRITE_GRAD:
            # -- sweep 2: grad = (softmax - eps/V - (1 - eps) onehot) * scale, scale = 1/n_valid for
            # "mean" (loaded from the device: no host sync), 1 otherwise (the backward multiplies).
            # softmax * scale = exp(x - ref) * scale / d (d = sum of exp(x - ref) over the row)
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


@triton.jit
def _widen_by_bits(x, WIDEN: tl.constexpr):
    """16-bit floats to fp32 by integer operations on their bits (``WIDEN``: "bf16", "fp16"; "": a
    plain conversion). bf16: the 16 bits moved to the top, exact. fp16: exponent and mantissa moved to
    fp32's places (13 bits up), the sign to the top, times 2**112 to rebias the exponent (15 -> 127):
    exact for finite values (subnormals included, unless the GPU flushes them: then |x| < 6.1e-5 reads
    as 0, an error below fp16's in any exp(x - lse)); inf reads as 65536 and NaN as a finite value,
    which the split kernel's fast path never meets (its row sum would be inf or NaN: the second round
    reads the logits again) but for -inf, whose exponential stays 0 (65536 is past fp16's range)."""
    if WIDEN == "bf16":
        return (x.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
    elif WIDEN == "fp16":
        b = x.to(tl.int16, bitcast=True).to(tl.int32)
        bits = ((b & 0x7FFF) << 13) | ((b & 0x8000) << 16)
        return bits.to(tl.float32, bitcast=True) * 5.192296858534828e33  # 2**112
    else:
        return x.to(tl.float32)


@triton.jit
def _cross_entropy_split_kernel(
    x_ptr, target_ptr, grad_ptr, loss_ptr, sync_ptr, part_ptr, n_cols, stride_xm, stride_gm, ignore_index,
    label_smoothing,
    SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr, BLOCK_N: tl.constexpr, MEAN: tl.constexpr, SMOOTH: tl.constexpr,
    EARLY: tl.constexpr = False, WIDEN: tl.constexpr = "", AGAIN_N: tl.constexpr = 1024, VEC: tl.constexpr = 1,
    FRAG: tl.constexpr = 0, EXTRA: tl.constexpr = 0,
    PART_N=0,
    PDL: tl.constexpr = False,
):  # fmt: skip
    # The loss and gradient of a row held by SPLIT programs, BLOCK_N logits each in registers (the
    # softmax's split schedule; _rows.py says why the wait cannot hang): each part
    # publishes its sum of exp(x - x_y) against the target's logit (and, label smoothing, its sum of
    # x), waits for the row's other parts, adds their sums into the row's lse and writes its part of
    # the gradient. One read, one write, no re-read. GPU only (SPLIT = 1 also in the interpreter).
    #
    # What limits it is the registers a program holds across the wait: the part, nothing else, or
    # fewer programs fit a SM and fewer bytes are in flight (benchmarks/notes_lesson5.md, 2026-11-25,
    # bytes in flight). Hence the target's logit as the reference (one for the whole row, known before the part
    # is read: no maximum, which made the compiler keep an fp32 copy of the part), and, for 16-bit
    # logits (WIDEN), the gradient's fp32 logits made after the wait from the 16-bit part by integer
    # operations on its bits (_widen_by_bits): an expression the compiler cannot merge with the first
    # widening, so only the 16-bit part crosses the wait, and a cap on the registers (SPLIT_MAXNREG).
    if PDL:  # launched while the prologue ran: its zeros are the ticket's and the counts'
        gdc_wait()
        gdc_launch_dependents()
    row, part = _split_ticket(sync_ptr + 1, SPLIT)  # (sync: see _COUNT_BLOCK)
    x_row = x_ptr + row * stride_xm
    g_row = grad_ptr + row * stride_gm
    # The parts hold the row's body, BLOCK_N columns each from `lo`; the last part also holds the
    # fragment, FRAG lanes (FRAG > 0): the `lo` columns before the row's first 16-byte boundary (VEC > 1:
    # a row whose start or length is not a multiple of 16 bytes, cut as the head-and-tail kernel cuts
    # it, so that the body still moves in 16-byte accesses) in lanes [0, VEC), and the columns after the
    # body in the others: fewer than VEC, or (SPLIT * BLOCK_N < n_cols) a remainder too small to be
    # worth a program of its own (65552 = 4 x 16384 + 16). EXTRA > 0: each part is PART_N columns (a
    # multiple of 16), more than BLOCK_N, held as a tile of BLOCK_N and one of EXTRA lanes after it, so
    # that a remainder too large for the fragment is shared by the parts (50257 in three parts of 16768,
    # not four with 1105 columns in the last: a program a part, and a part's slot on its SM is then full).
    # The gradient has the logits' row stride.
    if EXTRA > 0:
        part_n = PART_N
    else:
        part_n = BLOCK_N
    if VEC > 1:
        x_start = row * stride_xm
        lo, body = _row_body(x_start, n_cols, VEC)
        body = tl.multiple_of(tl.minimum(body, SPLIT * part_n), VEC)
        x_body = x_ptr + tl.multiple_of(x_start + lo, VEC)
        g_body = grad_ptr + tl.multiple_of(row * stride_gm + lo, VEC)
    else:
        lo = 0
        if FRAG > 0:
            body = SPLIT * part_n
        else:
            body = n_cols
        x_body = x_row
        g_body = g_row
    start = part * part_n
    # With the extra tile the part's width is a runtime value, and offsets from the row's start would be
    # made vector by vector (a 64-bit register pair each, 92 -> 113 registers: four programs a SM, not
    # five): then the part has its own pointers and the offsets are constants from them. Without it
    # the row's offsets fold into constants already (and fp16 65552 ran 1.4 points slower the other way).
    if EXTRA > 0:
        x_p = x_body + start
        g_p = g_body + start
        o0 = 0
        lim = body - start
        # the extra tile's end, a multiple of 16 bytes as the hint says: it still moves in 16-byte accesses
        end = tl.multiple_of(tl.minimum(start + PART_N, body), 16 if VEC == 1 else VEC) - start
        offs_e = BLOCK_N + tl.arange(0, EXTRA)
        mask_e = offs_e < end
    else:
        x_p = x_body
        g_p = g_body
        o0 = start
        lim = body
    offs = o0 + tl.arange(0, BLOCK_N)
    mask = offs < lim  # (the tile of BLOCK_N ends inside the part: the body's end is its only bound)
    if FRAG > 0:
        lane = tl.arange(0, FRAG)
        col_f = tl.where(lane < VEC, lane, lo + body + lane - VEC)
        last = part == SPLIT - 1  # (the other parts' fragments are empty)
        mask_f = tl.where(lane < VEC, lane < tl.where(last, lo, 0), col_f < tl.where(last, n_cols, 0))
    if EARLY:  # the part's load before the target's: the two latencies overlap (an ignored row reads it too)
        x_raw = tl.load(x_p + offs, mask=mask, other=float("-inf"))
        if EXTRA > 0:
            x_e_raw = tl.load(x_p + offs_e, mask=mask_e, other=float("-inf"))
    y = tl.load(target_ptr + row)
    if y == ignore_index:  # the whole row agrees (one target): no exchange, zero loss and gradient
        tl.store(g_p + offs, tl.zeros([BLOCK_N], dtype=grad_ptr.dtype.element_ty), mask=mask)
        if EXTRA > 0:
            tl.store(g_p + offs_e, tl.zeros([EXTRA], dtype=grad_ptr.dtype.element_ty), mask=mask_e)
        if FRAG > 0:
            tl.store(g_row + col_f, tl.zeros([FRAG], dtype=grad_ptr.dtype.element_ty), mask=mask_f)
        if part == 0:
            tl.store(loss_ptr + row, 0.0)
    else:
        valid = (y >= 0) & (y < n_cols)  # an out-of-range target: NaN, never a stray read
        # x_y before the exchange: with the gradient in place, the row is overwritten once all parts
        # have published, and not before
        x_y = tl.load(x_row + y, mask=valid, other=float("nan")).to(tl.float32)
        if not EARLY:
            x_raw = tl.load(x_p + offs, mask=mask, other=float("-inf"))
            if EXTRA > 0:
                x_e_raw = tl.load(x_p + offs_e, mask=mask_e, other=float("-inf"))
        # round 1: every part sums against the same reference, so the row's sum is the parts' sum
        ref = tl.where(tl.abs(x_y) < float("inf"), x_y, 0.0)  # NaN (bad target) or ±inf: 0
        d = tl.sum(tl.math.exp2((x_raw.to(tl.float32) - ref) * _LOG2E), axis=0)
        if SMOOTH:
            s = tl.sum(tl.where(mask, x_raw.to(tl.float32), 0.0), axis=0)
        if EXTRA > 0:
            d += tl.sum(tl.math.exp2((x_e_raw.to(tl.float32) - ref) * _LOG2E), axis=0)
            if SMOOTH:
                s += tl.sum(tl.where(mask_e, x_e_raw.to(tl.float32), 0.0), axis=0)
        if FRAG > 0:
            x_f_raw = tl.load(x_row + col_f, mask=mask_f, other=float("-inf"))
            d += tl.sum(tl.math.exp2((x_f_raw.to(tl.float32) - ref) * _LOG2E), axis=0)
            if SMOOTH:
                s += tl.sum(tl.where(mask_f, x_f_raw.to(tl.float32), 0.0), axis=0)
        parts = part_ptr + row * (4 * SPLIT)  # [sums | sums of x | round 2's maxima | round 2's sums]
        tl.store(parts + part, d)
        if SMOOTH:
            tl.store(parts + SPLIT + part, s)
        _split_wait(sync_ptr + 1, row, SPLIT)
        p = tl.arange(0, SPLIT_P2)
        d = tl.sum(tl.load(parts + p, mask=p < SPLIT, other=0.0, volatile=True), axis=0)
        if MEAN:
            scale = 1.0 / tl.load(sync_ptr).to(tl.float32)
        else:
            scale = 1.0
        # grad = (softmax - eps/V - (1 - eps) onehot) * scale, softmax * scale = exp2((x - lse) log2 e + log2 scale)
        log2_c = tl.where(valid, tl.math.log2(scale), float("nan"))
        c_s = label_smoothing / n_cols * scale
        # d >= 1 (the target's own term) and d <= 1e26 (no term past e**60): lse = ref + log d is exact.
        # Outside (a logit 60 above the target's, a target of ±inf, NaN) the parts, which all see the
        # same d, take a second round against their maxima (the online softmax's merge), waiting on the
        # same counter for 2 SPLIT arrivals, and write their gradient from the logits read again in
        # small tiles (the in-place gradient overwrites a tile only after reading it). A path of its
        # own, the part in registers dead on it (bf16 parts of 8192 on an H200: 86 -> 72 registers).
        if not ((d >= 1e-20) & (d <= 1e26)):  # (NaN fails both)
            stop = tl.minimum(o0 + part_n, lim)  # this part's columns, [o0, stop) from x_p
            m_v = tl.full([AGAIN_N], float("-inf"), tl.float32)
            for at in range(0, part_n, AGAIN_N):
                o = o0 + at + tl.arange(0, AGAIN_N)
                m_v = tl.maximum(m_v, tl.load(x_p + o, mask=o < stop, other=float("-inf")).to(tl.float32))
            m = tl.max(m_v, axis=0)
            if FRAG > 0:
                x_f = tl.load(x_row + col_f, mask=mask_f, other=float("-inf")).to(tl.float32)
                m = tl.maximum(m, tl.max(x_f, axis=0))
            m_ref = tl.where(m == float("-inf"), 0.0, m)
            d_v = tl.zeros([AGAIN_N], tl.float32)
            for at in range(0, part_n, AGAIN_N):
                o = o0 + at + tl.arange(0, AGAIN_N)
                x = tl.load(x_p + o, mask=o < stop, other=float("-inf")).to(tl.float32)
                d_v += tl.math.exp2((x - m_ref) * _LOG2E)
            d_part = tl.sum(d_v, axis=0)
            if FRAG > 0:
                d_part += tl.sum(tl.math.exp2((x_f - m_ref) * _LOG2E), axis=0)
            tl.store(parts + 2 * SPLIT + part, m)
            tl.store(parts + 3 * SPLIT + part, d_part)
            _split_wait(sync_ptr + 1, row, 2 * SPLIT)
            big, d = _split_merge(parts + 2 * SPLIT, SPLIT, SPLIT_P2)
            lse = big + tl.math.log2(d) * _LN2  # a row of only -inf: d = 0, lse = -inf, loss NaN (as torch)
            for at in range(0, part_n, AGAIN_N):
                o = o0 + at + tl.arange(0, AGAIN_N)
                x = tl.load(x_p + o, mask=o < stop, other=float("-inf")).to(tl.float32)
                grad = tl.math.exp2((x - lse) * _LOG2E + log2_c) - c_s
                tl.store(g_p + o, grad.to(grad_ptr.dtype.element_ty), mask=o < stop)
            if FRAG > 0:
                grad_f = tl.math.exp2((x_f - lse) * _LOG2E + log2_c) - c_s
                tl.store(g_row + col_f, grad_f.to(grad_ptr.dtype.element_ty), mask=mask_f)
        else:
            lse = ref + tl.math.log2(d) * _LN2
            x = _widen_by_bits(x_raw, WIDEN)
            grad = tl.math.exp2((x - lse) * _LOG2E + log2_c)
            if SMOOTH:
                grad -= c_s
            tl.store(g_p + offs, grad.to(grad_ptr.dtype.element_ty), mask=mask)
            if EXTRA > 0:
                grad_e = tl.math.exp2((_widen_by_bits(x_e_raw, WIDEN) - lse) * _LOG2E + log2_c)
                if SMOOTH:
                    grad_e -= c_s
                tl.store(g_p + offs_e, grad_e.to(grad_ptr.dtype.element_ty), mask=mask_e)
            if FRAG > 0:
                grad_f = tl.math.exp2((_widen_by_bits(x_f_raw, WIDEN) - lse) * _LOG2E + log2_c) - c_s
                tl.store(g_row + col_f, grad_f.to(grad_ptr.dtype.element_ty), mask=mask_f)
        loss = lse - x_y
        if SMOOTH:
            s = tl.sum(tl.load(parts + SPLIT + p, mask=p < SPLIT, other=0.0, volatile=True), axis=0)
            loss = (1.0 - label_smoothing) * loss + label_smoothing * (lse - s / n_cols)
        if part == 0:
            tl.store(loss_ptr + row, loss)
        # the target's element, by the part that holds it (in its body, or the last part's fragment),
        # after a barrier (its tile store came first)
        tl.debug_barrier()
        in_body = (y >= lo) & (y < lo + body)
        own = tl.where(in_body, (y >= lo + start) & (y < lo + start + part_n), part == SPLIT - 1)
        own = valid & own
        grad_y = tl.math.exp2((x_y - lse) * _LOG2E) * scale - c_s - (1.0 - label_smoothing) * scale
        tl.store(g_row + y, grad_y.to(grad_ptr.dtype.element_ty), mask=own)


@triton.jit
def _cross_entropy_rows_kernel(
    x_ptr, target_ptr, grad_ptr, loss_ptr, sync_ptr, n_rows, n_cols, stride_xm, stride_gm, ignore_index,
    BLOCK_N: tl.constexpr, MAX_ROWS: tl.constexpr, ROW_STAGES: tl.constexpr, MEAN: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    # Persistent programs, each taking rows pid, pid + P, pid + 2P, ... (at most MAX_ROWS) whole in one
    # tile. tl.range pipelines the loop: the next rows' loads are in flight through shared memory while
    # this row reduces and writes. No label smoothing (the fwd kernel takes it). GPU or interpreter.
    # What would stall that pipeline is kept out of the loop (probe_ce_persistent.py, H200): a scalar
    # load or store of a row's target or loss cost 10-25 points of copy, so the program's targets and
    # their logits are gathered before the loop and its losses (kept in a vector) stored after it; in
    # the loop the row's target is a one-element tensor, broadcast against the tile, compared in int32
    # (an int64 compare widens every lane's column index: two more registers an element, 59% of copy
    # against 90%).
    pid = tl.program_id(axis=0)
    step = tl.num_programs(axis=0)
    offs = tl.arange(0, BLOCK_N)
    col_ok = offs < n_cols
    one = tl.arange(0, 1)
    k = tl.arange(0, MAX_ROWS)
    rows = pid + step * k.to(tl.int64)  # int64: row * stride passes 2**31
    row_ok = rows < n_rows
    ys = tl.load(target_ptr + rows, mask=row_ok, other=ignore_index)
    ys_ok = row_ok & (ys >= 0) & (ys < n_cols)  # an out-of-range target: NaN, never a stray read
    # x_y before any gradient is written: with the gradient in place the row is overwritten in the loop
    x_ys = tl.load(x_ptr + rows * stride_xm + ys, mask=ys_ok, other=float("nan")).to(tl.float32)
    if PDL:
        # launched while the prologue ran; the wait before the loop, not in it: the pipeliner would
        # prefetch sync's load for the first rows ahead of a wait in the loop, before the prologue wrote
        # it (tried: different bits once in six shapes; benchmarks/notes_lesson5.md, 2026-11-25,
        # programmatic dependent launch)
        gdc_wait()
        gdc_launch_dependents()
    if MEAN:
        scale = 1.0 / tl.load(sync_ptr).to(tl.float32)
    else:
        scale = 1.0
    lses = tl.zeros([MAX_ROWS], tl.float32)
    for row in tl.range(pid, n_rows, step, num_stages=ROW_STAGES):
        r = tl.full([], 0, tl.int64) + row
        y = tl.load(target_ptr + r + one)  # (1,)
        keep = y != ignore_index
        valid = (y >= 0) & (y < n_cols)
        # an ignored row is not read (its lanes -inf: e = 0, gradient 0)
        x = tl.load(x_ptr + r * stride_xm + offs, mask=tl.where(keep, col_ok, False), other=float("-inf"))
        x = x.to(tl.float32)
        m = tl.max(x, axis=0)
        ref = tl.where(m == float("-inf"), 0.0, m)  # a row of only -inf: no -inf - -inf
        e = tl.math.exp2((x - ref) * _LOG2E)
        d = tl.sum(e, axis=0)
        lse = ref + tl.math.log2(d) * _LN2  # a row of only -inf: lse = -inf, loss NaN (as torch)
        lses = tl.where(k == (row - pid) // step, lse, lses)
        # grad = (softmax - onehot) * scale; an ignored row: 0; an out-of-range target: NaN
        c = tl.where(keep, tl.where(valid, scale / d, float("nan")), 0.0)
        hot = tl.where(keep, scale, 0.0)
        grad = e * c - tl.where(offs == y.to(tl.int32), hot, 0.0)
        tl.store(grad_ptr + r * stride_gm + offs, grad.to(grad_ptr.dtype.element_ty), mask=col_ok)
    loss = tl.where(ys == ignore_index, 0.0, lses - x_ys)
    tl.store(loss_ptr + rows, loss, mask=row_ok)


@triton.jit
def _cross_entropy_bwd_kernel(
    grad_ptr, target_ptr, grad_out_ptr, n_rows, n_cols, stride_gm, stride_go, ignore_index,
    BLOCK_N: tl.constexpr, SHARED: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    # grad *= grad_output in place, row by row, skipping rows whose grad_output is exactly 1 (a loss
    # that is the last op: the common case costs one launch and no pass) and ignored rows (their
    # gradient is 0 whatever grad_output is; 0 * inf would be NaN). SHARED: one grad_output for every
    # row ("mean", "sum", or "none" summed: a stride of 0), read once by each of a few programs that
    # walk rows pid, pid + P, ... (a launch of one program a row cost 3.7 us at 4096 rows and 6.2 us
    # at 8192 on an H200 only to find 1.0; benchmarks/notes_lesson5.md, 2026-11-25, the time beside the kernel);
    # otherwise one program a row, each reading its own. PDL: launched dependent on whatever kernel
    # came before (autograd's ones for grad_output), so it waits before it reads anything.
    if PDL:
        gdc_wait()
    pid = tl.program_id(axis=0)
    if SHARED:
        go = tl.load(grad_out_ptr).to(tl.float32)
        if go != 1.0:
            for row in range(pid, n_rows, tl.num_programs(axis=0)):
                r = tl.full([], 0, tl.int64) + row  # int64: row * stride passes 2**31
                _scale_row(grad_ptr, target_ptr, r, n_cols, stride_gm, ignore_index, go, BLOCK_N)
    else:
        row = pid.to(tl.int64)
        go = tl.load(grad_out_ptr + row * stride_go).to(tl.float32)
        if go != 1.0:
            _scale_row(grad_ptr, target_ptr, row, n_cols, stride_gm, ignore_index, go, BLOCK_N)


@triton.jit
def _scale_row(grad_ptr, target_ptr, row, n_cols, stride_gm, ignore_index, go, BLOCK_N: tl.constexpr):
    """Row ``row`` of the gradient times ``go``, unless its target is ``ignore_index``."""
    if tl.load(target_ptr + row) != ignore_index:
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


def _prologue(target, ignore_index, *, count, n_rows_split=None):
    """The ``sync`` buffer (see ``_COUNT_BLOCK``), written by one launch: the count of rows not ignored
    when ``count`` ("mean"); ``n_rows_split``: zeroed room for the split kernel's ticket and counts."""
    n_sync = 1 if n_rows_split is None else 2 + n_rows_split
    sync = torch.empty(n_sync, dtype=torch.int32, device=target.device)
    _cross_entropy_prologue_kernel[(1,)](
        target, sync, target.shape[0], n_sync, ignore_index,
        COUNT=count, BLOCK=min(_COUNT_BLOCK, max(COUNT_BLOCK_MIN, next_pow2(max(target.shape[0], n_sync)))),
        PDL=pdl_supported(), **launch_kwargs(16, pdl=True),
    )  # fmt: skip
    return sync


def _launch_forward(
    logits, target, grad, loss_rows, sync, ignore_index, label_smoothing, cfg, *, mean, after_prologue=False
):
    """One program per row (or per part of a split row) writes each row's loss to ``loss_rows`` (in
    its dtype). ``grad``: the gradient's destination (None: forward only; ``logits`` itself: in
    place). ``sync``: from :func:`_prologue` (its count read when ``mean``; split rows need its room).
    ``after_prologue``: the prologue was the stream's last launch, so this one may overlap it (PDL)."""
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


def _launch_split(logits, target, grad, loss_rows, sync, ignore_index, label_smoothing, cfg, mean, pdl=False):
    n_rows, n_cols = logits.shape
    parts, block, vec = cfg["SPLIT"], cfg["SPLIT_BLOCK"], cfg["VEC"]
    part_n = cfg.get("SPLIT_PART", block)  # columns a part: a tile of `block` and, past it, the extra tile
    if part_n < block or part_n % 16:
        raise ValueError(f"cross_entropy: SPLIT_PART={part_n} must be a multiple of 16 and at least SPLIT_BLOCK")
    stats = torch.empty(n_rows * 4 * parts, dtype=torch.float32, device=logits.device)  # (see the kernel)
    # the last part's fragment: VEC lanes for the columns before the row's first 16-byte boundary, and
    # room for those after the parts (fewer than VEC, or the remainder past SPLIT whole parts)
    frag = 0 if vec == 1 and parts * part_n >= n_cols else next_pow2(vec + max(vec, n_cols - parts * part_n))
    return _cross_entropy_split_kernel[(n_rows * parts,)](
        logits, target, grad, loss_rows, sync, stats, n_cols, logits.stride(0), grad.stride(0), ignore_index,
        label_smoothing,
        SPLIT=parts, SPLIT_P2=next_pow2(parts), BLOCK_N=block, MEAN=mean, SMOOTH=label_smoothing != 0.0,
        EARLY=cfg.get("SPLIT_EARLY", False),
        WIDEN={torch.bfloat16: "bf16", torch.float16: "fp16"}.get(logits.dtype, ""), AGAIN_N=min(1024, block),
        VEC=vec, FRAG=frag, EXTRA=next_pow2(part_n - block) if part_n > block else 0, PART_N=part_n, PDL=pdl,
        **launch_kwargs(cfg["SPLIT_WARPS"], maxnreg=cfg.get("SPLIT_MAXNREG"), pdl=pdl),
    )  # fmt: skip


def _launch_rows(logits, target, grad, loss_rows, sync, ignore_index, cfg, mean, pdl=False):
    n_rows, n_cols = logits.shape
    # one program a SM (a tile of 64 KiB, two more in shared memory), more when the rows would pass
    # ROWS_PER_PROGRAM a program; "ROWS_PROGRAMS" (a test's) sets the count
    programs = cfg.get("ROWS_PROGRAMS") or max(sm_count(), cdiv(n_rows, ROWS_PER_PROGRAM))
    programs = min(programs, n_rows)
    return _cross_entropy_rows_kernel[(programs,)](
        logits, target, grad, loss_rows, target if sync is None else sync, n_rows, n_cols, logits.stride(0),
        grad.stride(0), ignore_index,
        BLOCK_N=next_pow2(n_cols), MAX_ROWS=next_pow2(cdiv(n_rows, programs)), ROW_STAGES=cfg["ROW_STAGES"],
        MEAN=mean, PDL=pdl, **launch_kwargs(cfg["ROWS_WARPS"], pdl=pdl),
    )  # fmt: skip


def _loss(logits, target, grad, ignore_index, reduction, label_smoothing, cfg):
    """The loss as ``F.cross_entropy`` returns it (and, when ``grad`` is given, the gradient written
    there), with no torch op: the prologue when needed (the mean's count; the split's zeros), the loss
    kernel, and :func:`_reduce`. "none" writes each row's loss in the logits' dtype directly."""
    n_rows = logits.shape[0]
    if n_rows == 0:
        return _reduce(logits.new_empty(0, dtype=torch.float32), None, reduction, logits.dtype)
    split = grad is not None and bool(cfg.get("SPLIT"))
    mean = reduction == "mean"
    sync = (
        _prologue(target, ignore_index, count=mean, n_rows_split=n_rows if split else None) if mean or split else None
    )
    if reduction == "none":
        out = torch.empty(n_rows, dtype=logits.dtype, device=logits.device)
        _launch_forward(
            logits, target, grad, out, sync, ignore_index, label_smoothing, cfg, mean=False, after_prologue=True
        )
        return out
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    _launch_forward(
        logits, target, grad, loss_rows, sync, ignore_index, label_smoothing, cfg,
        mean=mean, after_prologue=True,
    )  # fmt: skip
    return _reduce(loss_rows, sync, reduction, logits.dtype, after_loss=True)


#: a grad_output shared by every row is checked by this many programs a SM (each walks its rows when it
#: is not 1), not one a row
BWD_PROGRAMS_PER_SM = 4


def _launch_backward(grad, target, grad_output, ignore_index):
    n_rows, n_cols = grad.shape
    if n_rows == 0:
        return
    stride_go = grad_output.stride(0) if grad_output.dim() else 0
    shared = stride_go == 0
    cfg = _config(n_cols, grad.dtype, runtime.is_gpu())
    programs = min(n_rows, BWD_PROGRAMS_PER_SM * sm_count()) if shared else n_rows
    _cross_entropy_bwd_kernel[(programs,)](
        grad, target, grad_output, n_rows, n_cols, grad.stride(0), stride_go, ignore_index,
        BLOCK_N=cfg["BLOCK_N"], SHARED=shared, PDL=pdl_supported(),
        **launch_kwargs(min(cfg["num_warps"], 8), pdl=True),
    )  # fmt: skip


def _reduce(loss_rows, sync, reduction, dtype, *, after_loss=False):
    """The rows' fp32 losses as ``reduction`` returns them, in ``dtype``: "none" cast; "mean" and
    "sum" by the one-program finish kernel ("mean" divides by the prologue's count, ``sync[0]``). No
    rows: what torch returns (the mean of nothing is NaN, the sum 0), with nothing launched.
    ``after_loss``: the loss kernel was the stream's last launch, so this one may overlap it (PDL)."""
    if reduction == "none":
        return loss_rows.to(dtype)
    if loss_rows.numel() == 0:
        return torch.full((), float("nan") if reduction == "mean" else 0.0, dtype=dtype, device=loss_rows.device)
    out = torch.empty((), dtype=dtype, device=loss_rows.device)
    _cross_entropy_finish_kernel[(1,)](
        loss_rows,
        out,
        loss_rows if sync is None else sync,
        loss_rows.shape[0],
        MEAN=reduction == "mean",
        PDL=after_loss and pdl_supported(),
        **launch_kwargs(8, pdl=after_loss),
    )
    return out


def _increment_version(t: torch.Tensor) -> None:
    # Tell autograd that t's memory changed: any other op that saved t for its backward then raises
    # "modified by an inplace operation" instead of silently using gradients as logits.
    bump = getattr(torch.autograd.graph, "increment_version", None)
    if bump is not None:
        bump(t)


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
    check_target: bool | None = None,
    head_n: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """``F.cross_entropy(logits, target, ...)`` fused: loss and gradient in one kernel, one pass a row.

    ``logits``: ``(T, V)``, fp32/bf16/fp16 (math in fp32), rows may be strided (last dim contiguous);
    ``target``: ``(T,)`` int64 class indices, or ``ignore_index`` (zero loss, zero gradient, not in the
    mean's denominator). A target outside ``[0, V)`` raises ``fusionlab.kernels.TargetOutOfRange`` (an
    ``IndexError`` and a ``ValueError``) where the check is free, in the interpreter; on a GPU the check
    would cost a host sync a call, so there it gives that row a NaN loss and gradient unless ``check_target=True``
    (``False``: NaN rows everywhere; see :func:`fusionlab.kernels._tensors.check_targets`).
    ``reduction``: "mean" (all rows ignored: NaN, as torch), "sum" or "none" (per row).
    ``label_smoothing`` in [0, 1], never applied to ignored rows. Returns the loss in the logits' dtype,
    differentiable when ``logits.requires_grad``.

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
    n_cols = logits.shape[1]
    check_targets(target, n_cols, ignore_index, op=op, check=check_target)
    need_grad = torch.is_grad_enabled() and logits.requires_grad
    cfg = cross_entropy_config(n_cols, logits.dtype, stride=logits.stride(0), grad=need_grad)
    if head_n is not None or block_n is not None or num_warps is not None:
        cfg = _head_and_tail(cfg)  # a tuning run
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
    "REDUCTIONS",
    "CrossEntropyFunction",
    "cross_entropy",
    "cross_entropy_config",
    "cross_entropy_eager",
    "cross_entropy_flops",
    "cross_entropy_ledger",
    "cross_entropy_reference",
]
