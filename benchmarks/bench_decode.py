"""Lesson 9 on a GPU: flash-decoding (``attention_decode``) against SDPA, kernel time and host time per call.

    PYTHONPATH=. python3 benchmarks/bench_decode.py [--out $OUT] [--no-sweep] [--budget 160]

Shapes: one query token per row, Llama-3-8B's heads (32 query heads, 8 KV heads, D 128), bf16, batch
B in 1, 4, 16, 64 and a KV cache of N_k in 1k, 4k, 16k, 32k keys. Per shape: the package's decode
kernel at its default configuration, SDPA (``enable_gqa=True``, whichever backend it picks) and the
package's prefill kernel ``attention()`` (one program per head and query tile, no split over the keys),
and where the default splits the keys, the decode kernel with the combine in a kernel of its own
(``LAST_COMBINES=False``),
each checked against SDPA's O first (norm-relative error < 1e-2, no NaN). Then at a few shapes each
row with its own cache length (uniform in [N_k/2, N_k]) against SDPA with a boolean mask. Kernel time:
``graph_us`` (calls in a CUDA graph, L2 flushed before each: the GPU's time alone; the ratios use it)
and ``fusionlab.bench.time_ms`` (do_bench median, L2 flushed: the host's time too where a call costs it
more than the GPU). Host time per call: the stream held by a sleep kernel while the host queues 200
calls (what a call costs the CPU, the GPU out of the way), at B 1, N_k 4k, in rounds over the functions.
The sweep (skipped with ``--no-sweep``): SPLITS x BLOCK_N x num_warps x num_stages at seven shapes, to
test the default's split rule. Stops starting new work after ``--budget`` seconds. JSON goes to
``$OUT/decode.json``; a compact table (graph times) is printed last.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

import fusionlab
from fusionlab import bench
from fusionlab.kernels.attention import attention
from fusionlab.kernels.attention_decode import attention_decode, attention_decode_config

H, H_KV, D = 32, 8, 128
BS = (1, 4, 16, 64)
NKS = (1024, 4096, 16384, 32768)
SWEEP_SHAPES = ((1, 1024), (1, 4096), (1, 32768), (4, 16384), (16, 4096), (64, 4096), (64, 32768))
SPLITS = (1, 2, 4, 8, 16, 32, 64, 128)
TILES = [dict(BLOCK_N=bn, num_warps=w, num_stages=s) for bn, w, s in itertools.product((32, 64, 128), (4, 8), (2, 3))]


def host_us(fn, calls: int = 200) -> float:
    """Host microseconds per call: a sleep kernel holds the stream while the host queues ``calls``
    calls, so the GPU never sets the pace (50 ms of sleep covers 200 calls of up to 250 us)."""
    fn()
    torch.cuda.synchronize()
    torch.cuda._sleep(int(2e9 * 0.05))
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return 1e6 * (t1 - t0) / calls


_FLUSH: list = []


def graph_us(fn, reps: int = 20) -> float:
    """GPU microseconds per call with the host out of the way and L2 flushed before each call: ``reps``
    x (flush, call) captured in one CUDA graph, minus ``reps`` flushes alone, per call (fastest of three
    replays). A small decode call costs the host more than the GPU, and do_bench then times the host."""
    if not _FLUSH:
        # 128 MiB: over twice an H100's or H200's 50 MB L2, and a short memset, so that the flush's own
        # time (subtracted) varies little beside a 10 us kernel
        _FLUSH.append(torch.empty(128 * 2**20, dtype=torch.int8, device="cuda"))
    flush = _FLUSH[0]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture (compiles, allocator pools)
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graphs = []
    for with_call in (True, False):
        g = torch.cuda.CUDAGraph()
        # captured on the warmed stream: attention_decode's per-stream counters exist there, so the graph
        # holds what an eager call launches (on a fresh stream a capture takes the combine kernel)
        with torch.cuda.graph(g, stream=side):
            for _ in range(reps):
                flush.zero_()
                if with_call:
                    fn()
        graphs.append(g)
    times = []
    for g in graphs:
        best = float("inf")
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            g.replay()
            end.record()
            torch.cuda.synchronize()
            best = min(best, start.elapsed_time(end))
        times.append(best)
    return 1e3 * (times[0] - times[1]) / reps


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


class Run:
    def __init__(self, out: str, budget: float):
        self.out, self.t0, self.budget = out, time.time(), budget
        self.data = {
            "meta": {**bench.metadata(), "command": " ".join(sys.argv), "fusionlab": fusionlab.__file__},
            "rows": [],
            "lengths": [],
            "host": {},
            "sweep": [],
        }

    def left(self) -> float:
        return self.budget - (time.time() - self.t0)

    def save(self):
        os.makedirs(self.out, exist_ok=True)
        with open(os.path.join(self.out, "decode.json"), "w") as f:
            json.dump(self.data, f, indent=1)


def inputs(B: int, N_k: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, H_KV, N_k, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(B, H_KV, N_k, D, device="cuda", dtype=torch.bfloat16, generator=g)
    return q, k, v


def timed(fn, ref, *, fast: bool = False, graph: bool = True) -> dict:
    try:
        out = fn()
        err = rel_err(out, ref)
        if not err < 1e-2:
            return {"error": f"wrong answer: norm-relative error {err:.3g}"}
        out = {"err": err}
        if graph:
            out["graph_us"] = graph_us(fn, reps=10 if fast else 20)
        if not fast:
            out["us"] = 1e3 * bench.time_ms(fn)
        return out
    except Exception as e:  # a configuration that does not compile or launch: recorded, not fatal
        return {"error": f"{type(e).__name__}: {str(e)[:200]}"}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--budget", type=float, default=160.0)
    args = p.parse_args()
    run = Run(args.out, args.budget)
    print(run.data["meta"], flush=True)

    # -- host time per call, at a small shape (the GPU finishes first) --------------------------------
    q, k, v = inputs(1, 4096)
    lens = torch.full((1,), 4000, device="cuda", dtype=torch.int32)
    host = {
        "attention_decode": lambda: attention_decode(q, k, v),
        "attention_decode, cache_len": lambda: attention_decode(q, k, v, lens),
        "attention_decode, combine kernel": lambda: attention_decode(q, k, v, lens, config={"LAST_COMBINES": False}),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
        "attention (prefill kernel)": lambda: attention(q, k, v),
        "torch.empty (one allocation)": lambda: torch.empty(4096, device="cuda"),
    }
    for _ in range(5):  # rounds over every function in turn: a slow moment of the host hits all alike
        for name, fn in host.items():
            run.data["host"][name] = min(run.data["host"].get(name, float("inf")), host_us(fn))
    run.save()
    print("host us/call:", {k: round(v, 1) for k, v in run.data["host"].items()}, flush=True)

    # -- kernel time per shape -----------------------------------------------------------------------
    for B, N_k in itertools.product(BS, NKS):
        if run.left() < 0:
            break
        q, k, v = inputs(B, N_k)
        ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        row = {"B": B, "N_k": N_k, "config": attention_decode_config(B, H, H_KV, 1, N_k, D)}
        row["decode"] = timed(lambda q=q, k=k, v=v: attention_decode(q, k, v), ref)
        if row["config"]["SPLITS"] > 1:  # the combine in a second kernel, not in each KV head's last split
            cfg = {"LAST_COMBINES": False}
            row["decode, combine kernel"] = timed(lambda q=q, k=k, v=v: attention_decode(q, k, v, config=cfg), ref,
                                                  fast=True)  # fmt: skip
        row["sdpa"] = timed(lambda q=q, k=k, v=v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), ref)
        # the prefill kernel, for the record: do_bench only (not captured, so no capture can fail the run)
        row["attention"] = timed(lambda q=q, k=k, v=v: attention(q, k, v)[0], ref, graph=False)
        if "graph_us" in row["decode"] and "graph_us" in row["sdpa"]:
            row["ratio"] = row["decode"]["graph_us"] / row["sdpa"]["graph_us"]
        kv_bytes = 2 * B * H_KV * N_k * D * 2
        if "graph_us" in row["decode"]:
            row["decode_gbps"] = kv_bytes / (row["decode"]["graph_us"] * 1e3)
        run.data["rows"].append(row)
        run.save()
        print(json.dumps(row), flush=True)
        del q, k, v, ref

    # -- each row its own length ---------------------------------------------------------------------
    for B, N_k in ((4, 4096), (16, 16384), (64, 4096)):
        if run.left() < 0:
            break
        q, k, v = inputs(B, N_k, seed=1)
        g = torch.Generator(device="cuda").manual_seed(2)
        lens = torch.randint(N_k // 2, N_k + 1, (B,), device="cuda", generator=g)
        mask = (torch.arange(N_k, device="cuda")[None, :] < lens[:, None])[:, None, None, :]
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        row = {"B": B, "N_k": N_k}
        row["decode"] = timed(lambda q=q, k=k, v=v, lens=lens: attention_decode(q, k, v, lens), ref)
        row["sdpa_mask"] = timed(
            lambda q=q, k=k, v=v, m=mask: F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True), ref
        )
        run.data["lengths"].append(row)
        run.save()
        print(json.dumps(row), flush=True)

    # -- the sweep ------------------------------------------------------------------------------------
    if not args.no_sweep:
        for B, N_k in SWEEP_SHAPES:
            q, k, v = inputs(B, N_k)
            ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            best = None
            for tile, splits in itertools.product(TILES, SPLITS):
                if run.left() < 0 or splits * tile["BLOCK_N"] > N_k:
                    continue
                cfg = dict(tile, SPLITS=splits)
                r = timed(lambda q=q, k=k, v=v, cfg=cfg: attention_decode(q, k, v, config=cfg), ref, fast=True)
                run.data["sweep"].append({"B": B, "N_k": N_k, "config": cfg, **r})
                if "graph_us" in r and (best is None or r["graph_us"] < best[0]):
                    best = (r["graph_us"], cfg)
            run.save()
            print(f"sweep B={B} N_k={N_k}: best {best}", flush=True)

    # -- the table --------------------------------------------------------------------------------------
    head = ("B", 3), ("N_k", 6), ("splits", 6), ("decode us", 10), ("sdpa us", 8), ("ratio", 6), ("attention us", 12)
    print(" ".join(f"{name:>{w}}" for name, w in head), f"{'GB/s':>6}")
    for r in run.data["rows"]:
        us = lambda key, r=r: r[key].get("graph_us", r[key].get("us", float("nan")))  # noqa: E731
        print(
            f"{r['B']:>3} {r['N_k']:>6} {r['config']['SPLITS']:>6} {us('decode'):>10.1f} {us('sdpa'):>8.1f} "
            f"{r.get('ratio', float('nan')):>6.2f} {us('attention'):>12.1f} {r.get('decode_gbps', float('nan')):>6.0f}"
        )
    print(f"done in {time.time() - run.t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
