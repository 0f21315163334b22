"""Probe: how much of a small cross-entropy call's host time is the package's own Python
(benchmarks/notes_lesson5.md, 2026-11-24 "the copy engine, the loss alone's tiles, larger split parts"). CPU only: the
Triton kernels are replaced by no-ops, so
what is timed is the wrapper (checks, configuration, allocations), the autograd Function and the
backward's bookkeeping, beside a trivial autograd.Function on the same tensors.

    .venv/bin/python benchmarks/probes/host_ce_python.py
"""

import torch
from _host import per_call_us, print_profile  # beside this script

import fusionlab  # noqa: F401
from fusionlab.kernels import _cross_entropy_kernels as CK
from fusionlab.kernels import cross_entropy as C


class Nop:
    """Stands in for a Triton kernel: ``kernel[grid](...)`` does nothing."""

    def __getitem__(self, grid):
        return lambda *a, **k: None


for name in (
    "_cross_entropy_fwd_kernel",
    "_cross_entropy_prologue_kernel",
    "_cross_entropy_finish_kernel",
    "_cross_entropy_bwd_kernel",
    "_cross_entropy_split_kernel",
):
    setattr(C if hasattr(C, name) else CK, name, Nop())
x = torch.randn(64, 32000).requires_grad_()
t = torch.randint(0, 32000, (64,))


def call():
    loss = C.cross_entropy(x, t)
    loss.backward()


def eager():
    torch.nn.functional.cross_entropy(x, t).backward()


class F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        return a.sum()

    @staticmethod
    def backward(ctx, g):
        return g.expand(64, 32000)


def triv():
    F.apply(x).backward()


print(f"wrapper + autograd, no kernels: {per_call_us(call):.1f} us a fwd+bwd call")
print(f"eager on this CPU (with its compute): {per_call_us(eager):.1f} us")
print(f"a trivial autograd.Function: {per_call_us(triv):.1f} us")
print_profile(call, 500, "cumulative", 18)
