"""The attention backward's tiles at the shapes that missed issue 39's cuDNN bar, TMA loads on and off.

    PYTHONPATH=. python3 benchmarks/probes/tune_attention_backward.py --out $OUT [--workers 14] [--deadline 170]

The 2026-11-26 lesson 8 recordings missed ">= 0.8x SDPA's cuDNN backward" at every head dim 128 shape
(0.73-0.84x) and at head dim 64, N = 16k, causal; their "hopper ours tma loads" cases (Q/dO and K/V
through tensor descriptors, ``backward_config={"TMA": True}``) ran 4-10% faster than the pointer loads at
N = 16k. This sweeps, per missed (head dim, causal), bf16, N = 4k and 16k at 16k x 16 token-heads:
each pass's tiles (``DKDV`` with the dQ pass at its default, ``DQ`` with the dK/dV pass at its
default), each with TMA loads off and on; then the pair of each half's fastest (summed over the Ns),
timed as one, against the default and against cuDNN's backward on the same inputs. The launches are
compiled first in ``--workers`` processes (``bench_attention_backward.precompile``). Every gradient of the
chosen pair is checked against the flash backend's (norm-relative). Last, the one forward + backward
miss (H200, head dim 64, N = 1k, causal, 1.12x flash): ours and flash end to end, five do_bench runs
each, to see how much of that miss is run-to-run spread. JSON: ``$OUT/tune_attention_backward.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_attention_backward import _t, bench, precompile, qkv_do, sdpa_fn, time_ours  # noqa: E402

#: (head dim, causal) that missed the cuDNN bar on an H100 or an H200
MISSED = [(128, False), (128, True), (64, True)]
NS = (4096, 16384)
DKDV = [(64, 128, 8, 2), (64, 128, 8, 3), (64, 64, 4, 2), (64, 64, 4, 3), (32, 128, 8, 3), (64, 64, 8, 3)]
DQ = [(128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 8, 3), (128, 64, 4, 3)]
K1 = ("BLOCK_M1", "BLOCK_N1", "num_warps1", "num_stages1")
K2 = ("BLOCK_M2", "BLOCK_N2", "num_warps2", "num_stages2")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--deadline", type=float, default=170.0)
    a = ap.parse_args()
    t0 = time.time()
    import triton

    from fusionlab.kernels.attention import attention
    from fusionlab.kernels.attention_backward import attention_backward_config

    rows = [{"kind": "device", "name": torch.cuda.get_device_name(), "torch": torch.__version__,
             "triton": triton.__version__, "date": time.strftime("%Y-%m-%d")}]  # fmt: skip
    path = os.path.join(a.out, "tune_attention_backward.json")

    def log(row):
        rows.append(row)
        print(json.dumps(row)[:260], flush=True)
        os.makedirs(a.out, exist_ok=True)
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)

    def late(need=0.0):
        return time.time() - t0 + need > a.deadline

    base, cands = {}, {}
    for d, causal in MISSED:
        cfg = attention_backward_config(d, causal)
        b = {k: cfg[k] for k in _t(*range(8))}
        base[(d, causal)] = b
        c = [("base", b, False), ("base", b, True)]
        for tma in (False, True):
            c += [("dkdv", {**b, **dict(zip(K1, t, strict=True))}, tma) for t in DKDV]
            c += [("dq", {**b, **dict(zip(K2, t, strict=True))}, tma) for t in DQ]
        cands[(d, causal)] = [(half, {**x, "TMA": tma}) for half, x, tma in c]
    failed = set()
    if a.workers:
        tasks = [(d, causal, "bf16", 1024, True, x) for (d, causal), cs in cands.items() for _, x in cs]
        failed = precompile(tasks, a.workers)
    log({"kind": "compiled", "seconds": time.time() - t0, "failed": len(failed)})

    for (d, causal), cs in cands.items():
        totals: dict[int, list[float]] = {}
        cudnn = {}
        for n in NS:
            if late(40):
                break
            inputs = qkv_do(n, d, torch.bfloat16)
            leaves = [t.clone().requires_grad_() for t in inputs[:3]]
            o = sdpa_fn("cudnn")(*leaves, causal)
            cudnn[n] = bench(
                lambda o=o, leaves=leaves, do=inputs[3]: torch.autograd.grad(o, leaves, do, retain_graph=True)
            )
            del o, leaves
            log({"kind": "cudnn", "d": d, "causal": causal, "n": n, "bwd_ms": cudnn[n]})
            for i, (half, x) in enumerate(cs):
                if (d, causal, json.dumps(x)) in failed or late(30):
                    continue
                try:
                    ms = time_ours(inputs, causal, x)[0]
                    totals.setdefault(i, []).append(ms)
                    log({"kind": "sweep", "d": d, "causal": causal, "n": n, "half": half, "cfg": x, "bwd_ms": ms,
                         "vs_cudnn": cudnn[n] / ms})  # fmt: skip
                except Exception as e:  # noqa: BLE001  (a tile that does not build here is a result)
                    log({"kind": "sweep", "d": d, "causal": causal, "n": n, "cfg": x, "error": str(e)[:200]})
            del inputs
            torch.cuda.empty_cache()
        full = {i: sum(v) for i, v in totals.items() if len(v) == len(NS)}
        if not full or late(20):
            continue
        b1 = min((i for i in full if cs[i][0] in ("base", "dkdv")), key=full.get)
        b2 = min((i for i in full if cs[i][0] in ("base", "dq")), key=full.get)
        # one TMA flag covers both passes: the pair takes the flag of the faster half's winner
        tma = cs[b1][1]["TMA"] if full[b1] <= full[b2] else cs[b2][1]["TMA"]
        pair = {**{k: cs[b1][1][k] for k in K1}, **{k: cs[b2][1][k] for k in K2}, "TMA": tma}
        for n in NS:
            if late(10):
                break
            inputs = qkv_do(n, d, torch.bfloat16)
            leaves = [t.clone().requires_grad_() for t in inputs[:3]]
            ref = torch.autograd.grad(sdpa_fn("flash")(*leaves, causal), leaves, inputs[3])
            try:
                ms, _, errs = time_ours(inputs, causal, pair, True, ref)
                base_ms = time_ours(inputs, causal, base[(d, causal)])[0]
                log({"kind": "pair", "d": d, "causal": causal, "n": n, "cfg": pair, "bwd_ms": ms, "base_ms": base_ms,
                     "vs_cudnn": cudnn.get(n, float("nan")) / ms, "base_vs_cudnn": cudnn.get(n, float("nan")) / base_ms,
                     "rel_err_vs_flash": errs})  # fmt: skip
            except Exception as e:  # noqa: BLE001
                log({"kind": "pair", "d": d, "causal": causal, "n": n, "cfg": pair, "error": str(e)[:200]})
            del inputs, leaves, ref
            torch.cuda.empty_cache()

    # the forward + backward miss: the spread of five runs each
    if not late(15):
        q, k, v, do = qkv_do(1024, 64, torch.bfloat16)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        flash = sdpa_fn("flash")

        def ours():
            return torch.autograd.grad(attention(*leaves, causal=True)[0], leaves, do)

        def theirs():
            return torch.autograd.grad(flash(*leaves, True), leaves, do)

        for name, fn in (("ours", ours), ("flash", theirs)):
            fn()
            log({"kind": "fwd_bwd_spread", "d": 64, "n": 1024, "causal": True, "impl": name,
                 "ms": [bench(fn) for _ in range(5)]})  # fmt: skip
    print("wrote", path, f"in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
