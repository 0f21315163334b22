"""The RMSNorm backward three ways: do_bench, back-to-back wall time per call, and the GPU time of its
kernels alone (torch.profiler), GPU only.

    PYTHONPATH=. python3 benchmarks/profile_rms_bwd.py

Written to explain lesson 4's one missed bar (the fused backward at 37-45% of copy at 4096 x 8192 by
do_bench, 2026-11-24): its kernels ran at 86-96% of copy at every shape, and the call as a whole was
host-bound (about 0.39 ms of host time a backward on the H100 host). Results: benchmarks/NOTES.md.
"""

import time

import torch
from torch.profiler import ProfilerActivity, profile

from fusionlab import bench
from fusionlab.kernels.rmsnorm import rmsnorm
from fusionlab.lessons.l4.suite import EPS, _grad_thunk, _no_donated_buffers, rms_bwd_ledger, rms_inputs

ceil = bench.ceilings()
print(bench.source_label(), f"copy {ceil.copy_GBps:.0f} GB/s")
for rows, n in ((2048, 8192), (4096, 8192), (8192, 8192), (32768, 4096)):
    x, r, dy, dh, w = rms_inputs(rows, n)
    xg, rg, wg = (t.clone().requires_grad_() for t in (x, r, w))
    with _no_donated_buffers():
        y, h = rmsnorm(xg, wg, EPS, rg)
        fn = _grad_thunk((y, h), (xg, wg, rg), (dy, dh))
        fn()
        ms = bench.time_ms(fn)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / 200 * 1e3
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
    kernels = {e.key: e.self_device_time_total / 20 / 1e3 for e in prof.key_averages() if e.self_device_time_total}
    gpu = sum(kernels.values())
    pct = rms_bwd_ledger(rows, n).fused_bytes / gpu / 1e6 / ceil.copy_GBps * 100
    print(f"{rows}x{n}: do_bench {ms:.3f} ms, back to back {wall:.3f} ms/call, kernels {gpu:.3f} ms ({pct:.0f}%)")
    for name, t in sorted(kernels.items(), key=lambda kv: -kv[1])[:4]:
        print(f"    {t:.4f} ms  {name[:90]}")
