"""Probe: cross-entropy rows read through the copy engine (TMA), pipelined across tiles and across rows
(benchmarks/notes_lesson5.md, 2026-11-24 "the copy engine, the loss alone's tiles, larger split parts").

    PYTHONPATH=. python3 benchmarks/probes/probe_ce_tma.py [--quick]

The H200 left the package's cross-entropy at 75-83% of copy (fwd+bwd bf16, GPU clock): even the loss
alone, which only reads the logits, stays at 74-79% there. ncu called it latency-bound (too few bytes in
flight): a 32-warp program holds one 16-byte load a thread in flight. Hopper's copy engine moves a whole
tile into shared memory on one instruction, and Triton's pipeliner keeps ``num_stages`` of them in
flight. Kernels here (bf16, rows of a multiple of 256 logits, no ignored rows, no smoothing, "mean";
each checked against float64 first):

- ``lse ptr``: the loss alone, pointer loads a tile at a time (the package's sweep 1);
- ``lse tma``: the loss alone, one program a row, tiles of T x 256 through TMA, S stages;
- ``lse tma persistent``: the same over a flat (row, tile) loop, so the pipeline runs across rows;
- ``ce tma``: loss and gradient, one program a row, both sweeps through TMA;
- ``ce tma persistent``: loss and gradient over a flat (row, sweep, tile) loop: one exp2 an element a
  sweep, the sums in sweep 1, the gradient's store in sweep 2;
- the package's kernel (``shipped``) beside them.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels.cross_entropy import CrossEntropyFunction, cross_entropy_config

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # older triton
    TensorDescriptor = None

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
W = 256  # a TMA box holds at most 256 elements along each dimension: rows are viewed as (V / 256, 256)


@triton.jit
def _lse_ptr_kernel(x_ptr, t_ptr, loss_ptr, n_cols, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    y = tl.load(t_ptr + row)
    ref = tl.load(x_ptr + row * n_cols + y).to(tl.float32)
    d_v = tl.zeros([BLOCK], tl.float32)
    for start in tl.range(0, n_cols, BLOCK, num_stages=STAGES):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n_cols + offs, mask=offs < n_cols, other=float("-inf")).to(tl.float32)
        d_v += tl.math.exp2((x - ref) * LOG2E)
    tl.store(loss_ptr + row, tl.math.log2(tl.sum(d_v, axis=0)) * LN2)


@triton.jit
def _lse_tma_kernel(desc, x_ptr, t_ptr, loss_ptr, n_cols, T: tl.constexpr, WW: tl.constexpr, STAGES: tl.constexpr):
    row = tl.program_id(0)
    y = tl.load(t_ptr + row)
    ref = tl.load(x_ptr + row.to(tl.int64) * n_cols + y).to(tl.float32)
    n_sub = n_cols // WW
    sub = tl.arange(0, T)[:, None]
    d_v = tl.zeros([T, WW], tl.float32)
    for j in tl.range(0, tl.cdiv(n_sub, T), num_stages=STAGES):
        x = desc.load([row, j * T, 0]).reshape(T, WW).to(tl.float32)
        x = tl.where(j * T + sub < n_sub, x, float("-inf"))  # the box past the row's end is zero-filled
        d_v += tl.math.exp2((x - ref) * LOG2E)
    tl.store(loss_ptr + row, tl.math.log2(tl.sum(tl.sum(d_v, axis=1), axis=0)) * LN2)


@triton.jit
def _lse_tma_persistent_kernel(
    desc, x_ptr, t_ptr, loss_ptr, n_rows, n_cols, T: tl.constexpr, WW: tl.constexpr, STAGES: tl.constexpr
):
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    n_sub = n_cols // WW
    n_t = tl.cdiv(n_sub, T)
    my_rows = tl.cdiv(n_rows - pid, n_prog)
    sub = tl.arange(0, T)[:, None]
    d_v = tl.zeros([T, WW], tl.float32)
    ref = 0.0
    for it in tl.range(0, my_rows * n_t, num_stages=STAGES):
        r = pid + (it // n_t) * n_prog
        j = it % n_t
        x = desc.load([r, j * T, 0]).reshape(T, WW).to(tl.float32)
        if j == 0:
            y = tl.load(t_ptr + r)
            ref = tl.load(x_ptr + r.to(tl.int64) * n_cols + y).to(tl.float32)
            d_v = tl.zeros([T, WW], tl.float32)
        x = tl.where(j * T + sub < n_sub, x, float("-inf"))
        d_v += tl.math.exp2((x - ref) * LOG2E)
        if j == n_t - 1:
            tl.store(loss_ptr + r, tl.math.log2(tl.sum(tl.sum(d_v, axis=1), axis=0)) * LN2)


@triton.jit
def _ce_tma_kernel(
    desc, x_ptr, t_ptr, g_ptr, loss_ptr, n_cols, scale, T: tl.constexpr, WW: tl.constexpr, STAGES: tl.constexpr
):
    row = tl.program_id(0)
    row64 = row.to(tl.int64)
    y = tl.load(t_ptr + row)
    x_y = tl.load(x_ptr + row64 * n_cols + y).to(tl.float32)
    n_sub = n_cols // WW
    n_t = tl.cdiv(n_sub, T)
    sub = tl.arange(0, T)[:, None]
    lane = tl.arange(0, WW)[None, :]
    d_v = tl.zeros([T, WW], tl.float32)
    for j in tl.range(0, n_t, num_stages=STAGES):
        x = desc.load([row, j * T, 0]).reshape(T, WW).to(tl.float32)
        x = tl.where(j * T + sub < n_sub, x, float("-inf"))
        d_v += tl.math.exp2((x - x_y) * LOG2E)
    d = tl.sum(tl.sum(d_v, axis=1), axis=0)
    tl.store(loss_ptr + row, tl.math.log2(d) * LN2)
    log2_c = tl.math.log2(scale / d)
    for i in tl.range(0, n_t, num_stages=STAGES):
        j = n_t - 1 - i  # newest first: the likeliest still in L2
        x = desc.load([row, j * T, 0]).reshape(T, WW).to(tl.float32)
        offs = (j * T + sub) * WW + lane
        # the target's -scale in the tile's own store: no scalar store after a barrier
        grad = tl.math.exp2((x - x_y) * LOG2E + log2_c) - tl.where(offs == y, scale, 0.0)
        tl.store(g_ptr + row64 * n_cols + offs, grad.to(g_ptr.dtype.element_ty), mask=j * T + sub < n_sub)


@triton.jit
def _ce_tma_persistent_kernel(
    desc,
    x_ptr,
    t_ptr,
    g_ptr,
    loss_ptr,
    n_rows,
    n_cols,
    scale,
    T: tl.constexpr,
    WW: tl.constexpr,
    STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    n_sub = n_cols // WW
    n_t = tl.cdiv(n_sub, T)
    steps = 2 * n_t
    my_rows = tl.cdiv(n_rows - pid, n_prog)
    sub = tl.arange(0, T)[:, None]
    lane = tl.arange(0, WW)[None, :]
    d_v = tl.zeros([T, WW], tl.float32)
    x_y = 0.0
    shift = 0.0
    y = tl.load(t_ptr + pid)  # (the loop sets it again: here for its type)
    for it in tl.range(0, my_rows * steps, num_stages=STAGES):
        r = pid + (it // steps) * n_prog
        s = it % steps
        second = s >= n_t
        j = tl.where(second, steps - 1 - s, s)  # sweep 2 newest first
        x = desc.load([r, j * T, 0]).reshape(T, WW).to(tl.float32)
        if s == 0:
            y = tl.load(t_ptr + r)
            x_y = tl.load(x_ptr + r.to(tl.int64) * n_cols + y).to(tl.float32)
            d_v = tl.zeros([T, WW], tl.float32)
            shift = 0.0
        inside = j * T + sub < n_sub
        e = tl.math.exp2((x - x_y) * LOG2E + shift)
        if second:
            offs = (j * T + sub) * WW + lane
            grad = e - tl.where(offs == y, scale, 0.0)
            tl.store(g_ptr + r.to(tl.int64) * n_cols + offs, grad.to(g_ptr.dtype.element_ty), mask=inside)
        else:
            d_v += tl.where(inside, e, 0.0)
            if s == n_t - 1:
                d = tl.sum(tl.sum(d_v, axis=1), axis=0)
                tl.store(loss_ptr + r, tl.math.log2(d) * LN2)
                shift = tl.math.log2(scale / d)


def _desc(x, t):
    m, v = x.shape
    return TensorDescriptor(x, [m, v // W, W], [v, W, 1], [1, t, W])


def run_lse(kind, x, t, loss, T, S, warps, n_prog=None):
    m, v = x.shape
    if kind == "ptr":
        _lse_ptr_kernel[(m,)](x, t, loss, v, BLOCK=T * W, STAGES=S, num_warps=warps)
    elif kind == "tma":
        _lse_tma_kernel[(m,)](_desc(x, T), x, t, loss, v, T=T, WW=W, STAGES=S, num_warps=warps)
    else:
        _lse_tma_persistent_kernel[(n_prog,)](_desc(x, T), x, t, loss, m, v, T=T, WW=W, STAGES=S, num_warps=warps)


def run_ce(kind, x, t, g, loss, T, S, warps, n_prog=None):
    m, v = x.shape
    if kind == "tma":
        _ce_tma_kernel[(m,)](_desc(x, T), x, t, g, loss, v, 1.0 / m, T=T, WW=W, STAGES=S, num_warps=warps)
    else:
        _ce_tma_persistent_kernel[(n_prog,)](
            _desc(x, T), x, t, g, loss, m, v, 1.0 / m, T=T, WW=W, STAGES=S, num_warps=warps
        )


def main():
    quick = "--quick" in sys.argv
    copy = bench.measure_copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    dev = torch.cuda.get_device_name()
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s", flush=True)
    shapes = ((8192, 128256), (8192, 32000)) if not quick else ((8192, 128256),)
    for m, v in shapes:
        g0 = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, v, device="cuda", dtype=torch.bfloat16, generator=g0) * 2
        t = torch.randint(0, v, (m,), device="cuda", generator=g0)
        want_rows = torch.logsumexp(x[:64].double(), dim=1) - x[:64].double().gather(1, t[:64, None])[:, 0]
        xs = x[:64].double().requires_grad_()
        (want_g,) = torch.autograd.grad(F.cross_entropy(xs, t[:64], reduction="sum") / m, xs)
        loss = torch.empty(m, device="cuda", dtype=torch.float32)
        g = torch.empty_like(x)
        rd, rw = x.numel() * 2, 2 * x.numel() * 2

        def report(label, fn, nb, check):
            try:
                fn()
                torch.cuda.synchronize()
                err = check()
                ms = bench.queued_ms(fn)
                print(f"  {m} x {v:<6} {label:34s} {ms:7.4f} ms {nb / ms / 1e6 / copy:6.1%}  err {err:.1e}", flush=True)
            except Exception as e:  # a configuration that does not compile: say so, go on
                print(f"  {m} x {v:<6} {label:34s} failed: {type(e).__name__} {str(e)[:200]}", flush=True)

        def lse_err():
            return ((loss[:64].double() - want_rows).abs().max()).item()

        def ce_err():
            lse_ok = ((loss[:64].double() - want_rows).abs().max()).item()
            gr = ((g[:64].double() - want_g).norm() / want_g.norm()).item()
            return max(lse_ok, gr)

        # the package's kernel: fwd+bwd and the loss alone, for the same run's reference
        cfg = cross_entropy_config(v, torch.bfloat16)
        xg = x.clone().requires_grad_()
        report(
            "shipped fwd+bwd",
            lambda: torch.autograd.grad(CrossEntropyFunction.apply(xg, t, -100, "mean", 0.0, False, cfg), xg),
            rw,
            lambda: 0.0,
        )
        xg = None
        with torch.no_grad():
            report("shipped loss alone", lambda: fusionlab.kernels.cross_entropy.cross_entropy(x, t), rd, lambda: 0.0)
        for S in (1, 3):
            report(f"lse ptr 8192 w32 s{S}", lambda S=S: run_lse("ptr", x, t, loss, 32, S, 32), rd, lse_err)
        # (T, stages, warps[, programs an SM]): Triton keeps stages - 1 tiles in flight
        one = [(16, 3, 8), (16, 5, 8), (32, 3, 8), (32, 4, 16), (8, 5, 4), (64, 3, 16)]
        pers = [(16, 3, 8, 2), (16, 5, 8, 2), (32, 4, 16, 1), (8, 5, 4, 4), (16, 4, 4, 3), (32, 3, 8, 2)]
        if quick:
            one, pers = one[:2], pers[:2]
        for T, S, w in one:
            report(f"lse tma T{T} s{S} w{w}", lambda T=T, S=S, w=w: run_lse("tma", x, t, loss, T, S, w), rd, lse_err)
        for T, S, w, k in pers:
            n = min(m, k * sms)
            fn = lambda T=T, S=S, w=w, n=n: run_lse("pers", x, t, loss, T, S, w, n)  # noqa: E731
            report(f"lse tma persistent T{T} s{S} w{w} x{k}", fn, rd, lse_err)
        for T, S, w in one:
            report(f"ce tma T{T} s{S} w{w}", lambda T=T, S=S, w=w: run_ce("tma", x, t, g, loss, T, S, w), rw, ce_err)
        for T, S, w, k in pers:
            n = min(m, k * sms)
            fn = lambda T=T, S=S, w=w, n=n: run_ce("pers", x, t, g, loss, T, S, w, n)  # noqa: E731
            report(f"ce tma persistent T{T} s{S} w{w} x{k}", fn, rw, ce_err)
        x = g = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
