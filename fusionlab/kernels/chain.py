"""Lesson 2: a chain of k element-wise ops — 2kN elements through HBM eager, 2N fused.

Eager PyTorch runs each op as its own kernel: op i reads the tensor op i-1 wrote and writes a new
one, so k ops move 2kN elements. The fused kernel reads x once, applies all k ops in registers and
writes y once: 2N, whatever k is. While the chain stays memory-bound, its fused time should not grow
with k, and the eager time should grow linearly.

The chain is fixed, so that every k means one function: op i (counting from 0) is ``CHAIN_OPS[i % 4]``

====  ========  =====================  ==================================================
 i     name      torch (one kernel)     what it costs in the fused kernel
====  ========  =====================  ==================================================
 0     add       ``t + 0.5``            one add
 1     relu      ``torch.relu(t)``      one compare-select
 2     mul       ``t * 1.5``            one multiply
 3     sigmoid   ``torch.sigmoid(t)``   an exp2 and a division; bounds t to (0, 1)
====  ========  =====================  ==================================================

so ``chain k=3`` is ``relu(x + 0.5) * 1.5``. Why these and not sin/cos: on an H100 (Triton 3.6, fp32,
2**28 elements) a fused chain of add/sin/relu/cos fell from 97% of copy bandwidth at k=5 to 65% at
k=8 — the arithmetic of two sines and two cosines, no longer the memory, set the time. With the
ops above all eight stay memory-bound, which is the point the chain is there to show. The sigmoid
keeps values bounded, so fp16 results stay well-conditioned.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime
from .._exercise import answer_key
from ..ledger import Ledger
from ._launch import KernelInputError, cdiv, check_block, check_tensor

#: the most ops the fused kernel takes (it unrolls the chain at compile time, one variant per k)
MAX_K = 8


def _add(t: torch.Tensor) -> torch.Tensor:
    return t + 0.5


def _mul(t: torch.Tensor) -> torch.Tensor:
    return t * 1.5


#: (name, eager op) in chain order; op i of a chain is CHAIN_OPS[i % len(CHAIN_OPS)]. The names are
#: the aten ops eager PyTorch runs, so a LaunchCounter and the ledger speak of the same kernels.
CHAIN_OPS = (("add", _add), ("relu", torch.relu), ("mul", _mul), ("sigmoid", torch.sigmoid))


def _check_k(k, op: str, max_k: int | None = MAX_K) -> int:
    if isinstance(k, bool) or not isinstance(k, int):
        raise KernelInputError(f"{op}: k must be an int, got {type(k).__name__}.")
    if k < 1 or (max_k is not None and k > max_k):
        upper = f"<= {max_k}" if max_k is not None else ""
        raise KernelInputError(f"{op}: k={k}; the chain needs 1 <= k {upper}".rstrip() + ".")
    return k


def chain_names(k: int) -> list[str]:
    """The names of the chain's first k ops, e.g. ``chain_names(3) == ["add", "relu", "mul"]``.

    The ledger (:func:`chain_ledger`) counts the same ops the kernels run.
    """
    _check_k(k, "chain_names", max_k=None)
    return [CHAIN_OPS[i % len(CHAIN_OPS)][0] for i in range(k)]


@answer_key
def chain_reference(x: torch.Tensor, k: int) -> torch.Tensor:
    """The spec and the eager baseline: the chain's first k ops, one torch call (kernel) each.

    Computed in fp32 and returned in ``x.dtype``: for fp32 input that is exactly k kernels; for
    fp16/bf16 the two casts add two more, and the result is rounded once, as the fused kernel does.
    """
    _check_k(k, "chain_reference", max_k=None)
    t = x.float()
    for i in range(k):
        t = CHAIN_OPS[i % len(CHAIN_OPS)][1](t)
    return t.to(x.dtype)


@answer_key
def chain_ledger(k: int, n: int, dtype=torch.float32) -> Ledger:
    """The chain's first k ops on n elements: 2kN elements eager, 2N fused."""
    return Ledger.chain(chain_names(k), n, dtype)


@triton.jit
def _chain_kernel(x_ptr, y_ptr, n_elements, K: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements  # the last block hangs over the end of the tensor
    t = tl.load(x_ptr + offs, mask=mask).to(tl.float32)  # math in fp32, whatever the storage
    # static_range unrolls at compile time and i is a constexpr, so each `if` below is resolved
    # then too: the kernel for a given K is straight-line code, every intermediate in registers.
    for i in tl.static_range(K):
        if i % 4 == 0:
            t = t + 0.5
        elif i % 4 == 1:
            t = tl.maximum(t, 0.0, propagate_nan=tl.PropagateNan.ALL)  # NaN stays NaN, as in torch
        elif i % 4 == 2:
            t = t * 1.5
        else:
            t = tl.sigmoid(t)
    tl.store(y_ptr + offs, t.to(y_ptr.dtype.element_ty), mask=mask)


def _block_size() -> int:
    # GPU: 4096 elements and 8 warps, 16 per thread, as lesson 1's cos. The interpreter spends
    # milliseconds of Python per program, so it gets fewer, larger blocks.
    return 4096 if runtime.is_gpu() else 65536


def chain(x: torch.Tensor, k: int, *, block_size: int | None = None) -> torch.Tensor:
    """The chain's first k ops (1 <= k <= 8) fused: one kernel, one read of x and one write of y.

    ``block_size`` (a power of two) overrides the elements per program, for a tuning sweep.
    """
    op = "chain"
    _check_k(k, op)
    check_tensor(x, "x", op=op)
    block = _block_size() if block_size is None else block_size
    check_block(block, "block_size", op)
    y = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return y
    grid = (cdiv(n, block),)
    kwargs = {"num_warps": 8 if block >= 4096 else 4} if runtime.is_gpu() else {}
    _chain_kernel[grid](x, y, n, K=k, BLOCK_SIZE=block, **kwargs)
    return y
