"""What attention's forward (:mod:`.attention`) and backward (:mod:`.attention_backward`) share.

The forward module is the op's public home: ``attention(...)`` and its ``autograd.Function``, which runs
the backward's launches. So the backward is built first and cannot import the forward; what both need
lives here, below both (and lesson 7's FA1 schedule, :mod:`.attention_fa1`, takes it from here too):
the spec's float64 scores; the eager baseline and its arithmetic (FLOPs, the forward's trips, on which
the backward's ledger builds); the input checks, the default scale and the config overrides' checks;
what the GPU can do (tensor descriptors, by measured compute capability) and the descriptors' geometry;
the forward's tile loader, which lesson 7's kernel and lesson 7b's modification path
(:mod:`.attention_mods`) both call; and the forward's score-block steps (a block's new row max, its
``P``), with the loop Hopper's default takes (``REF_MAX``: every block against block 0's row max, no
rescale), which the kernel in :mod:`.attention` calls beside its online loop.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .. import runtime
from .._exercise import answer_key
from ..ledger import Ledger
from ._launch import KernelInputError, check_block, check_tensor, dtype_name, element_size

try:  # host-side TMA descriptors: triton >= 3.4 (the GPU machine and Colab have 3.6)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: the pointer path only
    TensorDescriptor = None

OP = "attention"
LOG2E = 1.4426950408889634
#: head dims the forward takes (padded to a power of two on chip)
MAX_HEAD_DIM = 256
#: the grid's y and z axes (heads, batch) are limited to 65535 programs by CUDA
MAX_GRID_YZ = 65535


def default_scale(d: int, scale) -> float:
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def hopper() -> bool:
    """Tensor descriptors (TMA) and the bulk reduce-add: a GPU of compute capability 9.0 or more, as the
    runtime measured it."""
    return runtime.is_gpu() and runtime.CAPABILITY is not None and runtime.CAPABILITY >= (9, 0)


def scores64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None):
    """The spec's scores in float64: ``(s, k, v)`` with ``s = Q K^T * scale`` (B, H_q, N_q, N_k), causal
    entries -inf (top-left: query i sees keys j <= i), and K, V repeated to the query heads (GQA)."""
    scale = default_scale(q.shape[-1], scale)
    group = q.shape[1] // k.shape[1]
    kd = k.double().repeat_interleave(group, dim=1)
    vd = v.double().repeat_interleave(group, dim=1)
    s = (q.double() @ kd.transpose(-2, -1)) * scale
    if causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return s, kd, vd


@functools.lru_cache(maxsize=64)
def _causal_keep(n_q: int, n_k: int, device: torch.device) -> torch.Tensor:
    """The top-left causal mask as a boolean (N_q, N_k) buffer: True where query i sees key j <= i.
    Built once per size and device, as nanoGPT keeps its ``bias`` buffer."""
    return torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril()


def attention_eager(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None
) -> torch.Tensor:
    """What eager PyTorch runs for attention written by hand (nanoGPT's manual path): O only.

    ``S = Q K^T`` (written to HBM), ``S * scale`` (read, written), the causal ``masked_fill``
    (read, written; the mask is a cached boolean buffer), ``softmax`` (read, written as P, in the
    input dtype), ``P V`` (read). Grouped-query attention first repeats K and V per query head.
    Peak memory: two ``N_q x N_k`` matrices per head. :func:`attention_ledger` counts its trips.
    """
    scale = default_scale(q.shape[-1], scale)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    s = (q @ k.transpose(-2, -1)) * scale  # (B, H, N_q, N_k)
    if causal:
        s = s.masked_fill(~_causal_keep(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    p = F.softmax(s, dim=-1)
    return p @ v  # (B, H, N_q, D)


def visible_pairs(n_q: int, n_k: int, causal: bool) -> int:
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
    pairs = N_q * N_k // 2 if causal and N_q == N_k else visible_pairs(N_q, N_k, causal)
    return 4 * B * H * pairs * D


def kv_heads(H: int, h_kv: int | None) -> int:
    """A ledger's key/value heads: ``h_kv`` (grouped-query attention) or H."""
    h_kv = H if h_kv is None else h_kv
    if h_kv < 1 or H % h_kv:
        raise ValueError(f"H={H} must be a multiple of h_kv={h_kv}")
    return h_kv


def keys_per_row(n_q: int, n_k: int, causal: bool, block_m: int) -> int:
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
    h_kv = kv_heads(H, h_kv)
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
        kv_reads = B * H * keys_per_row(N_q, N_k, causal, block_m) * D
    led.fused("load Q tiles", reads={"Q": q_n})
    led.fused("stream K, V", reads={"K": kv_reads, "V": kv_reads})
    led.fused("write O, lse", writes={"O": q_n, "lse": B * H * N_q})
    return led


def attention_bytes(
    B: int, H: int, N_q: int, N_k: int, D: int, dtype=torch.bfloat16, *, h_kv: int | None = None
) -> int:
    """The fewest bytes any attention forward moves: Q, K, V read once, O and lse written once."""
    h_kv = kv_heads(H, h_kv)
    es = element_size(dtype)
    return (2 * B * H * N_q * D + 2 * B * h_kv * N_k * D) * es + 4 * B * H * N_q


def check_inputs(q, k, v, causal, scale, *, op: str = OP, grad: bool = False) -> None:
    """The forward's checks (the backward runs them on what it is given): dtypes, devices, shapes,
    heads, strides, ``causal`` and ``scale``."""
    dtypes = tuple(d for d in runtime.DTYPES if d != torch.float32) if runtime.is_gpu() else runtime.DTYPES
    for name, t in (("q", q), ("k", k), ("v", v)):
        if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and runtime.is_gpu():
            raise KernelInputError(
                f"{op}: {name} is float32; on a GPU the kernel takes fp16 or bf16 (the tensor cores' inputs). "
                f"Pass {name}.to(torch.bfloat16)."
            )
        check_tensor(t, name, op=op, dtypes=dtypes, ndim=4, contiguous=False, grad=grad, max_numel=None)
    if not (q.dtype == k.dtype == v.dtype):
        raise KernelInputError(
            f"{op}: q, k and v must share a dtype, got {dtype_name(q.dtype)}, {dtype_name(k.dtype)}, "
            f"{dtype_name(v.dtype)}."
        )
    if not (q.device == k.device == v.device):
        raise KernelInputError(f"{op}: q, k and v must be on one device, got {q.device}, {k.device}, {v.device}.")
    B, H, N_q, D = q.shape
    if k.shape != v.shape:
        raise KernelInputError(
            f"{op}: k and v must have the same shape (B, H_kv, N_k, D), got {tuple(k.shape)} and {tuple(v.shape)}."
        )
    Bk, H_kv, N_k, Dk = k.shape
    if Bk != B or Dk != D:
        raise KernelInputError(
            f"{op}: q is {tuple(q.shape)} and k is {tuple(k.shape)}: batch and head dim must match "
            "(q: (B, H, N_q, D), k and v: (B, H_kv, N_k, D))."
        )
    if H_kv == 0 or H % H_kv:
        raise KernelInputError(
            f"{op}: q has {H} heads and k/v have {H_kv}; grouped-query attention needs H_q to be a multiple of H_kv."
        )
    if not 1 <= D <= MAX_HEAD_DIM:
        raise KernelInputError(f"{op}: head dim {D}; the kernel takes 1 to {MAX_HEAD_DIM}.")
    if H > MAX_GRID_YZ or B > MAX_GRID_YZ:
        raise KernelInputError(
            f"{op}: B={B}, H={H}; the grid holds at most {MAX_GRID_YZ} of each. Split the batch into chunks."
        )
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.shape[2] > 1 and t.stride(2) == 0:
            raise KernelInputError(
                f"{op}: {name} is broadcast along the sequence (stride 0 for N={t.shape[2]}). Pass {name}.contiguous()."
            )
    if not isinstance(causal, bool):
        raise KernelInputError(f"{op}: causal must be True or False, got {causal!r}.")
    if scale is not None and (
        isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale)
    ):
        raise KernelInputError(f"{op}: scale must be a finite number (or None for 1/sqrt(D)), got {scale!r}.")


def config_key(config: dict | None, op: str, known: tuple, *, flags: tuple = (), choices: dict | None = None) -> tuple:
    """A config's tile overrides, checked, as a hashable key: only ``known`` keys; ``BLOCK_*`` powers of
    two from 16 (``tl.dot``'s least) to 256, ``num_warps*`` powers of two to 16, ``num_stages*`` 1 to 8;
    ``flags`` True or False; ``choices``: a name and the values it takes."""
    if config is None:
        return ()
    if not isinstance(config, dict):
        raise KernelInputError(f"{op}: config must be a dict of tile overrides, got {type(config).__name__}.")
    unknown = set(config) - set(known)
    if unknown:
        raise KernelInputError(f"{op}: unknown config key(s) {sorted(unknown)}; known: {', '.join(known)}.")
    for name, value in config.items():
        if name in flags:
            if value not in (False, True):
                raise KernelInputError(f"{op}: {name}={value!r}; pass True or False.")
        elif choices and name in choices:
            if isinstance(value, (list, dict, set)) or value not in choices[name]:
                raise KernelInputError(f"{op}: {name}={value!r}; choose one of {choices[name]}.")
        elif name.startswith("num_stages"):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 8:
                raise KernelInputError(f"{op}: {name}={value!r}; pass 1 to 8 pipeline stages.")
        else:
            check_block(value, name, op, max_value=16 if name.startswith("num_warps") else 256)
            if name.startswith("BLOCK") and value < 16:
                raise KernelInputError(f"{op}: {name}={value}; tl.dot needs tiles of at least 16.")
    return tuple(sorted(config.items()))


# -- the forward's tensor descriptors: a (B, H, N, D) tensor as the rows of a matrix ---------------
def row_layout(shape, stride) -> tuple[int, int, int, int, int]:
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


def descriptor(shape, layout, es: int, block_rows: int, block_d: int):
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


# -- the forward's K and V tiles: lesson 7's kernel and the modification path load them alike ----------
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


# -- the forward's score blocks: lesson 7's online loop and Hopper's reference-max loop take them alike --
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


@triton.jit
def _attention_ref(
    acc, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn,
    offs_m, offs_d, n_k, qk_scale, lo_mask, hi,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
    SCALE_NEG: tl.constexpr, TMA: tl.constexpr, EVEN_N: tl.constexpr, ROW_SUM: tl.constexpr,
):  # fmt: skip
    """A Q tile's key blocks against block 0's row max (``REF_MAX``): ``[0, lo_mask)`` unmasked, then
    ``[lo_mask, hi)`` masked. Returns ``(acc, l, m_ref)``; the kernel checks for overflow."""
    if ROW_SUM:
        l_t = tl.zeros([BLOCK_M], dtype=tl.float32)
    else:
        l_t = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc, l_t, m_ref = _attention_inner_ref(
        acc, l_t, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn,
        offs_m, offs_d, n_k, qk_scale, 0, lo_mask,
        HEAD_DIM, BLOCK_N, False, CAUSAL, SCALE_NEG, TMA, EVEN_N, ROW_SUM,
    )  # fmt: skip
    if CAUSAL or not EVEN_N:
        acc, l_t, m_ref = _attention_inner_ref(
            acc, l_t, m_ref, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn,
            offs_m, offs_d, n_k, qk_scale, lo_mask, hi,
            HEAD_DIM, BLOCK_N, True, CAUSAL, SCALE_NEG, TMA, EVEN_N, ROW_SUM,
        )  # fmt: skip
    if not ROW_SUM:
        l_t = tl.sum(l_t, 1)
    return acc, l_t, m_ref
