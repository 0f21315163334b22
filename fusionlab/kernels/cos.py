"""Lesson 1: ``cos`` and the fused ``cos(cos(x))`` — one read and one write per element.

Eager PyTorch runs ``x.cos().cos()`` as two kernels: read x, write t, read t, write y (4N elements
through HBM). The fused kernel reads x once and writes y once (2N), doing both cosines in registers.

The fused kernel is also where the arithmetic starts to show. A precise ``cos`` is a few dozen
instructions (range reduction, then a polynomial). At copy speed a GPU has room for
``(SMs x 128 fp32 lanes x clock) / (copy bandwidth / 8 bytes)`` instructions per fp32 element (each
element is read and written: 8 bytes) — about 64 on an H200, fewer on a GPU with more bandwidth per
lane; two precise cosines come close enough to that budget to make the kernel compute-bound on an H200
(``benchmarks/NOTES.md``, lesson 1). Fusion lets the kernel use what it knows about the intermediate:
the second cosine's argument lies in [-1, 1], where no range reduction is needed and a short
polynomial is exact to fp32 rounding. ``second="precise"`` keeps ``tl.cos`` twice, for comparison.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from .. import runtime
from .._exercise import answer_key
from ..ledger import Ledger
from ._launch import KernelInputError, Launcher, cdiv, check_tensor, launch_kwargs

COS, COS_COS_PRECISE, COS_COS = 0, 1, 2


@answer_key
def cos_cos_reference(x: torch.Tensor) -> torch.Tensor:
    """The spec: ``cos(cos(x))`` in fp32, returned in x's dtype."""
    return x.float().cos().cos().to(x.dtype)


def cos_cos_eager(x: torch.Tensor) -> torch.Tensor:
    """What eager PyTorch runs: ``x.cos().cos()``, two kernels (t1 = cos x, then cos t1)."""
    return x.cos().cos()


@answer_key
def cos_cos_ledger(n: int, dtype=torch.float32) -> Ledger:
    """Eager: cos reads x, writes t1; cos reads t1, writes y (4N elements). Fused: read x, write y (2N)."""
    return Ledger.chain(["cos", "cos"], n, dtype)


def cos_cos_flops(n: int) -> int:
    """Nominal: a precise cosine is a range reduction and a polynomial, ~20 operations; two per element."""
    return 40 * n


@triton.jit
def _cos_kernel(x_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr, WHAT: tl.constexpr):
    pid = tl.program_id(axis=0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements  # the last block hangs over the end of the tensor
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)  # math in fp32, whatever the storage
    y = tl.cos(x)
    if WHAT == 1:  # resolved at compile time: one specialised kernel per choice, no run-time branch
        y = tl.cos(y)
    elif WHAT == 2:
        # cos(c) for |c| <= 1 by its Taylor series up to c^12 (Horner in u = c^2): the first term left
        # out is below 1.2e-11, far under fp32's rounding, so this is cos to within an ulp or two.
        u = y * y
        y = u * (u * (u * (u * (u * (u * (1 / 479001600) - 1 / 3628800) + 1 / 40320) - 1 / 720) + 1 / 24) - 0.5) + 1.0
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


_launch_cos = Launcher(_cos_kernel)


@functools.lru_cache(maxsize=4096)
def _plan(n: int) -> tuple:
    # 1024 elements and 4 warps per program: 8 fp32 elements (two 16-byte loads) per thread, the
    # best of a sweep on an H200 (benchmarks/NOTES.md). The interpreter runs programs one after
    # another, so it gets fewer, larger blocks.
    block = 1024 if runtime.is_gpu() else 4096
    return (cdiv(n, block),), block


def _launch(x: torch.Tensor, what: int, op: str) -> torch.Tensor:
    check_tensor(x, "x", op=op)
    y = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return y
    grid, block = _plan(n)
    key = (n, x.dtype, what, x.data_ptr() & 15, y.data_ptr() & 15)  # all Triton specialises on
    _launch_cos(grid, x, y, n, BLOCK_SIZE=block, WHAT=what, key=key, **launch_kwargs(4))
    return y


def cos(x: torch.Tensor) -> torch.Tensor:
    """``cos(x)`` in one Triton kernel: the one-pass baseline the fused chain is measured against."""
    return _launch(x, COS, "cos")


def cos_cos(x: torch.Tensor, second: str = "poly") -> torch.Tensor:
    """``cos(cos(x))`` fused: one kernel, one read of x and one write of y.

    ``second``: ``"poly"`` (default) computes the second cosine, whose argument lies in [-1, 1], by a
    short polynomial; ``"precise"`` calls ``tl.cos`` twice.
    """
    if second not in ("poly", "precise"):
        raise KernelInputError(f"cos_cos: second={second!r}; choose 'poly' or 'precise'.")
    return _launch(x, COS_COS if second == "poly" else COS_COS_PRECISE, "cos_cos")
