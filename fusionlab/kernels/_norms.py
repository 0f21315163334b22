"""What RMSNorm and LayerNorm (and lesson 4b's dropout + norm) share: the rule that reads a launch
configuration off a tuning table, a tuning run's overrides, the entry's checks, the launch flags, the
backward's blocks of rows and buffers, the deterministic sum of the weight gradients' partial sums
(:func:`sum_partials`), and the ledgers' eager kernels written one a line (:func:`eager_steps`).

Each norm keeps its own tuning table (``GPU_TUNING`` in :mod:`fusionlab.kernels.rmsnorm` and
:mod:`fusionlab.kernels.layernorm`); the interpreter's is shared (:data:`INTERPRETER_TUNING`).
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait  # PDL (sm_90): see pdl_supported

from .. import runtime
from ..ledger import Ledger
from ._launch import (
    DEFAULT_SMS,
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
from ._rows import Rows, check_rows

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
#: the largest tile (BLOCK_M x BLOCK_N elements) whose next rows a backward stages by default; a tuning
#: run's larger tile stages none unless it asks (RMSNorm's ``prefetch_tile``)
STAGED_TILE = 8192
#: the partial-sum reduction: about ``reduce_programs`` column blocks (enough to spread over the SMs
#: when N is small), each adding at most ``reduce_tile`` fp32 elements a step
REDUCE = {"reduce_programs": 256, "reduce_tile": 8192, "num_warps": 4}


def norm_config(t: dict, n_rows: int, n_cols: int, dtype: torch.dtype, backward: bool, gpu: bool, sms: int) -> dict:
    """A row normalisation's launch configuration read off its tuning table ``t`` (a ``GPU_TUNING``
    entry of :mod:`~fusionlab.kernels.rmsnorm` or :mod:`~fusionlab.kernels.layernorm`, or
    :data:`INTERPRETER_TUNING`): the one rule RMSNorm and LayerNorm share. ``max_single`` (elements)
    or ``max_single_bytes`` bound the one-tile row; ``warps_by_tile`` (optional) overrides the warps
    of given tile sizes. ``tail_from`` (optional, with ``tail_max``, ``tail_warps``, ``tail_stages``,
    ``tail_per_sm``: the backward's programs an SM) asks for a one-tile row held as a head and a tail
    (``TAIL_N``); ``reread_tile`` (optional, backward, with ``reread_warps`` and ``reread_stages``)
    for a row of that tile past three quarters of it held as two halves, each read twice
    (``REREAD``)."""
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


def apply_overrides(cfg: dict, override: dict | None, n_cols: int, op: str) -> dict:
    """A configuration with a tuning run's (or a test's) overrides: any of ``BLOCK_M``, ``BLOCK_N``,
    ``num_warps``, ``programs`` (backward), ``num_stages``. A ``BLOCK_N`` below the row width forces
    the two-pass path."""
    if not check_overrides(override, "fwd_config/bwd_config", op=op):
        return cfg
    cfg = overridden(cfg, override, ("BLOCK_M", "BLOCK_N", "num_warps", "programs", "num_stages", "row_stages"), op)
    if "BLOCK_N" in override:
        cfg.pop("TAIL_N", None)  # a tile asked for is the whole tile
        cfg.pop("REREAD", None)
    cfg["SINGLE_TILE"] = n_cols <= cfg["BLOCK_N"] + cfg.get("TAIL_N", 0)
    if "row_stages" not in override and cfg["BLOCK_M"] * cfg["BLOCK_N"] > STAGED_TILE:
        cfg.pop("row_stages", None)  # a larger tile than the default's: no prefetch unless asked
    check_tile(cfg["BLOCK_M"], cfg["BLOCK_N"], op=op)
    return cfg


def overridden(cfg: dict, override: dict, keys: tuple, op: str) -> dict:
    """A copy of ``cfg`` with ``override``'s values, each key one of ``keys`` and each value checked:
    tiles a power of two, warps up to 32, programs and stages whole numbers >= 1."""
    cfg = dict(cfg)
    for key, value in override.items():
        if key not in keys:
            raise KernelInputError(f"{op}: unknown configuration key {key!r}; use {', '.join(keys)}.")
        if key in ("BLOCK_M", "BLOCK_N", "num_warps"):
            cfg[key] = check_block(value, key, op, **({"max_value": 32} if key == "num_warps" else {}))
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise KernelInputError(f"{op}: {key}={value!r} must be a whole number >= 1.")
        else:
            cfg[key] = value
    return cfg


def cached_config(tables: dict, interpreter: dict):
    """A norm's cached configuration function ``(n_rows, n_cols, dtype, backward, gpu, sms) -> cfg``,
    read off its GPU ``tables`` (``{"forward": ..., "backward": ...}``) or the ``interpreter``'s."""

    @functools.lru_cache(maxsize=4096)
    def config(n_rows: int, n_cols: int, dtype: torch.dtype, backward: bool, gpu: bool, sms: int) -> dict:
        t = tables["backward" if backward else "forward"] if gpu else interpreter
        return norm_config(t, n_rows, n_cols, dtype, backward, gpu, sms)

    return config


def configs_with_overrides(config, n_rows: int, n_cols: int, dtype, fwd_config, bwd_config, op: str):
    """``(fwd_cfg, bwd_cfg)`` of a norm's entry: ``config``'s (``rmsnorm_config``, ``layernorm_config``)
    with a tuning run's overrides; ``bwd_cfg`` None without backward overrides (the backward then
    asks for its own when it runs)."""
    fwd_cfg = apply_overrides(config(n_rows, n_cols, dtype), fwd_config, n_cols, op)
    bwd_cfg = None
    if bwd_config:
        bwd_cfg = apply_overrides(config(n_rows, n_cols, dtype, backward=True), bwd_config, n_cols, op)
    return fwd_cfg, bwd_cfg


def check_eps(eps, op: str) -> float:
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise KernelInputError(f"{op}: eps={eps!r} must be a finite number >= 0.")
    return float(eps)


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
    does not; benchmarks/notes_norms.md, 2026-11-25, the backward's partial sums placed early).
    ``checked=True``: a norm's backward, which allocated ``part`` itself, skips the checks a direct call
    gets (host time on a small backward's path)."""
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


def gpu_and_sms(gpu: bool | None) -> tuple[bool, int]:
    """``(gpu, sms)`` for a configuration: the GPU's (default: this mode's), with :data:`DEFAULT_SMS`
    SMs on a machine without one, so a lesson on a CPU can ask what the GPU kernel does."""
    gpu = runtime.is_gpu() if gpu is None else bool(gpu)
    return gpu, (sm_count() if gpu and runtime.is_gpu() else DEFAULT_SMS)


def forward_flags(cfg: dict, layout: Rows) -> dict:
    """The forward kernels' shape constexprs and launch options: the tile, ``EVEN`` (one tile, whole
    rows, whole row blocks: no mask) and ``TAIL_N`` (the tail of a head-and-tail row, 0 for none)."""
    n_rows, n_cols = layout.n_rows, layout.n_cols
    even = cfg["SINGLE_TILE"] and n_cols == cfg["BLOCK_N"] and n_rows % cfg["BLOCK_M"] == 0
    return {
        **_tile_flags(cfg, layout),
        "EVEN": even,
        "TAIL_N": cfg.get("TAIL_N", 0) if cfg["SINGLE_TILE"] else 0,
        **launch_kwargs(cfg["num_warps"], cfg.get("num_stages")),
    }


def _tile_flags(cfg: dict, layout: Rows) -> dict:
    return {
        "BLOCK_M": cfg["BLOCK_M"],
        "BLOCK_N": cfg["BLOCK_N"],
        "SINGLE_TILE": cfg["SINGLE_TILE"],
        "TWO_LEVEL": layout.two_level,
    }


def backward_blocks(cfg: dict, n_rows: int) -> tuple[int, int]:
    """``(programs, rows_per_program)`` of a backward: at most ``cfg["programs"]`` programs, each a
    contiguous block of whole row blocks."""
    bm = cfg["BLOCK_M"]
    programs = max(1, min(cfg["programs"], cdiv(n_rows, bm)))
    rows_per_program = cdiv(cdiv(n_rows, programs), bm) * bm
    return cdiv(n_rows, rows_per_program), rows_per_program


def backward_flags(cfg: dict, layout: Rows) -> dict:
    """The backward kernels' tile, row stages, tail and launch options."""
    return {
        **_tile_flags(cfg, layout),
        "NUM_STAGES": cfg.get("row_stages", 1) if runtime.is_gpu() else 1,
        "TAIL_N": cfg.get("TAIL_N", 0) if cfg["SINGLE_TILE"] else 0,
        **launch_kwargs(cfg["num_warps"], cfg.get("num_stages")),
    }


def backward_buffers(cfg: dict, n_rows: int, n_cols: int, k: int, c_per_row: int, device) -> tuple:
    """``(programs, rows_per_program, part, c)`` of a backward: its blocks of rows
    (:func:`backward_blocks`), the ``(k, programs, N)`` fp32 partial sums of its weight gradients (None
    for k = 0) and, for rows wider than one tile, ``c_per_row`` fp32 a row of phase 1's terms (None on
    the one-tile path)."""
    programs, rows_per_program = backward_blocks(cfg, n_rows)
    part = torch.empty((k, programs, n_cols), dtype=torch.float32, device=device) if k else None
    wide = c_per_row and not cfg["SINGLE_TILE"]
    c = torch.empty(c_per_row * n_rows, dtype=torch.float32, device=device) if wide else None
    return programs, rows_per_program, part, c


def check_norm(x: torch.Tensor, weight: torch.Tensor, eps, others: dict, op: str) -> tuple[tuple[Rows, ...], float]:
    """The checks every norm's entry makes: x ``(..., N)`` (and ``others``, ``{name: tensor}`` of x's
    shape) read in place through at most two merged row strides, ``weight`` ``(N,)`` on x's device,
    ``eps`` a finite number >= 0. Returns the tensors' :class:`~fusionlab.kernels._rows.Rows` and eps."""
    check_tensor(x, "x", op=op, contiguous=False, grad=True, max_numel=None)
    check_tensor(weight, "weight", op=op, ndim=1, grad=True, max_numel=None)
    eps = check_eps(eps, op)
    for name, t in others.items():
        check_tensor(t, name, op=op, contiguous=False, grad=True, max_numel=None)
        if t.dtype != x.dtype or t.shape != x.shape:
            raise KernelInputError(
                f"{op}: {name} must have x's shape and dtype, got {tuple(t.shape)} {t.dtype} for "
                f"x {tuple(x.shape)} {x.dtype}."
            )
    layouts = check_rows(x, "x", others, op)
    n_cols = layouts[0].n_cols
    if weight.shape[0] != n_cols:
        raise KernelInputError(
            f"{op}: weight has {weight.shape[0]} elements but x has {n_cols} columns (shape {tuple(x.shape)}); "
            "weight must have shape (N,) where N is x's last dimension."
        )
    if weight.device != x.device:
        raise KernelInputError(f"{op}: x and weight must be on the same device, got {x.device} and {weight.device}.")
    return layouts, eps


def wants_grad(*tensors) -> bool:
    """Autograd records this call: grad mode is on and an input (None: absent) requires a gradient."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def eager_steps(led: Ledger, steps, rows: int, n: int, per_row=(), per_col=("w", "b", "dw", "db")) -> Ledger:
    """Eager's kernels added to ``led``, one a string ``"name: reads -> writes"`` (tensor names apart
    by spaces; a falsy entry, a kernel that does not run, is skipped). A tensor has ``rows n``
    elements, ``rows`` if named in ``per_row``, ``n`` if in ``per_col``."""

    def size(t: str) -> int:
        return rows if t in per_row else n if t in per_col else rows * n

    for step in filter(None, steps):
        name, io = step.split(": ")
        reads, writes = io.split(" -> ")
        led.op(name, reads={t: size(t) for t in reads.split()}, writes={t: size(t) for t in writes.split()})
    return led
