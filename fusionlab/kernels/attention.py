"""Lesson 7: FlashAttention forward — attention without the N x N matrices in HBM.

``O = softmax(Q K^T * scale + mask) V`` per (batch, head), and the per-row log-sum-exp
``lse_i = log sum_j exp(s_ij)`` of the scaled, masked scores ``s`` (natural log, fp32: what a
backward pass needs to recompute P = exp(s - lse) without a second softmax).

Eager attention (nanoGPT's manual path, :func:`attention_eager`) writes the scores ``S = Q K^T`` to HBM,
reads them back to scale (and mask) them, again to softmax them into ``P``, and once more for
``P V``: four to five trips of an ``N_q x N_k`` matrix per head, and ``O(N^2)`` memory — 8 GiB of bf16
scores at N = 16384 for 16 heads. The fused kernel (Dao et al. 2022, FlashAttention; the schedule of
FlashAttention-2) keeps one ``BLOCK_M x D`` tile of Q on chip for the whole program, streams K and V
through in ``BLOCK_N``-key tiles, and runs the *online softmax* of lesson 4 on the scores of each
tile in registers: a running row max ``m``, a running sum ``l`` of ``exp(s - m)``, and an fp32
accumulator ``acc`` of ``exp(s - m) V``, both rescaled by ``exp(m_old - m_new)`` whenever a tile
raises the max. One division ``acc / l`` at the end; O and lse are written once. The scores never
reach HBM.

Trips (:func:`attention_ledger`): Q read once, O and lse written once, and K and V read once per
*Q tile* — ``ceil(N_q / BLOCK_M)`` times (half as many keys on average when causal). With on-chip
memory of M elements and ``BLOCK_M ~ M / d``, K/V traffic is ``Theta(N^2 d^2 / M)`` against eager's
``Theta(N^2 + N d)`` per head for S and P; on a GPU ``d^2 / M`` is well below 1 (d = 128, M ~ 10^5
per SM), and the L2 cache serves most K/V re-reads of programs that run together. The FLOPs are
the same as eager's (``4 N_q N_k d`` per head, :func:`attention_flops`): FlashAttention is faster
because it moves fewer bytes, not because it computes less. Peak extra memory is O and lse:
``O(N d)`` instead of ``O(N^2)``.

Numerics: the scores, ``m``, ``l`` and ``acc`` are fp32; ``P`` is cast to the input dtype before the
``P V`` product (the tensor cores take fp16/bf16 operands; P lies in [0, 1], so the rounding is
relative, ~0.4% in bf16). ``exp`` is ``exp2`` with ``scale * log2(e)`` folded into one multiply-add
per score; ``m`` is kept in those base-2 units and converted at the end:
``lse = ln(2) * (m + log2(l))``.

On Hopper the default drops the running max altogether (``REF_MAX``, lesson 5's cross-entropy trick):
softmax is exact against *any* reference, so block 0's row max is taken once and every block sums
``exp(s - m_ref)`` against it, with no per-block max, no ``alpha`` and no rescale of ``acc``
(:func:`_attention_inner_ref`). A score far above block 0's overflows: fp16's P past 65504 (a score
16 base-2 units, 11 nats, above block 0's best), fp32's past 2**128. The tile checks at the end
(``l > 0``, ``sum |acc| + l`` finite, NaN failing both) and reruns from scratch through the online
loop if any row fails: always correct, twice the work for such a tile. The interpreter and
pre-Hopper GPUs run the online loop. Non-finite inputs: a NaN or inf in Q or K gives what the float64
reference gives (masked scores become -inf whatever they held); a NaN or inf in V reaches the rows of
the tiles that load its key (``0 * inf`` is NaN), where the dense reference spreads it to every row.

Masks. ``causal=True`` follows ``F.scaled_dot_product_attention(is_causal=True)``: the mask is
**top-left aligned**, query i sees keys j <= i (also when N_q != N_k; then query rows i >= N_k see
every key). So no row is ever empty unless N_k = 0; then O is 0 and lse is -inf, as SDPA's math
path gives (a softmax over nothing, times nothing). A Q tile's key range splits in two loops:
blocks wholly below the diagonal run with no mask at all; only the blocks on the diagonal (and the
last, partial block when N_k is not a multiple of ``BLOCK_N``) are masked, to ``-inf``; blocks
above the diagonal are never loaded. The grid runs each head's Q tiles from last to first, so the
longest causal tiles start first and the short ones fill the tail.

Two ways to load the tiles, one kernel (``TMA`` constexpr):

- plain pointers with masks: any strides (last dimension contiguous), any head dim; the
  interpreter's path and the fallback on GPUs before Hopper;
- Hopper tensor descriptors (TMA: the copy engine moves whole tiles into shared memory, and the
  loop is software-pipelined ``num_stages`` deep): each of Q, K, V is seen as a 2-D (rows, columns)
  matrix in which every head's tokens are whole rows, so contiguous (B, H, N, D) tensors and (B, N, H, D) layouts
  transposed to (B, H, N, D) both qualify (:func:`_row_layout`). A tile that hangs past a head's
  last token reads the next head's rows: those keys are masked to ``-inf`` and their V rows zeroed
  (an inf there would otherwise make ``0 * inf = NaN``), and those query rows are never stored.
  Head dims that are not a power of two are padded to one by the descriptor's zero fill.

Measured against SDPA's flash and cuDNN backends: lesson 7's recording (``fusionlab/recorded/``)
and ``benchmarks/notes_attention.md``.

Reference: Dao et al., "FlashAttention" (NeurIPS 2022) and "FlashAttention-2" (2023); Milakov &
Gimelshein, "Online normalizer calculation for softmax" (2018); Triton's tutorial 06 (fused
attention, triton 3.6), whose Hopper recipe (descriptors, two-stage causal loop, ``exp2``) this
follows.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .. import runtime
from .._exercise import answer_key
from ..ledger import Ledger
from ._launch import (
    KernelInputError,
    cdiv,
    check_block,
    check_tensor,
    dtype_name,
    element_size,
    launch_kwargs,
    next_pow2,
)

try:  # host-side TMA descriptors: triton >= 3.4 (the GPU machine and Colab have 3.6)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: the pointer path only
    TensorDescriptor = None

OP = "attention"
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
#: head dims the kernel takes (padded to a power of two on chip)
MAX_HEAD_DIM = 256
#: the grid's y and z axes (heads, batch) are limited to 65535 programs by CUDA
MAX_GRID_YZ = 65535
VARIANTS = (None, "auto", "plain", "tma")


def _default_scale(d: int, scale) -> float:
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


@functools.lru_cache(maxsize=64)
def _causal_keep(n_q: int, n_k: int, device: torch.device) -> torch.Tensor:
    """The top-left causal mask as a boolean (N_q, N_k) buffer: True where query i sees key j <= i.
    Built once per size and device, as nanoGPT keeps its ``bias`` buffer."""
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril()


# -- the spec -------------------------------------------------------------------------------------
@answer_key
def attention_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The spec, in float64: ``O = softmax(Q K^T * scale + mask) V`` and ``lse = logsumexp(...)``.

    ``q`` (B, H_q, N_q, D); ``k``, ``v`` (B, H_kv, N_k, D), H_q a multiple of H_kv (query head h reads
    key/value head ``h // (H_q // H_kv)``). ``causal``: top-left aligned, query i sees keys j <= i
    (``F.scaled_dot_product_attention(is_causal=True)``). ``scale`` defaults to ``1 / sqrt(D)``.
    Returns O in q's dtype and lse (B, H_q, N_q) in fp32, natural log. N_k = 0 gives O = 0 and
    lse = -inf.
    """
    scale = _default_scale(q.shape[-1], scale)
    group = q.shape[1] // k.shape[1]
    kd = k.double().repeat_interleave(group, dim=1)  # (B, H_q, N_k, D)
    vd = v.double().repeat_interleave(group, dim=1)
    s = (q.double() @ kd.transpose(-2, -1)) * scale  # (B, H_q, N_q, N_k)
    if causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # -inf for an empty row (N_k = 0)
    if s.shape[-1] == 0:
        o = torch.zeros(q.shape[:-1] + (v.shape[-1],), dtype=torch.float64, device=q.device)
    else:
        o = torch.softmax(s, dim=-1) @ vd
    return o.to(q.dtype), lse.float()


def attention_eager(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """What eager PyTorch runs for attention written by hand (nanoGPT's manual path): O only.

    ``S = Q K^T`` (written to HBM), ``S * scale`` (read, written), the causal ``masked_fill``
    (read, written; the mask is a cached boolean buffer), ``softmax`` (read, written as P, in the
    input dtype), ``P V`` (read). Grouped-query attention first repeats K and V per query head.
    Peak memory: two ``N_q x N_k`` matrices per head. :func:`attention_ledger` counts its trips.
    """
    scale = _default_scale(q.shape[-1], scale)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-2, -1)) * scale  # (B, H, N_q, N_k)
    if causal:
        s = s.masked_fill(~_causal_keep(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    p = F.softmax(s, dim=-1)
    return p @ v  # (B, H, N_q, D)


def _visible_pairs(n_q: int, n_k: int, causal: bool) -> int:
    """(query, key) pairs the causal mask keeps: sum over rows i of min(i + 1, N_k)."""
    if not causal:
        return n_q * n_k
    n = min(n_q, n_k)
    return n * (n + 1) // 2 + max(0, n_q - n_k) * n_k


def attention_flops(B: int, H: int, N_q: int, N_k: int, D: int, causal: bool = False) -> int:
    """``4 N_q N_k D`` per (batch, head): ``Q K^T`` and ``P V``, a multiply and an add each.

    Causal with N_q = N_k counts half (``2 N^2 D``), the convention of the FlashAttention papers and
    of every benchmark this course compares with; causal with N_q != N_k counts the (query, key)
    pairs the top-left mask keeps. The softmax's exponentials are not counted (they run on the
    special-function units, not the tensor cores).
    """
    if causal and N_q == N_k:
        pairs = N_q * N_k // 2
    else:
        pairs = _visible_pairs(N_q, N_k, causal)
    return 4 * B * H * pairs * D


def _keys_per_row(n_q: int, n_k: int, causal: bool, block_m: int) -> int:
    """Keys a program row of Q tiles reads, summed over its ceil(N_q / BLOCK_M) tiles."""
    tiles = -(-n_q // block_m)
    if not causal:
        return tiles * n_k
    return sum(min((i + 1) * block_m, n_k) for i in range(tiles))


@answer_key
def attention_ledger(
    B: int,
    H: int,
    N_q: int,
    N_k: int,
    D: int,
    dtype=torch.bfloat16,
    causal: bool = False,
    block_m: int | None = None,
    *,
    h_kv: int | None = None,
) -> Ledger:
    """Attention's trips through HBM: eager op by op, and the fused kernel's schedule.

    Eager (:func:`attention_eager`), per (batch, head): ``Q K^T`` reads Q and K, writes S
    (``N_q x N_k``); the scale reads S and writes it; causal ``masked_fill`` reads S and the boolean
    mask (1 byte per entry, shared by all heads) and writes S; softmax reads S and writes P; ``P V``
    reads P and V and writes O. Grouped-query attention (``h_kv < H``) first repeats K and V.

    Fused (the kernel): Q read once; O written once and lse (fp32) once; K and V read once per Q
    tile, ``ceil(N_q / block_m)`` times per query head (causal: only the keys up to each tile's last
    row). ``block_m=None`` is the ideal, each K/V element read once (the Q tile as long as the
    sequence). With ``block_m ~ M / D`` for on-chip memory M, K/V traffic is ``Theta(N^2 D^2 / M)``
    while eager's S and P traffic is ``Theta(N^2)`` per head; the L2 cache serves most re-reads of
    programs that run side by side, so HBM sees between the ideal and this count.
    """
    h_kv = H if h_kv is None else h_kv
    if h_kv < 1 or H % h_kv:
        raise ValueError(f"H={H} must be a multiple of h_kv={h_kv}")
    q_n = B * H * N_q * D
    kv_n = B * h_kv * N_k * D
    s_n = B * H * N_q * N_k
    led = Ledger(dtype_bytes=dtype, outputs=("O", "lse"), sizes={"lse": 4, "mask": 1})
    k_name, v_name = "K", "V"
    if h_kv != H:
        led.op("repeat_kv", reads={"K": kv_n, "V": kv_n}, writes={"K_rep": B * H * N_k * D, "V_rep": B * H * N_k * D})
        k_name, v_name = "K_rep", "V_rep"
    led.op("QK^T", reads={"Q": q_n, k_name: B * H * N_k * D}, writes={"S": s_n})
    led.op("scale", reads={"S": s_n}, writes={"S_scaled": s_n})
    src = "S_scaled"
    if causal:
        led.op("mask", reads={src: s_n, "mask": N_q * N_k}, writes={"S_masked": s_n})
        src = "S_masked"
    led.op("softmax", reads={src: s_n}, writes={"P": s_n})
    led.op("PV", reads={"P": s_n, v_name: B * H * N_k * D}, writes={"O": q_n})

    if block_m is None:
        kv_reads = kv_n
    else:
        kv_reads = B * H * _keys_per_row(N_q, N_k, causal, block_m) * D
    led.fused("load Q tiles", reads={"Q": q_n})
    led.fused("stream K, V", reads={"K": kv_reads, "V": kv_reads})
    led.fused("write O, lse", writes={"O": q_n, "lse": B * H * N_q})
    return led


def attention_bytes(
    B: int, H: int, N_q: int, N_k: int, D: int, dtype=torch.bfloat16, *, h_kv: int | None = None
) -> int:
    """The fewest bytes any attention forward moves: Q, K, V read once, O and lse written once."""
    h_kv = H if h_kv is None else h_kv
    es = element_size(dtype)
    return (2 * B * H * N_q * D + 2 * B * h_kv * N_k * D) * es + 4 * B * H * N_q


# -- configuration --------------------------------------------------------------------------------
@functools.cache
def _hopper() -> bool:
    return runtime.is_gpu() and torch.cuda.get_device_capability() >= (9, 0)


#: the Hopper (TMA) path's tiles, (BLOCK_M, BLOCK_N, num_warps, num_stages, TMA_STORE, REF_MAX), by
#: (head-dim class, causal, long sequence: N_q > LONG): benchmarks/notes_attention.md has the H100 and
#: H200 sweeps behind each row. Short sequences take 64-row tiles: a program streams few key blocks, and more, smaller
#: programs per SM hide each one's prologue (the Q load, the pipeline's fill) and epilogue behind the
#: others' loops. TMA_STORE: O leaves through a descriptor (one bulk copy per tile, where BLOCK_M
#: divides N_q), which measured faster at head dim 128 and for long non-causal runs at 64. REF_MAX
#: (sweeps 5 and 6): every block against block 0's row max, no running max and no rescale of the
#: accumulator; 1 sums P as a tile, 2 a row sum per block (long non-causal rows). +3-25% at head dims
#: 64 and 128 on an H100, once block 0 was peeled inside the loop (before, its own tiles cost 32 KiB of
#: shared memory and head dim 128 dropped to one program per SM); with it, causal head dim 128 moved to
#: 64-row tiles (the 128 x 64 tile spills registers there). Head dim 256: not measured, off.
TMA_TABLE = {
    (64, False, False): (64, 64, 4, 3, False, 1),
    (64, False, True): (128, 64, 4, 3, True, 2),
    (64, True, False): (64, 64, 4, 3, False, 1),
    (64, True, True): (128, 64, 4, 3, True, 2),
    (128, False, False): (64, 64, 4, 3, True, 1),
    (128, False, True): (128, 64, 4, 2, True, 2),
    (128, True, False): (64, 32, 4, 3, True, 1),
    (128, True, True): (64, 64, 4, 3, True, 1),
    (256, False, False): (64, 64, 4, 2, False, 0),
    (256, False, True): (64, 64, 4, 2, False, 0),
    (256, True, False): (64, 64, 4, 2, False, 0),
    (256, True, True): (64, 64, 4, 2, False, 0),
}
#: "long" starts past this many queries
LONG = 2048
#: below this many FLOPs a call takes the pointer path even on Hopper. The descriptors cost the host
#: 30-40 µs a call (three built in Python, then encoded by the driver) on top of 50-90 µs for the rest
#: of the call, and below ~30 GFLOP the kernel is shorter than that host work, so the call is host-bound
#: either way: back to back on an H100, 53-93 µs a call on the pointer path against 82-135 µs with
#: descriptors (``benchmarks/small_attention.py``, two machines). Lesson 7's shapes start at 34 GFLOP
TMA_MIN_FLOPS = 32e9


def _tma_by_default(B: int, H: int, N_q: int, N_k: int, D: int, causal: bool) -> bool:
    """Whether a call takes the descriptors when no variant is asked for: on a Hopper GPU, with at
    least :data:`TMA_MIN_FLOPS` of work (the layout and the dtype are the caller's to check)."""
    return _hopper() and attention_flops(B, H, N_q, N_k, D, causal) >= TMA_MIN_FLOPS


#: the pointer path on a GPU (pre-Hopper, or a layout the descriptors cannot take); REF_MAX off: not
#: measured on that path
PLAIN_TABLE = {
    64: (128, 64, 4, 3),
    128: (128, 64, 8, 3),
    256: (64, 32, 8, 2),
}
#: the interpreter: every program is Python, so few of them; 32 x 16 tiles still give a causal tile
#: two diagonal blocks, so small tests reach every code path
INTERPRETER_TILE = (32, 16)


def _d_class(block_d: int) -> int:
    return 64 if block_d <= 64 else (128 if block_d <= 128 else 256)


@functools.lru_cache(maxsize=4096)
def _config(n_q: int, n_k: int, d: int, causal: bool, tma: bool, gpu: bool) -> dict:
    block_d = max(16, next_pow2(d))
    store, ref = False, 0
    if not gpu:
        bm, bn = INTERPRETER_TILE
        nw, ns = 4, 1
    elif tma:
        bm, bn, nw, ns, store, ref = TMA_TABLE[(_d_class(block_d), causal, n_q > LONG)]
    else:
        bm, bn, nw, ns = PLAIN_TABLE[_d_class(block_d)]
    # short sequences: no tile longer than the sequence (tl.dot needs 16)
    bm = min(bm, max(16, next_pow2(n_q)))
    bn = min(bn, max(16, next_pow2(n_k)))
    if causal and bn > bm:
        bn = bm  # the causal split needs BLOCK_M to be a multiple of BLOCK_N
    return {
        "variant": "tma" if tma else "plain",
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_D": block_d,
        "num_warps": nw,
        "num_stages": ns,
        "TMA_STORE": tma and store,
        "REF_MAX": ref,
    }


def attention_config(
    B: int, H: int, N_q: int, N_k: int, D: int, dtype=torch.bfloat16, causal: bool = False, *, tma: bool | None = None
) -> dict:
    """The launch configuration the launcher picks: ``{"variant", "BLOCK_M", "BLOCK_N", "BLOCK_D",
    "num_warps", "num_stages", "TMA_STORE", "REF_MAX"}``.

    ``BLOCK_D`` is the head dim rounded up to a power of two (at least 16). On a Hopper GPU with
    fp16/bf16 inputs in a descriptor-friendly layout (``tma=None`` assumes one) and at least
    :data:`TMA_MIN_FLOPS` of work, the TMA path with the tile of ``TMA_TABLE``; elsewhere on a GPU the
    pointer path (``PLAIN_TABLE``); in the interpreter
    32 x 16 tiles. Tiles shrink to short sequences. B and H do not change the tile (the grid grows).
    ``REF_MAX`` (0, 1 or 2) comes from ``TMA_TABLE`` on the TMA path and is 0 elsewhere: the interpreter
    runs the online loop the lesson teaches.
    """
    if tma is None:
        tma = (
            TensorDescriptor is not None
            and dtype in (torch.float16, torch.bfloat16)
            and D % 8 == 0
            and _tma_by_default(B, H, N_q, N_k, D, causal)
        )
    return dict(_config(int(N_q), int(N_k), int(D), bool(causal), bool(tma), runtime.is_gpu()))


_CONFIG_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "TMA_STORE", "REF_MAX")


def _check_config(config: dict, causal: bool) -> dict:
    unknown = set(config) - set(_CONFIG_KEYS)
    if unknown:
        raise KernelInputError(f"{OP}: unknown config key(s) {sorted(unknown)}; known: {', '.join(_CONFIG_KEYS)}.")
    for name in ("BLOCK_M", "BLOCK_N"):
        if name in config:
            check_block(config[name], name, OP, max_value=256)
            if config[name] < 16:
                raise KernelInputError(f"{OP}: {name}={config[name]}; tl.dot needs tiles of at least 16.")
    if "num_warps" in config:
        check_block(config["num_warps"], "num_warps", OP, max_value=16)
    if "REF_MAX" in config and config["REF_MAX"] not in (0, 1, 2):  # False and True count as 0 and 1
        raise KernelInputError(
            f"{OP}: REF_MAX={config['REF_MAX']!r}; 0 (the online loop), 1 (P summed as a tile) or 2 (row sums)."
        )
    return dict(config)


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
        # every row sees key 0, so m is finite from the first block on: no -inf - -inf
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
    """Key blocks ``[lo, hi)`` of one Q tile: the online-softmax update, block by block.

    ``MASKED``: the diagonal and the partial last block (the key bound, and the causal mask when
    ``CAUSAL``); otherwise no mask at all. Plain path: ``k_src``/``v_src`` point at the head's first
    token (``k_row``/``k_col`` unused); TMA path: they are descriptors and the tile starts at row
    ``k_row + start_n``, column ``k_col``. ``EVEN_N``: BLOCK_N divides N_k, so no block hangs past the
    last key and the masked blocks need only the causal mask.
    """
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        k = _kv_tile(k_src, k_row, k_col, start_n, offs_n, stride_kn, offs_d, n_k, HEAD_DIM, MASKED, EVEN_N, TMA, False)
        qk = tl.dot(q, tl.trans(k))  # (BLOCK_M, BLOCK_N) fp32, unscaled
        qk, m_ij = _block_max(qk, m_i, offs_m, offs_n, n_k, qk_scale, MASKED, CAUSAL, SCALE_NEG, EVEN_N)
        p = _block_p(qk, m_ij, qk_scale, MASKED)
        alpha = tl.math.exp2(m_i - m_ij)  # rescales what was summed against the old max (0 at first)
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
    taken when the loop that holds block 0 reaches it (``m_ref`` is -inf until then). After that,
    ``p = exp2(s - m_ref)`` with no running max, no rescale of ``acc`` and no per-block row max;
    ``l_t`` adds the P tiles elementwise (the kernel reduces it once) or, ``ROW_SUM``, their row sums.
    Exact for any finite reference as long as nothing overflows; the kernel checks that at the end
    and falls back to the online loop if not. Block 0 is peeled inside the loop, not before it: tiles
    loaded outside the loop get shared-memory buffers of their own (32 KiB at head dim 128, enough to
    drop a 64 x 64 tile from two programs per SM to one)."""
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


@triton.jit
def _attention_kernel(
    q_src, k_src, v_src, o_ptr, o_desc, lse_ptr, kv_group, n_q, n_k, qk_scale, q_rb, q_rh, q_cb, q_ch, stride_qm,
    k_rb, k_rh, k_cb, k_ch, stride_kn, v_rb, v_rh, v_cb, v_ch, stride_vn, stride_ob, stride_oh, stride_om,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, SCALE_NEG: tl.constexpr, TMA: tl.constexpr, EVEN_N: tl.constexpr, TMA_STORE: tl.constexpr,
    REF_MAX: tl.constexpr = 0,
):  # fmt: skip
    # q: (B, H, N_q, D), k/v: (B, H_kv, N_k, D), o: (B, H, N_q, D), lse: (B, H, N_q) fp32.
    # Each of q, k, v is addressed as rows of a 2-D matrix: head (b, h) starts at row
    # b * rb + h * rh, column b * cb + h * ch, and its tokens are consecutive rows (stride_*m/n
    # elements apart). Grid: (Q tiles, H, B); axis 0 counts Q tiles from the last, so a causal
    # head's longest tiles start first and its shortest fill the tail.
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
        k_base = k_src
        v_base = v_src
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
    if REF_MAX:
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

    # one division per row, at the end; lse back from base-2 units to natural log
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453
    # a score of +inf (an inf in Q or K) makes the max +inf and p = exp2(inf - inf) NaN, so l is NaN; the
    # log-sum-exp is +inf all the same (float64's answer; O is NaN in both). One select a row. (A row
    # whose every score is -inf keeps NaN where float64 says -inf: l is NaN there too, and a NaN score,
    # whose answer is NaN, leaves the same trace, so the epilogue cannot tell them apart.)
    lse = tl.where(m_i == float("inf"), m_i, lse)
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


# -- layouts --------------------------------------------------------------------------------------
def _row_layout(shape, stride) -> tuple[int, int, int, int, int]:
    """(rb, rh, cb, ch, stride_n): element (b, h, n, d) of ``t`` lies at
    ``(b rb + h rh + n) * stride_n + b cb + h ch + d`` — the tensor as rows of a matrix whose rows
    are ``stride_n`` elements apart, every head's tokens consecutive rows. Exact for any strides
    (``rb, cb = divmod(stride_b, stride_n)``); a dimension of size 1 has no stride that matters."""
    B, H, N, D = shape
    sb, sh, sn, _ = stride
    sb = sb if B > 1 else 0
    sh = sh if H > 1 else 0
    if sn <= 0:  # N == 1 (checked by the caller): any row pitch describes it
        sn = max(D, 1)
    rb, cb = divmod(sb, sn)
    rh, ch = divmod(sh, sn)
    return rb, rh, cb, ch, sn


def _descriptor(shape, layout, es: int, block_rows: int, block_d: int):
    """``(shape, strides, block)`` of a 2-D TMA descriptor over a tensor's rows, or None when the
    layout does not allow one (the base's alignment is checked per call).

    Rows must be 16-byte aligned. When every head starts at column 0 (contiguous tensors, slices
    along B or H) the descriptor is D columns wide and zero-fills a padded head dim; otherwise
    (heads side by side in a row, as in (B, N, H, D) transposed) it spans the row, so the head dim
    must be a power of two (no padding, which would read the neighbouring head) and every head must
    fit in its row.
    """
    B, H, N, D = shape
    rb, rh, cb, ch, sn = layout
    if (sn * es) % 16 or (D * es) % 16:
        return None
    rows = (B - 1) * rb + (H - 1) * rh + N
    if rows + block_rows >= 2**31:  # TMA coordinates are int32
        return None
    if cb == 0 and ch == 0:
        cols = D
    elif block_d == D and (B - 1) * cb + (H - 1) * ch + D <= sn:
        cols = sn
    else:
        return None
    return ([rows, cols], [sn, 1], [block_rows, block_d])


# -- the launcher ---------------------------------------------------------------------------------
def _check_inputs(q, k, v, causal, scale) -> None:
    dtypes = tuple(d for d in runtime.DTYPES if d != torch.float32) if runtime.is_gpu() else runtime.DTYPES
    for name, t in (("q", q), ("k", k), ("v", v)):
        if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and runtime.is_gpu():
            raise KernelInputError(
                f"{OP}: {name} is float32; on a GPU the kernel takes fp16 or bf16 (the tensor cores' inputs). "
                f"Pass {name}.to(torch.bfloat16)."
            )
        check_tensor(t, name, op=OP, dtypes=dtypes, ndim=4, contiguous=False, max_numel=None)
    if not (q.dtype == k.dtype == v.dtype):
        raise KernelInputError(
            f"{OP}: q, k and v must share a dtype, got {dtype_name(q.dtype)}, {dtype_name(k.dtype)}, "
            f"{dtype_name(v.dtype)}."
        )
    if not (q.device == k.device == v.device):
        raise KernelInputError(f"{OP}: q, k and v must be on one device, got {q.device}, {k.device}, {v.device}.")
    B, H, N_q, D = q.shape
    if k.shape != v.shape:
        raise KernelInputError(
            f"{OP}: k and v must have the same shape (B, H_kv, N_k, D), got {tuple(k.shape)} and {tuple(v.shape)}."
        )
    Bk, H_kv, N_k, Dk = k.shape
    if Bk != B or Dk != D:
        raise KernelInputError(
            f"{OP}: q is {tuple(q.shape)} and k is {tuple(k.shape)}: batch and head dim must match "
            "(q: (B, H, N_q, D), k and v: (B, H_kv, N_k, D))."
        )
    if H_kv == 0 or H % H_kv:
        raise KernelInputError(
            f"{OP}: q has {H} heads and k/v have {H_kv}; grouped-query attention needs H_q to be a multiple of H_kv."
        )
    if not 1 <= D <= MAX_HEAD_DIM:
        raise KernelInputError(f"{OP}: head dim {D}; the kernel takes 1 to {MAX_HEAD_DIM}.")
    if H > MAX_GRID_YZ or B > MAX_GRID_YZ:
        raise KernelInputError(
            f"{OP}: B={B}, H={H}; the grid holds at most {MAX_GRID_YZ} of each. Split the batch into chunks."
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[2] > 1 and t.stride(2) == 0:
            raise KernelInputError(
                f"{OP}: {name} is broadcast along the sequence (stride 0 for N={t.shape[2]}). Pass {name}.contiguous()."
            )
    if not isinstance(causal, bool):
        raise KernelInputError(f"{OP}: causal must be True or False, got {causal!r}.")
    if scale is not None and (
        isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale)
    ):
        raise KernelInputError(f"{OP}: scale must be a finite number (or None for 1/sqrt(D)), got {scale!r}.")


class _Plan(NamedTuple):
    """Everything a launch derives from shapes, strides, dtype and options: computed once per
    combination (:func:`_plan`), so a call does only its checks, two allocations and the launch."""

    ints: tuple  # the kernel's integer arguments (the scale goes between the third and the fourth)
    meta: dict  # constexprs and launch options
    grid: tuple
    descs: tuple | None  # (shape, strides, block) of the q, k, v descriptors; None: the pointer path
    store: tuple | None  # (shape, strides, block) of O's descriptor, or None
    key: tuple  # the config overrides, as _config_key gives them


def _config_key(config: dict | None) -> tuple:
    if config is None:
        return ()
    if not isinstance(config, dict):
        raise KernelInputError(f"{OP}: config must be a dict of tile overrides, got {type(config).__name__}.")
    try:
        return tuple(sorted(config.items()))
    except TypeError:
        raise KernelInputError(f"{OP}: config values must be numbers or booleans, got {config!r}.") from None


@functools.lru_cache(maxsize=1024)
def _plan(q_shape, q_stride, k_shape, k_stride, v_stride, dtype, causal, variant, config_key) -> _Plan:
    B, H, N_q, D = q_shape
    H_kv, N_k = k_shape[1], k_shape[2]
    gpu = runtime.is_gpu()
    metas = [(q_shape, q_stride), (k_shape, k_stride), (k_shape, v_stride)]
    layouts = [_row_layout(shape, stride) for shape, stride in metas]
    tma = variant == "tma" or (variant in (None, "auto") and _tma_by_default(B, H, N_q, N_k, D, causal))
    if variant == "tma" and gpu and not _hopper():
        raise KernelInputError(
            f"{OP}: variant='tma' needs a Hopper GPU (compute capability 9.0+); use variant='plain'."
        )
    if tma and TensorDescriptor is None:
        if variant == "tma":
            raise KernelInputError(f"{OP}: variant='tma' needs triton >= 3.4 (tensor descriptors).")
        tma = False
    overrides = _check_config(dict(config_key), causal)
    cfg = {**_config(N_q, N_k, D, causal, tma, gpu), **overrides}
    descs = None
    if tma:
        rows = (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_N"])
        es = element_size(dtype)
        descs = [_descriptor(m[0], lay, es, r, cfg["BLOCK_D"]) for m, lay, r in zip(metas, layouts, rows, strict=True)]
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
    meta = {
        "HEAD_DIM": D,
        "BLOCK_D": bd,
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "CAUSAL": causal,
        "TMA": tma,
        "EVEN_N": N_k % bn == 0,
        "TMA_STORE": store is not None,
        "REF_MAX": int(cfg["REF_MAX"]),  # 0 off; 1: P summed as a tile, reduced once; 2: a row sum a block
        **launch_kwargs(cfg["num_warps"], cfg["num_stages"]),
    }
    return _Plan(ints, meta, (cdiv(N_q, bm), H, B), descs, store, config_key)


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashAttention forward: ``(O, lse)`` in one launch, the N x N scores never in HBM; differentiable.

    ``O = softmax(Q K^T * scale + mask) V``, ``lse = logsumexp(Q K^T * scale + mask)`` per row.
    ``q``: (B, H_q, N_q, D); ``k``, ``v``: (B, H_kv, N_k, D) with H_q a multiple of H_kv (query head h
    reads key/value head ``h // (H_q // H_kv)``). fp16/bf16 on a GPU, fp32/fp16 in the interpreter.
    Head dims 1 to 256 (padded on chip to a power of two; 32, 64, 80, 96, 128 and 256 are tested). Any
    N_q, N_k. Any strides with the last dimension contiguous (``x.view(B, N, H, D).transpose(1, 2)`` is
    read in place). ``causal``: top-left aligned, query i sees keys j <= i, as
    ``F.scaled_dot_product_attention(is_causal=True)``. ``scale``: default ``1 / sqrt(D)``.

    Returns O (B, H_q, N_q, D), contiguous, in q's dtype, and lse (B, H_q, N_q), fp32, natural log.
    N_k = 0 gives O = 0 and lse = -inf. Inputs that require grad (autograd on) go through
    :class:`~fusionlab.kernels.attention_backward.AttentionFunction`: O and lse both differentiable, the
    backward of lesson 8 (head dims 16 to 128; ``deterministic``: dQ in a pass of its own, bit-identical
    from run to run, or by atomics; ``backward_config``: its tiles). ``variant``: ``"tma"`` or
    ``"plain"`` forces a load path (None picks: TMA on Hopper where
    the layout allows and the call has :data:`TMA_MIN_FLOPS` of work). ``config``:
    tile overrides for a sweep (``BLOCK_M``, ``BLOCK_N``, ``num_warps``,
    ``num_stages``, ``TMA_STORE``, ``REF_MAX``: 0, 1 or 2, every
    block against block 0's row max with a fallback to the online loop on overflow, the Hopper default
    for head dims up to 128).
    Trips: :func:`attention_ledger`; FLOPs: :func:`attention_flops`; reference: :func:`attention_reference`.
    """
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (q, k, v)):
        return attention_backward.attention_trainable(
            q, k, v, causal, scale, deterministic=deterministic, backward_config=backward_config,
            variant=variant, config=config,
        )  # fmt: skip
    _check_inputs(q, k, v, causal, scale)
    if variant not in VARIANTS:
        raise KernelInputError(f"{OP}: variant={variant!r}; choose one of {VARIANTS}.")
    B, H, N_q, D = q.shape
    scale = _default_scale(D, scale)
    o = torch.empty((B, H, N_q, D), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, N_q), dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse
    if k.shape[2] == 0:  # a softmax over no keys: SDPA's math path gives 0, and log(0) = -inf
        return o.zero_(), lse.fill_(float("-inf"))

    plan = _plan(q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.dtype, causal, variant, _config_key(config))
    srcs, o_desc = (q, k, v), o
    if plan.descs is not None:
        if (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16 == 0:  # TMA needs 16-byte aligned bases
            srcs = [TensorDescriptor(t, *spec) for t, spec in zip(srcs, plan.descs, strict=True)]
            if plan.store is not None:
                o_desc = TensorDescriptor(o, *plan.store)
        elif variant == "tma":
            raise KernelInputError(f"{OP}: variant='tma' needs q, k and v to start on 16-byte boundaries.")
        else:  # an odd view's base: the pointer path
            plan = _plan(q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.dtype, causal, "plain", plan.key)
    _attention_kernel[plan.grid](*srcs, o, o_desc, lse, *plan.ints[:3], scale * LOG2E, *plan.ints[3:],
                                 SCALE_NEG=scale < 0, **plan.meta)  # fmt: skip
    return o, lse


# the backward builds on this module's launcher (its autograd Function runs attention() for the forward),
# so it is imported last, once everything above exists
from . import attention_backward  # noqa: E402
