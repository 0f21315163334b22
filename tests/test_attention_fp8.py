"""Lesson 8's FP8 forward (fusionlab.kernels.attention_fp8): the per-block quantisation, the kernel against
its float64 emulation (the same online softmax and the same e4m3 rounding of P) within the bound the
emulation derives from Hopper's published FP8 accumulation and fp32's rounding, element by element (the
interpreter's fp32 sums sit well inside it), the error FP8 costs against float64 of the unquantised
inputs, and the errors for what it cannot take. In the interpreter the kernel runs on e4m3 inputs with P
rounded to e4m3 by the kernel's own emulation of the cast; GPU cases (``gpu``) run bf16 inputs at lesson
sizes."""

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
    mma_error_bound,
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


def _ternary(B, H, N_q, N_k, D, seed=0):
    """Q and K in {-2, 0, 2}, V in {-1, 0, 1}: each quantised block's largest value lands on e4m3's 448, so
    every product of Q K^T is 448^2 times -1, 0 or 1 and every sum fits the few bits Hopper's FP8 tensor
    cores keep (:func:`mma_error_bound` is 0 there): P is the same in the kernel and its emulation, and
    what the tensor cores round in P V is a small part of what P's own rounding costs."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v = (torch.randint(-1, 2, (B, H, n, D), generator=g).float() for n in (N_q, N_k, N_k))
    return (2 * q).to(DEV, DTYPE), (2 * k).to(DEV, DTYPE), v.to(DEV, DTYPE)


def _within(got, want, bound):
    """Element by element: the kernel within the emulation's derived bound; the worst ratio for the message."""
    excess = (got.double() - want).abs() / bound.clamp_min(1e-300)
    return bool((excess <= 1).all()), float(excess.max())


@pytest.mark.parametrize(
    "B, H, N_q, N_k, D, causal",
    [(1, 2, 50, 50, 32, False), (1, 2, 64, 64, 64, True), (2, 1, 40, 72, 32, True), (1, 1, 33, 17, 64, False),
     (1, 1, 1, 1, 32, True)],
)  # fmt: skip
def test_kernel_matches_its_float64_emulation(B, H, N_q, N_k, D, causal):
    q, k, v = _ternary(B, H, N_q, N_k, D)
    cfg = attention_fp8_config(D, causal, N_q, N_k)
    x = quantize_fp8(q, k, v, cfg["BLOCK_M"], cfg["BLOCK_N"])
    o, lse = attention_fp8_quantized(x, causal, out_dtype=torch.float32)
    o_em, lse_em, o_bound, lse_bound = attention_fp8_emulated(x, causal, bound=True, promote=cfg["PROMOTE"])
    o_exact, _ = attention_fp8_reference(x, causal)
    ok, worst = _within(o, o_em, o_bound)
    assert ok, f"the kernel leaves its emulation's bound (Hopper's FP8 sums and fp32 rounding): {worst:.3g}x"
    ok, worst = _within(lse, lse_em, lse_bound)
    assert ok, f"lse leaves its bound: {worst:.3g}x"
    # the bound is sharp enough to see P's rounding, what separates the emulation from the exact attention
    # of the same inputs: a kernel within the bound everywhere is within its norm, so one that skipped
    # the rounding (as far from the emulation as the exact attention is) would leave it somewhere
    if N_k > 1:
        assert float(o_bound.norm()) < float((o_em - o_exact).norm())


def test_mma_error_bound_is_zero_for_sums_that_fit_and_grows_with_spread():
    # 448 * 448 * (sums of up to 64 of -1, 0, 1) fits 13 bits: exact; e4m3 values 16 binades apart do not
    g = torch.Generator().manual_seed(0)
    a = 448.0 * torch.randint(-1, 2, (8, 64), generator=g).double()
    assert float(mma_error_bound(a, a.T).abs().max()) == 0.0
    wide = torch.exp2(torch.randint(-8, 8, (8, 64), generator=g).double()) * torch.randint(-1, 2, (8, 64), generator=g)
    b = mma_error_bound(wide, wide.T)
    assert float(b.max()) > 0
    # never more than a few units of the 13th bit of the largest product per group of 32 (two groups here)
    assert bool((b <= 2 * 34 * 2.0 ** (16 - 12) + 2.0**-10 * (wide @ wide.T).abs()).all())
    # promoting every 32 products to fp32 cannot loosen it by more than fp32's half ulp per add
    assert bool((mma_error_bound(wide, wide.T, promote=32) <= b * (1 + 1e-6) + 1e-3).all())


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
    # device read what the host's do. On a GPU Triton 3.6's pass fails on this kernel below 8 warps: a
    # refusal by name, before the compiler is reached; at 8 warps the partitions may lay out (and so sum)
    # the rows in another order, so there both loops are held to the emulation's bound instead
    q, k, v = _ternary(1, 2, 256, 256, 128)
    cfg = attention_fp8_config(128, False, 256)
    x = quantize_fp8(q, k, v, cfg["BLOCK_M"], cfg["BLOCK_N"])
    if runtime.is_gpu():
        with pytest.raises(KernelInputError, match="WS with num_warps=4"):
            attention_fp8_quantized(x, False, config={"WS": True, "num_warps": 4})
        o_em, _, o_bound, _ = attention_fp8_emulated(x, False, bound=True)
        for ws in (False, True):  # the loop as it compiled warp-specialised on an H200 (PROMOTE off)
            cfg = {"WS": ws, "num_warps": 8, "PROMOTE": 0}
            o = attention_fp8_quantized(x, False, out_dtype=torch.float32, config=cfg)[0]
            assert _within(o, o_em, o_bound)[0], ws
    else:
        ws = attention_fp8_quantized(x, False, config={"WS": True})[0]
        assert torch.equal(attention_fp8_quantized(x, False)[0], ws)


def test_wider_key_blocks_than_query_tiles_without_the_causal_mask():
    # FlashAttention-3's FP8 tiles take more keys a step than queries; the causal diagonal cannot (a query
    # tile's diagonal must start a key block)
    bm, bn = (64, 128) if runtime.is_gpu() else (16, 32)  # a GPU's FP8 tiles start at 64 rows
    q, k, v = _ternary(1, 1, 150, 300, 32)
    x = quantize_fp8(q, k, v, bm, bn)
    cfg = {"BLOCK_M": bm, "BLOCK_N": bn}
    o, _ = attention_fp8_quantized(x, False, out_dtype=torch.float32, config=cfg)
    o_em, _, o_bound, _ = attention_fp8_emulated(x, False, bound=True)
    assert _within(o, o_em, o_bound)[0]
    with pytest.raises(KernelInputError, match="causal: BLOCK_M a multiple of BLOCK_N"):
        attention_fp8_quantized(x, True, config=cfg)


@pytest.mark.parametrize("opt", [{"PIPE": 1}, {"PIPE": 2}, {"PROMOTE": 64}, {"EXP16": True, "PIPE": 2}])
def test_pipelined_and_promoted_loops_stay_within_the_bound(opt):
    # PIPE only reorders the loop (the interpreter: the same bits); PROMOTE sums P V in fp32 between
    # groups of keys, EXP16 takes P's exponentials in fp16: the emulation's bound takes both as arguments
    q, k, v = _ternary(1, 2, 200, 200, 64)
    if "PROMOTE" in opt and not runtime.is_gpu():
        opt = {**opt, "PROMOTE": 0}  # the interpreter's 16-key blocks are narrower than one promotion
    cfg = attention_fp8_config(64, True, 200)
    x = quantize_fp8(q, k, v, cfg["BLOCK_M"], cfg["BLOCK_N"])
    o, _ = attention_fp8_quantized(x, True, out_dtype=torch.float32, config=opt)
    o_em, _, o_bound, _ = attention_fp8_emulated(
        x, True, bound=True, promote=opt.get("PROMOTE", 0), exp16=opt.get("EXP16", False)
    )
    ok, worst = _within(o, o_em, o_bound)
    assert ok, worst
    if not runtime.is_gpu() and set(opt) == {"PIPE"}:
        assert torch.equal(o, attention_fp8_quantized(x, True, out_dtype=torch.float32)[0])


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
    # against the emulation, within its derived bound, on the first 128 queries of one head (the bound's
    # float64 products are large): Hopper's FP8 sums move scores, and a score that moves moves P across
    # e4m3's rounding boundaries; the bound counts both
    cfg = attention_fp8_config(D, causal, N)
    x = quantize_fp8(q[:, :1], k[:, :1], v[:, :1], cfg["BLOCK_M"], cfg["BLOCK_N"])
    o, _ = attention_fp8_quantized(x, causal, out_dtype=torch.float32)
    o_em, _, o_bound, _ = attention_fp8_emulated(x, causal, bound=True, promote=cfg["PROMOTE"])
    ok, worst = _within(o[..., :128, :], o_em[..., :128, :], o_bound[..., :128, :])
    assert ok, worst


@pytest.mark.parametrize("causal", [False, True])
def test_ref_schedule_matches_its_emulation_and_falls_back(causal):
    q, k, v = _ternary(1, 1, 160, 160, 32)
    cfg = attention_fp8_config(32, causal, 160, 160)
    x = quantize_fp8(q, k, v, cfg["BLOCK_M"], cfg["BLOCK_N"])
    o, lse = attention_fp8_quantized(x, causal, out_dtype=torch.float32, config={"REF": True})
    o_em, lse_em, o_bound, lse_bound = attention_fp8_emulated(x, causal, ref=True, bound=True)
    assert _within(o, o_em, o_bound)[0] and _within(lse, lse_em, lse_bound)[0]
    # the same inputs, the online schedule: a different rounding of P, within FP8's error of each other
    assert 0 < _rel(o, attention_fp8_emulated(x, causal)[0]) < 0.04
    # a key that every query likes far more than anything in block 0 (its P would saturate e4m3 against
    # block 0's max), past block 0 at every tile size (GPU: 64 keys a block): the tiles redo themselves
    # online, and the result is the online schedule's
    k[..., 140, :] = q.mean(2) * 40
    x = quantize_fp8(q, k, v, cfg["BLOCK_M"], cfg["BLOCK_N"])
    o, _ = attention_fp8_quantized(x, causal, out_dtype=torch.float32, config={"REF": True})
    o_em, _, o_bound, _ = attention_fp8_emulated(x, causal, ref=True, bound=True)
    o_on = attention_fp8_emulated(x, causal)[0]
    assert _within(o, o_em, o_bound)[0]
    # every tile with a row that sees key 140 fell back (causal: the tiles from row 128 on, at both tile
    # sizes: 32 and 128 rows)
    seen = slice(128, None) if causal else slice(None)
    assert torch.equal(o_em[..., seen, :], o_on[..., seen, :])
