"""The attention backward at head dim 128 against cuDNN's: where its time goes, and an A/B of what is left.

    PYTHONPATH=. python3 benchmarks/probes/probe_attention_bwd_ab.py --out $OUT [--workers 14] [--deadline 170]

Head dim 128 still misses issue 39's ">= 0.8x SDPA's cuDNN backward" (0.74-0.80x on an H100 after the
2026-11-27 tile sweep, ``tune_attention_backward.py``, whose 26 configurations per shape this does not
repeat). Per (causal, N = 4k and 16k at 16k x 16 token-heads), bf16:

1. the default's launches timed one by one (torch's profiler: preprocess, dK/dV pass, dQ pass), so the
   pass that loses is named;
2. the atomic schedule (``deterministic=False``: dQ added by the dK/dV programs, no dQ pass), with the
   bulk reduce-add (``TMA_REDUCE``) off and on;
3. ``EARLY_DP`` (dP's product issued before the exponentials, both passes), in both schedules;
   tiles the earlier sweep did not try, each half against the other's default (TMA loads on, the
   default at these shapes): deeper pipelines, 128-row tiles, 4 warps on 128-key tiles;
4. cuDNN's backward on the same inputs.

Items 1, 2 and EARLY_DP run at every shape before any tile, so a deadline cuts tiles, not schedules.
The launches are compiled first in ``--workers`` processes. Every configuration's gradients are
checked against the flash backend's (norm-relative) at N = 4k. JSON: ``$OUT/probe_attention_bwd_ab.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_attention_backward import _t, bench, precompile, qkv_do, rel_err, sdpa_fn  # noqa: E402

NS = (4096, 16384)
#: (BLOCK_M1, BLOCK_N1, warps, stages) for the dK/dV pass, and (BLOCK_M2, BLOCK_N2, warps, stages) for
#: the dQ pass, not in tune_attention_backward.py's lists
DKDV = [(64, 128, 8, 4), (128, 128, 8, 2), (64, 128, 4, 3), (32, 128, 4, 4)]
DQ = [(128, 64, 8, 4), (64, 128, 4, 3), (128, 128, 8, 3)]
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
    from fusionlab.kernels.attention_backward import attention_backward, attention_backward_config

    rows = [{"kind": "device", "name": torch.cuda.get_device_name(), "torch": torch.__version__,
             "triton": triton.__version__, "date": time.strftime("%Y-%m-%d")}]  # fmt: skip
    path = os.path.join(a.out, "probe_attention_bwd_ab.json")

    def log(row):
        rows.append(row)
        print(json.dumps(row)[:260], flush=True)
        os.makedirs(a.out, exist_ok=True)
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)

    def late(need=0.0):
        return time.time() - t0 + need > a.deadline

    cands = {}  # causal -> [(name, config, deterministic)]
    for causal in (False, True):
        cfg = attention_backward_config(128, causal)
        b = {k: cfg[k] for k in _t(*range(8))}
        c = [
            ("default", {}, True),
            ("default+early_dp", {"EARLY_DP": True}, True),
            ("atomic", {}, False),
            ("atomic+early_dp", {"EARLY_DP": True}, False),
            ("atomic+reduce", {"TMA_REDUCE": True}, False),
        ]
        c += [(f"dkdv {t}", {**b, **dict(zip(K1, t, strict=True)), "TMA": True}, True) for t in DKDV]
        c += [(f"dq {t}", {**b, **dict(zip(K2, t, strict=True)), "TMA": True}, True) for t in DQ]
        cands[causal] = c
    failed = set()
    if a.workers:
        # at N = 4096: where the default turns TMA loads on, so the default compiles what is timed
        tasks = [(128, causal, "bf16", 4096, det, x) for causal, cs in cands.items() for _, x, det in cs]
        failed = precompile(tasks, a.workers)
    log({"kind": "compiled", "seconds": time.time() - t0, "failed": len(failed)})

    cudnn_ms = {}

    def shape(causal, n, cs, first):
        """One (causal, N): cuDNN and the default's launches (``first``), then the A/B rows ``cs``."""
        q, k, v, do = qkv_do(n, 128, torch.bfloat16)
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        if first:
            o_c = sdpa_fn("cudnn")(*leaves, causal)
            cudnn_ms[(causal, n)] = bench(
                lambda o_c=o_c, leaves=leaves: torch.autograd.grad(o_c, leaves, do, retain_graph=True)
            )
            del o_c
            log({"kind": "cudnn", "causal": causal, "n": n, "bwd_ms": cudnn_ms[(causal, n)]})
        cudnn = cudnn_ms[(causal, n)]
        ref = torch.autograd.grad(sdpa_fn("flash")(*leaves, causal), leaves, do) if n == NS[0] else None
        o, lse = attention(q, k, v, causal)
        # 1. the default's launches one by one (the first pass only)
        if first:
            try:
                from torch.profiler import ProfilerActivity, profile

                attention_backward(q, k, v, o, lse, do, causal)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        attention_backward(q, k, v, o, lse, do, causal)
                    torch.cuda.synchronize()
                per = {}
                for ev in prof.key_averages():
                    t_us = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
                    if t_us:
                        per[ev.key[:60]] = t_us / 5 / 1000.0
                log({"kind": "launches", "causal": causal, "n": n, "ms_per_launch": per})
            except Exception as e:  # noqa: BLE001  (the profile is a help, the A/B still runs)
                log({"kind": "launches", "causal": causal, "n": n, "error": str(e)[:200]})
        # 2-3. the schedules and tiles
        for name, x, det in cs:
            if (128, causal, json.dumps(x)) in failed or late(15):
                continue
            row = {"kind": "ab", "causal": causal, "n": n, "name": name, "cfg": x, "deterministic": det}
            try:
                grads = attention_backward(q, k, v, o, lse, do, causal, deterministic=det, config=x or None)
                if ref is not None:
                    row["rel_err_vs_flash"] = [rel_err(g, r) for g, r in zip(grads, ref, strict=True)]
                ms = bench(
                    lambda x=x, det=det: attention_backward(q, k, v, o, lse, do, causal, deterministic=det,
                                                            config=x or None)
                )  # fmt: skip
                row.update(bwd_ms=ms, vs_cudnn=cudnn / ms)
            except Exception as e:  # noqa: BLE001  (a configuration that does not build is a result)
                row["error"] = str(e)[:200]
            log(row)

    # the schedules at every shape first, then the tiles: a deadline cuts the tiles, not the schedules
    for first in (True, False):
        for causal, cs in cands.items():
            for n in NS:
                if late(30):
                    break
                shape(causal, n, [c for c in cs if (c[0].split()[0] in ("dkdv", "dq")) != first], first)
                torch.cuda.empty_cache()
    print("wrote", path, f"in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
