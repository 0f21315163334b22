"""Lesson 7's one odd shape (D = 64, causal, N = 1k, bf16): is its time the host's?

    PYTHONPATH=. python3 benchmarks/probes/probe_attention_host.py

At 16 x 16 heads of 1024 the kernel takes about 0.12 ms on an H100; twice (the final run of 2026-11-22 and the
notebook's live run of 2026-11-24) it measured 213-214 TFLOP/s (0.16 ms) where fresh processes give
282-305. This times the same call five ways: do_bench five times over, the host's own time per call
(wall clock over many calls, the GPU left to catch up at the end), and the GPU's time with the calls
queued behind a sleep kernel (``bench.queued_ms``), for D = 64 and 128, causal and full.
"""

from __future__ import annotations

import time

import torch
import triton.testing

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels.attention import attention, attention_flops


def main():
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for d in (64, 128):
        for causal in (True, False):
            q, k, v = (torch.randn(16, 16, 1024, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            fn = lambda: attention(q, k, v, causal)  # noqa: E731
            fn()
            torch.cuda.synchronize()
            f = attention_flops(16, 16, 1024, 1024, d, causal) / 1e9
            runs = [triton.testing.do_bench(fn, warmup=25, rep=100) for _ in range(5)]
            n = 2000
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            host_us = (time.perf_counter() - t0) / n * 1e6
            torch.cuda.synchronize()
            queued = bench.queued_ms(fn)
            print(
                f"D={d} {'causal' if causal else 'full  '}: do_bench "
                + " ".join(f"{f / ms:4.0f}" for ms in runs)
                + f" TFLOP/s; host {host_us:5.1f} us a call; queued {queued * 1e3:6.1f} us = {f / queued:4.0f} TFLOP/s",
                flush=True,
            )


if __name__ == "__main__":
    main()
