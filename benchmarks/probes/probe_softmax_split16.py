"""Probe: the softmax's split schedule with cross-entropy's register diet (2026-11-25 "programmatic dependent launch
between a call's own kernels").

    PYTHONPATH=. python3 benchmarks/probes/probe_softmax_split16.py [--key]

Lesson 4's one miss is the H200's 4096 x 32768 bf16 softmax (87.7% of copy recorded, bar 90%), taken
by persistent one-tile programs. The package's split kernel (parts of 8192 bf16 that swap (max, sum)
and write their part) ran it at 85.4% in the 2026-11-24 "softmax rows split across programs"; it keeps the part's
exponentials, fp32,
across the wait. Cross-entropy's split kernel reached 90% at 128256 by keeping only the 16-bit part
across the wait (the exponentials made again after it from the part's bits: `_widen_by_bits`, which
the compiler cannot merge with the first widening) and capping the registers so more programs fit a
SM. Here the softmax gets the same: parts of 8192 or 16384 bf16, 4 warps, registers capped at 64-128,
against the package, on lesson 4's clock (`bench.time_ms`) and the GPU's (`bench.queued_ms`), each
checked against torch first. The "max by key" variants (written at the end of the 2026-11-25 "programmatic dependent
launch between a call's own kernels",
not yet run on a GPU) take the part's maximum from its 16-bit patterns, so that no fp32 copy of the
part is alive at once: the reason the first variants spilled (notes_softmax.md).
"""

from __future__ import annotations

import sys

import torch
import triton
import triton.language as tl

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels import softmax as sm
from fusionlab.kernels._cross_entropy_kernels import _widen_by_bits
from fusionlab.kernels._rows import _split_merge, _split_ticket, _split_wait


@triton.jit
def _split16_kernel(
    x_ptr,
    y_ptr,
    sync_ptr,
    part_ptr,
    n_cols,
    SPLIT: tl.constexpr,
    SPLIT_P2: tl.constexpr,
    BLOCK_N: tl.constexpr,
    AGAIN: tl.constexpr,
    KEY: tl.constexpr = False,
):
    row, part = _split_ticket(sync_ptr, SPLIT)
    offs = part * BLOCK_N + tl.arange(0, BLOCK_N)
    x16 = tl.load(x_ptr + row * n_cols + offs)  # rows are whole parts (the probe's widths)
    if KEY:
        # the part's maximum from its 16-bit patterns, no fp32 value: a bf16's bits as a signed integer,
        # the low 15 bits flipped for negative numbers, order as the floats do (every bf16 checked on a
        # CPU, NaN aside); then the sum streams (each exponential made as its element is widened)
        bits = x16.to(tl.int16, bitcast=True).to(tl.int32)
        mk = tl.max(bits ^ ((bits >> 15) & 0x7FFF), axis=0)
        m = ((mk ^ ((mk >> 15) & 0x7FFF)) << 16).to(tl.float32, bitcast=True)
        ref = tl.where(m == float("-inf"), 0.0, m)
        e = tl.exp(x16.to(tl.float32) - ref)
    else:
        x = x16.to(tl.float32)
        m = tl.max(x, axis=0)
        ref = tl.where(m == float("-inf"), 0.0, m)
        e = tl.exp(x - ref)
    d = tl.sum(e, axis=0)
    parts = part_ptr + row * (2 * SPLIT)
    tl.store(parts + part, m)
    tl.store(parts + SPLIT + part, d)
    _split_wait(sync_ptr, row, SPLIT)
    big, l = _split_merge(parts, SPLIT, SPLIT_P2)
    if AGAIN:  # only the 16-bit part crossed the wait: the exponentials again, from its bits
        y = tl.exp(_widen_by_bits(x16, "bf16") - big) * (1.0 / l)
    else:
        y = e * (tl.exp(ref - big) / l)
    tl.store(y_ptr + row * n_cols + offs, y.to(y_ptr.dtype.element_ty))


def split16(x, part, again, maxnreg, warps=4, key=False):
    rows, n = x.shape
    parts = n // part
    y = torch.empty_like(x)
    sync = torch.zeros(rows + 1, dtype=torch.int32, device=x.device)
    stats = torch.empty(rows * 2 * parts, dtype=torch.float32, device=x.device)
    kw = {"num_warps": warps}
    if maxnreg:
        kw["maxnreg"] = maxnreg
    k = _split16_kernel[(rows * parts,)](
        x,
        y,
        sync,
        stats,
        n,
        SPLIT=parts,
        SPLIT_P2=triton.next_power_of_2(parts),
        BLOCK_N=part,
        AGAIN=again,
        KEY=key,
        **kw,
    )
    return y, k


def main():
    copy = bench.measure_copy_bandwidth()
    dev = torch.cuda.get_device_name()
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s")
    # (part, again, cap, key); `--key`: only the maximum-by-key variants, beside the package
    variants = [
        (16384, True, 96, False),
        (16384, True, 128, False),
        (16384, False, None, False),
        (8192, True, 64, False),
        (8192, True, 80, False),
        (8192, False, None, False),
        (16384, True, 80, False),
    ]
    keyed = [(16384, True, 96, True), (16384, True, 128, True), (16384, True, None, True)]
    keyed += [(8192, True, 64, True), (8192, True, 80, True), (8192, True, None, True)]
    variants = keyed if "--key" in sys.argv else variants + keyed
    for rows, n in ((4096, 32768), (2048, 32768), (16384, 32768), (4096, 16384), (2048, 65536), (1024, 131072)):
        g = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(rows, n, device="cuda", generator=g) * 3).to(torch.bfloat16)
        x[0, 5] = float("-inf")
        x[1] = float("-inf")
        x[1, 7] = 2.0
        want = torch.softmax(x.float(), -1)
        nb = 2 * x.numel() * x.element_size()

        def show(label, fn):
            t, q = bench.time_ms(fn), bench.queued_ms(fn)
            print(
                f"  {label:40s} call {t * 1e3:7.1f} us {nb / t / 1e6 / copy:6.1%}  GPU {nb / q / 1e6 / copy:6.1%}",
                flush=True,
            )

        print(f"{rows} x {n}: {nb / 1e6:.0f} MB", flush=True)
        show(f"package {sm.softmax_config(rows, n, x.dtype)}", lambda x=x: sm.softmax(x))
        for part, again, cap, key in variants:
            if part > n:
                continue
            y, k = split16(x, part, again, cap, key=key)
            err = (y.float() - want).abs().max().item()
            how = ("max by key, " if key else "") + ("again" if again else "keep e")
            label = f"split {n // part} x {part} {how} cap {cap} ({k.n_regs} r, {k.n_spills} sp)"
            if err > 1e-2:
                print(f"  {label}: WRONG {err:.1e}")
                continue
            show(label, lambda x=x, part=part, again=again, cap=cap, key=key: split16(x, part, again, cap, key=key))
        x = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
