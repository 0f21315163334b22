"""Lesson 8: FlashAttention backward — the gradients without the N x N matrices in HBM.

The spec. With ``s = Q K^T * scale`` (causal entries -inf), ``P = softmax(s)``, ``O = P V`` and
``lse = logsumexp(s)`` per row, and upstream gradients ``dO`` (and, optionally, ``dlse``):

- ``dV = P^T dO``;
- ``dP = dO V^T``;
- ``dS = P * (dP - D)`` with ``D = rowsum(dO * O) - dlse`` (``rowsum(P * dP) = rowsum(dO * O)``, so D
  is one number per query row, computed once from O instead of from the N x N P; ``lse``'s own
  gradient enters as ``d lse_i / d s_ij = P_ij``, the same shape, so it only shifts D);
- ``dQ = dS K * scale``, ``dK = dS^T Q * scale``.

``P`` is never stored: it is recomputed tile by tile from Q, K and the forward's ``lse`` as
``exp(s - lse)`` (one exponential, no max, no sum: ``lse`` already normalises it). Nothing of size
N_q x N_k reaches HBM; the extra memory is D (fp32, one per query row) and, for the atomic schedule,
an fp32 dQ.

The schedule (FlashAttention-2, section 3.1.2). Three launches:

1. *preprocess*: ``D = rowsum(dO * O) - dlse`` and the copy of lse the passes read, one program per
   block of query rows;
2. *dK, dV*: one program per (K/V tile, K/V head, batch). It holds its K and V tile and the fp32
   accumulators dK and dV on chip, and streams every query block that sees the tile (causal: only
   the rows at or below the tile's first key; blocks above the diagonal are never loaded), for every
   query head of its group (grouped-query attention: a K/V head's gradient is the sum over the query
   heads that read it, summed here in registers). Each step recomputes ``P^T`` (keys by queries),
   adds ``P^T dO`` to dV and ``dS^T Q`` to dK. dK and dV are written once.
3. *dQ*: one program per query tile streams the key blocks it sees and accumulates ``dS K`` — the
   forward's loop again, with ``dP`` and ``dS`` in place of the online softmax. The sums run in a
   fixed order: the result is bit-identical from run to run (``deterministic=True``, the default).

``deterministic=False`` drops pass 3: the dK/dV programs, which hold ``dS^T`` anyway, add
``dS K * scale`` into an fp32 dQ with atomic adds. That saves recomputing P and dP (two of pass 3's
three matmuls) but the adds land in whatever order the programs run, so dQ changes in its last
bits from run to run, and the atomics' traffic goes through L2.

FLOPs (:func:`attention_backward_flops`): five matmuls of ``2 N_q N_k D`` each against the forward's
two, ``2.5x`` the forward; the deterministic schedule computes ``Q K^T`` and ``dO V^T`` twice (seven
matmuls), the convention of every FlashAttention benchmark counts five.

Numerics: ``s``, ``P``, ``dP``, ``dS`` and the accumulators are fp32; ``P`` and ``dS`` are cast to
the input dtype before the matmuls they feed (the tensor cores' operands), as the forward casts P.
``exp`` is ``exp2`` with ``scale * log2(e)`` folded into one multiply and ``lse`` converted to base 2
once per row.

Non-finite inputs. A row whose lse is -inf, +inf or NaN (an inf or NaN in Q or K) has float64's
gradients at every pair it sees: NaN in its dQ row and in dK, dV at each key it sees (the preprocess's copy
of lse has NaN for +inf, so that P is NaN across the row as float64's softmax is). Float64's dense
autograd also spreads the NaN to dV at keys the causal mask hides from such a row; the kernel never
visits them and leaves what the other rows give them (tests/test_attention_backward.py shows both).

Masks follow the forward (:mod:`fusionlab.kernels.attention`): causal is top-left aligned, query i
sees keys j <= i (rows i >= N_k see every key); rows past N_q are loaded as zeros with ``lse = +inf``
(so their P is 0); keys past N_k are masked in the dQ pass and only ever touch their own, never
stored, rows of dK and dV.

Loads. Plain pointers with masks: any strides with the last dimension contiguous (q, k, v as the
forward took them; dO as autograd hands it over). ``config={"TMA": True}`` (Hopper, and the interpreter):
Q and dO in the dK/dV loop and K and V in the dQ loop through tensor descriptors over the (B H N, D)
rows of contiguous tensors, a partial last block through the pointers. ``config={"TMA_REDUCE": True}``
(Hopper, atomic schedule): dQ's tiles added by the copy engine's bulk reduce-add instead of one atomic
per element. The TMA loads are on by default on Hopper where they were measured faster (:data:`TMA_LOADS`,
from :data:`TMA_MIN_N` queries; ``{"TMA": False}`` turns them off), the reduce-add is off
(benchmarks/notes_attention_backward.md has every measurement behind the defaults and the tiles).
``config={"EARLY_DP": True}``: both passes issue dP's product right after S's, before the exponentials
(the same arithmetic; on by default at head dim 128 in the deterministic schedule, :data:`EARLY_DP_ON`).

Autograd: :class:`fusionlab.kernels.attention.AttentionFunction` runs the forward kernel and
:func:`_backward`'s launches; ``attention(...)`` on inputs that require grad goes through it. This module
builds on :mod:`fusionlab.kernels._attention` (the checks and the spec's arithmetic both passes share)
and never imports the forward's module.

Reference: Dao, "FlashAttention-2" (2023), algorithm 2; Triton's tutorial 06 (fused attention)
backward, whose shape (a dK/dV loop over query blocks, then a dQ loop over key blocks) this follows,
without its restrictions (causal only, N a multiple of 128, one head per K/V head).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import runtime
from .._exercise import answer_key
from ..ledger import Ledger
from ._attention import (
    LOG2E,
    TensorDescriptor,
    attention_flops,
    check_inputs,
    config_key,
    default_scale,
    hopper,
    keys_per_row,
    kv_heads,
    scores64,
)
from ._launch import KernelInputError, Launcher, cdiv, check_tensor, element_size, launch_kwargs, next_pow2
from ._tensors import upstream_grad

OP = "attention_backward"
#: the head dims the backward takes (powers of two are tested; others are padded on chip)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128


# -- the spec -------------------------------------------------------------------------------------
@answer_key
def attention_backward_reference(q, k, v, o, lse, do, causal=False, scale=None, dlse=None):
    """The spec, in float64 and in closed form (no autograd): ``(dq, dk, dv)`` in q's dtype.

    ``q`` (B, H_q, N_q, D), ``k``, ``v`` (B, H_kv, N_k, D); ``o``, ``lse`` the forward's outputs
    (``lse`` natural log: P is recomputed as ``exp(s - lse)``, exactly as the kernel does); ``do``
    (B, H_q, N_q, D); ``dlse`` (B, H_q, N_q) or None. GQA's dK and dV are summed over the query heads
    of a group.
    """
    scale = default_scale(q.shape[-1], scale)
    group = q.shape[1] // k.shape[1]
    qd, od, dod = q.double(), o.double(), do.double()
    s, kd, vd = scores64(q, k, v, causal, scale)
    p = torch.exp(s - lse.double()[..., None])  # the forward's lse normalises: no softmax here
    delta = (dod * od).sum(-1)
    if dlse is not None:
        delta = delta - dlse.double()
    dv = p.transpose(-2, -1) @ dod
    dp = dod @ vd.transpose(-2, -1)
    ds = p * (dp - delta[..., None])
    dq = (ds @ kd) * scale
    dk = (ds.transpose(-2, -1) @ qd) * scale
    B, H_kv, N_k, D = k.shape
    dk = dk.view(B, H_kv, group, N_k, D).sum(2)  # GQA: the query heads of a group summed
    dv = dv.view(B, H_kv, group, N_k, D).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# -- the ledger -----------------------------------------------------------------------------------
def attention_backward_flops(B: int, H: int, N_q: int, N_k: int, D: int, causal: bool = False) -> int:
    """``2.5x`` the forward's (:func:`fusionlab.kernels.attention.attention_flops`): five matmuls
    (``S``, ``dV``, ``dP``, ``dQ``, ``dK``) of ``2 N_q N_k D`` each, against its two. The recomputation
    in the deterministic schedule's dQ pass (``S`` and ``dP`` again) is not counted, as in every
    FlashAttention benchmark."""
    return attention_flops(B, H, N_q, N_k, D, causal) * 5 // 2


@answer_key
def attention_backward_ledger(
    B: int,
    H: int,
    N_q: int,
    N_k: int,
    D: int,
    dtype=torch.bfloat16,
    causal: bool = False,
    *,
    h_kv: int | None = None,
    block_m2: int | None = None,
    block_n1: int | None = None,
    deterministic: bool = True,
) -> Ledger:
    """The backward's trips through HBM: eager's autograd of :func:`~fusionlab.kernels.attention.
    attention_eager` op by op, and the fused schedule.

    Eager (per head, ``s_n = N_q N_k``): ``P V``'s backward reads dO, P, V and writes dP and dV;
    softmax's backward reads P and dP, writes dS; the scale's backward reads and writes dS (the causal
    mask's too); ``Q K^T``'s backward reads dS, Q, K and writes dQ and dK. P was saved by the forward.

    Fused: the preprocess reads O, dO and the forward's lse (``lse_fwd``), writes D and the copy of lse
    the passes read (fp32). The dK/dV programs read K and V once and
    write dK and dV once, and read Q, dO, lse and D once per K/V tile (``ceil(N_k / block_n1)`` times;
    causal: only the rows at or below each tile). The dQ programs read Q, dO, lse, D once and K, V once
    per query tile (``ceil(N_q / block_m2)``), and write dQ. ``None`` blocks: the ideal, each read once.
    The atomic schedule has no dQ pass; its dK/dV programs add into an fp32 dQ instead (a read and a
    write per K/V tile), zeroed before (``torch.zeros``) and cast after (``.to``): two torch ops.
    """
    h_kv = kv_heads(H, h_kv)
    q_n = B * H * N_q * D
    kv_n = B * h_kv * N_k * D
    rep_n = B * H * N_k * D
    s_n = B * H * N_q * N_k
    rows = B * H * N_q
    led = Ledger(dtype_bytes=dtype, outputs=("dQ", "dK", "dV"), sizes={"lse": 4, "lse_fwd": 4, "D": 4, "dQ_acc": 4})
    led.op("PV backward", reads={"dO": q_n, "P": s_n, "V_rep": rep_n}, writes={"dP": s_n, "dV_rep": rep_n})
    led.op("softmax backward", reads={"P": s_n, "dP": s_n}, writes={"dS": s_n})
    if causal:
        led.op("mask backward", reads={"dS": s_n}, writes={"dS_masked": s_n})
    led.op("scale backward", reads={"dS": s_n}, writes={"dS_scaled": s_n})
    led.op("QK^T backward", reads={"dS_scaled": s_n, "Q": q_n, "K_rep": rep_n}, writes={"dQ": q_n, "dK_rep": rep_n})
    if h_kv != H:
        led.op("sum over the group", reads={"dK_rep": rep_n, "dV_rep": rep_n}, writes={"dK": kv_n, "dV": kv_n})

    def q_side(tiles_rows: int) -> int:  # query rows the dK/dV programs read, summed over K/V tiles
        return B * H * tiles_rows

    if block_n1 is None:
        q_rows = N_q
    else:
        tiles = cdiv(N_k, block_n1)
        q_rows = sum(max(0, N_q - t * block_n1) if causal else N_q for t in range(tiles))
    led.fused("D = rowsum(dO * O); lse", reads={"O": q_n, "dO": q_n, "lse_fwd": rows}, writes={"D": rows, "lse": rows})
    led.fused(
        "dK, dV",
        reads={"K": kv_n, "V": kv_n, "Q": q_side(q_rows) * D, "dO": q_side(q_rows) * D, "lse": q_side(q_rows),
               "D": q_side(q_rows)},
        writes={"dK": kv_n, "dV": kv_n},
    )  # fmt: skip
    if deterministic:
        if block_m2 is None:
            kv_reads = B * H * N_k * D
        else:
            kv_reads = B * H * keys_per_row(N_q, N_k, causal, block_m2) * D  # a causal tile: keys to its last row
        led.fused("dQ", reads={"Q": q_n, "dO": q_n, "lse": rows, "D": rows, "K": kv_reads, "V": kv_reads},
                  writes={"dQ": q_n})  # fmt: skip
    else:
        led.fused("dQ zeroed", writes={"dQ_acc": q_n})  # torch.zeros: the atomics need a zero to add to
        led.fused("dQ atomics", reads={"dQ_acc": q_side(q_rows) * D}, writes={"dQ_acc": q_side(q_rows) * D})
        led.fused("dQ cast", reads={"dQ_acc": q_n}, writes={"dQ": q_n})
    return led


def attention_backward_bytes(B: int, H: int, N_q: int, N_k: int, D: int, dtype=torch.bfloat16, *, h_kv=None) -> int:
    """The fewest bytes any attention backward moves: Q, K, V, O, dO, lse read once; dQ, dK, dV
    written once."""
    h_kv = kv_heads(H, h_kv)
    es = element_size(dtype)
    return (5 * B * H * N_q * D + 4 * B * h_kv * N_k * D) * es + 4 * B * H * N_q


# -- the configuration ----------------------------------------------------------------------------
#: (BLOCK_M1, BLOCK_N1, warps1, stages1, BLOCK_M2, BLOCK_N2, warps2, stages2) by (head-dim class, causal):
#: pass 2 (dK/dV: BLOCK_N1 keys held, BLOCK_M1 queries streamed) and pass 3 (dQ: BLOCK_M2 queries held,
#: BLOCK_N2 keys streamed). The causal split needs BLOCK_N1 a multiple of BLOCK_M1 and BLOCK_M2 a
#: multiple of BLOCK_N2. Each row is the fastest of a sweep of each pass's tiles (the other pass fixed)
#: summed over N = 1k, 4k, 16k at 16k x 16 token-heads, bf16, on an H200
#: (benchmarks/notes_attention_backward.md, 2026-11-26, backward tiles). Head dim 32 takes 64's rows
#: (not swept).
GPU_TABLE = {
    (64, False): (32, 128, 8, 3, 128, 64, 8, 3),
    (64, True): (64, 64, 4, 3, 64, 64, 4, 3),
    (128, False): (64, 128, 8, 3, 128, 64, 8, 3),
    (128, True): (64, 64, 4, 2, 128, 64, 8, 3),
}
#: (head-dim class, causal) whose loads go through tensor descriptors by default on Hopper, from
#: :data:`TMA_MIN_N` queries on: the shapes that missed the cuDNN bar, where TMA loads with the table's
#: tiles were the fastest of 26 configurations on an H100 (2026-11-27, N = 4k and 16k: 2-9% over the
#: pointer loads, benchmarks/notes_attention_backward.md, "FP8 forward, warp specialisation, backward
#: tiles"); head dim 64 without a mask was not measured with them
TMA_LOADS = frozenset({(128, False), (128, True), (64, True)})
TMA_MIN_N = 4096
#: (head-dim class, causal) where dP's product is issued before the exponentials by default on a GPU
#: (``EARLY_DP``), in the deterministic schedule: head dim 128, where it was faster on an H200 (2026-11-27,
#: benchmarks/probes/probe_attention_bwd_ab.py: against cuDNN's backward 0.716 -> 0.747x and 0.789 ->
#: 0.809x without the mask, 0.805 -> 0.807x and 0.795 -> 0.809x causal, N = 4k and 16k); the atomic
#: schedule was slower with it (0.61 -> 0.55x), head dim 64 was not measured
EARLY_DP_ON = frozenset({(128, False), (128, True)})
#: the interpreter: every program is Python, so few of them; still small enough that the tests' short
#: sequences reach a causal diagonal of several blocks and a partial last block
INTERPRETER_TABLE = (16, 32, 4, 1, 32, 16, 4, 1)
_CONFIG_KEYS = ("BLOCK_M1", "BLOCK_N1", "num_warps1", "num_stages1", "BLOCK_M2", "BLOCK_N2", "num_warps2",
                "num_stages2", "TMA_REDUCE", "TMA", "EARLY_DP")  # fmt: skip


@functools.lru_cache(maxsize=1024)
def _config(d: int, causal: bool, gpu: bool) -> dict:
    block_d = max(16, next_pow2(d))
    row = GPU_TABLE[(max(64, block_d), causal)] if gpu else INTERPRETER_TABLE
    cfg = dict(zip(_CONFIG_KEYS, row, strict=False))
    cfg["BLOCK_D"] = block_d
    cfg["TMA_REDUCE"] = False
    cfg["TMA"] = False
    cfg["EARLY_DP"] = gpu and (max(64, block_d), causal) in EARLY_DP_ON
    return cfg


def attention_backward_config(D: int, causal: bool = False) -> dict:
    """The tiles the launcher picks: ``BLOCK_M1``/``BLOCK_N1`` (queries streamed / keys held by a dK,
    dV program), ``BLOCK_M2``/``BLOCK_N2`` (queries held / keys streamed by a dQ program), their
    ``num_warps*``/``num_stages*``, and ``BLOCK_D`` (the head dim rounded up to a power of two)."""
    return dict(_config(int(D), bool(causal), runtime.is_gpu()))


# -- the kernels ----------------------------------------------------------------------------------
@triton.jit
def _load_rows(base, rows, stride, offs_d, n, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, EVEN: tl.constexpr):
    """A (len(rows), BLOCK_D) tile of a head whose rows are ``stride`` elements apart: rows past ``n``
    (unless ``EVEN``: none are) and columns past ``HEAD_DIM`` read as zeros."""
    ptrs = base + rows.to(tl.int64)[:, None] * stride + offs_d[None, :]
    if EVEN:
        if HEAD_DIM == BLOCK_D:
            t = tl.load(ptrs)
        else:
            t = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    else:
        t = tl.load(ptrs, mask=(rows[:, None] < n) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    return t


@triton.jit
def _store_rows(base, rows, stride, offs_d, n, val, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    ptrs = base + rows.to(tl.int64)[:, None] * stride + offs_d[None, :]
    tl.store(ptrs, val.to(base.dtype.element_ty), mask=(rows[:, None] < n) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _bwd_preprocess_kernel(
    o_ptr, do_ptr, dlse_ptr, lse_fwd_ptr, delta_ptr, lse_ptr, n_q,
    stride_ob, stride_oh, stride_om, stride_dob, stride_doh, stride_dom,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, HAS_DLSE: tl.constexpr,
):  # fmt: skip
    """``D = rowsum(dO * O) - dlse`` in fp32 for BLOCK_M query rows of one head, and the copy of the
    forward's lse that the other passes read (``P = exp(s - lse)``), with +inf made NaN: a row whose lse
    is +inf (a score of +inf: an inf in Q or K) has float64's softmax NaN across it, where
    ``exp(s - inf)`` would give its finite scores P = 0 (a row of -inf scores, lse = -inf, is NaN
    already: ``exp(-inf - -inf)``). One select a row, here once, and none in the passes' loops."""
    off_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    offs_d = tl.arange(0, BLOCK_D)
    o_base = o_ptr + off_b.to(tl.int64) * stride_ob + off_h.to(tl.int64) * stride_oh
    do_base = do_ptr + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh
    o = _load_rows(o_base, off_m, stride_om, offs_d, n_q, HEAD_DIM, BLOCK_D, False).to(tl.float32)
    do = _load_rows(do_base, off_m, stride_dom, offs_d, n_q, HEAD_DIM, BLOCK_D, False).to(tl.float32)
    delta = tl.sum(o * do, 1)
    row = (off_b.to(tl.int64) * tl.num_programs(1) + off_h) * n_q
    if HAS_DLSE:
        delta -= tl.load(dlse_ptr + row + off_m, mask=off_m < n_q, other=0.0).to(tl.float32)
    tl.store(delta_ptr + row + off_m, delta, mask=off_m < n_q)
    lse = tl.load(lse_fwd_ptr + row + off_m, mask=off_m < n_q, other=0.0)
    tl.store(lse_ptr + row + off_m, tl.where(lse == float("inf"), float("nan"), lse), mask=off_m < n_q)


@triton.jit
def _dkdv_inner(
    dk, dv, k, v, q_base, do_base, q_desc, do_desc, lse_base, delta_base, dq_base, row, stride_qm, stride_dom,
    offs_n, offs_d, n_q, qk_scale, scale, lo, hi,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr, EVEN_M: tl.constexpr, ATOMIC_DQ: tl.constexpr, TMA: tl.constexpr,
    EARLY_DP: tl.constexpr,
):  # fmt: skip
    """Query blocks ``[lo, hi)`` against one K/V tile: the transposed tiles ``S^T``, ``P^T``, ``dP^T``,
    ``dS^T`` (keys by queries), so that dV and dK accumulate as ``P^T dO`` and ``dS^T Q`` with no
    transpose of an accumulator. ``MASKED``: the causal diagonal (query i sees key j <= i). ``TMA``: Q and
    dO tiles through descriptors over the (B H N_q, D) rows, whole blocks only (``EVEN_M`` holds).
    ``EARLY_DP``: ``dP^T``'s product issued right after ``S^T``'s, before the exponentials (it needs only
    V and dO), so the tensor cores can run it while they do; the same arithmetic."""
    offs_m0 = tl.arange(0, BLOCK_M)
    for start_m in tl.range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + offs_m0
        if TMA:
            q = q_desc.load([(row + start_m).to(tl.int32), 0])
        else:
            q = _load_rows(q_base, offs_m, stride_qm, offs_d, n_q, HEAD_DIM, BLOCK_D, EVEN_M)
        # rows past n_q: lse = +inf makes their P exactly 0 (and their Q, dO are zeros)
        if EVEN_M:
            lse2 = tl.load(lse_base + offs_m) * 1.4426950408889634
        else:
            lse2 = tl.load(lse_base + offs_m, mask=offs_m < n_q, other=float("inf")) * 1.4426950408889634
        s_t = tl.dot(k, tl.trans(q))  # (BLOCK_N, BLOCK_M), unscaled
        if EARLY_DP:
            do = _load_do(do_base, do_desc, row, start_m, offs_m, stride_dom, offs_d, n_q, HEAD_DIM, BLOCK_D,
                          EVEN_M, TMA)  # fmt: skip
            dp_t = tl.dot(v, tl.trans(do))  # (BLOCK_N, BLOCK_M)
        p_t = tl.math.exp2(s_t * qk_scale - lse2[None, :])
        if MASKED:
            p_t = tl.where(offs_m[None, :] >= offs_n[:, None], p_t, 0.0)
        if not EARLY_DP:
            do = _load_do(do_base, do_desc, row, start_m, offs_m, stride_dom, offs_d, n_q, HEAD_DIM, BLOCK_D,
                          EVEN_M, TMA)  # fmt: skip
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        if not EARLY_DP:
            dp_t = tl.dot(v, tl.trans(do))  # (BLOCK_N, BLOCK_M)
        if EVEN_M:
            di = tl.load(delta_base + offs_m)
        else:
            di = tl.load(delta_base + offs_m, mask=offs_m < n_q, other=0.0)
        ds_t = (p_t * (dp_t - di[None, :])).to(q.dtype)
        dk = tl.dot(ds_t, q, dk)
        if ATOMIC_DQ == 1:
            dq = tl.dot(tl.trans(ds_t), k) * scale  # (BLOCK_M, BLOCK_D) fp32
            ptrs = dq_base + offs_m.to(tl.int64)[:, None] * HEAD_DIM + offs_d[None, :]
            tl.atomic_add(ptrs, dq, mask=(offs_m[:, None] < n_q) & (offs_d[None, :] < HEAD_DIM), sem="relaxed")
        elif ATOMIC_DQ == 2:
            # one bulk reduce-add of the tile by the copy engine (TMA); rows past n_q belong to the next
            # head in the (B H N_q, D) view, and add exactly 0 there (their dS is 0)
            dq = tl.dot(tl.trans(ds_t), k) * scale
            dq_base.atomic_add([(row + start_m).to(tl.int32), 0], dq)
    return dk, dv


@triton.jit
def _load_do(do_base, do_desc, row, start_m, offs_m, stride_dom, offs_d, n_q, HEAD_DIM: tl.constexpr,
             BLOCK_D: tl.constexpr, EVEN_M: tl.constexpr, TMA: tl.constexpr):  # fmt: skip
    """dO's query block at ``start_m``: through the descriptor (whole blocks) or the pointers."""
    if TMA:
        do = do_desc.load([(row + start_m).to(tl.int32), 0])
    else:
        do = _load_rows(do_base, offs_m, stride_dom, offs_d, n_q, HEAD_DIM, BLOCK_D, EVEN_M)
    return do


@triton.jit
def _dkdv_range(
    dk, dv, k, v, q_base, do_base, q_desc, do_desc, lse_base, delta_base, dq_base, row, stride_qm, stride_dom,
    offs_n, offs_d, n_q, qk_scale, scale, lo, hi,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    MASKED: tl.constexpr, EVEN_M: tl.constexpr, ATOMIC_DQ: tl.constexpr, TMA: tl.constexpr,
    EARLY_DP: tl.constexpr,
):  # fmt: skip
    """Query blocks ``[lo, hi)``: with ``TMA``, the whole blocks through the descriptors and a partial
    last block (rows past n_q, which the descriptors would read from the next head) through masked
    pointer loads."""
    if TMA:
        m_full = (n_q // BLOCK_M) * BLOCK_M
        dk, dv = _dkdv_inner(
            dk, dv, k, v, q_base, do_base, q_desc, do_desc, lse_base, delta_base, dq_base, row, stride_qm,
            stride_dom, offs_n, offs_d, n_q, qk_scale, scale, lo, tl.minimum(hi, m_full),
            HEAD_DIM, BLOCK_D, BLOCK_M, MASKED, True, ATOMIC_DQ, True, EARLY_DP,
        )  # fmt: skip
        if not EVEN_M:
            dk, dv = _dkdv_inner(
                dk, dv, k, v, q_base, do_base, q_desc, do_desc, lse_base, delta_base, dq_base, row, stride_qm,
                stride_dom, offs_n, offs_d, n_q, qk_scale, scale, tl.maximum(lo, m_full), hi,
                HEAD_DIM, BLOCK_D, BLOCK_M, MASKED, False, ATOMIC_DQ, False, EARLY_DP,
            )  # fmt: skip
    else:
        dk, dv = _dkdv_inner(
            dk, dv, k, v, q_base, do_base, q_desc, do_desc, lse_base, delta_base, dq_base, row, stride_qm,
            stride_dom, offs_n, offs_d, n_q, qk_scale, scale, lo, hi,
            HEAD_DIM, BLOCK_D, BLOCK_M, MASKED, EVEN_M, ATOMIC_DQ, False, EARLY_DP,
        )  # fmt: skip
    return dk, dv


@triton.jit
def _bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, dq_ptr, q_desc, do_desc,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_dob, stride_doh, stride_dom, kv_group, n_q, n_k, qk_scale, scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, EVEN_M: tl.constexpr, ATOMIC_DQ: tl.constexpr, TMA: tl.constexpr,
    EARLY_DP: tl.constexpr,
):  # fmt: skip
    # grid: (K/V tiles, H_kv, B). dk, dv: contiguous (B, H_kv, N_k, D); lse (the preprocess's copy), delta:
    # (B, H_q, N_q)
    # fp32; dq (atomic schedule only): fp32 (B, H_q, N_q, D), zeroed by the launcher.
    pid_n = tl.program_id(0)
    off_hk = tl.program_id(1)
    off_b = tl.program_id(2)
    h_q = tl.num_programs(1) * kv_group
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    k_base = k_ptr + off_b.to(tl.int64) * stride_kb + off_hk.to(tl.int64) * stride_kh
    v_base = v_ptr + off_b.to(tl.int64) * stride_vb + off_hk.to(tl.int64) * stride_vh
    # keys past n_k load as zeros; their rows of dK and dV are never stored, and nothing else reads them
    k = _load_rows(k_base, offs_n, stride_kn, offs_d, n_k, HEAD_DIM, BLOCK_D, False)
    v = _load_rows(v_base, offs_n, stride_vn, offs_d, n_k, HEAD_DIM, BLOCK_D, False)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    if CAUSAL:
        # query rows below n0 see none of these keys: never loaded. [n0, n0 + BLOCK_N): the diagonal,
        # masked (BLOCK_N is a multiple of BLOCK_M, so n0 starts a query block); the rest unmasked
        lo = n0
        mid = tl.minimum(n0 + BLOCK_N, n_q)
    else:
        lo = 0
        mid = 0
    for g in range(kv_group):  # the query heads that read this K/V head: their dK, dV summed here
        off_h = off_hk * kv_group + g
        q_base = q_ptr + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
        do_base = do_ptr + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh
        row = (off_b.to(tl.int64) * h_q + off_h) * n_q
        if ATOMIC_DQ == 2:
            dq_base = dq_ptr  # a descriptor over dQ's rows, (B H N_q, D)
        else:
            dq_base = dq_ptr + row * HEAD_DIM
        if CAUSAL:
            dk, dv = _dkdv_range(
                dk, dv, k, v, q_base, do_base, q_desc, do_desc, lse_ptr + row, delta_ptr + row, dq_base, row,
                stride_qm, stride_dom, offs_n, offs_d, n_q, qk_scale, scale, lo, mid,
                HEAD_DIM, BLOCK_D, BLOCK_M, True, EVEN_M, ATOMIC_DQ, TMA, EARLY_DP,
            )  # fmt: skip
        dk, dv = _dkdv_range(
            dk, dv, k, v, q_base, do_base, q_desc, do_desc, lse_ptr + row, delta_ptr + row, dq_base, row,
            stride_qm, stride_dom, offs_n, offs_d, n_q, qk_scale, scale, mid, n_q,
            HEAD_DIM, BLOCK_D, BLOCK_M, False, EVEN_M, ATOMIC_DQ, TMA, EARLY_DP,
        )  # fmt: skip
    out = (off_b.to(tl.int64) * tl.num_programs(1) + off_hk) * n_k * HEAD_DIM
    _store_rows(dk_ptr + out, offs_n, HEAD_DIM, offs_d, n_k, dk * scale, HEAD_DIM, BLOCK_D)
    _store_rows(dv_ptr + out, offs_n, HEAD_DIM, offs_d, n_k, dv, HEAD_DIM, BLOCK_D)


@triton.jit
def key_range(m0, n_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """The key blocks of the query tile starting at ``m0``: ``(lo_mask, hi)``, unmasked blocks in
    ``[0, lo_mask)``, the causal diagonal and the partial last block in ``[lo_mask, hi)``; causal keys
    above the diagonal are never loaded. (Shared with :mod:`.attention_fp8`'s forward.)"""
    n_full = (n_k // BLOCK_N) * BLOCK_N
    if CAUSAL:
        lo_mask = tl.minimum(m0, n_full)  # m0 is a multiple of BLOCK_M, hence of BLOCK_N
        hi = tl.minimum(m0 + BLOCK_M, n_k)
    else:
        lo_mask = n_full
        hi = n_k
    return lo_mask, hi


@triton.jit
def _dq_inner(
    dq, q, do, lse2, di, k_base, v_base, k_desc, v_desc, k_row, stride_kn, stride_vn, offs_m, offs_d, n_k,
    qk_scale, lo, hi,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
    CAUSAL: tl.constexpr, TMA: tl.constexpr, EARLY_DP: tl.constexpr,
):  # fmt: skip
    """Key blocks ``[lo, hi)`` for one query tile: ``dQ += dS K``. ``MASKED``: the causal diagonal and
    the partial last block (keys past n_k: their P is forced to 0, whatever the zero K row gave).
    ``TMA`` (unmasked blocks only): K and V through descriptors over the (B H_kv N_k, D) rows."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        if TMA:
            k = k_desc.load([(k_row + start_n).to(tl.int32), 0])
            v = v_desc.load([(k_row + start_n).to(tl.int32), 0])
        else:
            k = _load_rows(k_base, offs_n, stride_kn, offs_d, n_k, HEAD_DIM, BLOCK_D, not MASKED)
            v = _load_rows(v_base, offs_n, stride_vn, offs_d, n_k, HEAD_DIM, BLOCK_D, not MASKED)
        s = tl.dot(q, tl.trans(k))  # (BLOCK_M, BLOCK_N)
        if EARLY_DP:  # dP's product before the exponentials (the dK/dV loop's EARLY_DP)
            dp = tl.dot(do, tl.trans(v))
        p = tl.math.exp2(s * qk_scale - lse2[:, None])
        if MASKED:
            keep = offs_n[None, :] < n_k
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            p = tl.where(keep, p, 0.0)
        if not EARLY_DP:
            dp = tl.dot(do, tl.trans(v))
        ds = (p * (dp - di[:, None])).to(k.dtype)
        dq = tl.dot(ds, k, dq)
    return dq


@triton.jit
def _bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, k_desc, v_desc,
    stride_qb, stride_qh, stride_qm, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    stride_dob, stride_doh, stride_dom, kv_group, n_q, n_k, qk_scale, scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, TMA: tl.constexpr, EARLY_DP: tl.constexpr,
):  # fmt: skip
    # grid: (query tiles, H_q, B); dq contiguous (B, H_q, N_q, D). Query tiles from the last, as the
    # forward: a causal head's longest tiles start first
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    off_h = tl.program_id(1)
    off_b = tl.program_id(2)
    off_hk = off_h // kv_group
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    q_base = q_ptr + off_b.to(tl.int64) * stride_qb + off_h.to(tl.int64) * stride_qh
    do_base = do_ptr + off_b.to(tl.int64) * stride_dob + off_h.to(tl.int64) * stride_doh
    k_base = k_ptr + off_b.to(tl.int64) * stride_kb + off_hk.to(tl.int64) * stride_kh
    v_base = v_ptr + off_b.to(tl.int64) * stride_vb + off_hk.to(tl.int64) * stride_vh
    row = (off_b.to(tl.int64) * tl.num_programs(1) + off_h) * n_q
    q = _load_rows(q_base, offs_m, stride_qm, offs_d, n_q, HEAD_DIM, BLOCK_D, False)
    do = _load_rows(do_base, offs_m, stride_dom, offs_d, n_q, HEAD_DIM, BLOCK_D, False)
    lse2 = tl.load(lse_ptr + row + offs_m, mask=offs_m < n_q, other=float("inf")) * 1.4426950408889634
    di = tl.load(delta_ptr + row + offs_m, mask=offs_m < n_q, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    lo_mask, hi = key_range(m0, n_k, BLOCK_M, BLOCK_N, CAUSAL)
    k_row = (off_b * (tl.num_programs(1) // kv_group) + off_hk) * n_k  # the head's first row in (B H_kv N_k, D)
    dq = _dq_inner(dq, q, do, lse2, di, k_base, v_base, k_desc, v_desc, k_row, stride_kn, stride_vn, offs_m, offs_d,
                   n_k, qk_scale, 0, lo_mask, HEAD_DIM, BLOCK_D, BLOCK_N, False, CAUSAL, TMA, EARLY_DP)  # fmt: skip
    dq = _dq_inner(dq, q, do, lse2, di, k_base, v_base, k_desc, v_desc, k_row, stride_kn, stride_vn, offs_m, offs_d,
                   n_k, qk_scale, lo_mask, hi, HEAD_DIM, BLOCK_D, BLOCK_N, True, CAUSAL, False,
                   EARLY_DP)  # fmt: skip
    dq_base = dq_ptr + row * HEAD_DIM
    _store_rows(dq_base, offs_m, HEAD_DIM, offs_d, n_q, dq * scale, HEAD_DIM, BLOCK_D)


# -- the launcher ---------------------------------------------------------------------------------
def _check_saved(q, k, v, o, lse, do, dlse) -> None:
    """What the forward's checks did not see: o, lse, do, dlse against q."""
    B, H, N_q, D = q.shape
    for name, t in (("o", o), ("do", do)):
        check_tensor(t, name, op=OP, dtypes=(q.dtype,), ndim=4, contiguous=False, grad=True, max_numel=None)
        if t.shape != q.shape:
            raise KernelInputError(f"{OP}: {name} must have q's shape {tuple(q.shape)}, got {tuple(t.shape)}.")
    for name, t in (("lse", lse), ("dlse", dlse)):
        if t is None and name == "dlse":
            continue
        check_tensor(t, name, op=OP, dtypes=(torch.float32,), ndim=3, contiguous=False, grad=True, max_numel=None)
        if t.shape != (B, H, N_q):
            raise KernelInputError(f"{OP}: {name} must be fp32 (B, H_q, N_q) = {(B, H, N_q)}, got {tuple(t.shape)}.")
    if not MIN_HEAD_DIM <= D <= MAX_HEAD_DIM:
        raise KernelInputError(f"{OP}: head dim {D}; the backward takes {MIN_HEAD_DIM} to {MAX_HEAD_DIM}.")


_launch_preprocess = Launcher(_bwd_preprocess_kernel)
_launch_dkdv = Launcher(_bwd_dkdv_kernel)
_launch_dq = Launcher(_bwd_dq_kernel)


class _Plan(NamedTuple):
    """What a launch derives from shapes and options, computed once per combination (:func:`_plan`)."""

    grids: tuple  # preprocess, dK/dV, dQ
    metas: tuple  # their constexprs and launch options
    dq_desc: tuple | None  # (shape, strides, block) of the atomic dQ's descriptor, or None: pointer atomics
    loads: tuple | None  # (shape, strides, block) of the Q/dO and the K/V descriptors, or None: pointer loads


def _config_key(config: dict | None) -> tuple:
    return config_key(config, OP, _CONFIG_KEYS, flags=("TMA_REDUCE", "TMA", "EARLY_DP"))


@functools.lru_cache(maxsize=1024)
def _plan(B, H, H_kv, N_q, N_k, D, causal, deterministic, key) -> _Plan:
    gpu = runtime.is_gpu()
    cfg = {**_config(D, causal, gpu), **dict(key)}
    if "TMA" not in dict(key) and gpu and N_q >= TMA_MIN_N and (max(64, cfg["BLOCK_D"]), causal) in TMA_LOADS:
        cfg["TMA"] = True  # still only where the layout allows it (contiguous, aligned: checked per call)
    bm1, bn1, bm2, bn2, bd = cfg["BLOCK_M1"], cfg["BLOCK_N1"], cfg["BLOCK_M2"], cfg["BLOCK_N2"], cfg["BLOCK_D"]
    if causal and (bn1 % bm1 or bm2 % bn2):
        raise KernelInputError(
            f"{OP}: causal needs BLOCK_N1 ({bn1}) a multiple of BLOCK_M1 ({bm1}) and BLOCK_M2 ({bm2}) one of "
            f"BLOCK_N2 ({bn2})."
        )
    # the atomic schedule's dQ by the copy engine's reduce-add: Hopper only (the interpreter has no bulk
    # reduce; elsewhere pointer atomics), a head dim that is a power of two, int32 row coordinates
    tma_reduce = (
        not deterministic and bool(cfg["TMA_REDUCE"]) and TensorDescriptor is not None and D == bd
        and hopper() and B * H * N_q + bm1 < 2**31
    )  # fmt: skip
    # EARLY_DP by default in the deterministic schedule only (EARLY_DP_ON); as asked, in either
    early = bool(cfg["EARLY_DP"]) and (deterministic or "EARLY_DP" in dict(key))
    bmp = 64 if gpu else 128  # the preprocess: a row sum per query, memory-bound
    grids = ((cdiv(N_q, bmp), H, B), (cdiv(N_k, bn1), H_kv, B), (cdiv(N_q, bm2), H, B))
    metas = (
        {"HEAD_DIM": D, "BLOCK_D": bd, "BLOCK_M": bmp, **launch_kwargs(4)},
        {"HEAD_DIM": D, "BLOCK_D": bd, "BLOCK_M": bm1, "BLOCK_N": bn1, "CAUSAL": causal, "EVEN_M": N_q % bm1 == 0,
         "ATOMIC_DQ": 0 if deterministic else (2 if tma_reduce else 1), "EARLY_DP": early,
         **launch_kwargs(cfg["num_warps1"], cfg["num_stages1"])},
        {"HEAD_DIM": D, "BLOCK_D": bd, "BLOCK_M": bm2, "BLOCK_N": bn2, "CAUSAL": causal,
         "EARLY_DP": early, **launch_kwargs(cfg["num_warps2"], cfg["num_stages2"])},
    )  # fmt: skip
    # TMA loads (config TMA): Q and dO in the dK/dV loop, K and V in the dQ loop, through descriptors over
    # the (B H N, D) rows of contiguous tensors (the launcher checks contiguity and alignment per call)
    tma = (
        bool(cfg["TMA"]) and TensorDescriptor is not None and D == bd and (hopper() or not gpu)
        and B * H * N_q + bm1 < 2**31 and B * H_kv * N_k + bn2 < 2**31
    )  # fmt: skip
    loads = (([B * H * N_q, D], [D, 1], [bm1, bd]), ([B * H_kv * N_k, D], [D, 1], [bn2, bd])) if tma else None
    return _Plan(grids, metas, ([B * H * N_q, D], [D, 1], [bm1, bd]) if tma_reduce else None, loads)


def attention_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    causal: bool = False,
    scale: float | None = None,
    *,
    dlse: torch.Tensor | None = None,
    deterministic: bool = True,
    config: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashAttention backward: ``(dq, dk, dv)`` from the forward's ``o`` and ``lse``, P recomputed.

    ``q``: (B, H_q, N_q, D); ``k``, ``v``: (B, H_kv, N_k, D) with H_q a multiple of H_kv; ``o``, ``lse``:
    what :func:`fusionlab.kernels.attention.attention` returned for them with the same ``causal`` and
    ``scale``; ``do``: the gradient of O (any strides with the last dimension contiguous; a negated view
    is resolved, a transposed one copied); ``dlse``: the gradient of lse, or None. Head dims
    16 to 128; any N_q, N_k; fp16/bf16 on a GPU, fp32/fp16 in the interpreter.
    ``deterministic=True`` (default): dQ in a pass of its own, bit-identical from run to run;
    ``False``: dQ added with fp32 atomics by the dK/dV programs. ``config``: tile overrides
    (:func:`attention_backward_config`'s keys). Returns dq, dk, dv, contiguous, in the inputs' dtype;
    dk and dv are summed over the query heads of each group.
    """
    check_inputs(q, k, v, causal, scale, op=OP, grad=True)
    if do is None:
        raise KernelInputError(f"{OP}: do must be a torch.Tensor, got None.")
    do = upstream_grad(do, q.dtype) if isinstance(do, torch.Tensor) and do.dtype == q.dtype else do
    if dlse is not None and isinstance(dlse, torch.Tensor):
        dlse = upstream_grad(dlse, torch.float32) if dlse.dtype == torch.float32 else dlse
        dlse = dlse.contiguous()
    _check_saved(q, k, v, o, lse, do, dlse)
    if not isinstance(deterministic, bool):
        raise KernelInputError(f"{OP}: deterministic must be True or False, got {deterministic!r}.")
    return _backward(q, k, v, o, lse, do, causal, scale, dlse, deterministic, _config_key(config))


def _backward(q, k, v, o, lse, do, causal, scale, dlse, deterministic, key):
    """The launches, on checked inputs (``do`` and ``dlse`` readable as they are: last dimension
    contiguous, no lazy negation)."""
    B, H, N_q, D = q.shape
    H_kv, N_k = k.shape[1], k.shape[2]
    if N_q == 0 or N_k == 0 or B == 0 or H == 0:  # no pair of a query and a key: no gradient flows
        dk = torch.zeros((B, H_kv, N_k, D), dtype=k.dtype, device=q.device)
        return torch.zeros((B, H, N_q, D), dtype=q.dtype, device=q.device), dk, torch.zeros_like(dk)
    plan = _plan(B, H, H_kv, N_q, N_k, D, causal, deterministic, key)
    scale = default_scale(D, scale)
    # every row of dK and dV is written (a K/V tile no query sees stores zeros): no memset
    dk = torch.empty((B, H_kv, N_k, D), dtype=k.dtype, device=q.device)
    dv = torch.empty((B, H_kv, N_k, D), dtype=v.dtype, device=q.device)
    if lse.stride(-1) != 1 or not lse.is_contiguous():
        lse = lse.contiguous()
    delta, lse_nan = torch.empty((2, B, H, N_q), dtype=torch.float32, device=q.device)  # one allocation
    _launch_preprocess(plan.grids[0], o, do, delta if dlse is None else dlse, lse, delta, lse_nan, N_q, *o.stride()[:3],
                       *do.stride()[:3], **plan.metas[0], HAS_DLSE=dlse is not None)  # fmt: skip
    strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3])
    ints = (H // H_kv, N_q, N_k)
    tma = (
        plan.loads is not None and q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
        and do.is_contiguous() and (q.data_ptr() | k.data_ptr() | v.data_ptr() | do.data_ptr()) % 16 == 0
    )  # fmt: skip
    if tma:
        q_src, do_src = (TensorDescriptor(t.view(-1, D), *plan.loads[0]) for t in (q, do))
        k_src, v_src = (TensorDescriptor(t.view(-1, D), *plan.loads[1]) for t in (k, v))
    else:
        q_src, do_src, k_src, v_src = q, do, k, v  # placeholders: the kernels read the pointers
    if deterministic:
        dq_acc = delta  # a placeholder: the kernel never touches it
    else:
        dq_acc = torch.zeros((B, H, N_q, D), dtype=torch.float32, device=q.device)
    dq_arg = dq_acc if plan.dq_desc is None else TensorDescriptor(dq_acc.view(-1, D), *plan.dq_desc)
    # descriptors go through Triton's own launch (the Launcher's cache keys on tensors and numbers)
    direct = tma or plan.dq_desc is not None
    launch = _bwd_dkdv_kernel[plan.grids[1]] if direct else functools.partial(_launch_dkdv, plan.grids[1])
    launch(q, k, v, do, lse_nan, delta, dk, dv, dq_arg, q_src, do_src, *strides, *ints, scale * LOG2E, scale,
           **plan.metas[1], TMA=tma)  # fmt: skip
    if deterministic:
        dq = torch.empty((B, H, N_q, D), dtype=q.dtype, device=q.device)
        launch = _bwd_dq_kernel[plan.grids[2]] if tma else functools.partial(_launch_dq, plan.grids[2])
        launch(q, k, v, do, lse_nan, delta, dq, k_src, v_src, *strides, *ints, scale * LOG2E, scale,
               **plan.metas[2], TMA=tma)  # fmt: skip
    else:
        dq = dq_acc.to(q.dtype)
    return dq, dk, dv


def _check_options(d: int, deterministic, config: dict | None) -> tuple:
    """What :func:`fusionlab.kernels.attention.attention` checks before a forward that autograd will
    differentiate: the backward's head dims, ``deterministic``, and its tile overrides (returned as a key
    for :func:`_backward`)."""
    if not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
        raise KernelInputError(f"{OP}: head dim {d}; the backward takes {MIN_HEAD_DIM} to {MAX_HEAD_DIM}.")
    if not isinstance(deterministic, bool):
        raise KernelInputError(f"{OP}: deterministic must be True or False, got {deterministic!r}.")
    return _config_key(config)
