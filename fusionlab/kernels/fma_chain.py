"""k fused multiply-adds per element: where arithmetic stops being free, and the vector units' ceiling.

``y = fma_chain(x, k)`` reads each element, applies ``t = t * a + b`` k times in registers (fp32, one
FMA instruction each, 2 FLOPs) and writes it back: always one read and one write per element (2N
elements through HBM), while the arithmetic grows with k. At small k the kernel runs at copy speed;
past the point where ``k`` FMAs take longer than moving the element's bytes, the vector units set the
time. That point, measured, is the per-element instruction budget lesson 2 predicts; with large k
the kernel measures the vector units' peak itself (the element-wise ceiling of the roofline, which
is not the tensor cores': element-wise work never runs on them).

Four independent chains per element (k/4 FMAs each, summed at the end) keep the FMA pipelines busy:
one dependent chain would measure the FMA latency, not its throughput.
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

#: multiplier and addend: |a| < 1 keeps every chain bounded, so no value overflows whatever k is
A, B = 0.999, 0.001


@answer_key
def fma_chain_reference(x: torch.Tensor, k: int) -> torch.Tensor:
    """The spec: the four chains of ``k // 4`` FMAs from x, x + 1, x + 2, x + 3, summed; fp32 math."""
    _check_k(k, "fma_chain_reference")
    t = x.float()
    chains = [t, t + 1.0, t + 2.0, t + 3.0]
    for _ in range(k // 4):
        chains = [c * A + B for c in chains]
    return (chains[0] + chains[1] + chains[2] + chains[3]).to(x.dtype)


def fma_chain_ledger(n: int, dtype=torch.float32) -> Ledger:
    """One kernel: read x, write y, whatever k is."""
    return Ledger.chain(["fma_chain"], n, dtype)


def fma_chain_flops(n: int, k: int) -> int:
    """2 FLOPs per FMA, k per element (the 3 adds that seed and the 3 that sum the chains not counted)."""
    return 2 * k * n


def _check_k(k, op: str) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k < 4 or k % 4 or k > 65536:
        raise KernelInputError(f"{op}: k={k!r}; k must be a multiple of 4 between 4 and 65536.")
    return k


@triton.jit
def _fma_chain_kernel(x_ptr, y_ptr, n_elements, K4: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offs = pid.to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    t0 = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    t1 = t0 + 1.0
    t2 = t0 + 2.0
    t3 = t0 + 3.0
    for _ in range(K4):  # a run-time loop: the code stays small whatever k is
        t0 = t0 * 0.999 + 0.001
        t1 = t1 * 0.999 + 0.001
        t2 = t2 * 0.999 + 0.001
        t3 = t3 * 0.999 + 0.001
    tl.store(y_ptr + offs, (t0 + t1 + t2 + t3).to(y_ptr.dtype.element_ty), mask=mask)


_launch = Launcher(_fma_chain_kernel)
#: the GPU launch: elements a program and warps (the interpreter takes larger programs, and no warps)
GPU_BLOCK, NUM_WARPS = 1024, 4


@functools.lru_cache(maxsize=1024)
def _plan(n: int) -> tuple:
    block = GPU_BLOCK if runtime.is_gpu() else 4096
    return (cdiv(n, block),), block


def fma_chain(x: torch.Tensor, k: int) -> torch.Tensor:
    """``k`` fused multiply-adds per element (k a multiple of 4) in one kernel: one read, one write."""
    op = "fma_chain"
    _check_k(k, op)
    check_tensor(x, "x", op=op, max_numel=None)
    y = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return y
    grid, block = _plan(n)
    _launch(grid, x, y, n, K4=k // 4, BLOCK_SIZE=block, **launch_kwargs(NUM_WARPS))
    return y
