"""Three regimes on one GPU: launch-bound small tensors, L2-resident intermediates, HBM-bound large ones.

    PYTHONPATH=. python3 benchmarks/small_tensors.py [--out FILE]

writes lesson 1's recording, ``fusionlab/lessons/l1/regimes-<device>-<date>.json`` unless ``--out`` says
otherwise (lesson 1 reads the newest file of its device).

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
import re
from pathlib import Path

import torch

from fusionlab import bench, runtime
from fusionlab.lessons.l1 import regimes


def small(out: dict) -> None:
    rows = regimes.launch_costs()
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
    ap.add_argument("--out", default=None, help="default: fusionlab/lessons/l1/regimes-<device>-<date>.json")
    args = ap.parse_args()
    if not runtime.is_gpu():
        raise SystemExit("needs a GPU Triton supports")
    out = {"meta": bench.metadata(), "L2_bytes": torch.cuda.get_device_properties(0).L2_cache_size}
    out["meta"]["command"] = "python3 benchmarks/small_tensors.py"
    if args.out is None:
        slug = re.sub(r"[^a-z0-9]+", "-", out["meta"]["device"].lower()).strip("-")
        args.out = str(Path(regimes.__file__).parent / f"regimes-{slug}-{out['meta']['date']}.json")
    small(out)
    sweep(out)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
