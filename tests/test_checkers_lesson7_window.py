"""Lesson 7's sliding-window exercise: its checker accepts the solution's kernel and rejects a kernel
that loads the blocks before the window (its loop starts at key 0), one that runs past the diagonal,
one with the window's mask off by one, and one whose rows with no key in view yet turn NaN; the
prediction checker accepts the block count and refuses the causal fraction."""

from __future__ import annotations  # noqa: I001  (fusionlab before triton: see test_checkers_lesson2.py)

import math

import pytest
import torch

from fusionlab import runtime
import triton
import triton.language as tl

from fusionlab.grading import CheckFailed
from fusionlab.lessons.l7 import checkers as ex

pytestmark = [
    pytest.mark.lesson7,
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning"),
]

BLOCK_M, BLOCK_N = runtime.pick(gpu=(64, 32), interpreter=(32, 16))


@triton.jit
def _window_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, n, window, scale, stride_h, stride_m,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   SKIP_BEFORE: tl.constexpr, STOP_AT_DIAGONAL: tl.constexpr, OFF_BY_ONE: tl.constexpr,
                   SAFE_MAX: tl.constexpr):  # fmt: skip
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d[None, :] < HEAD_DIM
    q = tl.load(q_ptr + bh * stride_h + offs_m[:, None] * stride_m + offs_d[None, :],
                mask=(offs_m[:, None] < n) & d_mask, other=0.0)  # fmt: skip
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo = 0
    if SKIP_BEFORE:
        lo = tl.maximum(start_m - window + 1, 0) // BLOCK_N * BLOCK_N
    hi = n
    if STOP_AT_DIAGONAL:
        hi = tl.minimum(n, start_m + BLOCK_M)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n[:, None] < n) & d_mask
        k = tl.load(k_ptr + bh * stride_h + offs_n[:, None] * stride_m + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + bh * stride_h + offs_n[:, None] * stride_m + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        i, j = offs_m[:, None], offs_n[None, :]
        keep = (j < n) & (j <= i) & (j > i - window - OFF_BY_ONE)
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = m_new
        if SAFE_MAX:
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_use)
        p = tl.exp(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    o = acc / l_i[:, None]
    row_mask = offs_m < n
    tl.store(o_ptr + bh * stride_h + offs_m[:, None] * stride_m + offs_d[None, :], o.to(o_ptr.dtype.element_ty),
             mask=row_mask[:, None] & d_mask)  # fmt: skip
    tl.store(lse_ptr + bh * n + offs_m, m_i + tl.log(l_i), mask=row_mask)


def _window(skip_before=True, stop_at_diagonal=True, off_by_one=0, safe_max=True):
    def fn(q, k, v, window):
        B, H, n, d = q.shape
        o = torch.empty_like(q)
        lse = torch.empty((B, H, n), dtype=torch.float32, device=q.device)
        # q, k, v and o share their strides (contiguous (B, H, N, D) views)
        _window_kernel[(triton.cdiv(n, BLOCK_M), B * H)](
            q, k, v, o, lse, n, window, 1 / math.sqrt(d), q.stride(1), q.stride(2), HEAD_DIM=d,
            BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
            SKIP_BEFORE=skip_before, STOP_AT_DIAGONAL=stop_at_diagonal, OFF_BY_ONE=off_by_one, SAFE_MAX=safe_max,
        )  # fmt: skip
        return o, lse

    return fn


def test_sliding_window_accepts_the_solution():
    assert "✓ sliding_window" in ex.check_sliding_window(_window())


@pytest.mark.parametrize(
    "wrong, says",
    [
        (dict(skip_before=False), "start each Q tile's key loop at its window"),
        (dict(stop_at_diagonal=False), "Stop each Q tile's key loop"),
        (dict(off_by_one=1), "differ from float64"),
        (dict(safe_max=False), "exp(-inf - (-inf)) is NaN"),
    ],
    ids=["loads-before-the-window", "past-the-diagonal", "window-one-too-long", "nan-rows"],
)
def test_sliding_window_rejects(wrong, says):
    with pytest.raises(CheckFailed, match=None) as e:
        ex.check_sliding_window(_window(**wrong))
    assert says in str(e.value)


def test_window_prediction():
    n, window, bm, bn = ex.WINDOW_PREDICTION
    right = ex.window_block_fraction(n, window, bm, bn)
    assert 0 < right < 0.2  # a window of 1024 in 16384 keys: a small share of the blocks
    assert "✓" in ex.check_window_prediction(right)
    with pytest.raises(CheckFailed):
        ex.check_window_prediction(0.5)  # the causal fraction
    with pytest.raises(CheckFailed):
        ex.check_window_prediction(None)
