"""Lesson 8's FA3 step: an FP8 (e4m3) attention forward with per-block scales, for Hopper.

FlashAttention-3's third idea (after warp specialisation and ping-pong) is FP8: Hopper's tensor cores
multiply e4m3 at twice bf16's rate, so a forward whose time is set by its two matmuls could run up to
twice as fast, for an error that has to be measured. This module is that step, forward only (FP8
training is out of the course's scope).

Quantisation (:func:`quantize_fp8`, plain torch: memory-bound, done once per tensor):

- **Q**: one scale per block of ``BLOCK_M`` query rows of a head, ``amax / 448`` (448: e4m3's largest
  finite value), so one outlier row spoils only its block;
- **K**: one scale per block of ``BLOCK_N`` key rows of a head;
- **V**: one scale per channel of a head (``amax`` over the sequence), stored **transposed**,
  ``(B, H, D, N_k)``. Transposed because Hopper's FP8 ``wgmma`` reads both operands K-major: in
  ``P V`` the reduction runs over keys, so V's keys must be contiguous (Triton's fused-attention tutorial
  does the same: its FP8 V is a transposed view). Per channel rather than per key block because a
  channel's scale factors out of the sum over keys, ``O[:, d] = s_v[d] * sum_j P[:, j] V8[j, d]``, and is
  applied once in the epilogue; a per-key-block scale would need its own product and add every step.

The kernel (:func:`attention_fp8_quantized`): the package forward's online softmax with
``s = (Q8 K8^T) * (s_q * s_k * scale)`` — the two block scales fold into the one multiply that scales
the scores already — and ``P`` cast to e4m3 for the second product. ``P <= 1`` after the max is
subtracted; e4m3 has full precision only down to 2^-6, so P is computed as ``exp2(s - m + 8)``, i.e.
times 256 (at most 256 < 448), which moves the small probabilities out of e4m3's subnormals for free (the
row sum ``l`` carries the same factor and ``O = acc / l`` cancels it; lse subtracts the 8 back). The
accumulators, the max and the sum are fp32; O comes out in bf16 (or what ``out_dtype`` asks), with the
natural-log ``lse`` as the package's forward returns it.

Scope: head dims 32, 64, 128; any N_q, N_k (masked last blocks); causal (top-left, as the package);
H_q == H_kv; finite inputs. On a GPU it needs FP8 tensor cores (compute capability 8.9 or more; the
tiles are tuned on Hopper). Loads go through host tensor descriptors on Hopper when the layout allows
(``TMA``), through pointers elsewhere.

Hopper's FP8 sums. The e4m3 products are exact, but an FP8 ``wgmma`` does not add them in fp32: it takes
them 32 at a time, aligns them to the largest exponent among them and truncates each (DeepSeek-V3's
report, section 3.5.2: 14 bits kept after a sign-filled right shift), and keeps the accumulator to 13
mantissa bits (SageAttention2, section 4: of an fp32 C, the low 10 bits are dropped). Triton accumulates
FP8 dots this way on Hopper by default (``max_num_imprecise_acc`` = 2^30); given a smaller value it lets
the tensor cores sum that many products from zero and adds the partial sum to the accumulator in fp32
(the kernel's ``PROMOTE`` option for ``P V``, where the accumulator runs over the whole sequence). So
the kernel differs from an fp32-exact emulation by more than fp32 rounding: moved scores move some P
across e4m3's rounding boundaries, and ``P V``'s small products lose bits. :func:`mma_error_bound`
bounds what the published description allows (read conservatively), and
:func:`attention_fp8_emulated` carries it through the softmax to a bound on O and lse, element by
element; the tests hold the kernel to it, and ``benchmarks/probes/probe_fp8_ab.py`` checks the
description itself against the hardware, one ``tl.dot`` at a time.

The interpreter: Triton's interpreter reads e4m3 and multiplies it exactly, but its in-kernel cast from
fp32 to e4m3 rounds wrongly across a binade (7.97 became 4.0 under Triton 3.9). So on the interpreter
the kernel first rounds P to e4m3's grid in fp32 arithmetic (:func:`_round_e4m3`, round to nearest
even) and casts only exact values. The GPU path casts directly; both round P the same way.

The error is stated against float64 (:func:`attention_fp8_error`): of the whole (quantise, kernel)
path against the exact attention of the bf16 inputs, and of the kernel against
:func:`attention_fp8_reference` — the exact attention of the *dequantised* inputs — which separates
what the inputs' quantisation costs from what the kernel's FP8 P costs.

Reference: Shah et al., "FlashAttention-3" (2024), section 3.3 (block quantisation, V transposed for
FP8 wgmma); Triton's tutorial 06, fused attention, its FP8 path.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import runtime
from ._attention import LOG2E, TensorDescriptor, config_key, default_scale, hopper, scores64
from ._launch import KernelInputError, cdiv, check_tensor, launch_kwargs
from .attention_backward import key_range

OP = "attention_fp8"
FP8 = torch.float8_e4m3fn
#: e4m3's largest finite magnitude
FP8_MAX = 448.0
#: P is computed times 2**P_SHIFT (see the module's docstring)
P_SHIFT = 8
#: the REF schedule (config ``"REF"``): P = 2^(s - m_ref + REF_SHIFT) against block 0's row max, and a row
#: whose scores pass that reference by more than REF_ROOM (base 2) sends its tile through the online loop:
#: 2^(REF_SHIFT + REF_ROOM) stays under e4m3's 448 (the kernel writes these two numbers as literals)
REF_SHIFT, REF_ROOM = 4, 4.8
HEAD_DIMS = (32, 64, 128)
#: (BLOCK_M, BLOCK_N, num_warps, num_stages, REF) by (head dim, causal) on a GPU. Head dim 128: the fastest of
#: eight tiles summed over N = 4k and 16k on an H100, and again of seven with REF off and on on an H200
#: (2026-11-27, benchmarks/bench_attention_fp8.py; benchmarks/notes_attention_backward.md, "FP8 forward,
#: warp specialisation, backward tiles"): REF was slower at every tile but one. Head dim 64: the H200
#: sweep's fastest of three; 32: not measured, 64's causal tile
GPU_TABLE = {
    (32, False): (128, 64, 4, 3, False), (32, True): (128, 64, 4, 3, False),
    (64, False): (128, 128, 4, 3, False), (64, True): (128, 128, 4, 3, False),
    (128, False): (128, 128, 4, 3, False), (128, True): (64, 64, 4, 3, False),
}  # fmt: skip
#: the loop's options on a GPU by (head dim, causal), where measured faster (``PROMOTE``, ``PIPE``, ``EXP16``:
#: :func:`attention_fp8_quantized`); elsewhere off. Head dim 128 without the mask: ``P V`` promoted to fp32
#: every block (its add and the rescale contract to one FMA), the fastest of 38 variants summed over N = 4k
#: and 16k on an H200 (2026-11-27, benchmarks/probes/probe_fp8_ab.py: 1.34x and 1.40x the bf16 forward
#: against 1.32x and 1.35x without); causal: nothing beat the plain loop (notes_attention_backward.md,
#: "2026-11-27 (later)")
GPU_OPTIONS: dict = {(128, False): {"PROMOTE": 128}}
#: what ``config`` may override
CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "WS", "REF", "PROMOTE", "PIPE", "EXP16")
#: ``PIPE``'s values (:func:`_fp8_inner`): 0 off; 1, 2: where the next block's ``Q K^T`` is issued
PIPE_CHOICES = (0, 1, 2)
#: ``PROMOTE``'s values: 0 (the tensor cores accumulate ``P V`` into ``acc`` themselves) or every how many keys
#: the partial sum is added to ``acc`` in fp32 (a multiple of ``wgmma``'s 32, at most ``BLOCK_N``)
PROMOTE_CHOICES = (0, 32, 64, 128)
#: the interpreter: few programs, but a causal diagonal of several blocks and partial last blocks
INTERPRETER_TILE = (32, 16, 4, 1, False)


class Fp8Inputs(NamedTuple):
    """Q, K, V in e4m3 with their scales (:func:`quantize_fp8`): ``q8`` (B, H, N_q, D), ``k8`` (B, H, N_k,
    D), ``vt8`` (B, H, D, N_k): V transposed; ``q_scale`` (B, H, cdiv(N_q, block_m)), ``k_scale`` (B, H,
    cdiv(N_k, block_n)), ``v_scale`` (B, H, D), fp32; the block sizes the scales were taken over."""

    q8: torch.Tensor
    k8: torch.Tensor
    vt8: torch.Tensor
    q_scale: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    block_m: int
    block_n: int


def _block_scales(t: torch.Tensor, block: int) -> torch.Tensor:
    """amax / 448 of each block of ``block`` rows of each head (fp32, a zero block gets scale 1)."""
    B, H, N, D = t.shape
    pad = cdiv(N, block) * block - N
    tp = torch.nn.functional.pad(t, (0, 0, 0, pad)) if pad else t
    amax = tp.reshape(B, H, -1, block * D).abs().amax(-1).float()
    return torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))


def _expand(scales: torch.Tensor, block: int, n: int) -> torch.Tensor:
    """Per-block scales repeated to per-row, (B, H, n, 1)."""
    return scales.repeat_interleave(block, dim=-1)[..., :n, None]


def quantize_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_m: int, block_n: int) -> Fp8Inputs:
    """Q and K with a scale per block of rows, V with a scale per channel, stored transposed (the
    module's docstring says why each)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name, op=OP, dtypes=(torch.bfloat16, torch.float16, torch.float32), ndim=4, contiguous=False)
    if k.shape[2] == 0:
        raise KernelInputError(f"{OP}: no keys (N_k = 0): every row's softmax would be empty.")
    qs, ks = _block_scales(q, block_m), _block_scales(k, block_n)
    vamax = v.abs().amax(2).float()
    vs = torch.where(vamax > 0, vamax / FP8_MAX, torch.ones_like(vamax))
    q8 = (q.float() / _expand(qs, block_m, q.shape[2])).to(FP8)
    k8 = (k.float() / _expand(ks, block_n, k.shape[2])).to(FP8)
    vt8 = (v.float() / vs[:, :, None, :]).to(FP8).transpose(2, 3).contiguous()
    return Fp8Inputs(q8, k8, vt8, qs, ks, vs, int(block_m), int(block_n))


def dequantize_fp8(x: Fp8Inputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What the e4m3 inputs stand for, in float64: ``(q, k, v)``, v back in (B, H, N_k, D)."""
    q = x.q8.double() * _expand(x.q_scale.double(), x.block_m, x.q8.shape[2])
    k = x.k8.double() * _expand(x.k_scale.double(), x.block_n, x.k8.shape[2])
    v = x.vt8.double().transpose(2, 3) * x.v_scale.double()[:, :, None, :]
    return q, k, v


def attention_fp8_reference(x: Fp8Inputs, causal: bool = False, scale: float | None = None):
    """The exact (float64) attention of the dequantised inputs: ``(o, lse)``. What the kernel would give
    with no rounding of its own; the gap to it is the FP8 P's (and fp32 sums') error."""
    q, k, v = dequantize_fp8(x)
    s, _, vd = scores64(q, k, v, causal, default_scale(q.shape[-1], scale))
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse[..., None]) @ vd, lse


def attention_fp8_emulated(
    x: Fp8Inputs,
    causal: bool = False,
    scale: float | None = None,
    ref: bool = False,
    *,
    bound: bool = False,
    promote: int = 0,
    exp16: bool = False,
):
    """The kernel's arithmetic in float64, key block by key block: ``(o, lse)``. The same online softmax
    with the same running maxima, P times 2^8 rounded to e4m3 by torch's cast (round to nearest even)
    before ``P V``, the row sum of the unrounded P. The products are exact, as an fp32 kernel's would
    nearly be (the interpreter matches this to fp32's rounding); Hopper's FP8 tensor cores do not sum
    exactly (the module's docstring), so ``bound=True`` also returns how far the kernel may lie from it:
    ``(o, lse, o_bound, lse_bound)``, element by element, derived from the published description of that
    accumulation (:func:`mma_error_bound`) and fp32's rounding, never fitted to a measurement.
    ``promote``: the kernel's ``PROMOTE`` (P V's partial sums added in fp32 every ``promote`` keys);
    ``exp16``: its ``EXP16`` (P's exponent rounded to fp16, 2^x in fp16; the online schedule only).

    The tests compare the kernel with this within the bound; with inputs whose ``Q K^T`` the tensor
    cores sum exactly (tests/test_attention_fp8.py), P is the same in both and the bound is a small part of
    what P's rounding costs, so the check still sees the scales, the shift, the masks and P's cast.
    ``ref``: the kernel's ``REF`` schedule, block 0's row max as a fixed reference and P times 2^4, and
    a query tile with a row that passes the reference by more than 4.8 (base 2) taken from the online
    schedule instead."""
    if ref:
        r_ref = _emulate(x, causal, scale, True, promote)
        r_on = _emulate(x, causal, scale, False, promote, exp16)
        bad = r_ref[-1]
        n_q, bm = x.q8.shape[2], x.block_m
        pad = cdiv(n_q, bm) * bm - n_q
        tiles = torch.nn.functional.pad(bad, (0, pad)).view(*bad.shape[:2], -1, bm).any(-1)
        redo = tiles.repeat_interleave(bm, dim=-1)[..., :n_q]
        pairs = zip(r_on[:4], r_ref[:4], strict=True)
        out = [torch.where(redo[..., None] if a.dim() == 4 else redo, a, b) for a, b in pairs]
    else:
        out = list(_emulate(x, causal, scale, False, promote, exp16)[:4])
    return tuple(out) if bound else tuple(out[:2])


#: Hopper's FP8 ``wgmma`` as published, read conservatively (:func:`mma_error_bound`): significant bits a
#: product keeps below the group's largest exponent, and bits the sum keeps (DeepSeek-V3: 14 bits of each
#: aligned product, "sign-fill right shifting", which may count the sign; SageAttention2: the accumulator
#: keeps 13 of fp32's 23 mantissa bits, i.e. 14 significant bits); one bit fewer each is taken here
MMA_PRODUCT_BITS, MMA_SUM_BITS = 13, 13
#: products a ``wgmma`` with e4m3 operands sums before it adds them to its accumulator (its K)
MMA_GROUP = 32


def _exponent(t: torch.Tensor) -> torch.Tensor:
    """floor(log2 |t|), 0 where t is 0."""
    a = t.abs()
    return torch.floor(torch.log2(torch.where(a > 0, a, torch.ones_like(a))))


def _inexact(t: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
    """Whether ``t`` is not a multiple of ``unit`` (float64: every value here is a few bits wide)."""
    return torch.remainder(t, unit) != 0


def _mma_error(a, b, c, c_err, promote: int = 0):
    """:func:`mma_error_bound` for a C that is itself within ``c_err`` of ``c``: ``(c + a @ b, bound)``."""
    acc, err = c.clone(), c_err.clone()
    part = torch.zeros_like(acc) if promote else acc
    perr = torch.zeros_like(err) if promote else err
    K = a.shape[-1]
    for g0 in range(0, K, MMA_GROUP):
        pr = a[..., :, None, g0 : g0 + MMA_GROUP] * b[..., g0 : g0 + MMA_GROUP, :].transpose(-2, -1)[..., None, :, :]
        # the group's alignment: its largest product, or the accumulator if that is larger (conservative)
        big = torch.maximum(pr.abs().amax(-1), part.abs() + perr)
        unit = torch.exp2(_exponent(big) - (MMA_PRODUCT_BITS - 1))
        lost = _inexact(pr, unit[..., None]).sum(-1) + (_inexact(part, unit) | (perr > 0))
        part = part + pr.sum(-1)
        # the sum kept to MMA_SUM_BITS significant bits, toward zero
        r_unit = torch.exp2(_exponent(part.abs() + perr + lost * unit) - (MMA_SUM_BITS - 1))
        perr = perr + lost * unit + (_inexact(part, r_unit) | (perr > 0) | (lost > 0)) * r_unit
        if promote and ((g0 + MMA_GROUP) % promote == 0 or g0 + MMA_GROUP >= K):
            acc = acc + part  # an fp32 add: rounds to nearest
            err = err + perr + (acc.abs() + err + perr) * 2.0**-24
            part, perr = torch.zeros_like(acc), torch.zeros_like(err)
    return (acc, err) if promote else (part, perr)


def mma_error_bound(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None, *, promote: int = 0):
    """How far Hopper's FP8 tensor cores may put ``c + a @ b`` (a: (..., M, K), b: (..., K, N), e4m3
    values in float64; c fp32 values, or 0) from its exact value, element by element.

    The published description (DeepSeek-V3's report, section 3.5.2; SageAttention2, section 4): a
    ``wgmma`` with e4m3 operands takes its products 32 at a time; they are exact (4 by 4 significant
    bits), then aligned to the largest exponent among them and truncated (right-shifted, the bits past
    the kept width dropped), summed, added to the fp32 accumulator, and the result is kept to 13 mantissa
    bits. Read conservatively (:data:`MMA_PRODUCT_BITS`, :data:`MMA_SUM_BITS`, the accumulator counted in
    the alignment): each product not a multiple of the group's unit ``2^(e - 12)`` (e the exponent of
    the largest product or of the accumulator) loses less than one unit, the accumulator likewise, and
    the sum loses less than one unit of its 13th significant bit. Sums that fit those bits are exact, as
    the bound says. ``promote`` (Triton's ``max_num_imprecise_acc``): the partial sums start from zero
    and are added to the accumulator in fp32 every ``promote`` products (an fp32 add's half ulp)."""
    c = torch.zeros(*a.shape[:-1], b.shape[-1], dtype=torch.float64, device=a.device) if c is None else c.double()
    return _mma_error(a.double(), b.double(), c, torch.zeros_like(c), promote)[1]


def _round_fp8(p: torch.Tensor) -> torch.Tensor:
    """P rounded to e4m3 as the kernel casts it (round to nearest even, saturating)."""
    return p.clamp(max=FP8_MAX).float().to(FP8).double()


def _emulate(x: Fp8Inputs, causal: bool, scale, ref: bool, promote: int = 0, exp16: bool = False):
    """:func:`attention_fp8_emulated`'s arithmetic for one schedule: ``(o, lse, o_bound, lse_bound, rows
    past the reference)``.

    The bound. The kernel's scores ``Q K^T`` may lie ``dq`` from the exact ones (:func:`mma_error_bound`,
    times the scale): in base 2, ``ds = dq * c``; a row's maxima move by at most its largest ``ds``, D_i.
    So each of the kernel's P (before its cast) lies within a factor ``2^E``, ``E = 2 D_i``, of the
    emulation's, times fp32's own (:data:`_P_FP32`: the scores' rounding and ``exp2``'s approximation), and
    where that interval straddles an e4m3 rounding boundary the kernel's e4m3 P may be the neighbour
    (``amb``, its distance). The rescales between blocks move by the same factor. The row sum ``l`` (of the
    unrounded P, fp32) is within ``lam`` of its own; ``P V``'s sums within :func:`mma_error_bound`. So
    ``|o_k - o| <= s_v (sum_j (amb_j + p8_j (2^E - 1)) a_j |v_j| + e_PV + |acc| lam) / (l (1 - lam))``,
    ``a_j`` the rescale block j's P meets after it, plus the epilogue's fp32 rounding."""
    B, H, N_q, D = x.q8.shape
    N_k, bn = x.k8.shape[2], x.block_n
    c_row = _expand(x.q_scale.double(), x.block_m, N_q) * (default_scale(D, scale) * LOG2E)
    q8, k8, vt8 = x.q8.double(), x.k8.double(), x.vt8.double()
    dev = q8.device
    m = torch.full((B, H, N_q, 1), float("-inf"), dtype=torch.float64, device=dev)
    l = torch.zeros_like(m)  # noqa: E741  (the row sum's name in every FlashAttention paper)
    acc = torch.zeros((B, H, N_q, D), dtype=torch.float64, device=dev)
    rows = torch.arange(N_q, device=dev)[:, None]
    bad = torch.zeros((B, H, N_q), dtype=torch.bool, device=dev)
    # the bound's pieces: the row's largest score error (base 2), the numerator's error terms
    ds_max = torch.zeros_like(m)
    pv_err = torch.zeros_like(acc)
    blocks = []
    for j0 in range(0, N_k, bn):
        kb = k8[:, :, j0 : j0 + bn]
        c_blk = c_row * x.k_scale.double()[:, :, j0 // bn, None, None]
        qk = q8 @ kb.transpose(-2, -1)
        ds = mma_error_bound(q8, kb.transpose(-2, -1)) * c_blk
        s = qk * c_blk
        if causal:
            hide = rows < torch.arange(j0, min(j0 + bn, N_k), device=dev)[None, :]
            s = s.masked_fill(hide, float("-inf"))
            ds = ds.masked_fill(hide, 0.0)
        ds_max = torch.maximum(ds_max, ds.amax(-1, keepdim=True))
        m_blk = s.amax(-1, keepdim=True)
        if ref:
            m = m_blk if j0 == 0 else m
            bad |= (m_blk > m + REF_ROOM).squeeze(-1)
            p = torch.exp2(s - (m - REF_SHIFT))
            l = l + p.sum(-1, keepdim=True)  # noqa: E741
            alpha = torch.ones_like(m)
        else:
            m_new = torch.maximum(m, m_blk)
            xe = s - (m_new - P_SHIFT)
            p = _exp2_16(xe) if exp16 else torch.exp2(xe)
            alpha = torch.exp2(m - m_new)
            l = l * alpha + p.sum(-1, keepdim=True)  # noqa: E741
            m = m_new
        p8 = _round_fp8(p)
        vb = vt8[:, :, :, j0 : j0 + bn].transpose(-2, -1)
        # P V as the tensor cores sum it onto the rescaled accumulator (an fp32 multiply: half an ulp)
        acc = acc * alpha
        acc, pv_err = _mma_error(p8, vb, acc, pv_err * alpha + acc.abs() * 2.0**-24, promote)
        blocks = [(pb, p8b, ab * alpha, vbb, xb) for pb, p8b, ab, vbb, xb in blocks]
        blocks.append((p, p8, torch.ones_like(alpha), vb, xe if exp16 and not ref else None))
    o = acc * x.v_scale.double()[:, :, None, :] / l
    shift = REF_SHIFT if ref else P_SHIFT
    lse = ((m + torch.log2(l)).squeeze(-1) - shift) * math.log(2.0)
    # the bound, with the final D_i of each row (every block's maxima move by at most it)
    E = 2 * ds_max
    grow = torch.exp2(E) * (1 + _P_FP32)
    num = torch.zeros_like(acc)
    l_err = torch.zeros_like(l)
    for p, p8, a, vb, xe in blocks:
        if xe is None:  # P within a factor grow of the emulation's
            p_lo, p_hi = p / grow, p * grow
        else:  # EXP16: the exponent within E (and fp32's rounding) of the emulation's, then fp16's exp2
            dx = E + xe.abs().nan_to_num(0.0, 0.0, 0.0) * 2.0**-22
            p_lo, p_hi = _exp2_16(xe - dx) * (1 - _EX2_F16), _exp2_16(xe + dx) * (1 + _EX2_F16)
        amb = torch.maximum((_round_fp8(p_hi) - p8).abs(), (p8 - _round_fp8(p_lo)).abs())
        num = num + ((amb * grow + p8 * (grow - 1)) * a) @ vb.abs()
        l_err = l_err + (torch.maximum(p_hi - p, p - p_lo) * a * grow).sum(-1, keepdim=True)
    lam = l_err / l + (grow - 1) + N_k * 2.0**-24
    vs = x.v_scale.double()[:, :, None, :]
    o_bound = vs * (num + pv_err + acc.abs() * lam) / (l * (1 - lam).clamp_min(1e-3)) + o.abs() * 2.0**-20
    # lse: the row max's move, the row sum's, and fp32's rounding of m + log2(l) - shift (a few ulps of it)
    lse_bound = (ds_max + torch.log2(1 / (1 - lam).clamp_min(1e-3))).squeeze(-1) * math.log(2.0)
    lse_bound = lse_bound + ((m.abs() + torch.log2(l).abs()).squeeze(-1) + shift) * 2.0**-20
    return o, lse, o_bound, lse_bound, bad


#: P's relative error from fp32 alone: the scores' rounding (|s| up to ~30) and ex2.approx's two ulps
_P_FP32 = 2.0**-18
#: ``ex2.approx.f16x2``'s relative error, its fp16 rounding included, taken conservatively (the EXP16 option)
_EX2_F16 = 2.0**-8


def _exp2_16(t: torch.Tensor) -> torch.Tensor:
    """2^t as the EXP16 option computes it: t rounded to fp16, its exp2 rounded to fp16 (float64 out)."""
    return torch.exp2(t.to(torch.float16).double()).to(torch.float16).double()


# -- the configuration ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def _config(d: int, causal: bool, n_q: int, n_k: int, gpu: bool) -> dict:
    bm, bn, nw, ns, ref = GPU_TABLE[(d, causal)] if gpu else INTERPRETER_TILE
    cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": nw, "num_stages": ns, "REF": ref}
    return {**cfg, "PROMOTE": 0, "PIPE": 0, "EXP16": False, **(GPU_OPTIONS.get((d, causal), {}) if gpu else {})}


def attention_fp8_config(D: int, causal: bool = False, N_q: int = 4096, N_k: int | None = None) -> dict:
    """The tiles the launcher picks: ``BLOCK_M`` (queries a program holds; Q's quantisation block),
    ``BLOCK_N`` (keys a step; K's quantisation block), ``num_warps``, ``num_stages``, ``REF`` (the
    fixed-reference schedule) and the loop's options ``PROMOTE``, ``PIPE``, ``EXP16``."""
    return dict(_config(int(D), bool(causal), int(N_q), int(N_q if N_k is None else N_k), runtime.is_gpu()))


# -- the kernel -----------------------------------------------------------------------------------
@triton.jit
def _round_e4m3(x):
    """fp32 values rounded to e4m3's grid (round to nearest even, saturating at 448): normal numbers keep
    3 of fp32's 23 mantissa bits, subnormals (below 2^-6) are multiples of 2^-9. The interpreter's own
    cast rounds wrongly; the values this returns cast exactly."""
    x = tl.minimum(tl.maximum(x, -448.0), 448.0)
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576  # 0xFFF00000: RNE of the low 20 bits
    normal = bits.to(tl.float32, bitcast=True)
    sub = (x + 16384.0) - 16384.0  # fp32's ulp at 2^14 is 2^-9: RNE to a multiple of 2^-9
    return tl.where(tl.abs(x) < 0.015625, sub, normal)


@triton.jit
def _fp8_inner(
    acc, l_i, m_i, bad, q, k_src, vt_src, ks_ptr, k_row, vt_row, offs_m, offs_n0, offs_d, n_k, stride_kn,
    stride_vd, c_row, lo, hi,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
    TMA: tl.constexpr, EMULATE: tl.constexpr, WS: tl.constexpr, REF: tl.constexpr, PROMOTE: tl.constexpr,
    PIPE: tl.constexpr, EXP16: tl.constexpr,
):  # fmt: skip
    """Key blocks ``[lo, hi)``: the online softmax with e4m3 products. ``c_row``: s_q * scale * log2(e)
    (the Q block's part of the scores' multiplier); each step multiplies in its K block's scale. ``WS``:
    the loop warp-specialised by Triton (producer warps load, consumer warps compute). ``REF``: ``m_i`` is
    a fixed reference, block 0's row max, and P = 2^(s - m_ref + 4): no rescale of ``acc`` and ``l``; a
    row whose scores pass the reference by more than 4.8 (base 2: its P would pass e4m3's 448 and
    saturate) is flagged in ``bad`` and the kernel redoes the tile online. ``PROMOTE`` (> 0): ``P V``'s
    products summed by the tensor cores from zero and added to ``acc`` in fp32 every ``PROMOTE`` keys
    (Triton's ``max_num_imprecise_acc``; 0: the hardware's own accumulation into ``acc``, module
    docstring). ``PIPE`` (unmasked blocks only): the next block's ``Q K^T`` is issued in this step, so
    the tensor cores may work while exponentials run — 1: before this block's softmax; 2: after it,
    before its ``P V`` (FlashAttention-3's intra-warpgroup order: the next softmax under this ``P V``);
    the last step recomputes its own block's scores, never read. Whether Triton's waits let them
    overlap is measured (``benchmarks/probes/probe_fp8_ab.py``)."""
    if PIPE > 0:  # the first block's scores before the loop (a partial block only when there is no full one)
        lo_k = tl.minimum(lo, tl.maximum(hi - BLOCK_N, 0))
        qk_next = tl.dot(q, tl.trans(_load_k(k_src, k_row, lo_k, offs_n0, offs_d, n_k, stride_kn, TMA, True)))
    else:
        qk_next = tl.zeros([BLOCK_N], dtype=tl.float32)  # unused: a placeholder the loop carries
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        if TMA:
            vt = vt_src.load([vt_row, start_n])
        else:
            vt_ptrs = vt_src + offs_d.to(tl.int64)[:, None] * stride_vd + offs_n[None, :]
            if MASKED:
                vt = tl.load(vt_ptrs, mask=offs_n[None, :] < n_k, other=0.0)
            else:
                vt = tl.load(vt_ptrs)
        c = c_row * tl.load(ks_ptr + start_n // BLOCK_N)  # > 0: the scores in log2 units are qk * c
        if PIPE > 0:
            qk = qk_next
        if PIPE == 1:  # the next block's scores issued before this block's softmax
            nxt = tl.minimum(start_n + BLOCK_N, hi - BLOCK_N)  # unmasked: hi is a multiple of BLOCK_N
            qk_next = tl.dot(q, tl.trans(_load_k(k_src, k_row, nxt, offs_n0, offs_d, n_k, stride_kn, TMA, False)))
        if PIPE == 0:
            qk = tl.dot(q, tl.trans(_load_k(k_src, k_row, start_n, offs_n0, offs_d, n_k, stride_kn, TMA, MASKED)))
        if MASKED:
            keep = offs_n[None, :] < n_k
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            qk = tl.where(keep, qk * c, float("-inf"))
            m_blk = tl.max(qk, 1)
        else:  # the row max of the raw scores, then scale and subtract in one FMA per score
            m_blk = tl.max(qk, 1) * c
        if REF:
            if start_n == 0:  # every row sees key 0: block 0's max is finite for finite inputs
                m_i = m_blk
            bad = bad | (m_blk > m_i + 4.8).to(tl.int32)  # REF_ROOM: 2^(4 + 4.8) < 448
            if MASKED:
                p = tl.math.exp2(qk - (m_i[:, None] - 4.0))
            else:
                p = tl.math.exp2(qk * c - (m_i[:, None] - 4.0))
            l_i += tl.sum(p, 1)
        else:
            # P times 2^8: e4m3's normal range instead of its subnormals (the module's docstring)
            m_ij = tl.maximum(m_i, m_blk)
            if MASKED:
                x = qk - (m_ij[:, None] - 8.0)
            else:
                x = qk * c - (m_ij[:, None] - 8.0)
            if EXP16:  # two exponentials per MUFU instruction, in fp16: P keeps more bits than e4m3 takes
                p = _exp2_half(x, EMULATE)
                l_blk = tl.sum(p.to(tl.float32), 1)
            else:
                p = tl.math.exp2(x)
                l_blk = tl.sum(p, 1)
            alpha = tl.math.exp2(m_i - m_ij)
            l_i = l_i * alpha + l_blk
            acc = acc * alpha[:, None]
            m_i = m_ij
        if EMULATE:
            p = _round_e4m3(p.to(tl.float32))
        if PIPE == 2:  # the next block's scores issued before this block's P V (FlashAttention-3's order)
            nxt = tl.minimum(start_n + BLOCK_N, hi - BLOCK_N)  # unmasked: hi is a multiple of BLOCK_N
            qk_next = tl.dot(q, tl.trans(_load_k(k_src, k_row, nxt, offs_n0, offs_d, n_k, stride_kn, TMA, False)))
        if PROMOTE > 0:
            acc = tl.dot(p.to(tl.float8e4nv), tl.trans(vt), acc, max_num_imprecise_acc=PROMOTE)
        else:
            acc = tl.dot(p.to(tl.float8e4nv), tl.trans(vt), acc)
    return acc, l_i, m_i, bad


@triton.jit
def _exp2_half(x, EMULATE: tl.constexpr):
    """2^x for fp32 ``x <= 8`` as fp16 (the ``EXP16`` option): x rounded to fp16, then ``ex2.approx.f16x2``,
    two lanes an instruction (the interpreter: exp2 of the fp16 x, rounded to fp16)."""
    h = x.to(tl.float16)
    if EMULATE:
        return tl.math.exp2(h.to(tl.float32)).to(tl.float16)
    else:
        return tl.inline_asm_elementwise(
            "ex2.approx.f16x2 $0, $1;", "=r,r", [h], dtype=tl.float16, is_pure=True, pack=2
        )


@triton.jit
def _load_k(k_src, k_row, start, offs_n0, offs_d, n_k, stride_kn, TMA: tl.constexpr, MASKED: tl.constexpr):
    """The K block of keys ``start + offs_n0`` (a descriptor zero-fills past ``n_k``; pointers are masked
    when asked)."""
    if TMA:
        k = k_src.load([k_row + start, 0])
    else:
        offs_n = start + offs_n0
        k_ptrs = k_src + offs_n.to(tl.int64)[:, None] * stride_kn + offs_d[None, :]
        if MASKED:
            k = tl.load(k_ptrs, mask=offs_n[:, None] < n_k, other=0.0)
        else:
            k = tl.load(k_ptrs)
    return k


@triton.jit
def _fp8_tile(
    q, k_src, vt_src, ks_base, k_row, vt_row, offs_m, offs_n0, offs_d, n_k, c_row, lo_mask, hi,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    TMA: tl.constexpr, EMULATE: tl.constexpr, WS: tl.constexpr, REF: tl.constexpr, PROMOTE: tl.constexpr,
    PIPE: tl.constexpr, EXP16: tl.constexpr,
):  # fmt: skip
    """Every key block of a Q tile: ``[0, lo_mask)`` unmasked, ``[lo_mask, hi)`` masked. Returns
    ``(acc, l, m, bad)``; with ``REF``, ``m`` is the reference and ``bad`` flags the rows it failed."""
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    bad = tl.zeros([BLOCK_M], dtype=tl.int32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    acc, l_i, m_i, bad = _fp8_inner(acc, l_i, m_i, bad, q, k_src, vt_src, ks_base, k_row, vt_row, offs_m, offs_n0,
                                    offs_d, n_k, HEAD_DIM, n_k, c_row, 0, lo_mask, HEAD_DIM, BLOCK_N, False,
                                    CAUSAL, TMA, EMULATE, WS, REF, PROMOTE, PIPE, EXP16)  # fmt: skip
    acc, l_i, m_i, bad = _fp8_inner(acc, l_i, m_i, bad, q, k_src, vt_src, ks_base, k_row, vt_row, offs_m, offs_n0,
                                    offs_d, n_k, HEAD_DIM, n_k, c_row, lo_mask, hi, HEAD_DIM, BLOCK_N, True,
                                    CAUSAL, TMA, EMULATE, False, REF, PROMOTE, 0, EXP16)  # fmt: skip
    return acc, l_i, m_i, bad


@triton.jit
def _fp8_fwd_kernel(
    q_ptr, k_ptr, vt_ptr, qs_ptr, ks_ptr, vs_ptr, o_ptr, lse_ptr, q_desc, k_desc, vt_desc,
    n_q, n_k, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    TMA: tl.constexpr, EMULATE: tl.constexpr, WS: tl.constexpr, REF: tl.constexpr, PROMOTE: tl.constexpr,
    PIPE: tl.constexpr, EXP16: tl.constexpr,
):  # fmt: skip
    # grid: (query tiles, H, B); q8, k8 (B, H, N, D) and vt8 (B, H, D, N_k) contiguous. Query tiles from
    # the last: a causal head's longest tiles start first
    if WS:  # Triton's warp specialisation on Hopper wants descriptors made on the device
        rows = tl.num_programs(1) * tl.num_programs(2)
        q_desc = tl.make_tensor_descriptor(q_ptr, shape=[rows * n_q, HEAD_DIM], strides=[HEAD_DIM, 1],
                                           block_shape=[BLOCK_M, HEAD_DIM])  # fmt: skip
        k_desc = tl.make_tensor_descriptor(k_ptr, shape=[rows * n_k, HEAD_DIM], strides=[HEAD_DIM, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])  # fmt: skip
        vt_desc = tl.make_tensor_descriptor(vt_ptr, shape=[rows * HEAD_DIM, n_k], strides=[n_k, 1],
                                            block_shape=[HEAD_DIM, BLOCK_N])  # fmt: skip
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    bh = tl.program_id(2).to(tl.int64) * tl.num_programs(1) + tl.program_id(1)
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    if TMA:
        q = q_desc.load([(bh * n_q + m0).to(tl.int32), 0])
    else:
        q_ptrs = q_ptr + (bh * n_q + offs_m.to(tl.int64))[:, None] * HEAD_DIM + offs_d[None, :]
        q = tl.load(q_ptrs, mask=offs_m[:, None] < n_q, other=0.0)
    c_row = tl.load(qs_ptr + bh * tl.cdiv(n_q, BLOCK_M) + pid_m) * qk_scale
    ks_base = ks_ptr + bh * tl.cdiv(n_k, BLOCK_N)
    k_base = k_ptr + bh * n_k * HEAD_DIM
    vt_base = vt_ptr + bh * HEAD_DIM * n_k
    k_row = (bh * n_k).to(tl.int32)
    vt_row = (bh * HEAD_DIM).to(tl.int32)
    lo_mask, hi = key_range(m0, n_k, BLOCK_M, BLOCK_N, CAUSAL)
    k_src = k_desc if TMA else k_base
    vt_src = vt_desc if TMA else vt_base
    shift = 8.0
    if REF:  # against block 0's max; a row that passes it by too much sends the tile through the online loop
        acc, l_i, m_i, bad = _fp8_tile(q, k_src, vt_src, ks_base, k_row, vt_row, offs_m, offs_n0, offs_d, n_k,
                                       c_row, lo_mask, hi, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, TMA, EMULATE, WS,
                                       True, PROMOTE, PIPE, EXP16)  # fmt: skip
        shift = 4.0
        if tl.max(bad, 0) > 0:
            acc, l_i, m_i, bad = _fp8_tile(q, k_src, vt_src, ks_base, k_row, vt_row, offs_m, offs_n0, offs_d, n_k,
                                           c_row, lo_mask, hi, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, TMA, EMULATE, WS,
                                           False, PROMOTE, PIPE, EXP16)  # fmt: skip
            shift = 8.0
    else:
        acc, l_i, m_i, bad = _fp8_tile(q, k_src, vt_src, ks_base, k_row, vt_row, offs_m, offs_n0, offs_d, n_k,
                                       c_row, lo_mask, hi, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, TMA, EMULATE, WS,
                                       False, PROMOTE, PIPE, EXP16)  # fmt: skip
    vs = tl.load(vs_ptr + bh * HEAD_DIM + offs_d)
    o = acc * (vs[None, :] / l_i[:, None])
    o_ptrs = o_ptr + (bh * n_q + offs_m.to(tl.int64))[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=offs_m[:, None] < n_q)
    lse = (m_i + tl.math.log2(l_i) - shift) * 0.6931471805599453  # base 2 -> natural, P's factor taken back
    tl.store(lse_ptr + bh * n_q + offs_m, lse, mask=offs_m < n_q)


# -- the launcher ---------------------------------------------------------------------------------
@functools.cache
def _device_descriptor_allocator() -> None:
    """Descriptors made on the device need global scratch memory per launch; Triton asks for it through
    the allocator set here (once, torch's caching allocator). Only the ``WS`` experiment makes them."""
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device="cuda", dtype=torch.int8))


def _check_fp8(x: Fp8Inputs, causal, scale) -> None:
    if not isinstance(x, Fp8Inputs):
        raise KernelInputError(f"{OP}: pass what quantize_fp8 returns, got {type(x).__name__}.")
    for name in ("q8", "k8", "vt8"):
        check_tensor(getattr(x, name), name, op=OP, dtypes=(FP8,), ndim=4)
    for name in ("q_scale", "k_scale", "v_scale"):
        check_tensor(getattr(x, name), name, op=OP, dtypes=(torch.float32,), ndim=3)
    B, H, N_q, D = x.q8.shape
    if x.k8.shape[:2] != (B, H) or x.k8.shape[3] != D or x.vt8.shape != (B, H, D, x.k8.shape[2]):
        raise KernelInputError(
            f"{OP}: q8 {tuple(x.q8.shape)}, k8 {tuple(x.k8.shape)}, vt8 {tuple(x.vt8.shape)}: expected (B, H, N_q, D), "
            "(B, H, N_k, D) and V transposed, (B, H, D, N_k) (grouped-query attention is not taken)."
        )
    if D not in HEAD_DIMS:
        raise KernelInputError(f"{OP}: head dim {D}; the FP8 kernel takes {HEAD_DIMS}.")
    if x.k8.shape[2] == 0:
        raise KernelInputError(f"{OP}: no keys (N_k = 0): every row's softmax would be empty.")
    if not isinstance(causal, bool):
        raise KernelInputError(f"{OP}: causal must be True or False, got {causal!r}.")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise KernelInputError(f"{OP}: scale must be a number (or None for 1/sqrt(D)), got {scale!r}.")
    if runtime.is_gpu() and (runtime.CAPABILITY or (0, 0)) < (8, 9):
        raise KernelInputError(f"{OP}: e4m3 tensor cores need compute capability 8.9 or more (Ada, Hopper).")


def attention_fp8_quantized(
    x: Fp8Inputs, causal: bool = False, scale: float | None = None, *, out_dtype=torch.bfloat16, config=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The FP8 forward on quantised inputs: ``(o, lse)``, o (B, H, N_q, D) in ``out_dtype``, lse fp32
    (natural log). ``config``: tile overrides (``num_warps``, ``num_stages``; ``BLOCK_M``/``BLOCK_N`` must
    be the blocks ``x`` was quantised over; ``"WS": True``: the unmasked loop warp-specialised by Triton,
    with descriptors made on the device, where the descriptors' layout rules hold — an experiment,
    off by default; Triton 3.6 cannot compile it below 8 warps, refused by name; ``"PROMOTE": n``: P V's
    partial sums added to the accumulator in fp32 every n keys, :data:`PROMOTE_CHOICES`; ``"PIPE": 1 or 2``:
    the next key block's scores issued in this step, :func:`_fp8_inner`; ``"EXP16": True``:
    P's exponentials in fp16, two an instruction, :func:`_exp2_half`)."""
    _check_fp8(x, causal, scale)
    B, H, N_q, D = x.q8.shape
    N_k = x.k8.shape[2]
    gpu = runtime.is_gpu()
    flags = ("WS", "REF", "EXP16")
    choices = {"PROMOTE": PROMOTE_CHOICES, "PIPE": PIPE_CHOICES}
    given = dict(config_key(config, OP, CONFIG_KEYS, flags=flags, choices=choices))
    cfg = {**_config(D, causal, N_q, N_k, gpu), **given}
    bm, bn = x.block_m, x.block_n
    # causal: a query tile's diagonal starts at a multiple of BLOCK_M, which must be a key block's start
    if (cfg["BLOCK_M"], cfg["BLOCK_N"]) != (bm, bn) or (causal and bm % bn) or bn < 16:
        raise KernelInputError(
            f"{OP}: inputs quantised over blocks {bm} x {bn}; the kernel's tiles are {cfg['BLOCK_M']} x "
            f"{cfg['BLOCK_N']} (BLOCK_N >= 16, and causal: BLOCK_M a multiple of BLOCK_N)."
        )
    if "PROMOTE" not in given:  # the table's promotion is per key block: at most the tiles asked for
        cfg["PROMOTE"] = min(cfg["PROMOTE"], bn)
    if cfg["PROMOTE"] > bn:
        raise KernelInputError(f"{OP}: PROMOTE={cfg['PROMOTE']} passes BLOCK_N={bn}, the keys one P V product sums.")
    if cfg.get("WS") and gpu and cfg["num_warps"] < 8:
        # Triton 3.6's NVGPUWarpSpecialization pass fails on this kernel at 4 warps (PassManager::run failed
        # after an MLIR dominance assertion, H100 and H200, 2026-11-27); at 8 warps it compiles and runs
        raise KernelInputError(
            f"{OP}: WS with num_warps={cfg['num_warps']}: Triton's warp specialisation fails to compile this kernel "
            "below 8 warps; pass num_warps=8 with it."
        )
    o = torch.empty((B, H, N_q, D), dtype=out_dtype, device=x.q8.device)
    lse = torch.empty((B, H, N_q), dtype=torch.float32, device=x.q8.device)
    if N_q == 0 or B == 0 or H == 0:
        return o, lse
    # descriptors: Hopper (or the interpreter), row strides 16-byte aligned (vt8's row is N_k bytes), and
    # row coordinates within int32
    tma = (
        TensorDescriptor is not None and (hopper() or not gpu) and N_k % 16 == 0 and N_k > 0
        and B * H * max(N_q + bm, N_k + bn, D) < 2**31
    )  # fmt: skip
    ws = bool(cfg.get("WS")) and tma
    if ws and gpu:
        _device_descriptor_allocator()
    if tma and not ws:
        q_desc = TensorDescriptor(x.q8.view(-1, D), [B * H * N_q, D], [D, 1], [bm, D])
        k_desc = TensorDescriptor(x.k8.view(-1, D), [B * H * N_k, D], [D, 1], [bn, D])
        vt_desc = TensorDescriptor(x.vt8.view(-1, N_k), [B * H * D, N_k], [N_k, 1], [D, bn])
    else:
        q_desc = k_desc = vt_desc = x.q8  # placeholders: the kernel reads the pointers or makes descriptors
    grid = (cdiv(N_q, bm), H, B)
    qk_scale = default_scale(D, scale) * LOG2E
    _fp8_fwd_kernel[grid](
        x.q8, x.k8, x.vt8, x.q_scale, x.k_scale, x.v_scale, o, lse, q_desc, k_desc, vt_desc, N_q, N_k, qk_scale,
        HEAD_DIM=D, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, TMA=tma, EMULATE=not gpu, WS=ws, REF=bool(cfg["REF"]),
        PROMOTE=int(cfg["PROMOTE"]), PIPE=int(cfg["PIPE"]), EXP16=bool(cfg["EXP16"]),
        **launch_kwargs(cfg["num_warps"], cfg["num_stages"]),
    )  # fmt: skip
    return o, lse


def attention_fp8(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None, *, config=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise (:func:`quantize_fp8`, at the kernel's tiles) and run the FP8 forward: ``(o, lse)`` with o in
    q's dtype. The quantisation is plain torch, several memory-bound passes: a model that feeds FP8
    attention produces Q, K, V in e4m3 in the epilogue of the layer before, so the lesson times the kernel
    on quantised inputs and states the quantisation's cost beside it."""
    D = q.shape[-1] if isinstance(q, torch.Tensor) and q.ndim == 4 else None
    if D not in HEAD_DIMS:
        raise KernelInputError(f"{OP}: q must be (B, H, N_q, D) with a head dim D in {HEAD_DIMS}.")
    cfg = {**attention_fp8_config(D, causal, q.shape[2], k.shape[2]), **(config or {})}
    x = quantize_fp8(q, k, v, cfg["BLOCK_M"], cfg["BLOCK_N"])
    return attention_fp8_quantized(x, causal, scale, out_dtype=q.dtype, config=config)


def attention_fp8_error(q, k, v, causal: bool = False, scale: float | None = None, *, config=None) -> dict:
    """The FP8 path's error against float64: ``"o"`` (norm-relative) and ``"lse"`` (the largest absolute
    difference, natural log) against the exact attention of ``q, k, v`` (everything FP8 costs), and
    ``"o_kernel"`` (norm-relative) against the exact attention of the dequantised inputs (what the kernel's
    FP8 P and fp32 sums cost, the inputs' rounding taken out)."""
    D = q.shape[-1]
    cfg = {**attention_fp8_config(D, causal, q.shape[2], k.shape[2]), **(config or {})}
    x = quantize_fp8(q, k, v, cfg["BLOCK_M"], cfg["BLOCK_N"])
    o, lse = attention_fp8_quantized(x, causal, scale, out_dtype=q.dtype, config=config)
    s, _, vd = scores64(q, k, v, causal, default_scale(D, scale))
    lse64 = torch.logsumexp(s, -1)
    o64 = torch.exp(s - lse64[..., None]) @ vd
    o_deq, _ = attention_fp8_reference(x, causal, scale)

    def rel(a, b):
        return float((a.double() - b).norm() / b.norm().clamp_min(1e-30))

    lse_err = float((lse.double() - lse64).abs().max()) if lse.numel() else 0.0
    return {"o": rel(o, o64), "lse": lse_err, "o_kernel": rel(o, o_deq)}
