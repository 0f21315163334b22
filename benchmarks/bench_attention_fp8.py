"""Lesson 8's FP8 step on a GPU: the e4m3 forward against the package's bf16 forward, error against float64.

    PYTHONPATH=. python3 benchmarks/bench_attention_fp8.py --out $OUT [--deadline 170] [--no-sweep] [--workers 14]

First the sweep (unless ``--no-sweep``): at head dims 128 and 64, N = 4k and 16k, causal and not, every
tile of ``SWEEP`` with the kernel's REF schedule (block 0's max as a fixed reference, no rescale) off
and on; the rest of the run takes the fastest per (head dim, causal). Then the correctness gate at those
tiles, on small shapes (N = 1, 17, 1000, 1025, N_q != N_k, causal and not, head dims 32, 64, 128): the
FP8 forward's error against float64 of the bf16 inputs (``o``, ``lse``) and against the exact attention
of its dequantised inputs (``o_kernel``: what the kernel itself adds), beside the bf16 forward's own
error — :func:`fusionlab.kernels.attention_fp8.attention_fp8_error`. Then the timing, at 16k x 16
token-heads (B = 16384 / N, H = 16), head dims 128 and 64, N = 4k, 8k, 16k, causal and not: the
package's bf16 forward (``attention``, its defaults), the FP8 kernel on inputs already quantised (what a
model whose previous layer writes e4m3 pays), and the quantisation alone (``quantize_fp8``, plain
torch). TFLOP/s count the forward's FLOPs (``attention_flops``) for both. JSON:
``$OUT/attention_fp8.json``; one line per row on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import traceback

import torch
import triton

#: (BLOCK_M, BLOCK_N, num_warps, num_stages) tried per head dim, each with the REF schedule off and on (the
#: 2026-11-27 H100 sweep's fastest at 128, and 256-row tiles on two warpgroups, each of 128 rows as the
#: fastest 4-warp tile; at 64, where (128, 128, 8, 3) lost to bf16, smaller ones)
SWEEP = {128: [(128, 128, 4, 3), (128, 128, 4, 4), (128, 64, 4, 3), (64, 64, 4, 3), (256, 128, 8, 2), (256, 64, 8, 3),
               (128, 256, 8, 2)],
         64: [(128, 64, 4, 3), (64, 64, 4, 3), (128, 128, 4, 3)]}  # fmt: skip
GATE = [  # (B, H, N_q, N_k, D, causal)
    (1, 2, 1, 1, 64, False), (1, 2, 17, 17, 64, True), (2, 3, 1000, 1000, 128, True), (1, 2, 1025, 1025, 128, False),
    (1, 2, 1025, 700, 64, True), (1, 2, 300, 1100, 32, False), (1, 4, 4096, 4096, 128, False),
    (1, 4, 4096, 4096, 128, True),
]  # fmt: skip


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")


def config_of(tile):
    """A sweep tile, (BLOCK_M, BLOCK_N, warps, stages, REF), as the kernel's config (None: the defaults)."""
    if tile is None:
        return None
    bm, bn, nw, ns, ref = tile
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": nw, "num_stages": ns, "REF": bool(ref)}


def _compile_worker(tasks):
    """Run each (head dim, causal, tile) once at N = 4096 (the timed shapes' specialisation): fills Triton's
    on-disk cache for the timing process. Returns the tasks that failed, with why."""
    from fusionlab.kernels.attention_fp8 import attention_fp8_quantized, quantize_fp8

    failed = []
    for d, causal, tile in tasks:
        try:
            q, k, v = (torch.randn(1, 2, 4096, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            attention_fp8_quantized(quantize_fp8(q, k, v, tile[0], tile[1]), causal, config=config_of(tile))
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001  (a tile that does not build is a result: the sweep records it)
            failed.append((d, causal, tile, f"{type(e).__name__}: {e}"[:200]))
    return failed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--deadline", type=float, default=170.0, help="seconds after which no new case starts")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--workers", type=int, default=0, help="compile the sweep's launches in this many processes first")
    a = ap.parse_args()
    t0 = time.time()
    from fusionlab.kernels.attention import attention, attention_flops
    from fusionlab.kernels.attention_fp8 import (
        attention_fp8_config,
        attention_fp8_error,
        attention_fp8_quantized,
        quantize_fp8,
    )

    rows = [{"kind": "device", "name": torch.cuda.get_device_name(), "torch": torch.__version__,
             "triton": triton.__version__, "date": time.strftime("%Y-%m-%d")}]  # fmt: skip
    path = os.path.join(a.out, "attention_fp8.json")

    def log(row):
        rows.append(row)
        print(
            " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items())[:300], flush=True
        )
        os.makedirs(a.out, exist_ok=True)
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)

    def late():
        return time.time() - t0 > a.deadline

    def shape_inputs(d, n):
        B, H = max(1, 16384 // n), 16
        g = torch.Generator(device="cuda").manual_seed(0)
        return [torch.randn(B, H, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3)]

    def time_fp8(q, k, v, causal, tile):
        cfg = config_of(tile)
        bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
        x = quantize_fp8(q, k, v, bm, bn)
        o, _ = attention_fp8_quantized(x, causal, config=cfg)
        ok = bool(torch.isfinite(o).all())
        return (
            bench(lambda: attention_fp8_quantized(x, causal, config=cfg)),
            ok,
            bench(lambda: quantize_fp8(q, k, v, bm, bn)),
        )

    best = {}  # (d, causal) -> the sweep's fastest (BLOCK_M, BLOCK_N, warps, stages, REF)
    if not a.no_sweep and a.workers:  # every sweep launch compiled first, in parallel
        import multiprocessing as mp

        tasks = [(d, c, (*t, ref)) for d in SWEEP for c in (False, True) for t in SWEEP[d] for ref in (False, True)]
        with mp.get_context("spawn").Pool(a.workers) as pool:
            failed = [f for part in pool.map(_compile_worker, [tasks[i :: a.workers] for i in range(a.workers)])
                      for f in part]  # fmt: skip
        log({"kind": "compiled", "tasks": len(tasks), "seconds": time.time() - t0, "failed": failed})
    if not a.no_sweep:
        for d in (128, 64):
            for causal in (False, True):
                totals, counts = {}, {}
                for n in (4096, 16384):
                    q, k, v = shape_inputs(d, n)
                    for tile in [(*t, ref) for t in SWEEP[d] for ref in (False, True)]:
                        if late():
                            break
                        row = {"kind": "sweep", "d": d, "n": n, "causal": causal, "tile": list(tile)}
                        try:
                            ms, ok, _ = time_fp8(q, k, v, causal, tile)
                            row.update(ms=ms, finite=ok, tflops=attention_flops(*q.shape[:3], n, d, causal) / ms * 1e-9)
                            if ok:
                                totals[tile] = totals.get(tile, 0.0) + ms
                                counts[tile] = counts.get(tile, 0) + 1
                        except Exception as e:  # noqa: BLE001  (a tile Triton cannot build is a result)
                            row["error"] = f"{type(e).__name__}: {e}"[:300]
                        log(row)
                full = {t: ms for t, ms in totals.items() if counts[t] == 2}  # timed at both N
                if full:
                    best[(d, causal)] = min(full, key=full.get)
                    log({"kind": "chosen", "d": d, "causal": causal, "tile": list(best[(d, causal)])})

    # the gate, at the chosen tiles: FP8 and bf16 against float64
    for B, H, nq, nk, d, causal in GATE:
        g = torch.Generator(device="cuda").manual_seed(1)
        q = torch.randn(B, H, nq, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(B, H, nk, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        row = {"kind": "gate", "shape": [B, H, nq, nk, d], "causal": causal, "tile": best.get((d, causal))}
        try:
            row.update(attention_fp8_error(q, k, v, causal, config=config_of(best.get((d, causal)))))
            from fusionlab.kernels._attention import scores64

            s, _, vd = scores64(q, k, v, causal, None)
            o64 = torch.softmax(s, -1) @ vd
            ob, _ = attention(q, k, v, causal)
            row["o_bf16"] = float((ob.double() - o64).norm() / o64.norm())
            row["ok"] = row["o"] < 0.08 and row["o_kernel"] < 0.04 and row["lse"] < 0.25
        except Exception as e:  # noqa: BLE001  (a failing case is a result; the timing still runs)
            row.update(ok=False, error=f"{type(e).__name__}: {e}"[:300], trace=traceback.format_exc()[-600:])
        log(row)

    for d in (128, 64):
        for causal in (False, True):
            for n in (4096, 8192, 16384):
                if late():
                    break
                q, k, v = shape_inputs(d, n)
                flops = attention_flops(*q.shape[:3], n, d, causal)
                cfg = attention_fp8_config(d, causal, n)
                tile = best.get((d, causal)) or (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"], cfg["num_stages"],
                                                 cfg["REF"])  # fmt: skip
                row = {"kind": "time", "d": d, "n": n, "causal": causal, "tile": list(tile)}
                try:
                    bf16_ms = bench(lambda q=q, k=k, v=v, c=causal: attention(q, k, v, c))
                    fp8_ms, ok, quant_ms = time_fp8(q, k, v, causal, tile)
                    row.update(bf16_ms=bf16_ms, fp8_ms=fp8_ms, quant_ms=quant_ms, finite=ok,
                               bf16_tflops=flops / bf16_ms * 1e-9, fp8_tflops=flops / fp8_ms * 1e-9,
                               speedup=bf16_ms / fp8_ms, speedup_with_quant=bf16_ms / (fp8_ms + quant_ms))  # fmt: skip
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {e}"[:300]
                log(row)
    print("wrote", path, f"in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
