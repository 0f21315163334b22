"""Probe: RMSNorm's backward at hidden 16384 with its row held as two halves (8192 + 8192).

    PYTHONPATH=. python3 benchmarks/probes/probe_rms_bwd_halves.py

The one 16384-element tile (32 warps, one program an SM) cannot keep the next row in flight: a row
stage made it spill (notes_norms.md, 2026-11-24 "`bench_norms.py final` on both GPUs after the three row stages"), and
the backward stays at 72-83% of copy (GPU
clock). At 11008 a head and a tail (8192 + 4096) stopped the spill and let a row stage in. Here the same
head-and-tail kernel is handed two halves of 8192 (``head_and_tail`` patched for the run): warps, row
stages and programs an SM, bf16, GPU clock (``bench.queued_ms``), share of copy by the backward's
ledger, each checked against the default's gradients.
"""

from __future__ import annotations

import torch

from fusionlab import bench
from fusionlab.kernels import rmsnorm as rn
from fusionlab.kernels._launch import sm_count
from fusionlab.lessons.l4.suite import DTYPE, EPS, _grad_thunk, _no_donated_buffers, rms_bwd_ledger, rms_inputs

SHAPES = ((32768, 16384), (4096, 16384))


def main():
    ceil = bench.ceilings()
    sms = sm_count()
    print(bench.source_label(), f"copy {ceil.copy_GBps:.0f} GB/s", flush=True)
    original = rn.head_and_tail
    for rows, n in SHAPES:
        x, r, dy, dh, w = rms_inputs(rows, n)
        nbytes = rms_bwd_ledger(rows, n).fused_bytes
        xg, rg, wg = (t.clone().requires_grad_() for t in (x, r, w))
        with _no_donated_buffers():
            rn.head_and_tail = original
            rn._config.cache_clear()
            print(f"\n{rows} x {n}: default {rn.rmsnorm_config(rows, n, DTYPE, backward=True)}", flush=True)
            y, h = rn.rmsnorm(xg, wg, EPS, rg)
            ref = torch.autograd.grad((y, h), (xg, wg, rg), (dy, dh))
            variants = [("default", False, None)]
            for warps in (32, 16):
                for stages in (1, 2):
                    variants.append((f"halves {warps}w rs{stages}", True, {"num_warps": warps, "row_stages": stages}))
            variants.append(("halves 16w rs1 2/SM", True, {"num_warps": 16, "row_stages": 1, "programs": 2 * sms}))
            variants.append(("halves 16w rs2 2/SM", True, {"num_warps": 16, "row_stages": 2, "programs": 2 * sms}))
            for name, halves, cfg in variants:
                rn.head_and_tail = (lambda n_cols, block_n: (block_n // 2, block_n // 2)) if halves else original
                rn._config.cache_clear()
                try:
                    y, h = rn.rmsnorm(xg, wg, EPS, rg, bwd_config=cfg)
                    fn = _grad_thunk((y, h), (xg, wg, rg), (dy, dh))
                    got = torch.autograd.grad((y, h), (xg, wg, rg), (dy, dh), retain_graph=True)
                    err = max((a.float() - b.float()).abs().max().item() for a, b in zip(got, ref, strict=True))
                    q = bench.queued_ms(fn)
                except Exception as e:  # shared memory or registers
                    print(f"  {name:22s} {type(e).__name__}: {str(e)[:120]}", flush=True)
                    continue
                share = nbytes / q / 1e6 / ceil.copy_GBps
                print(f"  {name:22s} {q:7.4f} ms {share:6.1%}  max diff {err:.3g}", flush=True)
        rn.head_and_tail = original
        rn._config.cache_clear()
        del x, r, dy, dh, xg, rg, wg
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
