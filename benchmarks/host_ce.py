"""Where a cross-entropy call's host time goes, and small calls against eager (benchmarks/notes_lesson5.md).

    PYTHONPATH=. python3 benchmarks/host_ce.py

At 8192 x 32000 a fused fwd+bwd call measured 0.43-0.84 ms while its kernels took 0.42 ms on the
GPU's own clock (H100, H200): the host set the pace. Each line is host time per call (``bench.wall_s``
over many calls of a tiny problem, where the GPU finishes first), then whole calls at small sizes
against eager ``F.cross_entropy``, per call (``bench.time_ms``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels.cross_entropy import (
    CrossEntropyFunction,
    _launch_backward,
    _loss,
    _prologue,
    cross_entropy,
    cross_entropy_config,
    cross_entropy_rows,
)


def us(fn, calls=400):
    fn()
    torch.cuda.synchronize()
    return 1e6 * bench.wall_s(fn, calls) / calls


def main():
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    T, V = 64, 32000
    x = torch.randn(T, V, device="cuda", dtype=torch.bfloat16)
    t = torch.randint(0, V, (T,), device="cuda")
    xg = x.clone().requires_grad_()
    cfg = cross_entropy_config(V, x.dtype)
    rows = torch.empty(T, device="cuda")
    g = torch.empty_like(x)
    sync = _prologue(t, -100, count=True)
    go = torch.ones((), device="cuda")
    parts = {
        "fused fwd+bwd call (autograd.grad)": lambda: torch.autograd.grad(cross_entropy(xg, t), xg),
        "fused forward with grad (apply)": lambda: cross_entropy(xg, t),
        "fused forward, no grad": lambda: cross_entropy(x, t),
        "CrossEntropyFunction.apply (no checks)": lambda: CrossEntropyFunction.apply(
            xg, t, -100, "mean", 0.0, False, cfg
        ),
        "_loss (prologue, kernel, allocations)": lambda: _loss(x, t, g, -100, "mean", 0.0, cfg),
        "cross_entropy_rows (the Triton launch)": lambda: cross_entropy_rows(
            x, t, g, rows, sync, -100, 0.0, cfg, mean=True
        ),
        "_prologue (count, zero: one launch)": lambda: _prologue(t, -100, count=True),
        "_launch_backward": lambda: _launch_backward(g, t, go, -100, cfg),
        "torch's n_valid, (t != -100).sum(), for comparison": lambda: (t != -100).sum(),
        "cross_entropy_config": lambda: cross_entropy_config(V, x.dtype, stride=V),
        "torch.empty_strided like x": lambda: torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="cuda"),
        "eager F.cross_entropy fwd+bwd": lambda: torch.autograd.grad(F.cross_entropy(xg, t), xg),
        "eager F.cross_entropy forward": lambda: F.cross_entropy(x, t),
    }
    print("host time per call, us (64 x 32000 bf16: the GPU is never the limit)")
    for name, fn in parts.items():
        print(f"  {name:42s} {us(fn):8.1f}", flush=True)
    print("whole fwd+bwd calls, ms (do_bench median), fused / eager")
    for T, V in ((16, 32000), (256, 32000), (1024, 32000), (1024, 128256), (4096, 128256)):
        x = torch.randn(T, V, device="cuda", dtype=torch.bfloat16).requires_grad_()
        t = torch.randint(0, V, (T,), device="cuda")
        f = bench.time_ms(lambda: torch.autograd.grad(cross_entropy(x, t), x))
        e = bench.time_ms(lambda: torch.autograd.grad(F.cross_entropy(x, t), x))
        fq = bench.queued_ms(lambda: torch.autograd.grad(cross_entropy(x, t), x))
        eq = bench.queued_ms(lambda: torch.autograd.grad(F.cross_entropy(x, t), x))
        print(
            f"  {T:5d} x {V:<6d} call: fused {f:.3f} eager {e:.3f} ({e / f:.2f}x) | GPU clock: fused {fq:.3f} "
            f"eager {eq:.3f} ({eq / fq:.2f}x)",
            flush=True,
        )


def engine():
    """Where the backward's host time goes: the engine's Python node, and the launch on its thread."""
    import threading

    from fusionlab.kernels import cross_entropy as ce

    T, V = 64, 32000
    xg = torch.randn(T, V, device="cuda", dtype=torch.bfloat16).requires_grad_()
    t = torch.randint(0, V, (T,), device="cuda")
    g0, go0 = torch.empty_like(xg), torch.ones((), device="cuda", dtype=torch.bfloat16)
    cfg = cross_entropy_config(V, xg.dtype)  # the backward's tile (the autograd Function looks it up)

    def node(backward):
        """An autograd node like cross-entropy's (forward: a sum of the logits) with this backward."""

        class Node(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.sum()

            @staticmethod
            def backward(ctx, go):
                return backward(go)

        return lambda: torch.autograd.grad(Node.apply(xg), xg)

    def triton_launch(go):
        _launch_backward(g0, t, go, -100, cfg)
        return g0

    def aten_op(go):
        go0.mul_(go)
        return g0

    print("backward's host time, us per fwd+bwd call")
    for name, backward in [
        ("Function, backward = a Triton launch", triton_launch),
        ("Function, backward = an aten op", aten_op),
        ("trivial Function fwd+bwd", lambda go: go.expand(T, V)),
    ]:
        print(f"  {name:42s} {us(node(backward)):8.1f}")
    real = ce._launch_backward
    ce._launch_backward = lambda *a: None
    print(f"  {'fused, backward launch removed':42s} {us(lambda: torch.autograd.grad(cross_entropy(xg, t), xg)):8.1f}")
    ce._launch_backward = real
    print(f"  {'fused, as shipped':42s} {us(lambda: torch.autograd.grad(cross_entropy(xg, t), xg)):8.1f}")
    print(f"  {'backward launch, main thread, bf16 go':42s} {us(lambda: _launch_backward(g0, t, go0, -100, cfg)):8.1f}")
    out = []

    def other():
        out.append(us(lambda: _launch_backward(g0, t, go0, -100, cfg)))

    th = threading.Thread(target=other)
    th.start()
    th.join()
    print(f"  {'backward launch, another thread':42s} {out[0]:8.1f}", flush=True)


def profile():
    """cProfile of the forward with grad (the main thread's part of a call), top functions by own time."""
    import cProfile
    import pstats

    T, V = 64, 32000
    xg = torch.randn(T, V, device="cuda", dtype=torch.bfloat16).requires_grad_()
    t = torch.randint(0, V, (T,), device="cuda")
    for _ in range(20):
        cross_entropy(xg, t)
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(300):
        cross_entropy(xg, t)
    pr.disable()
    torch.cuda.synchronize()
    print("cProfile, 300 forward-with-grad calls (us per call = tottime / 300 * 1e6):")
    pstats.Stats(pr).sort_stats("tottime").print_stats(22)
    full = lambda: torch.autograd.grad(cross_entropy(xg, t), xg)  # noqa: E731
    eager = lambda: torch.autograd.grad(F.cross_entropy(xg, t), xg)  # noqa: E731
    print(f"fwd+bwd host us: fused {us(full):.1f}, eager {us(eager):.1f}")
    with torch.autograd.set_multithreading_enabled(False):  # the backward on this thread: cProfile sees it
        print(f"fwd+bwd host us, autograd on the calling thread: fused {us(full):.1f}, eager {us(eager):.1f}")
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(300):
            full()
        pr.disable()
    torch.cuda.synchronize()
    print("cProfile, 300 fwd+bwd calls, autograd on the calling thread:")
    pstats.Stats(pr).sort_stats("tottime").print_stats(16)


if __name__ == "__main__":
    import sys

    if "--profile" in sys.argv:
        profile()
    else:
        engine()
        main()
