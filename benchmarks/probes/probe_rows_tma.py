"""Probe: whole rows through the copy engine (TMA), persistent programs pipelining the next rows
(benchmarks/notes_lesson5.md and notes_softmax.md, 2026-11-24 "widths that are not powers of two").

    PYTHONPATH=. python3 benchmarks/probes/probe_rows_tma.py

``probe_ce_tma.py`` showed that on the H200 a plain read of the logits reaches 100-106% of copy while
the package's cross-entropy loss alone stays at 75-85%: the read is not the limit, the schedule is.
Rows of up to 32768 elements (64 KiB in 16 bits) fit shared memory whole. Here a persistent program
loads its next rows by TMA (Triton's pipeliner: ``stages - 1`` rows in flight) while it reduces this
one, then writes the result by TMA store (or pointer stores): each row read once, written once, and
the loads never wait on this row's arithmetic. Two ops: softmax (lesson 4's 32768-wide miss) and
cross-entropy's loss and gradient (lesson 5's 32000 miss: bf16, "mean", no ignored rows, no
smoothing). Each configuration is checked against float64 first; the package's kernel beside it.
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
from fusionlab.kernels.softmax import softmax

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # older triton
    TensorDescriptor = None

LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
CE_ONLY = "--ce" in sys.argv


@triton.jit
def _softmax_rows_tma_kernel(
    x_desc, y_desc, y_ptr, n_rows, n_cols, BLOCK: tl.constexpr, STAGES: tl.constexpr, TMA_STORE: tl.constexpr
):
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    for r in tl.range(pid, n_rows, n_prog, num_stages=STAGES):
        x = x_desc.load([r, 0]).reshape(BLOCK).to(tl.float32)
        x = tl.where(cols < n_cols, x, float("-inf"))  # past the row: zero-filled by the copy engine
        m = tl.max(x, axis=0)
        e = tl.math.exp2((x - m) * LOG2E)
        y = e * (1.0 / tl.sum(e, axis=0))
        if TMA_STORE:
            y_desc.store([r, 0], y.to(y_desc.dtype).reshape(1, BLOCK))
        else:
            tl.store(y_ptr + r.to(tl.int64) * n_cols + cols, y.to(y_ptr.dtype.element_ty), mask=cols < n_cols)


@triton.jit
def _ce_rows_tma_kernel(
    x_desc,
    g_desc,
    x_ptr,
    g_ptr,
    t_ptr,
    loss_ptr,
    n_rows,
    n_cols,
    scale,
    BLOCK: tl.constexpr,
    STAGES: tl.constexpr,
    TMA_STORE: tl.constexpr,
    PTR_LOAD: tl.constexpr = False,
    PREFETCH_T: tl.constexpr = False,
):
    pid = tl.program_id(0)
    n_prog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK)
    y_next = tl.load(t_ptr + pid).to(tl.int32)  # an int64 target would widen every column compare
    for r in tl.range(pid, n_rows, n_prog, num_stages=STAGES):
        if PREFETCH_T:  # the next row's target loaded a row ahead: its latency off the row's path
            y = y_next
            y_next = tl.load(t_ptr + r + n_prog, mask=r + n_prog < n_rows, other=0).to(tl.int32)
        else:
            y = tl.load(t_ptr + r).to(tl.int32)
        if PTR_LOAD:  # pointer loads, pipelined by Triton through shared memory (cp.async)
            x = tl.load(x_ptr + r.to(tl.int64) * n_cols + cols, mask=cols < n_cols, other=float("-inf"))
            x = x.to(tl.float32)
        else:
            x = x_desc.load([r, 0]).reshape(BLOCK).to(tl.float32)
        x = tl.where(cols < n_cols, x, float("-inf"))
        m = tl.max(x, axis=0)
        e = tl.math.exp2((x - m) * LOG2E)
        d = tl.sum(e, axis=0)
        x_y = tl.sum(tl.where(cols == y, x, 0.0), axis=0)  # from the tile: no dependent load
        tl.store(loss_ptr + r, m + tl.math.log2(d) * LN2 - x_y)
        g = e * (scale / d) - tl.where(cols == y, scale, 0.0)
        if TMA_STORE:
            g_desc.store([r, 0], g.to(g_desc.dtype).reshape(1, BLOCK))
        else:
            tl.store(g_ptr + r.to(tl.int64) * n_cols + cols, g.to(g_ptr.dtype.element_ty), mask=cols < n_cols)


def _desc(t, block):
    return TensorDescriptor(t, list(t.shape), list(t.stride()), [1, block])


def main():
    copy = bench.measure_copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    dev = torch.cuda.get_device_name()
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s", flush=True)
    configs = [  # (warps, stages, TMA store, programs an SM)
        (16, 2, True, 1),
        (16, 2, False, 1),
        (16, 3, False, 1),
        (32, 2, True, 1),
        (32, 3, False, 1),
        (8, 2, False, 2),
        (16, 4, False, 1),
    ]

    def report(label, m, v, fn, nb, check):
        try:
            fn()
            torch.cuda.synchronize()
            err = check()
            ms = bench.queued_ms(fn)
            print(f"  {m:>5} x {v:<6} {label:30s} {ms:7.4f} ms {nb / ms / 1e6 / copy:6.1%}  err {err:.1e}", flush=True)
        except Exception as e:  # a configuration that does not compile or fit: say so, go on
            print(f"  {m:>5} x {v:<6} {label:30s} failed: {type(e).__name__} {str(e)[:200]}", flush=True)

    for m, v in ((4096, 32768),) if CE_ONLY else ((4096, 32768), (16384, 32768), (4096, 16384)):
        g0 = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, v, device="cuda", dtype=torch.bfloat16, generator=g0) * 3
        y = torch.empty_like(x)
        want = torch.softmax(x[:64].double(), dim=-1)
        nb = 2 * x.numel() * 2

        def err():
            return (y[:64].double() - want).abs().max().item()

        report(
            "softmax shipped",
            m,
            v,
            lambda: softmax(x),
            nb,
            lambda: (softmax(x)[:64].double() - want).abs().max().item(),
        )
        block = triton.next_power_of_2(v)
        for w, s, tma, k in configs:
            n = min(m, k * sms)

            def fn(w=w, s=s, tma=tma, n=n):
                _softmax_rows_tma_kernel[(n,)](
                    _desc(x, block), _desc(y, block), y, m, v, BLOCK=block, STAGES=s, TMA_STORE=tma, num_warps=w
                )

            report(f"softmax tma w{w} s{s} {'tma' if tma else 'ptr'}-store x{k}", m, v, fn, nb, err)
        x = y = None

    for m, v in ((8192, 32000), (4096, 32000), (8192, 16384)):
        g0 = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(m, v, device="cuda", dtype=torch.bfloat16, generator=g0) * 2
        t = torch.randint(0, v, (m,), device="cuda", generator=g0)
        xs = x[:64].double().requires_grad_()
        want_loss = F.cross_entropy(xs, t[:64], reduction="none")
        (want_g,) = torch.autograd.grad(want_loss.sum() / m, xs)
        loss = torch.empty(m, device="cuda", dtype=torch.float32)
        g = torch.empty_like(x)
        nb = 2 * x.numel() * 2

        def err():
            e_l = (loss[:64].double() - want_loss.detach()).abs().max().item()
            return max(e_l, ((g[:64].double() - want_g).norm() / want_g.norm()).item())

        cfg = cross_entropy_config(v, torch.bfloat16)
        xg = x.clone().requires_grad_()

        def shipped():
            return torch.autograd.grad(CrossEntropyFunction.apply(xg, t, -100, "mean", 0.0, False, cfg), xg)

        report("ce shipped fwd+bwd", m, v, shipped, nb, lambda: 0.0)
        xg = None
        block = triton.next_power_of_2(v)
        ce_configs = [(16, 3, False, 1, False, False), (16, 4, False, 1, False, False)]
        ce_configs += [(w, s, tma, 1, False, True) for w, s, tma in ((16, 3, False), (16, 4, False), (8, 3, False),
                       (16, 3, True), (32, 3, False), (16, 2, False))]  # fmt: skip
        for w, s, tma, k, ptr, pre in ce_configs:
            n = min(m, k * sms)

            def fn(w=w, s=s, tma=tma, n=n, ptr=ptr, pre=pre):
                _ce_rows_tma_kernel[(n,)](
                    _desc(x, block), _desc(g, block), x, g, t, loss, m, v, 1.0 / m,
                    BLOCK=block, STAGES=s, TMA_STORE=tma, PTR_LOAD=ptr, PREFETCH_T=pre, num_warps=w,
                )  # fmt: skip

            how = f"{'ptr' if ptr else 'tma'} w{w} s{s} {'tma' if tma else 'ptr'}-store x{k}{' pre-t' if pre else ''}"
            report(f"ce {how}", m, v, fn, nb, err)
        x = g = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
