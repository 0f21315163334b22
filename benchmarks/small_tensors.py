"""Three regimes on one GPU: launch-bound small tensors, L2-resident intermediates, HBM-bound large ones.

    PYTHONPATH=. python3 benchmarks/small_tensors.py [--out results.json]

1. Per call, back to back (the launch-bound regime): for bias + GELU and cos·cos in bf16 at 8 x 4096,
   128 x 11008 and 1024 x 4096, the wall time of 1000 calls in a row divided by 1000 (host time per
   call when the GPU is faster than the host), every case of a shape timed in turns, seven rounds, the
   best round kept (``regimes.per_call_round_robin``); and the GPU time alone (a CUDA graph of 100
   calls, replayed: no host in the loop). Eager PyTorch, the package's launchers, a copy. The bar:
   each launcher's per-call time at most 1.1x eager's for the same function.
2. A size sweep of cos·cos fp32 from 4 KiB to 1 GiB: eager, compiled and the fused kernel, each by
   do_bench (L2 flushed between calls, so only the intermediate of eager can stay in L2) and per call
   back to back; the ratio eager / fused shows the three regimes.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from fusionlab import bench, runtime
from fusionlab.kernels.bias_gelu import bias_gelu, bias_gelu_eager
from fusionlab.kernels.cos import cos_cos, cos_cos_eager
from fusionlab.lessons.l1 import regimes
from fusionlab.lessons.l1.regimes import per_call_round_robin

SHAPES = ((8, 4096), (128, 11008), (1024, 4096))


def graph_us(fn, calls: int = 100) -> float:
    """GPU time per call: a CUDA graph of ``calls`` calls, replayed (no host work in the loop)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    reps = 20
    t0 = time.perf_counter()
    for _ in range(reps):
        g.replay()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / (reps * calls) * 1e6


def small(out: dict) -> None:
    rows = []
    for m, n in SHAPES:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        xc = x.flatten()
        cases = {
            "eager gelu(x + b) tanh": lambda: bias_gelu_eager(x, b, "tanh"),
            "eager gelu(x + b) erf": lambda: bias_gelu_eager(x, b),
            "fusionlab bias_gelu tanh": lambda: bias_gelu(x, b, "tanh"),
            "fusionlab bias_gelu erf_fast": lambda: bias_gelu(x, b, "erf_fast"),
            "fusionlab bias_gelu erf": lambda: bias_gelu(x, b),
            "eager cos().cos()": lambda: cos_cos_eager(xc),
            "fusionlab cos_cos": lambda: cos_cos(xc),
            "copy (clone)": lambda: x.clone(),
            "torch x + 1 (one launch)": lambda: x + 1,
        }
        per_call = per_call_round_robin(cases)
        for name, fn in cases.items():
            rows.append({"shape": [m, n], "case": name, "per_call_us": per_call[name], "graph_us": graph_us(fn)})
    out["small"] = rows
    print(f"{'shape':<14} {'case':<30} {'per call us':>12} {'GPU us':>8} {'vs eager':>9}")
    for r in rows:
        op = "cos" if "cos" in r["case"] else "tanh" if "tanh" in r["case"] else "erf"
        eager = next(
            (
                e["per_call_us"]
                for e in rows
                if e["shape"] == r["shape"]
                and e["case"]
                == {"cos": "eager cos().cos()", "tanh": "eager gelu(x + b) tanh", "erf": "eager gelu(x + b) erf"}[op]
            ),
            None,
        )
        ratio = r["per_call_us"] / eager if eager and "fusionlab" in r["case"] else float("nan")
        r["vs_eager"] = None if ratio != ratio else ratio
        print(
            f"{str(tuple(r['shape'])):<14} {r['case']:<30} {r['per_call_us']:12.1f} {r['graph_us']:8.2f} {ratio:9.2f}"
        )

    worst = max(r["vs_eager"] for r in rows if r["vs_eager"] is not None)
    print(
        f"bar: every launcher <= 1.1x eager per call, same function: {'met' if worst <= 1.1 else 'MISSED'} "
        f"(worst {worst:.2f}x)"
    )


def sweep(out: dict) -> None:
    rows = regimes.sweep()
    out["sweep"] = rows
    print(f"\n{'bytes':>12} {'eager/fused (do_bench)':>24} {'eager/fused (per call)':>24} {'fused us/call':>14}")
    for r in rows:
        print(
            f"{r['bytes']:12d} {r['eager do_bench ms'] / r['fused do_bench ms']:24.2f} "
            f"{r['eager per call us'] / r['fused per call us']:24.2f} {r['fused per call us']:14.1f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="small_tensors.json")
    args = ap.parse_args()
    if not runtime.is_gpu():
        raise SystemExit("needs a GPU Triton supports")
    out = {"meta": bench.metadata(), "L2_bytes": torch.cuda.get_device_properties(0).L2_cache_size}
    out["meta"]["command"] = "python3 benchmarks/small_tensors.py"
    small(out)
    sweep(out)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
