"""Which GELU does cuBLASLt's epilogue compute, and how do our two GELU epilogues time beside it?

    PYTHONPATH=. python3 benchmarks/probe_gelu_epilogue.py --out $OUT [--rounds 3]

Part 1 (the question): ``torch._addmm_activation(b, x, w.T, use_gelu=True)`` on the GPU against
float64 ``gelu(x w^T + b)`` computed both ways, exact (erf) and tanh. Inputs are fp32 with TF32 off,
so the matmul's rounding (~1e-6) is far below the two formulas' gap (up to ~5e-4 near |v| = 2); the
smaller error names the formula. The same in bf16, by the error norms over 4M outputs. (On the CPU
the op computes the exact GELU; the GPU's comes from cuBLASLt's epilogue.)

Part 2 (the timings): at lesson 6's shapes, the cuBLAS matmul alone, ``linear(x, w, b, "gelu")``,
``linear(x, w, b, "gelu_tanh")`` and cuBLASLt's GELU epilogue, in rotated rounds (median of the
rounds). Results go to ``$OUT/gelu_epilogue.json``; a table is printed last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics

import torch
import torch.nn.functional as F

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 4096, 16384)]  # (M, K, N)
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def which_gelu(dtype, M=2048, K=1024, N=2048) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(M, K, device="cuda", generator=g).to(dtype)
    w = (torch.randn(N, K, device="cuda", generator=g) / K**0.5).to(dtype)
    b = torch.randn(N, device="cuda", generator=g).to(dtype)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        y = torch._addmm_activation(b, x, w.t(), use_gelu=True).double()
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    h = F.linear(x.double(), w.double(), b.double())
    exact, tanh = F.gelu(h), F.gelu(h, approximate="tanh")
    near = (h.abs() > 1.0) & (h.abs() < 3.0)  # where the two formulas differ most
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "max_err_vs_exact": (y - exact)[near].abs().max().item(),
        "max_err_vs_tanh": (y - tanh)[near].abs().max().item(),
        "norm_err_vs_exact": (y - exact)[near].norm().item(),
        "norm_err_vs_tanh": (y - tanh)[near].norm().item(),
        "formulas_gap": (exact - tanh)[near].abs().max().item(),
    }


def timings(rounds: int) -> list[dict]:
    from fusionlab import bench
    from fusionlab.kernels.linear import linear

    rows = []
    for dname, dtype in DTYPES.items():
        for M, K, N in SHAPES:
            g = torch.Generator(device="cuda").manual_seed(1)
            x = torch.randn(M, K, device="cuda", generator=g).to(dtype)
            w = (torch.randn(N, K, device="cuda", generator=g) / K**0.5).to(dtype)
            b = torch.randn(N, device="cuda", generator=g).to(dtype)
            h = F.linear(x.float(), w.float(), b.float())
            fns = {
                "cublas matmul alone": (lambda: torch.matmul(x, w.t()), None),
                "ours gelu (erf)": (lambda: linear(x, w, b, "gelu"), F.gelu(h)),
                "ours gelu_tanh": (lambda: linear(x, w, b, "gelu_tanh"), F.gelu(h, approximate="tanh")),
                "cuBLASLt gelu epilogue": (
                    lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True),
                    F.gelu(h, approximate="tanh"),
                ),
            }
            for name, (fn, ref) in fns.items():
                if ref is not None:
                    err = ((fn().float() - ref).norm() / ref.norm()).item()
                    rows.append({"kind": "check", "dtype": dname, "shape": [M, K, N], "impl": name, "rel_err": err})
            times = {name: [] for name in fns}
            names = list(fns)
            for rnd in range(rounds):
                for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
                    times[name].append(bench.time_ms(fns[name][0], warmup_ms=10, rep_ms=50))
            base = statistics.median(times["cublas matmul alone"])
            for name, ts in times.items():
                ms = statistics.median(ts)
                row = {"kind": "time", "dtype": dname, "shape": [M, K, N], "impl": name, "ms": ms}
                row["over_matmul"] = ms / base
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args(argv)
    import triton

    import fusionlab  # noqa: F401  (decides the mode before the kernels are defined)

    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.date.today().isoformat(),
    }
    which = [which_gelu(torch.float32), which_gelu(torch.bfloat16)]
    for row in which:
        print(json.dumps(row), flush=True)
    rows = timings(a.rounds)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "gelu_epilogue.json"), "w") as f:
        json.dump({"meta": meta, "which": which, "rows": rows}, f, indent=1)
    print(meta)
    print("| dtype | shape | impl | ms | x matmul |")
    for r in rows:
        if r["kind"] == "time":
            print(f"| {r['dtype']} | {r['shape']} | {r['impl']} | {r['ms']:.3f} | {r['over_matmul']:.3f} |")


if __name__ == "__main__":
    main()
