"""Where a backward call's host time goes: the RMSNorm backward taken apart, GPU only.

    PYTHONPATH=. python3 benchmarks/probes/host_rms_bwd.py

Wall time per call of 300 calls back to back (host-bound at these sizes: the GPU work is ~0.05 ms), for
the whole ``torch.autograd.grad``, the package's ``_backward`` called directly, each of its launches,
and autograd's engine around functions that do (almost) nothing.
"""

import time

import torch

from fusionlab import bench
from fusionlab.kernels import rmsnorm as rn
from fusionlab.lessons.l4.suite import DTYPE, EPS, rms_inputs


def per_call_ms(fn, calls=300):
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e3)
    return best


class Nothing(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


print(bench.source_label())
rows, n = 2048, 8192
x, r, dy, dh, w = rms_inputs(rows, n)
xg, rg, wg = (t.clone().requires_grad_() for t in (x, r, w))
y, h = rn.rmsnorm(xg, wg, EPS, rg)
y1 = rn.rmsnorm(xg, wg, EPS)
layout = rn.row_layouts(h)[0]
rstd = torch.rand(rows, device="cuda", dtype=torch.float32)
cfg = rn.rmsnorm_config(rows, n, DTYPE, backward=True)
part = torch.empty((1, 132, n), dtype=torch.float32, device="cuda")
a = xg.detach().clone().requires_grad_()
b = a * 2
c = Nothing.apply(a)
cases = {
    "autograd.grad, fused rmsnorm (the suite's call)": lambda: torch.autograd.grad(
        (y, h), (xg, wg, rg), (dy, dh), retain_graph=True
    ),
    "autograd.grad, y only (one output)": lambda: torch.autograd.grad(y, (xg, wg, rg), dy, retain_graph=True),
    "autograd.grad, y and h, into x only": lambda: torch.autograd.grad((y, h), xg, (dy, dh), retain_graph=True),
    "autograd.grad, no residual": lambda: torch.autograd.grad(y1, (xg, wg), dy, retain_graph=True),
    "_backward called directly": lambda: rn._backward(dy, dh, h.detach(), layout, w, rstd, None, True, True),
    "sum_partials alone": lambda: rn.sum_partials(part, DTYPE),
    "torch.empty of x's shape": lambda: torch.empty_like(x),
    "autograd.grad, x * 2 (one eager kernel)": lambda: torch.autograd.grad(b, a, dy, retain_graph=True),
    "autograd.grad, a Function doing nothing": lambda: torch.autograd.grad(c, a, dy, retain_graph=True),
    "x.clone() (one launch)": lambda: x.clone(),
}
for name, fn in cases.items():
    print(f"{per_call_ms(fn) * 1e3:8.1f} us  {name}")
