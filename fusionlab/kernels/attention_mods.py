"""Lesson 7b: score modifications and block masks for lesson 7's attention forward.

``attention(q, k, v, score_mod=..., block_mask=...)`` (:mod:`.attention`, forward only) takes them;
this module is what they are:

- a **score modification** (:class:`ScoreMod`): a ``@triton.jit`` function ``(score, b, h, q_idx, kv_idx,
  aux, a0, a1) -> score`` that the kernel applies to each block of scaled fp32 scores in registers (Triton
  takes a jitted function as a ``tl.constexpr`` argument and inlines it), and its torch twin for the
  float64 reference. Ready-made: :func:`softcap` (Gemma 2), :func:`alibi`, :func:`relative_bias`;
- a **mask** (:class:`MaskMod`): a jitted ``(b, h, q_idx, kv_idx, aux, a0, a1) -> keep`` and its torch
  twin; :func:`block_mask` evaluates the twin once per shape into a :class:`BlockMask`, the lists of the
  *full* key blocks (run with no element mask) and *partial* ones (the jitted function masks them) of
  each Q tile; an *empty* block is in neither list and is never loaded. Ready-made:
  :func:`causal_mask`, :func:`sliding_window`, :func:`document_mask` (packed sequences), :func:`prefix_lm`;
- the kernel's half (:func:`_attention_mod`): the online softmax of lesson 7 (or its reference-max form,
  ``REF_MAX``) over those lists, or over lesson 7's loop bounds when there is only a score modification.

With neither, ``attention`` compiles lesson 7's kernel unchanged (``benchmarks/notes_lesson7b.md``).
Semantics follow ``torch.nn.attention.flex_attention``'s: the modification sees every scaled score, the
mask then decides which count, a row that sees no key gives O = 0 and lse = -inf.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import runtime
from ._attention import OP, _kv_tile, scores64
from ._launch import KernelInputError, check_block

__all__ = ["ScoreMod", "MaskMod", "BlockMask", "block_mask", "modified_scores64", "mod_overrides", "mod_error_text",
           "softcap", "alibi", "relative_bias", "causal_mask", "sliding_window", "prefix_lm",
           "document_mask"]  # fmt: skip


# -- what a modification is, and the block lists -----------------------------------------------------
class ScoreMod(NamedTuple):
    """A score modification: ``fn``, a ``@triton.jit`` function ``(score, b, h, q_idx, kv_idx, aux, a0, a1)
    -> score`` the kernel applies to each block of scaled fp32 scores in registers (``q_idx`` a column,
    ``kv_idx`` a row of token indices, ``h`` the query head); ``ref``, the same on torch tensors (float64,
    broadcasting), for the reference; ``aux`` a tensor and ``a0``, ``a1`` numbers it reads (None: not
    passed). ``bounded``: the modified scores stay in a narrow range (softcap's ``(-cap, cap)``), so the
    kernel may sum every block against the first block's max (``REF_MAX``); a modification that moves the
    max from block to block by far (ALiBi's bias grows with the distance) would overflow that sum and run
    the tile twice, so it takes the online loop. ``rising``: it moves the max the other way only, never
    lowering a later key's score (ALiBi's ``m_h (kv_idx - q_idx)``): the kernel then walks a tile's keys from
    the last block back, against the max of the blocks it meets first, and the sum cannot overflow; with a
    block mask (whose blocks it walks forward) it takes the online loop."""

    fn: object
    ref: Callable | None = None
    aux: torch.Tensor | None = None
    a0: float | int | None = None
    a1: float | int | None = None
    name: str = "score_mod"
    bounded: bool = False
    rising: bool = False


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
    ``contiguous``: every tile's full blocks are consecutive (a window's, a document's, causal, prefix-LM:
    every mask here), so the kernel may run them as a range from the first, with no list entry to load a
    block; ``one_run``: every tile's visited blocks, full and partial, are consecutive too (every mask here),
    so they may run as one loop.
    """

    mask: MaskMod
    shape: tuple  # (B', H', N_q, N_k)
    block_m: int
    block_n: int
    num: torch.Tensor
    idx: torch.Tensor
    visible: int
    contiguous: bool = False
    one_run: bool = False

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


#: the block mask's tiles on a GPU; the kernel's tiles lie inside them (a Q tile a part of the mask's, a key
#: block a part of the mask's), each head dim at its own. 64 x 128: the best of the 2026-11-27 sweep at head dim
#: 64 (a window's and the documents' edge blocks waste less than with 128-row tiles); head dim 128 runs 64 x 64
#: inside them (benchmarks/notes_lesson7b.md). The interpreter takes lesson 7's 32 x 16, so small tests reach
#: full, partial and empty blocks
MOD_TILE = (64, 128)
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
    return BlockMask(mask, (Bp, Hp, N_q, N_k), bm, bn, num.contiguous(), idx.to(torch.int32).contiguous(), visible,
                     _one_run(full), _one_run(full | part))  # fmt: skip


def _one_run(blocks: torch.Tensor) -> bool:
    """Whether each tile's blocks (a bool row a tile) are consecutive: at most one run of True."""
    starts = blocks[..., :1].int() + (blocks[..., 1:] & ~blocks[..., :-1]).sum(-1, keepdim=True)
    return bool((starts <= 1).all())


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


# -- the common modifications, ready-made --------------------------------------------------------------
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
                    f"softcap({cap:g})", bounded=True)  # fmt: skip


@triton.jit
def _alibi(score, b, h, q_idx, kv_idx, aux, n_heads, a1):
    slope = tl.math.exp2(-8.0 * (h + 1) / n_heads)
    # the indices to float as the row and the column they are (BLOCK_M + BLOCK_N conversions), not as the
    # block their difference is: an int-to-float conversion runs at a quarter of the FMA rate, as exp2 does
    return score + (slope * kv_idx.to(tl.float32) - slope * q_idx.to(tl.float32))


def _alibi_ref(s, b, h, q, kv, aux, n_heads, a1):
    return s + torch.exp2(-8.0 * (h + 1) / n_heads) * (kv - q)


def alibi(n_heads: int) -> ScoreMod:
    """ALiBi (Press et al., 2022): ``score + m_h (kv_idx - q_idx)``, head h's slope ``m_h = 2^(-8 (h+1) / H)``."""
    if isinstance(n_heads, bool) or not isinstance(n_heads, int) or n_heads < 1:
        raise KernelInputError(f"{OP}: alibi takes the number of query heads, got {n_heads!r}.")
    return ScoreMod(_alibi, _alibi_ref, None, float(n_heads), None, f"alibi({n_heads})", rising=True)


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


def mod_error_text(e: BaseException) -> str:
    """Why a modification did not compile, the cause on the first line: the root of ``e``'s chain (a checker
    or a log that keeps one line still names it). The GPU's ``CompilationError`` writes ``at L:C:``, the
    source and a caret first and its cause last, so the cause and the line come first here, then its text;
    the interpreter's errors are Python's own, wrapped."""
    root = e
    while root.__cause__ is not None:
        root = root.__cause__
    text = str(root).strip()[:2000]
    if isinstance(root, triton.CompilationError) and getattr(root, "error_message", None):
        cause = root.error_message.strip().splitlines()[-1]
        line = getattr(root.node, "lineno", None)
        src = (root.src or "").split("\n")
        at = src[line - 1].strip() if line and line <= len(src) else None
        where = f" at line {line} of the jitted function: `{at}`" if at else ""
        return f"{cause}{where}\n{text}"
    return f"{type(root).__name__}: {text}"


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


#: how the kernel walks a block mask: "lists" (``SPARSE=1``: a list entry loaded before each block's K and V),
#: "ranges" (``SPARSE=2``, where the full blocks are consecutive: a range from the first, then the partial
#: ones through their list), "one" (``SPARSE=3``, where all visited blocks are consecutive: one loop from the
#: first full block round to the one before it, the element mask applied to the partial blocks only). A
#: mask that is not consecutive falls back to the ranges, or the lists. None: :data:`SPARSE_LOOP_BY_D`'s.
SPARSE_LOOP = None
#: the walk by head-dim class, from ``benchmarks/probes/probe_7b_sparse.py`` (H200, 2026-11-27, N = 32768:
#: benchmarks/notes_lesson7b.md, "the probe's answer"). Head dim 128 at 64 x 64 kernel tiles: one loop beats
#: the lists by a fifth to a quarter (the window, the documents, causal); head dim 64 at 64 x 128: the
#: lists win by a few percent, and one loop runs the documents' mask function in a branch five times slower
SPARSE_LOOP_BY_D = {64: "lists", 128: "one"}


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
        if sm.rising and not sm.bounded and bmask is None:
            kwargs.update(MOD_RISING=True)
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
        d_class = 64 if q.shape[-1] <= 64 else (128 if q.shape[-1] <= 128 else 256)
        loop = SPARSE_LOOP or SPARSE_LOOP_BY_D.get(d_class, "lists")
        loop = loop if (loop != "one" or bmask.one_run) else "ranges"
        sparse = {"one": 3, "ranges": 2 if bmask.contiguous else 1}.get(loop, 1)
        kwargs.update(SPARSE=sparse, MASK_MOD=bmask.mask.fn, mask_aux=bmask.mask.aux,
                      mask_a0=bmask.mask.a0, mask_a1=bmask.mask.a1, bm_num=bmask.num, bm_idx=bmask.idx,
                      bm_sb=(Hm * T_m if Bm > 1 else 0), bm_sh=(T_m if Hm > 1 else 0),
                      bm_tn=bmask.idx.shape[-1])  # fmt: skip
        tiles = (bmask.block_m, bmask.block_n)
        names.append(f"mask {bmask.mask.name!r}")
    # the plan's key: the mask's tiles, and whether the reference-max loop may run (no unbounded modification,
    # or a rising one walked backwards)
    return _Mods((*tiles, sm is None or sm.bounded or bool(kwargs.get("MOD_RISING"))), kwargs, " and ".join(names))


#: the modification path's (BLOCK_M, BLOCK_N, num_warps, num_stages) on the TMA path, by (head-dim
#: class, block mask), where TMA_TABLE's row is not its best (benchmarks/notes_lesson7b.md, 2026-11-27 "the
#: first sweep"): a score modification on the dense non-causal loop past LONG queries, and a block mask at
#: any length (the kernel's tiles lie inside the mask's 64 x 128, ``MOD_TILE``)
MOD_TMA_TABLE = {(64, False): (64, 128, 4, 2), (64, True): (64, 128, 4, 2), (128, True): (64, 64, 4, 3)}


def mod_overrides(
    mod, overrides: dict, config_key: tuple, config_of, D: int, causal: bool, tma: bool, long: bool
) -> dict:
    """The plan's tile overrides for the modification path (``mod``: a block mask's ``(block_m, block_n)``, or
    ``(None, None)``, and whether the reference-max loop may run): :data:`MOD_TMA_TABLE`'s row where it
    applies, then, with a block mask, the kernel's tiles inside the mask's (the table's where they divide
    it, else the mask's own; a config override that does not divide it is refused). ``config_of(overrides)``:
    the plan's whole configuration with them."""
    overrides = dict(overrides)
    sparse = mod[1] is not None
    if not mod[2]:  # an unbounded score modification: the online loop, unless the config says otherwise
        overrides.setdefault("REF_MAX", 0)
    if tma:
        d_class = 64 if D <= 64 else (128 if D <= 128 else 256)
        row = MOD_TMA_TABLE.get((d_class, sparse)) if sparse or (not causal and long) else None
        for name, value in zip(("BLOCK_M", "BLOCK_N", "num_warps", "num_stages"), row or (), strict=False):
            overrides.setdefault(name, value)
    if sparse:
        base = config_of(overrides)
        for name, mask_t in zip(("BLOCK_M", "BLOCK_N"), mod[:2], strict=True):
            if name in dict(config_key) and mask_t % overrides[name]:
                raise KernelInputError(f"{OP}: config {name}={overrides[name]} does not divide the block mask's "
                                       f"{name.lower()}={mask_t}; the kernel's tiles lie inside the mask's "
                                       f"(block_mask(..., {name.lower()}=...)).")  # fmt: skip
            overrides[name] = base[name] if base[name] <= mask_t and mask_t % base[name] == 0 else mask_t
    return overrides


# -- the kernel's half: what lesson 7's kernel calls when MOD is set -------------------------------------
@triton.jit
def _mod_scores(
    qk, offs_m, offs_n, off_b, off_h, n_k, sm_scale, mod_aux, mod_a0, mod_a1, mask_aux, mask_a0, mask_a1, part,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, SCORE_MOD: tl.constexpr, MASK_MOD: tl.constexpr,
):  # fmt: skip
    """A block's scores in base-2 units: scaled to natural units (the modification sees what the spec
    writes, ``Q K^T * scale``), modified, then times log2(e). ``MASKED``: the key bound, the causal
    mask and the mask function set what they hide to -inf (a full block needs none of them); 2: only where
    ``part`` (a block of a loop that runs full and partial blocks both)."""
    q_idx = offs_m[:, None]
    kv_idx = offs_n[None, :]
    if SCORE_MOD is not None:
        s = SCORE_MOD(qk * sm_scale, off_b, off_h, q_idx, kv_idx, mod_aux, mod_a0, mod_a1) * 1.4426950408889634
    else:  # nothing between the two scalings: one multiply a score
        s = qk * (sm_scale * 1.4426950408889634)
    if MASKED == 2:
        if part:
            s = tl.where(_keep(q_idx, kv_idx, off_b, off_h, n_k, mask_aux, mask_a0, mask_a1, CAUSAL, MASK_MOD), s,
                         float("-inf"))  # fmt: skip
    elif MASKED:
        s = tl.where(_keep(q_idx, kv_idx, off_b, off_h, n_k, mask_aux, mask_a0, mask_a1, CAUSAL, MASK_MOD), s,
                     float("-inf"))  # fmt: skip
    return s


@triton.jit
def _keep(q_idx, kv_idx, off_b, off_h, n_k, mask_aux, mask_a0, mask_a1, CAUSAL: tl.constexpr, MASK_MOD: tl.constexpr):
    keep = kv_idx < n_k
    if CAUSAL:
        keep = keep & (q_idx >= kv_idx)
    if MASK_MOD is not None:
        keep = keep & MASK_MOD(off_b, off_h, q_idx, kv_idx, mask_aux, mask_a0, mask_a1)
    return keep


@triton.jit
def _attention_inner_mod(
    acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d, n_k, sm_scale,
    lo, hi, idx_ptr, off_b, off_h, mod_aux, mod_a0, mod_a1, mask_aux, mask_a0, mask_a1, u_lo, rot, f_lo, f_hi,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr,
    EVEN_N: tl.constexpr, SCORE_MOD: tl.constexpr, MASK_MOD: tl.constexpr, INDEXED: tl.constexpr, STEP: tl.constexpr,
    REF: tl.constexpr, FIRST: tl.constexpr, BN_DIV: tl.constexpr, REVERSE: tl.constexpr = False,
):  # fmt: skip
    """:func:`_attention_inner` with a modification: key blocks ``[lo, hi)`` (``INDEXED``: entries
    ``[lo, hi)`` of the block mask's list ``idx_ptr``, key block numbers, each ``BN_DIV`` of the kernel's
    blocks: entry ``j // BN_DIV``, part ``j % BN_DIV``), the online softmax on
    :func:`_mod_scores`. No folded scale: the modification needs the scaled score before the exponential.
    ``REF`` (lesson 7's ``REF_MAX``): ``m_i`` is a fixed reference, no running max and no rescale; the
    tile's first block sets it (``FIRST``: 1 the block at key 0, 2 the first of ``[lo, hi)``, 0 none here).
    ``INDEXED == 2``: kernel blocks ``u_lo + (rot + j) % hi`` (a run of consecutive blocks entered at its first
    full one), ``MASKED == 2``: the element mask on those outside ``[f_lo, f_hi)`` only, decided per block.
    ``REVERSE`` (not ``INDEXED``; ``hi - lo`` a multiple of ``STEP``): the blocks from the last back to ``lo``."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for j in tl.range(lo, hi, STEP):
        part = True
        if INDEXED == 2:
            blk = u_lo + (rot + j) % hi
            part = (blk < f_lo) | (blk >= f_hi)
            start_n = blk * BLOCK_N
        elif INDEXED:
            start_n = tl.load(idx_ptr + j // BN_DIV) * (BLOCK_N * BN_DIV) + (j % BN_DIV) * BLOCK_N
        elif REVERSE:
            start_n = hi - STEP - (j - lo)
        else:
            start_n = j
        start_n = tl.multiple_of(start_n, BLOCK_N)
        offs_n = start_n + offs_n0
        k = _kv_tile(k_src, k_row, k_col, start_n, offs_n, stride_kn, offs_d, n_k, HEAD_DIM, MASKED > 0, EVEN_N, TMA,
                     False)  # fmt: skip
        qk = tl.dot(q, tl.trans(k))
        s = _mod_scores(qk, offs_m, offs_n, off_b, off_h, n_k, sm_scale, mod_aux, mod_a0, mod_a1, mask_aux,
                        mask_a0, mask_a1, part, MASKED, CAUSAL, SCORE_MOD, MASK_MOD)  # fmt: skip
        if REF:
            if FIRST == 1:
                if start_n == 0:
                    m_i = tl.max(s, 1)
            elif FIRST == 2:
                if j == lo:
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
        v = _kv_tile(v_src, v_row, v_col, start_n, offs_n, stride_vn, offs_d, n_k, HEAD_DIM, MASKED > 0, EVEN_N, TMA,
                     True)  # fmt: skip
        acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_i


@triton.jit
def _mod_pass(
    acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d, n_k, sm_scale,
    lo_mask, hi, idx, n_whole, n_part, bm_tn, off_b, off_h, mod_aux, mod_a0, mod_a1, mask_aux, mask_a0, mask_a1,
    HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, TMA: tl.constexpr, EVEN_N: tl.constexpr,
    SCORE_MOD: tl.constexpr, MASK_MOD: tl.constexpr, SPARSE: tl.constexpr, REF: tl.constexpr, BN_DIV: tl.constexpr,
    RISING: tl.constexpr = False,
):  # fmt: skip
    """Every key block of a Q tile, once. ``SPARSE`` (a block mask): the tile's full blocks with no element
    mask (1: through the list; 2: consecutive, as a range from the list's first), then its partial blocks
    through the mask function; an empty block is in neither list, so it is never loaded. 3: the visited
    blocks consecutive, one loop over them that starts at the first full block and comes round to the
    partial ones before it, the element mask on the partial blocks only (:data:`SPARSE_LOOP`). Without a
    block mask: lesson 7's split, ``[0, lo_mask)`` unmasked and ``[lo_mask, hi)`` masked; ``RISING`` with
    ``REF`` (a modification that only raises later keys' scores, :attr:`ScoreMod.rising`): the masked
    blocks first, online (they hold each row's last keys, where its max lies), then the unmasked ones from
    the last back against that max (or against the first block met, when nothing is masked)."""
    if SPARSE == 3:  # all visited blocks consecutive: one loop, entered at the first full block
        f_lo = tl.load(idx) * BN_DIV
        f_hi = f_lo + n_whole * BN_DIV
        if n_whole == 0:
            f_lo = tl.load(idx + bm_tn) * BN_DIV
            f_hi = f_lo
        u_lo = f_lo
        u_hi = f_hi
        if n_part > 0:
            u_lo = tl.minimum(u_lo, tl.load(idx + bm_tn) * BN_DIV)
            u_hi = tl.maximum(u_hi, (tl.load(idx + bm_tn + n_part - 1) + 1) * BN_DIV)
        acc, l_i, m_i = _attention_inner_mod(
            acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d, n_k,
            sm_scale, 0, u_hi - u_lo, None, off_b, off_h, mod_aux, mod_a0, mod_a1, mask_aux, mask_a0, mask_a1,
            u_lo, f_lo - u_lo, f_lo, f_hi, HEAD_DIM, BLOCK_N, 2, False, TMA, EVEN_N, SCORE_MOD, MASK_MOD, 2, 1, REF,
            2, 1,
        )  # fmt: skip
    elif SPARSE == 2:  # consecutive full blocks: a range of keys from the first, nothing loaded to find a block
        lo_full = tl.load(idx) * (BLOCK_N * BN_DIV)
        acc, l_i, m_i = _attention_inner_mod(
            acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d, n_k,
            sm_scale, lo_full, lo_full + n_whole * (BLOCK_N * BN_DIV), None, off_b, off_h, mod_aux, mod_a0, mod_a1,
            mask_aux, mask_a0, mask_a1, 0, 0, 0, 0, HEAD_DIM, BLOCK_N, 0, False, TMA, EVEN_N, SCORE_MOD, None, 0,
            BLOCK_N, REF, 2, 1,
        )  # fmt: skip
    elif SPARSE:
        acc, l_i, m_i = _attention_inner_mod(
            acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d, n_k,
            sm_scale, 0, n_whole * BN_DIV, idx, off_b, off_h, mod_aux, mod_a0, mod_a1, mask_aux, mask_a0, mask_a1,
            0, 0, 0, 0, HEAD_DIM, BLOCK_N, 0, False, TMA, EVEN_N, SCORE_MOD, None, 1, 1, REF, 2, BN_DIV,
        )  # fmt: skip
    if SPARSE == 1 or SPARSE == 2:
        acc, l_i, m_i = _attention_inner_mod(
            acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d, n_k,
            sm_scale, 0, n_part * BN_DIV, idx + bm_tn, off_b, off_h, mod_aux, mod_a0, mod_a1, mask_aux, mask_a0,
            mask_a1, 0, 0, 0, 0, HEAD_DIM, BLOCK_N, 1, False, TMA, EVEN_N, SCORE_MOD, MASK_MOD, 1, 1, REF, 0, BN_DIV,
        )  # fmt: skip
    elif not SPARSE:
        # lesson 7's order: the unmasked blocks, then the masked ones (FIRST 1: block 0 sets the reference).
        # RISING with REF: the masked blocks first, online (they hold each row's last keys, where its max
        # lies), then the unmasked ones from the last back against that max (FIRST 0), or against the first
        # block they meet when nothing is masked (FIRST 2)
        back: tl.constexpr = RISING and REF
        tail: tl.constexpr = CAUSAL or not EVEN_N
        first: tl.constexpr = (0 if tail else 2) if back else 1
        if back and tail:
            acc, l_i, m_i = _attention_inner_mod(
                acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d,
                n_k, sm_scale, lo_mask, hi, None, off_b, off_h, mod_aux, mod_a0, mod_a1, mask_aux, mask_a0, mask_a1,
                0, 0, 0, 0, HEAD_DIM, BLOCK_N, 1, CAUSAL, TMA, EVEN_N, SCORE_MOD, None, 0, BLOCK_N, False, 0, 1,
            )  # fmt: skip
        acc, l_i, m_i = _attention_inner_mod(
            acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d, n_k,
            sm_scale, 0, lo_mask, None, off_b, off_h, mod_aux, mod_a0, mod_a1, mask_aux, mask_a0, mask_a1,
            0, 0, 0, 0, HEAD_DIM, BLOCK_N, 0, CAUSAL, TMA, EVEN_N, SCORE_MOD, None, 0, BLOCK_N, REF, first, 1, back,
        )  # fmt: skip
        if tail and not back:
            acc, l_i, m_i = _attention_inner_mod(
                acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d,
                n_k, sm_scale, lo_mask, hi, None, off_b, off_h, mod_aux, mod_a0, mod_a1, mask_aux, mask_a0, mask_a1,
                0, 0, 0, 0, HEAD_DIM, BLOCK_N, 1, CAUSAL, TMA, EVEN_N, SCORE_MOD, None, 0, BLOCK_N, REF, 1, 1,
            )  # fmt: skip
    return acc, l_i, m_i


@triton.jit
def _attention_mod(
    acc, l_i, m_i, q, k_src, v_src, k_row, k_col, v_row, v_col, stride_kn, stride_vn, offs_m, offs_d, n_k, sm_scale,
    lo_mask, hi, pid_m, off_b, off_h, mod_aux, mod_a0, mod_a1, mask_aux, mask_a0, mask_a1,
    bm_num, bm_idx, bm_sb, bm_sh, bm_tn,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, TMA: tl.constexpr, EVEN_N: tl.constexpr, SCORE_MOD: tl.constexpr, MASK_MOD: tl.constexpr,
    SPARSE: tl.constexpr, BM_DIV: tl.constexpr, BN_DIV: tl.constexpr, REF: tl.constexpr, RISING: tl.constexpr = False,
):  # fmt: skip
    """A Q tile's key blocks with a modification (:func:`_mod_pass`). ``BM_DIV``: the block mask's Q tile
    holds that many of the kernel's (their lists are the mask tile's: a block full for it is full for
    each part, a partial one is masked element by element); ``BN_DIV``: its key block holds that many.
    ``REF``: first against a fixed reference max, the tile's first block's (a full block with a block
    mask: every row sees all of it, so the reference is finite; a tile with no full block takes the online
    loop); a row that overflows or sees no key sends the tile through the online loop from the start, as
    lesson 7's kernel does."""
    n_whole = 0
    n_part = 0
    idx = bm_idx
    if SPARSE:
        tile = off_b * bm_sb + off_h * bm_sh + pid_m // BM_DIV
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
                BN_DIV, RISING,
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
            BN_DIV,
        )  # fmt: skip
    return acc, l_i, m_i
