"""Did a change move a kernel's GPU time? Two copies of the package, one process each, the same shapes.

    git archive REV fusionlab | tar -x -C /tmp/old               # the copy to compare with, made here
    for i in 1 2; do PYTHONPATH= python3 benchmarks/probes/probe_kernels_ab.py old /tmp/old norms
                     PYTHONPATH= python3 benchmarks/probes/probe_kernels_ab.py new . norms; done

Prints ``TAG KERNEL SHAPE MS`` per line (``do_bench`` medians, bf16); keep the faster of each copy's runs
and divide. Families: ``norms`` (LayerNorm and RMSNorm forward and backward at the lessons' shapes) and
``attention`` (lesson 7's forward shapes). Used for notes_norms.md § 2026-11-27 (the huge-rows statistics)
and notes_attention.md § 2026-11-27 (rows of infinite scores).
"""

from __future__ import annotations

import importlib
import sys

import torch
import triton


def norms(tag: str) -> None:
    ln = importlib.import_module("fusionlab.kernels.layernorm").layernorm
    rms = importlib.import_module("fusionlab.kernels.rmsnorm").rmsnorm
    for rows, n in ((32768, 4096), (4096, 8192), (32768, 8192), (4096, 5120)):
        x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
        w, b = (torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        g = torch.randn_like(x)
        xr = x.detach().requires_grad_()
        yr = rms(xr, w, 1e-6)
        xl = x.detach().requires_grad_()
        yl = ln(xl, w, b, 1e-5)
        cases = {
            "ln fwd": lambda: ln(x, w, b, 1e-5),  # noqa: B023
            "rms fwd": lambda: rms(x, w, 1e-6),  # noqa: B023
            "rms bwd": lambda: torch.autograd.grad(yr, xr, g, retain_graph=True),  # noqa: B023
            "ln bwd": lambda: torch.autograd.grad(yl, xl, g, retain_graph=True),  # noqa: B023
        }
        for name, f in cases.items():
            f()
            torch.cuda.synchronize()
            print(f"{tag} {name} {rows}x{n} {triton.testing.do_bench(f, warmup=30, rep=200):.4f}", flush=True)


def attention(tag: str) -> None:
    attn = importlib.import_module("fusionlab.kernels.attention").attention
    for d in (64, 128):
        for n in (1024, 4096, 16384):
            for causal in (False, True):
                b = 16384 * 16 // (16 * n)  # lesson 7's 16k x 16 token-heads at every N
                q, k, v = (torch.randn(b, 16, n, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                f = lambda: attn(q, k, v, causal)  # noqa: B023, E731
                f()
                torch.cuda.synchronize()
                ms = triton.testing.do_bench(f, warmup=50, rep=300)
                print(f"{tag} D={d} N={n} {'causal' if causal else 'full'} {ms:.4f}", flush=True)


if __name__ == "__main__":
    tag, where, family = sys.argv[1:4]
    sys.path.insert(0, where)  # this copy of fusionlab first
    {"norms": norms, "attention": attention}[family](tag)
