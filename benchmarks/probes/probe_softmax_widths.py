"""Probe: the softmax forward at awkward row widths (benchmarks/notes_softmax.md, 2026-11-24 "widths that are not
powers of two").

    PYTHONPATH=. python3 benchmarks/probes/probe_softmax_widths.py [5000,5120 ...: these widths only]

Lesson 4's sweep times powers of two. Rows of other widths pad their tile to the next power of two,
and widths that are not a multiple of 16 elements are not known to start on 16-byte boundaries. Here:
128 MiB of bf16 at each width, the package's forward against torch.softmax, share of copy by two
trips on the GPU clock; each checked against float64 first.
"""

from __future__ import annotations

import sys

import torch
import triton

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels import softmax as S

WIDTHS = (1000, 1001, 2049, 3000, 4097, 5000, 5001, 6144, 8191, 8193, 10000, 11008, 12288, 12289, 16385, 17000)
WIDTHS += (20000, 24576, 32000, 32767)
WIDTHS += (32768, 50257, 65537, 100000, 128256)


def main():
    copy = bench.measure_copy_bandwidth()
    dev = torch.cuda.get_device_name()
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s", flush=True)
    widths = [int(v) for v in sys.argv[1].split(",")] if len(sys.argv) > 1 else WIDTHS
    for n in widths:
        rows = 2**26 // n
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16, generator=g) * 3
        want = torch.softmax(x[-16:].double(), dim=-1)
        err = (S.softmax(x)[-16:].double() - want).abs().max().item()
        cfg = S.softmax_config(rows, n, x.dtype)
        how = (
            "split"
            if cfg.get("SPLIT")
            else "persistent"
            if cfg.get("programs")
            else ("one tile" if cfg["SINGLE_TILE"] else "online")
        )
        nb = 2 * x.numel() * 2
        ours = bench.queued_ms(lambda: S.softmax(x))
        theirs = bench.queued_ms(lambda: torch.softmax(x, dim=-1))
        other = ""
        frag = S.softmax_config(rows, n, x.dtype, fragments=True)
        if frag.get("VEC"):  # odd rows: the opt-in fragments beside the default
            layout = S._rows(x)
            ms = bench.queued_ms(lambda: S._forward(x, layout, frag))
            other = f"  fragments (BLOCK_N {frag['BLOCK_N']}) {nb / ms / 1e6 / copy:6.1%}"
        if cfg.get("TAIL_N"):  # a head and a tail: beside the one padded tile (its warps), twice the warps
            layout = S._rows(x)
            for name, alt in (
                ("one tile", {**cfg, "BLOCK_N": 2 * cfg["BLOCK_N"], "TAIL_N": 0, "num_warps": 2 * cfg["num_warps"]}),
                ("twice the warps", {**cfg, "num_warps": min(32, cfg["num_warps"] * 2)}),
            ):
                ms = bench.queued_ms(lambda alt=alt: S._forward(x, layout, alt))
                other += f"  {name} {nb / ms / 1e6 / copy:6.1%}"
        print(
            f"  {rows:>6} x {n:<6} {how:10s} BLOCK_N {cfg['BLOCK_N']:>5} w{cfg['num_warps']:<2} "
            f"VEC {cfg.get('VEC', 1)} TAIL {cfg.get('TAIL_N', 0)} "
            f"ours {ours:7.4f} ms {nb / ours / 1e6 / copy:6.1%}  torch {nb / theirs / 1e6 / copy:6.1%}  err {err:.0e}"
            + other,
            flush=True,
        )
        x = None


if __name__ == "__main__":
    main()
