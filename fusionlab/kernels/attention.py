"""Lesson 7: FlashAttention forward — attention without the N x N matrices in HBM.

``O = softmax(Q K^T * scale + mask) V`` per (batch, head), and the per-row log-sum-exp ``lse`` of the
scaled, masked scores (natural log, fp32: the backward recomputes P = exp(s - lse) from it).

Eager attention (:func:`attention_eager`) writes the scores to HBM and reads them back to scale, mask,
softmax and multiply them: four to five trips of an ``N_q x N_k`` matrix per head, and ``O(N^2)``
memory. The fused kernel (FlashAttention, with FlashAttention-2's schedule) keeps one ``BLOCK_M x D``
tile of Q on chip, streams K and V through in ``BLOCK_N``-key tiles, and runs lesson 4's *online
softmax* on each tile's scores in registers: a running row max ``m``, a running sum ``l`` of
``exp(s - m)`` and an fp32 ``acc`` of ``exp(s - m) V``, rescaled by ``exp(m_old - m_new)`` when a tile
raises the max; one division ``acc / l`` at the end. Trips: :func:`attention_ledger`; the FLOPs are
eager's (:func:`attention_flops`): it is faster because it moves fewer bytes, not because it computes less.

Numerics: scores, ``m``, ``l``, ``acc`` in fp32; ``P`` cast to the input dtype for ``P V`` (the tensor
cores' operand). ``exp`` is ``exp2`` with ``scale * log2(e)`` folded into one multiply-add per score, so
``m`` is in base-2 units and ``lse = ln(2) * (m + log2(l))``. On Hopper the default drops the running
max (``REF_MAX``, lesson 5's trick): softmax is exact against *any* reference, so every block sums
``exp(s - m_ref)`` against block 0's row max with no rescale (:func:`_attention_inner_ref`); a tile where
that overflows reruns through the online loop. Non-finite inputs give the float64 reference's O and lse
(:func:`attention_reference`; where a row max is infinite the online loop subtracts 0 instead), except
that a NaN or inf in V reaches only the rows of the tiles that load its key.

Masks. ``causal=True`` is ``F.scaled_dot_product_attention(is_causal=True)``'s **top-left** mask: query
i sees keys j <= i. N_k = 0 gives O = 0 and lse = -inf (SDPA's math path). Key blocks below the
diagonal run unmasked, the diagonal and a partial last block masked, blocks above it are never loaded;
the grid runs each head's Q tiles from last to first, so the longest causal tiles start first.

Two ways to load the tiles (``TMA`` constexpr): pointers with masks (any strides with the last dimension
contiguous: the interpreter's path and the fallback), or Hopper tensor descriptors over each tensor seen
as the rows of a matrix (:func:`~fusionlab.kernels._attention.row_layout`). A descriptor tile past a
head's last token reads the next head's rows: those keys are masked, their V rows zeroed, those queries
never stored. Measurements: lesson 7's recording (``fusionlab/recorded/``), ``benchmarks/notes_attention.md``.
The backward (lesson 8) is :mod:`~fusionlab.kernels.attention_backward`; :class:`AttentionFunction`
joins the two.

Reference: Dao et al., "FlashAttention" (2022), "FlashAttention-2" (2023); Milakov & Gimelshein, "Online
normalizer calculation for softmax" (2018); Triton's tutorial 06 (fused attention), whose Hopper recipe
this follows.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from torch.autograd.function import once_differentiable

from .. import runtime
from .._exercise import answer_key
from . import _attention, attention_backward
from ._attention import (
    LOG2E,
    OP,
    BlockMask,
    MaskMod,
    ScoreMod,
    TensorDescriptor,
    attention_bytes,
    attention_eager,
    attention_flops,
    attention_ledger,
    block_mask,
    default_scale,
    descriptor,
    row_layout,
)
from ._launch import KernelInputError, cdiv, element_size, launch_kwargs, next_pow2
from ._tensors import upstream_grad

__all__ = ["attention", "attention_reference", "attention_eager", "attention_ledger", "attention_flops",
           "attention_bytes", "attention_config", "AttentionFunction", "ScoreMod", "MaskMod", "BlockMask",
           "block_mask", "softcap", "alibi", "relative_bias", "causal_mask", "sliding_window", "prefix_lm",
           "document_mask"]  # fmt: skip

VARIANTS = (None, "auto", "plain", "tma")
_hopper = _attention.hopper


# -- the spec -------------------------------------------------------------------------------------
@answer_key
def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    *,
    score_mod: ScoreMod | None = None,
    block_mask: BlockMask | MaskMod | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The spec, in float64: ``O = softmax(Q K^T * scale + mask) V`` and ``lse = logsumexp(...)``.

    ``q`` (B, H_q, N_q, D); ``k``, ``v`` (B, H_kv, N_k, D), H_q a multiple of H_kv (query head h reads
    key/value head ``h // (H_q // H_kv)``). ``causal``: top-left aligned, query i sees keys j <= i
    (``F.scaled_dot_product_attention(is_causal=True)``). ``scale`` defaults to ``1 / sqrt(D)``.
    Returns O in q's dtype and lse (B, H_q, N_q) in fp32, natural log. N_k = 0 gives O = 0 and
    lse = -inf.

    Lesson 7b: ``score_mod`` (its torch function) modifies the scaled scores, then the causal mask and
    ``block_mask``'s mask function (a :class:`BlockMask` or the :class:`MaskMod` itself) hide keys; a
    row that sees no key gives O = 0 and lse = -inf, as ``flex_attention`` does.
    """
    if score_mod is None and block_mask is None:
        s, _, vd = _attention.scores64(q, k, v, causal, scale)
    else:
        mask = block_mask.mask if isinstance(block_mask, BlockMask) else block_mask
        s, _, vd = _attention.modified_scores64(q, k, v, causal, scale, _score_mod(score_mod), mask)
    lse = torch.logsumexp(s, dim=-1)  # -inf for an empty row (N_k = 0)
    if s.shape[-1] == 0:
        o = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64, device=q.device)
    else:
        o = torch.softmax(s, dim=-1) @ vd
        if score_mod is not None or block_mask is not None:  # a row the mask empties: 0, not softmax's NaN
            o = o.masked_fill(torch.isneginf(lse)[..., None], 0.0)
    return o.to(q.dtype), lse.float()


# -- configuration --------------------------------------------------------------------------------
#: the Hopper (TMA) path's tiles, (BLOCK_M, BLOCK_N, num_warps, num_stages, TMA_STORE, REF_MAX), by
#: (head-dim class, causal, long sequence: N_q > LONG). TMA_STORE: O leaves through a descriptor (one bulk
#: copy a tile, where BLOCK_M divides N_q). REF_MAX: 0 the online loop; 1 every block against block 0's
#: row max, P summed as a tile; 2 the same with a row sum a block. The H100 and H200 sweeps behind each
#: row, and why short sequences take 64-row tiles: benchmarks/notes_attention.md (2026-11-24, "block 0
#: inside the loop"; 2026-11-26, "the forward's tables"). Head dim 256: not measured, REF_MAX off.
TMA_TABLE = {
    (64, False, False): (64, 64, 4, 3, False, 1), (64, False, True): (128, 64, 4, 3, True, 2),
    (64, True, False): (64, 64, 4, 3, False, 1), (64, True, True): (128, 64, 4, 3, True, 2),
    (128, False, False): (64, 64, 4, 3, True, 1), (128, False, True): (128, 64, 4, 2, True, 2),
    (128, True, False): (64, 32, 4, 3, True, 1), (128, True, True): (64, 64, 4, 3, True, 1),
    (256, False, False): (64, 64, 4, 2, False, 0), (256, False, True): (64, 64, 4, 2, False, 0),
    (256, True, False): (64, 64, 4, 2, False, 0), (256, True, True): (64, 64, 4, 2, False, 0),
}  # fmt: skip
#: "long" starts past this many queries
LONG = 2048
#: below this many FLOPs a call takes the pointer path even on Hopper: the three descriptors cost the
#: host more than so short a kernel runs (benchmarks/notes_attention.md, "Small calls")
TMA_MIN_FLOPS = 32e9
#: the pointer path on a GPU (pre-Hopper, or a layout the descriptors cannot take): (BLOCK_M, BLOCK_N,
#: num_warps, num_stages) by head-dim class; REF_MAX off (not measured on that path)
PLAIN_TABLE = {64: (128, 64, 4, 3), 128: (128, 64, 8, 3), 256: (64, 32, 8, 2)}
#: the interpreter: every program is Python, so few of them; 32 x 16 tiles still give a causal tile
#: two diagonal blocks, so small tests reach every code path
INTERPRETER_TILE = (32, 16)
_CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "TMA_STORE", "REF_MAX")


def _tma_by_default(B: int, H: int, N_q: int, N_k: int, D: int, causal: bool) -> bool:
    """Whether a call takes the descriptors when no variant is asked for: on a Hopper GPU, with at
    least :data:`TMA_MIN_FLOPS` of work (the layout and the dtype are the caller's to check)."""
    return _hopper() and attention_flops(B, H, N_q, N_k, D, causal) >= TMA_MIN_FLOPS


@functools.lru_cache(maxsize=4096)
def _config(n_q: int, n_k: int, d: int, causal: bool, tma: bool, gpu: bool) -> dict:
    block_d = max(16, next_pow2(d))
    d_class = 64 if block_d <= 64 else (128 if block_d <= 128 else 256)
    store, ref = False, 0
    if not gpu:
        bm, bn = INTERPRETER_TILE
        nw, ns = 4, 1
    elif tma:
        bm, bn, nw, ns, store, ref = TMA_TABLE[(d_class, causal, n_q > LONG)]
    else:
        bm, bn, nw, ns = PLAIN_TABLE[d_class]
    # short sequences: no tile longer than the sequence (tl.dot needs 16)
    bm = min(bm, max(16, next_pow2(n_q)))
    bn = min(bn, max(16, next_pow2(n_k)))
    if causal and bn > bm:
        bn = bm  # the causal split needs BLOCK_M to be a multiple of BLOCK_N
    return dict(variant="tma" if tma else "plain", BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=block_d, num_warps=nw,
                num_stages=ns, TMA_STORE=tma and store, REF_MAX=ref)  # fmt: skip


def attention_config(
    B: int, H: int, N_q: int, N_k: int, D: int, dtype=torch.bfloat16, causal: bool = False, *, tma: bool | None = None
) -> dict:
    """The launch configuration the launcher picks: ``{"variant", "BLOCK_M", "BLOCK_N", "BLOCK_D",
    "num_warps", "num_stages", "TMA_STORE", "REF_MAX"}``.

    ``BLOCK_D`` is the head dim rounded up to a power of two (at least 16). On a Hopper GPU with
    fp16/bf16 inputs in a descriptor-friendly layout (``tma=None`` assumes one) and at least
    :data:`TMA_MIN_FLOPS` of work, the TMA path with the tile of ``TMA_TABLE``; elsewhere on a GPU the
    pointer path (``PLAIN_TABLE``); in the interpreter 32 x 16 tiles (and the online loop the lesson
    teaches). Tiles shrink to short sequences. B and H do not change the tile (the grid grows).
    """
    if tma is None:  # the descriptors need Triton's, a tensor-core dtype, 16-byte rows and enough work
        half = dtype in (torch.float16, torch.bfloat16)
        tma = TensorDescriptor is not None and half and D % 8 == 0 and _tma_by_default(B, H, N_q, N_k, D, causal)
    return dict(_config(int(N_q), int(N_k), int(D), bool(causal), bool(tma), runtime.is_gpu()))


def _config_key(config: dict | None) -> tuple:
    return _attention.config_key(config, OP, _CONFIG_KEYS, flags=("TMA_STORE",), choices={"REF_MAX": (0, 1, 2)})


# -- the kernel -----------------------------------------------------------------------------------
@triton.jit
def _kv_tile(
    src, row, col, start_n, offs_n, stride, offs_d, n_k,
    HEAD_DIM: tl.constexpr, MASKED: tl.constexpr, EVEN_N: tl.constexpr, TMA: tl.constexpr, ZERO_TAIL: tl.constexpr,
):  # fmt: skip
    """One (BLOCK_N, BLOCK_D) tile of K or V, keys ``start_n + [0, BLOCK_N)``. ``ZERO_TAIL`` (V): on
    the TMA path, rows past ``n_k`` belong to the next head; they are zeroed (``0 * inf`` would be
    NaN). K's rows there need nothing: their scores are masked to -inf whatever they hold."""
    if TMA:
        t = src.load([row + start_n, col])
        if ZERO_TAIL and MASKED and not EVEN_N:
            t = tl.where(offs_n[:, None] < n_k, t, 0.0)
    else:
        ptrs = src + offs_n.to(tl.int64)[:, None] * stride + offs_d[None, :]
        d_mask = offs_d[None, :] < HEAD_DIM  # all true unless the head dim is padded
        if MASKED and not EVEN_N:
            t = tl.load(ptrs, mask=(offs_n[:, None] < n_k) & d_mask, other=0.0)
        else:
            t = tl.load(ptrs, mask=d_mask, other=0.0)
    return t


@triton.jit
def _block_max(
    qk, m_i, offs_m, offs_n, n_k, qk_scale,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, SCALE_NEG: tl.constexpr, EVEN_N: tl.constexpr,
):  # fmt: skip
    """The new running max of a block's raw scores ``qk``. Returns ``(qk, m_ij)``: on masked blocks
    ``qk`` comes back scaled with the mask applied (-inf), elsewhere untouched (:func:`_block_p`
    scales it in the same FMA that subtracts the max)."""
    if MASKED:
        if CAUSAL:
            keep = offs_m[:, None] >= offs_n[None, :]  # top-left: query i sees keys j <= i
            if not EVEN_N:
                keep = keep & (offs_n[None, :] < n_k)
        else:
            keep = offs_n[None, :] < n_k
        qk = tl.where(keep, qk * qk_scale, float("-inf"))
        # every row sees key 0, so for finite inputs m is finite from the first block on
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
    else:
        # the max of the scaled scores from the unscaled ones (one multiply per row, not per
        # score), then scale and subtract in one FMA per score
        if SCALE_NEG:
            m_ij = tl.maximum(m_i, tl.min(qk, 1) * qk_scale)
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    return qk, m_ij


@triton.jit
def _block_p(qk, m_ij, qk_scale, MASKED: tl.constexpr):
    """``P = exp(s - m)``, base 2 with log2(e) folded into ``qk_scale``."""
    if MASKED:
        qk = qk - m_ij[:, None]
    else:
        qk = qk * qk_scale - m_ij[:, None]
    return tl.math.exp2(qk)


@triton.jit
def _attention_inner(
    acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d, n_k, qk_scale,
    lo, hi,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
    SCALE_NEG: tl.constexpr, TMA: tl.constexpr, EVEN_N: tl.constexpr,
):  # fmt: skip
    """Key blocks ``[lo, hi)`` of one Q tile: the online-softmax update, block by block. ``MASKED``: the
    diagonal and the partial last block (the key bound, and the causal mask when ``CAUSAL``), else no
    mask. ``k_src``/``v_src``: the head's first token (pointers) or descriptors (TMA: tiles at row
    ``k_row + start_n``, column ``k_col``). ``EVEN_N``: BLOCK_N divides N_k (no block hangs past it)."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        k = _kv_tile(k_src, k_row, k_col, start_n, offs_n, stride_kn, offs_d, n_k, HEAD_DIM, MASKED, EVEN_N, TMA, False)
        qk = tl.dot(q, tl.trans(k))  # (BLOCK_M, BLOCK_N) fp32, unscaled
        qk, m_ij = _block_max(qk, m_i, offs_m, offs_n, n_k, qk_scale, MASKED, CAUSAL, SCALE_NEG, EVEN_N)
        # a row max of -inf (every score so far -inf) or +inf would make exp2(s - m) NaN where float64's
        # terms are 0 or inf: such a row subtracts 0 instead (two selects a row, none a score)
        m_sub = tl.where(tl.abs(m_ij) < float("inf"), m_ij, 0.0)
        p = _block_p(qk, m_sub, qk_scale, MASKED)
        # rescales what was summed against the old max (1 while nothing was: l and acc are still 0)
        alpha = tl.math.exp2(tl.where(tl.abs(m_i) < float("inf"), m_i, m_sub) - m_sub)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = _kv_tile(v_src, v_row, v_col, start_n, offs_n, stride_vn, offs_d, n_k, HEAD_DIM, MASKED, EVEN_N, TMA, True)
        acc = tl.dot(p.to(v.dtype), v, acc)  # P cast down to the input dtype: the tensor cores' operand
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _attention_online(
    acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn,
    offs_m, offs_d, n_k, qk_scale, lo_mask, hi,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, SCALE_NEG: tl.constexpr,
    TMA: tl.constexpr, EVEN_N: tl.constexpr,
):  # fmt: skip
    """The online softmax over a Q tile's key blocks: ``[0, lo_mask)`` unmasked, then ``[lo_mask, hi)``
    masked (the diagonal and the partial last block)."""
    acc, l_i, m_i = _attention_inner(
        acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn,
        offs_m, offs_d, n_k, qk_scale, 0, lo_mask,
        HEAD_DIM, BLOCK_N, False, CAUSAL, SCALE_NEG, TMA, EVEN_N,
    )  # fmt: skip
    if CAUSAL or not EVEN_N:  # non-causal with BLOCK_N dividing N_k: no masked block, no second loop
        acc, l_i, m_i = _attention_inner(
            acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn,
            offs_m, offs_d, n_k, qk_scale, lo_mask, hi,
            HEAD_DIM, BLOCK_N, True, CAUSAL, SCALE_NEG, TMA, EVEN_N,
        )  # fmt: skip
    return acc, l_i, m_i


@triton.jit
def _attention_inner_ref(
    acc, l_t, m_ref, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn,
    offs_m, offs_d, n_k, qk_scale, lo, hi,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
    SCALE_NEG: tl.constexpr, TMA: tl.constexpr, EVEN_N: tl.constexpr, ROW_SUM: tl.constexpr,
):  # fmt: skip
    """Key blocks ``[lo, hi)`` against a fixed reference ``m_ref`` (``REF_MAX``): block 0's row max,
    taken when the loop that holds block 0 reaches it (``m_ref`` is -inf until then). Then
    ``p = exp2(s - m_ref)`` with no running max, no rescale of ``acc`` and no
    per-block row max; ``l_t`` adds the P tiles elementwise (the kernel reduces it once) or, ``ROW_SUM``,
    their row sums. Exact for any finite reference as long as nothing overflows; the kernel checks that
    at the end and falls back to the online loop if not. Block 0 is taken inside the loop, not before it
    (benchmarks/notes_attention.md, 2026-11-24: a tile loaded outside the loop has shared memory of
    its own)."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        k = _kv_tile(k_src, k_row, k_col, start_n, offs_n, stride_kn, offs_d, n_k, HEAD_DIM, MASKED, EVEN_N, TMA, False)
        qk = tl.dot(q, tl.trans(k))
        # each row sees key 0, so block 0's row max is finite for finite inputs
        if MASKED:
            qk, m_blk = _block_max(qk, m_ref, offs_m, offs_n, n_k, qk_scale, MASKED, CAUSAL, SCALE_NEG, EVEN_N)
            if start_n == 0:
                m_ref = m_blk
        else:
            if start_n == 0:
                _, m_ref = _block_max(qk, m_ref, offs_m, offs_n, n_k, qk_scale, MASKED, CAUSAL, SCALE_NEG, EVEN_N)
        p = _block_p(qk, m_ref, qk_scale, MASKED)
        if ROW_SUM:  # l_t is (BLOCK_M,): one cross-thread sum a block, no tile of partial sums to keep
            l_t += tl.sum(p, 1)
        else:
            l_t += p
        v = _kv_tile(v_src, v_row, v_col, start_n, offs_n, stride_vn, offs_d, n_k, HEAD_DIM, MASKED, EVEN_N, TMA, True)
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_t, m_ref


# -- lesson 7b: the learner's modification, in the same kernel ---------------------------------------
@triton.jit
def _mod_scores(
    qk, offs_m, offs_n, off_b, off_h, n_k, sm_scale, mod_aux, mod_a0, mod_a1, mask_aux, mask_a0, mask_a1,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, SCORE_MOD: tl.constexpr, MASK_MOD: tl.constexpr,
):  # fmt: skip
    """A block's scores in base-2 units: scaled to natural units (the modification sees what the spec
    writes, ``Q K^T * scale``), modified, then times log2(e). ``MASKED``: the key bound, the causal
    mask and the mask function set what they hide to -inf (a full block needs none of them)."""
    s = qk * sm_scale
    q_idx = offs_m[:, None]
    kv_idx = offs_n[None, :]
    if SCORE_MOD is not None:
        s = SCORE_MOD(s, off_b, off_h, q_idx, kv_idx, mod_aux, mod_a0, mod_a1)
    s = s * 1.4426950408889634
    if MASKED:
        keep = kv_idx < n_k
        if CAUSAL:
            keep = keep & (q_idx >= kv_idx)
        if MASK_MOD is not None:
            keep = keep & MASK_MOD(off_b, off_h, q_idx, kv_idx, mask_aux, mask_a0, mask_a1)
        s = tl.where(keep, s, float("-inf"))
    return s


@triton.jit
def _attention_inner_mod(
    acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d, n_k, sm_scale,
    lo, hi, idx_ptr, off_b, off_h, mod_aux, mod_a0, mod_a1, mask_aux, mask_a0, mask_a1,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr,
    EVEN_N: tl.constexpr, SCORE_MOD: tl.constexpr, MASK_MOD: tl.constexpr, INDEXED: tl.constexpr, STEP: tl.constexpr,
    REF: tl.constexpr, FIRST: tl.constexpr,
):  # fmt: skip
    """:func:`_attention_inner` with a modification: key blocks ``[lo, hi)`` (``INDEXED``: entries
    ``[lo, hi)`` of the block mask's list ``idx_ptr``, key block numbers), the online softmax on
    :func:`_mod_scores`. No folded scale: the modification needs the scaled score before the exponential.
    ``REF`` (lesson 7's ``REF_MAX``): ``m_i`` is a fixed reference, no running max and no rescale; the
    tile's first block sets it (``FIRST``: 1 the block at key 0, 2 entry 0 of the list, 0 none here)."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for j in tl.range(lo, hi, STEP):
        if INDEXED:
            start_n = tl.load(idx_ptr + j) * BLOCK_N
        else:
            start_n = j
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        k = _kv_tile(k_src, k_row, k_col, start_n, offs_n, stride_kn, offs_d, n_k, HEAD_DIM, MASKED, EVEN_N, TMA, False)
        qk = tl.dot(q, tl.trans(k))
        s = _mod_scores(qk, offs_m, offs_n, off_b, off_h, n_k, sm_scale, mod_aux, mod_a0, mod_a1, mask_aux,
                        mask_a0, mask_a1, MASKED, CAUSAL, SCORE_MOD, MASK_MOD)  # fmt: skip
        if REF:
            if FIRST == 1:
                if start_n == 0:
                    m_i = tl.max(s, 1)
            elif FIRST == 2:
                if j == 0:
                    m_i = tl.max(s, 1)
            p = tl.math.exp2(s - m_i[:, None])
            l_i += tl.sum(p, 1)
        else:
            m_ij = tl.maximum(m_i, tl.max(s, 1))
            # a row every score of which is -inf so far (a mask, or a modification, hid them) subtracts 0
            m_sub = tl.where(tl.abs(m_ij) < float("inf"), m_ij, 0.0)
            p = tl.math.exp2(s - m_sub[:, None])
            alpha = tl.math.exp2(tl.where(tl.abs(m_i) < float("inf"), m_i, m_sub) - m_sub)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            m_i = m_ij
        v = _kv_tile(v_src, v_row, v_col, start_n, offs_n, stride_vn, offs_d, n_k, HEAD_DIM, MASKED, EVEN_N, TMA, True)
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_i


@triton.jit
def _mod_pass(
    acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d, n_k, sm_scale,
    lo_mask, hi, idx, n_whole, n_part, bm_tn, off_b, off_h, mod_aux, mod_a0, mod_a1, mask_aux, mask_a0, mask_a1,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr, EVEN_N: tl.constexpr,
    SCORE_MOD: tl.constexpr, MASK_MOD: tl.constexpr, SPARSE: tl.constexpr, REF: tl.constexpr,
):  # fmt: skip
    """Every key block of a Q tile, once. ``SPARSE`` (a block mask): the tile's full blocks with no element
    mask, then its partial blocks through the mask function; an empty block is in neither list, so it is
    never loaded. Without one: lesson 7's split, ``[0, lo_mask)`` unmasked and ``[lo_mask, hi)`` masked."""
    if SPARSE:
        acc, l_i, m_i = _attention_inner_mod(
            acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d, n_k,
            sm_scale, 0, n_whole, idx, off_b, off_h, mod_aux, mod_a0, mod_a1, mask_aux, mask_a0, mask_a1,
            HEAD_DIM, BLOCK_N, False, False, TMA, EVEN_N, SCORE_MOD, None, True, 1, REF, 2,
        )  # fmt: skip
        acc, l_i, m_i = _attention_inner_mod(
            acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d, n_k,
            sm_scale, 0, n_part, idx + bm_tn, off_b, off_h, mod_aux, mod_a0, mod_a1, mask_aux, mask_a0, mask_a1,
            HEAD_DIM, BLOCK_N, True, False, TMA, EVEN_N, SCORE_MOD, MASK_MOD, True, 1, REF, 0,
        )  # fmt: skip
    else:
        acc, l_i, m_i = _attention_inner_mod(
            acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d, n_k,
            sm_scale, 0, lo_mask, None, off_b, off_h, mod_aux, mod_a0, mod_a1, mask_aux, mask_a0, mask_a1,
            HEAD_DIM, BLOCK_N, False, CAUSAL, TMA, EVEN_N, SCORE_MOD, None, False, BLOCK_N, REF, 1,
        )  # fmt: skip
        if CAUSAL or not EVEN_N:
            acc, l_i, m_i = _attention_inner_mod(
                acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d,
                n_k, sm_scale, lo_mask, hi, None, off_b, off_h, mod_aux, mod_a0, mod_a1, mask_aux, mask_a0, mask_a1,
                HEAD_DIM, BLOCK_N, True, CAUSAL, TMA, EVEN_N, SCORE_MOD, None, False, BLOCK_N, REF, 1,
            )  # fmt: skip
    return acc, l_i, m_i


@triton.jit
def _attention_mod(
    acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d, n_k, sm_scale,
    lo_mask, hi, pid_m, off_b, off_h, mod_aux, mod_a0, mod_a1, mask_aux, mask_a0, mask_a1,
    bm_num, bm_idx, bm_sb, bm_sh, bm_tn,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, TMA: tl.constexpr, EVEN_N: tl.constexpr, SCORE_MOD: tl.constexpr, MASK_MOD: tl.constexpr,
    SPARSE: tl.constexpr, REF: tl.constexpr,
):  # fmt: skip
    """A Q tile's key blocks with a modification (:func:`_mod_pass`). ``REF``: first against a fixed
    reference max, the tile's first block's (a full block with a block mask: every row sees all of it,
    so the reference is finite; a tile with no full block takes the online loop); a row that overflows
    or sees no key sends the tile through the online loop from the start, as lesson 7's kernel does."""
    n_whole = 0
    n_part = 0
    idx = bm_idx
    if SPARSE:
        tile = off_b * bm_sb + off_h * bm_sh + pid_m
        n_whole = tl.load(bm_num + 2 * tile)
        n_part = tl.load(bm_num + 2 * tile + 1)
        idx = bm_idx + 2 * tile.to(tl.int64) * bm_tn
    online = tl.full((), 1, tl.int32)  # a tensor in every branch: the compiler needs one type
    if REF:
        if SPARSE:
            use_ref = n_whole > 0
        else:
            use_ref = True
        if use_ref:
            acc, l_i, m_ref = _mod_pass(
                acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d,
                n_k, sm_scale, lo_mask, hi, idx, n_whole, n_part, bm_tn, off_b, off_h, mod_aux, mod_a0, mod_a1,
                mask_aux, mask_a0, mask_a1, HEAD_DIM, BLOCK_N, CAUSAL, TMA, EVEN_N, SCORE_MOD, MASK_MOD, SPARSE, True,
            )  # fmt: skip
            ok = (l_i > 0) & (tl.sum(tl.abs(acc), 1) + l_i < float("inf"))
            online = tl.max(tl.where(ok, 0, 1), 0)
            if online > 0:
                acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
                l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            else:
                m_i = m_ref
    if online > 0:
        acc, l_i, m_i = _mod_pass(
            acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d,
            n_k, sm_scale, lo_mask, hi, idx, n_whole, n_part, bm_tn, off_b, off_h, mod_aux, mod_a0, mod_a1,
            mask_aux, mask_a0, mask_a1, HEAD_DIM, BLOCK_N, CAUSAL, TMA, EVEN_N, SCORE_MOD, MASK_MOD, SPARSE, False,
        )  # fmt: skip
    return acc, l_i, m_i


@triton.jit
def _attention_kernel(
    q_src, k_src, v_src, o_ptr, o_desc, lse_ptr, kv_group, n_q, n_k, qk_scale, q_rb, q_rh, q_cb, q_ch, stride_qm,
    k_rb, k_rh, k_cb, k_ch, stride_kn, v_rb, v_rh, v_cb, v_ch, stride_vn, stride_ob, stride_oh, stride_om,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, SCALE_NEG: tl.constexpr, TMA: tl.constexpr, EVEN_N: tl.constexpr, TMA_STORE: tl.constexpr,
    REF_MAX: tl.constexpr = 0,
    MOD: tl.constexpr = False, SCORE_MOD: tl.constexpr = None, MASK_MOD: tl.constexpr = None,
    SPARSE: tl.constexpr = False,
    mod_aux=None, mod_a0=None, mod_a1=None, mask_aux=None, mask_a0=None, mask_a1=None,
    bm_num=None, bm_idx=None, bm_sb=None, bm_sh=None, bm_tn=None,
):  # fmt: skip
    # q: (B, H, N_q, D), k/v: (B, H_kv, N_k, D), o: (B, H, N_q, D), lse: (B, H, N_q) fp32. Each of q, k, v
    # as rows of a matrix: head (b, h) starts at row b rb + h rh, column b cb + h ch, its tokens stride_*m/n
    # elements apart. Grid: (Q tiles, H, B), Q tiles from the last (a causal head's longest start first).
    # MOD (lesson 7b): a score modification and/or a block mask, through _attention_mod; left at their
    # defaults (None: constexprs, not arguments) the compiled kernel is lesson 7's, unchanged.
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    off_hk = off_h // kv_group  # grouped-query attention: the key/value head this query head reads
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d[None, :] < HEAD_DIM

    q_row = off_b * q_rb + off_h * q_rh
    q_col = off_b * q_cb + off_h * q_ch
    k_row = off_b * k_rb + off_hk * k_rh
    k_col = off_b * k_cb + off_hk * k_ch
    v_row = off_b * v_rb + off_hk * v_rh
    v_col = off_b * v_cb + off_hk * v_ch
    if TMA:
        q = q_src.load([q_row + m0, q_col])  # (BLOCK_M, BLOCK_D): rows past n_q are never stored
        k_base, v_base = k_src, v_src
    else:  # int64 element offsets: a head may start past 2**31 elements
        q_base = q_src + q_row.to(tl.int64) * stride_qm + q_col
        q_ptrs = q_base + offs_m.to(tl.int64)[:, None] * stride_qm + offs_d[None, :]
        q = tl.load(q_ptrs, mask=(offs_m[:, None] < n_q) & d_mask, other=0.0)
        k_base = k_src + k_row.to(tl.int64) * stride_kn + k_col
        v_base = v_src + v_row.to(tl.int64) * stride_vn + v_col

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)  # running max (base-2 units)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum of exp(s - m)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # running sum of exp(s - m) V

    # Key blocks [0, lo_mask) need no mask: they end before this tile's first row (causal) and
    # before n_k. [lo_mask, hi): the diagonal blocks and the partial last block, masked.
    n_full = (n_k // BLOCK_N) * BLOCK_N
    if CAUSAL:
        lo_mask = tl.minimum(m0, n_full)  # m0 is a multiple of BLOCK_M, hence of BLOCK_N
        hi = tl.minimum(m0 + BLOCK_M, n_k)  # blocks above the diagonal: never loaded
    else:
        lo_mask = n_full
        hi = n_k
    if MOD:
        acc, l_i, m_i = _attention_mod(
            acc, l_i, m_i, q, k_base, v_base, k_row, k_col, v_row, v_col, stride_kn, stride_vn,
            offs_m, offs_d, n_k, qk_scale * 0.6931471805599453, lo_mask, hi, pid_m, off_b, off_h,
            mod_aux, mod_a0, mod_a1, mask_aux, mask_a0, mask_a1, bm_num, bm_idx, bm_sb, bm_sh, bm_tn,
            HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL, TMA, EVEN_N, SCORE_MOD, MASK_MOD, SPARSE, REF_MAX > 0,
        )  # fmt: skip
    elif REF_MAX:
        if REF_MAX == 2:
            l_t = tl.zeros([BLOCK_M], dtype=tl.float32)
        else:
            l_t = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        acc, l_t, m_ref = _attention_inner_ref(
            acc, l_t, m_i, q, k_base, v_base, k_row, k_col, v_row, v_col, stride_kn, stride_vn,
            offs_m, offs_d, n_k, qk_scale, 0, lo_mask,
            HEAD_DIM, BLOCK_N, False, CAUSAL, SCALE_NEG, TMA, EVEN_N, REF_MAX == 2,
        )  # fmt: skip
        if CAUSAL or not EVEN_N:
            acc, l_t, m_ref = _attention_inner_ref(
                acc, l_t, m_ref, q, k_base, v_base, k_row, k_col, v_row, v_col, stride_kn, stride_vn,
                offs_m, offs_d, n_k, qk_scale, lo_mask, hi,
                HEAD_DIM, BLOCK_N, True, CAUSAL, SCALE_NEG, TMA, EVEN_N, REF_MAX == 2,
            )  # fmt: skip
        l_i = l_t if REF_MAX == 2 else tl.sum(l_t, 1)
        # exact unless something overflowed: a later score 2**127 above the reference (p = inf), P past
        # fp16's 65504, an acc past fp32; or the inputs held inf/NaN. Any such row sends the whole
        # tile through the online loop, from the start (NaN compares false, so it is caught too)
        ok = (l_i > 0) & (tl.sum(tl.abs(acc), 1) + l_i < float("inf"))
        if tl.max(tl.where(ok, 0, 1), 0) > 0:
            m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
            acc, l_i, m_i = _attention_online(
                acc, l_i, m_i, q, k_base, v_base, k_row, k_col, v_row, v_col, stride_kn, stride_vn,
                offs_m, offs_d, n_k, qk_scale, lo_mask, hi,
                HEAD_DIM, BLOCK_N, CAUSAL, SCALE_NEG, TMA, EVEN_N,
            )  # fmt: skip
        else:
            m_i = m_ref
    else:
        acc, l_i, m_i = _attention_online(
            acc, l_i, m_i, q, k_base, v_base, k_row, k_col, v_row, v_col, stride_kn, stride_vn,
            offs_m, offs_d, n_k, qk_scale, lo_mask, hi,
            HEAD_DIM, BLOCK_N, CAUSAL, SCALE_NEG, TMA, EVEN_N,
        )  # fmt: skip

    # one division per row, at the end; lse back from base-2 units to natural log (a row max of +-inf was
    # not subtracted: the online loop took 0 there, so float64's -inf, +inf or NaN comes out of log2(l))
    if MOD:  # a row the mask empties (l = 0): O = 0 and lse = -inf, as flex_attention gives
        empty = l_i == 0
        l_i = tl.where(empty, 1.0, l_i)
    lse = (tl.where(tl.abs(m_i) < float("inf"), m_i, 0.0) + tl.math.log2(l_i)) * 0.6931471805599453
    if MOD:
        lse = tl.where(empty, float("-inf"), lse)
    o = acc / l_i[:, None]
    row_ok = offs_m < n_q
    if TMA_STORE:  # BLOCK_M divides N_q: the tile is whole rows of O seen as (B H N_q, D)
        o_desc.store([(off_b * tl.num_programs(1) + off_h) * n_q + m0, 0], o.to(o_desc.dtype))
    else:
        o_base = o_ptr + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
        o_ptrs = o_base + offs_m.to(tl.int64)[:, None] * stride_om + offs_d[None, :]
        tl.store(o_ptrs, o.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & d_mask)
    lse_base = lse_ptr + (off_b.to(tl.int64) * tl.num_programs(1) + off_h) * n_q
    tl.store(lse_base + offs_m, lse, mask=row_ok)


# -- lesson 7b: the common modifications, ready-made ----------------------------------------------
# Each is a @triton.jit function for the kernel and a torch function for the float64 reference, with
# the same arguments: (score, b, h, q_idx, kv_idx, aux, a0, a1) for a score modification, the same less
# the score for a mask. Only exp2 and arithmetic: the interpreter runs them as the GPU does.
@triton.jit
def _softcap(score, b, h, q_idx, kv_idx, aux, cap, a1):
    # cap * tanh(score / cap), tanh(x) = 1 - 2 / (exp(2x) + 1): one exp2, one add, one division a score
    return cap - 2.0 * cap / (tl.math.exp2(score * (2.8853900817779268 / cap)) + 1.0)


@triton.jit
def _softcap_tanh(score, b, h, q_idx, kv_idx, aux, cap, a1):
    # the GPU's own tanh: one special-function instruction (relative error about 2^-11, below the bf16
    # rounding of P that follows), where the exp2 form takes two (the exponential and the division's
    # reciprocal); the interpreter has no inline assembly
    t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [score * (1.0 / cap)], dtype=tl.float32,
                                  is_pure=True, pack=1)  # fmt: skip
    return cap * t


def softcap(cap: float) -> ScoreMod:
    """Gemma 2's logit soft-capping: ``cap * tanh(score / cap)``, the scores squeezed into (-cap, cap). On a
    GPU, PTX's ``tanh.approx.f32``; in the interpreter, ``tanh`` from ``exp2``."""
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap > 0:
        raise KernelInputError(f"{OP}: softcap takes a positive cap, got {cap!r}.")
    fn = _softcap_tanh if runtime.is_gpu() else _softcap
    return ScoreMod(fn, lambda s, b, h, q, kv, aux, c, a1: c * torch.tanh(s / c), None, float(cap), None,
                    f"softcap({cap:g})")  # fmt: skip


@triton.jit
def _alibi(score, b, h, q_idx, kv_idx, aux, n_heads, a1):
    slope = tl.math.exp2(-8.0 * (h + 1) / n_heads)
    return score + slope * (kv_idx - q_idx).to(tl.float32)


def _alibi_ref(s, b, h, q, kv, aux, n_heads, a1):
    return s + torch.exp2(-8.0 * (h + 1) / n_heads) * (kv - q)


def alibi(n_heads: int) -> ScoreMod:
    """ALiBi (Press et al., 2022): ``score + m_h (kv_idx - q_idx)``, head h's slope ``m_h = 2^(-8 (h+1) / H)``."""
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
        raise KernelInputError(f"{OP}: alibi takes the number of query heads, got {n_heads!r}.")
    return ScoreMod(_alibi, _alibi_ref, None, float(n_heads), None, f"alibi({n_heads})")


@triton.jit
def _relative_bias(score, b, h, q_idx, kv_idx, table, max_dist, a1):
    d = tl.minimum(tl.maximum(kv_idx - q_idx, -max_dist), max_dist)
    return score + tl.load(table + h * (2 * max_dist + 1) + d + max_dist)


def _relative_bias_ref(s, b, h, q, kv, table, max_dist, a1):
    d = (kv - q).clamp(-max_dist, max_dist) + max_dist
    return s + table.double()[h, d]


def relative_bias(table: torch.Tensor) -> ScoreMod:
    """A learned relative position bias (T5's, without the buckets): ``score + table[h, clamp(kv_idx - q_idx,
    -R, R) + R]`` for a ``(H, 2R + 1)`` float32 table."""
    if not isinstance(table, torch.Tensor) or table.ndim != 2 or table.shape[1] % 2 == 0:
        raise KernelInputError(f"{OP}: relative_bias takes an (H, 2R + 1) tensor, got "
                               f"{getattr(table, 'shape', type(table).__name__)}.")  # fmt: skip
    table = table.float().contiguous()
    return ScoreMod(_relative_bias, _relative_bias_ref, table, (table.shape[1] - 1) // 2, None,
                    f"relative_bias(R={(table.shape[1] - 1) // 2})")  # fmt: skip


@triton.jit
def _causal(b, h, q_idx, kv_idx, aux, a0, a1):
    return q_idx >= kv_idx


def causal_mask() -> MaskMod:
    """Query i sees keys j <= i (top-left, as ``causal=True``), as a block mask."""
    return MaskMod(_causal, lambda b, h, q, kv, aux, a0, a1: q >= kv, name="causal")


@triton.jit
def _sliding_window(b, h, q_idx, kv_idx, aux, window, a1):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < window)


def sliding_window(window: int) -> MaskMod:
    """Mistral's sliding window: query i sees the ``window`` keys ``i - window < j <= i`` (itself included)."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise KernelInputError(f"{OP}: sliding_window takes a window of at least 1 key, got {window!r}.")
    return MaskMod(_sliding_window, lambda b, h, q, kv, aux, w, a1: (q >= kv) & (q - kv < w), None, window, None,
                   f"sliding_window({window})")  # fmt: skip


@triton.jit
def _prefix_lm(b, h, q_idx, kv_idx, aux, prefix, a1):
    return (kv_idx < prefix) | (q_idx >= kv_idx)


def prefix_lm(prefix: int) -> MaskMod:
    """Prefix-LM: the first ``prefix`` keys are seen by every query (bidirectional), the rest causally."""
    if isinstance(prefix, bool) or not isinstance(prefix, int) or prefix < 0:
        raise KernelInputError(f"{OP}: prefix_lm takes a prefix length >= 0, got {prefix!r}.")
    return MaskMod(_prefix_lm, lambda b, h, q, kv, aux, p, a1: (kv < p) | (q >= kv), None, prefix, None,
                   f"prefix_lm({prefix})")  # fmt: skip


@triton.jit
def _document(b, h, q_idx, kv_idx, doc, n, causal):
    # indices past the sequence (a tile's padding) read the last token's document: those are masked anyway
    same = tl.load(doc + tl.minimum(q_idx, n - 1)) == tl.load(doc + tl.minimum(kv_idx, n - 1))
    return same & ((q_idx >= kv_idx) | (causal == 0))


def _document_ref(b, h, q, kv, doc, n, causal):
    same = doc[q.clamp(max=n - 1)] == doc[kv.clamp(max=n - 1)]
    return same & (q >= kv) if causal else same


def document_mask(doc_ids: torch.Tensor, causal: bool = True) -> MaskMod:
    """Packed sequences: query i sees key j only inside its own document (``doc_ids[i] == doc_ids[j]``, an
    int tensor of one document id per token, shared by the batch), and ``causal``: only j <= i."""
    if not isinstance(doc_ids, torch.Tensor) or doc_ids.ndim != 1 or not doc_ids.numel() or doc_ids.is_floating_point():
        raise KernelInputError(f"{OP}: document_mask takes a 1-D int tensor of document ids, one per token.")
    return MaskMod(_document, _document_ref, doc_ids.to(torch.int32).contiguous(), doc_ids.numel(), int(causal),
                   f"document_mask({'causal' if causal else 'bidirectional'})")  # fmt: skip


def _mod_errors() -> tuple:
    """What a modification that cannot compile raises: the GPU's compiler, or the interpreter running it as
    Python (read at the call: without Triton, importing this module must not touch its attributes)."""
    return (triton.CompilationError, TypeError, NameError, AttributeError, ValueError, AssertionError,
            getattr(triton.runtime.errors, "InterpreterError", TypeError))  # fmt: skip


class _Mods(NamedTuple):
    """A call's checked modifications: the block mask's tiles (``(None, None)`` without one), the
    kernel's keyword arguments, and their names for an error."""

    tiles: tuple
    kwargs: dict
    names: str


def _jitted(fn) -> bool:
    return isinstance(fn, triton.runtime.jit.JITFunction) or type(fn).__name__ == "InterpretedFunction"


def _score_mod(score_mod) -> ScoreMod | None:
    """A bare ``@triton.jit`` function as a :class:`ScoreMod` with no arguments (and no reference)."""
    if score_mod is None or isinstance(score_mod, ScoreMod):
        return score_mod
    if _jitted(score_mod):
        return ScoreMod(score_mod, name=getattr(score_mod, "__name__", "score_mod"))
    raise KernelInputError(f"{OP}: score_mod must be a ScoreMod (softcap(30.0), alibi(H), ...) or a @triton.jit "
                           f"function (score, b, h, q_idx, kv_idx, aux, a0, a1) -> score; got "
                           f"{type(score_mod).__name__}. A plain Python function cannot run inside the kernel: "
                           "decorate it with @triton.jit.")  # fmt: skip


def _mods(q, k, causal, score_mod, bmask) -> _Mods:
    """The checks of a call's modifications, and the kernel arguments that carry them."""
    kwargs, names, tiles = {}, [], (None, None)
    sm = _score_mod(score_mod)
    for what, mod in (("score_mod", sm), ("mask", getattr(bmask, "mask", None))):
        aux = getattr(mod, "aux", None)
        if isinstance(aux, torch.Tensor) and aux.device != q.device:
            raise KernelInputError(f"{OP}: {what} {mod.name!r} reads a tensor on {aux.device}, q is on {q.device}; "
                                   "build it from a tensor on q's device.")  # fmt: skip
    if sm is not None:
        if not _jitted(sm.fn):
            raise KernelInputError(f"{OP}: score_mod {sm.name!r}: fn must be a @triton.jit function, got "
                                   f"{type(sm.fn).__name__}.")  # fmt: skip
        kwargs.update(SCORE_MOD=sm.fn, mod_aux=sm.aux, mod_a0=sm.a0, mod_a1=sm.a1)
        names.append(f"score_mod {sm.name!r}")
    if bmask is not None:
        if not isinstance(bmask, BlockMask):
            raise KernelInputError(f"{OP}: block_mask must come from block_mask(mask, B, H, N_q, N_k) (a BlockMask), "
                                   f"got {type(bmask).__name__}.")  # fmt: skip
        if not _jitted(bmask.mask.fn):
            raise KernelInputError(f"{OP}: mask {bmask.mask.name!r}: fn must be a @triton.jit function.")
        if causal:
            raise KernelInputError(f"{OP}: causal=True with a block_mask: put causality in the mask (causal_mask(), "
                                   "sliding_window(w), document_mask(ids)) and pass causal=False.")  # fmt: skip
        B, H, N_q = q.shape[:3]
        Bm, Hm, Nm_q, Nm_k = bmask.shape
        if (Nm_q, Nm_k) != (N_q, k.shape[2]) or Bm not in (1, B) or Hm not in (1, H):
            raise KernelInputError(f"{OP}: the block mask was built for (B, H, N_q, N_k) = {bmask.shape}, the call is "
                                   f"{(B, H, N_q, k.shape[2])}; build one per shape (B or H 1: shared).")  # fmt: skip
        if bmask.num.device != q.device:
            raise KernelInputError(f"{OP}: the block mask is on {bmask.num.device}, q on {q.device}.")
        T_m = bmask.num.shape[2]
        kwargs.update(SPARSE=True, MASK_MOD=bmask.mask.fn, mask_aux=bmask.mask.aux, mask_a0=bmask.mask.a0,
                      mask_a1=bmask.mask.a1, bm_num=bmask.num, bm_idx=bmask.idx, bm_sb=(Hm * T_m if Bm > 1 else 0),
                      bm_sh=(T_m if Hm > 1 else 0), bm_tn=bmask.idx.shape[-1])  # fmt: skip
        tiles = (bmask.block_m, bmask.block_n)
        names.append(f"mask {bmask.mask.name!r}")
    return _Mods(tiles, kwargs, " and ".join(names))


# -- the launcher ---------------------------------------------------------------------------------
class _Plan(NamedTuple):
    """Everything a launch derives from shapes, strides, dtype and options: computed once per
    combination (:func:`_plan`), so a call does only its checks, two allocations and the launch."""

    ints: tuple  # the kernel's integer arguments (the scale goes between the third and the fourth)
    meta: dict  # constexprs and launch options
    grid: tuple
    descs: tuple | None  # (shape, strides, block) of the q, k, v descriptors; None: the pointer path
    store: tuple | None  # (shape, strides, block) of O's descriptor, or None
    key: tuple  # the config overrides, as _config_key gives them


@functools.lru_cache(maxsize=1024)
def _plan(q_shape, q_stride, k_shape, k_stride, v_stride, dtype, causal, variant, config_key, mod=None) -> _Plan:
    """``mod`` (lesson 7b): None for lesson 7's kernel, else the block mask's ``(BLOCK_M, BLOCK_N)``
    ((None, None) without one): the modification path at those tiles (``REF_MAX`` 1 or 2: a reference max
    with row sums; 0: the online loop)."""
    B, H, N_q, D = q_shape
    H_kv, N_k = k_shape[1], k_shape[2]
    gpu = runtime.is_gpu()
    metas = [(q_shape, q_stride), (k_shape, k_stride), (k_shape, v_stride)]
    layouts = [row_layout(shape, stride) for shape, stride in metas]
    tma = variant == "tma" or (variant in (None, "auto") and _tma_by_default(B, H, N_q, N_k, D, causal))
    if variant == "tma" and gpu and not _hopper():
        raise KernelInputError(
            f"{OP}: variant='tma' needs a Hopper GPU (compute capability 9.0+); use variant='plain'."
        )
    if tma and TensorDescriptor is None:
        if variant == "tma":
            raise KernelInputError(f"{OP}: variant='tma' needs triton >= 3.4 (tensor descriptors).")
        tma = False
    overrides = dict(config_key)
    if mod is not None:
        for name, want in zip(("BLOCK_M", "BLOCK_N"), mod, strict=True):
            if want is not None and overrides.get(name, want) != want:
                raise KernelInputError(f"{OP}: config {name}={overrides[name]} but the block mask was built with "
                                       f"{name}={want}; the kernel runs at the mask's tiles (block_mask(..., "
                                       f"{name.lower()}=...)).")  # fmt: skip
            if want is not None:
                overrides[name] = want
    cfg = {**_config(N_q, N_k, D, causal, tma, gpu), **overrides}
    descs = None
    if tma:
        rows = (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_N"])
        es = element_size(dtype)
        descs = [descriptor(m[0], lay, es, r, cfg["BLOCK_D"]) for m, lay, r in zip(metas, layouts, rows, strict=True)]
        if all(d is not None for d in descs):
            descs = tuple(descs)
        elif variant == "tma":
            raise KernelInputError(
                f"{OP}: variant='tma' needs 16-byte aligned rows and heads the descriptors can address (strides "
                f"q {q_stride}, k {k_stride}, v {v_stride}, head dim {D}); use variant='plain' or .contiguous()."
            )
        else:  # a layout the descriptors cannot take: the pointer path reads any strides
            tma, descs = False, None
            cfg = {**_config(N_q, N_k, D, causal, False, gpu), **overrides}
    bm, bn, bd = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_D"]
    if causal and bm % bn:
        raise KernelInputError(f"{OP}: causal needs BLOCK_M ({bm}) to be a multiple of BLOCK_N ({bn}).")
    store = None
    if tma and cfg["TMA_STORE"] and N_q % bm == 0 and B * H * N_q + bm < 2**31:
        store = ([B * H * N_q, D], [D, 1], [bm, bd])  # O is allocated contiguous: (B H N_q, D) rows
    o_strides = (H * N_q * D, N_q * D, D)
    ints = (H // H_kv, N_q, N_k, *layouts[0], *layouts[1], *layouts[2], *o_strides)
    meta = dict(HEAD_DIM=D, BLOCK_D=bd, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, TMA=tma, EVEN_N=N_k % bn == 0,
                TMA_STORE=store is not None, REF_MAX=int(cfg["REF_MAX"]),
                **launch_kwargs(cfg["num_warps"], cfg["num_stages"]))  # fmt: skip
    if mod is not None:
        meta["MOD"] = True
    return _Plan(ints, meta, (cdiv(N_q, bm), H, B), descs, store, config_key)


def _forward(q, k, v, causal, scale, variant, config_key, mods=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The launch, on checked inputs; ``mods``: lesson 7b's :class:`_Mods`, or None."""
    B, H, N_q, D = q.shape
    scale = default_scale(D, scale)
    o = torch.empty((B, H, N_q, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N_q), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse
    if k.shape[2] == 0:  # a softmax over no keys: SDPA's math path gives 0, and log(0) = -inf
        return o.zero_(), lse.fill_(float("-inf"))
    tiles = None if mods is None else mods.tiles
    plan = _plan(q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.dtype, causal, variant, config_key, tiles)
    srcs, o_desc = (q, k, v), o
    if plan.descs is not None:
        if (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16 == 0:  # TMA needs 16-byte aligned bases
            srcs = [TensorDescriptor(t, *spec) for t, spec in zip(srcs, plan.descs, strict=True)]
            if plan.store is not None:
                o_desc = TensorDescriptor(o, *plan.store)
        elif variant == "tma":
            raise KernelInputError(f"{OP}: variant='tma' needs q, k and v to start on 16-byte boundaries.")
        else:  # an odd view's base: the pointer path
            plan = _plan(q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.dtype, causal, "plain", plan.key,
                         tiles)  # fmt: skip
    if mods is None:
        _attention_kernel[plan.grid](*srcs, o, o_desc, lse, *plan.ints[:3], scale * LOG2E, *plan.ints[3:],
                                     SCALE_NEG=scale < 0, **plan.meta)  # fmt: skip
        return o, lse
    try:
        _attention_kernel[plan.grid](*srcs, o, o_desc, lse, *plan.ints[:3], scale * LOG2E, *plan.ints[3:],
                                     SCALE_NEG=scale < 0, **plan.meta, **mods.kwargs)  # fmt: skip
    except _mod_errors() as e:
        # the interpreter runs the modification as Python (its mistakes surface as Python's errors, wrapped in
        # InterpreterErrors); the GPU compiles it (a CompilationError): say which function failed, and the root
        root = e
        while root.__cause__ is not None:
            root = root.__cause__
        raise KernelInputError(f"{OP}: {mods.names} did not compile into the attention kernel: "
                               f"{type(root).__name__}: {str(root).strip()[:2000]}") from e  # fmt: skip
    return o, lse


# -- autograd: this forward, and the backward of lesson 8 -----------------------------------------
class AttentionFunction(torch.autograd.Function):
    """:func:`attention`'s kernel forward and :mod:`~fusionlab.kernels.attention_backward`'s launches:
    saves q, k, v, O and lse (O(N d) memory, no N x N matrix); O and lse both differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, causal, scale, variant, config_key, deterministic, backward_key):
        o, lse = _forward(q, k, v, causal, scale, variant, config_key)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.scale, ctx.deterministic, ctx.backward_key = causal, scale, deterministic, backward_key
        ctx.set_materialize_grads(False)  # an unused lse sends None, not an N_q tensor of zeros
        return o, lse

    @staticmethod
    @once_differentiable  # the kernels' gradients have no graph: a second derivative is refused, not zero
    def backward(ctx, do, dlse):
        q, k, v, o, lse = ctx.saved_tensors
        # autograd's gradients, readable once a lazy negation is resolved and a strided last dimension copied
        do = torch.zeros_like(o) if do is None else upstream_grad(do, o.dtype)
        if dlse is not None:
            dlse = upstream_grad(dlse, torch.float32).contiguous()
        dq, dk, dv = attention_backward._backward(q, k, v, o, lse, do, ctx.causal, ctx.scale, dlse, ctx.deterministic,
                                               ctx.backward_key)  # fmt: skip
        return dq, dk, dv, None, None, None, None, None, None


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    *,
    variant: str | None = None,
    config: dict | None = None,
    deterministic: bool = True,
    backward_config: dict | None = None,
    score_mod: ScoreMod | None = None,
    block_mask: BlockMask | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention forward: ``(O, lse)`` in one launch, the N x N scores never in HBM; differentiable.

    ``O = softmax(Q K^T * scale + mask) V`` and ``lse = logsumexp(Q K^T * scale + mask)`` per row. ``q``:
    (B, H_q, N_q, D); ``k``, ``v``: (B, H_kv, N_k, D), H_q a multiple of H_kv (query head h reads key/value
    head ``h // (H_q // H_kv)``). fp16/bf16 on a GPU, fp32/fp16 in the interpreter. Head dims 1 to 256
    (padded on chip to a power of two), any N_q and N_k, any strides with the last dimension contiguous
    (``x.view(B, N, H, D).transpose(1, 2)`` is read in place). ``causal``: top-left, as
    ``F.scaled_dot_product_attention(is_causal=True)``. ``scale``: default ``1 / sqrt(D)``.

    Returns O (B, H_q, N_q, D), contiguous, in q's dtype, and lse (B, H_q, N_q), fp32, natural log.
    Inputs that require grad go through :class:`AttentionFunction`: O and lse both differentiable by
    lesson 8's backward (:func:`~fusionlab.kernels.attention_backward.attention_backward`: head dims 16
    to 128; ``deterministic``: dQ in a pass of its own, bit-identical from run to run, or by atomics;
    ``backward_config``: its tiles). ``variant``: ``"tma"`` or ``"plain"`` forces a load path (None: TMA
    on Hopper where the layout allows and the call has :data:`TMA_MIN_FLOPS` of work). ``config``: tile
    overrides for a sweep (``BLOCK_M``, ``BLOCK_N``, ``num_warps``, ``num_stages``, ``TMA_STORE``,
    ``REF_MAX``: 0, 1 or 2, as in ``TMA_TABLE``). Reference: :func:`attention_reference`.

    Lesson 7b, forward only: ``score_mod`` (a :class:`ScoreMod`, or a bare ``@triton.jit`` function
    ``(score, b, h, q_idx, kv_idx, aux, a0, a1) -> score``) modifies the scaled scores in registers before
    the exponential (:func:`softcap`, :func:`alibi`, :func:`relative_bias`); ``block_mask`` (from
    :func:`block_mask`, built once per shape) lists the key blocks each Q tile visits, full ones with no
    element mask, partial ones through the mask function (:func:`causal_mask`, :func:`sliding_window`,
    :func:`document_mask`, :func:`prefix_lm`), and empty ones are never loaded. A row the mask empties
    gives O = 0 and lse = -inf. Without either, the kernel is lesson 7's, compiled the same.
    """
    grad = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v))
    _attention.check_inputs(q, k, v, causal, scale, grad=grad)
    if variant not in VARIANTS:
        raise KernelInputError(f"{OP}: variant={variant!r}; choose one of {VARIANTS}.")
    key = _config_key(config)
    if score_mod is not None or block_mask is not None:
        mods = _mods(q, k, causal, score_mod, block_mask)
        if grad:
            raise KernelInputError(
                f"{OP}: {mods.names} has a forward only (no backward yet); q, k or v requires grad. Call it under "
                "torch.no_grad() or on detached tensors, or train through torch.nn.attention.flex_attention."
            )
        return _forward(q, k, v, causal, scale, variant, key, mods)
    if not grad:
        return _forward(q, k, v, causal, scale, variant, key)
    backward_key = attention_backward._check_options(q.shape[-1], deterministic, backward_config)
    return AttentionFunction.apply(q, k, v, causal, scale, variant, key, deterministic, backward_key)
