"""Lesson 4: residual-add + RMSNorm in one kernel, forward and backward.

Llama's decoder layer adds a sub-layer's output to the residual stream and normalises the sum::

    h = x + r                                   # the new residual stream: written, the next layer adds to it
    y = h * rsqrt(mean(h², -1) + eps) * w       # the normalised input of the next sub-layer

Both ``h`` and ``y`` leave the kernel. Fused, a row costs: read x, r (and w, shared by every row and
served from L2), write h, y — ``4 rows N`` elements, not ``2 rows N``: the residual sum is an output.
Eager PyTorch (Hugging Face's ``LlamaRMSNorm`` after an add) runs about nine kernels with fp32
intermediates; :func:`rmsnorm_ledger` counts them.

**A reduction needs the whole row.** ``mean(h²)`` is known only after the last element of the row is
seen, and every output element needs it. A row of up to ``BLOCK_N`` elements (:func:`rmsnorm_config`,
64 KiB of row on a GPU) is held in registers: one read per element. A wider row is walked twice in
``BLOCK_N`` tiles: pass 1 computes and writes h and sums h², pass 2 re-reads h (not x and r: h is
one tensor, x and r two) and writes y — the ledger's re-read term (``block=`` in the ledger). Pass 2
walks the tiles backwards, so the tiles written last (the likeliest still in L2) are read first. A row
that fits three quarters of a 16384-element tile (11008) is held as a head of 8192 and a tail of 4096
(``TAIL_N``, forward and backward): fewer lanes, registers and warps than the padded tile.

**Numerics and cast order** (Hugging Face's LlamaRMSNorm, which we follow): ``h`` is rounded to the
input dtype (it is stored, and eager adds in that dtype); statistics are fp32 from the rounded h
whatever the storage; ``h * rstd`` is computed in fp32 and **rounded to the input dtype, then
multiplied by the weight** (``weight * hidden.to(input_dtype)``), and y is rounded to the input dtype.
The weight may be fp32 with fp16/bf16 activations (y stays in the activations' dtype; Hugging Face
would return fp32 there — :func:`rmsnorm_eager` casts back so both give the same dtype). ``eps`` sits
inside the square root, added to the mean square. ``rsqrt`` on a GPU is the hardware approximation
(relative error ~2**-23, as ``torch.rsqrt``). Non-finite inputs give what the reference gives (an inf
in a row makes its mean square inf, rstd 0, and the row NaN).

**Backward** (``rstd`` saved in fp32, one per row; ``n = h * rstd``; ``g = dy * w``)::

    dh = rstd * g - h * rstd³ * mean(g * h)  (+ grad_h, when the caller uses h)
    dx = dresidual = dh;      dw = sum over rows of dy * round(n)

dx (which is also the residual's gradient: the add passes it to both) comes from one kernel that
reads dy, h, w, rstd (and grad_h) and writes dx. ``dw`` is a cross-program reduction: each of P
programs walks a contiguous block of rows, accumulates ``dy * round(n)`` for its rows in fp32
registers and writes one row of a ``(P, N)`` fp32 buffer; a second small Triton kernel sums the P
rows in a fixed order. No atomics: ``tl.atomic_add`` from P programs would add the partial sums in
whatever order the programs finish, which changes from run to run, and fp32 addition is not
associative — dw would differ in its last bits between two identical calls. (A Triton kernel rather
than ``buffer.sum(0)``: the same order on every device and mode, one fewer torch dispatch, and the
reduction is part of the op the lesson shows.) Rows wider than the backward tile run two phases in
the same kernel: phase 1 computes each row's ``rstd³ mean(g h)`` (one read of dy, h), phase 2 walks
the tiles with the rows inside, so the dw partial of one tile stays in registers across rows (a
second read of dy and h — the backward's re-read term). A backward row of 12289-16384 16-bit elements
fits its tile but not its tile's registers with the next row in flight: it is walked as two halves,
each loaded twice (``REREAD``: the second load comes from L2, just read, so HBM still sees one read
and the ledger has no re-read term), so only one half is live at a time.

**Layout**: x and r of any shape ``(..., N)`` whose last dimension has stride 1; their leading
dimensions may be strided as long as they merge into at most two (size, stride) levels (a slice of a
wider buffer, ``x[:, :-1]`` of a ``(B, T, N)`` tensor, ``x[::2]``): they are read in place through
their strides. A last dimension of stride != 1, or leading dimensions needing three strides, is
refused with a :class:`KernelInputError` (no silent copy); gradients arriving in backward with such a
layout (an expanded ``y.sum()`` gradient has stride 0 everywhere) are copied, since the caller does
not choose them. Row offsets are int64: rows x N past 2**31 elements works. h and y are new,
contiguous tensors.

**Few rows**: one program per row (block of rows) is the schedule; 1–64 rows of 16k leave most of a
132-SM GPU idle. Such a call moves at most a few MiB and is launch-bound (a launch costs more than the
bytes at copy speed), so we keep one program per row and give it the most warps its tile allows
(more loads in flight per row) — a known limit, not a fix. Measured on an H100 (bf16, residual,
do_bench medians; ``benchmarks/notes_norms.md``): 1, 8, 64, 256 rows x 16384 took 19, 19, 40, 18 µs
(eager 55, 75, 44, 80; compiled 97, 55, 28, 112): at this size every version is launch-bound and
the spread is noise of the launch path, not bytes. Splitting a row over programs would need a second
kernel (or a grid-wide sync) to combine the partial sums.

References: Zhang & Sennrich, "Root Mean Square Layer Normalization" (2019); Hugging Face
``LlamaRMSNorm``; Triton tutorial 05 (layer norm, partial-sum dw); Liger-Kernel ``ops/rms_norm.py``
(row-blocked backward, one dw partial per program).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait  # PDL (sm_90): see pdl_supported

from .. import runtime
from .._exercise import answer_key
from ..ledger import Ledger, dtype_bytes
from ._launch import (  # noqa: F401  (DEFAULT_SMS, sm_count: lesson 4 and the benchmarks read them here)
    DEFAULT_SMS,
    INT32_LIMIT,
    KernelInputError,
    Launcher,
    cdiv,
    check_block,
    check_overrides,
    check_tensor,
    check_tile,
    element_size,
    head_and_tail,
    launch_kwargs,
    next_pow2,
    pdl_supported,
    sm_count,
    tail_warps,
)
from ._tensors import resolved

OP = "rmsnorm"

# -- launch configuration ----------------------------------------------------------------------------
#: GPU tuning (benchmarks/bench_norms.py; the sweep is in benchmarks/notes_norms.md).
#: ``max_single_bytes``: the widest row held in one tile, in bytes of the storage dtype;
#: ``wide_block``: the tile width (elements) of the two-pass path; ``tile``: elements a program takes
#: when rows are narrow (BLOCK_M rows of BLOCK_N); ``per_thread``: elements a thread holds (sets
#: num_warps); ``warps_per_sm``: the backward launches ``SMs * warps_per_sm // num_warps`` programs
#: (at least one a SM), each walking a contiguous block of rows; ``prefetch_tile``: up to this many
#: elements a row block, the backward's row loop is software-pipelined (``tl.range(num_stages=2)``:
#: the next rows' dy, h, grad_h are loaded while this row computes; on an H100 that took 32768 x 4096
#: from 81% to 95% of copy). A 16384-element tile would need ~192 KiB of shared memory for it.
#: ``row_stages``: three (two row blocks in flight, within ``stage_bytes`` of shared memory) where two
#: were: GPU clock, bf16, H200 32768 x 5120 66% -> 93% of copy, 4096 x 5120 58% -> 78%, 32768 x 8192
#: 84% -> 97%; H100 81% -> 98%, 65% -> 77%, 96% -> 99%; the rest within a point or better
#: (benchmarks/tune_rms_bwd.py --stages, notes_norms.md ninth session).
#: ``tail_from``: a one-tile row wider than this tile (up to a tile of ``tail_max``) that fits three
#: quarters of its tile (8193-12288: 11008) is held as a head of half the tile and a tail of a quarter
#: (12288 lanes in place of 16384), ``tail_warps`` warps; the backward with ``tail_stages`` row stages
#: where they fit ``stage_bytes`` (16-bit rows). GPU clock, bf16 (tune_rms_bwd.py --wide,
#: probe_rms_tail.py; notes_norms.md tenth session): backward 32768 x 11008, one 16384 tile against
#: head and tail: H100 77.2% -> 91.5% of copy, H200 66.7% -> 81.3%; forward, H200 92.0% -> 98.1%
#: (compiled 95.8%). A forward row of 20000 (a tile of 32768) ran at 99% in one tile and 80-90% as a
#: head and a tail: hence ``tail_max``.
#: Thirteenth session (probe_rms_bwd_reread.py --tail-stages, GPU clock, bf16): the backward's head and
#: tail with 8 warps and three row stages (147 KiB of shared memory staged: ``stage_bytes`` 160 KiB,
#: which moves no other tile) where it had 16 warps and two: H200 32768 x 11008 82.0% -> 91.4%,
#: 4096 x 11008 74.6% -> 83.8%, 32768 x 9216 81.0% -> 96.7%, 32768 x 12288 83.8% -> 95.4%.
#: ``reread_tile``: a backward row of 12289-16384 (16-bit) filled the 16384 tile's registers (32 warps,
#: 64 a thread: no row stage without spilling); walked as two halves of 8192, each loaded twice (the
#: second time from L2), 16 warps and a row stage: GPU clock, bf16, H200 32768 x 16384 73.3% -> 86.6% of
#: copy, 4096 x 16384 67.9% -> 81.5% (benchmarks/probe_rms_bwd_reread.py, notes_norms.md thirteenth
#: session). At 11008 (a head and a tail already) it lost: 81.3% -> 73-75%.
GPU_TUNING = {
    "forward": {
        "max_single_bytes": 65536,
        "wide_block": 4096,
        "tile": 2048,
        "per_thread": 16,
        "tail_from": 8192,
        "tail_max": 16384,
        "tail_warps": 8,
    },
    "backward": {
        "max_single_bytes": 32768,
        "wide_block": 4096,
        "tile": 2048,
        "per_thread": 16,
        "warps_per_sm": 16,
        "prefetch_tile": 8192,
        "row_stages": 3,
        "stage_bytes": 163840,
        "tail_from": 8192,
        "tail_warps": 8,
        "tail_stages": 3,
        "reread_tile": 16384,
        "reread_warps": 16,
        "reread_stages": 2,
    },
}
#: the interpreter: every program costs milliseconds of Python, so tiles are large (64 Ki elements)
#: and few backward programs; rows past 4096 elements take the two-pass path.
INTERPRETER_TUNING = {
    "max_single": 4096,
    "wide_block": 4096,
    "tile": 65536,
    "programs": 4,
    "tail_from": 2048,
    "reread_tile": 4096,
}
#: the partial-sum reduction: about ``reduce_programs`` column blocks (enough to spread over the SMs
#: when N is small), each adding at most ``reduce_tile`` fp32 elements a step
REDUCE = {"reduce_programs": 256, "reduce_tile": 8192, "num_warps": 4}


def norm_config(t: dict, n_rows: int, n_cols: int, dtype: torch.dtype, backward: bool, gpu: bool, sms: int) -> dict:
    """A row normalisation's launch configuration read off its tuning table ``t`` (this module's
    :data:`GPU_TUNING` or :data:`INTERPRETER_TUNING` entry, or LayerNorm's): the one rule RMSNorm and
    LayerNorm share. ``max_single`` (elements) or ``max_single_bytes`` bound the one-tile row;
    ``warps_by_tile`` (optional) overrides the warps of given tile sizes. ``tail_from`` (optional, with
    ``tail_max``, ``tail_warps``, ``tail_stages``, ``tail_per_sm``: the backward's programs an SM) asks
    for a one-tile row held as a head and a tail (``TAIL_N``); ``reread_tile`` (optional, backward,
    with ``reread_warps`` and ``reread_stages``) for a row of that tile past three quarters of it held
    as two halves, each read twice (``REREAD``)."""
    if gpu:
        max_single = t.get("max_single") or max(16, t["max_single_bytes"] // element_size(dtype))
    else:
        max_single = t["max_single"]
    single = n_cols <= next_pow2(max_single)
    block_n = max(16, next_pow2(n_cols) if single else min(next_pow2(t["wide_block"]), next_pow2(max_single)))
    # narrow rows: several rows a program, so each program still moves a useful amount
    block_m = max(1, min(t["tile"] // block_n, next_pow2(max(n_rows, 1))))
    if gpu:
        num_warps = max(1, min(32, next_pow2(block_m * block_n // t["per_thread"]) // 32))
        num_warps = t.get("warps_by_tile", {}).get(block_m * block_n, num_warps)
        if cdiv(max(n_rows, 1), block_m) < sms:  # few rows: the GPU idles; more loads in flight a row
            block_m = 1
            num_warps = max(num_warps, min(32, max(4, block_n // 256)))
    else:
        num_warps = 4
    cfg = {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": num_warps, "SINGLE_TILE": single}
    if backward:
        blocks = cdiv(max(n_rows, 1), block_m)
        per_sm = max(1, t["warps_per_sm"] // num_warps) if gpu else 0
        cfg["programs"] = max(1, min(blocks, sms * per_sm if gpu else t["programs"]))
        if gpu and single and block_m * block_n <= t["prefetch_tile"]:
            # the next rows' loads in flight while this row computes: row_stages - 1 row blocks of dy,
            # h and grad_h in shared memory, as deep as stage_bytes allows (fp32 rows of 8192: 2)
            stages = t.get("row_stages", 2)
            staged = block_m * block_n * element_size(dtype) * 3
            while stages > 2 and staged * (stages - 1) > t.get("stage_bytes", 0):
                stages -= 1
            cfg["row_stages"] = stages
    tail_from = t.get("tail_from")
    # (the interpreter's blocks of rows take tails too: the kernels are written for any BLOCK_M, and
    # the CPU tests then check them so; on a GPU a tail was only ever measured against one-row blocks)
    if tail_from and single and (block_m == 1 or not gpu) and tail_from < block_n <= t.get("tail_max", 2**20):
        split_tile = head_and_tail(n_cols, block_n)
        if split_tile:
            cfg.update(BLOCK_N=split_tile[0], TAIL_N=split_tile[1])
            if gpu:
                warps = t.get("tail_warps", cfg["num_warps"])
                cfg["num_warps"] = tail_warps(warps, *split_tile, dtype)
            if gpu and backward and t.get("tail_per_sm"):
                cfg["programs"] = max(1, min(blocks, sms * t["tail_per_sm"]))
            if gpu and backward and t.get("tail_stages"):  # the next row in flight where its stage fits
                # (three row tensors, as above: RMSNorm's dy, h and grad_h; LayerNorm's two, dy and x,
                # counted as three, an upper bound)
                staged = sum(split_tile) * element_size(dtype) * 3 * (t["tail_stages"] - 1)
                if staged <= t["stage_bytes"]:
                    cfg["row_stages"] = t["tail_stages"]
        elif backward and block_n == t.get("reread_tile"):
            # a backward row that fills more than three quarters of its tile, walked as two halves read
            # twice (the kernel's REREAD): the first read sums g h, the second (from L2) writes dx
            half = block_n // 2
            cfg.update(BLOCK_N=half, TAIL_N=max(16, next_pow2(n_cols - half)), REREAD=True)
            if gpu:
                cfg.update(num_warps=t["reread_warps"], row_stages=t["reread_stages"])
    return cfg


@functools.lru_cache(maxsize=4096)
def _config(n_rows: int, n_cols: int, dtype: torch.dtype, backward: bool, gpu: bool, sms: int) -> dict:
    t = GPU_TUNING["backward" if backward else "forward"] if gpu else INTERPRETER_TUNING
    return norm_config(t, n_rows, n_cols, dtype, backward, gpu, sms)


def rmsnorm_config(
    n_rows: int, n_cols: int, dtype: torch.dtype, *, backward: bool = False, gpu: bool | None = None
) -> dict:
    """The launch configuration: ``{"BLOCK_M", "BLOCK_N", "num_warps", "SINGLE_TILE"}`` (backward:
    and ``"programs"``, the number of programs P, each walking a contiguous block of rows).

    ``SINGLE_TILE``: the row fits one ``BLOCK_N`` tile and is read once; otherwise the two-pass path
    walks it in ``BLOCK_N`` tiles. ``BLOCK_M`` rows share a program when rows are narrow. ``gpu``: the
    GPU's configuration (default: this mode's), so a lesson on a CPU can ask what the GPU kernel does
    (with :data:`DEFAULT_SMS` SMs there). Tuned on an H100 (``benchmarks/notes_norms.md``).
    """
    gpu = runtime.is_gpu() if gpu is None else bool(gpu)
    sms = sm_count() if gpu and runtime.is_gpu() else DEFAULT_SMS
    return dict(_config(int(n_rows), int(n_cols), dtype, bool(backward), gpu, sms))


# -- a ledger for reductions -----------------------------------------------------------------------------
# -- spec, eager, ledger, flops ------------------------------------------------------------------------
@answer_key
def rmsnorm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, residual: torch.Tensor | None = None):
    """The spec, in float64 arithmetic with the model's roundings: ``h = x + r`` rounded to x's dtype;
    ``n = h * rsqrt(mean(h², -1) + eps)`` rounded to x's dtype; ``y = n * w`` rounded to x's dtype.

    Returns y, or ``(y, h)`` with a residual. On float64 inputs no rounding happens: the exact RMSNorm
    (differentiable, for gradient checks against torch autograd).
    """
    d = x.dtype
    h = x if residual is None else (x.double() + residual.double()).to(d)
    hf = h.double()
    n = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(d)
    y = (n.double() * weight.double()).to(d)
    return y if residual is None else (y, h)


def rmsnorm_eager(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, residual: torch.Tensor | None = None):
    """What eager PyTorch runs: the residual add, then Hugging Face's ``LlamaRMSNorm.forward``::

        h = x + r
        hf = h.to(torch.float32)
        hf = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
        y = weight * hf.to(x.dtype)

    About nine kernels with fp32 intermediates. With an fp32 weight and fp16/bf16 x, Hugging Face's y
    would be fp32; this casts it back to x's dtype (one more kernel), so y has the kernel's dtype.
    Returns y, or ``(y, h)`` with a residual.
    """
    h = x if residual is None else x + residual
    hf = h.to(torch.float32)
    hf = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    y = weight * hf.to(x.dtype)
    if y.dtype != x.dtype:
        y = y.to(x.dtype)
    return y if residual is None else (y, h)


def _wide(rows: int, n: int, dtype, block: int | None, backward: bool) -> bool:
    if block is None:  # the GPU kernel's own choice
        return not rmsnorm_config(rows, n, dtype, backward=backward, gpu=True)["SINGLE_TILE"]
    return n > int(block)


@answer_key
def rmsnorm_ledger(
    rows: int,
    n: int,
    dtype,
    residual: bool = True,
    weight_dtype=None,
    *,
    block: int | None = None,
    stats: bool = False,
    backward: bool = False,
    grad_h: bool = True,
    programs: int | None = None,
) -> Ledger:
    """Residual + RMSNorm of ``rows`` rows of ``n``, trip by trip: eager (``rmsnorm_eager``, op by
    op) and the fused kernel.

    Forward, fused: read x, r (``rows n`` each), w (``n``, once: every program reads the same
    weight, which stays in L2); write h, y (``rows n`` each) — ``4 rows n`` elements plus the weight
    (without a residual: read x, w; write y). ``stats=True`` (training: autograd needs rstd): also write
    rstd (``rows`` fp32). A row wider than ``block`` (default: the GPU kernel's one-tile limit,
    :func:`rmsnorm_config` with ``gpu=True``) is read in two passes: pass 2 re-reads h (or x without a
    residual) — the re-read term, ``rows n`` more.

    ``backward=True``: eager autograd of ``rmsnorm_eager`` (nominal: one trip per tensor each
    formula of torch's derivatives reads or writes; the exact kernels vary by version) and the fused
    backward: read dy, h (or x), w, rstd and, with ``grad_h`` (the caller uses h), grad_h; write dx
    (which is also the residual's gradient); write then read the ``(programs, n)`` fp32 partial sums
    of dw; write dw. Rows wider than ``block`` (the backward tile): dy and h are read twice, and one
    fp32 per row (phase 1's row term) is written and read.

    ``weight_dtype``: the weight's dtype (default: ``dtype``); it sets the size of w and dw (and in
    the forward, eager's extra cast of an fp32 y back to ``dtype``).
    """
    rows, n = int(rows), int(n)
    weight_dtype = dtype if weight_dtype is None else weight_dtype
    f32 = torch.float32
    rn = rows * n
    low = dtype_bytes(dtype) != 4  # fp16/bf16: eager's .float() and .to(dtype) are real kernels
    promoted = torch.promote_types(dtype, weight_dtype) if isinstance(dtype, torch.dtype) else dtype
    h = "h" if residual else "x"
    sizes = {
        "w": weight_dtype,
        "dw": weight_dtype,
        "rstd": f32,
        "c": f32,
        "dw_partial": f32,
        "y32": f32,
        "hf": f32,
        "sq": f32,
        "var": f32,
        "t": f32,
        "rs": f32,
        "hn": f32,
        "dhn": f32,
        "dhf1": f32,
        "t2": f32,
        "drs": f32,
        "dt": f32,
        "dsq": f32,
        "dhf2": f32,
        "dhf": f32,
    }
    wide = _wide(rows, n, dtype, block, backward)
    led = Ledger(dtype_bytes=dtype, sizes=sizes)
    if not backward:
        if residual:
            led.op("add", reads={"x": rn, "r": rn}, writes={"h": rn})
        hf = "hf" if low else h
        if low:
            led.op("float", reads={h: rn}, writes={"hf": rn})
        led.op("pow", reads={hf: rn}, writes={"sq": rn})
        led.op("mean", reads={"sq": rn}, writes={"var": rows})
        led.op("add eps", reads={"var": rows}, writes={"t": rows})
        led.op("rsqrt", reads={"t": rows}, writes={"rs": rows})
        led.op("mul rstd", reads={hf: rn, "rs": rows}, writes={"hn": rn})
        hb = "hb" if low else "hn"
        if low:
            led.op("to dtype", reads={"hn": rn}, writes={"hb": rn})
        if promoted != dtype:
            led.op("mul w", reads={"w": n, hb: rn}, writes={"y32": rn})
            led.op("to dtype", reads={"y32": rn}, writes={"y": rn})
        else:
            led.op("mul w", reads={"w": n, hb: rn}, writes={"y": rn})
        led.outputs = ("h", "y") if residual else ("y",)
        step = "rmsnorm"
        led.fused(step, reads={"x": rn, "r": rn if residual else 0, "w": n})
        if residual:
            led.fused(step, writes={"h": rn})
        if wide:
            led.fused("pass 2", reads={h: rn})
        led.fused(step, writes={"y": rn, "rstd": rows if stats else 0})
        return led

    # backward: eager autograd, formula by formula (residual add: no kernel, dh goes to x and r)
    hb = "hb" if low else "hn"
    hf = "hf" if low else h
    led.op("mul bwd (dhb)", reads={"dy": rn, "w": n}, writes={"dhb": rn})
    led.op("mul bwd (dw)", reads={"dy": rn, hb: rn}, writes={"t1": rn})
    led.op("sum (dw)", reads={"t1": rn}, writes={"dw": n})
    dhn = "dhb"
    if low:
        led.op("to bwd", reads={"dhb": rn}, writes={"dhn": rn})
        dhn = "dhn"
    led.op("mul bwd (dhf)", reads={dhn: rn, "rs": rows}, writes={"dhf1": rn})
    led.op("mul bwd (drs)", reads={dhn: rn, hf: rn}, writes={"t2": rn})
    led.op("sum (drs)", reads={"t2": rn}, writes={"drs": rows})
    led.op("rsqrt bwd", reads={"drs": rows, "rs": rows}, writes={"dt": rows})
    led.op("mean bwd", reads={"dt": rows}, writes={"dsq": rn})
    led.op("pow bwd", reads={"dsq": rn, hf: rn}, writes={"dhf2": rn})
    led.op("add grads", reads={"dhf1": rn, "dhf2": rn}, writes={"dhf": rn})
    dh = "dhf"
    if low:
        led.op("float bwd", reads={"dhf": rn}, writes={"dh1": rn})
        dh = "dh1"
    if residual and grad_h:
        led.op("add grad_h", reads={dh: rn, "grad_h": rn}, writes={"dx": rn})
    if programs is None:
        programs = rmsnorm_config(rows, n, dtype, backward=True, gpu=True)["programs"]
    step = "rmsnorm bwd"
    led.fused(step, reads={"dy": rn, h: rn, "w": n, "rstd": rows, "grad_h": rn if (residual and grad_h) else 0})
    if wide:
        led.fused("phase 1", writes={"c": rows})
        led.fused("phase 2", reads={"dy": rn, h: rn, "c": rows})
    led.fused(step, writes={"dx": rn, "dw_partial": programs * n})
    led.fused("sum partials", reads={"dw_partial": programs * n}, writes={"dw": n})
    return led


def rmsnorm_flops(rows: int, n: int, residual: bool = True, *, backward: bool = False) -> int:
    """Nominal FLOPs. Forward, per element: the residual add (1), square and sum (2), times rstd (1),
    times w (1); backward: g = dy w (1), g h and its sum (2), rstd g (1), h c (1), the difference (1),
    grad_h (1), round(n) (1), dy n and its sum (2)."""
    per = (11 if residual else 10) if backward else (5 if residual else 4)
    return per * int(rows) * int(n)


# -- kernels --------------------------------------------------------------------------------------------
@triton.jit
def _row_offsets(rows, n_inner, stride_b, stride_m, TWO_LEVEL: tl.constexpr):
    # rows: int64. Row r starts at (r // n_inner) * stride_b + (r % n_inner) * stride_m (two levels of
    # leading dimensions), or r * stride_m when they merge into one stride.
    if TWO_LEVEL:
        return (rows // n_inner) * stride_b + (rows % n_inner) * stride_m
    else:
        return rows * stride_m


@triton.jit
def _fwd_tile_h(x_rows, r_rows, h_rows, offs, mask_m, n_cols, EVEN: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """One tile of the forward's rows: h = x + r (rounded to h's dtype, stored), returned in fp32.
    EVEN: the tile covers the row and the row blocks divide the rows."""
    ptrs = offs[None, :]
    mask = mask_m[:, None] & (offs < n_cols)[None, :]
    if EVEN:  # no masks
        x = tl.load(x_rows[:, None] + ptrs)
    else:
        x = tl.load(x_rows[:, None] + ptrs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        if EVEN:
            r = tl.load(r_rows[:, None] + ptrs)
        else:
            r = tl.load(r_rows[:, None] + ptrs, mask=mask, other=0.0)
        # h rounded to the storage dtype: it is stored, and the statistics are those of what is stored
        h = (x.to(tl.float32) + r.to(tl.float32)).to(h_rows.dtype.element_ty)
        if EVEN:
            tl.store(h_rows[:, None] + ptrs, h)
        else:
            tl.store(h_rows[:, None] + ptrs, h, mask=mask)
    else:
        h = x
    return h.to(tl.float32)


@triton.jit
def _fwd_tile_y(y_rows, w_ptr, offs, mask_m, n_cols, hf, rstd, EVEN: tl.constexpr):
    """y = round(h rstd) w on one tile of the rows (Llama's cast order: normalise in fp32, round to the
    activations' dtype, then multiply by w)."""
    mask_n = offs < n_cols
    if EVEN:
        w = tl.load(w_ptr + offs).to(tl.float32)
    else:
        w = tl.load(w_ptr + offs, mask=mask_n, other=0.0).to(tl.float32)
    nrm = (hf * rstd[:, None]).to(y_rows.dtype.element_ty).to(tl.float32)
    y = (nrm * w[None, :]).to(y_rows.dtype.element_ty)
    if EVEN:
        tl.store(y_rows[:, None] + offs[None, :], y)
    else:
        tl.store(y_rows[:, None] + offs[None, :], y, mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _rmsnorm_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    h_ptr,
    y_ptr,
    rstd_ptr,
    n_rows,
    n_cols,
    n_inner,
    stride_xb,
    stride_xm,
    stride_rb,
    stride_rm,
    eps,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SINGLE_TILE: tl.constexpr,
    EVEN: tl.constexpr,
    TWO_LEVEL: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    STORE_RSTD: tl.constexpr,
    TAIL_N: tl.constexpr = 0,
):
    # One program per BLOCK_M rows. h and y are contiguous (rows, N); x and r are read through strides.
    pid = tl.program_id(axis=0)
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    mask_m = offs_m < n_rows
    rows = offs_m.to(tl.int64)  # rows x N can pass 2**31
    x_rows = x_ptr + _row_offsets(rows, n_inner, stride_xb, stride_xm, TWO_LEVEL)
    r_rows = r_ptr + _row_offsets(rows, n_inner, stride_rb, stride_rm, TWO_LEVEL)
    h_rows = h_ptr + rows * n_cols
    y_rows = y_ptr + rows * n_cols
    offs_n = tl.arange(0, BLOCK_N)
    if SINGLE_TILE:  # the whole row in registers: one read of each element
        # one BLOCK_N tile, or (TAIL_N > 0) a BLOCK_N head and a TAIL_N tail: 11008 in 12288 lanes
        # both loads issued before the first reduction: a load written after one waits for it (its
        # barrier), so the tail's trip to memory would follow the head's instead of overlapping it
        hf = _fwd_tile_h(x_rows, r_rows, h_rows, offs_n, mask_m, n_cols, EVEN, HAS_RESIDUAL)
        if TAIL_N > 0:
            offs_t = BLOCK_N + tl.arange(0, TAIL_N)
            hf_t = _fwd_tile_h(x_rows, r_rows, h_rows, offs_t, mask_m, n_cols, False, HAS_RESIDUAL)
        sq = tl.sum(hf * hf, axis=1)
        if TAIL_N > 0:
            sq += tl.sum(hf_t * hf_t, axis=1)
        rstd = tl.math.rsqrt(sq / n_cols + eps)  # (BLOCK_M,) fp32; eps inside the root
        _fwd_tile_y(y_rows, w_ptr, offs_n, mask_m, n_cols, hf, rstd, EVEN)
        if TAIL_N > 0:
            _fwd_tile_y(y_rows, w_ptr, offs_t, mask_m, n_cols, hf_t, rstd, False)
    else:  # a row wider than one tile: pass 1 writes h and sums h², pass 2 re-reads h and writes y
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            offs = start + offs_n
            mask = mask_m[:, None] & (offs < n_cols)[None, :]
            x = tl.load(x_rows[:, None] + offs[None, :], mask=mask, other=0.0)
            if HAS_RESIDUAL:
                r = tl.load(r_rows[:, None] + offs[None, :], mask=mask, other=0.0)
                h = (x.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
                tl.store(h_rows[:, None] + offs[None, :], h, mask=mask)
            else:
                h = x
            hf = h.to(tl.float32)
            acc += hf * hf  # element-wise partial sums; one reduction after the loop
        rstd = tl.math.rsqrt(tl.sum(acc, axis=1) / n_cols + eps)
        # the h this program stored is read back below: make every thread's stores visible first
        tl.debug_barrier()
        n_tiles = tl.cdiv(n_cols, BLOCK_N)
        for i in range(0, n_tiles):
            start = (n_tiles - 1 - i) * BLOCK_N  # backwards: the tiles stored last are likeliest in L2
            offs = start + offs_n
            mask_n = offs < n_cols
            mask = mask_m[:, None] & mask_n[None, :]
            if HAS_RESIDUAL:
                hf = tl.load(h_rows[:, None] + offs[None, :], mask=mask, other=0.0).to(tl.float32)
            else:
                hf = tl.load(x_rows[:, None] + offs[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + offs, mask=mask_n, other=0.0).to(tl.float32)
            nrm = (hf * rstd[:, None]).to(y_ptr.dtype.element_ty).to(tl.float32)
            y = (nrm * w[None, :]).to(y_ptr.dtype.element_ty)
            tl.store(y_rows[:, None] + offs[None, :], y, mask=mask)
    if STORE_RSTD:  # autograd's saved statistic: one fp32 a row
        tl.store(rstd_ptr + offs_m, rstd, mask=mask_m)


@triton.jit
def _bwd_tile(dy_ptr, h_rows, rows, offs, mask_m, mask_n, stride_dym, CACHE: tl.constexpr):
    """One tile of the backward's rows: dy and h, in fp32 (0 where masked). ``CACHE=".cg"``: a second
    read of the same bytes, from L2 (and never merged with the first read by the compiler)."""
    mask = mask_m[:, None] & mask_n[None, :]
    dy = tl.load(dy_ptr + rows[:, None] * stride_dym + offs[None, :], mask=mask, other=0.0, cache_modifier=CACHE)
    hf = tl.load(h_rows[:, None] + offs[None, :], mask=mask, other=0.0, cache_modifier=CACHE)
    return dy.to(tl.float32), hf.to(tl.float32)


@triton.jit
def _bwd_store_dx(dx_ptr, dh_ptr, rows, offs, mask_m, mask_n, g, hf, rstd, c, n_cols, stride_dhm, HAS_DH: tl.constexpr):
    """dx = g rstd - h c (+ grad_h) on one tile of the rows, g = dy w, c = rstd³ mean(g h)."""
    mask = mask_m[:, None] & mask_n[None, :]
    dh = g * rstd[:, None] - hf * c[:, None]
    if HAS_DH:  # the caller used h too: its gradient joins the one through y
        dh += tl.load(dh_ptr + rows[:, None] * stride_dhm + offs[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(dx_ptr + rows[:, None] * n_cols + offs[None, :], dh.to(dx_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rmsnorm_bwd_kernel(
    dy_ptr,
    h_ptr,
    w_ptr,
    rstd_ptr,
    dh_ptr,
    dx_ptr,
    dwp_ptr,
    c_ptr,
    n_rows,
    n_cols,
    n_inner,
    rows_per_program,
    stride_dym,
    stride_hb,
    stride_hm,
    stride_dhm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SINGLE_TILE: tl.constexpr,
    TWO_LEVEL: tl.constexpr,
    HAS_DH: tl.constexpr,
    COMPUTE_DX: tl.constexpr,
    COMPUTE_DW: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    TAIL_N: tl.constexpr = 0,
    REREAD: tl.constexpr = False,
):
    # Program pid walks rows [row_start, row_end) in steps of BLOCK_M and writes one (N,) fp32 row of
    # dw partial sums: dw_partial[pid] = sum over its rows of dy * round(h * rstd).
    # dy, grad_h (dh) and dx are (rows, N) with one row stride; h may have two levels.
    pid = tl.program_id(axis=0)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    offs_n = tl.arange(0, BLOCK_N)
    if SINGLE_TILE:
        # the row on chip: one BLOCK_N tile, or (TAIL_N > 0) a BLOCK_N head and a TAIL_N tail, so a
        # row of 11008 takes 12288 lanes, not 16384 (rmsnorm_config's "tail")
        mask_n = offs_n < n_cols
        w = tl.load(w_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if TAIL_N > 0:
            offs_t = BLOCK_N + tl.arange(0, TAIL_N)
            mask_t = offs_t < n_cols
            w_t = tl.load(w_ptr + offs_t, mask=mask_t, other=0.0).to(tl.float32)
            acc_t = tl.zeros([BLOCK_M, TAIL_N], dtype=tl.float32)
        # NUM_STAGES > 1: Triton prefetches the next rows' loads while this row computes
        for m0 in tl.range(row_start, row_end, BLOCK_M, num_stages=NUM_STAGES):
            offs_m = m0 + tl.arange(0, BLOCK_M)
            mask_m = offs_m < row_end
            rows = offs_m.to(tl.int64)
            h_rows = h_ptr + _row_offsets(rows, n_inner, stride_hb, stride_hm, TWO_LEVEL)
            dy, hf = _bwd_tile(dy_ptr, h_rows, rows, offs_n, mask_m, mask_n, stride_dym, "")
            if TAIL_N > 0:
                dy_t, hf_t = _bwd_tile(dy_ptr, h_rows, rows, offs_t, mask_m, mask_t, stride_dym, "")
            rstd = tl.load(rstd_ptr + offs_m, mask=mask_m, other=0.0)
            if COMPUTE_DX:
                gh = tl.sum(dy * w[None, :] * hf, axis=1)
                if TAIL_N > 0:
                    gh += tl.sum(dy_t * w_t[None, :] * hf_t, axis=1)
                c = gh * (rstd * rstd * rstd) / n_cols
            # dx and the dw partials, the tail first. REREAD: each part's dy and h are loaded again (just
            # read, the L2 holds them), so the compiler keeps one part live, not the whole row: a row of
            # 16384 then leaves registers for the dw sums and the next row in flight
            # (rmsnorm_config's "reread")
            if TAIL_N > 0:
                if REREAD:
                    dy_t, hf_t = _bwd_tile(dy_ptr, h_rows, rows, offs_t, mask_m, mask_t, stride_dym, ".cg")
                if COMPUTE_DX:
                    g_t = dy_t * w_t[None, :]
                    _bwd_store_dx(
                        dx_ptr, dh_ptr, rows, offs_t, mask_m, mask_t, g_t, hf_t, rstd, c, n_cols, stride_dhm, HAS_DH
                    )
                if COMPUTE_DW:  # y = round(n) * w: dw sees the rounded normalised row, as autograd does
                    acc_t += dy_t * (hf_t * rstd[:, None]).to(h_ptr.dtype.element_ty).to(tl.float32)
            if REREAD:
                dy, hf = _bwd_tile(dy_ptr, h_rows, rows, offs_n, mask_m, mask_n, stride_dym, ".cg")
            if COMPUTE_DX:
                g = dy * w[None, :]
                _bwd_store_dx(dx_ptr, dh_ptr, rows, offs_n, mask_m, mask_n, g, hf, rstd, c, n_cols, stride_dhm, HAS_DH)
            if COMPUTE_DW:
                acc += dy * (hf * rstd[:, None]).to(h_ptr.dtype.element_ty).to(tl.float32)
        if COMPUTE_DW:
            tl.store(dwp_ptr + pid.to(tl.int64) * n_cols + offs_n, tl.sum(acc, axis=0), mask=mask_n)
            if TAIL_N > 0:
                tl.store(dwp_ptr + pid.to(tl.int64) * n_cols + offs_t, tl.sum(acc_t, axis=0), mask=mask_t)
    else:
        if COMPUTE_DX:  # phase 1: each row's c = rstd³ mean(g h), one fp32 a row
            for m0 in range(row_start, row_end, BLOCK_M):
                offs_m = m0 + tl.arange(0, BLOCK_M)
                mask_m = offs_m < row_end
                rows = offs_m.to(tl.int64)
                h_rows = h_ptr + _row_offsets(rows, n_inner, stride_hb, stride_hm, TWO_LEVEL)
                acc1 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                for start in range(0, n_cols, BLOCK_N):
                    offs = start + offs_n
                    mask_n = offs < n_cols
                    mask = mask_m[:, None] & mask_n[None, :]
                    dy = tl.load(dy_ptr + rows[:, None] * stride_dym + offs[None, :], mask=mask, other=0.0)
                    hf = tl.load(h_rows[:, None] + offs[None, :], mask=mask, other=0.0).to(tl.float32)
                    w = tl.load(w_ptr + offs, mask=mask_n, other=0.0).to(tl.float32)
                    acc1 += dy.to(tl.float32) * w[None, :] * hf
                rstd = tl.load(rstd_ptr + offs_m, mask=mask_m, other=0.0)
                tl.store(c_ptr + offs_m, tl.sum(acc1, axis=1) * (rstd * rstd * rstd) / n_cols, mask=mask_m)
            tl.debug_barrier()  # phase 2's threads read c values other threads stored
        # phase 2: tiles outside, rows inside, so one tile's dw partial stays in registers
        for start in range(0, n_cols, BLOCK_N):
            offs = start + offs_n
            mask_n = offs < n_cols
            w = tl.load(w_ptr + offs, mask=mask_n, other=0.0).to(tl.float32)
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for m0 in range(row_start, row_end, BLOCK_M):
                offs_m = m0 + tl.arange(0, BLOCK_M)
                mask_m = offs_m < row_end
                rows = offs_m.to(tl.int64)
                mask = mask_m[:, None] & mask_n[None, :]
                h_rows = h_ptr + _row_offsets(rows, n_inner, stride_hb, stride_hm, TWO_LEVEL)
                dy = tl.load(dy_ptr + rows[:, None] * stride_dym + offs[None, :], mask=mask, other=0.0).to(tl.float32)
                hf = tl.load(h_rows[:, None] + offs[None, :], mask=mask, other=0.0).to(tl.float32)
                rstd = tl.load(rstd_ptr + offs_m, mask=mask_m, other=0.0)
                if COMPUTE_DX:
                    c = tl.load(c_ptr + offs_m, mask=mask_m, other=0.0)
                    dh = dy * w[None, :] * rstd[:, None] - hf * c[:, None]
                    if HAS_DH:
                        dh += tl.load(dh_ptr + rows[:, None] * stride_dhm + offs[None, :], mask=mask, other=0.0).to(
                            tl.float32
                        )
                    tl.store(dx_ptr + rows[:, None] * n_cols + offs[None, :], dh.to(dx_ptr.dtype.element_ty), mask=mask)
                if COMPUTE_DW:
                    nrm = (hf * rstd[:, None]).to(h_ptr.dtype.element_ty).to(tl.float32)
                    acc += dy * nrm
            if COMPUTE_DW:
                tl.store(dwp_ptr + pid.to(tl.int64) * n_cols + offs, tl.sum(acc, axis=0), mask=mask_n)


@triton.jit
def _sum_partials_kernel(
    part_ptr,
    out_ptr,
    n_parts,
    n_cols,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PDL: tl.constexpr = False,
):
    # part: (K, P, N) fp32 partial sums; out: (K, N). Program (column block, k) adds the P rows of its
    # columns in a fixed order: the same bits on every call (no atomics, see the module docstring).
    # PDL: placed while the backward kernel that wrote `part` still runs; waits for it before any read.
    if PDL:
        gdc_wait()
    pid_n = tl.program_id(axis=0)
    k = tl.program_id(axis=1).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < n_cols
    base = part_ptr + k * n_parts * n_cols
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for p0 in range(0, n_parts, BLOCK_P):
        offs_p = p0 + tl.arange(0, BLOCK_P)
        mask = (offs_p < n_parts)[:, None] & mask_n[None, :]
        acc += tl.load(base + offs_p.to(tl.int64)[:, None] * n_cols + offs_n[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + k * n_cols + offs_n, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty), mask=mask_n)


@functools.lru_cache(maxsize=4096)
def reduce_config(n_parts: int, n_cols: int, gpu: bool) -> tuple[int, int, int | None]:
    """``(BLOCK_P, BLOCK_N, num_warps)`` for :func:`_sum_partials_kernel`. On a GPU, narrow column
    blocks when N is small (N = 1024 in blocks of 16: 64 programs instead of 8), and as many partial
    rows a step as fit ``reduce_tile`` (usually all of them: one round of loads). The interpreter:
    one program a column block of up to 4096, all partial rows at once."""
    if not gpu:
        return next_pow2(n_parts), min(4096, max(16, next_pow2(n_cols))), None
    bn = max(16, min(256, next_pow2(cdiv(n_cols, REDUCE["reduce_programs"]))))
    bp = max(1, min(next_pow2(n_parts), REDUCE["reduce_tile"] // bn))
    return bp, bn, REDUCE["num_warps"]


_launch_sum = Launcher(_sum_partials_kernel)


def sum_partials(part: torch.Tensor, dtype: torch.dtype, *, pdl: bool = False, checked: bool = False) -> torch.Tensor:
    """``part.sum(1)`` for a ``(K, P, N)`` fp32 buffer of partial sums, as a ``(K, N)`` tensor of
    ``dtype``, by :func:`_sum_partials_kernel` (a fixed order: deterministic). ``pdl``: the kernel that
    wrote ``part`` was the stream's last and lets this one be placed early (``gdc_launch_dependents``):
    LayerNorm's backward, 0.4-1 us a call on an H200; RMSNorm's gained nothing (-0.7 to +1.8 us, so it
    does not; benchmarks/notes_norms.md, eighteenth session). ``checked=True``: a norm's backward, which
    allocated ``part`` itself, skips the checks a direct call gets (host time on a small backward's path)."""
    if not checked:
        check_tensor(part, "part", op="sum_partials", dtypes=(torch.float32,), ndim=3, max_numel=None)
        if dtype not in runtime.DTYPES:
            raise KernelInputError(f"sum_partials: dtype={dtype!r}; choose one of {runtime.DTYPES}.")
    k, p, n = part.shape
    out = torch.empty((k, n), dtype=dtype, device=part.device)
    if out.numel() == 0:
        return out
    if p == 0:
        return out.zero_()
    bp, bn, nw = reduce_config(p, n, runtime.is_gpu())
    pdl = pdl and pdl_supported()
    _launch_sum((cdiv(n, bn), k), part, out, p, n, BLOCK_P=bp, BLOCK_N=bn, PDL=pdl, **launch_kwargs(nw, pdl=pdl))
    return out


# -- layouts ------------------------------------------------------------------------------------------
class Rows(NamedTuple):
    """Where a tensor's rows are: row r starts at ``(r // n_inner) * stride_b + (r % n_inner) * stride_m``."""

    n_rows: int
    n_cols: int
    n_inner: int
    stride_b: int
    stride_m: int
    two_level: bool


def _levels(shape, stride) -> list[list[int]] | None:
    """The leading dimensions merged into (size, stride) levels, innermost first; None for more than two."""
    levels: list[list[int]] = []
    for size, st in zip(reversed(shape[:-1]), reversed(stride[:-1]), strict=True):
        if size == 1:
            continue  # a size-1 dim has no stride worth keeping
        if levels and st == levels[-1][0] * levels[-1][1]:
            levels[-1][0] *= size  # this dim steps over the whole level inside it: one level
        else:
            levels.append([size, st])
    return levels if len(levels) <= 2 else None


@functools.lru_cache(maxsize=4096)
def _layouts(shape: tuple, strides: tuple) -> tuple[Rows, ...] | None:
    n_cols = shape[-1] if shape else 1
    n_rows = math.prod(shape[:-1])
    levels = [_levels(shape, st) for st in strides]
    if any(lv is None for lv in levels):
        return None
    inner = {lv[0][0] for lv in levels if len(lv) == 2}
    if len(inner) > 1:
        return None
    if not inner:  # one stride each
        return tuple(Rows(n_rows, n_cols, max(n_rows, 1), 0, lv[0][1] if lv else n_cols, False) for lv in levels)
    (n_inner,) = inner
    out = []
    for lv in levels:
        if len(lv) == 2:
            out.append(Rows(n_rows, n_cols, n_inner, lv[1][1], lv[0][1], True))
        else:
            st = lv[0][1] if lv else n_cols
            out.append(Rows(n_rows, n_cols, n_inner, n_inner * st, st, True))
    return tuple(out)


def row_layouts(*tensors: torch.Tensor) -> tuple[Rows, ...] | None:
    """One :class:`Rows` per tensor (all of one shape ``(..., N)``), sharing ``n_inner`` so that one
    kernel can walk them together; None if a tensor needs three strides or two need different splits.
    Cached by shape and strides: a launcher works it out once per layout."""
    return _layouts(tuple(tensors[0].shape), tuple(tuple(t.stride()) for t in tensors))


def grad_rows(g: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A gradient as ``(tensor, row stride)`` with unit column stride and one row stride, copying it
    when autograd handed over another layout (an expanded ``y.sum()`` gradient, a transposed view)."""
    g = resolved(g)  # a negated view (what autograd hands over for -y) made real
    if g.dim() == 0 or (g.shape[-1] > 1 and g.stride(-1) != 1):
        g = g.contiguous()
    lv = _levels(g.shape, g.stride())
    if lv is None or len(lv) == 2:
        g = g.contiguous()
        lv = _levels(g.shape, g.stride())
    return g, (lv[0][1] if lv else g.shape[-1])


# -- launchers ------------------------------------------------------------------------------------------
def apply_overrides(cfg: dict, override: dict | None, n_cols: int, op: str) -> dict:
    """A configuration with a tuning run's (or a test's) overrides: any of ``BLOCK_M``, ``BLOCK_N``,
    ``num_warps``, ``programs`` (backward), ``num_stages``. A ``BLOCK_N`` below the row width forces
    the two-pass path."""
    if not check_overrides(override, "fwd_config/bwd_config", op=op):
        return cfg
    cfg = dict(cfg)
    for key, value in override.items():
        if key in ("BLOCK_M", "BLOCK_N"):
            cfg[key] = check_block(value, key, op)
        elif key == "num_warps":
            cfg[key] = check_block(value, key, op, max_value=32)
        elif key in ("programs", "num_stages", "row_stages"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise KernelInputError(f"{op}: {key}={value!r} must be a whole number >= 1.")
            cfg[key] = value
        else:
            raise KernelInputError(
                f"{op}: unknown configuration key {key!r}; use BLOCK_M, BLOCK_N, num_warps, programs, "
                "num_stages, row_stages."
            )
    if "BLOCK_N" in override:
        cfg.pop("TAIL_N", None)  # a tile asked for is the whole tile
        cfg.pop("REREAD", None)
    cfg["SINGLE_TILE"] = n_cols <= cfg["BLOCK_N"] + cfg.get("TAIL_N", 0)
    if "row_stages" not in override and cfg["BLOCK_M"] * cfg["BLOCK_N"] > GPU_TUNING["backward"]["prefetch_tile"]:
        cfg.pop("row_stages", None)  # a larger tile than the default's: no prefetch unless asked
    check_tile(cfg["BLOCK_M"], cfg["BLOCK_N"], op=op)
    return cfg


def check_eps(eps, op: str) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise KernelInputError(f"{op}: eps={eps!r} must be a finite number >= 0.")
    return float(eps)


def check_rows(x: torch.Tensor, name: str, others: dict, op: str) -> tuple[Rows, ...]:
    """Validate the layout of ``x`` and same-shaped ``others`` ({name: tensor}); their Rows."""
    if x.dim() < 1:
        raise KernelInputError(f"{op}: {name} must have at least one dimension (..., N), got a scalar.")
    if x.shape[-1] >= INT32_LIMIT:
        raise KernelInputError(f"{op}: rows of {x.shape[-1]} elements; the kernel takes rows of fewer than 2**31.")
    layouts = row_layouts(x, *others.values())
    if layouts is None:
        names = " and ".join([name, *others])
        raise KernelInputError(
            f"{op}: the leading dimensions of {names} (shape {tuple(x.shape)}, strides "
            f"{[tuple(t.stride()) for t in (x, *others.values())]}) do not merge into the (at most two, shared) "
            f"row strides the kernel takes. Pass .contiguous()."
        )
    if layouts[0].n_rows >= INT32_LIMIT:
        raise KernelInputError(f"{op}: {layouts[0].n_rows} rows; the kernel numbers rows in int32 (fewer than 2**31).")
    return layouts


_launch_fwd = Launcher(_rmsnorm_kernel)
_launch_bwd = Launcher(_rmsnorm_bwd_kernel)


def _forward(x, weight, residual, eps, layouts, cfg, store_rstd):
    """Launch the forward kernel: ``(y, h, rstd)`` (h is None without a residual, rstd None unless asked)."""
    n_cols = x.shape[-1]
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    h = torch.empty(x.shape, dtype=x.dtype, device=x.device) if residual is not None else None
    lx = layouts[0]
    rstd = torch.empty(lx.n_rows, dtype=torch.float32, device=x.device) if store_rstd else None
    if x.numel() == 0:
        return y, h, rstd
    lr = layouts[1] if residual is not None else lx
    even = cfg["SINGLE_TILE"] and n_cols == cfg["BLOCK_N"] and lx.n_rows % cfg["BLOCK_M"] == 0
    _launch_fwd(
        (cdiv(lx.n_rows, cfg["BLOCK_M"]),),
        x,
        residual if residual is not None else x,
        weight,
        h if h is not None else y,
        y,
        rstd if rstd is not None else y,
        lx.n_rows,
        n_cols,
        lx.n_inner,
        lx.stride_b,
        lx.stride_m,
        lr.stride_b,
        lr.stride_m,
        eps,
        BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"],
        SINGLE_TILE=cfg["SINGLE_TILE"],
        EVEN=even,
        TWO_LEVEL=lx.two_level,
        HAS_RESIDUAL=residual is not None,
        STORE_RSTD=store_rstd,
        TAIL_N=cfg.get("TAIL_N", 0) if cfg["SINGLE_TILE"] else 0,
        **launch_kwargs(cfg["num_warps"], cfg.get("num_stages")),
    )
    return y, h, rstd


def _backward(dy, grad_h, h, layout_h, weight, rstd, cfg, need_dx, need_dw):
    """``(dx, dw)``: one kernel for dx and the dw partials, one for their sum (None where not needed)."""
    n_rows, n_cols = layout_h.n_rows, layout_h.n_cols
    dtype = h.dtype
    dx = torch.empty(h.shape, dtype=dtype, device=h.device) if need_dx else None
    if dy is None:  # only h was used downstream: y's branch contributes nothing
        if need_dx and grad_h is not None:
            dx.copy_(grad_h)
        elif need_dx:
            dx.zero_()
        dw = torch.zeros(n_cols, dtype=weight.dtype, device=weight.device) if need_dw else None
        return dx, dw
    if n_rows == 0 or n_cols == 0:
        dw = torch.zeros(n_cols, dtype=weight.dtype, device=weight.device) if need_dw else None
        return dx, dw
    if cfg is None:
        cfg = rmsnorm_config(n_rows, n_cols, dtype, backward=True)
    dy, stride_dy = grad_rows(dy.to(dtype))
    has_dh = grad_h is not None and need_dx
    if has_dh:
        grad_h, stride_dh = grad_rows(grad_h.to(dtype))
    else:
        stride_dh = 0
    bm = cfg["BLOCK_M"]
    programs = max(1, min(cfg["programs"], cdiv(n_rows, bm)))
    rows_per_program = cdiv(cdiv(n_rows, programs), bm) * bm
    programs = cdiv(n_rows, rows_per_program)
    part = torch.empty((1, programs, n_cols), dtype=torch.float32, device=h.device) if need_dw else None
    c = torch.empty(n_rows, dtype=torch.float32, device=h.device) if (need_dx and not cfg["SINGLE_TILE"]) else None
    dummy = rstd
    _launch_bwd(
        (programs,),
        dy,
        h,
        weight,
        rstd,
        grad_h if has_dh else dy,
        dx if dx is not None else dummy,
        part if part is not None else dummy,
        c if c is not None else dummy,
        n_rows,
        n_cols,
        layout_h.n_inner,
        rows_per_program,
        stride_dy,
        layout_h.stride_b,
        layout_h.stride_m,
        stride_dh,
        BLOCK_M=bm,
        BLOCK_N=cfg["BLOCK_N"],
        SINGLE_TILE=cfg["SINGLE_TILE"],
        TWO_LEVEL=layout_h.two_level,
        HAS_DH=has_dh,
        COMPUTE_DX=need_dx,
        COMPUTE_DW=need_dw,
        NUM_STAGES=cfg.get("row_stages", 1) if runtime.is_gpu() else 1,
        TAIL_N=cfg.get("TAIL_N", 0) if cfg["SINGLE_TILE"] else 0,
        REREAD=bool(cfg.get("REREAD")) and cfg["SINGLE_TILE"],
        **launch_kwargs(cfg["num_warps"], cfg.get("num_stages")),
    )
    dw = sum_partials(part, weight.dtype, checked=True)[0] if need_dw else None
    return dx, dw


class RMSNormFunction(torch.autograd.Function):
    """Residual + RMSNorm with its backward. Saves h (x without a residual), w and rstd (fp32, a row)."""

    @staticmethod
    def forward(ctx, x, weight, residual, eps, layouts, fwd_cfg, bwd_cfg):
        y, h, rstd = _forward(x, weight, residual, eps, layouts, fwd_cfg, store_rstd=True)
        ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None, not zeros
        ctx.has_residual = residual is not None
        ctx.layout_h = layouts[0] if residual is None else row_layouts(h)[0]
        ctx.bwd_cfg = bwd_cfg
        ctx.save_for_backward(x if residual is None else h, weight, rstd)
        return (y, h) if residual is not None else y

    @staticmethod
    def backward(ctx, dy, grad_h=None):
        h, weight, rstd = ctx.saved_tensors
        need_dx = ctx.needs_input_grad[0] or ctx.needs_input_grad[2]
        need_dw = ctx.needs_input_grad[1]
        dx, dw = _backward(dy, grad_h, h, ctx.layout_h, weight, rstd, ctx.bwd_cfg, need_dx, need_dw)
        # the add passes dh to both of its inputs: x and the residual get the same tensor (autograd
        # copies before any in-place accumulation, as it does for AddBackward's own (grad, grad))
        dr = dx if ctx.has_residual and ctx.needs_input_grad[2] else None
        return (dx if ctx.needs_input_grad[0] else None), dw, dr, None, None, None, None


def rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    residual: torch.Tensor | None = None,
    *,
    fwd_config: dict | None = None,
    bwd_config: dict | None = None,
):
    """Residual-add + RMSNorm fused, differentiable: ``y = h * rsqrt(mean(h², -1) + eps) * w``.

    Without ``residual``: ``h = x``, returns y. With it: ``h = x + residual`` is written too and
    ``(y, h)`` is returned (gradients flow through both: ``dh = dh_from_y + grad_h``).

    ``x`` (and ``residual``, same shape and dtype): any shape ``(..., N)``, fp32/fp16/bf16 (no bf16 in
    the interpreter), last dimension of stride 1, leading dimensions possibly strided (up to two merged
    strides). ``weight``: shape ``(N,)``, contiguous, x's dtype or another float dtype (fp32 with
    bf16/fp16 activations is the usual mix); y and h are in x's dtype. Cast order, numerics, trips
    and the backward: the module docstring; reference: :func:`rmsnorm_reference`; trips:
    :func:`rmsnorm_ledger`.

    ``fwd_config``/``bwd_config``: overrides of :func:`rmsnorm_config`'s choice (``BLOCK_M``,
    ``BLOCK_N``, ``num_warps``, ``programs``, ``num_stages``) for tuning and tests; a ``BLOCK_N``
    below N forces the two-pass path.
    """
    op = OP
    check_tensor(x, "x", op=op, contiguous=False, grad=True, max_numel=None)
    check_tensor(weight, "weight", op=op, ndim=1, grad=True, max_numel=None)
    eps = check_eps(eps, op)
    others = {}
    if residual is not None:
        check_tensor(residual, "residual", op=op, contiguous=False, grad=True, max_numel=None)
        if residual.dtype != x.dtype or residual.shape != x.shape:
            raise KernelInputError(
                f"{op}: residual must have x's shape and dtype, got {tuple(residual.shape)} {residual.dtype} for "
                f"x {tuple(x.shape)} {x.dtype}."
            )
        others["residual"] = residual
    layouts = check_rows(x, "x", others, op)
    n_rows, n_cols = layouts[0].n_rows, layouts[0].n_cols
    if weight.shape[0] != n_cols:
        raise KernelInputError(
            f"{op}: weight has {weight.shape[0]} elements but x has {n_cols} columns (shape {tuple(x.shape)}); "
            "weight must have shape (N,) where N is x's last dimension."
        )
    if weight.device != x.device:
        raise KernelInputError(f"{op}: x and weight must be on the same device, got {x.device} and {weight.device}.")
    fwd_cfg = apply_overrides(rmsnorm_config(n_rows, n_cols, x.dtype), fwd_config, n_cols, op)
    bwd_cfg = None
    if bwd_config:
        bwd_cfg = apply_overrides(rmsnorm_config(n_rows, n_cols, x.dtype, backward=True), bwd_config, n_cols, op)
    needs_grad = x.requires_grad or weight.requires_grad or (residual is not None and residual.requires_grad)
    if needs_grad and torch.is_grad_enabled():
        return RMSNormFunction.apply(x, weight, residual, eps, layouts, fwd_cfg, bwd_cfg)
    y, h, _ = _forward(x, weight, residual, eps, layouts, fwd_cfg, store_rstd=False)
    return y if residual is None else (y, h)
