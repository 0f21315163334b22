"""Probe: RMSNorm's backward at hidden 9216-16384: rows read twice, and the head and tail's stages.

    PYTHONPATH=. python3 benchmarks/probes/probe_rms_bwd_reread.py [--quick | --tail-stages]

Why: the one 16384-element tile holds dy, h, grad_h and w of a row in registers (32 warps, one program
an SM, 64 registers a thread at most) and cannot keep the next row in flight; held as two halves it did
no better (``probe_rms_bwd_halves.py``, 66-68% on the H200 against 72.7%). The kernel's ``REREAD``
walks a row as a head and a tail twice: the first loads of dy and h sum g h; the second (just read: the
L2 holds them, about 64 KiB a row per SM) with grad_h store dx and add to dw. Only one part's dy and h
are live at a time, so registers are freed for the dw sums and for a row in flight. The HBM bytes are
the one tile's (the ledger does not change); the L2 serves the second reads.

Default: the package's configuration against the one 16384 tile it replaced and against ``REREAD``
under other warps, row stages (``tl.range(num_stages=...)``) and programs an SM, at 16384 and at 11008
(where ``REREAD`` is not the default). ``--tail-stages``: the head and tail of 9216-12288 (no reread)
under other warps, stages and programs. GPU clock (``bench.queued_ms``) of the backward's two kernels
(``_backward``: the rows kernel and ``sum_partials``), bf16, share of copy by the backward's ledger;
each variant's dx and dw checked against the default's. (The probe's first version
carried its own kernel, with an eviction-hint variant: first loads ``evict_last``, second
``evict_first``; it changed nothing measurable; benchmarks/notes_norms.md, 2026-11-24 "the RMSNorm backward at
9216-16384".)
"""

from __future__ import annotations

import sys

import torch

from fusionlab import bench
from fusionlab.kernels import rmsnorm as rn
from fusionlab.kernels._launch import sm_count
from fusionlab.lessons.l4.suite import DTYPE, EPS, rms_bwd_ledger, rms_inputs

#: (warps, row stages, programs an SM) of the reread sweep (three stages asked 393 KiB: refused)
REREAD_GRID = ((32, 1, 1), (32, 2, 1), (16, 1, 1), (16, 2, 1), (16, 2, 2), (8, 2, 2), (8, 2, 4))
#: the same for the head and tail without reread (4 warps spilled: 7-9% of copy)
TAIL_GRID = ((16, 2, 1), (8, 2, 1), (8, 3, 1), (8, 4, 1), (16, 3, 1))


def sweep(shapes, variants):
    """Time the package's backward at each ``(rows, n)`` under its default and each ``(name, override)``
    of ``variants(base_config, sms)`` (overrides replace the default configuration's keys)."""
    ceil = bench.ceilings()
    sms = sm_count()
    print(bench.source_label(), f"copy {ceil.copy_GBps:.0f} GB/s", flush=True)
    for rows, n in shapes:
        x, r, dy, dh, w = rms_inputs(rows, n)
        _, h, rstd = rn._forward(x, w, r, EPS, rn.row_layouts(x, r), rn.rmsnorm_config(rows, n, DTYPE), store_rstd=True)
        layout = rn.row_layouts(h)[0]
        nbytes = rms_bwd_ledger(rows, n).fused_bytes
        base = rn.rmsnorm_config(rows, n, DTYPE, backward=True)
        ref = rn._backward(dy, dh, h, layout, w, rstd, None, True, True)
        print(f"\n{rows} x {n}: package {base}", flush=True)
        for name, over in [("package", {})] + variants(base, sms):
            cfg = {**base, **over}
            cfg = {k: v for k, v in cfg.items() if v is not None}  # None: drop the default's key
            try:
                got = rn._backward(dy, dh, h, layout, w, rstd, cfg, True, True)
                torch.cuda.synchronize()
                ddx = (got[0].float() - ref[0].float()).abs().max().item()
                ddw = ((got[1].float() - ref[1].float()).abs().max() / ref[1].float().abs().max()).item()
                q = bench.queued_ms(lambda cfg=cfg: rn._backward(dy, dh, h, layout, w, rstd, cfg, True, True))
            except Exception as e:  # shared memory or registers
                print(f"  {name:22s} {type(e).__name__}: {str(e)[:100]}", flush=True)
                continue
            share = nbytes / q / 1e6 / ceil.copy_GBps
            print(f"  {name:22s} {q:7.4f} ms {share:6.1%}  dx diff {ddx:.3g} dw rel {ddw:.2g}", flush=True)
        torch.cuda.empty_cache()


def reread_variants(base, sms, quick=False):
    out = []
    if base.get("BLOCK_N", 0) + base.get("TAIL_N", 0) >= 16384:  # the one tile the reread replaced
        out.append(
            ("one 16384 tile", {"BLOCK_N": 16384, "TAIL_N": None, "REREAD": None, "num_warps": 32, "row_stages": None})
        )
    for warps, stages, per_sm in REREAD_GRID:
        if not quick or stages == 2:
            over = {"REREAD": True, "num_warps": warps, "row_stages": stages, "programs": per_sm * sms}
            out.append((f"reread {warps}w rs{stages} {per_sm}/SM", over))
    return out


def tail_variants(base, sms):
    return [
        (f"{warps}w rs{stages} {per_sm}/SM", {"num_warps": warps, "row_stages": stages, "programs": per_sm * sms})
        for warps, stages, per_sm in TAIL_GRID
    ]


if __name__ == "__main__":
    if "--tail-stages" in sys.argv:
        sweep(((32768, 11008), (4096, 11008), (32768, 9216), (32768, 12288), (4096, 12288)), tail_variants)
    else:
        quick = "--quick" in sys.argv
        sweep(
            ((32768, 16384), (4096, 16384), (32768, 11008), (4096, 11008)),
            lambda base, sms: reread_variants(base, sms, quick),
        )
