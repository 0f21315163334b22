"""What attention's forward (:mod:`.attention`) and backward (:mod:`.attention_backward`) share.

The forward module is the op's public home: ``attention(...)`` and its ``autograd.Function``, which runs
the backward's launches. So the backward is built first and cannot import the forward; what both need
lives here, below both (and lesson 7's FA1 schedule, :mod:`.attention_fa1`, takes it from here too):
the spec's float64 scores; the eager baseline and its arithmetic (FLOPs, the forward's trips, on which
the backward's ledger builds); the input checks, the default scale and the config overrides' checks;
what the GPU can do (tensor descriptors, by measured compute capability) and the descriptors' geometry;
lesson 7b's modifications and block masks on the host (their float64 scores, the block lists).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F

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


# -- lesson 7b: score modifications and block masks, the host's half -------------------------------
class ScoreMod(NamedTuple):
    """A score modification: ``fn``, a ``@triton.jit`` function ``(score, b, h, q_idx, kv_idx, aux, a0, a1)
    -> score`` the kernel applies to each block of scaled fp32 scores in registers (``q_idx`` a column,
    ``kv_idx`` a row of token indices, ``h`` the query head); ``ref``, the same on torch tensors (float64,
    broadcasting), for the reference; ``aux`` a tensor and ``a0``, ``a1`` numbers it reads (None: not
    passed)."""

    fn: object
    ref: Callable | None = None
    aux: torch.Tensor | None = None
    a0: float | int | None = None
    a1: float | int | None = None
    name: str = "score_mod"


class MaskMod(NamedTuple):
    """A mask function: ``fn``, a ``@triton.jit`` function ``(b, h, q_idx, kv_idx, aux, a0, a1) -> keep``
    (True where query ``q_idx`` sees key ``kv_idx``), run on the partial blocks only; ``ref``, the same
    on torch tensors, from which :func:`block_mask` builds the block lists and the reference its mask."""

    fn: object
    ref: Callable
    aux: torch.Tensor | None = None
    a0: float | int | None = None
    a1: float | int | None = None
    name: str = "mask"


@dataclass(frozen=True, eq=False)
class BlockMask:
    """Which key blocks each Q tile visits, built once per shape by :func:`block_mask`.

    ``num`` (B', H', T_m, 2) int32: per Q tile, how many *full* blocks (every query of the tile sees
    every key of the block: no element mask) and *partial* blocks (some do: the mask function runs on
    them); ``idx`` (B', H', T_m, 2, T_n) int32: their key-block numbers, ascending, the rest of each row
    unused. A block in neither list is empty: never loaded. B' and H' are 1 where the mask does not
    depend on the batch or the head. ``visible``: the (query, key) pairs the mask keeps, over B' x H'.
    """

    mask: MaskMod
    shape: tuple  # (B', H', N_q, N_k)
    block_m: int
    block_n: int
    num: torch.Tensor
    idx: torch.Tensor
    visible: int

    def blocks(self) -> tuple[int, int, int]:
        """(full, partial, all) key blocks over every Q tile, summed over B' x H'."""
        full, part = (int(x) for x in self.num.sum(dim=(0, 1, 2)).tolist())
        return full, part, self.num.shape[0] * self.num.shape[1] * self.num.shape[2] * self.idx.shape[-1]

    def density(self) -> float:
        """The fraction of the (Q tile, key block) grid the kernel visits: full plus partial blocks."""
        full, part, total = self.blocks()
        return (full + part) / total

    def __repr__(self) -> str:
        full, part, total = self.blocks()
        B, H, N_q, N_k = self.shape
        return (f"BlockMask({self.mask.name}, B={B}, H={H}, N_q={N_q}, N_k={N_k}, tiles {self.block_m}x{self.block_n}: "
                f"{full} full + {part} partial of {total} blocks, density {(full + part) / total:.3f})")  # fmt: skip


#: the block mask's tiles on a GPU (the kernel runs at the mask's tiles); the interpreter takes lesson 7's
#: 32 x 16 so small tests reach full, partial and empty blocks
MOD_TILE = (128, 64)
MOD_TILE_INTERPRETER = (32, 16)


def _mask_args(mask: MaskMod):
    return mask.aux, mask.a0, mask.a1


def block_mask(
    mask: MaskMod,
    B: int | None,
    H: int | None,
    N_q: int,
    N_k: int,
    device=None,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    rows_per_chunk: int = 1024,
) -> BlockMask:
    """The block lists of ``mask`` for one shape (``torch.nn.attention.flex_attention.create_block_mask``'s
    job): the mask's torch function evaluated on every (query, key) pair, a chunk of rows at a time, and
    reduced to (BLOCK_M x BLOCK_N) blocks. ``B``, ``H`` None: the mask is the same for every batch row or
    head. Rows past N_q do not count (they are never stored); keys past N_k are hidden, so a block that
    hangs past N_k is never full. Tiles default to :data:`MOD_TILE` (the interpreter: 32 x 16), shrunk to
    a short sequence; the kernel runs at the mask's tiles."""
    if not isinstance(mask, MaskMod):
        raise KernelInputError(f"{OP}: block_mask takes a MaskMod (causal_mask(), sliding_window(w), ...), got "
                               f"{type(mask).__name__}.")  # fmt: skip
    dev = torch.device(runtime.DEVICE if device is None else device)
    default_m, default_n = MOD_TILE if runtime.is_gpu() else MOD_TILE_INTERPRETER
    bm = min(default_m, max(16, _pow2(N_q))) if block_m is None else block_m
    bn = min(default_n, max(16, _pow2(N_k))) if block_n is None else block_n
    for name, value in (("block_m", bm), ("block_n", bn)):
        check_block(value, name, OP, max_value=256)
        if value < 16:
            raise KernelInputError(f"{OP}: {name}={value}; tl.dot needs tiles of at least 16.")
    Bp, Hp = (1 if B is None else B), (1 if H is None else H)
    T_m, T_n = -(-N_q // bm), -(-N_k // bn)
    full = torch.zeros(Bp, Hp, T_m, T_n, dtype=torch.bool, device=dev)
    part = torch.zeros_like(full)
    visible = 0
    kv = torch.arange(T_n * bn, device=dev).view(1, -1)
    kv_ok = kv < N_k
    step = max(1, rows_per_chunk // bm) * bm
    aux, a0, a1 = _mask_args(mask)
    for b in range(Bp):
        for h in range(Hp):
            bt, ht = torch.tensor(b, device=dev), torch.tensor(h, device=dev)
            for r0 in range(0, T_m * bm, step):
                q = torch.arange(r0, min(r0 + step, T_m * bm), device=dev).view(-1, 1)
                keep = torch.as_tensor(mask.ref(bt, ht, q, kv, aux, a0, a1), device=dev).expand(q.shape[0], kv.shape[1])
                keep = keep & kv_ok
                q_ok = q < N_q
                visible += int((keep & q_ok).sum())
                tiles = q.shape[0] // bm
                seen = (keep & q_ok).view(tiles, bm, T_n, bn).any(dim=3).any(dim=1)
                whole = (keep | ~q_ok).view(tiles, bm, T_n, bn).all(dim=3).all(dim=1)
                t0 = r0 // bm
                full[b, h, t0 : t0 + tiles] = whole
                part[b, h, t0 : t0 + tiles] = seen & ~whole
    num = torch.stack([full.sum(-1), part.sum(-1)], dim=-1).to(torch.int32)
    # each list's block numbers first, ascending (a stable sort of "not in the list")
    idx = torch.stack([torch.sort((~x).to(torch.int8), dim=-1, stable=True).indices for x in (full, part)], dim=-2)
    return BlockMask(mask, (Bp, Hp, N_q, N_k), bm, bn, num.contiguous(), idx.to(torch.int32).contiguous(), visible)


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def modified_scores64(q, k, v, causal: bool, scale, score_mod: ScoreMod | None, mask: MaskMod | None):
    """:func:`scores64` with a modification: the float64 scores ``Q K^T * scale``, then ``score_mod``'s
    torch function, then the causal mask and ``mask``'s (-inf where hidden). The modification sees every
    score, the mask decides which count, as in the kernel."""
    s, kd, vd = scores64(q, k, v, False, scale)
    B, H, N_q, N_k = s.shape
    dev = s.device
    b = torch.arange(B, device=dev).view(B, 1, 1, 1)
    h = torch.arange(H, device=dev).view(1, H, 1, 1)
    qi = torch.arange(N_q, device=dev).view(N_q, 1)
    ki = torch.arange(N_k, device=dev).view(1, N_k)
    if score_mod is not None:
        if score_mod.ref is None:
            raise KernelInputError(f"{OP}: score_mod {score_mod.name!r} has no torch function (ref) for the reference.")
        s = score_mod.ref(s, b, h, qi, ki, score_mod.aux, score_mod.a0, score_mod.a1).double()
    keep = torch.ones(N_q, N_k, dtype=torch.bool, device=dev)
    if causal:
        keep = keep & (qi >= ki)
    if mask is not None:
        keep = keep & torch.as_tensor(mask.ref(b, h, qi, ki, *_mask_args(mask)), device=dev)
    return s.masked_fill(~keep, float("-inf")), kd, vd
