"""Probe: warps and programs of the persistent 32768-wide softmax (2026-11-26 "the H200's 32768-wide softmax on a
timeline"; notes_softmax.md).

    PYTHONPATH=. python3 benchmarks/probes/probe_softmax_warps.py [--widths]

The persistent one-tile rows (softmax_config's ``programs``) hold 64 bytes of row a thread: 32 warps for
a 32768-wide 16-bit row, so one program fills an SM's 1024-thread register file and its 32 warps meet
at every row's two reductions. The 2026-11-24 sweep measured the program count and the row stages, not
the warps. Here 8, 16 and 32 warps (256, 128 and 64 bytes a thread) at one and two programs a SM,
checked against float64 with the output poisoned, timed in turn on both clocks, medians of 7.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import triton

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels import softmax as S

sys.path.insert(0, str(Path(__file__).parent))
from probe_softmax_timeline import package_with, time_in_turn  # noqa: E402


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
                variants[f"{warps} warps, {per_sm} a SM"] = lambda w=warps, p=per_sm: package_with(
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
        time_in_turn(variants, 2 * x.numel() * x.element_size(), copy)
        x = want = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
