"""Probe: cross-entropy rows held whole in registers, and the head loaded before the target is known
(benchmarks/notes_lesson5.md, 2026-11-24 "the small kernels around the fused call").

    PYTHONPATH=. python3 benchmarks/probes/probe_ce_single_tile.py [--narrow | --stages]

The shipped configuration for rows up to 64 Ki keeps a head of 8192 logits in registers (8 warps) and
streams the rest twice (sweep 2 re-reads it from L2). The softmax's one-tile kernel, with the same
traffic (read a row once, write it once), reaches 87-88% of copy at 4096 x 32768 on the H200; the same
one-tile schedule in cross-entropy reached only 76% at 8192 x 32000. One difference: the kernel loads
the row only after the branch on its target (an ignored row reads nothing), so every row waits for two
loads in turn; ``EARLY_HEAD`` issues the head's load before the branch. Configurations: shipped, the
whole row in one tile (``HEAD`` >= V) at 32 warps, each with and without ``EARLY_HEAD``; fwd+bwd bf16
"mean", no ignored rows, on the GPU clock. Each is checked against float64 on 64 rows (some ignored).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
import triton

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels.cross_entropy import CrossEntropyFunction, cross_entropy_config

SHAPES = ((8192, 32000), (4096, 32000), (8192, 50257), (8192, 65536), (8192, 128256))


def configs(vocab):
    base = cross_entropy_config(vocab, torch.bfloat16)
    out = {"shipped": base, "shipped, early head": {**base, "EARLY_HEAD": True}}
    tile = triton.next_power_of_2(vocab)
    if tile <= 65536:
        one = {**base, "HEAD": tile, "BLOCK_N": min(base["BLOCK_N"], tile), "num_warps": 32}
        out[f"one tile {tile} w32"] = one
        out[f"one tile {tile} w32, early"] = {**one, "EARLY_HEAD": True}
    return out


def narrow_configs(vocab):
    """``--narrow``: smaller programs for rows up to 32 Ki (more of them to an SM), with and without
    the early head: (HEAD, BLOCK_N, num_warps)."""
    base = cross_entropy_config(vocab, torch.bfloat16)
    out = {"shipped": base}
    for head, block, warps in ((8192, 4096, 4), (4096, 4096, 4), (8192, 2048, 4), (4096, 2048, 4), (8192, 8192, 8)):
        for early in (False, True):
            label = f"head {head} tile {block} w{warps}" + (", early" if early else "")
            out[label] = {**base, "HEAD": head, "BLOCK_N": block, "num_warps": warps, "EARLY_HEAD": early}
    return out


def stage_configs(vocab):
    """``--stages``: smaller heads with deeper pipelines (2026-11-24 "cross-entropy's loss alone and its split, read
    faster": the loss alone ran 8 points
    faster on the H200 with tiles of 4096 three deep): (HEAD, BLOCK_N, num_warps, LOOP_STAGES)."""
    base = cross_entropy_config(vocab, torch.bfloat16)
    out = {"shipped": base}
    for head, block, warps, stages in (
        (8192, 4096, 8, 4),
        (4096, 4096, 8, 3),
        (4096, 4096, 8, 4),
        (4096, 2048, 4, 4),
        (8192, 8192, 8, 3),
        (4096, 4096, 16, 4),
    ):
        label = f"head {head} tile {block} w{warps} s{stages}"
        out[label] = {**base, "HEAD": head, "BLOCK_N": block, "num_warps": warps, "LOOP_STAGES": stages}
    return out


def main():
    narrow = "--narrow" in sys.argv or "--stages" in sys.argv
    shapes = ((8192, 32000), (4096, 32000)) if narrow else SHAPES
    copy = bench.measure_copy_bandwidth()
    dev = torch.cuda.get_device_name()
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s", flush=True)
    for tokens, vocab in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16, generator=g) * 2
        t = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
        xg = x.clone().requires_grad_()
        nb = 2 * x.numel() * 2
        ts = t[:64].clone()
        ts[::5] = -100
        xs = x[:64].double().requires_grad_()
        (want_g,) = torch.autograd.grad(F.cross_entropy(xs, ts), xs)
        pick = stage_configs if "--stages" in sys.argv else narrow_configs if narrow else configs
        for label, cfg in pick(vocab).items():
            try:
                xc = x[:64].clone().requires_grad_()
                (got_g,) = torch.autograd.grad(CrossEntropyFunction.apply(xc, ts, -100, "mean", 0.0, False, cfg), xc)
                err = ((got_g.double() - want_g).norm() / want_g.norm()).item()

                def fn(cfg=cfg):
                    return torch.autograd.grad(CrossEntropyFunction.apply(xg, t, -100, "mean", 0.0, False, cfg), xg)

                msq = bench.queued_ms(fn)
                print(
                    f"  {tokens:>5} x {vocab:<6} {label:26s} GPU clock {msq:7.4f} ms {nb / msq / 1e6 / copy:6.1%}"
                    f"  grad rel err {err:.1e}",
                    flush=True,
                )
            except Exception as e:  # a configuration that does not compile (registers): say so, go on
                print(f"  {tokens:>5} x {vocab:<6} {label:26s} failed: {type(e).__name__} {str(e)[:150]}", flush=True)
        x = xg = None


if __name__ == "__main__":
    main()
