"""Philox-4x32-10 in numpy: the independent spec of the random stream that
:mod:`fusionlab.kernels.dropout_norm`'s kernels draw with ``tl.randint4x``, and the keep mask they make
from it. The tests compare the kernels' masks, forward and backward, with :func:`dropout_keep_reference`."""

from __future__ import annotations

import math

import numpy as np
import torch

from ._launch import cdiv


def keep_threshold(p: float) -> int:
    """An element is kept when its word's top 31 bits (``bits >> 1``) are at least ``round(p 2**31)``: an
    integer compare, so p = 0 keeps every element, exactly."""
    return min(int(round(p * 2**31)), 2**31 - 1)


_M32 = np.uint64(0xFFFFFFFF)


def philox_reference(seed: int, counters: np.ndarray) -> tuple[np.ndarray, ...]:
    """Philox-4x32-10 in numpy (uint64 arithmetic, so every product is exact): the four 32-bit words
    for each counter (a uint64 array), as ``tl.randint4x(seed, counter)`` computes them."""
    c = np.asarray(counters, dtype=np.uint64)
    c0, c1 = c & _M32, c >> np.uint64(32)
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    k0, k1 = np.uint64(seed & 0xFFFFFFFF), np.uint64((seed >> 32) & 0xFFFFFFFF)
    ra, rb = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    for _ in range(10):
        pa, pb = ra * c0, rb * c2  # < 2**64: exact
        c0, c1, c2, c3 = (pb >> np.uint64(32)) ^ c1 ^ k0, pb & _M32, (pa >> np.uint64(32)) ^ c3 ^ k1, pa & _M32
        k0 = (k0 + np.uint64(0x9E3779B9)) & _M32
        k1 = (k1 + np.uint64(0xBB67AE85)) & _M32
    return c0, c1, c2, c3


def dropout_keep_reference(shape, p: float, seed: int, offset: int = 0) -> torch.Tensor:
    """The keep mask (bool, ``shape``) the kernel makes for ``(seed, offset)``, from :func:`philox_reference`."""
    shape = tuple(shape)
    n = shape[-1]
    rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
    col = np.arange(n)
    ctr = offset + np.arange(rows)[:, None] * cdiv(n, 4) + (col // 4)[None, :]
    words = philox_reference(seed, ctr.astype(np.uint64))
    bits = np.choose(np.broadcast_to(col % 4, ctr.shape), words)
    keep = (bits >> np.uint64(1)).astype(np.int64) >= keep_threshold(p)
    return torch.from_numpy(keep.reshape(shape))
