"""Lesson 8's FP8 forward (fusionlab.kernels.attention_fp8): the per-block quantisation, the kernel against
its float64 emulation (the same online softmax and the same e4m3 rounding of P: what is left is fp32
rounding), the error FP8 costs against float64 of the unquantised inputs, and the errors for what it
cannot take. In the interpreter the kernel runs on e4m3 inputs with P rounded to e4m3 by the kernel's own
emulation of the cast; GPU cases (``gpu``) run bf16 inputs at lesson sizes."""

from __future__ import annotations

import pytest
import torch
from conftest import gpu_only

from fusionlab import runtime
from fusionlab.kernels import KernelInputError
from fusionlab.kernels.attention_fp8 import (
    FP8,
    FP8_MAX,
    attention_fp8,
    attention_fp8_config,
    attention_fp8_emulated,
    attention_fp8_error,
    attention_fp8_quantized,
    attention_fp8_reference,
    dequantize_fp8,
    quantize_fp8,
)

pytestmark = pytest.mark.lesson8

DEV = runtime.DEVICE
DTYPE = torch.bfloat16 if runtime.is_gpu() else torch.float32


def _qkv(B, H, N_q, N_k, D, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return [torch.randn(B, H, n, D, generator=g).to(DEV, DTYPE) for n in (N_q, N_k, N_k)]


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_quantise_per_block_scales_and_transposed_v():
    q, k, v = _qkv(2, 3, 50, 37, 32)
    q[0, 1, 20] *= 100  # an outlier: only its block's scale grows
    x = quantize_fp8(q, k, v, 16, 16)
    assert x.q8.dtype == x.k8.dtype == x.vt8.dtype == FP8
    assert x.q_scale.shape == (2, 3, 4) and x.k_scale.shape == (2, 3, 3) and x.v_scale.shape == (2, 3, 32)
    assert x.vt8.shape == (2, 3, 32, 37)  # V transposed: the keys contiguous, as FP8 wgmma reads them
    assert x.q_scale[0, 1, 1] > 50 * x.q_scale[0, 1, 0]
    # each block's largest element lands on e4m3's largest value, so it dequantises exactly
    assert float(x.q8.float().abs().amax()) == FP8_MAX
    qd, kd, vd = dequantize_fp8(x)
    for got, want in ((qd, q), (kd, k), (vd, v)):
        # e4m3 keeps 3 mantissa bits: each normal element within 2^-4 of itself (plus the subnormal floor)
        err = (got - want.double()).abs()
        floor = 2.0**-10 * got.abs().amax()
        assert bool((err <= 2.0**-4 * want.double().abs() + floor).all())


@pytest.mark.parametrize(
    "B, H, N_q, N_k, D, causal",
    [(1, 2, 50, 50, 32, False), (1, 2, 64, 64, 64, True), (2, 1, 40, 72, 32, True), (1, 1, 33, 17, 64, False),
     (1, 1, 1, 1, 32, True)],
)  # fmt: skip
def test_kernel_matches_its_float64_emulation(B, H, N_q, N_k, D, causal):
    q, k, v = _qkv(B, H, N_q, N_k, D)
    cfg = attention_fp8_config(D, causal, N_q, N_k)
    x = quantize_fp8(q, k, v, cfg["BLOCK_M"], cfg["BLOCK_N"])
    o, lse = attention_fp8_quantized(x, causal, out_dtype=torch.float32)
    o_em, lse_em = attention_fp8_emulated(x, causal)
    o_exact, _ = attention_fp8_reference(x, causal)
    assert _rel(o, o_em) < 2e-3, "the kernel differs from its emulation by more than fp32 rounding"
    assert float((lse.double() - lse_em).abs().max()) < 1e-4
    # the emulation's P rounding is what separates it from the exact attention of the same inputs: the
    # check above would not see a kernel that skipped it only if that gap were as small as fp32's
    if N_k > 1:
        assert _rel(o_em, o_exact) > 5 * _rel(o, o_em)


def test_error_against_float64_is_stated_and_bounded():
    q, k, v = _qkv(1, 2, 70, 70, 64)
    e = attention_fp8_error(q, k, v, causal=True)
    assert set(e) == {"o", "lse", "o_kernel"}
    # e4m3 inputs cost a few percent of O's norm; the kernel's own FP8 P less than that. lse's largest
    # difference comes from the rows that see a few keys (no averaging): a few hundredths, where a wrong
    # base or a forgotten 2^8 would be whole units
    assert 1e-3 < e["o"] < 0.08 and e["o_kernel"] < 0.04 and e["lse"] < 0.25


def test_public_entry_quantises_at_the_kernels_tiles():
    q, k, v = _qkv(1, 1, 40, 40, 32)
    o, lse = attention_fp8(q, k, v, causal=True)
    assert o.dtype == q.dtype and o.shape == q.shape and lse.shape == (1, 1, 40)
    cfg = attention_fp8_config(32, True, 40)
    x = quantize_fp8(q, k, v, cfg["BLOCK_M"], cfg["BLOCK_N"])
    assert torch.equal(o, attention_fp8_quantized(x, True, out_dtype=q.dtype)[0])


def test_refusals():
    q, k, v = _qkv(1, 1, 32, 32, 32)
    x = quantize_fp8(q, k, v, 32, 16)
    with pytest.raises(KernelInputError, match="quantised over blocks"):
        attention_fp8_quantized(x, config={"BLOCK_M": 64, "BLOCK_N": 16})
    with pytest.raises(KernelInputError, match="head dim"):
        attention_fp8(*_qkv(1, 1, 8, 8, 48))
    with pytest.raises(KernelInputError, match="quantize_fp8"):
        attention_fp8_quantized((x.q8, x.k8, x.vt8))
    with pytest.raises(KernelInputError, match="causal"):
        attention_fp8_quantized(x, causal=1)
    with pytest.raises(KernelInputError, match="no keys"):
        attention_fp8(*_qkv(1, 1, 8, 0, 32))
    assert attention_fp8(*_qkv(1, 1, 0, 8, 32))[0].shape == (1, 1, 0, 32)  # no queries: nothing to do
    with pytest.raises(KernelInputError, match="unknown config"):
        attention_fp8_quantized(x, config={"TMA": True})
    with pytest.raises(KernelInputError, match="WS"):
        attention_fp8_quantized(x, config={"WS": "yes"})


def test_warp_specialised_loop_gives_the_same_bits():
    # in the interpreter warp_specialize changes nothing of the arithmetic: the descriptors made on the
    # device read what the host's do
    q, k, v = _qkv(1, 2, 64, 64, 64)
    cfg = attention_fp8_config(64, True, 64)
    x = quantize_fp8(q, k, v, cfg["BLOCK_M"], cfg["BLOCK_N"])
    assert torch.equal(attention_fp8_quantized(x, True)[0], attention_fp8_quantized(x, True, config={"WS": True})[0])


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("N", [1000, 1025, 4096])
def test_gpu_fp8_against_float64(D, N, causal):
    if (runtime.CAPABILITY or (0, 0)) < (8, 9):
        pytest.skip("e4m3 tensor cores need sm_89 or newer")
    q, k, v = _qkv(1, 4, N, N, D, seed=3)
    e = attention_fp8_error(q, k, v, causal)
    assert e["o"] < 0.08 and e["o_kernel"] < 0.04 and e["lse"] < 0.25, e
    cfg = attention_fp8_config(D, causal, N)
    x = quantize_fp8(q, k, v, cfg["BLOCK_M"], cfg["BLOCK_N"])
    o, _ = attention_fp8_quantized(x, causal, out_dtype=torch.float32)
    o_em = attention_fp8_emulated(x, causal)[0]
    # not fp32's 1e-7 here: Hopper's FP8 products accumulate with fewer bits than fp32 (H100, 2026-11-27:
    # 0.4-0.55% of O's norm from the emulation), and a score that moves moves P across e4m3's rounding
    # boundaries; still well under the FP8 P's own cost, the gap to the dequantised inputs' exact attention
    assert _rel(o, o_em) < min(1e-2, _rel(o_em, attention_fp8_reference(x, causal)[0]) / 2)


@pytest.mark.parametrize("causal", [False, True])
def test_ref_schedule_matches_its_emulation_and_falls_back(causal):
    q, k, v = _qkv(1, 2, 64, 80, 32)
    cfg = attention_fp8_config(32, causal, 64, 80)
    x = quantize_fp8(q, k, v, cfg["BLOCK_M"], cfg["BLOCK_N"])
    o, lse = attention_fp8_quantized(x, causal, out_dtype=torch.float32, config={"REF": True})
    o_em, lse_em = attention_fp8_emulated(x, causal, ref=True)
    assert _rel(o, o_em) < 2e-6 and float((lse.double() - lse_em).abs().max()) < 1e-4
    # the same inputs, the online schedule: a different rounding of P, within FP8's error of each other
    assert 0 < _rel(o, attention_fp8_emulated(x, causal)[0]) < 0.04
    # a key that every query likes far more than anything in block 0 (its P would saturate e4m3 against
    # block 0's max): the tiles redo themselves online, and the result is the online schedule's
    k[..., 40, :] = q.mean(2) * 40
    x = quantize_fp8(q, k, v, cfg["BLOCK_M"], cfg["BLOCK_N"])
    o, _ = attention_fp8_quantized(x, causal, out_dtype=torch.float32, config={"REF": True})
    o_on, o_em = attention_fp8_emulated(x, causal)[0], attention_fp8_emulated(x, causal, ref=True)[0]
    assert _rel(o, o_em) < 2e-6
    # every tile with a row that sees key 40 fell back (causal: rows 0-31, the first tile, do not see it)
    seen = slice(32, None) if causal else slice(None)
    assert torch.equal(o_em[..., seen, :], o_on[..., seen, :])
