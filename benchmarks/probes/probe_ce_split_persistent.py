"""Probe: cross-entropy's split rows (past 65536 logits) walked by persistent programs that load their
next part while this one waits for its row's other parts (benchmarks/notes_lesson5.md,
2026-11-25 "the H200's 128256, bytes in flight").

    PYTHONPATH=. python3 benchmarks/probes/probe_ce_split_persistent.py [--quick]
    PYTHONPATH=. python3 benchmarks/probes/probe_ce_split_persistent.py --split   # one program a part
    PYTHONPATH=. python3 benchmarks/probes/probe_ce_split_persistent.py --reread  # parts in tiles, read twice
    PYTHONPATH=. python3 benchmarks/probes/probe_ce_split_persistent.py --ref     # the target's reference

``--split``: the package's split kernel (one program a part) with its exponentials kept across the
wait in bf16 (``E_BF16``, meant to halve the registers so that more programs fit a SM), over part sizes
and warps. ``--reread``: parts walked in pipelined tiles and read again after the wait. ``--ref``: the
sum against the target's logit and the bf16 part widened again by its bits after the wait (the form
that won: benchmarks/notes_lesson5.md, 2026-11-25 "the H200's 128256, bytes in flight").

The package's split kernel (``_cross_entropy_split_kernel``) runs one program a part of 32 KiB: it
takes a ticket, loads its part, publishes the part's (max, sum), waits for the row's other parts,
writes its gradient and exits. On an H100 that reaches 92% of copy at 8192 x 128256 (fwd+bwd bf16);
on an H200 79%: between its load and its exit a program has no bytes in flight (the publish, the
wait, the merge, the exponentials, the store), and the H200 needs about 40% more bytes in flight than
the H100 for its bandwidth. Here a few programs a SM stay resident and each, before it works on its
part, takes its next ticket and issues that part's load (registers: two parts live at once).

Safety: every part a program takes is published before its holder waits on anything (AHEAD: the
next part is published before this one's wait; otherwise the next ticket is taken only after the
wait), so a wait depends only on tickets being taken, and tickets are taken in order by running
programs: a row completes once at least SPLIT programs are resident (the package's split kernel
assumes the same). A first form held the next part unpublished while waiting and published it early
only when it was of the same row; it chained the rows one after another (3-25% of copy, the notes).

fwd+bwd bf16 "mean" through the package's prologue and reduce, GPU clock, share of copy by two trips;
the package's ``_loss`` (the shipped split) beside it. Each configuration checked against float64
first, on rows with ignored targets and on the in-place gradient.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels import cross_entropy as ce
from fusionlab.kernels._launch import sm_count
from fusionlab.kernels._rows import _split_merge, _split_ticket, _split_wait

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _publish(parts, part, x, count_ptr, SPLIT: tl.constexpr):
    """Store a part's (max, sum of exp(x - max)), then count it as published (release). Returns the
    part's exponentials and its reference (its max)."""
    xf = x.to(tl.float32)
    m = tl.max(xf, axis=0)
    ref = tl.where(m == float("-inf"), 0.0, m)
    e = tl.math.exp2((xf - ref) * LOG2E)
    tl.store(parts + part, m)
    tl.store(parts + SPLIT + part, tl.sum(e, axis=0))
    tl.debug_barrier()
    tl.atomic_add(count_ptr, 1, sem="acq_rel")
    return e, ref


@triton.jit
def _take(
    ticket_ptr, total, x_ptr, target_ptr, n_cols, stride_xm, ignore_index, SPLIT: tl.constexpr, BLOCK_N: tl.constexpr
):
    """A ticket, its (row, part), the part's load and the row's target (masked past the last ticket)."""
    t = tl.atomic_add(ticket_ptr, 1, sem="relaxed")
    row = (t // SPLIT).to(tl.int64)
    part = t % SPLIT
    offs = part * BLOCK_N + tl.arange(0, BLOCK_N)
    x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < tl.where(t < total, n_cols, 0), other=float("-inf"))
    y = tl.load(target_ptr + row, mask=t < total, other=ignore_index)
    return t, row, part, x, y


@triton.jit
def _finish(
    g_row,
    loss_ptr,
    row,
    part,
    e,
    ref,
    x_y,
    y,
    valid,
    parts,
    count_ptr,
    scale,
    n_cols,
    ignore_index,
    SPLIT: tl.constexpr,
    SPLIT_P2: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Wait for the row's parts, merge, write this part's gradient (and the loss, part 0); an ignored
    row (the whole row agrees: nothing published, no wait): zeros."""
    if y == ignore_index:
        _zeros(g_row, loss_ptr, row, part, n_cols, BLOCK_N)
    else:
        arrived = tl.atomic_add(count_ptr, 0, sem="acquire")
        while arrived < SPLIT:
            arrived = tl.atomic_add(count_ptr, 0, sem="acquire")
        big, d = _split_merge(parts, SPLIT, SPLIT_P2)
        lse = big + tl.math.log2(d) * LN2
        if part == 0:
            tl.store(loss_ptr + row, lse - x_y)
        offs = part * BLOCK_N + tl.arange(0, BLOCK_N)
        grad = e * tl.where(valid, tl.math.exp2((ref - lse) * LOG2E) * scale, float("nan"))
        tl.store(g_row + offs, grad.to(g_row.dtype.element_ty), mask=offs < n_cols)
        tl.debug_barrier()
        own = valid & (y >= part * BLOCK_N) & (y < part * BLOCK_N + BLOCK_N)
        grad_y = tl.math.exp2((x_y - lse) * LOG2E) * scale - scale
        tl.store(g_row + y, grad_y.to(g_row.dtype.element_ty), mask=own)


@triton.jit
def _zeros(g_row, loss_ptr, row, part, n_cols, BLOCK_N: tl.constexpr):
    offs = part * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(g_row + offs, tl.zeros([BLOCK_N], dtype=g_row.dtype.element_ty), mask=offs < n_cols)
    if part == 0:
        tl.store(loss_ptr + row, 0.0)


@triton.jit
def _ce_split_persistent_kernel(
    x_ptr,
    target_ptr,
    grad_ptr,
    loss_ptr,
    sync_ptr,
    part_ptr,
    n_rows,
    n_cols,
    stride_xm,
    stride_gm,
    ignore_index,
    SPLIT: tl.constexpr,
    SPLIT_P2: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MEAN: tl.constexpr,
    AHEAD: tl.constexpr,
):
    # AHEAD=False: load, publish, wait, then the next ticket and its load (in flight while this part's
    # gradient is computed and stored). AHEAD=True: the next part is loaded and *published* before
    # this one waits (so a part is never held unpublished while its holder waits: no chain of waits),
    # and this part's row, published an iteration ago, has mostly arrived by the time it waits.
    total = n_rows * SPLIT
    ticket_ptr = sync_ptr + 1
    count_base = sync_ptr + 2
    if MEAN:
        scale = 1.0 / tl.load(sync_ptr).to(tl.float32)
    else:
        scale = 1.0
    t, row, part, x, y = _take(ticket_ptr, total, x_ptr, target_ptr, n_cols, stride_xm, ignore_index, SPLIT, BLOCK_N)
    if AHEAD:
        valid = (y >= 0) & (y < n_cols)
        x_y = tl.load(x_ptr + row * stride_xm + y, mask=valid & (t < total), other=float("nan")).to(tl.float32)
        live = (t < total) & (y != ignore_index)
        e = tl.zeros([BLOCK_N], tl.float32)
        ref = tl.full([], 0.0, tl.float32)
        if live:
            e, ref = _publish(part_ptr + row * (2 * SPLIT), part, x, count_base + row, SPLIT)
        while t < total:
            t2, row2, part2, x2, y2 = _take(
                ticket_ptr, total, x_ptr, target_ptr, n_cols, stride_xm, ignore_index, SPLIT, BLOCK_N
            )
            valid2 = (y2 >= 0) & (y2 < n_cols)
            x_y2 = tl.load(x_ptr + row2 * stride_xm + y2, mask=valid2 & (t2 < total), other=float("nan")).to(tl.float32)
            live2 = (t2 < total) & (y2 != ignore_index)
            e2 = tl.zeros([BLOCK_N], tl.float32)
            ref2 = tl.full([], 0.0, tl.float32)
            if live2:
                e2, ref2 = _publish(part_ptr + row2 * (2 * SPLIT), part2, x2, count_base + row2, SPLIT)
            g_row = grad_ptr + row * stride_gm
            _finish(
                g_row,
                loss_ptr,
                row,
                part,
                e,
                ref,
                x_y,
                y,
                valid,
                part_ptr + row * (2 * SPLIT),
                count_base + row,
                scale,
                n_cols,
                ignore_index,
                SPLIT,
                SPLIT_P2,
                BLOCK_N,
            )
            t = t2
            row = row2
            part = part2
            y = y2
            valid = valid2
            x_y = x_y2
            e = e2
            ref = ref2
    else:
        while t < total:
            g_row = grad_ptr + row * stride_gm
            valid = (y >= 0) & (y < n_cols)
            ignored = y == ignore_index
            e = tl.zeros([BLOCK_N], tl.float32)
            ref = tl.full([], 0.0, tl.float32)
            x_y = tl.full([], 0.0, tl.float32)
            if not ignored:
                x_y = tl.load(x_ptr + row * stride_xm + y, mask=valid, other=float("nan")).to(tl.float32)
                e, ref = _publish(part_ptr + row * (2 * SPLIT), part, x, count_base + row, SPLIT)
                arrived = tl.atomic_add(count_base + row, 0, sem="acquire")
                while arrived < SPLIT:
                    arrived = tl.atomic_add(count_base + row, 0, sem="acquire")
            # the row is complete (or ignored): the next ticket can be of this row without a wait on itself
            t2, row2, part2, x2, y2 = _take(
                ticket_ptr, total, x_ptr, target_ptr, n_cols, stride_xm, ignore_index, SPLIT, BLOCK_N
            )
            _finish(
                g_row,
                loss_ptr,
                row,
                part,
                e,
                ref,
                x_y,
                y,
                valid,
                part_ptr + row * (2 * SPLIT),
                count_base + row,
                scale,
                n_cols,
                ignore_index,
                SPLIT,
                SPLIT_P2,
                BLOCK_N,
            )
            t = t2
            row = row2
            part = part2
            x = x2
            y = y2


@triton.jit
def _ce_split_e_bf16_kernel(
    x_ptr,
    target_ptr,
    grad_ptr,
    loss_ptr,
    sync_ptr,
    part_ptr,
    n_cols,
    stride_xm,
    stride_gm,
    ignore_index,
    SPLIT: tl.constexpr,
    SPLIT_P2: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MEAN: tl.constexpr,
    E_BF16: tl.constexpr,
):
    # The package's split kernel (no label smoothing), one program a part, the part loaded before the
    # target; E_BF16: the exponentials kept across the wait in bf16 (half the registers: more
    # programs resident a SM, more bytes in flight; two roundings of the gradient in place of one).
    # A first form recomputed them from the part after the wait: the compiler kept the part in fp32
    # (the conversion is shared), 160-166 registers either way, and it lost 3 points.
    row, part = _split_ticket(sync_ptr + 1, SPLIT)
    offs = part * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = offs < n_cols
    x_row = x_ptr + row * stride_xm
    g_row = grad_ptr + row * stride_gm
    x_raw = tl.load(x_row + offs, mask=mask, other=float("-inf"))
    y = tl.load(target_ptr + row)
    if y == ignore_index:
        tl.store(g_row + offs, tl.zeros([BLOCK_N], dtype=grad_ptr.dtype.element_ty), mask=mask)
        if part == 0:
            tl.store(loss_ptr + row, 0.0)
    else:
        valid = (y >= 0) & (y < n_cols)
        x_y = tl.load(x_row + y, mask=valid, other=float("nan")).to(tl.float32)
        x = x_raw.to(tl.float32)
        m = tl.max(x, axis=0)
        ref = tl.where(m == float("-inf"), 0.0, m)
        e = tl.math.exp2((x - ref) * LOG2E)
        parts = part_ptr + row * (2 * SPLIT)
        tl.store(parts + part, m)
        tl.store(parts + SPLIT + part, tl.sum(e, axis=0))
        if E_BF16:  # e kept across the wait in bf16: half the registers
            e = e.to(tl.bfloat16)
        _split_wait(sync_ptr + 1, row, SPLIT)
        big, d = _split_merge(parts, SPLIT, SPLIT_P2)
        lse = big + tl.math.log2(d) * LN2
        if MEAN:
            scale = 1.0 / tl.load(sync_ptr).to(tl.float32)
        else:
            scale = 1.0
        if part == 0:
            tl.store(loss_ptr + row, lse - x_y)
        grad = e.to(tl.float32) * tl.where(valid, tl.math.exp2((ref - lse) * LOG2E) * scale, float("nan"))
        tl.store(g_row + offs, grad.to(grad_ptr.dtype.element_ty), mask=mask)
        tl.debug_barrier()
        own = valid & (y >= part * BLOCK_N) & (y < part * BLOCK_N + BLOCK_N)
        grad_y = tl.math.exp2((x_y - lse) * LOG2E) * scale - scale
        tl.store(g_row + y, grad_y.to(grad_ptr.dtype.element_ty), mask=own)


@triton.jit
def _ce_split_reread_kernel(
    x_ptr,
    target_ptr,
    grad_ptr,
    loss_ptr,
    sync_ptr,
    part_ptr,
    n_cols,
    stride_xm,
    stride_gm,
    ignore_index,
    SPLIT: tl.constexpr,
    SPLIT_P2: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SUB: tl.constexpr,
    STAGES: tl.constexpr,
    MEAN: tl.constexpr,
):
    # One program a part of BLOCK_N, walked in tiles of SUB pipelined STAGES deep (Triton's pipeliner,
    # through shared memory): nothing of the part is held across the wait, so a program's registers are
    # one tile's and more programs fit a SM. After the wait the part is read again, from L2 (it was read
    # a few microseconds before), and its gradient written.
    row, part = _split_ticket(sync_ptr + 1, SPLIT)
    start = part * BLOCK_N
    x_row = x_ptr + row * stride_xm
    g_row = grad_ptr + row * stride_gm
    y = tl.load(target_ptr + row)
    lanes = tl.arange(0, SUB)
    if y == ignore_index:
        for i in tl.range(0, BLOCK_N, SUB):
            offs = start + i + lanes
            tl.store(g_row + offs, tl.zeros([SUB], dtype=grad_ptr.dtype.element_ty), mask=offs < n_cols)
        if part == 0:
            tl.store(loss_ptr + row, 0.0)
    else:
        valid = (y >= 0) & (y < n_cols)
        x_y = tl.load(x_row + y, mask=valid, other=float("nan")).to(tl.float32)
        m_v = tl.full([SUB], float("-inf"), tl.float32)
        d_v = tl.zeros([SUB], tl.float32)
        for i in tl.range(0, BLOCK_N, SUB, num_stages=STAGES):
            offs = start + i + lanes
            x = tl.load(x_row + offs, mask=offs < n_cols, other=float("-inf"), eviction_policy="evict_last")
            x = x.to(tl.float32)
            t = x - m_v
            e = tl.where(x == float("-inf"), 0.0, tl.math.exp2(tl.abs(t) * -LOG2E))
            new_max = t > 0
            d_v = tl.where(new_max, d_v * e + 1.0, d_v + e)
            m_v = tl.where(new_max, x, m_v)
        m = tl.max(m_v, axis=0)
        ref = tl.where(m == float("-inf"), 0.0, m)
        d = tl.sum(d_v * tl.math.exp2((m_v - ref) * LOG2E), axis=0)
        parts = part_ptr + row * (2 * SPLIT)
        tl.store(parts + part, m)
        tl.store(parts + SPLIT + part, d)
        _split_wait(sync_ptr + 1, row, SPLIT)
        big, dd = _split_merge(parts, SPLIT, SPLIT_P2)
        lse = big + tl.math.log2(dd) * LN2
        if MEAN:
            scale = 1.0 / tl.load(sync_ptr).to(tl.float32)
        else:
            scale = 1.0
        if part == 0:
            tl.store(loss_ptr + row, lse - x_y)
        log2_c = tl.where(valid, tl.math.log2(scale), float("nan"))
        for i in tl.range(0, BLOCK_N, SUB, num_stages=STAGES):
            offs = start + i + lanes
            mask = offs < n_cols
            x = tl.load(x_row + offs, mask=mask, other=float("-inf"), eviction_policy="evict_first")
            grad = tl.math.exp2((x.to(tl.float32) - lse) * LOG2E + log2_c)
            tl.store(g_row + offs, grad.to(grad_ptr.dtype.element_ty), mask=mask, eviction_policy="evict_first")
        tl.debug_barrier()
        own = valid & (y >= start) & (y < start + BLOCK_N)
        grad_y = tl.math.exp2((x_y - lse) * LOG2E) * scale - scale
        tl.store(g_row + y, grad_y.to(grad_ptr.dtype.element_ty), mask=own)


def part_loss(kernel, x, t, grad, cfg, **consts):
    """fwd+bwd "mean" through the package's prologue and reduce, ``kernel`` one program a part of
    ``cfg["block"]`` logits (its statistics two floats a part)."""
    n_rows, n_cols = x.shape
    split = triton.cdiv(n_cols, cfg["block"])
    sync = ce._prologue(t, -100, count=True, n_rows_split=n_rows)
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    stats = torch.empty(n_rows * 2 * split, dtype=torch.float32, device=x.device)
    cfg["compiled"] = kernel[(n_rows * split,)](
        x,
        t,
        grad,
        loss_rows,
        sync,
        stats,
        n_cols,
        x.stride(0),
        grad.stride(0),
        -100,
        SPLIT=split,
        SPLIT_P2=triton.next_power_of_2(split),
        BLOCK_N=cfg["block"],
        MEAN=True,
        num_warps=cfg["warps"],
        **consts,
    )
    return ce._reduce(loss_rows, sync, "mean", x.dtype)


def split_loss(x, t, grad, cfg):
    return part_loss(_ce_split_e_bf16_kernel, x, t, grad, cfg, E_BF16=cfg["e_bf16"])


def reread_loss(x, t, grad, cfg):
    return part_loss(_ce_split_reread_kernel, x, t, grad, cfg, SUB=cfg["sub"], STAGES=cfg["stages"])


def ref_loss(x, t, grad, cfg):
    return part_loss(_ce_split_ref_kernel, x, t, grad, cfg, BITCAST=cfg["bitcast"], MAX_REF=cfg.get("max_ref", False))


def reread_configs():
    out = {"split part 16384 w4 (package form)": {"block": 16384, "warps": 4, "e_bf16": False, "loss": split_loss}}
    for block, sub, warps, stages in (
        (16384, 4096, 4, 3),
        (16384, 2048, 4, 4),
        (16384, 4096, 8, 3),
        (32768, 4096, 4, 3),
        (32768, 4096, 8, 4),
        (65536, 4096, 8, 3),
        (65536, 8192, 8, 3),
        (16384, 2048, 2, 3),
    ):
        label = f"reread part {block} tile {sub} w{warps} s{stages}"
        out[label] = {"block": block, "sub": sub, "warps": warps, "stages": stages, "loss": reread_loss}
    return out


@triton.jit
def _ce_split_ref_kernel(
    x_ptr,
    target_ptr,
    grad_ptr,
    loss_ptr,
    sync_ptr,
    part_ptr,
    n_cols,
    stride_xm,
    stride_gm,
    ignore_index,
    SPLIT: tl.constexpr,
    SPLIT_P2: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MEAN: tl.constexpr,
    BITCAST: tl.constexpr,
    MAX_REF: tl.constexpr = False,
):
    # MAX_REF: each part's own maximum as its reference (overflow-safe, no fall-back needed), the
    # maximum taken on the bf16 part so that no fp32 copy of it is formed for it.
    # Otherwise: one program a part, its sum against the target's logit (the package's REF_TARGET: one reference
    # for the whole row, so the parts publish a sum alone, no maximum, no fp32 tile needed for a max
    # first). After the wait the gradient comes from the part in bf16, widened a second time; BITCAST
    # widens it by a shift of its bits, an expression the compiler cannot merge with the first widening,
    # so the part crosses the wait in bf16 (half the registers). Probe: no fall-back for a row whose sum
    # leaves fp32's range (the package sums such rows again against their maximum).
    row, part = _split_ticket(sync_ptr + 1, SPLIT)
    offs = part * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = offs < n_cols
    x_row = x_ptr + row * stride_xm
    g_row = grad_ptr + row * stride_gm
    x_raw = tl.load(x_row + offs, mask=mask, other=float("-inf"))
    y = tl.load(target_ptr + row)
    if y == ignore_index:
        tl.store(g_row + offs, tl.zeros([BLOCK_N], dtype=grad_ptr.dtype.element_ty), mask=mask)
        if part == 0:
            tl.store(loss_ptr + row, 0.0)
    else:
        valid = (y >= 0) & (y < n_cols)
        x_y = tl.load(x_row + y, mask=valid, other=float("nan")).to(tl.float32)
        if MAX_REF:  # the part's maximum, taken in bf16 (exact), then the package's (max, sum) exchange
            m = tl.max(x_raw, axis=0).to(tl.float32)
            ref = tl.where(m == float("-inf"), 0.0, m)
            d = tl.sum(tl.math.exp2((x_raw.to(tl.float32) - ref) * LOG2E), axis=0)
            parts = part_ptr + row * (2 * SPLIT)
            tl.store(parts + part, m)
            tl.store(parts + SPLIT + part, d)
            _split_wait(sync_ptr + 1, row, SPLIT)
            big, d_row = _split_merge(parts, SPLIT, SPLIT_P2)
            lse = big + tl.math.log2(d_row) * LN2
        else:
            ref = tl.where(tl.abs(x_y) < float("inf"), x_y, 0.0)
            d = tl.sum(tl.math.exp2((x_raw.to(tl.float32) - ref) * LOG2E), axis=0)
            parts = part_ptr + row * SPLIT
            tl.store(parts + part, d)
            _split_wait(sync_ptr + 1, row, SPLIT)
            p = tl.arange(0, SPLIT_P2)
            d_row = tl.sum(tl.load(parts + p, mask=p < SPLIT, other=0.0, volatile=True), axis=0)
            lse = ref + tl.math.log2(d_row) * LN2
        if MEAN:
            scale = 1.0 / tl.load(sync_ptr).to(tl.float32)
        else:
            scale = 1.0
        if part == 0:
            tl.store(loss_ptr + row, lse - x_y)
        if BITCAST:  # bf16 -> fp32 by its bits: b << 16 (the sign extension is shifted out)
            xf = (x_raw.to(tl.int16, bitcast=True).to(tl.int32) << 16).to(tl.float32, bitcast=True)
        else:
            xf = x_raw.to(tl.float32)
        log2_c = tl.where(valid, tl.math.log2(scale), float("nan"))
        grad = tl.math.exp2((xf - lse) * LOG2E + log2_c)
        tl.store(g_row + offs, grad.to(grad_ptr.dtype.element_ty), mask=mask)
        tl.debug_barrier()
        own = valid & (y >= part * BLOCK_N) & (y < part * BLOCK_N + BLOCK_N)
        grad_y = tl.math.exp2((x_y - lse) * LOG2E) * scale - scale
        tl.store(g_row + y, grad_y.to(grad_ptr.dtype.element_ty), mask=own)


def ref_configs():
    out = {"split part 16384 w4 (package form)": {"block": 16384, "warps": 4, "e_bf16": False, "loss": split_loss}}
    for block, warps, bitcast, max_ref in (
        (16384, 4, True, False),
        (8192, 4, True, False),
        (16384, 4, True, True),
        (16384, 8, True, True),
        (8192, 4, True, True),
        (8192, 2, True, True),
        (4096, 4, True, True),
    ):
        label = f"{'max' if max_ref else 'ref'} part {block} w{warps}" + (" bitcast" if bitcast else "")
        out[label] = {"block": block, "warps": warps, "bitcast": bitcast, "max_ref": max_ref, "loss": ref_loss}
    return out


def split_configs():
    out = {}
    for block, warps, e_bf16 in (
        (16384, 4, False),
        (16384, 4, True),
        (16384, 2, True),
        (16384, 8, True),
        (8192, 2, True),
        (8192, 4, True),
        (32768, 8, True),
        (32768, 16, True),
    ):
        label = f"split part {block} w{warps}" + (" e in bf16" if e_bf16 else "")
        out[label] = {"block": block, "warps": warps, "e_bf16": e_bf16, "loss": split_loss}
    return out


def persistent_loss(x, t, grad, cfg):
    n_rows, n_cols = x.shape
    block = cfg["block"]
    split = triton.cdiv(n_cols, block)
    sync = ce._prologue(t, -100, count=True, n_rows_split=n_rows)
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=x.device)
    stats = torch.empty(n_rows * 2 * split, dtype=torch.float32, device=x.device)
    programs = max(split, min(n_rows * split, cfg["per_sm"] * sm_count()))
    cfg["compiled"] = _ce_split_persistent_kernel[(programs,)](
        x,
        t,
        grad,
        loss_rows,
        sync,
        stats,
        n_rows,
        n_cols,
        x.stride(0),
        grad.stride(0),
        -100,
        SPLIT=split,
        SPLIT_P2=triton.next_power_of_2(split),
        BLOCK_N=block,
        MEAN=True,
        AHEAD=cfg["ahead"],
        num_warps=cfg["warps"],
    )
    return ce._reduce(loss_rows, sync, "mean", x.dtype)


def configs(quick):
    out = {}
    for block, warps, per_sm, ahead in (
        (16384, 4, 2, False),
        (16384, 4, 3, False),
        (16384, 8, 1, False),
        (16384, 8, 2, False),
        (8192, 4, 4, False),
        (16384, 8, 1, True),
        (16384, 8, 2, True),
        (16384, 16, 1, True),
        (8192, 4, 2, True),
        (8192, 4, 4, True),
        (8192, 8, 2, True),
    ):
        if quick and per_sm > 2:
            continue
        label = f"{'ahead' if ahead else 'after'} part {block} w{warps} {per_sm}/SM"
        out[label] = {"block": block, "warps": warps, "per_sm": per_sm, "ahead": ahead, "loss": persistent_loss}
    return out


def check(cfg, vocab):
    """Against float64: 97 rows (every fifth ignored), out of place and in place; a few programs, so
    that programs take several parts of one row."""
    g = torch.Generator(device="cuda").manual_seed(1)
    xs = torch.randn(97, vocab, device="cuda", dtype=torch.bfloat16, generator=g) * 3
    ts = torch.randint(0, vocab, (97,), device="cuda", generator=g)
    ts[::5] = -100
    xd = xs.double().requires_grad_()
    want_loss = F.cross_entropy(xd, ts)
    (want_g,) = torch.autograd.grad(want_loss, xd)
    errs = []
    for per_sm_override in (None, "few"):
        c = dict(cfg)
        if per_sm_override:
            c["per_sm"] = 0  # programs = SPLIT: each program walks many parts, often of one row
        gs = torch.empty_like(xs)
        got = c["loss"](xs, ts, gs, c)
        errs.append(((gs.double() - want_g).norm() / want_g.norm()).item())
        errs.append(abs(got.double().item() - want_loss.item()) / abs(want_loss.item()))
    xi = xs.clone()
    got = cfg["loss"](xi, ts, xi, cfg)  # in place
    errs.append(((xi.double() - want_g).norm() / want_g.norm()).item())
    return max(errs)


def main():
    quick = "--quick" in sys.argv
    shapes = ((8192, 128256), (4096, 262144), (8192, 151936), (8192, 65552), (4096, 128256), (16384, 128256))
    copy = bench.measure_copy_bandwidth()
    dev = torch.cuda.get_device_name()
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s", flush=True)
    if "--reread" in sys.argv:
        cfgs = reread_configs()
    elif "--ref" in sys.argv:
        cfgs = ref_configs()
    else:
        cfgs = split_configs() if "--split" in sys.argv else configs(quick)
    bad = set()
    for label, cfg in cfgs.items():
        try:
            err = check(cfg, 128256)
            ok = err < 2e-2
            print(f"  check {label:44s} max rel err {err:.1e} {'ok' if ok else 'WRONG'}", flush=True)
            if not ok:
                bad.add(label)
        except Exception as exc:
            print(f"  check {label:44s} failed: {type(exc).__name__} {str(exc)[:160]}", flush=True)
            bad.add(label)
    for tokens, vocab in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16, generator=g) * 2
        t = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
        grad = torch.empty_like(x)
        nb = 2 * x.numel() * 2
        shipped = ce.cross_entropy_config(vocab, torch.bfloat16)

        def pkg():
            return ce._loss(x, t, grad, -100, "mean", 0.0, shipped)

        msq = bench.queued_ms(pkg)
        print(f"  {tokens:>5} x {vocab:<6} {'package _loss (shipped)':44s} {msq:7.4f} ms {nb / msq / 1e6 / copy:6.1%}")
        for label, cfg in cfgs.items():
            if label in bad:
                continue
            try:
                msq = bench.queued_ms(lambda cfg=cfg: cfg["loss"](x, t, grad, cfg))
                regs = getattr(cfg.get("compiled"), "n_regs", "?")
                spills = getattr(cfg.get("compiled"), "n_spills", "?")
                print(
                    f"  {tokens:>5} x {vocab:<6} {label:44s} {msq:7.4f} ms {nb / msq / 1e6 / copy:6.1%}"
                    f"  regs {regs} spills {spills}",
                    flush=True,
                )
            except Exception as exc:
                print(f"  {tokens:>5} x {vocab:<6} {label:44s} failed: {type(exc).__name__} {str(exc)[:120]}")
        x = grad = None


if __name__ == "__main__":
    main()
