"""Lesson 7's checkers accept the reference solutions and reject each kind of wrong answer.

The right answers below are the ones in solutions/07_flash_attention.ipynb; the wrong ones are the
mistakes the checkers are there to catch: an accumulator not rescaled (and l rescaled but not acc), m
initialised to 0, a division per key block, a causal mask off by one (strict, and one key late), a
kernel that materialises the scores, no max subtraction, a base-2 log-sum-exp, torch instead of
Triton, the package's own kernel; wrong counts of naive attention's peak memory.
"""

from __future__ import annotations  # noqa: I001  (fusionlab before triton: see test_checkers_lesson2.py)

import math

import pytest
import torch

from fusionlab import runtime
import triton
import triton.language as tl

from fusionlab.grading import CheckFailed
from fusionlab.kernels.attention import attention, attention_eager
from fusionlab.lessons.l7 import checkers as ex

pytestmark = [
    pytest.mark.lesson7,
    # the interpreter computes masked lanes too (exp of -inf - -inf), and the wrong answers overflow on purpose
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning"),
]

BLOCK_M, BLOCK_N = runtime.pick(gpu=(64, 32), interpreter=(32, 16))


# -- exercise 1: the online-softmax update -----------------------------------------------------------------
def solution_update(m, l, acc, s, v):  # noqa: E741
    m_new = torch.maximum(m, s.max(dim=1).values)
    alpha = torch.exp(m - m_new)
    p = torch.exp(s - m_new[:, None])
    return m_new, l * alpha + p.sum(dim=1), acc * alpha[:, None] + p @ v


def update_no_rescale(m, l, acc, s, v):  # noqa: E741
    m_new = torch.maximum(m, s.max(dim=1).values)
    p = torch.exp(s - m_new[:, None])
    return m_new, l + p.sum(dim=1), acc + p @ v


def update_l_not_acc(m, l, acc, s, v):  # noqa: E741
    m_new = torch.maximum(m, s.max(dim=1).values)
    alpha = torch.exp(m - m_new)
    p = torch.exp(s - m_new[:, None])
    return m_new, l * alpha + p.sum(dim=1), acc + p @ v


def update_forgets_old_max(m, l, acc, s, v):  # noqa: E741
    m_new = s.max(dim=1).values
    alpha = torch.exp(m - m_new)
    p = torch.exp(s - m_new[:, None])
    return m_new, l * alpha + p.sum(dim=1), acc * alpha[:, None] + p @ v


def update_divides(m, l, acc, s, v):  # noqa: E741
    """Keeps acc normalised, FlashAttention-1 style: right at the end, but a division per block."""
    m_new = torch.maximum(m, s.max(dim=1).values)
    alpha = torch.exp(m - m_new)
    p = torch.exp(s - m_new[:, None])
    l_new = l * alpha + p.sum(dim=1)
    return m_new, l_new, (acc * (l * alpha)[:, None] + p @ v) / l_new[:, None]


def update_no_max(m, l, acc, s, v):  # noqa: E741
    """exp(s) without the max: l and acc are sums of exp(s), m tracked but not used."""
    m_new = torch.maximum(m, s.max(dim=1).values)
    p = torch.exp(s)
    return m_new, l + p.sum(dim=1), acc + p @ v


def test_online_update_accepts_the_solution(capsys):
    msg = ex.check_online_update(solution_update)
    assert msg.startswith("✓ online_update: 16 block steps")
    assert capsys.readouterr().out.count("✓") == 1


@pytest.mark.parametrize(
    "wrong,match",
    [
        (update_no_rescale, "alpha = exp"),
        (update_l_not_acc, "l is right but acc is not"),
        (update_forgets_old_max, "old max must survive"),
        (update_divides, "already divided by l"),
        (update_no_max, "Subtract the running max"),
        (lambda m, l, acc, s, v: (m, l), "three tensors"),  # noqa: E741
    ],
)
def test_online_update_rejects(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        ex.check_online_update(wrong)


# -- exercises 2 and 3: the tiled forward kernel, the solution -------------------------------------------
@triton.jit
def _flash_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, n_q, n_k, scale,
                  stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_om,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr):  # fmt: skip
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d[None, :] < HEAD_DIM
    q = tl.load(q_ptr + bh * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=(offs_m[:, None] < n_q) & d_mask, other=0.0)  # fmt: skip
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    hi = n_k
    if CAUSAL:
        hi = tl.minimum(n_k, (pid_m + 1) * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n[:, None] < n_k) & d_mask
        k = tl.load(k_ptr + bh * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + bh * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        keep = offs_n[None, :] < n_k
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= offs_n[None, :])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    o = acc / l_i[:, None]
    row_mask = offs_m < n_q
    tl.store(o_ptr + bh * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
             o.to(o_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask)  # fmt: skip
    tl.store(lse_ptr + bh * n_q + offs_m, m_i + tl.log(l_i), mask=row_mask)


def _launch(kernel, q, k, v, causal, block_n=BLOCK_N, **extra):
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(n_q, BLOCK_M), B * H)
    kernel[grid](q, k, v, o, lse, n_q, n_k, 1 / math.sqrt(d),
                 q.stride(1), q.stride(2), k.stride(1), k.stride(2), v.stride(1), v.stride(2), o.stride(1), o.stride(2),
                 HEAD_DIM=d, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_M=BLOCK_M, BLOCK_N=block_n,
                 CAUSAL=causal, **extra)  # fmt: skip
    return o, lse


def solution_flash(q, k, v):
    return _launch(_flash_kernel, q, k, v, False)


def solution_flash_causal(q, k, v):
    return _launch(_flash_kernel, q, k, v, True)


# -- wrong answers: one kernel, a constexpr picks the mistake ---------------------------------------------
NO_RESCALE, L_NOT_ACC, M_ZERO, STRICT, LATE, NO_MAX, BASE2, ONE_BLOCK, BEFORE_DIAGONAL = range(1, 10)
#: ONE_BLOCK: every key in one block of this many, no loop (right while N_k fits it)
ONE_BLOCK_N = 256


@triton.jit
def _buggy_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, n_q, n_k, scale,
                  stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_om,
                  HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr, BUG: tl.constexpr):  # fmt: skip
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d[None, :] < HEAD_DIM
    q = tl.load(q_ptr + bh * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=(offs_m[:, None] < n_q) & d_mask, other=0.0)  # fmt: skip
    if BUG == 3:  # M_ZERO
        m_i = tl.zeros([BLOCK_M], tl.float32)
    else:
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    hi = n_k
    if CAUSAL:
        hi = tl.minimum(n_k, (pid_m + 2) * BLOCK_M)
    if BUG == 8:  # ONE_BLOCK: launched with BLOCK_N = ONE_BLOCK_N, one trip round the loop
        hi = 1
    if BUG == 9:  # BEFORE_DIAGONAL (held out): the causal loop stops where the query tile starts
        hi = tl.minimum(n_k, pid_m * BLOCK_M)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n[:, None] < n_k) & d_mask
        k = tl.load(k_ptr + bh * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + bh * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        keep = offs_n[None, :] < n_k
        if CAUSAL:
            if BUG == 4:  # STRICT
                keep = keep & (offs_m[:, None] > offs_n[None, :])
            elif BUG == 5:  # LATE
                keep = keep & (offs_m[:, None] + 1 >= offs_n[None, :])
            else:
                keep = keep & (offs_m[:, None] >= offs_n[None, :])
        s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if BUG == 6:  # NO_MAX
            p = tl.exp(s)
        else:
            p = tl.exp(s - m_new[:, None])
        if BUG == 1 or BUG == 6:  # NO_MAX
            l_i = l_i + tl.sum(p, 1)
            acc = acc + tl.dot(p.to(v.dtype), v)
        elif BUG == 2:  # L_NOT_ACC
            l_i = l_i * tl.exp(m_i - m_new) + tl.sum(p, 1)
            acc = acc + tl.dot(p.to(v.dtype), v)
        else:
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    o = acc / l_i[:, None]
    if BUG == 6:  # NO_MAX
        lse = tl.log(l_i)
    elif BUG == 7:  # BASE2
        lse = (m_i + tl.log(l_i)) * 1.4426950408889634
    else:
        lse = m_i + tl.log(l_i)
    row_mask = offs_m < n_q
    tl.store(o_ptr + bh * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
             o.to(o_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask)  # fmt: skip
    tl.store(lse_ptr + bh * n_q + offs_m, lse, mask=row_mask)


def buggy(bug, causal=False):
    block_n = ONE_BLOCK_N if bug == ONE_BLOCK else BLOCK_N
    return lambda q, k, v: _launch(_buggy_kernel, q, k, v, causal, block_n=block_n, BUG=bug)


@triton.jit
def _divide_per_block_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, n_q, n_k, scale,
                             stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_om,
                             HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):  # fmt: skip
    """FlashAttention-1's normalised accumulator: right values, a division per key block."""
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d[None, :] < HEAD_DIM
    q = tl.load(q_ptr + bh * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=(offs_m[:, None] < n_q) & d_mask, other=0.0)  # fmt: skip
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(0, n_k, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n[:, None] < n_k) & d_mask
        k = tl.load(k_ptr + bh * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + bh * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.where(offs_n[None, :] < n_k, tl.dot(q, tl.trans(k)) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_new = l_i * alpha + tl.sum(p, 1)
        acc = (acc * (l_i * alpha)[:, None] + tl.dot(p.to(v.dtype), v)) / l_new[:, None]
        l_i = l_new
        m_i = m_new
    row_mask = offs_m < n_q
    tl.store(o_ptr + bh * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
             acc.to(o_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask)  # fmt: skip
    tl.store(lse_ptr + bh * n_q + offs_m, m_i + tl.log(l_i), mask=row_mask)


def divide_per_block(q, k, v):
    return _launch(_divide_per_block_kernel, q, k, v, False)


@triton.jit
def _scores_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, s_ptr, n_q, n_k, scale,
                   stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_om,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   CAUSAL: tl.constexpr):  # fmt: skip
    """Right values, one launch, but every score tile is also written to an (N_q, N_k) buffer in HBM."""
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d[None, :] < HEAD_DIM
    q = tl.load(q_ptr + bh * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=(offs_m[:, None] < n_q) & d_mask, other=0.0)  # fmt: skip
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(0, n_k, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n[:, None] < n_k) & d_mask
        k = tl.load(k_ptr + bh * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + bh * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.where(offs_n[None, :] < n_k, tl.dot(q, tl.trans(k)) * scale, float("-inf"))
        s_mask = (offs_m[:, None] < n_q) & (offs_n[None, :] < n_k)
        tl.store(s_ptr + bh * n_q * n_k + offs_m[:, None] * n_k + offs_n[None, :], s, mask=s_mask)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    o = acc / l_i[:, None]
    row_mask = offs_m < n_q
    tl.store(o_ptr + bh * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
             o.to(o_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask)  # fmt: skip
    tl.store(lse_ptr + bh * n_q + offs_m, m_i + tl.log(l_i), mask=row_mask)


def materialises_scores(q, k, v):
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    s = torch.empty((B, H, n_q, n_k), dtype=torch.float32, device=q.device)
    _scores_kernel[(triton.cdiv(n_q, BLOCK_M), B * H)](
        q, k, v, o, lse, s, n_q, n_k, 1 / math.sqrt(d),
        q.stride(1), q.stride(2), k.stride(1), k.stride(2), v.stride(1), v.stride(2), o.stride(1), o.stride(2),
        HEAD_DIM=d, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=False,
    )  # fmt: skip
    return o, lse


def eager_torch(q, k, v):
    s = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return (torch.softmax(s, -1) @ v.float()).to(q.dtype), torch.logsumexp(s, -1)


# -- the tests ------------------------------------------------------------------------------------------
def test_flash_accepts_the_solutions(capsys):
    assert ex.check_flash_forward(solution_flash).startswith("✓ flash_forward: 17 checks passed")
    assert ex.check_flash_forward_causal(solution_flash_causal).startswith("✓ flash_forward_causal: 18 checks")
    assert capsys.readouterr().out.count("✓") == 2


@pytest.mark.parametrize(
    "wrong,match",
    [
        (buggy(NO_RESCALE), "right when each row's max is in the first key block"),
        (buggy(L_NOT_ACC), "multiply l AND acc"),
        (buggy(M_ZERO), "m must start at -inf"),
        (buggy(NO_MAX), "subtract the running max"),
        (buggy(BASE2), "base 2"),
        (divide_per_block, "divides inside its key loop"),
        (buggy(ONE_BLOCK), "right on rows of up to 129 keys and is wrong on 4099.*one block of a fixed size"),
        (materialises_scores, "allocates a tensor of"),
        (eager_torch, "computes or copies with torch"),
        (lambda q, k, v: attention(q, k, v), "own kernel"),
        (lambda q, k, v: (attention_eager(q, k, v), None), "computes or copies with torch"),
        (lambda q, k, v: attention_eager(q, k, v), "a pair"),
    ],
    ids=[
        "no-rescale",
        "l-not-acc",
        "m-zero",
        "no-max",
        "base2",
        "divide",
        "one-block",
        "scores",
        "torch",
        "package",
        "eager",
        "O-only",
    ],
)
def test_flash_rejects(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        ex.check_flash_forward(wrong)


@pytest.mark.parametrize(
    "bug,match",
    [(STRICT, "strict"), (LATE, "one key late"), (M_ZERO, "m must start at -inf"), (NO_RESCALE, "first key block")],
    ids=["strict", "late", "m-zero", "no-rescale"],
)
def test_flash_causal_rejects(bug, match):
    with pytest.raises(CheckFailed, match=match):
        ex.check_flash_forward_causal(buggy(bug, causal=True))


@pytest.mark.skipif(not runtime.is_interpreter(), reason="the seeds found these inputs in the interpreter (fp32)")
def test_scores_near_400_in_fp32_accept_a_right_kernel_and_still_diagnose_m_zero():
    # two seeds whose fp32 inputs with scores near +-400 put a row of the right kernel 1.1e-4 off float64 (the
    # rounding of a score that large), past O_TOL's 1e-4: the right kernel was rejected, and an m = 0 kernel,
    # right at +400, was rejected for that row instead of being told about m
    from fusionlab.grading import replay

    with replay(172328960669540):
        assert ex.check_flash_forward_causal(solution_flash_causal).startswith("✓")
    with replay(14522503761271), pytest.raises(CheckFailed, match="m must start at -inf"):
        ex.check_flash_forward_causal(buggy(M_ZERO, causal=True))


def test_flash_causal_rejects_one_block_of_keys():
    with pytest.raises(CheckFailed, match="right on rows of up to 100 keys and is wrong on 600"):
        ex.check_flash_forward_causal(buggy(ONE_BLOCK, causal=True))


def test_flash_causal_rejects_a_full_kernel():
    with pytest.raises(CheckFailed, match="rows of O differ"):
        ex.check_flash_forward_causal(solution_flash)


# -- exercise 4 -----------------------------------------------------------------------------------------
def test_naive_peak():
    one = 32 * 8192**2 * 2 / 2**30
    assert ex.check_naive_peak_gib(2 * one + 32 * 8192 * 128 * 2 / 2**30).startswith("✓ naive peak")
    for wrong, match in ((one, "one N x N"), (3 * one, "freed"), (4 * one, "fp16"), (2 * one * 2**30, "bytes")):
        with pytest.raises(CheckFailed, match=match):
            ex.check_naive_peak_gib(wrong)
    with pytest.raises(CheckFailed, match="finite number"):
        ex.check_naive_peak_gib(None)


# -- the suite's readers (no GPU needed) ------------------------------------------------------------------
def test_suite_bars_and_peaks_read_a_run():
    from fusionlab.bench import Result
    from fusionlab.lessons.l7 import suite

    results = []
    for d in suite.HEAD_DIMS:
        for n in suite.NS:
            for causal in (False, True):
                results += [Result(suite.case_name(d, n, causal, "ours"), 1.0)]
                results += [Result(suite.case_name(d, n, causal, "flash"), 1.3)]
                results += [Result(suite.case_name(d, n, causal, "cudnn"), 0.9 if n < 16384 else 0.8)]
    (flash, met_f, _), (cudnn, met_c, detail) = suite.bars(results)
    assert "flash" in flash and met_f and "cudnn" in cudnn and not met_c and "8 of 12" in detail
    results += [
        Result(suite.peak_name("naive", 1024), 1.0, nbytes=2**30),
        Result(suite.peak_name("ours", 1024), 1.0, nbytes=2**20),
        Result(suite.oom_name(65536), 1.0),
    ]
    peaks = suite.peaks_from(results)
    assert [(p.variant, p.n, p.peak_bytes) for p in peaks] == [
        ("naive", 1024, 2**30),
        ("ours", 1024, 2**20),
        ("naive", 65536, None),
    ]
    assert max(len(r.name) for r in results) <= 34  # bench.table's name column


# -- held out: mistakes the checks once let through, or named wrongly ----------------------------------------
def update_in_float32(m, l, acc, s, v):  # noqa: E741
    m32, l32, a32, s32, v32 = (t.float() for t in (m, l, acc, s, v))
    m_new = torch.maximum(m32, s32.max(dim=1).values)
    alpha = torch.exp(m32 - m_new)
    p = torch.exp(s32 - m_new[:, None])
    return m_new, l32 * alpha + p.sum(dim=1), a32 * alpha[:, None] + p @ v32


def test_online_update_names_float32_precision():
    with pytest.raises(CheckFailed, match=r"m, l, acc are float32.*works in float64"):
        ex.check_online_update(update_in_float32)


def test_causal_flash_names_a_loop_that_stops_before_the_diagonal():
    with pytest.raises(CheckFailed, match=r"stops before the diagonal block"):
        ex.check_flash_forward_causal(buggy(BEFORE_DIAGONAL, causal=True))


@triton.jit
def _renormalise(acc, l_old, alpha, pv, l_new):
    return (acc * (l_old * alpha)[:, None] + pv) / l_new[:, None]


@triton.jit
def _divide_in_helper_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, n_q, n_k, scale,
                             stride_qh, stride_qm, stride_kh, stride_kn, stride_vh, stride_vn, stride_oh, stride_om,
                             HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                             BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):  # fmt: skip
    """The division per key block moved into a jit helper: the kernel still divides in its loop."""
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d[None, :] < HEAD_DIM
    q = tl.load(q_ptr + bh * stride_qh + offs_m[:, None] * stride_qm + offs_d[None, :],
                mask=(offs_m[:, None] < n_q) & d_mask, other=0.0)  # fmt: skip
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start_n in range(0, n_k, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        kv_mask = (offs_n[:, None] < n_k) & d_mask
        k = tl.load(k_ptr + bh * stride_kh + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + bh * stride_vh + offs_n[:, None] * stride_vn + offs_d[None, :], mask=kv_mask, other=0.0)
        s = tl.where(offs_n[None, :] < n_k, tl.dot(q, tl.trans(k)) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_new = l_i * alpha + tl.sum(p, 1)
        acc = _renormalise(acc, l_i, alpha, tl.dot(p.to(v.dtype), v), l_new)
        l_i = l_new
        m_i = m_new
    row_mask = offs_m < n_q
    tl.store(o_ptr + bh * stride_oh + offs_m[:, None] * stride_om + offs_d[None, :],
             acc.to(o_ptr.dtype.element_ty), mask=row_mask[:, None] & d_mask)  # fmt: skip
    tl.store(lse_ptr + bh * n_q + offs_m, m_i + tl.log(l_i), mask=row_mask)


def test_flash_rejects_a_division_moved_into_a_helper():
    with pytest.raises(CheckFailed, match=r"divides inside its key loop \(_renormalise\(\): "):
        ex.check_flash_forward(lambda q, k, v: _launch(_divide_in_helper_kernel, q, k, v, False))


def test_a_helper_that_divides_by_a_constant_is_no_division_per_block():
    sources = ex._KernelSources(lambda: None, [])
    sources.sources = {
        "kern": "def kern(x, n):\n    for i in range(n):\n        x = scale(x, 4)\n    return x\n",
        "scale": "def scale(x, d):\n    return x / d\n",
    }
    assert sources.divisions_in_loops() == []


def test_kernel_sources_sent_by_the_grading_command_are_read():
    # under `python -m fusionlab grade` the answer lives in another process, which sends its jit sources
    class Remote:
        kernel_sources = {
            "kern": "def kern(acc, l, n):\n    for i in range(n):\n        l = l + 1\n        acc = norm(acc, l)\n",
            "norm": "def norm(a, d):\n    return a / d\n",
        }

    assert ex._KernelSources(Remote(), ["kern"]).divisions_in_loops() == ["norm(): a / d"]
