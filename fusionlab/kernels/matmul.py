"""Lesson 6: a tiled matmul ``C = A @ B`` in Triton, with an epilogue that runs on the tile in registers.

Each program owns one ``BLOCK_M x BLOCK_N`` tile of C. It walks K in steps of ``BLOCK_K``: it loads a
``BLOCK_M x BLOCK_K`` tile of A and a ``BLOCK_K x BLOCK_N`` tile of B, multiplies them on the tensor
cores (``tl.dot``) and adds the product to an fp32 accumulator that never leaves the chip. When K is
done, the *epilogue* runs on that accumulator (row scale, bias, activation, residual: see
:mod:`fusionlab.kernels.linear`), and the tile is written once, in the output dtype.

The matmul's own trips (:func:`matmul_ledger`): a program reads its BLOCK_M rows of A and its BLOCK_N
columns of B in full, so A is read once per column of tiles (``ceil(N / BLOCK_N)`` times) and B once
per row of tiles (``ceil(M / BLOCK_M)`` times). Those re-reads are served by the L2 cache when the
programs that share a tile of A or B run at about the same time, which is what the *grouped* tile
order arranges: instead of sweeping a whole row of tiles (which touches all of B before reusing any of
it), ``GROUP_M`` rows of tiles are walked column by column, so a wave of programs shares a few
columns of B and a few rows of A (Triton's tutorial 03 draws it).

Two kernels share that tile order and the epilogue (:func:`_epilogue`), selected by the launcher:

- ``_matmul_kernel`` (``variant="plain"``): the teaching version. One program per tile, pointer
  arithmetic with any strides, masks on every edge (any M, N, K, including K not a multiple of
  BLOCK_K), int64 row offsets. Runs in the interpreter and on any GPU Triton supports.
- ``_matmul_tma_kernel`` (``variant="tma"``): the Hopper path (compute capability 9.0+, fp16/bf16,
  rows 16-byte aligned). *Persistent*: one program per SM, each looping over tiles
  (``tl.range(..., flatten=True)`` lets the compiler issue the next tile's loads during this tile's
  epilogue); A, B and C move through *TMA descriptors* (the tensor memory accelerator copies whole
  tiles between HBM and shared memory, zero-fills what lies past the edge on loads and clips stores,
  so no masks); the output leaves in two half-tiles (``EPILOGUE_SUBTILE``) so that the staging
  buffer is half as large and the pipeline can be deeper. The configuration is autotuned over a
  short list (``TMA_CONFIGS``). Built after Triton's tutorial 09 (persistent matmul, triton 3.6).
  The measurements behind each choice are in ``benchmarks/notes_lesson6.md``.

Precision: the accumulator is fp32 whatever the inputs. fp16/bf16 products are exact in fp32; the
result is rounded once to the output dtype. fp32 inputs on a GPU go through the tensor cores as
**TF32** by default (``input_precision="tf32"``: operands rounded to a 10-bit mantissa, as
``torch.backends.cuda.matmul.allow_tf32 = True`` does for cuBLAS), a relative error of about 1e-3 of
``|A| |B|``; ``input_precision="ieee"`` gives full fp32 (FMA units, several times slower). The
interpreter always computes fp32 in full precision (numpy) and the launcher passes ``"ieee"`` there.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from .. import runtime
from .._exercise import answer_key
from ..ledger import Ledger
from ._launch import (
    INT32_LIMIT,
    KernelInputError,
    Launcher,
    cdiv,
    check_block,
    check_choice,
    check_same,
    check_tensor,
    check_tile,
    dtype_name,
    element_size,
    launch_kwargs,
    next_pow2,
)

try:  # host-side TMA descriptors: triton >= 3.4 (the GPU machine and Colab have 3.6)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older triton: the plain kernel only
    TensorDescriptor = None

#: activation name -> the constexpr code the kernels switch on
ACTIVATIONS = {None: 0, "gelu": 1, "gelu_tanh": 2, "silu": 3}
#: exact GELU through libdevice's erf instead of A&S 7.1.26: a code the benchmarks compare (not public)
_GELU_LIBDEVICE = 4
#: the codes gemm takes
ACTIVATION_CODES = (*ACTIVATIONS.values(), _GELU_LIBDEVICE)
#: tl.dot's fp32 modes the launcher accepts
INPUT_PRECISIONS = ("tf32", "tf32x3", "ieee")
VARIANTS = (None, "auto", "plain", "tma")
_SQRT1_2 = 0.7071067811865476
_TANH_GELU_2C = 1.5957691216057308  # 2 sqrt(2/pi): 0.5 (1 + tanh z) = sigmoid(2z)


def _check_activation(activation, op: str) -> int:
    return check_choice(activation, ACTIVATIONS, "activation", op=op)


# -- the spec -------------------------------------------------------------------------------------
@answer_key
def matmul_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The spec: ``a @ b`` computed in float64, returned in ``a.dtype``."""
    return (a.double() @ b.double()).to(a.dtype)


def matmul_eager(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """What eager PyTorch runs: ``torch.matmul``, one cuBLAS call (fp32 accumulation)."""
    return torch.matmul(a, b)


def _tiles(n: int, block: int | None) -> int:
    return 1 if block is None else math.ceil(n / block)


@answer_key
def matmul_ledger(
    M: int, N: int, K: int, BLOCK_M: int | None = None, BLOCK_N: int | None = None, dtype=torch.bfloat16
) -> Ledger:
    """The matmul's own trips: A (M x K) read ``ceil(N / BLOCK_N)`` times, B (K x N) read
    ``ceil(M / BLOCK_M)`` times, C (M x N) written once.

    Every program reads the full K extent of its BLOCK_M rows of A and its BLOCK_N columns of B, so
    each row of A is read by every program in its row of tiles, and each column of B by every program
    in its column of tiles. That is the traffic between the SMs and the memory system; the L2 cache
    serves the repeats that arrive close together in time (the grouped order's purpose), so the bytes
    that reach HBM lie between this count and the ideal one read of each. ``BLOCK_M=BLOCK_N=None``:
    the ideal (each input read once: the tile as large as the matrix).
    """
    led = Ledger(dtype_bytes=dtype)
    led.op("matmul", reads={"A": M * K * _tiles(N, BLOCK_N), "B": K * N * _tiles(M, BLOCK_M)}, writes={"C": M * N})
    return led


def matmul_flops(M: int, N: int, K: int) -> int:
    """``2 M N K``: one multiply and one add per term of every dot product."""
    return 2 * M * N * K


# -- the kernels ----------------------------------------------------------------------------------
@triton.jit
def _grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Tile ``tile_id`` -> (pid_m, pid_n) in grouped order: GROUP_M rows of tiles walked column by
    column, so programs that run together share columns of B and rows of A in L2."""
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = tl.minimum(num_pid_m - first_pid_m, GROUP_M)  # the last group may be short
    pid_m = first_pid_m + (tile_id % num_pid_in_group) % group_size_m
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _epilogue(
    acc,
    offs_m,
    offs_n,
    M,
    N,
    bias_ptr,
    res_ptr,
    scale_ptr,
    stride_rm,
    stride_rn,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    HAS_ROW_SCALE: tl.constexpr,
):
    """``act(scale[m] * acc + bias[n]) + residual[m, n]`` on the fp32 tile, in registers.

    Each flag is a constexpr: a kernel compiled without it has no trace of it. The row scale is
    RMSNorm's rstd (lesson 6's prologue: ``(x rstd) W = rstd (x W)``), one fp32 number per row of the
    tile; the bias is one number per *column* (per output feature), broadcast down the rows.
    """
    if HAS_ROW_SCALE:
        scale = tl.load(scale_ptr + offs_m, mask=offs_m < M, other=0.0)
        acc = acc * scale[:, None]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
        acc = acc + bias[None, :]
    if ACTIVATION == 1:  # exact GELU, 0.5 v (1 + erf(v / sqrt 2)), erf by A&S 7.1.26 (|error| <= 1.5e-7)
        # As lesson 2's erf_fast (fusionlab.kernels.bias_gelu): one rsqrt and one exp2 (the SFU) and a
        # few FMAs, where libdevice's erf (ACTIVATION 4) costs about twice as much; on a GPU the
        # epilogue's arithmetic is not hidden behind the tensor cores, so it shows in the layer's time
        # (benchmarks/notes_lesson6.md). t = 1 / (1 + p |v| / sqrt 2) as rsqrt(.)^2: an approximate
        # reciprocal in one instruction, its few-ulp error far below the formula's.
        r = tl.math.rsqrt(tl.abs(acc) * 0.23164193985531953 + 1.0)  # p / sqrt 2, p = 0.3275911
        t = r * r
        # the A&S coefficients a1..a5 halved (the 1/2 of GELU's 0.5 v folded in), Horner form
        poly = t * (0.127414796 + t * (-0.142248368 + t * (0.7107068705 + t * (-0.7265760135 + t * 0.5307027145))))
        half_q = poly * tl.exp2(acc * acc * -0.7213475204444817)  # erfc(|v| / sqrt 2) / 2
        # v (1 - q/2) for v >= 0, v q/2 below: no cancellation (q/2 <= 1/2). Written as v times a factor,
        # not v - v q/2: at v = +inf, q = 0 and v q/2 is inf * 0 = NaN, where GELU(inf) = inf; the
        # same three operations an element
        acc = acc * tl.where(acc >= 0, 1.0 - half_q, half_q)
    elif ACTIVATION == 2:  # tanh GELU, as v sigmoid(2z): no cancellation for v << 0
        acc = acc * tl.sigmoid(1.5957691216057308 * (acc + 0.044715 * acc * acc * acc))
    elif ACTIVATION == 3:  # SiLU
        acc = acc * tl.sigmoid(acc)
    elif ACTIVATION == 4:  # exact GELU through libdevice's erf: the benchmarks' comparison
        acc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))
    if HAS_RESIDUAL:
        r_ptrs = res_ptr + offs_m.to(tl.int64)[:, None] * stride_rm + offs_n[None, :] * stride_rn
        r = tl.load(r_ptrs, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N), other=0.0)
        acc = acc + r.to(tl.float32)
    return acc


@triton.jit
def _matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    bias_ptr,
    res_ptr,
    scale_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    stride_rm,
    stride_rn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    PRECISION: tl.constexpr,
    HAS_BIAS: tl.constexpr = False,
    ACTIVATION: tl.constexpr = 0,
    HAS_RESIDUAL: tl.constexpr = False,
    HAS_ROW_SCALE: tl.constexpr = False,
):
    # A: (M, K), B: (K, N) with any strides (F.linear's (N, K) weight arrives as its transposed
    # view), C: (M, N). One program per BLOCK_M x BLOCK_N tile of C.
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    # int64 row and column offsets: M x K past 2**31 elements must not wrap
    a_ptrs = a_ptr + offs_m.to(tl.int64)[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n.to(tl.int64)[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # fp32 whatever the inputs
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:  # BLOCK_K divides K: only the M and N edges are masked
            a = tl.load(a_ptrs, mask=mask_m[:, None], other=0.0)
            b = tl.load(b_ptrs, mask=mask_n[None, :], other=0.0)
        else:  # the last K step hangs over: the zeros it loads add nothing to the sums
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    acc = _epilogue(
        acc, offs_m, offs_n, M, N, bias_ptr, res_ptr, scale_ptr, stride_rm, stride_rn,
        HAS_BIAS, ACTIVATION, HAS_RESIDUAL, HAS_ROW_SCALE,
    )  # fmt: skip
    c_ptrs = c_ptr + offs_m.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _matmul_tma_kernel(
    a_desc,
    b_desc,
    c_desc,
    bias_ptr,
    res_ptr,
    scale_ptr,
    M,
    N,
    K,
    stride_rm,
    stride_rn,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    B_KN: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
    PROGRAMS_PER_SM: tl.constexpr = 1,
    HAS_BIAS: tl.constexpr = False,
    ACTIVATION: tl.constexpr = 0,
    HAS_RESIDUAL: tl.constexpr = False,
    HAS_ROW_SCALE: tl.constexpr = False,
):
    # Persistent: PROGRAMS_PER_SM x (number of SMs) programs (the launcher's grid; two per SM let one
    # program's epilogue overlap the other's matmul where registers and shared memory allow), each
    # taking tiles start_pid, start_pid + num_progs, ... in grouped
    # order. A: (M, K) descriptor; B: (K, N) if B_KN else (N, K) (F.linear's weight as it lies);
    # C: (M, N). TMA zero-fills loads past the edges and clips stores: no masks in the loop.
    start_pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    # the epilogue recomputes its tile's coordinates from a second counter (as tutorial 09 does), so
    # the flattened loop nest does not carry the loop's values across into the epilogue
    num_progs = tl.num_programs(axis=0)
    tile_id_c = start_pid - num_progs
    # flatten: one software pipeline over (tile, k) pairs, so the next tile's first loads are in
    # flight during this tile's epilogue. (Triton 3.6 does not flatten a warp-specialised loop on
    # Hopper.)
    for tile_id in tl.range(
        start_pid, num_tiles, num_progs, flatten=not WARP_SPECIALIZE, warp_specialize=WARP_SPECIALIZE
    ):
        pid_m, pid_n = _grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            off_k = ki * BLOCK_K
            a = a_desc.load([off_m, off_k])
            if B_KN:
                b = b_desc.load([off_k, off_n])
                acc = tl.dot(a, b, acc)
            else:
                b = b_desc.load([off_n, off_k])
                acc = tl.dot(a, b.T, acc)

        tile_id_c += num_progs
        pid_m, pid_n = _grouped_tile(tile_id_c, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        offs_m = off_m + tl.arange(0, BLOCK_M)
        if EPILOGUE_SUBTILE:
            # two BLOCK_M x BLOCK_N/2 halves: half the shared-memory staging for the TMA store and
            # half the registers for the epilogue's temporaries
            acc = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            acc0, acc1 = tl.split(acc)
            offs_n = off_n + tl.arange(0, BLOCK_N // 2)
            y0 = _epilogue(
                acc0, offs_m, offs_n, M, N, bias_ptr, res_ptr, scale_ptr, stride_rm, stride_rn,
                HAS_BIAS, ACTIVATION, HAS_RESIDUAL, HAS_ROW_SCALE,
            )  # fmt: skip
            c_desc.store([off_m, off_n], y0.to(c_desc.dtype))
            y1 = _epilogue(
                acc1, offs_m, offs_n + BLOCK_N // 2, M, N, bias_ptr, res_ptr, scale_ptr, stride_rm,
                stride_rn, HAS_BIAS, ACTIVATION, HAS_RESIDUAL, HAS_ROW_SCALE,
            )  # fmt: skip
            c_desc.store([off_m, off_n + BLOCK_N // 2], y1.to(c_desc.dtype))
        else:
            offs_n = off_n + tl.arange(0, BLOCK_N)
            y = _epilogue(
                acc, offs_m, offs_n, M, N, bias_ptr, res_ptr, scale_ptr, stride_rm, stride_rn,
                HAS_BIAS, ACTIVATION, HAS_RESIDUAL, HAS_ROW_SCALE,
            )  # fmt: skip
            c_desc.store([off_m, off_n], y.to(c_desc.dtype))


def _tma_block_shapes(nargs) -> None:
    """Autotune pre-hook: give the descriptors the block shapes of the config being tried."""
    bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
    nargs["a_desc"].block_shape = [bm, bk]
    nargs["b_desc"].block_shape = [bk, bn] if nargs["B_KN"] else [bn, bk]
    nargs["c_desc"].block_shape = [bm, bn // 2] if nargs["EPILOGUE_SUBTILE"] else [bm, bn]


def _tma_config(bm, bn, bk, stages, warps, subtile=True, ws=False, per_sm=1) -> triton.Config:
    meta = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8, "EPILOGUE_SUBTILE": subtile}
    meta.update(WARP_SPECIALIZE=ws, PROGRAMS_PER_SM=per_sm)
    return triton.Config(meta, num_warps=warps, num_stages=stages, pre_hook=_tma_block_shapes)


#: the autotuner's short list for the TMA path (benchmarks/notes_lesson6.md has the sweep behind it)
# (H100, benchmarks/notes_lesson6.md: 128 x 256 x 64 with 3 stages and 8 warps was the fastest at every
# large shape, 0.97-1.04x cuBLAS; 4 stages a close second; 128 x 128 tiles win only where 128 x 256
# leaves SMs idle. Warp specialisation did not compile for this kernel on triton 3.6; two programs
# per SM ran 10-30% slower.)
TMA_CONFIGS = [
    _tma_config(128, 256, 64, 3, 8),
    _tma_config(128, 256, 64, 4, 8),
    _tma_config(128, 128, 64, 4, 4),
]
_TMA_KEYS = ["M", "N", "K", "B_KN", "HAS_BIAS", "ACTIVATION", "HAS_RESIDUAL", "HAS_ROW_SCALE"]
_matmul_tma_autotuned = triton.autotune(configs=TMA_CONFIGS, key=_TMA_KEYS)(_matmul_tma_kernel)


# -- configuration --------------------------------------------------------------------------------
def _clamp_pow2(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, next_pow2(n)))


@functools.lru_cache(maxsize=4096)
def _plain_config(M: int, N: int, K: int, dtype: torch.dtype, gpu: bool) -> dict:
    """The plain kernel's tile for a problem size (see :func:`matmul_config`)."""
    if not gpu:
        # every program is milliseconds of Python: few, large tiles (tl.dot needs 16 at least)
        return {
            "BLOCK_M": _clamp_pow2(M, 16, 64),
            "BLOCK_N": _clamp_pow2(N, 16, 64),
            "BLOCK_K": _clamp_pow2(K, 16, 64),
            "GROUP_M": 8,
            "num_warps": 4,
            "num_stages": 1,
        }
    wide = element_size(dtype) == 4  # fp32: TF32 tiles hold half as many K per byte
    if M <= 64:  # decode-sized: a short, wide tile that streams B (the weights) over many programs
        bm = _clamp_pow2(M, 16, 64)
        return {
            "BLOCK_M": bm,
            "BLOCK_N": 64,
            "BLOCK_K": 64 if wide else 128,
            "GROUP_M": 8,
            "num_warps": 4,
            "num_stages": 4,
        }
    if wide:
        return {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
    return {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4}


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.cache
def _hopper() -> bool:
    return runtime.is_gpu() and torch.cuda.get_device_capability() >= (9, 0)


def _aligned(t: torch.Tensor) -> bool:
    """A TMA descriptor needs a 16-byte aligned base, unit stride along rows, 16-byte row pitch."""
    es = t.element_size()
    return t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * es) % 16 == 0


def _b_layout(b: torch.Tensor) -> tuple[torch.Tensor, bool] | None:
    """B (K, N) as TMA wants it: ``(b, True)`` if its rows are contiguous, ``(b.T, False)`` if it is
    the transposed view of an (N, K) row-major tensor (F.linear's weight); None if neither."""
    if b.stride(1) == 1 and _aligned(b):
        return b, True
    bt = b.t()
    if bt.stride(1) == 1 and _aligned(bt):
        return bt, False
    return None


def _tma_eligible(a: torch.Tensor, b: torch.Tensor, M: int, N: int, K: int) -> bool:
    if TensorDescriptor is None or not _hopper() or a.dtype not in (torch.float16, torch.bfloat16):
        return False
    if min(M, N) < 128 or K < 16 or (N * a.element_size()) % 16:  # C's rows must be 16-byte aligned too
        return False
    return _aligned(a) and _b_layout(b) is not None


def matmul_config(M: int, N: int, K: int, dtype: torch.dtype, *, tma: bool | None = None) -> dict:
    """The launch configuration the launcher picks for an (M, K) @ (K, N) problem.

    ``{"variant": "plain", BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages}`` for the plain
    kernel: on a GPU 128 x 128 x 64 tiles, 4 warps, 4 stages for 16-bit inputs (128 x 128 x 32, 8
    warps, 3 stages for fp32), and for M <= 64 (decode) a short BLOCK_M x 64 tile with a long K step;
    in the interpreter up to 64 x 64 x 64 (few programs: each costs Python time).
    ``{"variant": "tma", "configs": [...]}`` for the Hopper path: the autotuner's candidates
    (``TMA_CONFIGS``); it times them on the first call for each shape and keeps the fastest.
    ``tma``: whether the inputs qualify (the launcher decides from dtype, alignment and device); None
    assumes they do when the device and dtype allow it and M, N >= 128.
    """
    if tma is None:
        tma = TensorDescriptor is not None and _hopper() and dtype in (torch.float16, torch.bfloat16)
        tma = tma and min(M, N) >= 128 and K >= 16
    if tma:
        return {"variant": "tma", "configs": [dict(c.all_kwargs()) for c in TMA_CONFIGS]}
    return {"variant": "plain", **_plain_config(int(M), int(N), int(K), dtype, runtime.is_gpu())}


# -- the launcher shared by matmul, linear and rmsnorm_linear -------------------------------------
_launch_plain = Launcher(_matmul_kernel)


def _check_config(config: dict, op: str, keys: tuple[str, ...]) -> dict:
    unknown = set(config) - set(keys)
    if unknown:
        raise KernelInputError(f"{op}: unknown config key(s) {sorted(unknown)}; known: {', '.join(keys)}.")
    out = dict(config)
    for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M"):
        if name in out:
            check_block(out[name], name, op, max_value=1024)
    for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        if name in out and out[name] < 16:
            raise KernelInputError(f"{op}: {name}={out[name]}; tl.dot needs tiles of at least 16.")
    if "num_warps" in out:
        check_block(out["num_warps"], "num_warps", op, max_value=32)
    return out


_PLAIN_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
_TMA_KEYS_USER = _PLAIN_KEYS + ("EPILOGUE_SUBTILE", "WARP_SPECIALIZE", "PROGRAMS_PER_SM")


def _precision(dtype: torch.dtype, input_precision, op: str) -> str:
    if input_precision is None:
        return "tf32" if runtime.is_gpu() and dtype == torch.float32 else "ieee"
    if input_precision not in INPUT_PRECISIONS:
        raise KernelInputError(f"{op}: input_precision={input_precision!r}; choose one of {INPUT_PRECISIONS}.")
    return input_precision if runtime.is_gpu() else "ieee"  # the interpreter computes fp32 in full


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    activation: int = 0,
    residual: torch.Tensor | None = None,
    row_scale: torch.Tensor | None = None,
    variant: str | None = None,
    config: dict | None = None,
    input_precision: str | None = None,
    op: str = "matmul",
    checked: bool = False,
) -> torch.Tensor:
    """``act(row_scale[:, None] * (a @ b) + bias) + residual`` in one launch. ``checked=True``: the
    caller (:func:`matmul`, ``linear``, ``rmsnorm_linear``) has checked the inputs; a direct call
    (a benchmark's) is checked here, as every public entry point is.

    ``a``: (M, K); ``b``: (K, N), any strides (pass ``weight.t()`` for F.linear's (N, K) weight);
    ``bias`` (N,) contiguous; ``residual`` (M, N) any strides; ``row_scale`` (M,) fp32 contiguous;
    ``activation``: a code from :data:`ACTIVATIONS`. The launcher behind :func:`matmul`,
    :func:`fusionlab.kernels.linear.linear` and :func:`fusionlab.kernels.rmsnorm_linear.rmsnorm_linear`.
    """
    if not checked:
        _check_gemm_args(a, b, bias, activation, residual, row_scale, op)
    plan = _gemm_plan(a, b, bias, activation, residual, row_scale, variant, config, input_precision, op)
    return _run_gemm(plan, a, b, bias, residual, row_scale)


class _GemmPlan:
    """What :func:`gemm` works out for one problem before it launches: the output's shape, dtype and
    device, and either the plain kernel's grid, int arguments and constexprs (``kwargs``) or, for the
    Hopper path, what it needs to build its descriptors (``tma``). A plain plan reads nothing of its
    tensors but their data pointers when it runs (:func:`_run_gemm`), so an op may keep it for calls of
    the same signature (:class:`~fusionlab.kernels._launch.Plans`) and run it on the caller's own
    tensors (x as it came, the weight as (N, K)) without viewing them as (M, K) and (K, N) again."""

    __slots__ = ("out_shape", "dtype", "device", "grid", "ints", "kwargs", "tma", "keys")

    def __init__(self, out_shape, dtype, device, grid=None, ints=(), kwargs=None, tma=None):
        self.out_shape, self.dtype, self.device = out_shape, dtype, device
        self.grid, self.ints, self.kwargs, self.tma = grid, ints, kwargs or {}, tma
        self.keys: dict = {}  # the launcher's key, by the output's 16-byte alignment (fresh memory: 0)

    @property
    def reusable(self) -> bool:
        """Whether a call of the same signature may run this plan on its own tensors: the plain kernel's
        (the TMA path builds descriptors from the (M, K) and (K, N) tensors themselves)."""
        return self.tma is None


def _gemm_plan(a, b, bias, activation, residual, row_scale, variant, config, input_precision, op, out_shape=None):
    """:func:`gemm`'s choices for these (checked) operands: a :class:`_GemmPlan`. ``out_shape``: the
    output's shape when it is not (M, N) (``linear``'s (..., N): the same contiguous rows)."""
    M, K = a.shape
    N = b.shape[1]
    out_shape = (M, N) if out_shape is None else tuple(out_shape)
    if M == 0 or N == 0:
        return _GemmPlan(out_shape, a.dtype, a.device)
    precision = _precision(a.dtype, input_precision, op)
    if variant not in VARIANTS:
        raise KernelInputError(f"{op}: variant={variant!r}; choose one of {VARIANTS}.")
    tma_ok = _tma_eligible(a, b, M, N, K)
    if variant == "tma" and not tma_ok:
        raise KernelInputError(
            f"{op}: variant='tma' needs a Hopper GPU (compute capability 9.0+), fp16/bf16 inputs, M and N "
            f">= 128, K >= 16, and A, B and C rows 16 bytes aligned (got {dtype_name(a.dtype)}, M={M}, N={N}, "
            f"K={K}, A strides {a.stride()}, B strides {b.stride()}); use variant='plain'."
        )
    flags = {
        "HAS_BIAS": bias is not None,
        "ACTIVATION": activation,
        "HAS_RESIDUAL": residual is not None,
        "HAS_ROW_SCALE": row_scale is not None,
    }
    stride_rm, stride_rn = (residual.stride(0), residual.stride(1)) if residual is not None else (0, 0)
    if variant == "tma" or (variant in (None, "auto") and tma_ok):
        tma = {"M": M, "N": N, "K": K, "stride_rm": stride_rm, "stride_rn": stride_rn, "flags": flags}
        return _GemmPlan(out_shape, a.dtype, a.device, tma={**tma, "config": config, "op": op})

    cfg = _plain_config(M, N, K, a.dtype, runtime.is_gpu())
    if config is not None:
        cfg = {**cfg, **_check_config(config, op, _PLAIN_KEYS)}
        check_tile(cfg["BLOCK_M"], cfg["BLOCK_N"], op=op)
    bm, bn, bk = cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["BLOCK_K"]
    # the K loop advances pointers by BLOCK_K * stride in int32: refuse strides that would wrap
    if max(abs(a.stride(1)), abs(b.stride(0))) * bk >= INT32_LIMIT:
        raise KernelInputError(
            f"{op}: a K-step of {bk} times stride {max(a.stride(1), b.stride(0))} passes 2**31 elements; "
            "pass row-major (contiguous) operands."
        )
    # c is fresh and contiguous: rows of N, unit columns (what torch.empty((M, N)).stride() gives)
    ints = (M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), N, 1, stride_rm, stride_rn)
    kwargs = {
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "GROUP_M": cfg["GROUP_M"],
        "EVEN_K": K % bk == 0,
        "PRECISION": precision,
        **flags,
        **launch_kwargs(cfg["num_warps"], cfg["num_stages"]),
    }
    return _GemmPlan(out_shape, a.dtype, a.device, (cdiv(M, bm) * cdiv(N, bn),), ints, kwargs)


def _run_gemm(plan: _GemmPlan, a, b, bias, residual, row_scale, device: int | None = None) -> torch.Tensor:
    """Allocate the output and launch ``plan`` on these tensors (for a plain plan any views of the
    planned ones' memory: only their data pointers are read). ``device``: the current CUDA device when
    the caller knows it (:func:`~fusionlab.kernels._launch.signature`)."""
    # size= a plain tuple: torch's argument parser takes a positional tuple 0.3 us more slowly than the
    # keyword (a torch.Size positionally: 0.8 us) on a 2-core CPU, 2026-11-27; a decode step allocates ~10
    c = torch.empty(size=plan.out_shape, device=plan.device, dtype=plan.dtype)
    if plan.grid is None and plan.tma is None:  # M or N is 0
        return c
    dummy = c  # never read: the flag that would read it is off
    bias_t = bias if bias is not None else dummy
    res_t = residual if residual is not None else dummy
    scale_t = row_scale if row_scale is not None else dummy
    if plan.tma is not None:
        _run_tma(plan.tma, a, b, c, bias_t, res_t, scale_t)
        return c
    args = (a, b, c, bias_t, res_t, scale_t, *plan.ints)
    align = c.data_ptr() & 15
    key = plan.keys.get(align)
    if key is None:
        key = plan.keys[align] = _launch_plain.spec_key(args, plan.kwargs)
    _launch_plain.launch(plan.grid, args, plan.kwargs, key, device)
    return c


def _run_tma(t: dict, a, b, c, bias_t, res_t, scale_t) -> None:
    """The Hopper path of a plan (``t``: :class:`_GemmPlan`'s ``tma``): descriptors, then the autotuned
    kernel, or the kernel at a tuning run's ``config``."""
    M, N, K, config, op = t["M"], t["N"], t["K"], t["config"], t["op"]
    b_t, b_kn = _b_layout(b)
    nsm = _num_sms(a.device.index if a.device.index is not None else torch.cuda.current_device())
    if config is None:
        cfg0 = TMA_CONFIGS[0].all_kwargs()
        bm, bn, bk, sub = cfg0["BLOCK_M"], cfg0["BLOCK_N"], cfg0["BLOCK_K"], cfg0["EPILOGUE_SUBTILE"]
    else:
        cfg = _check_config(config, op, _TMA_KEYS_USER)
        bm, bn, bk = cfg.get("BLOCK_M", 128), cfg.get("BLOCK_N", 256), cfg.get("BLOCK_K", 64)
        sub = bool(cfg.get("EPILOGUE_SUBTILE", True))
        check_tile(bm, bn, op=op)
    # descriptors carry shape, strides and the block shape (set again by the autotuner's pre-hook)
    a_desc = TensorDescriptor.from_tensor(a, [bm, bk])
    b_desc = TensorDescriptor.from_tensor(b_t, [bk, bn] if b_kn else [bn, bk])
    c2 = c if c.dim() == 2 else c.view(M, N)  # linear's (..., N) output: its rows, as (M, N)
    c_desc = TensorDescriptor.from_tensor(c2, [bm, bn // 2] if sub else [bm, bn])
    args = (a_desc, b_desc, c_desc, bias_t, res_t, scale_t, M, N, K, t["stride_rm"], t["stride_rn"])
    flags = t["flags"]
    if config is None:

        def grid(meta):
            tiles = cdiv(M, meta["BLOCK_M"]) * cdiv(N, meta["BLOCK_N"])
            return (min(nsm * meta["PROGRAMS_PER_SM"], tiles),)

        _matmul_tma_autotuned[grid](*args, B_KN=b_kn, **flags)
    else:
        pps = cfg.get("PROGRAMS_PER_SM", 1)
        grid = (min(nsm * pps, cdiv(M, bm) * cdiv(N, bn)),)
        _matmul_tma_kernel[grid](
            *args,
            BLOCK_M=bm,
            BLOCK_N=bn,
            BLOCK_K=bk,
            GROUP_M=cfg.get("GROUP_M", 8),
            B_KN=b_kn,
            PROGRAMS_PER_SM=pps,
            EPILOGUE_SUBTILE=sub,
            WARP_SPECIALIZE=bool(cfg.get("WARP_SPECIALIZE", False)),
            num_warps=cfg.get("num_warps", 8),
            num_stages=cfg.get("num_stages", 3),
            **flags,
        )


def _check_gemm_args(a, b, bias, activation, residual, row_scale, op: str) -> None:
    """:func:`gemm`'s inputs, for a direct call: what :func:`matmul` and ``linear`` check before theirs."""
    check_operand(a, "a", op)
    check_operand(b, "b", op)
    check_same(a, b, "a and b", op=op, shape=False)
    if a.shape[1] != b.shape[0]:
        raise KernelInputError(
            f"{op}: a is {tuple(a.shape)} and b is {tuple(b.shape)}: a's columns must equal b's rows."
        )
    check_choice(activation, ACTIVATION_CODES, "activation (a code)", op=op)
    M, N = a.shape[0], b.shape[1]
    if bias is not None:
        check_tensor(bias, "bias", op=op, ndim=1)
        check_same(a, bias, "a and bias", op=op, shape=False)
        if bias.shape[0] != N:
            raise KernelInputError(f"{op}: bias has {bias.shape[0]} elements; the output has N={N} columns.")
    if residual is not None:
        check_operand(residual, "residual", op)
        check_same(a, residual, "a and residual", op=op, shape=False)
        if tuple(residual.shape) != (M, N):
            raise KernelInputError(f"{op}: residual is {tuple(residual.shape)}; the output is {(M, N)}.")
    if row_scale is not None:
        check_tensor(row_scale, "row_scale", op=op, dtypes=(torch.float32,), ndim=1)
        if row_scale.shape[0] != M or row_scale.device != a.device:
            raise KernelInputError(f"{op}: row_scale must be ({M},) fp32 on {a.device}, got {tuple(row_scale.shape)}.")


def check_operand(t, name: str, op: str, dtypes=None) -> torch.Tensor:
    """A 2-D matmul operand: device, dtype, no lazy negation, no grad. Row-major or column-major
    (a transposed view such as ``w.t()``) strides; the launcher picks the TMA path only for row-major
    rows that are 16 bytes aligned, and the plain kernel reads either."""
    if isinstance(t, torch.Tensor) and t.dim() == 2 and t.shape[1] > 1 and t.stride(1) != 1:
        if t.shape[0] > 1 and t.stride(0) != 1:
            raise KernelInputError(
                f"{op}: {name} has strides {t.stride()} (shape {tuple(t.shape)}): neither its rows nor its "
                f"columns are contiguous. Pass {name}.contiguous()."
            )
        check_tensor(t.t(), name, op=op, dtypes=dtypes, ndim=2, contiguous=False, max_numel=None)
    else:
        check_tensor(t, name, op=op, dtypes=dtypes, ndim=2, contiguous=False, max_numel=None)
    return t


def matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    variant: str | None = None,
    config: dict | None = None,
    input_precision: str | None = None,
) -> torch.Tensor:
    """``a @ b`` for ``a`` (M, K) and ``b`` (K, N): one launch, fp32 accumulation, any M, N, K.

    fp16/bf16 on a GPU (fp32 too, as TF32 by default, see the module docstring); fp32/fp16 in the
    interpreter. Any strides (``b`` may be ``w.t()``). ``variant``: None picks the Hopper TMA kernel
    where it applies (see :func:`matmul_config`) and the plain kernel otherwise; ``"plain"`` or
    ``"tma"`` force one. ``config``: tile overrides for a tuning sweep (``BLOCK_M``, ``BLOCK_N``,
    ``BLOCK_K``, ``GROUP_M``, ``num_warps``, ``num_stages``; the TMA kernel also takes
    ``EPILOGUE_SUBTILE`` and ``WARP_SPECIALIZE``); with a config the TMA path skips the autotuner.
    Trips: :func:`matmul_ledger`. Reference: :func:`matmul_reference`.
    """
    op = "matmul"
    check_operand(a, "a", op)
    check_operand(b, "b", op)
    if a.dtype != b.dtype or a.device != b.device:
        raise KernelInputError(
            f"{op}: a and b must share dtype and device, got {a.dtype}/{a.device} and {b.dtype}/{b.device}."
        )
    if a.shape[1] != b.shape[0]:
        raise KernelInputError(
            f"{op}: a is {tuple(a.shape)} and b is {tuple(b.shape)}: a's columns (K) must equal b's rows. "
            "For F.linear's (N, K) weight pass weight.t(), or use fusionlab.kernels.linear.linear."
        )
    return gemm(a, b, variant=variant, config=config, input_precision=input_precision, op=op, checked=True)
