"""Probe: the cross-entropy loss alone (no gradient: ``torch.no_grad()``, evaluation), which tiles
(benchmarks/notes_lesson5.md, 2026-11-24 "the copy engine, the loss alone's tiles, larger split parts").

    PYTHONPATH=. python3 benchmarks/probes/probe_ce_forward.py

``probe_ce_tma.py`` found that on the H200 a plain read of 8192 x 128256 bf16 logits, one 32-warp
program a row walking tiles of 8192, runs at 100% of copy, while the package's forward alone ran at
75%. The package sizes its tiles for the fused gradient: a head of up to 64 KiB kept in registers for
the second sweep (one program an SM), and L2 hints for tiles read again. A forward alone reads each
row once and needs neither. Configurations of the package kernel (``_loss`` without a gradient,
"mean", bf16, no ignored rows), checked against float64, share of copy by one read on the GPU clock.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels.cross_entropy import _loss, cross_entropy_config

SHAPES = ((8192, 32000), (4096, 32000), (8192, 50257), (8192, 128256), (8192, 151936), (4096, 262144))


def configs(vocab):
    base = cross_entropy_config(vocab, torch.bfloat16)
    base = {k: v for k, v in base.items() if not k.startswith("SPLIT")}
    plain = {**base, "PREFETCH": False, "PREFETCH2": False, "EVICT": False, "EARLY_HEAD": False}
    out = {"shipped": base}
    for head, block, warps, stages in (
        (8192, 8192, 32, 1),
        (8192, 8192, 16, 1),
        (16384, 8192, 32, 1),
        (4096, 4096, 8, 3),
        (8192, 4096, 8, 3),
        (8192, 8192, 16, 2),
        (4096, 4096, 4, 3),
        (2048, 2048, 4, 3),
        (4096, 4096, 8, 4),
        (4096, 2048, 4, 4),
    ):
        label = f"head {head} tile {block} w{warps} s{stages}"
        out[label] = {**plain, "HEAD": head, "BLOCK_N": block, "num_warps": warps, "LOOP_STAGES": stages}
    return out


def main():
    copy = bench.measure_copy_bandwidth()
    dev = torch.cuda.get_device_name()
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s", flush=True)
    for tokens, vocab in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16, generator=g) * 2
        t = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
        ts = t[:256].clone()
        ts[::7] = -100  # ignored rows checked; the timed rows are all counted (an ignored row reads nothing)
        want = F.cross_entropy(x[:256].double(), ts).item()
        for label, cfg in configs(vocab).items():
            try:
                got = _loss(x[:256], ts, None, -100, "mean", 0.0, cfg).double().item()
                err = abs(got - want) / abs(want)
                ms = bench.queued_ms(lambda cfg=cfg: _loss(x, t, None, -100, "mean", 0.0, cfg))
                share = x.numel() * 2 / ms / 1e6 / copy
                print(f"  {tokens:>5} x {vocab:<6} {label:30s} {ms:7.4f} ms {share:6.1%} err {err:.0e}", flush=True)
            except Exception as e:  # a configuration that does not compile: say so, go on
                print(f"  {tokens:>5} x {vocab:<6} {label:30s} failed: {type(e).__name__} {str(e)[:150]}", flush=True)
        x = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
