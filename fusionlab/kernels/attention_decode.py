"""Lesson 9: flash-decoding — attention for one (or a few) new query tokens against a KV cache.

When a model generates, each step brings one query token per sequence, and it attends to every key
in the cache. FlashAttention's schedule (:mod:`.attention`) gives each program a tile of queries of
one head: at decode time that is one query, one program per head, and each program walks the whole
cache alone — with batch 1 and 32 heads, 32 programs on a GPU of 132 SMs, each reading N_k keys in
sequence. The cache is what must be read (every key and value once: the op is memory-bound), and a
quarter of the GPU reading it is a quarter of the bandwidth.

Flash-decoding (Dao, Haziza, Massa, Sizov, "Flash-Decoding for long-context inference", 2023) splits
the *keys* across programs. Program (split s, batch b, KV head h) runs lesson 4's online softmax over
its slice of the cache and writes a partial result: the running max ``m``, the sum ``l`` of
``exp(s - m)``, and the unnormalised ``acc = sum exp(s - m) v``. A second small kernel combines the
splits exactly as the online softmax combines blocks: ``M = max_s m_s``,
``L = sum_s l_s exp(m_s - M)``, ``O = sum_s acc_s exp(m_s - M) / L``. With enough splits every SM reads
its share of the cache; the partials are ``(D + 2)`` fp32 numbers per query row per split, small
beside the cache (:func:`attention_decode_ledger`). One split needs no combine: that program writes O.

A second launch costs the host as much as the first, and at batch 1 a launched decode call is the
host's time, not the GPU's. So by default a launched call combines in the split kernel: each program,
once its partials are stored, adds 1 to a counter of its (batch row, KV head) (an atomic, released and
acquired at the GPU's scope), and the program that finds every other split already counted combines
them and zeroes the counter for the next call (``LAST_COMBINES``; ``config={"LAST_COMBINES": False}``
launches the combine kernel instead). The merge is the combine kernel's code, row by row (one
(splits x D) tile each), so the result does not depend on which program was last. A call captured
into a CUDA graph takes the combine kernel: a graph's launches cost the host nothing, and there one
program a row combines faster than each KV head's last program doing its rows in turn (an H200,
B 1 x 4k keys: 10.0 against 12.7 us).

Grouped-query attention: the G = H_q / H_kv query heads that share a KV head are rows of one
program's Q tile, so each K and V tile is read once for all of them, and ``tl.dot`` gets G x N_q
rows (padded to 16) instead of a matrix-vector product per head. Query head h reads KV head
``h // G``, as :func:`~fusionlab.kernels.attention.attention` and ``repeat_interleave`` do.

Which keys a query sees: ``cache_len`` (an int tensor of shape (B,), optional) is the number of valid
keys of each batch row (the cache is allocated for N_k, rows fill it at different speeds); without it
every row has N_k. The N_q queries are the *last* N_q tokens of their row (already written to the
cache), so with ``causal=True`` query i sees keys ``j <= len - N_q + i`` (SDPA's bottom-right causal
alignment); with one query that is every valid key. A query that sees no key gets O = 0. On a GPU
the lengths are never read back on the host (that would sync): out-of-range values are clamped to
[0, N_k] in the kernel; the interpreter refuses them.

Numerics as the forward's: scores, ``m``, ``l``, ``acc`` in fp32; ``exp`` is ``exp2`` with
``scale * log2(e)`` folded in, so ``m`` is in base-2 units; P cast to the input dtype for ``P V``.
Reference: :func:`attention_decode_reference`; eager: :func:`attention_decode_eager` (SDPA).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.utils._python_dispatch import _disable_current_modes

from .. import _triton, runtime
from ..ledger import Ledger
from ._attention import LOG2E, check_inputs, config_key, default_scale
from ._launch import (
    KernelInputError,
    Launcher,
    Plans,
    cdiv,
    current_device,
    host_range,
    launch_kwargs,
    next_pow2,
    signature,
    sm_count,
)

OP = "attention_decode"
_CONFIG_KEYS = ("BLOCK_N", "num_warps", "num_stages", "SPLITS", "LAST_COMBINES")
#: the most queries per row a call takes: decoding (1), speculative or chunked decoding (a few)
MAX_QUERIES = 16
#: the fewest keys a split is given: below this the partials' traffic and the combine cost more than
#: the extra programs gain
MIN_SPLIT_KEYS = 128


# -- spec, eager, ledger, flops --------------------------------------------------------------------
def _visible(B: int, N_q: int, N_k: int, cache_len, causal: bool, device) -> torch.Tensor:
    """(B, N_q, N_k) bool: which keys each query of each row sees."""
    lens = torch.full((B,), N_k, device=device) if cache_len is None else cache_len.to(device, torch.int64)
    j = torch.arange(N_k, device=device)
    i = torch.arange(N_q, device=device)
    last = lens[:, None] - N_q + i[None, :] if causal else (lens - 1)[:, None].expand(B, N_q)
    return (j[None, None, :] <= last[:, :, None]) & (j[None, None, :] < lens[:, None, None])


def attention_decode_reference(q, k, v, cache_len=None, causal: bool = True, scale: float | None = None):
    """The spec: ``softmax(Q K^T scale, visible keys only) V`` in fp32 (float64 for float64 inputs), K and
    V repeated to the query heads; a query with no visible key gets 0. Returned in q's dtype."""
    wide = torch.float64 if q.dtype == torch.float64 else torch.float32
    B, H, N_q, D = q.shape
    group = H // k.shape[1]
    kw = k.to(wide).repeat_interleave(group, dim=1)
    vw = v.to(wide).repeat_interleave(group, dim=1)
    s = (q.to(wide) @ kw.transpose(-2, -1)) * default_scale(D, scale)
    vis = _visible(B, N_q, k.shape[2], cache_len, causal, q.device)[:, None]  # (B, 1, N_q, N_k)
    p = torch.softmax(s.masked_fill(~vis, float("-inf")), dim=-1)
    p = torch.where(vis.any(-1, keepdim=True), p, 0.0)  # a row with no key: 0, not softmax's NaN
    return (p @ vw).to(q.dtype)


def attention_decode_eager(q, k, v, cache_len=None, causal: bool = True, scale: float | None = None):
    """What eager PyTorch runs: ``F.scaled_dot_product_attention`` with ``enable_gqa``, and a boolean
    mask only where one is needed (lengths per row, or several causal queries)."""
    B, _, N_q, _ = q.shape
    mask = None
    if cache_len is not None or (causal and N_q > 1):
        mask = _visible(B, N_q, k.shape[2], cache_len, causal, q.device)[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


def attention_decode_flops(B: int, H: int, N_q: int, N_k: int, D: int) -> int:
    """Nominal FLOPs of the two matmuls over every key (``4 B H N_q N_k D``)."""
    return 4 * B * H * N_q * N_k * D


def attention_decode_ledger(
    B: int, H: int, H_kv: int, N_q: int, N_k: int, D: int, dtype=torch.bfloat16, *, splits: int = 1,
    last_combines: bool = False,
) -> Ledger:  # fmt: skip
    """Trips of one decode attention call, eager's math path and the kernels'.

    Eager (SDPA's math path, as :mod:`._attention`'s ``attention_eager`` counts it, with GQA's
    ``repeat_interleave`` of K and V to the query heads first): repeat, scores ``Q K^T``, softmax,
    ``P V``. Fused: the split kernel reads Q, K and V once and writes ``splits`` partials per query row
    (``acc``: D fp32 numbers, ``m`` and ``l``: one each); the combine reads them and writes O. One split
    writes O directly. ``last_combines``: the same trips in one kernel (the last split of each KV head
    combines), one fused op "split + combine"."""
    rows = B * H * N_q
    kv, kv_rep, s = B * H_kv * N_k * D, B * H * N_k * D, B * H * N_q * N_k
    led = Ledger(dtype_bytes=dtype, outputs=("o",), sizes={"partials": torch.float32})
    led.op("repeat k", reads={"k": kv}, writes={"k_rep": kv_rep})
    led.op("repeat v", reads={"v": kv}, writes={"v_rep": kv_rep})
    led.op("q @ k^T", reads={"q": rows * D, "k_rep": kv_rep}, writes={"s": s})
    led.op("softmax", reads={"s": s}, writes={"p": s})
    led.op("p @ v", reads={"p": s, "v_rep": kv_rep}, writes={"o": rows * D})
    if splits == 1:
        led.fused("decode", reads={"q": rows * D, "k": kv, "v": kv}, writes={"o": rows * D})
    else:
        part = rows * splits * (D + 2)
        if last_combines:
            led.fused("split + combine", reads={"q": rows * D, "k": kv, "v": kv, "partials": part},
                      writes={"partials": part, "o": rows * D})  # fmt: skip
        else:
            led.fused("split", reads={"q": rows * D, "k": kv, "v": kv}, writes={"partials": part})
            led.fused("combine", reads={"partials": part}, writes={"o": rows * D})
    return led


# -- configuration ----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def _config(B: int, H_kv: int, N_k: int, D: int, rows: int, gpu: bool, sms: int) -> dict:
    block_d = max(16, next_pow2(D))
    if gpu:
        # an H100's sweep (benchmarks/bench_decode.py, 2026-11-27): 128-key tiles, 3 stages, and about one
        # program per SM; more splits than that only add partials (B 16 x 4k keys: 1 split 104 us, 3 splits
        # 110), fewer leave SMs idle (B 1 x 32k: 8 to 16 splits 64 us, 2 splits 168)
        block_n, num_warps, num_stages = (128, 4, 3) if block_d <= 128 else (32, 4, 2)
        splits = max(1, min(round(sms / (B * H_kv)), cdiv(N_k, MIN_SPLIT_KEYS)))
    else:  # the interpreter: few, large programs; two splits once there is more than a tile of keys
        block_n, num_warps, num_stages = 32, 4, 1
        splits = 1 if N_k <= block_n else 2
    return dict(BLOCK_M=max(16, next_pow2(rows)), BLOCK_N=block_n, BLOCK_D=block_d, num_warps=num_warps,
                num_stages=num_stages, SPLITS=splits, LAST_COMBINES=True)  # fmt: skip


def attention_decode_config(B: int, H: int, H_kv: int, N_q: int, N_k: int, D: int) -> dict:
    """The launch configuration the launcher picks: ``{"BLOCK_M", "BLOCK_N", "BLOCK_D", "num_warps",
    "num_stages", "SPLITS", "LAST_COMBINES"}``.

    ``BLOCK_M``: the G x N_q query rows of one KV head, padded to 16 (``tl.dot``'s least). ``SPLITS``:
    on a GPU, as many key splits as make B x H_kv x SPLITS programs about one per SM, but no split under
    :data:`MIN_SPLIT_KEYS` keys (``benchmarks/bench_decode.py``'s sweep chose the rule and the tiles);
    in the interpreter one split up to a tile of keys, else two (both paths run in tests).
    Each split's keys are a whole number of ``BLOCK_N`` tiles. ``LAST_COMBINES``: with several splits, the
    last of a KV head's programs to finish combines its splits (one launch: a launched decode step is
    host-bound at small batch), else a second kernel does (False: the schedule the lesson first builds,
    and what a call captured into a CUDA graph runs)."""
    return dict(_config(int(B), int(H_kv), int(N_k), int(D), (H // H_kv) * N_q, runtime.is_gpu(), sm_count()))


# -- kernels ----------------------------------------------------------------------------------------
@triton.jit
def _decode_split_kernel(
    q_ptr, k_ptr, v_ptr, len_ptr, o_ptr, ws_ptr, count_ptr,
    n_kv_heads, n_k, split_len, n_partials, qk_scale,
    stride_qb, stride_qh, stride_qn, stride_kb, stride_kh, stride_kn, stride_vb, stride_vh, stride_vn,
    GROUP: tl.constexpr, N_Q: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HAS_LEN: tl.constexpr, CAUSAL: tl.constexpr,
    SPLIT: tl.constexpr, LAST_COMBINES: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    # grid: (splits, B * H_kv). One program: the GROUP x N_Q query rows of one KV head, one slice of keys.
    sid = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // n_kv_heads
    hk = bh % n_kv_heads
    r = tl.arange(0, BLOCK_M)
    row_ok = r < GROUP * N_Q
    h = hk * GROUP + r // N_Q  # query head of row r
    i = r % N_Q  # its query index
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_rows = q_ptr + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh + i * stride_qn
    q = tl.load(q_rows[:, None] + d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if HAS_LEN:  # this row's cache length, clamped to the cache: never a read outside it
        kv_len = tl.minimum(tl.maximum(tl.load(len_ptr + b).to(tl.int32), 0), n_k)
    else:
        kv_len = n_k
    if CAUSAL:  # the queries are the row's last N_Q tokens: query i sees keys up to len - N_Q + i
        last = kv_len - N_Q + i
    else:
        last = kv_len - 1 + 0 * i
    start = sid * split_len
    end = tl.minimum(start + split_len, kv_len)
    k_base = k_ptr + b.to(tl.int64) * stride_kb + hk.to(tl.int64) * stride_kh
    v_base = v_ptr + b.to(tl.int64) * stride_vb + hk.to(tl.int64) * stride_vh
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for j0 in range(start, end, BLOCK_N):
        offs_n = j0 + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n < end)[:, None] & d_ok[None, :]
        k = tl.load(k_base + offs_n.to(tl.int64)[:, None] * stride_kn + d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * qk_scale  # (BLOCK_M, BLOCK_N), base-2 units
        # a key past the split's end (the last tile of a row's length) or past what the query sees: -inf
        s = tl.where((offs_n < end)[None, :] & (offs_n[None, :] <= last[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
        p = tl.math.exp2(s - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + offs_n.to(tl.int64)[:, None] * stride_vn + d[None, :], mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    # row r of this program is row (b H_kv + hk) GROUP N_Q + r of O viewed as (B H_q N_q, D)
    p_row = bh.to(tl.int64) * (GROUP * N_Q) + r
    out_mask = row_ok[:, None] & d_ok[None, :]
    if SPLIT:  # partials: acc (n_partials rows of D), then m and l; row p_row's split sid
        part = p_row * tl.num_programs(0) + sid
        tl.store(ws_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=out_mask)
        tl.store(ws_ptr + n_partials * HEAD_DIM + part, m_i, mask=row_ok)
        tl.store(ws_ptr + n_partials * (HEAD_DIM + 1) + part, l_i, mask=row_ok)
        if LAST_COMBINES:
            # the last of this KV head's splits to finish combines them all (no second launch): every
            # thread's partials stored (the barrier), then one counter per (b, KV head), released and
            # acquired at the GPU's scope, tells each program how many went before it
            tl.debug_barrier()
            n_splits = tl.num_programs(0)
            done = tl.atomic_add(count_ptr + bh, 1, sem="acq_rel", scope="gpu")
            if done == n_splits - 1:
                tl.atomic_xchg(count_ptr + bh, 0, sem="relaxed", scope="gpu")  # zero for the next call
                first = bh.to(tl.int64) * (GROUP * N_Q)
                for j in range(0, GROUP * N_Q):  # this KV head's query rows, one (splits x D) tile each
                    _combine_row(ws_ptr, o_ptr, first + j, n_splits, n_partials, HEAD_DIM, BLOCK_S, BLOCK_D)
    else:
        o = tl.where(l_i[:, None] == 0, 0.0, acc / l_i[:, None])  # no key seen: 0; a NaN stays NaN
        tl.store(o_ptr + p_row[:, None] * HEAD_DIM + d[None, :], o.to(o_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _combine_row(ws_ptr, o_ptr, row, n_splits, n_partials, HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr,
                 BLOCK_D: tl.constexpr):  # fmt: skip
    # one query row's splits combined at once (lesson 4's merge), loaded as one (splits x D) tile. Loads
    # bypass L1 (.cg): in the split kernel's last program, other SMs wrote them
    s = tl.arange(0, BLOCK_S)
    s_ok = s < n_splits
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    part = row * n_splits + s
    m = tl.load(ws_ptr + n_partials * HEAD_DIM + part, mask=s_ok, other=float("-inf"), cache_modifier=".cg")
    l = tl.load(ws_ptr + n_partials * (HEAD_DIM + 1) + part, mask=s_ok, other=0.0, cache_modifier=".cg")
    acc = tl.load(ws_ptr + part[:, None] * HEAD_DIM + d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0,
                  cache_modifier=".cg")  # fmt: skip
    m_max = tl.max(m, 0)
    m_use = tl.where(m_max == float("-inf"), 0.0, m_max)  # no split saw a key
    w = tl.math.exp2(m - m_use)  # a split that saw no key: exp2(-inf) = 0
    total = tl.sum(l * w, 0)
    o = tl.sum(acc * w[:, None], 0)
    o = tl.where(total == 0, 0.0, o / tl.where(total == 0, 1.0, total))  # no key seen: 0; a NaN stays NaN
    tl.store(o_ptr + row * HEAD_DIM + d, o.to(o_ptr.dtype.element_ty), mask=d_ok)


@triton.jit
def _decode_combine_kernel(
    ws_ptr, o_ptr, n_splits, n_partials,
    HEAD_DIM: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # grid: (B H_q N_q,). One program: one query row's splits
    _combine_row(ws_ptr, o_ptr, tl.program_id(0).to(tl.int64), n_splits, n_partials, HEAD_DIM, BLOCK_S, BLOCK_D)


# -- launcher ---------------------------------------------------------------------------------------
_launch_split = Launcher(_decode_split_kernel)
_launch_combine = Launcher(_decode_combine_kernel)


class _Plan(NamedTuple):
    """Everything a call derives from shapes and options, computed once per combination (:func:`_plan`)."""

    grid: tuple  # (splits, B * H_kv)
    meta: dict  # the split kernel's constexprs and launch options
    ints: tuple  # its scalar arguments: H_kv, N_k, split_len, partials, qk_scale
    c_grid: tuple  # the combine's grid, (B H_q N_q,)
    c_meta: dict | None  # None: no combine kernel (one split, or the last split combines)
    ws_numel: int  # fp32 workspace elements (0: one split, no workspace)
    counts: bool  # the last split combines: the launch takes the per-(b, KV head) counters


@functools.lru_cache(maxsize=1024)
def _plan(q_shape, k_shape, has_len: bool, causal: bool, scale, key: tuple, device: int) -> _Plan:
    B, H, N_q, D = q_shape
    H_kv, N_k = k_shape[1], k_shape[2]
    group = H // H_kv
    cfg = {**_config(B, H_kv, N_k, D, group * N_q, runtime.is_gpu(), sm_count()), **dict(key)}
    bn = cfg["BLOCK_N"]
    split_len = cdiv(cdiv(max(N_k, 1), cfg["SPLITS"]), bn) * bn  # a whole number of key tiles
    splits = cdiv(max(N_k, 1), split_len)
    rows = B * H * N_q
    # the workspace: acc of every (row, split) partial (D fp32 each), then their m, then their l
    n_partials = rows * splits
    last = cfg["LAST_COMBINES"] and splits > 1
    block_s = max(2, next_pow2(splits))
    meta = dict(GROUP=group, N_Q=N_q, HEAD_DIM=D, BLOCK_M=max(16, next_pow2(group * N_q)), BLOCK_N=bn,
                BLOCK_D=cfg["BLOCK_D"], HAS_LEN=has_len, CAUSAL=causal, SPLIT=splits > 1, LAST_COMBINES=last,
                BLOCK_S=block_s if last else 2, **launch_kwargs(cfg["num_warps"], cfg["num_stages"]))  # fmt: skip
    combine = None if last or splits == 1 else dict(HEAD_DIM=D, BLOCK_S=block_s, BLOCK_D=cfg["BLOCK_D"],
                                                     **launch_kwargs(4))  # fmt: skip
    ints = (H_kv, N_k, split_len, n_partials, default_scale(D, scale) * LOG2E)
    return _Plan((splits, B * H_kv), meta, ints, (rows,), combine, n_partials * (D + 2) if splits > 1 else 0, last)


#: per (device, stream): the fp32 workspace of the splits' partials and one int32 counter per (batch row,
#: KV head) for LAST_COMBINES (zero between calls: the last program of each puts it back), kept from call to
#: call and grown as needed. A stream's calls run in order, so they can share them (a decode step at batch
#: 1 is the host's time, and an allocation is a tenth of it); two streams could run at once, so each has
#: its own. Made and used by launched calls only: a call captured into a CUDA graph takes the combine
#: kernel and a workspace from the graph's pool.
_SCRATCH: dict = {}

_is_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or torch.cuda.is_current_stream_capturing


def _scratch(device: int, like: torch.Tensor, n_ws: int, n_counts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(workspace, counters)`` of the current stream, made (counters zeroed) or grown on first need."""
    stream = _triton.current_stream(device) if device >= 0 else 0
    got = _SCRATCH.get((device, stream))
    if got is None or got[0].numel() < n_ws or got[1].numel() < n_counts:
        # state kept across calls, made once per stream (as a launcher's compiled kernels are): out of sight
        # of a dispatch mode watching this call (fusionlab.instrument counts what each call does)
        old_ws, old_counts = got if got is not None else (None, None)
        with _disable_current_modes():
            ws = old_ws if old_ws is not None and old_ws.numel() >= n_ws else torch.empty(
                max(n_ws, 4096), dtype=torch.float32, device=like.device)  # fmt: skip
            counts = old_counts if old_counts is not None and old_counts.numel() >= n_counts else torch.zeros(
                max(n_counts, 256), dtype=torch.int32, device=like.device)  # fmt: skip
        got = _SCRATCH[(device, stream)] = (ws, counts)
    return got


def _check_len(cache_len, B: int, N_k: int, device) -> bool:
    """The lengths' checks; True when their values are read on the host (:func:`_check_len_values`), as a
    kept plan then reads them on every call."""
    if cache_len is None:
        return False
    if not isinstance(cache_len, torch.Tensor) or cache_len.dtype not in (torch.int32, torch.int64):
        raise KernelInputError(
            f"{OP}: cache_len must be None or an int32/int64 tensor of shape (B,), got {cache_len!r}."
        )
    if cache_len.shape != (B,) or cache_len.device != device or not cache_len.is_contiguous():
        raise KernelInputError(
            f"{OP}: cache_len must be a contiguous tensor of shape (B,) = ({B},) on {device}, got shape "
            f"{tuple(cache_len.shape)} on {cache_len.device}."
        )
    reads = not cache_len.is_cuda and B > 0  # free in the interpreter; a GPU would sync (the kernel clamps)
    if reads:
        _check_len_values(cache_len, N_k)
    return reads


def _check_len_values(cache_len: torch.Tensor, N_k: int) -> None:
    lo, hi = host_range(cache_len)
    if lo < 0 or hi > N_k:
        raise KernelInputError(f"{OP}: cache_len holds {lo}..{hi}; each row's length must be in [0, N_k={N_k}].")


def attention_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache_len: torch.Tensor | None = None,
    causal: bool = True,
    scale: float | None = None,
    *,
    config: dict | None = None,
) -> torch.Tensor:
    """Attention of a few new queries against a KV cache, keys split across programs (flash-decoding).

    ``q``: (B, H_q, N_q, D) with N_q up to :data:`MAX_QUERIES`; ``k``, ``v``: the cache, (B, H_kv, N_k, D),
    H_q a multiple of H_kv (GQA); any strides with the last dimension contiguous (a (B, N_k, H_kv, D)
    cache transposed is read in place). fp16/bf16 on a GPU, fp32/fp16 in the interpreter. ``cache_len``:
    None (every row has N_k keys) or an int32/int64 tensor (B,) of each row's valid keys. ``causal``: the
    queries are each row's last N_q tokens (bottom-right). ``config``: overrides for a sweep
    (``BLOCK_N``, ``num_warps``, ``num_stages``, ``SPLITS``). Returns O (B, H_q, N_q, D), contiguous, in
    q's dtype. Forward only (decoding needs no gradient). Reference: :func:`attention_decode_reference`.
    """
    key = device = None
    if config is None and type(causal) is bool and (scale is None or type(scale) is float):
        sig = signature(q, k, v, cache_len)
        if sig is not None:
            key, device = (sig, causal, scale), sig[1]
            kept = _PLANS.get(key)
            if kept is not None:  # a call of this signature passed every check but that of the lengths' values
                return _decode(kept, q, k, v, cache_len, device)
    check_inputs(q, k, v, causal, scale, op=OP)
    B, N_q, N_k = q.shape[0], q.shape[2], k.shape[2]
    if N_q > MAX_QUERIES:
        raise KernelInputError(
            f"{OP}: {N_q} queries per row; decoding takes at most {MAX_QUERIES} (use attention() for a prefill)."
        )
    reads = _check_len(cache_len, B, N_k, q.device)
    if B * k.shape[1] > 65535:
        raise KernelInputError(f"{OP}: B x H_kv = {B * k.shape[1]}; the grid holds at most 65535. Split the batch.")
    plan_key = () if config is None else config_key(config, OP, _CONFIG_KEYS, flags=("LAST_COMBINES",),
                                                     choices={"SPLITS": range(1, 1025)})  # fmt: skip
    kept = _decode_plan(q, k, v, cache_len, causal, scale, plan_key, reads)
    if key is not None:
        _PLANS.put(key, kept)
    return _decode(kept, q, k, v, cache_len, device)


class _Kept(NamedTuple):
    """What a checked call launches with again for a call of the same signature (:data:`_PLANS`)."""

    q_shape: tuple  # O's shape, a plain tuple (O takes q's layout where q is contiguous)
    like_q: bool  # q contiguous: O is empty_like(q)
    empty: int  # 0: a launch; 1: O has no element; 2: no key (O is zeros)
    n_k: int  # the lengths' values are checked against it when they are read on the host
    reads: bool  # they are (lengths in host memory, B > 0)
    plan: _Plan | None
    plan_key: tuple  # the configuration's overrides (a captured call works its own plan out from them)
    ints: tuple  # the split kernel's strides
    keys: tuple  # the split's and the combine's interned launcher keys
    args: tuple  # q's dtype and device; has_len, causal and scale (a captured call's plan)


def _launch_key(q, k, v, cache_len, causal, plan_key) -> tuple:
    """Everything Triton specialises the two launches on (each launcher keeps its own table), cheaper than
    working it out from 24 arguments: the plan's inputs (shapes, options: the ints and constexprs), the
    strides, the dtypes and the inputs' 16-byte alignment (o, the workspace and the counters come from the
    caching allocator: aligned; without lengths, o stands for them)."""
    lens = (q.dtype, 0) if cache_len is None else (cache_len.dtype, cache_len.data_ptr() & 15)
    return (q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.dtype, causal, plan_key, q.data_ptr() & 15,
            k.data_ptr() & 15, v.data_ptr() & 15, *lens)  # fmt: skip


def _decode_plan(q, k, v, cache_len, causal, scale, plan_key, reads) -> _Kept:
    """:class:`_Kept` of a checked call: everything but the lengths' values, the workspace (the current
    stream's) and whether the stream is being captured follows from the call's signature and options."""
    q_shape, k_shape = tuple(q.shape), tuple(k.shape)
    has_len = cache_len is not None
    empty = 1 if q.numel() == 0 else 2 if k_shape[2] == 0 else 0
    args = (q.dtype, q.device, has_len, causal, scale)
    if empty:
        return _Kept(q_shape, q.is_contiguous(), empty, k_shape[2], reads, None, plan_key, (), (), args)
    device = current_device() if q.is_cuda else -1
    plan = _plan(q_shape, k_shape, has_len, causal, scale, plan_key, device)
    key = _launch_key(q, k, v, cache_len, causal, plan_key)
    keys = (_launch_split.intern(key), _launch_combine.intern(key))
    ints = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3])
    return _Kept(q_shape, q.is_contiguous(), 0, k_shape[2], reads, plan, plan_key, ints, keys, args)


def _decode(kept: _Kept, q, k, v, cache_len, device) -> torch.Tensor:
    """The call's launches from its plan (:func:`_decode_plan`'s): the lengths' values checked where they are
    read on the host (on every call: a kept signature does not settle them), O made, the current stream's
    workspace taken, the split kernel (and the combine kernel) launched. ``device``: the current CUDA device
    when the caller knows it."""
    if kept.reads:
        _check_len_values(cache_len, kept.n_k)
    # O as q's (contiguous) layout: empty_like parses no dtype or device (half the host time of torch.empty)
    dtype, dev, has_len, causal, scale = kept.args
    o = torch.empty_like(q) if kept.like_q else torch.empty(kept.q_shape, dtype=dtype, device=dev)
    if kept.empty:
        return o if kept.empty == 1 else o.zero_()
    plan, keys, launch_device = kept.plan, kept.keys, device
    if device is None:
        device = current_device() if o.is_cuda else -1
    if not plan.ws_numel:  # one split: no partials, no counters (unused pointers)
        ws = counts = o
    elif plan.counts and not (device >= 0 and _is_capturing()):
        ws, counts = _scratch(device, q, plan.ws_numel, plan.grid[1])
    else:  # the combine kernel, with a workspace of its own (in a graph, from its pool, kept in capture order)
        if plan.counts:  # captured into a CUDA graph: launches cost nothing there, the parallel combine wins
            plan_key = tuple(sorted({**dict(kept.plan_key), "LAST_COMBINES": False}.items()))
            plan = _plan(kept.q_shape, tuple(k.shape), has_len, causal, scale, plan_key, device)
            key = _launch_key(q, k, v, cache_len, causal, plan_key)
            keys = (_launch_split.intern(key), _launch_combine.intern(key))
        ws = counts = torch.empty(plan.ws_numel, dtype=torch.float32, device=dev)
    lens = cache_len if has_len else o
    _launch_split.launch(plan.grid, (q, k, v, lens, o, ws, counts, *plan.ints, *kept.ints), plan.meta, keys[0],
                         launch_device)  # fmt: skip
    if plan.c_meta is not None:
        _launch_combine.launch(plan.c_grid, (ws, o, plan.grid[0], plan.ints[3]), plan.c_meta, keys[1], launch_device)
    return o


#: attention_decode's plans by call signature and options (a decode step attends with the same signature at
#: every token; benchmarks/notes_lesson9.md, 2026-11-27, swiglu's and attention_decode's plans by signature)
_PLANS = Plans()


__all__ = ["attention_decode", "attention_decode_reference", "attention_decode_eager", "attention_decode_ledger",
           "attention_decode_flops", "attention_decode_config"]  # fmt: skip
