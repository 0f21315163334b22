"""The cross-entropy's kernels beside the head-and-tail one, and the launches around them.

:mod:`fusionlab.kernels.cross_entropy` holds the op: its spec, its configuration, the lesson's kernel
grown up (``_cross_entropy_fwd_kernel``: a row's head kept in registers, its tail streamed twice) and
the public entry. Here is what that entry and :mod:`~fusionlab.kernels.linear_cross_entropy` (which
runs the same loss chunk by chunk over its logits) both launch, so that neither imports the other's
private code:

- the wide rows' GPU schedules: ``_cross_entropy_split_kernel`` (a row split across programs that
  swap their sums: lesson 4's split softmax) and ``_cross_entropy_rows_kernel`` (persistent programs
  walking whole rows: lesson 4's persistent softmax), each row read once;
- the small kernels around the loss, so that nothing runs in torch: the prologue (the count of rows
  not ignored, the mean's denominator, and the split's zeroed ticket), the finish (the rows' losses
  summed in a fixed order, divided, cast) and the backward (the stored gradient times grad_output,
  skipped when it is exactly 1);
- the head-and-tail kernel's two rare paths, as jit helpers it calls (the compiler inlines them): an
  ignored row's zeros (:func:`_zero_row`) and a row summed again against its maximum
  (:func:`_sum_against_max`);
- their launchers and the argument checks both ops share.

Why each kernel is built as it is, with the measurements: ``benchmarks/notes_lesson5.md``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # PDL (sm_90): see pdl_supported

from ._launch import KernelInputError, cdiv, check_tensor, launch_kwargs, next_pow2, pdl_supported, sm_count
from ._rows import _row_body, _split_merge, _split_ticket, _split_wait

REDUCTIONS = ("mean", "sum", "none")
#: at most this many rows a program of the rows kernel (its targets, target logits and losses are
#: vectors of this size): more rows than SMs x this take more programs, one after another on each SM
ROWS_PER_PROGRAM = 128
#: a grad_output shared by every row is checked by this many programs a SM (each walks its rows when it
#: is not 1), not one a row
BWD_PROGRAMS_PER_SM = 4


# -- the kernels around the loss ---------------------------------------------------------------------
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
    target_ptr, sync_ptr, n_rows, n_sync, ignore_index,
    COUNT: tl.constexpr, BLOCK: tl.constexpr = _COUNT_BLOCK, PDL: tl.constexpr = False,
):  # fmt: skip
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
def _zero_row(grad_ptr, g_body, body_len, g_row, col_f, mask_f, BLOCK_N: tl.constexpr, VEC: tl.constexpr):
    """An ignored row's gradient in the head-and-tail kernel: zeros over its body and (VEC > 1) fragments."""
    zero = tl.zeros([BLOCK_N], dtype=grad_ptr.dtype.element_ty)
    for start in range(0, body_len, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        tl.store(g_body + offs, zero, mask=offs < body_len)
    if VEC > 1:
        tl.store(g_row + col_f, tl.zeros([2 * VEC], dtype=grad_ptr.dtype.element_ty), mask=mask_f)


@triton.jit
def _sum_against_max(x_h, x_f, x_body, body_len, n_tail, HEAD: tl.constexpr, BLOCK_N: tl.constexpr,
                     VEC: tl.constexpr, SINGLE: tl.constexpr):  # fmt: skip
    """The head-and-tail kernel's rare path: ``(ref, d)`` of a row summed against its true maximum, when
    the sum against the target's logit left fp32's safe range. The head (``x_h``) and fragments
    (``x_f``, VEC > 1) come from registers; the ``n_tail`` streamed tiles are read twice more."""
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
    return ref, d


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
    WIDEN: tl.constexpr = "", AGAIN_N: tl.constexpr = 1024, VEC: tl.constexpr = 1,
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
    # the part's load before the target's: the two latencies overlap (an ignored row reads it too; the
    # other order measured slower at every size tried: benchmarks/notes_lesson5.md, 2026-11-24)
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


def _launch_backward(grad, target, grad_output, ignore_index, cfg):
    """``grad`` times ``grad_output`` in place, row by row, in tiles of ``cfg["BLOCK_N"]`` (``cfg``: the
    rows' configuration with a gradient, :func:`~fusionlab.kernels.cross_entropy.cross_entropy_config`)."""
    n_rows, n_cols = grad.shape
    if n_rows == 0:
        return
    stride_go = grad_output.stride(0) if grad_output.dim() else 0
    shared = stride_go == 0
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
