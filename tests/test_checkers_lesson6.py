"""Lesson 6's checkers accept the reference solutions and reject each kind of wrong answer.

The right answers below are the ones in solutions/06_fused_epilogues.ipynb (plus a two-launch RMSNorm
prologue with an rstd pre-pass, which is right too); the wrong ones are the mistakes the checkers are
there to catch: the epilogue as a second kernel, torch's matmul under a Triton epilogue, the bias along
the wrong axis, unmasked edge tiles (K, or M and N), an fp16 accumulator, rstd from one K-tile, the
normalised x written to memory, and miscounted matmul ledgers.

Interpreter matmuls are slow: one kernel per exercise with a constexpr ``MISTAKE`` code keeps the file
short, and the checkers' shapes are small.
"""

from __future__ import annotations  # noqa: I001  (fusionlab before triton: see test_checkers_lesson2.py)

import math

import pytest
import torch

from fusionlab import runtime
import triton
import triton.language as tl

from fusionlab.grading import CheckFailed
from fusionlab.kernels.linear import linear
from fusionlab.ledger import Ledger
from fusionlab.lessons.l6 import checkers as ex

pytestmark = [
    pytest.mark.lesson6,
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning"),
]

BLOCK_M, BLOCK_N, BLOCK_K = runtime.pick(gpu=(64, 64, 32), interpreter=(32, 32, 32))

# mistake codes of the exercise-1 kernel
RIGHT, BIAS_ROWS, NO_K_MASK, NO_MN_MASK, FP16_ACC, NO_BIAS, TANH, NO_EPILOGUE, ONE_K_TILE = range(9)


# -- exercise 1: the solution and its mistakes ----------------------------------------------------------
@triton.jit
def _linear_gelu_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MISTAKE: tl.constexpr,
):
    pid_m = tl.program_id(axis=0)
    pid_n = tl.program_id(axis=1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    if MISTAKE == 4:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float16)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # ONE_K_TILE: launched with BLOCK_K = 512, one trip round the loop: right while K <= 512
    for k0 in range(0, K if MISTAKE != 8 else 1, BLOCK_K):
        kk = k0 + offs_k
        mask_a = (offs_m[:, None] < M) & (kk[None, :] < K)
        mask_b = (offs_n[None, :] < N) & (kk[:, None] < K)
        if MISTAKE == 2:  # edges of M and N masked, the last K step not
            mask_a = offs_m[:, None] < M
            mask_b = offs_n[None, :] < N
        if MISTAKE == 3:  # the K step masked, the edge tiles of M and N not
            mask_a = kk[None, :] < K
            mask_b = kk[:, None] < K
        a = tl.load(x_ptr + offs_m[:, None] * stride_xm + kk[None, :], mask=mask_a, other=0.0)
        b = tl.load(w_ptr + offs_n[None, :] * stride_wn + kk[:, None], mask=mask_b, other=0.0)
        if MISTAKE == 4:
            acc += tl.dot(a, b).to(tl.float16)
        else:
            acc += tl.dot(a, b)
    v = acc.to(tl.float32)
    if MISTAKE == 1:
        v += tl.load(b_ptr + offs_m, mask=offs_m < N, other=0.0).to(tl.float32)[:, None]
    elif MISTAKE != 5 and MISTAKE != 7:
        v += tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    if MISTAKE == 6:
        y = v * tl.sigmoid(1.5957691216057308 * (v + 0.044715 * v * v * v))
    elif MISTAKE == 7:
        y = v
    else:
        y = 0.5 * v * (1.0 + tl.erf(v * 0.7071067811865476))
    mask_y = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if MISTAKE == 3:
        tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], y.to(y_ptr.dtype.element_ty))
    else:
        tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], y.to(y_ptr.dtype.element_ty), mask=mask_y)


def _launch(x, w, b, mistake=RIGHT):
    M, K = x.shape
    N = w.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    block_k = 512 if mistake == ONE_K_TILE else BLOCK_K
    _linear_gelu_kernel[grid](
        x, w, b, y, M, N, K, x.stride(0), w.stride(0), y.stride(0), BLOCK_M, BLOCK_N, block_k, MISTAKE=mistake
    )
    return y


def solution_linear_gelu(x, w, b):
    return _launch(x, w, b)


@triton.jit
def _bias_gelu_kernel(h_ptr, b_ptr, y_ptr, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    v = tl.load(h_ptr + offs_m[:, None] * N + offs_n[None, :], mask=mask).to(tl.float32)
    v += tl.load(b_ptr + offs_n, mask=offs_n < N).to(tl.float32)[None, :]
    y = 0.5 * v * (1.0 + tl.erf(v * 0.7071067811865476))
    tl.store(y_ptr + offs_m[:, None] * N + offs_n[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def _epilogue(h, b):
    M, N = h.shape
    y = torch.empty_like(h)
    _bias_gelu_kernel[(triton.cdiv(M, 32), triton.cdiv(N, 32))](h, b, y, M, N, BLOCK_M=32, BLOCK_N=32)
    return y


def two_kernels(x, w, b):  # the matmul writes h; a second kernel reads it back for bias + GELU
    return _epilogue(_launch(x, w, b, NO_EPILOGUE), b)


def torch_matmul_then_triton(x, w, b):
    return _epilogue(x @ w.t(), b)


def test_linear_gelu_accepts_the_solution(capsys):
    assert "✓ linear_gelu" in ex.check_linear_gelu(solution_linear_gelu)
    assert capsys.readouterr().out.count("✓") == 1


def _rejects(check, fn, *fragments):
    with pytest.raises(CheckFailed) as e:
        check(fn)
    for f in fragments:
        assert f in str(e.value), str(e.value)
    return str(e.value)


def test_linear_gelu_rejects_a_two_kernel_epilogue():
    _rejects(ex.check_linear_gelu, two_kernels, "saw 2", "second kernel for the epilogue")


def test_linear_gelu_rejects_torch_matmul_under_a_triton_epilogue():
    _rejects(ex.check_linear_gelu, torch_matmul_then_triton, "torch computes the matrix product")


def test_linear_gelu_rejects_the_bias_along_the_wrong_axis():
    _rejects(ex.check_linear_gelu, lambda x, w, b: _launch(x, w, b, BIAS_ROWS), "wrong axis", "offs_n")


def test_linear_gelu_rejects_an_unmasked_k_edge():
    msg = _rejects(ex.check_linear_gelu, lambda x, w, b: _launch(x, w, b, NO_K_MASK), "(64, 100, 64)")
    assert "last K step" in msg


def test_linear_gelu_rejects_one_k_tile_for_every_k():
    # right for every K up to 512: the checker's K of 1100 is not
    _rejects(ex.check_linear_gelu, lambda x, w, b: _launch(x, w, b, ONE_K_TILE), "(5, 1100, 9)")


def test_linear_gelu_rejects_unmasked_edge_tiles_of_m_and_n():
    _rejects(ex.check_linear_gelu, lambda x, w, b: _launch(x, w, b, NO_MN_MASK), "past the end", "offs_m")


def test_linear_gelu_rejects_an_fp16_accumulator():
    # named by type (the interpreter's adds, a GPU's IR) before any value could show it
    _rejects(ex.check_linear_gelu, lambda x, w, b: _launch(x, w, b, FP16_ACC), "sums in 16 bits", "tl.float32")


@pytest.mark.parametrize(
    "mistake, fragment",
    [
        (NO_BIAS, "bias is missing"),
        # on a GPU the checks run in fp16 and bf16 only, where tanh-GELU is within the dtype's tolerance
        pytest.param(
            TANH, "tanh", marks=pytest.mark.skipif(runtime.is_gpu(), reason="fp32 is checked in the interpreter")
        ),
        (NO_EPILOGUE, "epilogue is missing"),
    ],
)
def test_linear_gelu_names_a_missing_or_wrong_epilogue(mistake, fragment):
    _rejects(ex.check_linear_gelu, lambda x, w, b: _launch(x, w, b, mistake), fragment)


def test_linear_gelu_refuses_the_package_kernel_and_non_functions():
    _rejects(ex.check_linear_gelu, lambda x, w, b: linear(x, w, b, "gelu"), "fusionlab's own kernel")
    _rejects(ex.check_linear_gelu, 3, "pass your function")


def test_linear_gelu_reports_a_stub():
    def stub(x, w, b):
        raise NotImplementedError("Exercise: the K loop")

    _rejects(ex.check_linear_gelu, stub, "not done yet", "the K loop")


# -- exercise 2: the RMSNorm prologue -------------------------------------------------------------------
RMS_RIGHT, RMS_FIRST_TILE, RMS_LAST_TILE, RMS_NO_EPS, RMS_PER_TILE, RMS_PADDED_K = range(6)


@triton.jit
def _rmsnorm_matmul_kernel(
    x_ptr,
    w_ptr,
    y_ptr,
    M,
    N,
    K,
    eps,
    stride_xm,
    stride_wn,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MISTAKE: tl.constexpr,
):
    pid_m = tl.program_id(axis=0)
    pid_n = tl.program_id(axis=1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    sum_sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        a = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + kk[None, :], mask=(offs_m[:, None] < M) & (kk[None, :] < K), other=0.0
        )
        b = tl.load(
            w_ptr + offs_n[None, :] * stride_wn + kk[:, None], mask=(offs_n[None, :] < N) & (kk[:, None] < K), other=0.0
        )
        af = a.to(tl.float32)
        tile_sq = tl.sum(af * af, axis=1)
        if MISTAKE == 1:
            sum_sq = tl.where(k0 == 0, tile_sq, sum_sq)
        elif MISTAKE == 2:
            sum_sq = tile_sq  # the last tile's alone
        else:
            sum_sq += tile_sq
        if MISTAKE == 4:  # each tile normalised by its own statistic before its product
            acc += tl.dot(a, b) * (1.0 / tl.sqrt(tl.sum(af * af, axis=1) / BLOCK_K + eps))[:, None]
        else:
            acc += tl.dot(a, b)
    if MISTAKE == 3:
        rstd = 1.0 / tl.sqrt(sum_sq / K)
    elif MISTAKE == 5:  # the mean over the width the K tiles cover, padding included
        rstd = 1.0 / tl.sqrt(sum_sq / (tl.cdiv(K, BLOCK_K) * BLOCK_K) + eps)
    else:
        rstd = 1.0 / tl.sqrt(sum_sq / K + eps)
    if MISTAKE != 4:
        acc = acc * rstd[:, None]
    tl.store(
        y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :],
        acc.to(y_ptr.dtype.element_ty),
        mask=(offs_m[:, None] < M) & (offs_n[None, :] < N),
    )


def _launch_rms(x, w, eps, mistake=RMS_RIGHT):
    M, K = x.shape
    N = w.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    _rmsnorm_matmul_kernel[grid](
        x, w, y, M, N, K, eps, x.stride(0), w.stride(0), y.stride(0), BLOCK_M, BLOCK_N, BLOCK_K, MISTAKE=mistake
    )
    return y


def solution_rmsnorm_matmul(x, w, eps):
    return _launch_rms(x, w, eps)


@triton.jit
def _rstd_kernel(x_ptr, rstd_ptr, xn_ptr, K, eps, stride_xm, BLOCK: tl.constexpr, WRITE_XN: tl.constexpr):
    row = tl.program_id(0)
    sum_sq = tl.zeros((BLOCK,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        v = tl.load(x_ptr + row * stride_xm + offs, mask=offs < K, other=0.0).to(tl.float32)
        sum_sq += v * v
    rstd = 1.0 / tl.sqrt(tl.sum(sum_sq, axis=0) / K + eps)
    tl.store(rstd_ptr + row, rstd)
    if WRITE_XN:  # the normalised row, written out for the matmul to read back
        for k0 in range(0, K, BLOCK):
            offs = k0 + tl.arange(0, BLOCK)
            v = tl.load(x_ptr + row * stride_xm + offs, mask=offs < K, other=0.0).to(tl.float32)
            tl.store(xn_ptr + row * K + offs, (v * rstd).to(xn_ptr.dtype.element_ty), mask=offs < K)


@triton.jit
def _row_scaled_matmul_kernel(
    x_ptr,
    w_ptr,
    rstd_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SCALE: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        a = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + kk[None, :], mask=(offs_m[:, None] < M) & (kk[None, :] < K), other=0.0
        )
        b = tl.load(
            w_ptr + offs_n[None, :] * stride_wn + kk[:, None], mask=(offs_n[None, :] < N) & (kk[:, None] < K), other=0.0
        )
        acc += tl.dot(a, b)
    if SCALE:
        acc *= tl.load(rstd_ptr + offs_m, mask=offs_m < M, other=0.0)[:, None]
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask)


def _two_launches(x, w, eps, write_xn: bool):
    M, K = x.shape
    N = w.shape[0]
    rstd = torch.empty(M, dtype=torch.float32, device=x.device)
    xn = torch.empty((M, K), dtype=x.dtype, device=x.device) if write_xn else rstd
    _rstd_kernel[(M,)](x, rstd, xn, K, eps, x.stride(0), BLOCK=128, WRITE_XN=write_xn)
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    a = xn if write_xn else x
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    _row_scaled_matmul_kernel[grid](
        a, w, rstd, y, M, N, K, a.stride(0), w.stride(0), y.stride(0), BLOCK_M, BLOCK_N, BLOCK_K, SCALE=not write_xn
    )
    return y


def test_rmsnorm_matmul_accepts_the_solution_and_a_pre_pass(capsys):
    assert "✓ rmsnorm_matmul" in ex.check_rmsnorm_matmul(solution_rmsnorm_matmul)
    assert "✓ rmsnorm_matmul" in ex.check_rmsnorm_matmul(lambda x, w, eps: _two_launches(x, w, eps, False))
    assert capsys.readouterr().out.count("✓") == 2


@pytest.mark.parametrize("mistake", [RMS_FIRST_TILE, RMS_LAST_TILE])
def test_rmsnorm_matmul_rejects_rstd_from_one_k_tile(mistake):
    _rejects(ex.check_rmsnorm_matmul, lambda x, w, eps: _launch_rms(x, w, eps, mistake), "one K-tile", "whole row")


def test_rmsnorm_matmul_rejects_each_tile_normalised_by_itself():
    _rejects(ex.check_rmsnorm_matmul, lambda x, w, eps: _launch_rms(x, w, eps, RMS_PER_TILE), "differ beyond")


def test_rmsnorm_matmul_rejects_a_mean_over_the_padded_width():
    _rejects(
        ex.check_rmsnorm_matmul, lambda x, w, eps: _launch_rms(x, w, eps, RMS_PADDED_K), "the width the K tiles cover"
    )


def test_rmsnorm_matmul_rejects_a_missing_eps():
    _rejects(ex.check_rmsnorm_matmul, lambda x, w, eps: _launch_rms(x, w, eps, RMS_NO_EPS), "eps is missing")


def test_rmsnorm_matmul_rejects_the_normalised_x_written_out():
    _rejects(ex.check_rmsnorm_matmul, lambda x, w, eps: _two_launches(x, w, eps, True), "as large as x")


def test_rmsnorm_matmul_rejects_torch_doing_the_norm():
    def torch_norm(x, w, eps):
        xn = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype)
        return solution_linear_gelu(xn, w, torch.zeros(w.shape[0], dtype=x.dtype, device=x.device))

    _rejects(ex.check_rmsnorm_matmul, torch_norm, "torch runs")


# -- exercise 3: the matmul's ledger --------------------------------------------------------------------
def solution_ledger(M, N, K, BLOCK_M, BLOCK_N, dtype):
    reads = {"A": M * K * math.ceil(N / BLOCK_N), "B": K * N * math.ceil(M / BLOCK_M)}
    return Ledger(dtype_bytes=dtype).op("matmul", reads=reads, writes={"C": M * N})


def test_matmul_ledger_accepts_the_solution(capsys):
    assert "✓ matmul ledger" in ex.check_matmul_ledger(solution_ledger)
    assert capsys.readouterr().out.count("✓") == 1


def _ledger(ra, rb, dtype_bytes=None):
    def fn(M, N, K, BM, BN, dtype):
        return Ledger(dtype_bytes=dtype_bytes or dtype).op(
            "matmul", reads={"A": ra(M, N, K, BM, BN), "B": rb(M, N, K, BM, BN)}, writes={"C": M * N}
        )

    return fn


@pytest.mark.parametrize(
    "wrong, tip",
    [
        (
            _ledger(
                lambda M, N, K, bm, bn: M * K * math.ceil(M / bm), lambda M, N, K, bm, bn: K * N * math.ceil(N / bn)
            ),
            "swapped",
        ),
        (_ledger(lambda M, N, K, bm, bn: M * K * (N // bn), lambda M, N, K, bm, bn: K * N * (M // bm)), "edge tiles"),
        (_ledger(lambda M, N, K, bm, bn: M * K, lambda M, N, K, bm, bn: K * N), "the ideal"),
        (
            _ledger(
                lambda M, N, K, bm, bn: M * K * math.ceil(N / bn), lambda M, N, K, bm, bn: K * N * math.ceil(M / bm), 4
            ),
            "bytes per element",
        ),
    ],
)
def test_matmul_ledger_rejects_miscounts(wrong, tip):
    _rejects(ex.check_matmul_ledger, wrong, tip)


def test_matmul_ledger_refuses_the_answer_key():
    from fusionlab.kernels.matmul import matmul_ledger

    _rejects(ex.check_matmul_ledger, lambda M, N, K, bm, bn, d: matmul_ledger(M, N, K, bm, bn, d), "answer keys")
