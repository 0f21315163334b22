"""Where a batch-1 decode attention call's host time goes on a GPU machine, piece by piece, and what the
last-split combine costs the GPU beside the combine kernel.

    PYTHONPATH=. python3 benchmarks/probes/probe_decode_host.py [--out $OUT]

B 1, 32 query heads, 8 KV heads, D 128, bf16, a 4k cache with lengths. Host microseconds per call (the
stream held by a sleep kernel, ``bench_decode.host_us``, the fastest of five rounds over every row) of:
the whole call, each step of it alone (the shared input check, the length check, O's allocation, the
plan, the per-stream scratch, the specialisation key, the launch through the package's Launcher with
the arguments ready; Triton's C launcher alone, given tensors or their pointers as ints: a tensor costs
it a ``data_ptr()`` call and a ``cuPointerGetAttribute``), SDPA, and an empty Triton kernel of as many
arguments through the Launcher (the floor of one launch). Then GPU time (``bench_decode.graph_us``) at
B 1 and 4 with 1k to 16k keys: the last split combining against the combine kernel and SDPA.
JSON: ``$OUT/probe_decode_host.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from benchmarks.bench_decode import graph_us, host_us
from fusionlab import _triton, bench
from fusionlab.kernels import _attention
from fusionlab.kernels import attention_decode as AD
from fusionlab.kernels._launch import Launcher, current_device

H, H_KV, D = 32, 8, 128


@triton.jit
def _empty_kernel(a, b, c, d, e, f, g, i0, i1, i2, i3, x0, s0, s1, s2, s3, s4, s5, s6, s7, s8,
                  C0: tl.constexpr, C1: tl.constexpr):  # fmt: skip
    pass


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    args = p.parse_args()
    res = {"meta": {**bench.metadata(), "command": " ".join(sys.argv)}, "host_us": {}, "graph_us": {}}
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, H, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, H_KV, 4096, D, device="cuda", dtype=torch.bfloat16, generator=g)
    lens = torch.full((1,), 4000, device="cuda", dtype=torch.int32)
    with torch.no_grad():
        o = AD.attention_decode(q, k, k, lens)
        dev = current_device()
        plan = AD._plan(q.shape, k.shape, True, True, None, (), dev)
        ws, counts = AD._scratch(dev, q, plan.ws_numel, plan.grid[1])
        qs, ks = q.stride(), k.stride()
        key = (q.shape, qs, k.shape, ks, ks, q.dtype, lens.dtype, True, (), 0, 0, 0, 0)
        empty = Launcher(_empty_kernel)
        AD._launch_split(plan.grid, q, k, k, lens, o, ws, counts, *plan.ints, qs[0], qs[1], qs[2], ks[0], ks[1], ks[2],
                         ks[0], ks[1], ks[2], key=key, **plan.meta)  # fmt: skip
        _, run, function, packed, tail = AD._launch_split._compiled[(key, dev)]
        stream = _triton.current_stream(dev)
        scalars = (*plan.ints, qs[0], qs[1], qs[2], ks[0], ks[1], ks[2], ks[0], ks[1], ks[2])
        tensors = (q, k, k, lens, o, ws, counts)
        ints = tuple(t.data_ptr() for t in tensors)

        def raw(ptrs):  # Triton's C launcher alone, as the Launcher's fast path calls it
            run(plan.grid[0], plan.grid[1], 1, stream, function, packed, None, None, None, *ptrs, *scalars, *tail)

        ptrs = (q, k, k, lens, o, ws, counts)
        rows = {
            "attention_decode (cache_len)": lambda: AD.attention_decode(q, k, k, lens),
            "attention_decode (no cache_len)": lambda: AD.attention_decode(q, k, k),
            "attention_decode, combine kernel": lambda: AD.attention_decode(q, k, k, lens,
                                                                            config={"LAST_COMBINES": False}),
            "sdpa": lambda: F.scaled_dot_product_attention(q, k, k, enable_gqa=True),
            "check_inputs": lambda: _attention.check_inputs(q, k, k, True, None, op=AD.OP),
            "_check_len": lambda: AD._check_len(lens, 1, 4096, q.device),
            "empty_like(q)": lambda: torch.empty_like(q),
            "current_device": current_device,
            "_plan (cached)": lambda: AD._plan(q.shape, k.shape, True, True, None, (), dev),
            "_scratch": lambda: AD._scratch(dev, q, plan.ws_numel, plan.grid[1]),
            "the key": lambda: (q.shape, q.stride(), k.shape, k.stride(), k.stride(), q.dtype, lens.dtype, True, (),
                                q.data_ptr() & 15, k.data_ptr() & 15, k.data_ptr() & 15, lens.data_ptr() & 15),
            "the split launch, arguments ready": lambda: AD._launch_split(
                plan.grid, q, k, k, lens, o, ws, counts, *plan.ints, qs[0], qs[1], qs[2], ks[0], ks[1], ks[2],
                ks[0], ks[1], ks[2], key=key, **plan.meta),
            "Triton's C launcher, tensors": lambda: raw(tensors),
            "Triton's C launcher, pointers as ints": lambda: raw(ints),
            "an empty kernel, 21 arguments, Launcher": lambda: empty(
                (1,), *ptrs, 8, 4096, 256, 512, 0.1, *qs[:3], *ks[:3], *ks[:3], key=("e",), C0=1, C1=2),
            "torch.empty (4096 fp32)": lambda: torch.empty(4096, device="cuda"),
        }  # fmt: skip
        for _ in range(5):
            for name, fn in rows.items():
                try:
                    res["host_us"][name] = min(res["host_us"].get(name, float("inf")), host_us(fn))
                except Exception as e:
                    res["host_us"][name] = f"{type(e).__name__}: {str(e)[:200]}"
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in res["host_us"].items()},
                         indent=0), flush=True)  # fmt: skip
        for B, n in ((1, 1024), (1, 4096), (1, 16384), (4, 4096)):
            q2 = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
            k2 = torch.randn(B, H_KV, n, D, device="cuda", dtype=torch.bfloat16, generator=g)
            row = {
                "last split": graph_us(lambda: AD.attention_decode(q2, k2, k2)),
                "combine kernel": graph_us(lambda: AD.attention_decode(q2, k2, k2, config={"LAST_COMBINES": False})),
                "sdpa": graph_us(lambda: F.scaled_dot_product_attention(q2, k2, k2, enable_gqa=True)),
            }  # fmt: skip
            res["graph_us"][f"B={B} N_k={n}"] = row
            print(B, n, {k: round(v, 2) for k, v in row.items()}, flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "probe_decode_host.json"), "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
