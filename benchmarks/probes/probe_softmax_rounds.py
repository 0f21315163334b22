"""Probe: persistent softmax programs, how many (benchmarks/notes_softmax.md, 2026-11-24 "widths that are not powers
of two").

    PYTHONPATH=. python3 benchmarks/probes/probe_softmax_rounds.py
    PYTHONPATH=. python3 benchmarks/probes/probe_softmax_rounds.py --ab   # program counts, interleaved

``--ab`` (2026-11-25 "the H200's two open misses, measured further"): at 2048-16384 rows of 32768, the program counts
two an SM (shipped),
balanced rounds under two an SM and under one an SM (every program the same number of rows), 256 and
128, timed in turn seven times (A B C ..., A B C ...): run-to-run drift on the H200 is as large as the
differences, so only an interleaved median compares them.

Rows of 16385-32768 elements (16-bit) are walked by persistent programs, two an SM (264 on an H100 or
H200), each taking every 264th row. At lesson 4's sweep shape, 4096 x 32768, that is 15.5 rounds: in
the last one half the programs have no row, and the H200 reached 87.7% of copy (bar 90%) against
91.3% at 16384 rows. Balanced: as many rounds (16), fewer programs (4096 / 16 = 256), every program
the same number of rows. bf16, GPU clock, share of copy by two trips; each checked against float64.
"""

from __future__ import annotations

import sys

import torch
import triton

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels import softmax as S


def ab():
    copy = bench.measure_copy_bandwidth()
    dev = torch.cuda.get_device_name()
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s", flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for rows in (2048, 4096, 8192, 16384):
        x = torch.randn(rows, 32768, device="cuda", dtype=torch.bfloat16) * 3
        want = torch.softmax(x[-64:].double(), dim=-1)
        bal2 = triton.cdiv(rows, triton.cdiv(rows, 2 * sms))  # the same rows each, at most two an SM
        bal1 = triton.cdiv(rows, triton.cdiv(rows, sms))  # the same rows each, at most one an SM
        counts = {"shipped": None, f"{bal2} (bal 2/SM)": bal2, f"{bal1} (bal 1/SM)": bal1, "256": 256, "128": 128}
        times = {label: [] for label in counts}
        orig = S.softmax_config
        for _ in range(7):
            for label, programs in counts.items():

                def fixed(*a, programs=programs, **k):
                    cfg = orig(*a, **k)
                    return cfg if programs is None else {**cfg, "programs": programs}

                S.softmax_config = fixed
                try:
                    err = (S.softmax(x)[-64:].double() - want).abs().max().item()
                    assert err < 1e-2, err
                    times[label].append(bench.queued_ms(lambda: S.softmax(x)))
                finally:
                    S.softmax_config = orig
        for label, ts in times.items():
            ts = sorted(ts)
            share = [2 * x.numel() * 2 / t / 1e6 / copy for t in ts]
            print(
                f"  {rows:>5} x 32768 programs {label:16s} median {ts[3]:.4f} ms {share[3]:6.1%}"
                f"  (best {share[0]:.1%}, worst {share[-1]:.1%})",
                flush=True,
            )
        x = None


def main():
    if "--ab" in sys.argv:
        return ab()
    copy = bench.measure_copy_bandwidth()
    dev = torch.cuda.get_device_name()
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s", flush=True)
    for rows, n in ((4096, 32768), (8192, 20000), (4096, 24576), (8192, 17000), (1000, 32768)):
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16, generator=g) * 3
        want = torch.softmax(x[-64:].double(), dim=-1)
        cfg = S.softmax_config(rows, n, x.dtype)
        p_max = cfg["programs"]
        rounds = triton.cdiv(rows, p_max)
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        variants = [("shipped", {})]
        variants.append(("balanced", {"programs": triton.cdiv(rows, rounds)}))
        # (programs an SM, row stages, warps): at 64 KiB a row, two stages of shared memory hold one
        # program an SM whatever the launch asks
        for per_sm, stages, warps in ((1, 3, 16), (1, 4, 16), (1, 2, 16), (2, 2, 8)):
            label = f"{per_sm}/SM s{stages} w{warps}"
            variants.append((label, {"programs": per_sm * sms, "row_stages": stages, "num_warps": warps}))
        # the split kernel instead (several programs a row, parts in registers): rows padded less
        for part, warps in ((8192, 4), (16384, 4), (16384, 8), (4096, 4)):
            split = {"BLOCK_M": 1, "BLOCK_N": part, "num_warps": warps, "SINGLE_TILE": False}
            variants.append((f"split {part} w{warps}", {**split, "SPLIT": triton.cdiv(n, part)}))
        for label, over in variants:
            orig = S.softmax_config

            def fixed(*a, over=over, **k):
                return {**orig(*a, **k), **over}

            S.softmax_config = fixed
            try:
                err = (S.softmax(x)[-64:].double() - want).abs().max().item()
                ms = bench.queued_ms(lambda: S.softmax(x))
                share = 2 * x.numel() * 2 / ms / 1e6 / copy
                print(f"  {rows:>5} x {n:<6} {label:14s} {ms:7.4f} ms {share:6.1%} err {err:.0e}", flush=True)
            except Exception as e:  # shared memory past the SM's: say so, go on
                print(f"  {rows:>5} x {n:<6} {label:14s} failed: {type(e).__name__} {str(e)[:120]}", flush=True)
            finally:
                S.softmax_config = orig
        x = None


if __name__ == "__main__":
    main()
