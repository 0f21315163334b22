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
``exp(s - m_ref)`` against block 0's row max with no rescale (:func:`~._attention._attention_ref`); a
tile where that overflows reruns through the online loop. Non-finite inputs give the float64 reference's O and lse
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
    TensorDescriptor,
    _attention_ref,
    _block_max,
    _block_p,
    _kv_tile,
    attention_bytes,
    attention_eager,
    attention_flops,
    attention_ledger,
    default_scale,
    descriptor,
    row_layout,
)
from ._launch import KernelInputError, cdiv, element_size, launch_kwargs, next_pow2
from ._tensors import upstream_grad
from .attention_mods import (
    BlockMask,
    MaskMod,
    ScoreMod,
    _attention_mod,
    _mod_errors,
    _mods,
    _score_mod,
    mod_error_text,
    mod_overrides,
    modified_scores64,
)

__all__ = ["attention", "attention_reference", "attention_eager", "attention_ledger", "attention_flops",
           "attention_bytes", "attention_config", "AttentionFunction"]  # fmt: skip

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
        s, _, vd = modified_scores64(q, k, v, causal, scale, _score_mod(score_mod), mask)
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
def _attention_kernel(
    q_src, k_src, v_src, o_ptr, o_desc, lse_ptr, kv_group, n_q, n_k, qk_scale, q_rb, q_rh, q_cb, q_ch, stride_qm,
    k_rb, k_rh, k_cb, k_ch, stride_kn, v_rb, v_rh, v_cb, v_ch, stride_vn, stride_ob, stride_oh, stride_om,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, SCALE_NEG: tl.constexpr, TMA: tl.constexpr, EVEN_N: tl.constexpr, TMA_STORE: tl.constexpr,
    REF_MAX: tl.constexpr = 0,
    MOD: tl.constexpr = False, SCORE_MOD: tl.constexpr = None, MASK_MOD: tl.constexpr = None,
    SPARSE: tl.constexpr = False, BM_DIV: tl.constexpr = 1, BN_DIV: tl.constexpr = 1, MOD_RISING: tl.constexpr = False,
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
            HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, CAUSAL, TMA, EVEN_N, SCORE_MOD, MASK_MOD, SPARSE, BM_DIV, BN_DIV,
            REF_MAX > 0, MOD_RISING,
        )  # fmt: skip
    elif REF_MAX:  # Hopper's default: every block against block 0's row max (_attention.py)
        acc, l_i, m_ref = _attention_ref(
            acc, m_i, q, k_base, v_base, k_row, k_col, v_row, v_col, stride_kn, stride_vn,
            offs_m, offs_d, n_k, qk_scale, lo_mask, hi,
            HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL, SCALE_NEG, TMA, EVEN_N, REF_MAX == 2,
        )  # fmt: skip
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
    """``mod`` (lesson 7b): None for lesson 7's kernel, else the block mask's ``(block_m, block_n)``
    ((None, None) without one) and whether the reference max may run: the modification path
    (:func:`~fusionlab.kernels.attention_mods.mod_overrides`; ``REF_MAX`` 1 or 2: a reference max with row
    sums; 0: the online loop)."""
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
        overrides = mod_overrides(mod, overrides, config_key, lambda o: {**_config(N_q, N_k, D, causal, tma, gpu), **o},
                                  D, causal, tma, N_q > LONG)  # fmt: skip
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
        if mod[0] is not None:
            meta["BM_DIV"], meta["BN_DIV"] = mod[0] // bm, mod[1] // bn
            # a part of the mask's last key block may lie wholly past N_k: it is masked like the block
            meta["EVEN_N"] = N_k % mod[1] == 0
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
        # InterpreterErrors); the GPU compiles it (a CompilationError): say which function failed, and why first
        raise KernelInputError(f"{OP}: {mods.names} did not compile into the attention kernel: "
                               f"{mod_error_text(e)}") from e  # fmt: skip
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
    the exponential (:mod:`.attention_mods`: ``softcap``, ``alibi``, ``relative_bias``); ``block_mask`` (from
    ``attention_mods.block_mask``, built once per shape) lists the key blocks each Q tile visits, full ones with no
    element mask, partial ones through the mask function (``causal_mask``, ``sliding_window``,
    ``document_mask``, ``prefix_lm``), and empty ones are never loaded. A row the mask empties
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
