"""Probe: warps and programs of the persistent 32768-wide softmax (nineteenth session; notes_softmax.md).

    PYTHONPATH=. python3 benchmarks/probe_softmax_warps.py [--widths]

The persistent one-tile rows (softmax_config's ``programs``) hold 64 bytes of row a thread: 32 warps for
a 32768-wide 16-bit row, so one program fills an SM's 1024-thread register file and its 32 warps meet
at every row's two reductions. The 2026-11-24 sweep measured the program count and the row stages, not
the warps. Here 8, 16 and 32 warps (256, 128 and 64 bytes a thread) at one and two programs a SM,
checked against float64 with the output poisoned, timed in turn on both clocks, medians of 7.
"""

from __future__ import annotations

import statistics
import sys

import torch
import triton

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels import softmax as S


def with_cfg(x, **over):
    orig = S.softmax_config

    def fixed(*a, **k):
        cfg = orig(*a, **k)
        return {**cfg, **over} if cfg.get("programs") else cfg

    S.softmax_config = fixed
    try:
        return S.softmax(x)
    finally:
        S.softmax_config = orig


def poisoned(fn):
    empty = torch.empty
    torch.empty = lambda *a, **k: empty(*a, **k).fill_(float("nan"))
    try:
        return fn()
    finally:
        torch.empty = empty


def main():
    copy = bench.measure_copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"copy {copy:.0f} GB/s, {sms} SMs", flush=True)  # fmt: skip
    shapes = ((4096, 32768), (16384, 32768), (2048, 32768), (4096, 28000))
    if "--widths" in sys.argv:  # the persistent path's widths below a full tile, 16 against 32 warps
        shapes = tuple((4096, n) for n in (26000, 28000, 29000, 30000, 31000, 32000, 32760))
    for rows, n in shapes:
        g = torch.Generator(device="cuda").manual_seed(rows)
        x = (torch.randn(rows, n, device="cuda", generator=g) * 3).to(torch.bfloat16)
        want = torch.softmax(x.double(), dim=-1)
        variants = {"package": lambda: S.softmax(x)}
        for warps in (16, 32) if "--widths" in sys.argv else (8, 16, 32):
            for per_sm in (2,) if "--widths" in sys.argv else (1, 2):
                variants[f"{warps} warps, {per_sm} a SM"] = lambda w=warps, p=per_sm: with_cfg(
                    x, num_warps=w, programs=p * sms
                )
        print(f"\n{rows} x {n} bf16 {S.softmax_config(rows, n, x.dtype)}", flush=True)
        for label, fn in list(variants.items()):
            try:
                err = (poisoned(fn).double() - want).abs().max().item()
            except Exception as e:  # out of resources, say
                print(f"  {label}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                del variants[label]
                continue
            assert err < 2e-2, (label, err)
        times = {label: ([], []) for label in variants}
        for _ in range(7):
            for label, fn in variants.items():
                times[label][0].append(bench.queued_ms(fn))
                times[label][1].append(bench.time_ms(fn))
        nbytes = 2 * x.numel() * x.element_size()
        for label, (q, c) in times.items():
            q, c = statistics.median(q), statistics.median(c)
            print(
                f"  {label:22s} GPU {q * 1e3:7.1f} us {nbytes / q / 1e6 / copy:6.1%}   "
                f"call {c * 1e3:7.1f} us {nbytes / c / 1e6 / copy:6.1%}",
                flush=True,
            )
        x = want = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
