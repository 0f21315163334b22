"""Probe: LayerNorm's backward at rows that pad their one tile (3072, 5120, 6144), as a head and a tail.

    PYTHONPATH=. python3 benchmarks/probes/probe_ln_bwd.py

The 2026-11-24 "GPU checks of the CPU-only edits, softmax rows off their boundaries" section's table put LayerNorm's
backward at 32768 x 5120 at 54% of copy (H200) and 70% (H100)
on the GPU clock, in one 8192 tile of 16 warps. Here, bf16, GPU clock (``bench.queued_ms`` of
``torch.autograd.grad`` for x, w and b), share of copy by the backward's fused ledger: the package's
default, the head and the tail at other warps and programs an SM, the one padded tile, and eager
``F.layer_norm``'s backward, in one run; each variant's dx checked against the default's.
"""

from __future__ import annotations

import torch

from fusionlab import bench
from fusionlab.kernels import layernorm as ln
from fusionlab.kernels._launch import next_pow2, sm_count
from fusionlab.lessons.l4.suite import _no_donated_buffers

DT = torch.bfloat16
SHAPES = ((32768, 5120), (32768, 3072), (32768, 6144), (4096, 5120), (32768, 8192), (32768, 4096), (32768, 2048))


def main():
    ceil = bench.ceilings()
    sms = sm_count()
    print(bench.source_label(), f"copy {ceil.copy_GBps:.0f} GB/s", flush=True)
    for rows, n in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(n)
        x = (torch.randn(rows, n, device="cuda", generator=g) * 2 + 0.5).to(DT).requires_grad_()
        w = torch.randn(n, device="cuda", generator=g).to(DT).requires_grad_()
        b = torch.randn(n, device="cuda", generator=g).to(DT).requires_grad_()
        dy = torch.randn(rows, n, device="cuda", generator=g).to(DT)
        default = ln.layernorm_config(rows, n, DT, backward=True)
        programs = min(default["programs"], rows)
        nbytes = ln.layernorm_ledger(rows, n, DT, backward=True, programs=programs).fused_bytes
        print(f"\n{rows} x {n}: default {default}", flush=True)
        variants = [("default", None)]
        tile = next_pow2(n)
        # (the first run's sweep, H200: 4 warps and 2 programs an SM best for a head and a tail, 16 warps
        # and 1 an SM or 8 and 2 for the one tile; notes_norms.md, 2026-11-24 "LayerNorm's forward at 5120 and 11008")
        grid = [(4, 2), (8, 2)] if "TAIL_N" in default else []
        for warps, per_sm in grid:
            for stages in (1, 2, 3):
                cfg = {"num_warps": warps, "programs": per_sm * sms, "row_stages": stages}
                variants.append((f"head+tail {warps}w {per_sm}/SM rs{stages}", cfg))
        for warps, per_sm in ((16, 1), (8, 2), (4, 4)):
            for stages in (1, 2, 3):
                cfg = {"BLOCK_N": tile, "num_warps": warps, "programs": per_sm * sms, "row_stages": stages}
                variants.append((f"one tile {warps}w {per_sm}/SM rs{stages}", cfg))
        with _no_donated_buffers():
            ref = None
            for name, cfg in variants:
                y = ln.layernorm(x, w, b, bwd_config=cfg)

                def fn(y=y):
                    return torch.autograd.grad(y, (x, w, b), dy, retain_graph=True)

                try:
                    dx = fn()[0]
                except Exception as e:  # registers or shared memory
                    print(f"  {name:30s} {type(e).__name__}: {str(e)[:100]}", flush=True)
                    continue
                ref = dx if ref is None else ref
                err = (dx.float() - ref.float()).abs().max().item()
                q = bench.queued_ms(fn)
                share = nbytes / q / 1e6 / ceil.copy_GBps
                print(f"  {name:30s} {q:7.4f} ms {share:6.1%}  max |dx - default| {err:.3g}", flush=True)
            ye = ln.layernorm_eager(x, w, b)
            q = bench.queued_ms(lambda: torch.autograd.grad(ye, (x, w, b), dy, retain_graph=True))
            print(f"  {'eager':30s} {q:7.4f} ms {nbytes / q / 1e6 / ceil.copy_GBps:6.1%}", flush=True)
        x = w = b = dy = y = ye = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
