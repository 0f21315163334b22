"""Sweep of the RMSNorm backward's launch (programs per SM, warps, row prefetch), GPU only.

    PYTHONPATH=. python3 benchmarks/probes/tune_rms_bwd.py [--odd | --stages | --wide]

``--wide``: rows of 11008 and 16384 (a 16384-element tile, 32 warps; 11008 as a head of 8192 and a
tail of 4096): one 16384 tile for 11008 too, a row stage (its dy, h and grad_h in shared memory),
two programs an SM.

``--odd``: hidden sizes that are not powers of two (5120, 11008: the issue's bar shapes the one-tile
row pads to 8192 and 16384), with more programs an SM, fewer warps, deeper prefetch; timed on the GPU
clock (``bench.queued_ms``) as well, since calls of 4096 rows are host-bound.

Each row: the backward alone (gradients of y and h), timed as lesson 4's suite times it (do_bench).
Run on the H100 2026-11-24 (benchmarks/NOTES.md): where the kernel sets the time (16384 x 8192,
32768 x 4096) the defaults were within 1% of the best; at 2048-4096 rows the times jumped from config to
config with no order, because those calls are host-bound (benchmarks/profile_rms_bwd.py shows it).
"""

import sys

import torch

from fusionlab import bench
from fusionlab.kernels._launch import sm_count
from fusionlab.kernels.rmsnorm import rmsnorm, rmsnorm_config
from fusionlab.lessons.l4.suite import DTYPE, EPS, _grad_thunk, _no_donated_buffers, rms_bwd_ledger, rms_inputs

ceil = bench.ceilings()
sms = sm_count()
print(bench.source_label(), f"copy {ceil.copy_GBps:.0f} GB/s, {sms} SMs")
WIDE = "--wide" in sys.argv  # one-tile rows of 16384 (11008 pads to it): a row stage with 32 warps
ODD = "--odd" in sys.argv or "--stages" in sys.argv or WIDE
STAGES = "--stages" in sys.argv  # the default against three row stages, at odd and power-of-two widths
SHAPES = (
    ((4096, 5120), (32768, 5120), (4096, 11008), (32768, 11008))
    if ODD
    else ((4096, 8192), (32768, 4096), (8192, 8192), (2048, 8192), (16384, 8192))
)
if STAGES:
    SHAPES = ((4096, 5120), (32768, 5120), (32768, 1024), (32768, 2048), (32768, 4096), (4096, 8192), (32768, 8192))
if WIDE:
    SHAPES = ((4096, 11008), (32768, 11008), (4096, 16384), (32768, 16384))
for rows, n in SHAPES:
    x, r, dy, dh, w = rms_inputs(rows, n)
    nbytes = rms_bwd_ledger(rows, n).fused_bytes
    default = rmsnorm_config(rows, n, DTYPE, backward=True)
    print(f"\n{rows} x {n}: default {default}")
    configs = [None]
    if STAGES:
        configs.append({"row_stages": 3})
        configs.append({"row_stages": 4})
    if WIDE:  # (the --odd sweep stopped at 16 warps; the default here is 32 with no row stage)
        # one tile, no head and tail (notes_norms.md, 2026-11-24 "the RMSNorm backward three row stages deep")
        configs += [{"BLOCK_N": 16384, "num_warps": 32}]
        configs += [{"num_warps": 32, "row_stages": 1}]  # head and tail with the one tile's warps
        configs += [{"row_stages": 2}, {"row_stages": 2, "programs": min(rows, 2 * sms)}]
        configs += [{"num_warps": 16, "row_stages": 2}, {"programs": min(rows, 2 * sms)}]
    for warps in () if STAGES or WIDE else (4, 8, 16) if ODD else (8, 16):
        for per_sm in (1, 2, 4) if ODD else (1, 2, 4, 8):
            for stages in (1, 2, 3) if ODD else (1, 2):
                programs = min(rows, sms * per_sm)
                configs.append({"num_warps": warps, "programs": programs, "row_stages": stages})
    xg, rg, wg = (t.clone().requires_grad_() for t in (x, r, w))
    cases = []
    with _no_donated_buffers():
        for cfg in configs:
            y, h = rmsnorm(xg, wg, EPS, rg, bwd_config=cfg)
            fn = _grad_thunk((y, h), (xg, wg, rg), (dy, dh))
            try:
                fn()
            except Exception as e:  # a config that does not compile (shared memory, registers)
                print(f"  {cfg}: {type(e).__name__}")
                continue
            cases.append(bench.Case(f"{cfg}", fn, nbytes))
        for res in bench.run(cases, ceil=ceil, rounds=2):
            line = f"  {res.ms:7.3f} ms {100 * res.frac_copy:5.0f}% of copy"
            if ODD:  # the GPU's own time
                case = next(c for c in cases if c.name == res.name)
                q = bench.queued_ms(case.fn)
                line += f"  GPU clock {q:7.3f} ms {nbytes / q / 1e6 / ceil.copy_GBps:6.1%}"
            print(f"{line}  {res.name}", flush=True)
    del x, r, dy, dh, xg, rg, wg
    torch.cuda.empty_cache()
