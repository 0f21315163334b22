"""Probe: LayerNorm's forward at rows that pad their one tile (5120 in 8192, 11008 in 16384).

    PYTHONPATH=. python3 benchmarks/probes/probe_ln_fwd.py [--widths 5120,11008] [--rows 4096,32768]

RMSNorm's forward streams 5120-wide rows at 98-99% of copy in one 8192-element tile; LayerNorm's, in the
same tile and warps, at 67% (H200) to 86% (H100) (notes_norms.md, 2026-11-24 "`bench_norms.py final` on both GPUs
after the three row stages"). LayerNorm reduces a
row twice (its mean, then the centred squares), so a padded tile costs it two block-wide reductions.
Here, bf16, GPU clock (``bench.queued_ms``), share of copy by LayerNorm's fused ledger: the package's
default, one padded tile and a head and a tail (``TAIL_N``), each at several warps,
``torch.compile`` of the eager function and RMSNorm's forward (no residual, same bytes less the bias)
as the one-reduction yardstick, all in one run; each variant checked against the default's output.
"""

from __future__ import annotations

import argparse

import torch

from fusionlab import bench
from fusionlab.kernels import layernorm as ln
from fusionlab.kernels import rmsnorm as rn
from fusionlab.kernels._launch import head_and_tail, next_pow2

EPS = 1e-5
DT = torch.bfloat16


def with_tail(tail: bool):
    """LayerNorm's forward tuning with or without heads and tails (the config cache cleared)."""
    t = ln.GPU_TUNING["forward"]
    t.pop("tail_from", None)
    if tail:
        t.update(tail_from=2048, tail_max=16384)
    ln._config.cache_clear()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", default="5120,11008,3072,6144,12288,8192,16384,1024,2048,4096")
    ap.add_argument("--rows", default="32768,4096")
    args = ap.parse_args()
    ceil = bench.ceilings()
    print(bench.source_label(), f"copy {ceil.copy_GBps:.0f} GB/s", flush=True)
    shipped = dict(ln.GPU_TUNING["forward"])
    import torch._dynamo

    torch._dynamo.config.recompile_limit = 256  # one compile a shape; past 8, dynamo would run eager
    comp = torch.compile(ln.layernorm_eager, dynamic=False)
    for rows in (int(r) for r in args.rows.split(",")):
        for n in (int(v) for v in args.widths.split(",")):
            g = torch.Generator(device="cuda").manual_seed(n)
            x = torch.randn(rows, n, device="cuda", dtype=DT, generator=g) * 2 + 0.5
            w = torch.randn(n, device="cuda", dtype=DT, generator=g)
            b = torch.randn(n, device="cuda", dtype=DT, generator=g)
            nbytes = ln.layernorm_ledger(rows, n, DT).fused_bytes
            ln.GPU_TUNING["forward"].clear()
            ln.GPU_TUNING["forward"].update(shipped)
            ln._config.cache_clear()
            default = ln.layernorm_config(rows, n, DT)
            print(f"\n{rows} x {n}: default {default}", flush=True)

            def report(name, fn, ref=None):
                with torch.no_grad():
                    if ref is not None:
                        y = fn()
                        err = (y.float() - ref.float()).abs().max().item()
                    ms = bench.queued_ms(fn)
                tail = f"  max |y - default| {err:.3g}" if ref is not None else ""
                print(f"  {name:26s} {ms:7.4f} ms {nbytes / ms / 1e6 / ceil.copy_GBps:6.1%}{tail}", flush=True)

            with torch.no_grad():
                y_ref = ln.layernorm(x, w, b, EPS)
            report("default", lambda: ln.layernorm(x, w, b, EPS))
            tile = next_pow2(n)
            if n <= 16384:
                with_tail(False)
                for warps in (4, 8, 16):
                    cfg = {"BLOCK_N": tile, "num_warps": warps}
                    name = f"tile {tile} {warps}w"
                    report(name, lambda cfg=cfg: ln.layernorm(x, w, b, EPS, fwd_config=cfg), y_ref)
                if head_and_tail(n, tile):
                    with_tail(True)
                    c = ln.layernorm_config(rows, n, DT)
                    for warps in (4, 8, 16):
                        cfg = {"num_warps": warps}
                        name = f"{c['BLOCK_N']}+{c.get('TAIL_N')} {warps}w"
                        report(name, lambda cfg=cfg: ln.layernorm(x, w, b, EPS, fwd_config=cfg), y_ref)
            with torch.no_grad():
                comp(x, w, b)
            report("compiled", lambda: comp(x, w, b), y_ref)
            report("rmsnorm fwd (no r, no b)", lambda: rn.rmsnorm(x, w, EPS))
            x = w = b = y_ref = None
            torch.cuda.empty_cache()
    ln.GPU_TUNING["forward"].clear()
    ln.GPU_TUNING["forward"].update(shipped)


if __name__ == "__main__":
    main()
