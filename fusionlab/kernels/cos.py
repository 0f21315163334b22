"""Lesson 1: ``cos`` and the fused ``cos(cos(x))`` — one read and one write per element.

Eager PyTorch runs ``x.cos().cos()`` as two kernels: read x, write t, read t, write y (4N elements
through HBM). The fused kernel reads x once and writes y once (2N), doing both cosines in registers.
Memory-bound, so the fused version should cost about what a single ``cos`` costs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime
from ._validate import check_tensor


def cos_cos_reference(x: torch.Tensor) -> torch.Tensor:
    """The spec: ``cos(cos(x))``, two kernels in eager mode."""
    return x.cos().cos()


@triton.jit
def _cos_kernel(x_ptr, y_ptr, n_elements, BLOCK_SIZE: tl.constexpr, TWICE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements  # the last block hangs over the end of the tensor
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)  # math in fp32, whatever the storage
    y = tl.cos(x)
    if TWICE:  # resolved at compile time: two specialised kernels, no branch at run time
        y = tl.cos(y)
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _block_size() -> int:
    # On a GPU 4096 elements per program with 8 warps gives each thread 16 elements: four 16-byte
    # loads in flight, enough to keep HBM busy. The interpreter runs programs one after another, so
    # fewer, larger blocks run faster there too.
    return 4096


def _launch(x: torch.Tensor, twice: bool, op: str) -> torch.Tensor:
    check_tensor(x, "x", op=op)
    y = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return y
    grid = (triton.cdiv(n, _block_size()),)
    kwargs = {"num_warps": 8} if runtime.is_gpu() else {}
    _cos_kernel[grid](x, y, n, BLOCK_SIZE=_block_size(), TWICE=twice, **kwargs)
    return y


def cos(x: torch.Tensor) -> torch.Tensor:
    """``cos(x)`` in one Triton kernel: the one-pass baseline the fused chain is measured against."""
    return _launch(x, twice=False, op="cos")


def cos_cos(x: torch.Tensor) -> torch.Tensor:
    """``cos(cos(x))`` fused: one kernel, one read of x and one write of y."""
    return _launch(x, twice=True, op="cos_cos")
