"""Probe: RMSNorm's backward at hidden 11008-16384 with the row read twice, the second time from L2.

    PYTHONPATH=. python3 benchmarks/probe_rms_bwd_reread.py [--quick | --tail-stages]

Why: the one 16384-element tile holds dy, h, grad_h and w of a row in registers (32 warps, one program
an SM, 64 registers a thread at most) and cannot keep the next row in flight; held as two halves it did
no better (``probe_rms_bwd_halves.py``, 66-68% on the H200 against 72.7%). Here a row is walked as a
head and a tail twice: pass A loads dy and h of both and sums g h; pass B loads them again (just read:
the L2 holds them, about 64 KiB a row per SM) with grad_h, stores dx and adds to dw. Only one tile's dy
and h are live at a time, so registers are freed for the dw accumulators and for a row in flight. The
HBM bytes are the one tile's (the ledger does not change); the L2 serves the second reads.

Variants: warps, row stages (``tl.range(num_stages=...)``), programs an SM, and an eviction hint
(pass A's loads ``evict_last``, pass B's ``evict_first``). GPU clock (``bench.queued_ms``) of the
backward's two kernels (this one and ``sum_partials``) against the package's ``_backward``, bf16, share
of copy by the backward's ledger; each variant's dx and dw checked against the package's.
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

from fusionlab import bench
from fusionlab.kernels import rmsnorm as rn
from fusionlab.lessons.l4.suite import DTYPE, EPS, rms_bwd_ledger, rms_inputs


@triton.jit
def _reread_kernel(
    dy_ptr,
    h_ptr,
    w_ptr,
    rstd_ptr,
    dh_ptr,
    dx_ptr,
    dwp_ptr,
    n_rows,
    n_cols,
    rows_per_program,
    HEAD: tl.constexpr,
    TAIL: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    FIRST: tl.constexpr,
    SECOND: tl.constexpr,
):
    pid = tl.program_id(axis=0)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    offs_a = tl.arange(0, HEAD)
    offs_b = HEAD + tl.arange(0, TAIL)
    mask_b = offs_b < n_cols
    acc_a = tl.zeros([1, HEAD], dtype=tl.float32)
    acc_b = tl.zeros([1, TAIL], dtype=tl.float32)
    for m0 in tl.range(row_start, row_end, 1, num_stages=NUM_STAGES):
        offs_m = m0 + tl.arange(0, 1)
        base = offs_m.to(tl.int64)[:, None] * n_cols
        pa = base + offs_a[None, :]
        pb = base + offs_b[None, :]
        mb = mask_b[None, :]
        # pass A: g h summed over the row (w from L1: the same every row)
        wa = tl.load(w_ptr + offs_a).to(tl.float32)[None, :]
        wb = tl.load(w_ptr + offs_b, mask=mask_b, other=0.0).to(tl.float32)[None, :]
        gh = tl.sum(
            tl.load(dy_ptr + pa, eviction_policy=FIRST).to(tl.float32)
            * wa
            * tl.load(h_ptr + pa, eviction_policy=FIRST).to(tl.float32),
            axis=1,
        )
        gh += tl.sum(
            tl.load(dy_ptr + pb, mask=mb, other=0.0, eviction_policy=FIRST).to(tl.float32)
            * wb
            * tl.load(h_ptr + pb, mask=mb, other=0.0, eviction_policy=FIRST).to(tl.float32),
            axis=1,
        )
        rstd = tl.load(rstd_ptr + offs_m)
        c = gh * (rstd * rstd * rstd) / n_cols
        # pass B: the same bytes again (".cg": L2, and not merged with pass A's loads), tail first
        dy = tl.load(dy_ptr + pb, mask=mb, other=0.0, cache_modifier=".cg", eviction_policy=SECOND).to(tl.float32)
        hf = tl.load(h_ptr + pb, mask=mb, other=0.0, cache_modifier=".cg", eviction_policy=SECOND).to(tl.float32)
        dh = dy * wb * rstd[:, None] - hf * c[:, None]
        dh += tl.load(dh_ptr + pb, mask=mb, other=0.0).to(tl.float32)
        tl.store(dx_ptr + pb, dh.to(dx_ptr.dtype.element_ty), mask=mb)
        acc_b += dy * (hf * rstd[:, None]).to(h_ptr.dtype.element_ty).to(tl.float32)
        dy = tl.load(dy_ptr + pa, cache_modifier=".cg", eviction_policy=SECOND).to(tl.float32)
        hf = tl.load(h_ptr + pa, cache_modifier=".cg", eviction_policy=SECOND).to(tl.float32)
        dh = dy * wa * rstd[:, None] - hf * c[:, None]
        dh += tl.load(dh_ptr + pa).to(tl.float32)
        tl.store(dx_ptr + pa, dh.to(dx_ptr.dtype.element_ty))
        acc_a += dy * (hf * rstd[:, None]).to(h_ptr.dtype.element_ty).to(tl.float32)
    tl.store(dwp_ptr + pid.to(tl.int64) * n_cols + offs_a, tl.sum(acc_a, axis=0))
    tl.store(dwp_ptr + pid.to(tl.int64) * n_cols + offs_b, tl.sum(acc_b, axis=0), mask=mask_b)


def reread_backward(dy, dh, h, w, rstd, *, warps, stages, per_sm, hint, head=8192):
    rows, n = h.shape
    tail = triton.next_power_of_2(n - head)
    programs = min(rows, rn.sm_count() * per_sm)
    rpp = -(-rows // programs)
    programs = -(-rows // rpp)
    dx = torch.empty_like(h)
    part = torch.empty((1, programs, n), dtype=torch.float32, device=h.device)
    _reread_kernel[(programs,)](
        dy,
        h,
        w,
        rstd,
        dh,
        dx,
        part,
        rows,
        n,
        rpp,
        HEAD=head,
        TAIL=tail,
        NUM_STAGES=stages,
        FIRST="evict_last" if hint else "",
        SECOND="evict_first" if hint else "",
        num_warps=warps,
    )
    return dx, rn.sum_partials(part, w.dtype)[0]


def backward_case(rows, n):
    """The suite's inputs at ``rows x n``, the forward run, and the package's gradients (dx, dw)."""
    x, r, dy, dh, w = rms_inputs(rows, n)
    _, h, rstd = rn._forward(x, w, r, EPS, rn.row_layouts(x, r), rn.rmsnorm_config(rows, n, DTYPE), store_rstd=True)
    layout = rn.row_layouts(h)[0]
    ref = rn._backward(dy, dh, h, layout, w, rstd, None, True, True)
    return dy, dh, h, layout, w, rstd, rms_bwd_ledger(rows, n).fused_bytes, ref


def main():
    quick = "--quick" in sys.argv
    ceil = bench.ceilings()
    print(bench.source_label(), f"copy {ceil.copy_GBps:.0f} GB/s", flush=True)
    shapes = ((32768, 16384), (4096, 16384), (32768, 11008), (4096, 11008))
    variants = []
    for warps, per_sm in ((32, 1), (16, 1), (16, 2), (8, 2), (8, 4)):
        for stages in (1, 2, 3):
            for hint in (False, True):
                if quick and (hint or stages == 3):
                    continue
                variants.append((warps, stages, per_sm, hint))
    for rows, n in shapes:
        dy, dh, h, layout, w, rstd, nbytes, ref = backward_case(rows, n)
        cfg = rn.rmsnorm_config(rows, n, DTYPE, backward=True)
        q = bench.queued_ms(lambda: rn._backward(dy, dh, h, layout, w, rstd, None, True, True))
        print(f"\n{rows} x {n}: package {cfg}: {q:.4f} ms {nbytes / q / 1e6 / ceil.copy_GBps:6.1%}", flush=True)
        for warps, stages, per_sm, hint in variants:
            name = f"{warps}w rs{stages} {per_sm}/SM{' hint' if hint else ''}"

            def fn(warps=warps, stages=stages, per_sm=per_sm, hint=hint):
                return reread_backward(dy, dh, h, w, rstd, warps=warps, stages=stages, per_sm=per_sm, hint=hint)

            try:
                got = fn()
                torch.cuda.synchronize()
                ddx = (got[0].float() - ref[0].float()).abs().max().item()
                ddw = ((got[1].float() - ref[1].float()).abs().max() / ref[1].float().abs().max()).item()
                q = bench.queued_ms(fn)
            except Exception as e:  # shared memory or registers
                print(f"  {name:22s} {type(e).__name__}: {str(e)[:100]}", flush=True)
                continue
            share = nbytes / q / 1e6 / ceil.copy_GBps
            print(f"  {name:22s} {q:7.4f} ms {share:6.1%}  dx diff {ddx:.3g} dw rel {ddw:.2g}", flush=True)
        torch.cuda.empty_cache()


def tail_stages():
    """``--tail-stages``: the package's head and tail at 9216-12288 (8192 + a tail, no reread) with a third row
    stage (past ``stage_bytes``, within the SM's shared memory), warps and programs an SM."""
    ceil = bench.ceilings()
    sms = rn.sm_count()
    print(bench.source_label(), f"copy {ceil.copy_GBps:.0f} GB/s", flush=True)
    for rows, n in ((32768, 11008), (4096, 11008), (32768, 9216), (32768, 12288), (4096, 12288)):
        dy, dh, h, layout, w, rstd, nbytes, ref = backward_case(rows, n)
        base = rn.rmsnorm_config(rows, n, DTYPE, backward=True)
        print(f"\n{rows} x {n}: package {base}", flush=True)
        for warps, stages, per_sm in ((16, 2, 1), (8, 2, 1), (8, 3, 1), (8, 4, 1), (4, 3, 1), (4, 3, 2), (16, 3, 1)):
            cfg = dict(base, num_warps=warps, row_stages=stages, programs=sms * per_sm)
            name = f"{warps}w rs{stages} {per_sm}/SM"
            try:
                got = rn._backward(dy, dh, h, layout, w, rstd, cfg, True, True)
                torch.cuda.synchronize()
                ddx = (got[0].float() - ref[0].float()).abs().max().item()
                q = bench.queued_ms(lambda cfg=cfg: rn._backward(dy, dh, h, layout, w, rstd, cfg, True, True))
            except Exception as e:  # shared memory or registers
                print(f"  {name:16s} {type(e).__name__}: {str(e)[:100]}", flush=True)
                continue
            print(
                f"  {name:16s} {q:7.4f} ms {nbytes / q / 1e6 / ceil.copy_GBps:6.1%}  dx diff {ddx:.3g}",
                flush=True,
            )
        torch.cuda.empty_cache()


if __name__ == "__main__":
    tail_stages() if "--tail-stages" in sys.argv else main()
