"""Probe: residual + RMSNorm's forward with a head and a tail in place of one padded tile.

    PYTHONPATH=. python3 benchmarks/probes/probe_rms_tail.py

Rows that fit three quarters of their one tile (11008 in 16384, 20000 in 32768) can be held as a head
of half the tile and a tail of a quarter. Here, bf16, GPU clock (``bench.queued_ms``), share of copy by
the fused ledger: the package's default, the same with other warps, the one padded tile, and
``torch.compile`` of the eager function, all in one run.
"""

from __future__ import annotations

import torch

from fusionlab import bench
from fusionlab.kernels._launch import next_pow2
from fusionlab.kernels.rmsnorm import rmsnorm, rmsnorm_config, rmsnorm_eager, rmsnorm_ledger
from fusionlab.lessons.l4.suite import DTYPE, EPS, rms_inputs

SHAPES = ((4096, 11008), (32768, 11008), (4096, 20000), (32768, 20000), (32768, 8192))


def main():
    ceil = bench.ceilings()
    print(bench.source_label(), f"copy {ceil.copy_GBps:.0f} GB/s", flush=True)
    for rows, n in SHAPES:
        x, r, _, _, w = rms_inputs(rows, n)
        nbytes = rmsnorm_ledger(rows, n, DTYPE).fused_bytes
        default = rmsnorm_config(rows, n, DTYPE)
        print(f"\n{rows} x {n}: default {default}", flush=True)
        y_ref = rmsnorm(x, w, EPS, r, fwd_config={"BLOCK_N": next_pow2(n)})[0]
        comp = torch.compile(rmsnorm_eager, dynamic=False)
        variants = {"default": None, "one tile": {"BLOCK_N": next_pow2(n)}}
        for warps in (4, 8, 16, 32):
            if warps != default["num_warps"]:
                variants[f"{warps} warps"] = {"num_warps": warps}
        with torch.no_grad():
            for name, cfg in variants.items():
                y = rmsnorm(x, w, EPS, r, fwd_config=cfg)[0]
                same = torch.equal(y, y_ref)
                ms = bench.queued_ms(lambda cfg=cfg: rmsnorm(x, w, EPS, r, fwd_config=cfg))
                print(f"  {name:10s} {ms:7.4f} ms {nbytes / ms / 1e6 / ceil.copy_GBps:6.1%}  same bits: {same}")
            comp(x, w, EPS, r)
            ms = bench.queued_ms(lambda: comp(x, w, EPS, r))
            print(f"  {'compiled':10s} {ms:7.4f} ms {nbytes / ms / 1e6 / ceil.copy_GBps:6.1%}", flush=True)
        x = r = w = y = y_ref = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
