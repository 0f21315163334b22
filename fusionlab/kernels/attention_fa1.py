"""Lesson 7's contrast: the FlashAttention-1 schedule of the attention forward, K/V in the outer loop.

FlashAttention-1 (Dao et al., 2022, Algorithm 1) walks the keys in the **outer** loop and the queries in
the inner one. For each K/V block j it visits every Q tile i, and because a Q tile's running state
cannot stay on chip across the outer loop, it is carried through HBM:

    for each K/V block j:                 # K_j, V_j loaded once
        for each Q tile i:                # Q_i loaded again for every j
            read O_i, m_i, l_i            # the running state, back from HBM
            S = Q_i K_j^T; online update of m_i, l_i, O_i
            write O_i, m_i, l_i           # and out again

FlashAttention-2 (Dao, 2023) swaps the loops (the package's :func:`~fusionlab.kernels.attention.attention`
and lesson 7's kernel): one program per Q tile keeps Q_i, O_i, m_i, l_i in registers for its whole
life and streams K/V through it, so O and the statistics are written once. FA1 also parallelised over
(batch, head) only: one program per head, here too (``grid = (B * H,)``); FA2 adds the sequence.

This module is the schedule, not a tuned kernel: O's running state lives in an fp32 workspace (FA1
kept it in the output dtype, rescaled by ``l`` each step; fp32 here so that the two schedules differ
in their trips, not in their rounding), tiles are fixed, and nothing is autotuned. The trips of both
schedules: :func:`attention_fa1_ledger` beside :func:`~fusionlab.kernels.attention.attention_ledger`.
Reference and FLOPs are attention's (:func:`~fusionlab.kernels.attention.attention_reference`,
:func:`~fusionlab.kernels.attention.attention_flops`): same math, same FLOPs.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .. import runtime
from ..ledger import Ledger
from ._attention import LOG2E, attention_ledger, check_inputs
from ._launch import KernelInputError

#: (BLOCK_M, BLOCK_N): a Q tile's rows, a K/V block's keys (GPU; the interpreter's are smaller)
TILE = (64, 64)
INTERPRETER_TILE = (32, 16)


def _tile() -> tuple[int, int]:
    return TILE if runtime.is_gpu() else INTERPRETER_TILE


def _q_lo(start_n: int, n_q: int, block_m: int, causal: bool) -> int:
    """The first query row of the first Q tile that sees any key of the block starting at ``start_n``."""
    return min(start_n // block_m * block_m, n_q) if causal else 0


# -- ledger ---------------------------------------------------------------------------------------
def attention_fa1_ledger(
    B: int,
    H: int,
    N_q: int,
    N_k: int,
    D: int,
    dtype=torch.bfloat16,
    causal: bool = False,
    block_m: int | None = None,
    block_n: int | None = None,
) -> Ledger:
    """The trips of the FA1 schedule (fused side) beside naive attention's (eager side, as
    :func:`~fusionlab.kernels.attention.attention_ledger`).

    Per head: K and V read once; for each of the ``ceil(N_k / block_n)`` K/V blocks, every Q tile that
    sees it (causal: from the diagonal down) reads Q, and reads and writes the running state, O in fp32
    and m, l in fp32 (the first block only writes it); at the end the state is read once more and O and
    lse are written. Tiles default to the GPU's :data:`TILE`."""
    bm, bn = block_m or TILE[0], block_n or TILE[1]
    led = attention_ledger(B, H, N_q, N_k, D, dtype, causal)
    led.schedule = []
    led.sizes.update({"O_acc": 4, "m": 4, "l": 4, "lse": 4})
    heads = B * H
    rows = [N_q - _q_lo(s, N_q, bm, causal) for s in range(0, N_k, bn)]  # query rows each K block visits
    visits, revisits = sum(rows), sum(rows[1:])
    led.fused("K, V once (outer)", reads={"K": heads * N_k * D, "V": heads * N_k * D})
    led.fused("Q per K block", reads={"Q": heads * visits * D})
    led.fused(
        "state back in",
        reads={"O_acc": heads * revisits * D, "m": heads * revisits, "l": heads * revisits},
    )
    led.fused("state out", writes={"O_acc": heads * visits * D, "m": heads * visits, "l": heads * visits})
    led.fused("final: state in", reads={"O_acc": heads * N_q * D, "m": heads * N_q, "l": heads * N_q})
    led.fused("final: O, lse", writes={"O": heads * N_q * D, "lse": heads * N_q})
    return led


# -- the kernel -------------------------------------------------------------------------------------
@triton.jit
def _attention_fa1_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, acc_ptr, m_ptr, l_ptr, n_q, n_k, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr,
):  # fmt: skip
    bh = tl.program_id(0).to(tl.int64)  # one program per (batch, head), as FA1
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d[None, :] < HEAD_DIM
    q_head, o_head = q_ptr + bh * n_q * HEAD_DIM, o_ptr + bh * n_q * HEAD_DIM
    k_head, v_head = k_ptr + bh * n_k * HEAD_DIM, v_ptr + bh * n_k * HEAD_DIM
    acc_head, m_head, l_head = acc_ptr + bh * n_q * BLOCK_D, m_ptr + bh * n_q, l_ptr + bh * n_q
    for start_n in range(0, n_k, BLOCK_N):  # OUTER: K/V blocks, each loaded once
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n[:, None] < n_k) & d_mask
        k = tl.load(k_head + offs_n[:, None] * HEAD_DIM + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_head + offs_n[:, None] * HEAD_DIM + offs_d[None, :], mask=kv_mask, other=0.0)
        lo = 0
        if CAUSAL:
            lo = (start_n // BLOCK_M) * BLOCK_M  # Q tiles wholly above this block's first key see none of it
        for start_m in range(lo, n_q, BLOCK_M):  # INNER: every Q tile, its state carried through HBM
            offs_m = start_m + tl.arange(0, BLOCK_M)
            row = offs_m < n_q
            seen = row & (start_n > 0)  # the first K block starts the state: nothing to read back yet
            q = tl.load(q_head + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=row[:, None] & d_mask, other=0.0)
            m_i = tl.load(m_head + offs_m, mask=seen, other=float("-inf"))  # HBM -> chip, every K block
            l_i = tl.load(l_head + offs_m, mask=seen, other=0.0)
            acc_at = acc_head + offs_m[:, None] * BLOCK_D + offs_d[None, :]
            acc = tl.load(acc_at, mask=seen[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)) * qk_scale  # base-2 units, as the lesson's kernel
            keep = offs_n[None, :] < n_k
            if CAUSAL:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
            s = tl.where(keep, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
            alpha = tl.math.exp2(m_i - m_safe)
            p = tl.math.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            tl.store(m_head + offs_m, m_new, mask=row)  # chip -> HBM, every K block
            tl.store(l_head + offs_m, l_i, mask=row)
            tl.store(acc_at, acc, mask=row[:, None])
        tl.debug_barrier()  # the next K block reads back what every thread of this program wrote
    for start_m in range(0, n_q, BLOCK_M):  # the end: O = acc / l, lse, written once
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row = offs_m < n_q
        m_i = tl.load(m_head + offs_m, mask=row, other=0.0)
        l_i = tl.load(l_head + offs_m, mask=row, other=1.0)
        acc = tl.load(acc_head + offs_m[:, None] * BLOCK_D + offs_d[None, :], mask=row[:, None], other=0.0)
        o = acc / l_i[:, None]
        tl.store(o_head + offs_m[:, None] * HEAD_DIM + offs_d[None, :], o.to(o_ptr.dtype.element_ty),
                 mask=row[:, None] & d_mask)  # fmt: skip
        tl.store(lse_ptr + bh * n_q + offs_m, (m_i + tl.math.log2(l_i)) * 0.6931471805599453, mask=row)


# -- launcher ---------------------------------------------------------------------------------------
def attention_fa1(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward in the FA1 schedule: ``(O, lse)``, the same results as
    :func:`~fusionlab.kernels.attention.attention` to rounding.

    ``q`` (B, H, N_q, D), ``k``, ``v`` (B, H, N_k, D), all contiguous and of one dtype (fp16/bf16 on a
    GPU, fp32/fp16 in the interpreter), D <= 128, N_k >= 1. ``causal``: top-left, query i sees keys
    j <= i. Scale ``1 / sqrt(D)``. Allocates O, lse and the fp32 running state (B, H, N_q, D) + 2 (B, H,
    N_q): the state FA2 keeps on chip."""
    check_inputs(q, k, v, causal, None, op="attention_fa1")  # attention's checks: dtypes, devices, shapes, views
    if q.shape[1] != k.shape[1] or not all(t.is_contiguous() for t in (q, k, v)):
        raise KernelInputError("attention_fa1: q, k, v must have as many heads and be contiguous")
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    if not 1 <= d <= 128 or n_k < 1:
        raise KernelInputError(f"attention_fa1: head dim {d} (1 to 128) and N_k {n_k} (>= 1) only")
    bm, bn = _tile()
    block_d = max(16, triton.next_power_of_2(d))
    o = torch.empty_like(q)
    lse = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    acc = torch.empty((B, H, n_q, block_d), dtype=torch.float32, device=q.device)  # the running O
    m = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    l = torch.empty_like(m)  # noqa: E741  (the papers' name)
    if n_q:
        _attention_fa1_kernel[(B * H,)](
            q, k, v, o, lse, acc, m, l, n_q, n_k, LOG2E / math.sqrt(d),
            HEAD_DIM=d, BLOCK_D=block_d, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, num_warps=4, num_stages=2,
        )  # fmt: skip
    return o, lse
