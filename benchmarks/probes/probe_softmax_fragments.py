"""Probe: why the one-tile fragments path (softmax ``VEC``) is slower than expected at some odd widths.

    PYTHONPATH=. python3 benchmarks/probes/probe_softmax_fragments.py            (GPU clock, share of copy)
    PYTHONPATH=. python3 benchmarks/probes/probe_softmax_fragments.py --one N V   (one call, for ncu)

For each width: the package's forward with fragments (VEC 8) and without (the schedule strided rows
take), and the aligned width below it (n - n % 8) for scale; 128 MiB of bf16 each.
"""

from __future__ import annotations

import sys

import torch
import triton

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels import softmax as S

WIDTHS = (1001, 2049, 4097, 5001, 8191, 8193, 12289, 16385)


def _x(n):
    rows = 2**26 // n
    g = torch.Generator(device="cuda").manual_seed(0)
    return torch.randn(rows, n, device="cuda", dtype=torch.bfloat16, generator=g) * 3


def _run(x, packed, warps=1, maxnreg=None):
    cfg = S.softmax_config(x.shape[0], x.shape[1], x.dtype, packed=packed, fragments=packed)
    cfg = {**cfg, "num_warps": min(32, cfg["num_warps"] * warps), "maxnreg": maxnreg}
    return lambda: S._forward(x, S._rows(x), cfg), cfg


def main():
    if sys.argv[1:2] == ["--one"]:
        x = _x(int(sys.argv[2]))
        fn, cfg = _run(x, bool(int(sys.argv[3])))
        fn()
        torch.cuda.synchronize()
        print(cfg)
        return
    copy = bench.measure_copy_bandwidth()
    dev = torch.cuda.get_device_name()
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s")
    for n in WIDTHS:
        out = []
        variants = [(n, True, {}), (n, False, {}), (n - n % 8, True, {})]
        for warps in (1, 2):
            for reg in (None, 32, 40, 48):
                if (warps, reg) != (1, None):
                    variants.append((n, True, {"warps": warps, "maxnreg": reg}))
        for width, packed, knobs in variants:
            x = _x(width)
            fn, cfg = _run(x, packed, **knobs)
            y = fn()
            err = (y[-8:].double() - torch.softmax(x[-8:].double(), -1)).abs().max().item()
            ms = bench.queued_ms(fn)
            share = 2 * x.numel() * 2 / ms / 1e6 / copy
            how = f"VEC {cfg.get('VEC', 1)} BLOCK_N {cfg['BLOCK_N']} w{cfg['num_warps']} r{cfg['maxnreg']}"
            out.append(f"{width} {how} {share:6.1%} err {err:.0e}")
        print("\n    ".join(out), flush=True)


if __name__ == "__main__":
    main()
