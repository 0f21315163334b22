"""Lesson 7's FA1-schedule attention forward (K/V outer, the running state through HBM): O and lse
against float64 at awkward shapes, causal top-left; its ledger against a count by hand; inputs it
refuses. GPU cases (``gpu``) run bf16 and fp16 at the suite's head dims and a long sequence."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import gpu_only

from fusionlab import runtime
from fusionlab.kernels import KernelInputError
from fusionlab.kernels.attention import attention_ledger, attention_reference
from fusionlab.kernels.attention_fa1 import attention_fa1, attention_fa1_ledger

pytestmark = pytest.mark.lesson7

DEV = runtime.DEVICE
# fp32: exact in the interpreter; on a GPU Triton's fp32 dot is tf32 (10-bit mantissa), ~1e-3 relative
TOL = {torch.float32: 3e-3 if runtime.is_gpu() else 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _rel(x, ref) -> float:
    return ((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def _check(B, H, n_q, n_k, d, dtype, causal, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, d, generator=g).to(DEV, dtype) for n in (n_q, n_k, n_k))
    before = [t.clone() for t in (q, k, v)]
    o, lse = attention_fa1(q, k, v, causal)
    ref_o, ref_lse = attention_reference(q, k, v, causal=causal)
    assert o.dtype == dtype and lse.dtype == torch.float32
    assert _rel(o, ref_o) < TOL[dtype]
    assert (lse - ref_lse).abs().max().item() < (5e-3 if dtype == torch.float32 and runtime.is_gpu() else 1e-3)  # tf32
    assert all(torch.equal(a, b) for a, b in zip((q, k, v), before, strict=True))


# (B, H, N_q, N_k, D): one token; N not a multiple of either tile; N_q != N_k both ways; D not a power of 2
CPU_SHAPES = [(1, 1, 1, 1, 16), (2, 1, 45, 45, 32), (1, 2, 70, 40, 24), (1, 1, 33, 70, 16)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", CPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fa1_matches_reference(shape, causal):
    # on a GPU the kernel takes the tensor cores' 16-bit inputs (attention's shared input check)
    for dtype in (runtime.HALF,) if runtime.is_gpu() else (torch.float32, runtime.HALF):
        _check(*shape, dtype, causal)


@gpu_only  # the interpreter takes fp32
def test_fa1_refuses_fp32_on_a_gpu_by_name():
    q = torch.randn(1, 1, 16, 16, device=runtime.DEVICE)
    with pytest.raises(KernelInputError, match="fp16 or bf16"):
        attention_fa1(q, q, q)


def test_fa1_ledger_counts_the_state_per_k_block():
    B, H, N, D, bm, bn = 2, 3, 200, 64, 64, 32
    led = attention_fa1_ledger(B, H, N, N, D, torch.float16, block_m=bm, block_n=bn)
    blocks = math.ceil(N / bn)
    kv = 2 * B * H * N * D * 2  # K and V once, fp16
    q = blocks * B * H * N * D * 2  # Q once per K block
    state = (2 * blocks - 1 + 1) * B * H * N * (D + 2) * 4  # O, m, l fp32: written every block, read back
    out = B * H * N * (D * 2 + 4)  # O fp16, lse fp32
    assert led.fused_bytes == kv + q + state + out
    assert led.unfused_bytes == attention_ledger(B, H, N, N, D, torch.float16).unfused_bytes  # naive is naive
    fa2 = attention_ledger(B, H, N, N, D, torch.float16, block_m=bm).fused_bytes
    assert led.fused_bytes > fa2  # FA1 moves the state; FA2 keeps it on chip


def test_fa1_causal_ledger_skips_tiles_above_the_diagonal():
    full = attention_fa1_ledger(1, 1, 256, 256, 64, torch.float16, block_m=64, block_n=64)
    causal = attention_fa1_ledger(1, 1, 256, 256, 64, torch.float16, causal=True, block_m=64, block_n=64)
    assert causal.fused_bytes < full.fused_bytes


def test_fa1_refuses_bad_inputs():
    q = torch.randn(1, 1, 8, 16).to(DEV)
    with pytest.raises(KernelInputError):
        attention_fa1(q, q[..., :8], q[..., :8])
    with pytest.raises(KernelInputError):
        attention_fa1(q, q.transpose(2, 3).contiguous().transpose(2, 3), q)  # not contiguous
    with pytest.raises(KernelInputError):
        attention_fa1(q, q[:, :, :0], q[:, :, :0])  # no keys


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fa1_gpu(dtype, d, causal):
    _check(2, 4, 1000, 1000, d, dtype, causal)
    _check(1, 2, 4096, 4096, d, dtype, causal, seed=1)
