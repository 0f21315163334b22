"""Lesson 6's SiLU-gated epilogue exercise: its checker accepts a one-kernel gate with two weights and
rejects the gate on the wrong projection and torch doing the work; the prediction checker accepts the
roofline count on the printed ceilings and refuses the memory-bound ratio."""

from __future__ import annotations  # noqa: I001  (fusionlab before triton: see test_checkers_lesson2.py)

import pytest
import torch
import torch.nn.functional as F

from fusionlab import bench, runtime
import triton
import triton.language as tl

from fusionlab.grading import CheckFailed
from fusionlab.lessons.l6 import checkers as ex

pytestmark = [pytest.mark.lesson6, pytest.mark.filterwarnings("ignore::RuntimeWarning")]

BLOCK_M, BLOCK_N, BLOCK_K = runtime.pick(gpu=(64, 64, 32), interpreter=(32, 32, 32))


@triton.jit
def _gate_kernel(x_ptr, wg_ptr, wu_ptr, h_ptr, M, N, K, stride_xm, stride_wn, stride_hm,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP: tl.constexpr):  # fmt: skip
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :],
                    mask=(offs_m[:, None] < M) & (k[None, :] < K), other=0.0)  # fmt: skip
        w_mask = (k[:, None] < K) & (offs_n[None, :] < N)
        acc_g += tl.dot(x, tl.load(wg_ptr + offs_n[None, :] * stride_wn + k[:, None], mask=w_mask, other=0.0))
        acc_u += tl.dot(x, tl.load(wu_ptr + offs_n[None, :] * stride_wn + k[:, None], mask=w_mask, other=0.0))
    if SWAP:
        acc_g, acc_u = acc_u, acc_g
    h = acc_g * tl.sigmoid(acc_g) * acc_u
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(h_ptr + offs_m[:, None] * stride_hm + offs_n[None, :], h.to(h_ptr.dtype.element_ty), mask=mask)


def _gate(swap=False):
    def fn(x, w_gate, w_up):
        M, K = x.shape
        N = w_gate.shape[0]
        h = torch.empty((M, N), dtype=x.dtype, device=x.device)
        _gate_kernel[(triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))](
            x, w_gate, w_up, h, M, N, K, x.stride(0), w_gate.stride(0), h.stride(0),
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, SWAP=swap,
        )  # fmt: skip
        return h

    return fn


def test_silu_gate_accepts_one_kernel():
    assert "✓ silu_gate" in ex.check_silu_gate(_gate())


def test_silu_gate_rejects_the_gate_on_the_up_projection():
    with pytest.raises(CheckFailed, match="differ"):
        ex.check_silu_gate(_gate(swap=True))


def test_silu_gate_rejects_torch():
    with pytest.raises(CheckFailed, match="computes with torch"):
        ex.check_silu_gate(lambda x, wg, wu: F.silu(x @ wg.t()) * (x @ wu.t()))


def test_gate_prediction():
    ceil = bench.ceilings()
    right = ex.gate_predicted_ratio(ceil.copy_GBps, ceil.matmul_TFLOPs)
    assert 1.0 < right < 1.5  # compute-bound matmuls: the passes add a fraction
    assert "✓" in ex.check_gate_prediction(right, ceil)
    with pytest.raises(CheckFailed):
        ex.check_gate_prediction(5 / 3 * 1.0 + 1.0, ceil)  # a memory-bound count of the passes alone
