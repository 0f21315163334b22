"""Probe: cross-entropy's split rows, part size, warps and the early load (benchmarks/notes_lesson5.md,
ninth session).

    PYTHONPATH=. python3 benchmarks/probe_ce_split_tune.py

The split kernel holds a row in parts of ``SPLIT_BLOCK`` logits, one program each, which swap their
statistics: each row read once, written once. Shipped from 192 Ki columns with parts of 16 KiB at 4
warps; on the H200 it tied the head-and-tail kernel at 128256 (76%). Each part program waits for three
latencies in turn before its bulk load: the ticket (an atomic), the row's target, then the part.
``SPLIT_EARLY`` issues the part's load before the target's. fwd+bwd bf16 "mean" out of place, GPU
clock, share of copy by two trips; each configuration checked against float64 on 64 rows first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels.cross_entropy import CrossEntropyFunction, cross_entropy_config

SHAPES = ((8192, 128256), (8192, 151936), (4096, 262144), (8192, 65536))
PARTS = ((8192, 4), (16384, 2), (16384, 4), (32768, 4), (32768, 8))


def main():
    copy = bench.measure_copy_bandwidth()
    dev = torch.cuda.get_device_name()
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s", flush=True)
    for tokens, vocab in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16, generator=g) * 2
        t = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
        xg = x.clone().requires_grad_()
        ts = t[:64].clone()
        ts[::5] = -100
        xs = x[:64].double().requires_grad_()
        (want_g,) = torch.autograd.grad(F.cross_entropy(xs, ts), xs)
        base = {k: v for k, v in cross_entropy_config(vocab, torch.bfloat16).items() if not k.startswith("SPLIT")}
        configs = {"head-and-tail": base}
        for block, warps in PARTS:
            if triton.cdiv(vocab, block) > 64:
                continue
            for early in (False, True):
                label = f"split {block} w{warps}" + (" early" if early else "")
                split = {"SPLIT": triton.cdiv(vocab, block), "SPLIT_BLOCK": block, "SPLIT_WARPS": warps}
                configs[label] = {**base, **split, "SPLIT_EARLY": early}
        for label, cfg in configs.items():
            try:
                xc = x[:64].clone().requires_grad_()
                (got_g,) = torch.autograd.grad(CrossEntropyFunction.apply(xc, ts, -100, "mean", 0.0, False, cfg), xc)
                err = ((got_g.double() - want_g).norm() / want_g.norm()).item()

                def fn(cfg=cfg):
                    return torch.autograd.grad(CrossEntropyFunction.apply(xg, t, -100, "mean", 0.0, False, cfg), xg)

                ms = bench.queued_ms(fn)
                share = 2 * x.numel() * 2 / ms / 1e6 / copy
                print(f"  {tokens:>5} x {vocab:<6} {label:24s} {ms:7.4f} ms {share:6.1%}  err {err:.1e}", flush=True)
            except Exception as e:  # a configuration that does not compile: say so, go on
                print(f"  {tokens:>5} x {vocab:<6} {label:24s} failed: {type(e).__name__} {str(e)[:150]}", flush=True)
        x = xg = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
