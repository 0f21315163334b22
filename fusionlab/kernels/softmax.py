"""Lesson 4: the row softmax — a reduction, so the whole row must be seen before any output is known.

``y[i, j] = exp(x[i, j] - m_i) / l_i``, ``m_i = max_j x[i, j]``, ``l_i = sum_j exp(x[i, j] - m_i)``,
over the last dimension of ``x`` (any leading shape). Subtracting the row maximum changes nothing
mathematically and keeps ``exp`` from overflowing (logits of 1e4 give ``exp(0) = 1`` at most).

Written in torch by hand (Triton's tutorial 02 counts it), softmax is five kernels: max, subtract,
exp, sum, divide — ``8MN + 4M`` elements through HBM for M rows of N. The fused kernel reads each row
once and writes it once, ``2MN``, *if the row fits on chip*: a row is a reduction's unit, and the
k-x rule of element-wise chains no longer applies. Two schedules:

- **one tile** (``SINGLE_TILE``, rows up to ``BLOCK_N`` wide): the row (or ``BLOCK_M`` short rows) is
  loaded once into registers; max, exp, sum and the scaling happen there; y is written once.
  Trips: read x, write y.
- **online softmax** (wider rows): one pass over the row's tiles keeps a running max ``m`` and a
  running sum ``l`` of ``exp(x - m)``; when a tile raises the max, the sum so far is rescaled by
  ``exp(m_old - m_new)`` (Milakov & Gimelshein 2018, "Online normalizer calculation for softmax").
  A second pass re-reads the row and writes ``exp(x - m) / l``. Trips: read x, **read x again**, write
  y — the ledger's re-read term. On a GPU the first pass loads with ``evict_last`` and the second
  with ``evict_first``: while the rows in flight fit in L2 the re-read is served from there, and the
  time approaches one trip's (``benchmarks/notes_softmax.md`` has where that stops). The same
  recurrence, run over blocks of keys, is the heart of FlashAttention (lesson 7):
  :func:`online_softmax_stats` exposes its ``(m, l)`` and :func:`online_softmax_reference_blocks`
  runs it in float64 torch, block by block.
- **split rows** (``SPLIT``, GPU forward, rows wider than one tile, or 16-bit rows of 16385-24576
  that would pad their one tile to 32768): the row's ``BLOCK_N``-element
  parts go to ``SPLIT`` programs, each holding its part in registers. Each finds its part's max and
  sum, publishes them to a small buffer, waits for the row's other parts (an atomic count), merges
  the statistics as the online softmax does and writes its part of y. Trips: read x, write y; the
  price is the wait. On an H200 this beat the online path by 8-18 points of copy bandwidth
  (``benchmarks/notes_softmax.md``). The interpreter runs programs one at a time, so there the wide
  rows take the online path. Contiguous rows that start off 16-byte boundaries (odd widths) split at
  the row's first boundary: the parts read a 16-byte body, part 0 the few elements at either end.

A one-tile row that fits three quarters of its power-of-two tile (10000 in 16384, 4097 in 8192) is held
as a head of half the tile and a tail (``TAIL_N``: 8192 + 2048, 4096 + 16), with half the warps: on
an H200 10000-wide rows went from 69% of copy to 94%. Packed rows off 16-byte boundaries can instead be
read as a 16-byte body and two fragments (``VEC``, opt-in: slower than the head and tail where
measured; ``benchmarks/notes_softmax.md``, tenth session).

Rows of a multiple of 16 bytes but not of 16 elements (17000 in bf16, 1000 in fp32) are passed to the
kernels with lengths and strides divided by the 16-byte unit (``UNIT``), which the kernels multiply
back: Triton tells its compiler only about multiples of 16, and without this the rows move 2 bytes at a
time.

Backward (one kernel, from the saved y): ``dx = y * (dy - sum_j(dy * y))``. Trips: read y, dy; write
dx (rows wider than its one-tile limit: y and dy are read twice, the second time with L2 hints).

Numerics, as torch: fp32 arithmetic whatever the storage; masked lanes load as ``-inf`` (they add
``exp(-inf) = 0``); a row that is entirely ``-inf`` gives NaN (``-inf - (-inf)``), as ``torch.softmax``
does; a row holding ``+inf`` or NaN gives NaN throughout. The online recurrence guards the one case
where it would differ from the one-tile path: while a row has seen only ``-inf`` its running max is
``-inf`` and ``exp(-inf - (-inf))`` would poison the sum, so it rescales against 0 until a finite
value arrives.

Layout: the last dimension must have stride 1; the leading dimensions may be strided (their rows
are found through up to two strides, so ``x[:, ::2]``, ``x.transpose(0, 1)`` of a 3-D tensor or a
slice of a wider buffer are read in place). Row offsets are int64: rows x width past 2**31 works.

Reference: Triton tutorial 02 (fused softmax); Liger-Kernel ``ops/softmax.py``; Milakov &
Gimelshein (2018); Dao et al., FlashAttention (2022), section 3.1.
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
from ..ledger import Ledger
from ._launch import (
    DEFAULT_SMS,
    INT32_LIMIT,
    MAX_TILE,
    KernelInputError,
    cdiv,
    check_block,
    check_tensor,
    check_tile,
    element_size,
    head_and_tail,
    launch_kwargs,
    next_pow2,
    row_config,
    sm_count,
    tail_warps,
)
from ._tensors import upstream_grad
from .rmsnorm import _row_offsets

OP = "softmax"

# -- launch configuration --------------------------------------------------------------------------
#: GPU tuning (benchmarks/bench_softmax.py; the sweeps are in benchmarks/notes_softmax.md), in elements
#: unless named: ``max_single``: the widest row held in one tile (wider rows take the online path);
#: ``wide_block``: the online path's tile; ``tile``: elements a program takes when rows are narrow
#: (BLOCK_M rows of BLOCK_N); ``thread_bytes``: bytes of row a thread holds (sets num_warps, up to 32);
#: ``l2_hints``: the online path's first pass loads with evict_last and its second with evict_first,
#: so the re-read finds the row in L2 when the rows in flight fit there.
#: ``big_row``: from this width a one-tile row is held 64 bytes a thread (fewer warps) and, past it,
#: walked by persistent programs (``per_sm`` a SM, the next row's loads ``row_stages`` deep in
#: flight). On an H200 a 32768-wide bf16 row went from 73% to 89% of copy that way, 16384 from 87-89%
#: to 92%; on an H100 both were within 2% of the plain schedule (notes_softmax.md, 2026-11-24).
#: ``partial_warps_div``: a persistent row narrower than its tile (26000-32760 of 32768) takes this
#: fraction of the warps (16, 128 bytes a thread): H200, 4096 rows, bf16, lesson 4's clock, 26000
#: 69.4% -> 72.3% of copy, 28000 73.3% -> 77.1%, 32000 82.8% -> 87.6%; H100 86.1-91.2% -> 86.1-91.7%
#: (on the GPU's own clock the H100 lost 2-3 points at 26000-28000). A full tile keeps 32 warps (16:
#: 1-2 points slower). probe_softmax_warps.py --widths, notes_softmax.md nineteenth session.
#: ``small_rows``: 16-bit rows of these tile widths take ``small_tile`` elements a program, 64 bytes a
#: thread (2 warps): on an H200 1024-wide rows went from 85% to 97% of copy, on an H100 98% either way.
#: ``split``: rows wider than ``max_single`` are split across programs, ``split_bytes`` of row each
#: (``split_thread_bytes`` a thread), which swap their (max, sum) and write their part: read once, not
#: twice (up to ``max_split`` programs a row; wider rows take the online path). On an H200 a 65536-wide
#: bf16 row went from 70% to 79% of copy by two trips, 262144 from 59% to 77%; on an H100 a tie at 65536,
#: 67% to 89% at 262144 (notes_softmax.md).
#: ``tail_from``: a one-tile row wider than this tile (not persistent) that fits three quarters of its
#: tile is held as a head of half the tile and a tail (10000: 8192 + 2048 lanes in place of 16384),
#: with ``1 / tail_warps_div`` of the warps. H200, bf16, share of copy: 3000 87% -> 95%, 6144 82% ->
#: 95%, 10000 69% -> 94%, 12288 77% -> 93%, 4097 36% -> 80% (notes_softmax.md tenth session).
GPU_TUNING = {
    "forward": {
        "max_single": 32768,
        "wide_block": 32768,
        "tile": 4096,
        "thread_bytes": 32,
        "l2_hints": True,
        "big_row": 16384,
        "per_sm": 2,
        "row_stages": 3,
        "partial_warps_div": 2,
        "stage_bytes": 196608,  # shared memory the row pipeline may take (of an SM's 227 KiB)
        "small_rows": (512, 1024),
        "small_tile": 2048,
        "split": True,
        "split_bytes": 16384,
        "split_thread_bytes": 128,
        "max_split": 64,
        "tail_from": 2048,
        "tail_warps_div": 2,
    },
    "backward": {"max_single": 16384, "wide_block": 32768, "tile": 4096, "thread_bytes": 32, "l2_hints": True},
}
#: the interpreter: each program costs milliseconds of Python, so tiles are large (64 Ki elements),
#: and rows past 4096 elements take the online path (a tile is a numpy array there, not registers)
INTERPRETER_TUNING = {
    "max_single": 4096,
    "wide_block": 4096,
    "tile": 65536,
    "thread_bytes": 64,
    "l2_hints": False,
    "tail_from": 2048,
}


@functools.lru_cache(maxsize=4096)
def _config(
    n_rows: int,
    n_cols: int,
    max_single: int,
    wide_block: int,
    tile: int,
    thread_bytes: int,
    gpu: bool,
    dtype: torch.dtype = torch.float32,
    l2_hints: bool = False,
) -> dict:
    # the row tile from the shared helper: one tile up to max_single columns, else wide_block tiles
    single = row_config(n_cols, dtype, max_block=max_single, gpu=gpu)
    if single["SINGLE_TILE"]:
        block_n, single_tile = single["BLOCK_N"], True
    else:
        block_n, single_tile = row_config(n_cols, dtype, max_block=wide_block, gpu=gpu)["BLOCK_N"], False
    # narrow rows: several rows a program, so each program still moves a useful amount
    block_m = max(1, min(tile // block_n, next_pow2(max(n_rows, 1))))
    per_thread = max(1, thread_bytes // element_size(dtype))
    num_warps = max(1, min(32, next_pow2(block_m * block_n // per_thread) // 32)) if gpu else 4
    cfg = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": num_warps, "SINGLE_TILE": single_tile}
    if l2_hints and gpu and not single_tile:
        cfg.update(EVICT_1="evict_last", EVICT_2="evict_first")
    return cfg


def softmax_config(
    n_rows: int,
    n_cols: int,
    dtype: torch.dtype,
    *,
    backward: bool = False,
    gpu: bool | None = None,
    split: bool = True,
    packed: bool = True,
    fragments: bool = False,
) -> dict:
    """The launch configuration: ``{"BLOCK_M", "BLOCK_N", "num_warps", "SINGLE_TILE"}`` (and, for the
    online path on a GPU, the eviction hints ``EVICT_1``/``EVICT_2`` of its two passes; for a row that
    fits three quarters of its one tile, ``TAIL_N``: a head of half the tile and a tail).

    ``SINGLE_TILE``: the row fits one ``BLOCK_N`` tile and is read once; otherwise the online path
    walks it in ``BLOCK_N`` tiles and reads it twice, or (``SPLIT``, GPU forward) ``SPLIT`` programs
    hold ``BLOCK_N`` elements of the row each and swap their statistics: read once. ``BLOCK_M`` rows
    share a program when rows are narrow. ``gpu``: the GPU's configuration (default: this mode's), so
    a lesson on a CPU can ask what the GPU kernel does. ``split=False``: never ``SPLIT`` (wide rows
    take the online path). ``fragments`` (opt-in) with ``packed`` (x's rows lie end to end from a
    16-byte boundary, as a fresh tensor's do): a forward row whose width is not a multiple of 16 bytes
    is read as a 16-byte body and two fragments (``VEC``) where that halves its tile
    (:data:`FRAGMENT_MIN`). By default such a row takes a head and a tail (``TAIL_N``) instead.
    Tuned on an H100 (``benchmarks/notes_softmax.md``).
    """
    gpu = runtime.is_gpu() if gpu is None else gpu
    t = GPU_TUNING["backward" if backward else "forward"] if gpu else INTERPRETER_TUNING
    tile, thread_bytes = t["tile"], t["thread_bytes"]
    vec = 16 // element_size(dtype)
    n_tile = n_cols - n_cols % vec  # with fragments, the one tile holds the body
    fragments = bool(fragments and packed and not backward and vec > 1 and n_cols % vec and FRAGMENT_MIN <= n_cols)
    widest = t["big_row"] // 2 if t.get("big_row") else t["max_single"]  # wider: the split reads faster
    fragments = fragments and next_pow2(n_tile) < next_pow2(n_cols) and next_pow2(n_tile) <= widest
    n_tile = n_tile if fragments else n_cols
    width = next_pow2(max(int(n_tile), 1))  # the one tile's width, for rows that fit one
    big = t.get("big_row")
    if element_size(dtype) == 2 and width in t.get("small_rows", ()):  # measured: bf16
        tile, thread_bytes = t["small_tile"], 2 * thread_bytes
    elif big and big <= width <= t["max_single"]:  # a wide row in one tile: 64 bytes a thread, half the warps
        thread_bytes = 2 * thread_bytes
    cfg = _config(
        int(n_rows),
        int(n_tile),
        t["max_single"],
        t["wide_block"],
        tile,
        thread_bytes,
        bool(gpu),
        dtype,
        t["l2_hints"],
    )
    cfg = dict(cfg)
    staged = cfg["BLOCK_M"] * cfg["BLOCK_N"] * element_size(dtype) * t.get("row_stages", 0)
    if big and cfg["SINGLE_TILE"] and cfg["BLOCK_N"] > big and staged <= t["stage_bytes"]:
        # past big_row: persistent programs whose loop loads the next row while this one reduces (sms
        # from this GPU, or an H100's when a CPU asks what the GPU does); bf16/fp16 only, since an fp32
        # row of 32768 would need 384 KiB of stages (OutOfResources) and keeps one program a row
        sms = sm_count() if runtime.is_gpu() else DEFAULT_SMS
        cfg.update(programs=t["per_sm"] * sms, row_stages=t["row_stages"])
        if int(n_cols) < cfg["BLOCK_N"] and t.get("partial_warps_div"):  # the row does not fill its tile
            cfg["num_warps"] = max(1, cfg["num_warps"] // t["partial_warps_div"])
        if split and t.get("split"):
            cfg = _padded_row_split(int(n_cols), dtype, t, cfg)
    if split and t.get("split") and not cfg["SINGLE_TILE"] and not cfg.get("SPLIT"):
        chunk = t["split_bytes"] // element_size(dtype)
        parts = cdiv(int(n_cols), chunk)
        if parts <= t["max_split"] and int(n_rows) * parts < INT32_LIMIT:
            warps = max(1, min(32, t["split_bytes"] // t["split_thread_bytes"] // 32))
            cfg = {"BLOCK_M": 1, "BLOCK_N": chunk, "num_warps": warps, "SINGLE_TILE": False, "SPLIT": parts}
    if fragments and cfg["SINGLE_TILE"]:
        cfg["VEC"] = vec
    tail = t.get("tail_from") if not backward else None  # the backward kernel holds one tile
    if tail and cfg["SINGLE_TILE"] and not fragments and not cfg.get("programs") and tail < cfg["BLOCK_N"]:
        split_tile = head_and_tail(int(n_cols), cfg["BLOCK_N"])
        if split_tile:
            cfg.update(BLOCK_N=split_tile[0], TAIL_N=split_tile[1])
            if t.get("tail_warps_div"):
                warps = max(1, cfg["num_warps"] // t["tail_warps_div"])
                cfg["num_warps"] = tail_warps(warps, *split_tile, dtype)
    return cfg


#: Opt-in (``softmax_config(..., fragments=True)``): packed rows whose width is not a multiple of 16
#: bytes and just past a power of two (2049-2055, 4097-4103, 8193-8199 in bf16, from this width up) read
#: as a 16-byte body and two fragments (``VEC``), the tile the body's. On an H100 4097 went from 49% of
#: copy (one tile of 8192) to 70-80%; where the body's tile is the row's own (1001, 5001, 8191) the
#: fragments lost to 2-byte accesses (ncu: 86 registers a thread against 63). Not the default: on an
#: H200 a head and a tail (``TAIL_N``, 2-byte accesses) read 2049, 4097 and 8193 at 82%, 80% and 78%
#: against the fragments' 45%, 53% and 34% (probe_softmax_widths.py, notes_softmax.md tenth session).
FRAGMENT_MIN = 2049


#: a persistent one-tile row pads its tile to the next power of two, and its time follows the tile, not
#: the row: 16-bit rows of 20000 and 24576 ran at 60% and 70% of copy on an H200 where 32768 ran at
#: 88%. Split into parts of split_bytes or half that, they ran at 78% and 83% (probe_softmax_rounds.py,
#: notes_softmax.md ninth session). The split takes a row whose parts fill their tiles by at least
#: this much more than the one tile does (a rule from those widths, not a sweep of every width).
SPLIT_FILL_GAIN = 0.15


def _padded_row_split(n_cols: int, dtype: torch.dtype, t: dict, cfg: dict) -> dict:
    """``cfg`` (a persistent one-tile row), or the split schedule when its parts pad much less."""

    def fill(tile: int) -> float:
        return n_cols / (cdiv(n_cols, tile) * tile)

    big = t["split_bytes"] // element_size(dtype)
    part = max((big, big // 2), key=fill)  # the larger part on a tie
    if fill(part) - fill(cfg["BLOCK_N"]) < SPLIT_FILL_GAIN or cdiv(n_cols, part) > t["max_split"]:
        return cfg
    return {"BLOCK_M": 1, "BLOCK_N": part, "num_warps": 4, "SINGLE_TILE": False, "SPLIT": cdiv(n_cols, part)}


# -- the reference, the baseline, the ledger ---------------------------------------------------------
@answer_key
def softmax_reference(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """The spec: ``torch.softmax`` evaluated in fp32 (float64 stays float64), returned in ``x.dtype``."""
    return torch.softmax(x.to(torch.promote_types(x.dtype, torch.float32)), dim).to(x.dtype)


def softmax_eager(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """What eager PyTorch runs: ``torch.softmax(x, dim)`` — itself one fused kernel (read x, write y;
    for very wide rows PyTorch's kernel re-reads the row too)."""
    return torch.softmax(x, dim)


@answer_key
def softmax_ledger(rows: int, n: int, dtype, block: int | None = None, *, backward: bool = False) -> Ledger:
    """Softmax of ``rows`` rows of ``n``, trip by trip, as five torch ops written by hand.

    Forward (Triton tutorial 02's ``naive_softmax``): ``m = x.max(-1)`` (read x, write m),
    ``z = x - m`` (read x, m; write z), ``e = exp(z)``, ``s = e.sum(-1)``, ``y = e / s``:
    ``8 rows n + 4 rows`` elements. Fused: read x, write y (2 rows n). When the row is wider than one
    tile (``n > block``) the fused kernel is the online softmax and reads x a second time (the
    re-read term: 3 rows n). ``block``: the widest row held on chip; default: what this mode's
    launcher does (``softmax_config(...)["SINGLE_TILE"]``; pass ``gpu=True``'s ``BLOCK_N`` to count
    the GPU kernel). ``torch.softmax`` is itself one fused kernel, so eager PyTorch moves the fused
    total, not the five-op one.

    ``backward=True``: ``dx = y * (dy - sum(dy * y))`` by hand: ``t = dy * y``, ``s = t.sum(-1)``,
    ``u = dy - s``, ``dx = y * u``; fused: read y, dy, write dx (wide rows: y and dy read twice).
    """
    rows, n = int(rows), int(n)
    if block is None:
        cfg = softmax_config(rows, n, dtype, backward=backward)
        wide = not (cfg["SINGLE_TILE"] or cfg.get("SPLIT"))
    else:
        wide = n > int(block)
    mn = rows * n
    if not backward:
        led = Ledger(dtype_bytes=dtype, rereads={"x": mn} if wide else {})
        led.op("max", reads={"x": mn}, writes={"m": rows})
        led.op("sub", reads={"x": mn, "m": rows}, writes={"z": mn})
        led.op("exp", reads={"z": mn}, writes={"e": mn})
        led.op("sum", reads={"e": mn}, writes={"s": rows})
        led.op("div", reads={"e": mn, "s": rows}, writes={"y": mn})
    else:
        led = Ledger(dtype_bytes=dtype, rereads={"y": mn, "dy": mn} if wide else {})
        led.op("mul", reads={"dy": mn, "y": mn}, writes={"t": mn})
        led.op("sum", reads={"t": mn}, writes={"s": rows})
        led.op("sub", reads={"dy": mn, "s": rows}, writes={"u": mn})
        led.op("mul", reads={"y": mn, "u": mn}, writes={"dx": mn})
    return led


def softmax_flops(rows: int, n: int, *, backward: bool = False) -> int:
    """Nominal FLOPs: forward 5 per element (max, subtract, exp, sum, scale); backward 4 (multiply,
    sum, subtract, multiply)."""
    return (4 if backward else 5) * int(rows) * int(n)


# -- the kernels -------------------------------------------------------------------------------------
@triton.jit
def _load_tile(ptrs, col_ok, OTHER: tl.constexpr, EVEN_N: tl.constexpr, EVICT: tl.constexpr):
    # EVEN_N: the tiles divide the row, so no column mask at all (checked on the host); rows need
    # none either, since rows past the end re-read the last row
    if EVEN_N:
        t = tl.load(ptrs, eviction_policy=EVICT)
    else:
        t = tl.load(ptrs, mask=col_ok[None, :], other=OTHER, eviction_policy=EVICT)
    return t.to(tl.float32)  # fp32 arithmetic whatever the storage


@triton.jit
def _store_tile(ptrs, val, row_ok, col_ok, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr):
    val = val.to(ptrs.dtype.element_ty)
    if EVEN_M and EVEN_N:
        tl.store(ptrs, val)
    elif EVEN_N:
        tl.store(ptrs, val, mask=row_ok[:, None])
    elif EVEN_M:
        tl.store(ptrs, val, mask=col_ok[None, :])
    else:
        tl.store(ptrs, val, mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _row_ptrs(base, rows, n_rows, n_inner, stride_b, stride_m, TWO_LEVEL: tl.constexpr):
    # rows past the end re-read the last row instead of masking it: no row of -inf lanes, no NaN
    # computed for nothing, and a load mask only along the columns
    return base + _row_offsets(tl.minimum(rows, n_rows - 1), n_inner, stride_b, stride_m, TWO_LEVEL)


@triton.jit
def _fragments(rows, n_rows, n_cols, VEC: tl.constexpr):
    """Rows packed end to end (x and y contiguous, from 16-byte boundaries: the launcher checks) whose
    width is not a multiple of VEC elements, so most rows start off a 16-byte boundary and Triton would
    move them 2 bytes at a time. Each row is read as a body from its first boundary, a multiple of VEC
    long (16-byte accesses), and two fragments of fewer than VEC elements before and after it, in one
    (BLOCK_M, 2 VEC) tile. Returns the rows' starts, their bodies' starts (multiples of VEC) and
    lengths, and the fragments' columns and mask. The body is at most n_cols - n_cols % VEC long, so a
    row of 4097 fits a 4096-element tile."""
    start = tl.minimum(rows, n_rows - 1) * n_cols  # rows past the end re-read the last, as _row_ptrs
    lo = tl.minimum((VEC - start % VEC) % VEC, n_cols)  # elements before the first boundary
    body_len = (n_cols - lo) // VEC * VEC
    lane = tl.arange(0, 2 * VEC)[None, :]
    col_f = tl.where(lane >= VEC, (lo + body_len)[:, None] + lane - VEC, lane)
    f_ok = tl.where(lane >= VEC, col_f < n_cols, lane < lo[:, None])
    return start, tl.multiple_of(start + lo, VEC), body_len, col_f, f_ok


@triton.jit
def _nan_max(m, l):
    """The row max as torch's ``amax`` gives it: NaN when the row holds a NaN. Triton's max drops a NaN
    (``fmax``), but the NaN reaches l through exp, so a NaN l with a max below +inf (+inf alone also
    makes l NaN: exp(inf - inf)) marks the row; a row with both +inf and NaN keeps +inf. One select a
    row when the stats are written: the loop's max stays the one-instruction fmax."""
    return tl.where((l != l) & (m < float("inf")), l, m)


@triton.jit
def _softmax_kernel(
    x_ptr,
    y_ptr,
    m_ptr,
    l_ptr,
    n_rows,
    n_cols,
    n_inner,
    stride_xb,
    stride_xm,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SINGLE_TILE: tl.constexpr,
    TWO_LEVEL: tl.constexpr,
    WRITE_Y: tl.constexpr,
    WRITE_STATS: tl.constexpr,
    EVEN_M: tl.constexpr = False,
    EVEN_N: tl.constexpr = False,
    EVICT_1: tl.constexpr = "",
    EVICT_2: tl.constexpr = "",
    ROW_STAGES: tl.constexpr = 1,
    UNIT: tl.constexpr = 1,
    VEC: tl.constexpr = 1,
    TAIL_N: tl.constexpr = 0,
):
    # one program per BLOCK_M rows (or, persistent, per BLOCK_M rows at a time: see the one-tile path);
    # row numbers fit int32 (the launcher checks), rows * stride may not: int64 offsets
    if UNIT > 1:  # lengths and strides came divided by UNIT (see _unit): 16-byte rows, known as such
        n_cols = n_cols * UNIT
        stride_xb = stride_xb * UNIT
        stride_xm = stride_xm * UNIT
        stride_ym = stride_ym * UNIT
    pid = tl.program_id(axis=0)
    offs_n = tl.arange(0, BLOCK_N)
    if SINGLE_TILE:  # the row is on chip: one read, one write
        # program pid takes row blocks pid, pid + P, pid + 2P, ... for P programs launched. The launcher
        # starts one program a block (one trip round this loop) unless tuned persistent: then P is a
        # few per SM and, with ROW_STAGES > 1, tl.range pipelines the loop, so the next block's loads
        # are in flight (through shared memory) while this block reduces and writes
        col_ok = offs_n < n_cols
        if TAIL_N > 0:  # the row's columns past the head (softmax_config's "tail")
            offs_t = BLOCK_N + tl.arange(0, TAIL_N)
            tail_ok = offs_t < n_cols
        for blk in tl.range(pid, tl.cdiv(n_rows, BLOCK_M), tl.num_programs(0), num_stages=ROW_STAGES):
            rows = (blk * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # (BLOCK_M,)
            row_ok = rows < n_rows
            if VEC > 1:  # rows off 16-byte boundaries: a body of 16-byte accesses and two fragments
                start, body, body_len, col_f, f_ok = _fragments(rows, n_rows, n_cols, VEC)
                x_body = (x_ptr + body)[:, None] + offs_n[None, :]
                body_ok = offs_n[None, :] < body_len[:, None]
                x = tl.load(x_body, mask=body_ok, other=float("-inf"), eviction_policy=EVICT_1).to(tl.float32)
                x_f = tl.load((x_ptr + start)[:, None] + col_f, mask=f_ok, other=float("-inf")).to(tl.float32)
            elif TAIL_N > 0:  # a head of BLOCK_N (inside every row: no column mask) and a tail
                x_rows = _row_ptrs(x_ptr, rows, n_rows, n_inner, stride_xb, stride_xm, TWO_LEVEL)
                x = _load_tile(x_rows[:, None] + offs_n[None, :], col_ok, float("-inf"), True, EVICT_1)
                x_t = _load_tile(x_rows[:, None] + offs_t[None, :], tail_ok, float("-inf"), False, EVICT_1)
            else:
                x_rows = _row_ptrs(x_ptr, rows, n_rows, n_inner, stride_xb, stride_xm, TWO_LEVEL)
                x = _load_tile(x_rows[:, None] + offs_n[None, :], col_ok, float("-inf"), EVEN_N, EVICT_1)
            m = tl.max(x, axis=1)
            if VEC > 1:
                m = tl.maximum(m, tl.max(x_f, axis=1))
            if TAIL_N > 0:
                m = tl.maximum(m, tl.max(x_t, axis=1))
            e = tl.exp(x - m[:, None])  # masked lanes: exp(-inf) = 0; an all -inf row: NaN, as torch
            l = tl.sum(e, axis=1)
            if VEC > 1:
                e_f = tl.exp(x_f - m[:, None])
                l += tl.sum(e_f, axis=1)
            if TAIL_N > 0:
                e_t = tl.exp(x_t - m[:, None])
                l += tl.sum(e_t, axis=1)
            if WRITE_Y:
                # one reciprocal a row, then a multiply per element (a division per element costs
                # several instructions; the product is within an ulp of it)
                inv_l = (1.0 / l)[:, None]
                y = e * inv_l
                if VEC > 1:  # y's rows start where x's do
                    out_ty = y_ptr.dtype.element_ty
                    body_ok = row_ok[:, None] & (offs_n[None, :] < body_len[:, None])
                    tl.store((y_ptr + body)[:, None] + offs_n[None, :], y.to(out_ty), mask=body_ok)
                    tl.store((y_ptr + start)[:, None] + col_f, (e_f * inv_l).to(out_ty), mask=row_ok[:, None] & f_ok)
                elif TAIL_N > 0:
                    y_rows = y_ptr + rows[:, None] * stride_ym
                    _store_tile(y_rows + offs_n[None, :], y, row_ok, col_ok, EVEN_M, True)
                    _store_tile(y_rows + offs_t[None, :], e_t * inv_l, row_ok, tail_ok, EVEN_M, False)
                else:
                    y_ptrs = y_ptr + rows[:, None] * stride_ym + offs_n[None, :]
                    _store_tile(y_ptrs, y, row_ok, col_ok, EVEN_M, EVEN_N)
            if WRITE_STATS:
                tl.store(m_ptr + rows, _nan_max(m, l), mask=row_ok)
                tl.store(l_ptr + rows, l, mask=row_ok)
    else:  # online softmax: pass 1 finds (m, l) in one sweep, pass 2 re-reads x and writes y
        rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # (BLOCK_M,)
        row_ok = rows < n_rows
        x_rows = _row_ptrs(x_ptr, rows, n_rows, n_inner, stride_xb, stride_xm, TWO_LEVEL)
        y_rows = y_ptr + rows * stride_ym
        m = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_M], tl.float32)
        for start in tl.range(0, n_cols, BLOCK_N):
            offs = start + offs_n
            x = _load_tile(x_rows[:, None] + offs[None, :], offs < n_cols, float("-inf"), EVEN_N, EVICT_1)
            m_new = tl.maximum(m, tl.max(x, axis=1))
            # a row that has seen only -inf keeps m = -inf; rescaling against it would compute
            # exp(-inf - (-inf)) = NaN, so measure against 0 until a finite value arrives
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            l = l * tl.exp(m - m_ref) + tl.sum(tl.exp(x - m_ref[:, None]), axis=1)
            m = m_new
        if WRITE_Y:
            inv_l = 1.0 / l
            for start in tl.range(0, n_cols, BLOCK_N):
                offs = start + offs_n
                col_ok = offs < n_cols
                x = _load_tile(x_rows[:, None] + offs[None, :], col_ok, float("-inf"), EVEN_N, EVICT_2)
                y = tl.exp(x - m[:, None]) * inv_l[:, None]
                _store_tile(y_rows[:, None] + offs[None, :], y, row_ok, col_ok, EVEN_M, EVEN_N)
        if WRITE_STATS:
            tl.store(m_ptr + rows, _nan_max(m, l), mask=row_ok)
            tl.store(l_ptr + rows, l, mask=row_ok)


@triton.jit
def _split_ticket(sync_ptr, SPLIT: tl.constexpr):
    """(row, part) of a program of a split row, from the atomic ticket at ``sync_ptr[0]`` (see
    :func:`_softmax_split_kernel` for why not the program id)."""
    ticket = tl.atomic_add(sync_ptr, 1, sem="relaxed")
    return (ticket // SPLIT).to(tl.int64), ticket % SPLIT


@triton.jit
def _split_wait(sync_ptr, row, SPLIT: tl.constexpr):
    """Count this part of ``row`` as published (its stores done: a barrier first, then the count with
    release semantics) and wait until all SPLIT parts are; then their stores are visible (acquire)."""
    tl.debug_barrier()
    count = sync_ptr + 1 + row
    arrived = tl.atomic_add(count, 1, sem="acq_rel") + 1
    while arrived < SPLIT:
        arrived = tl.atomic_add(count, 0, sem="acquire")  # a read with acquire semantics


@triton.jit
def _split_merge(parts, SPLIT: tl.constexpr, SPLIT_P2: tl.constexpr):
    """The row's (max, sum of exp(x - max)) from its parts' pairs at ``parts[:SPLIT]`` (maxima) and
    ``parts[SPLIT:2 SPLIT]`` (sums), merged as the online softmax merges tiles. The max is 0 for a row
    of only -inf (its sum is then 0)."""
    p = tl.arange(0, SPLIT_P2)
    m_all = tl.load(parts + p, mask=p < SPLIT, other=float("-inf"), volatile=True)
    d_all = tl.load(parts + SPLIT + p, mask=p < SPLIT, other=0.0, volatile=True)
    big = tl.max(m_all, axis=0)
    big = tl.where(big == float("-inf"), 0.0, big)
    return big, tl.sum(d_all * tl.exp(m_all - big), axis=0)


@triton.jit
def _softmax_split_kernel(
    x_ptr,
    y_ptr,
    sync_ptr,
    part_ptr,
    n_cols,
    n_inner,
    stride_xb,
    stride_xm,
    stride_ym,
    SPLIT: tl.constexpr,
    SPLIT_P2: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TWO_LEVEL: tl.constexpr,
    EVEN_N: tl.constexpr = False,
    UNIT: tl.constexpr = 1,
    VEC: tl.constexpr = 1,
):
    # A row too wide for one program's registers, held by SPLIT programs instead: each loads its
    # BLOCK_N elements once, finds their max m and sum d of exp(x - m), publishes (m, d), waits for
    # the row's other parts, combines them (the online softmax's merge) and writes its part of y from
    # registers. Trips: read x, write y — no re-read. GPU only: the interpreter runs programs one at a
    # time, so the first would wait for ever.
    #
    # Why the wait cannot hang: a program takes its (row, part) from an atomic ticket (sync_ptr[0],
    # zeroed by the launcher), not from its program id. A program holding ticket t is running, and it
    # waits only for tickets of its own row, which are taken by programs already running or by the
    # next ones to start. The GPU holds far more than SPLIT (at most 64) of these programs at once,
    # so those start, whatever order the hardware starts programs in.
    if UNIT > 1:  # as in _softmax_kernel
        n_cols = n_cols * UNIT
        stride_xb = stride_xb * UNIT
        stride_xm = stride_xm * UNIT
        stride_ym = stride_ym * UNIT
    row, part = _split_ticket(sync_ptr, SPLIT)
    offs = part * BLOCK_N + tl.arange(0, BLOCK_N)
    start = _row_offsets(row, n_inner, stride_xb, stride_xm, TWO_LEVEL)
    if VEC > 1:
        # Rows that do not start on 16-byte boundaries (an odd width, contiguous: x and y rows start
        # at the same offsets; the launcher sees to it): the parts cover a body from the row's first
        # boundary, a multiple of VEC long, so that every access is 16 bytes; the fewer than VEC
        # elements before it and after it go to part 0, in one tile of 2 VEC lanes (cross-entropy's
        # kernel does the same).
        lo = tl.minimum(((VEC - start % VEC) % VEC).to(tl.int32), n_cols)
        body_len = ((n_cols - lo) // VEC) * VEC
        start_body = tl.multiple_of(start + lo, VEC)
        lane = tl.arange(0, 2 * VEC)
        hi = lane >= VEC
        col_f = tl.where(hi, lo + body_len + lane - VEC, lane)
        mask_f = tl.where(hi, col_f < n_cols, lane < lo) & (part == 0)
        x_f = tl.load(x_ptr + start + col_f, mask=mask_f, other=float("-inf")).to(tl.float32)
    else:
        body_len = n_cols
        start_body = start
    col_ok = offs < body_len
    x_row = x_ptr + start_body
    if EVEN_N:
        x = tl.load(x_row + offs).to(tl.float32)
    else:
        x = tl.load(x_row + offs, mask=col_ok, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    if VEC > 1:
        m = tl.maximum(m, tl.max(x_f, axis=0))
    ref = tl.where(m == float("-inf"), 0.0, m)  # a part of only -inf: d = 0, not exp(-inf - -inf)
    e = tl.exp(x - ref)
    d = tl.sum(e, axis=0)
    if VEC > 1:
        e_f = tl.exp(x_f - ref)
        d += tl.sum(e_f, axis=0)
    # publish (m, d): the stores, then a barrier (every thread's store is done), then the count with
    # release semantics; the last of the row's parts to count sees SPLIT at once, the others wait
    parts = part_ptr + row * (2 * SPLIT)
    tl.store(parts + part, m)
    tl.store(parts + SPLIT + part, d)
    _split_wait(sync_ptr, row, SPLIT)
    big, l = _split_merge(parts, SPLIT, SPLIT_P2)  # an all -inf row: l = 0, y = 0 * (1 / 0): NaN, as torch
    scale = tl.exp(ref - big) / l
    y = e * scale
    if VEC > 1:
        y_row = y_ptr + row * stride_ym  # the same offsets as x's rows (contiguous)
        tl.store(y_row + col_f, (e_f * scale).to(y_ptr.dtype.element_ty), mask=mask_f)
        y_ptrs = y_ptr + tl.multiple_of(row * stride_ym + lo, VEC) + offs
    else:
        y_ptrs = y_ptr + row * stride_ym + offs
    if EVEN_N:
        tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty))
    else:
        tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=col_ok)


@triton.jit
def _softmax_bwd_kernel(
    y_ptr,
    dy_ptr,
    dx_ptr,
    n_rows,
    n_cols,
    n_inner,
    stride_ym,
    stride_dyb,
    stride_dym,
    stride_dxm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SINGLE_TILE: tl.constexpr,
    TWO_LEVEL: tl.constexpr,
    EVEN_M: tl.constexpr = False,
    EVEN_N: tl.constexpr = False,
    EVICT_1: tl.constexpr = "",
    EVICT_2: tl.constexpr = "",
    UNIT: tl.constexpr = 1,
):
    # dx = y * (dy - sum(dy * y)): a row's dot product first, then one element-wise pass
    if UNIT > 1:  # as in _softmax_kernel
        n_cols = n_cols * UNIT
        stride_ym = stride_ym * UNIT
        stride_dyb = stride_dyb * UNIT
        stride_dym = stride_dym * UNIT
        stride_dxm = stride_dxm * UNIT
    pid = tl.program_id(axis=0)
    rows = (pid * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)  # (BLOCK_M,)
    row_ok = rows < n_rows
    y_rows = y_ptr + tl.minimum(rows, n_rows - 1) * stride_ym
    # the incoming gradient may be strided (y and dx are the kernels' own)
    dy_rows = _row_ptrs(dy_ptr, rows, n_rows, n_inner, stride_dyb, stride_dym, TWO_LEVEL)
    dx_rows = dx_ptr + rows * stride_dxm
    offs_n = tl.arange(0, BLOCK_N)

    if SINGLE_TILE:  # read y and dy once, write dx once
        col_ok = offs_n < n_cols
        y = _load_tile(y_rows[:, None] + offs_n[None, :], col_ok, 0.0, EVEN_N, "")  # (BLOCK_M, BLOCK_N)
        dy = _load_tile(dy_rows[:, None] + offs_n[None, :], col_ok, 0.0, EVEN_N, "")
        dot = tl.sum(y * dy, axis=1)
        _store_tile(dx_rows[:, None] + offs_n[None, :], y * (dy - dot[:, None]), row_ok, col_ok, EVEN_M, EVEN_N)
    else:  # wide rows: the dot product in one sweep, then y and dy again
        dot = tl.zeros([BLOCK_M], tl.float32)
        for start in tl.range(0, n_cols, BLOCK_N):
            offs = start + offs_n
            y = _load_tile(y_rows[:, None] + offs[None, :], offs < n_cols, 0.0, EVEN_N, EVICT_1)
            dy = _load_tile(dy_rows[:, None] + offs[None, :], offs < n_cols, 0.0, EVEN_N, EVICT_1)
            dot += tl.sum(y * dy, axis=1)
        for start in tl.range(0, n_cols, BLOCK_N):
            offs = start + offs_n
            col_ok = offs < n_cols
            y = _load_tile(y_rows[:, None] + offs[None, :], col_ok, 0.0, EVEN_N, EVICT_2)
            dy = _load_tile(dy_rows[:, None] + offs[None, :], col_ok, 0.0, EVEN_N, EVICT_2)
            _store_tile(dx_rows[:, None] + offs[None, :], y * (dy - dot[:, None]), row_ok, col_ok, EVEN_M, EVEN_N)


# -- layouts and launches ----------------------------------------------------------------------------
class _Rows(NamedTuple):
    """Where a tensor's rows are: row r starts at ``(r // n_inner) * stride_b + (r % n_inner) * stride_m``."""

    n_rows: int
    n_cols: int
    n_inner: int
    stride_b: int
    stride_m: int
    two_level: bool


def _rows(t: torch.Tensor) -> _Rows | None:
    """Merge the leading dimensions into at most two (size, stride) levels; None if they need more."""
    n_cols = t.shape[-1] if t.dim() else 1
    levels: list[list[int]] = []  # innermost first: [size, stride]
    for size, stride in zip(reversed(t.shape[:-1]), reversed(t.stride()[:-1]), strict=True):
        if size == 1:
            continue  # a size-1 dim has no stride worth keeping
        if levels and stride == levels[-1][0] * levels[-1][1]:
            levels[-1][0] *= size  # this dim steps over the whole level inside it: one level
        else:
            levels.append([size, stride])
    if not levels:
        return _Rows(1, n_cols, 1, 0, n_cols, False)
    if len(levels) == 1:
        ((n, s),) = levels
        return _Rows(n, n_cols, n, 0, s, False)
    if len(levels) == 2:
        (n_in, s_in), (n_out, s_out) = levels
        return _Rows(n_in * n_out, n_cols, n_in, s_out, s_in, True)
    return None


def _check_input(x, dim, op: str, *, grad: bool) -> _Rows:
    check_tensor(x, "x", op=op, contiguous=False, grad=grad, max_numel=None)
    ndim = max(x.dim(), 1)
    if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
        raise KernelInputError(f"{op}: dim={dim!r} is not a dimension of x (shape {tuple(x.shape)}).")
    if dim % ndim != ndim - 1:
        raise KernelInputError(
            f"{op}: this kernel takes the softmax over the last dimension only (dim=-1), got dim={dim} "
            f"for shape {tuple(x.shape)}. Move that dimension last: {op}(x.transpose({dim}, -1)).transpose({dim}, -1)."
        )
    if x.dim() and x.shape[-1] >= INT32_LIMIT:
        raise KernelInputError(f"{op}: rows of {x.shape[-1]} elements; the kernel takes rows of fewer than 2**31.")
    layout = _rows(x)
    if layout is not None and layout.n_rows >= INT32_LIMIT - MAX_TILE:
        raise KernelInputError(
            f"{op}: {layout.n_rows} rows; the kernel numbers rows in int32 (fewer than 2**31 - 2**20)."
        )
    if layout is None:
        raise KernelInputError(
            f"{op}: x's leading dimensions (shape {tuple(x.shape)}, strides {x.stride()}) do not merge into "
            f"two row strides, which is all the kernel takes. Pass x.contiguous()."
        )
    return layout


def _block_override(cfg: dict, block_m, block_n, num_warps, n_cols: int, op: str) -> dict:
    cfg = dict(cfg)
    if block_n is not None:  # a tile asked for is the whole tile: no head and tail, no fragments
        cfg["BLOCK_N"] = check_block(block_n, "block_n", op)
        cfg["SINGLE_TILE"] = n_cols <= cfg["BLOCK_N"]
        cfg.pop("TAIL_N", None)
        cfg.pop("VEC", None)
    if block_m is not None:
        cfg["BLOCK_M"] = check_block(block_m, "block_m", op)
    if num_warps is not None:
        cfg["num_warps"] = check_block(num_warps, "num_warps", op, max_value=32)
    check_tile(cfg["BLOCK_M"], cfg["BLOCK_N"], op=op)
    return cfg


def _unit(dtype: torch.dtype, *values: int) -> int:
    """The 16-byte unit in elements (8 in 16 bits, 4 in fp32) when every length and stride in
    ``values`` is a multiple of it, but not all of 16 elements, else 1. Triton tells its compiler which
    integer arguments are multiples of 16, not of 8: rows of, say, 17000 bf16 start on 16-byte
    boundaries, but the compiler cannot know it and moves them 2 bytes at a time. The launchers pass
    such values divided by the unit, and the kernels multiply them back (``UNIT``): a product by a
    constant the compiler can see through."""
    vec = 16 // element_size(dtype)
    if vec == 1 or any(v % vec for v in values) or all(v % 16 == 0 for v in values):
        return 1
    return vec


def _in_units(dtype: torch.dtype, r: _Rows) -> tuple[int, int, int, int]:
    """``(UNIT, n_cols, stride_b, stride_m)`` for a launch: the row's length and strides divided by
    :func:`_unit`'s unit, which the kernel multiplies back."""
    u = _unit(dtype, r.n_cols, r.stride_b, r.stride_m)
    return u, r.n_cols // u, r.stride_b // u, r.stride_m // u


def _launch_flags(r: _Rows, cfg: dict) -> dict:
    """Constexprs that follow from the shape: the unmasked paths when the tiles divide the tensor."""
    if cfg.get("masked"):  # a tuning run measuring what the masks cost
        return {"EVEN_M": False, "EVEN_N": False}
    return {"EVEN_M": r.n_rows % cfg["BLOCK_M"] == 0, "EVEN_N": r.n_cols % cfg["BLOCK_N"] == 0}


def _forward(x: torch.Tensor, layout: _Rows, cfg: dict) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)  # contiguous, whatever x's strides
    if x.numel() == 0:
        return y
    r = layout
    if cfg.get("SPLIT"):
        return _forward_split(x, y, r, cfg)
    blocks = cdiv(r.n_rows, cfg["BLOCK_M"])
    # persistent programs walk the one-tile path's rows; the online path takes one program a block
    programs = min(blocks, cfg.get("programs") or blocks) if cfg["SINGLE_TILE"] else blocks
    vec = cfg.get("VEC", 1) if cfg["SINGLE_TILE"] else 1
    if vec > 1 and not _packed(x):
        raise RuntimeError(f"{OP}: a fragments configuration (VEC) for rows that are not packed: {cfg}")
    u, n_cols, stride_b, stride_m = _in_units(x.dtype, r)
    _softmax_kernel[(programs,)](
        x,
        y,
        y,
        y,  # m_ptr, l_ptr: unused when WRITE_STATS is off
        r.n_rows,
        n_cols,
        r.n_inner,
        stride_b,
        stride_m,
        n_cols,
        BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"],
        SINGLE_TILE=cfg["SINGLE_TILE"],
        TWO_LEVEL=r.two_level,
        WRITE_Y=True,
        WRITE_STATS=False,
        EVICT_1=cfg.get("EVICT_1", ""),
        EVICT_2=cfg.get("EVICT_2", ""),
        ROW_STAGES=cfg.get("row_stages", 1),
        UNIT=u,
        VEC=vec,
        TAIL_N=cfg.get("TAIL_N", 0) if cfg["SINGLE_TILE"] else 0,
        **_launch_flags(r, cfg),
        **launch_kwargs(cfg["num_warps"], cfg.get("num_stages"), cfg.get("maxnreg")),
    )
    return y


def _packed(x: torch.Tensor) -> bool:
    """x's rows lie end to end from a 16-byte boundary (and so will a fresh y's): the fragments path."""
    return x.is_contiguous() and x.data_ptr() % 16 == 0


def _forward_split(x: torch.Tensor, y: torch.Tensor, r: _Rows, cfg: dict) -> torch.Tensor:
    parts = cfg["SPLIT"]
    sync = torch.zeros(r.n_rows + 1, dtype=torch.int32, device=x.device)  # the ticket, then a count a row
    stats = torch.empty(r.n_rows * 2 * parts, dtype=torch.float32, device=x.device)  # (m, d) of every part
    u, n_cols, stride_b, stride_m = _in_units(x.dtype, r)
    # rows off 16-byte boundaries: the fragments path, when x is contiguous (y's rows then start at the
    # same offsets) and starts on a boundary itself
    vec = 16 // x.element_size()
    frag = vec > 1 and r.n_cols % vec != 0 and _packed(x)
    _softmax_split_kernel[(r.n_rows * parts,)](
        x,
        y,
        sync,
        stats,
        n_cols,
        r.n_inner,
        stride_b,
        stride_m,
        n_cols,
        SPLIT=parts,
        SPLIT_P2=next_pow2(parts),
        BLOCK_N=cfg["BLOCK_N"],
        TWO_LEVEL=r.two_level,
        EVEN_N=r.n_cols % cfg["BLOCK_N"] == 0 and not frag,
        UNIT=u,
        VEC=vec if frag else 1,
        **launch_kwargs(cfg["num_warps"]),
    )
    return y


def _backward(y: torch.Tensor, dy: torch.Tensor, cfg: dict | None = None) -> torch.Tensor:
    dy = upstream_grad(dy, y.dtype)  # dtype, a negated view resolved, last stride 1
    layout = _rows(dy)
    if layout is None:  # e.g. an expanded gradient (stride 0 everywhere)
        dy = dy.contiguous()
        layout = _rows(dy)
    dx = torch.empty(y.shape, dtype=y.dtype, device=y.device)
    if y.numel() == 0:
        return dx
    r = layout
    if cfg is None:
        cfg = softmax_config(r.n_rows, r.n_cols, y.dtype, backward=True)
    u, n_cols, stride_b, stride_m = _in_units(y.dtype, r)
    _softmax_bwd_kernel[(cdiv(r.n_rows, cfg["BLOCK_M"]),)](
        y,
        dy,
        dx,
        r.n_rows,
        n_cols,
        r.n_inner,
        n_cols,
        stride_b,
        stride_m,
        n_cols,
        BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"],
        SINGLE_TILE=cfg["SINGLE_TILE"],
        TWO_LEVEL=r.two_level,
        EVICT_1=cfg.get("EVICT_1", ""),
        EVICT_2=cfg.get("EVICT_2", ""),
        UNIT=u,
        **_launch_flags(r, cfg),
        **launch_kwargs(cfg["num_warps"], cfg.get("num_stages")),
    )
    return dx


class SoftmaxFunction(torch.autograd.Function):
    """``softmax`` with its backward: saves y (not x), ``dx = y * (dy - sum(dy * y))`` in one kernel."""

    @staticmethod
    def forward(ctx, x, layout, cfg):
        y = _forward(x, layout, cfg)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        return _backward(y, dy), None, None


def softmax(
    x: torch.Tensor,
    dim: int = -1,
    *,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    split: bool = True,
) -> torch.Tensor:
    """``softmax(x)`` over the last dimension, fused: one kernel, forward and backward.

    ``y = exp(x - max(x)) / sum(exp(x - max(x)))`` row by row, fp32 arithmetic, y in x's dtype.
    ``x``: any shape ``(..., N)``, fp32/fp16/bf16 (fp32/fp16 in the interpreter), last dimension of
    stride 1, leading dimensions possibly strided. ``dim`` must name the last dimension.
    Trips: rows of up to ``BLOCK_N`` (:func:`softmax_config`): read x, write y; wider rows (online
    softmax): read x twice, write y — on a GPU, rows of up to 64 parts are split across programs
    instead (``SPLIT``), read once. Backward: read y, dy; write dx (wide rows: y, dy twice).
    ``block_m``, ``block_n``, ``num_warps``: override the tile (powers of two); a ``block_n`` below
    the row width forces the online path, and so does ``split=False`` with the online path's own
    tuning. Returns a new contiguous tensor of x's shape.
    """
    layout = _check_input(x, dim, OP, grad=True)
    # a tile asked for is one program a row: start from the schedule that is not split
    split = split and block_n is None
    cfg = softmax_config(layout.n_rows, layout.n_cols, x.dtype, split=split, packed=_packed(x))
    if block_m is not None or block_n is not None or num_warps is not None:
        cfg = _block_override(cfg, block_m, block_n, num_warps, layout.n_cols, OP)
    if x.requires_grad and torch.is_grad_enabled():
        return SoftmaxFunction.apply(x, layout, cfg)
    return _forward(x, layout, cfg)


@functools.lru_cache(maxsize=1024)
def _stats_config(n_rows: int, n_cols: int, dtype: torch.dtype, block: int | None, gpu: bool) -> dict:
    t = GPU_TUNING["forward"] if gpu else INTERPRETER_TUNING
    if block is None:  # the forward kernel's tile: the whole row if it fits, else the online tile
        cfg = softmax_config(n_rows, n_cols, dtype, packed=False)  # the stats' launch has no fragments
        if not cfg.get("SPLIT"):
            return cfg
        block = t["wide_block"]  # the split schedule keeps no (m, l) a row: the online tile does
    block_m = max(1, min(t["tile"] // block, next_pow2(max(n_rows, 1))))
    per_thread = max(1, t["thread_bytes"] // element_size(dtype))
    num_warps = max(1, min(32, next_pow2(block_m * block // per_thread) // 32)) if gpu else 4
    check_tile(block_m, block, op="online_softmax_stats")
    return {"BLOCK_M": block_m, "BLOCK_N": block, "num_warps": num_warps, "SINGLE_TILE": False}


class SoftmaxStats(NamedTuple):
    m: torch.Tensor  # (...,) fp32/float64: the row max
    l: torch.Tensor  # (...,) the row's sum of exp(x - m)  # noqa: E741


def online_softmax_stats(x: torch.Tensor, block: int | None = None) -> SoftmaxStats:
    """``(m, l)`` per row from the one-pass online recurrence, in fp32, by the Triton kernel.

    For each tile of ``block`` columns: ``m_new = max(m, max(tile))``,
    ``l = l * exp(m - m_new) + sum(exp(tile - m_new))``, ``m = m_new`` (from m = -inf, l = 0). Then
    ``softmax(x) = exp(x - m) / l`` and ``logsumexp(x) = m + log(l)``. ``block``: the tile width (a
    power of two; default: the kernel's online tile); any block gives the same (m, l) up to rounding.
    Returns tensors of shape ``x.shape[:-1]``. No backward.
    """
    op = "online_softmax_stats"
    layout = _check_input(x, -1, op, grad=False)
    if block is not None:
        check_block(block, "block", op)
    cfg = _stats_config(layout.n_rows, layout.n_cols, x.dtype, block, runtime.is_gpu())
    lead = x.shape[:-1] if x.dim() else ()
    m = torch.empty(lead, dtype=torch.float32, device=x.device)
    l = torch.empty(lead, dtype=torch.float32, device=x.device)  # noqa: E741
    if layout.n_rows == 0 or x.numel() == 0:
        return SoftmaxStats(m.fill_(float("-inf")), l.zero_())
    r = layout
    _softmax_kernel[(cdiv(r.n_rows, cfg["BLOCK_M"]),)](
        x,
        m,
        m,
        l,
        r.n_rows,
        r.n_cols,
        r.n_inner,
        r.stride_b,
        r.stride_m,
        0,
        BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"],
        SINGLE_TILE=False,
        TWO_LEVEL=r.two_level,
        WRITE_Y=False,
        WRITE_STATS=True,  # the recurrence even when the row fits one tile
        **_launch_flags(r, cfg),
        **launch_kwargs(cfg["num_warps"]),
    )
    return SoftmaxStats(m, l)


@answer_key
def online_softmax_reference_blocks(x: torch.Tensor, block: int) -> SoftmaxStats:
    """The online recurrence in float64 torch, ``block`` columns at a time: ``(m, l)`` per row.

    The spec of :func:`online_softmax_stats`, written to be read: one loop step per tile, the running
    max and the rescaled running sum. ``exp(x - m[..., None]) / l[..., None]`` is then the softmax
    (compare it with :func:`softmax_reference` in float64), whatever the block.
    """
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a whole number >= 1, got {block!r}")
    x = x.double()
    lead = x.shape[:-1]
    m = torch.full(lead, float("-inf"), dtype=torch.float64, device=x.device)
    l = torch.zeros(lead, dtype=torch.float64, device=x.device)  # noqa: E741
    for start in range(0, x.shape[-1], block):
        tile = x[..., start : start + block]
        m_new = torch.maximum(m, tile.amax(-1))
        m_ref = torch.where(m_new == float("-inf"), 0.0, m_new)  # as the kernel: no -inf - -inf
        l = l * torch.exp(m - m_ref) + torch.exp(tile - m_ref[..., None]).sum(-1)  # noqa: E741
        m = m_new
    return SoftmaxStats(m, l)
