"""Lesson 5's checkers accept the reference solutions and reject each kind of wrong answer.

The right answers below are the ones in solutions/05_gates_and_losses.ipynb; the wrong ones are the
mistakes the checkers are there to catch: SwiGLU as two kernels, the gate on the wrong input, 16-bit
arithmetic that overflows; a cross-entropy gradient without the mean's 1/N, ignored rows in the
denominator or with a gradient (label smoothing included), no max subtraction, a materialised
probability tensor; wrong counts of eager cross-entropy's peak memory.
"""

from __future__ import annotations  # noqa: I001  (fusionlab before triton: see test_checkers_lesson2.py)

import pytest
import torch
import torch.nn.functional as F

from fusionlab import runtime
import triton
import triton.language as tl

from fusionlab.grading import CheckFailed
from fusionlab.kernels.cross_entropy import cross_entropy
from fusionlab.kernels.swiglu import swiglu, swiglu_reference
from fusionlab.lessons.l5 import checkers as ex

pytestmark = [
    pytest.mark.lesson5,
    # the interpreter evaluates sigmoid and exp in numpy, which warns where it overflows (to the right answer)
    # (numpy warns where it overflows or divides by zero, as the wrong answers below do on purpose)
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning"),
]

BLOCK_M, BLOCK_N = runtime.pick(gpu=(1, 1024), interpreter=(64, 256))
BLOCK = runtime.pick(gpu=1024, interpreter=4096)


# -- exercise 1: SwiGLU, the solution ---------------------------------------------------------------
@triton.jit
def _swiglu_kernel(
    g_ptr, u_ptr, h_ptr, n_rows, n_cols, stride_gm, stride_um, stride_hm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    pid = tl.program_id(axis=0)
    n_tiles_n = tl.cdiv(n_cols, BLOCK_N)
    offs_m = (pid // n_tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid % n_tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < n_rows) & (offs_n[None, :] < n_cols)
    g = tl.load(g_ptr + offs_m[:, None] * stride_gm + offs_n[None, :], mask=mask).to(tl.float32)
    u = tl.load(u_ptr + offs_m[:, None] * stride_um + offs_n[None, :], mask=mask).to(tl.float32)
    h = g * tl.sigmoid(g) * u
    tl.store(h_ptr + offs_m[:, None] * stride_hm + offs_n[None, :], h.to(h_ptr.dtype.element_ty), mask=mask)


def _launch_swiglu(kernel, g, u):
    n_rows, n_cols = g.shape
    h = torch.empty((n_rows, n_cols), dtype=g.dtype, device=g.device)
    grid = (triton.cdiv(n_rows, BLOCK_M) * triton.cdiv(n_cols, BLOCK_N),)
    kernel[grid](g, u, h, n_rows, n_cols, g.stride(0), u.stride(0), h.stride(0), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N)
    return h


def solution_swiglu(g, u):
    return _launch_swiglu(_swiglu_kernel, g, u)


# -- exercise 1: wrong answers --------------------------------------------------------------------------
@triton.jit
def _silu_kernel(g_ptr, s_ptr, n_rows, n_cols, stride_gm, stride_sm, BLOCK_N: tl.constexpr):
    row = tl.program_id(axis=0)
    for start in range(0, n_cols, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        mask = offs < n_cols
        g = tl.load(g_ptr + row * stride_gm + offs, mask=mask).to(tl.float32)
        tl.store(s_ptr + row * stride_sm + offs, (g * tl.sigmoid(g)).to(s_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _mul_kernel(s_ptr, u_ptr, h_ptr, n_rows, n_cols, stride_sm, stride_um, stride_hm, BLOCK_N: tl.constexpr):
    row = tl.program_id(axis=0)
    for start in range(0, n_cols, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        mask = offs < n_cols
        s = tl.load(s_ptr + row * stride_sm + offs, mask=mask).to(tl.float32)
        u = tl.load(u_ptr + row * stride_um + offs, mask=mask).to(tl.float32)
        tl.store(h_ptr + row * stride_hm + offs, (s * u).to(h_ptr.dtype.element_ty), mask=mask)


def silu_then_mul(g, u):
    """Right values, two kernels: s goes to HBM and back (eager's schedule, in Triton)."""
    n_rows, n_cols = g.shape
    s = torch.empty((n_rows, n_cols), dtype=g.dtype, device=g.device)
    h = torch.empty_like(s)
    _silu_kernel[(n_rows,)](g, s, n_rows, n_cols, g.stride(0), s.stride(0), BLOCK_N=256)
    _mul_kernel[(n_rows,)](s, u, h, n_rows, n_cols, s.stride(0), u.stride(0), h.stride(0), BLOCK_N=256)
    return h


@triton.jit
def _gate_on_u_kernel(
    g_ptr, u_ptr, h_ptr, n_rows, n_cols, stride_gm, stride_um, stride_hm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    pid = tl.program_id(axis=0)
    n_tiles_n = tl.cdiv(n_cols, BLOCK_N)
    offs_m = (pid // n_tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid % n_tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < n_rows) & (offs_n[None, :] < n_cols)
    g = tl.load(g_ptr + offs_m[:, None] * stride_gm + offs_n[None, :], mask=mask).to(tl.float32)
    u = tl.load(u_ptr + offs_m[:, None] * stride_um + offs_n[None, :], mask=mask).to(tl.float32)
    h = u * tl.sigmoid(u) * g  # silu on the wrong input
    tl.store(h_ptr + offs_m[:, None] * stride_hm + offs_n[None, :], h.to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _half_math_kernel(
    g_ptr, u_ptr, h_ptr, n_rows, n_cols, stride_gm, stride_um, stride_hm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    pid = tl.program_id(axis=0)
    n_tiles_n = tl.cdiv(n_cols, BLOCK_N)
    offs_m = (pid // n_tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid % n_tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < n_rows) & (offs_n[None, :] < n_cols)
    g = tl.load(g_ptr + offs_m[:, None] * stride_gm + offs_n[None, :], mask=mask)
    u = tl.load(u_ptr + offs_m[:, None] * stride_um + offs_n[None, :], mask=mask)
    h = (g * u) * tl.sigmoid(g.to(tl.float32))  # g * u formed in the input's dtype: overflows fp16
    tl.store(h_ptr + offs_m[:, None] * stride_hm + offs_n[None, :], h.to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _flat_kernel(g_ptr, u_ptr, h_ptr, n_elements, BLOCK: tl.constexpr):
    offs = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask).to(tl.float32)
    tl.store(h_ptr + offs, (g * tl.sigmoid(g) * u).to(h_ptr.dtype.element_ty), mask=mask)


def flat_ignoring_strides(g, u):
    """Treats g and u as contiguous: reads the wrong elements of a (T, 2F) projection's halves."""
    h = torch.empty(g.shape, dtype=g.dtype, device=g.device)
    _flat_kernel[(triton.cdiv(h.numel(), BLOCK),)](g, u, h, h.numel(), BLOCK=BLOCK)
    return h


def test_swiglu_accepts_the_solution_and_refuses_the_package_kernel(capsys):
    msg = ex.check_swiglu(solution_swiglu)
    assert msg.startswith("✓ swiglu: 12 checks passed")
    assert capsys.readouterr().out.count("✓ swiglu") == 1
    with pytest.raises(CheckFailed, match="fusionlab's own kernel"):
        ex.check_swiglu(swiglu)


def test_swiglu_rejects_two_kernels():
    with pytest.raises(CheckFailed, match=r"expected 1 Triton kernel launch, saw 2.*fuse them"):
        ex.check_swiglu(silu_then_mul)


def test_swiglu_rejects_the_gate_on_u():
    with pytest.raises(CheckFailed, match=r"computes silu\(u\) \* g\. The gate is g"):
        ex.check_swiglu(lambda g, u: _launch_swiglu(_gate_on_u_kernel, g, u))


def test_swiglu_rejects_fp16_arithmetic_that_overflows():
    with pytest.raises(CheckFailed, match=r"float16 with \|g \* u\| > 65504: \d+ results are inf or NaN.*overflowed"):
        ex.check_swiglu(lambda g, u: _launch_swiglu(_half_math_kernel, g, u))


def test_swiglu_rejects_torch_copies_and_ignored_strides():
    with pytest.raises(CheckFailed, match=r"computes with torch \(mul, silu\)"):
        ex.check_swiglu(lambda g, u: F.silu(g) * u)
    with pytest.raises(CheckFailed, match=r"moves tensor data with torch \(clone|copy"):
        ex.check_swiglu(lambda g, u: solution_swiglu(g.contiguous(), u.contiguous()))
    with pytest.raises(CheckFailed, match=r"elements differ.*row stride"):
        ex.check_swiglu(flat_ignoring_strides)
    with pytest.raises(CheckFailed, match="computes with torch"):
        ex.check_swiglu(swiglu_reference)


# -- exercise 2: cross-entropy, the solutions -------------------------------------------------------------
@triton.jit
def _ce_kernel(x_ptr, target_ptr, grad_ptr, loss_ptr, n_rows, n_cols, stride_xm, stride_gm, BLOCK_V: tl.constexpr):
    row = tl.program_id(axis=0)
    offs = tl.arange(0, BLOCK_V)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=float("-inf")).to(tl.float32)
    y = tl.load(target_ptr + row)
    m = tl.max(x, axis=0)
    e = tl.exp(x - m)
    d = tl.sum(e, axis=0)
    x_y = tl.sum(tl.where(offs == y, x, 0.0), axis=0)
    tl.store(loss_ptr + row, tl.log(d) + m - x_y)
    grad = (e / d - tl.where(offs == y, 1.0, 0.0)) / n_rows
    tl.store(grad_ptr + row * stride_gm + offs, grad.to(grad_ptr.dtype.element_ty), mask=mask)


def _launch_ce(kernel, logits, target, *extra, n=None, **meta):
    n_rows, n_cols = logits.shape
    grad = torch.empty_like(logits)
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    block = triton.next_power_of_2(n_cols)
    kernel[(n_rows,)](
        logits, target, grad, loss_rows, *extra, n_cols, logits.stride(0), grad.stride(0), BLOCK_V=block, **meta
    )
    return loss_rows.sum() / (n_rows if n is None else n), grad


def solution_cross_entropy(logits, target):
    n_rows = logits.shape[0]
    n_cols = logits.shape[1]
    grad = torch.empty_like(logits)
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    _ce_kernel[(n_rows,)](
        logits,
        target,
        grad,
        loss_rows,
        n_rows,
        n_cols,
        logits.stride(0),
        grad.stride(0),
        BLOCK_V=triton.next_power_of_2(n_cols),
    )
    return loss_rows.sum() / n_rows, grad


@triton.jit
def _ce_ignore_kernel(
    x_ptr,
    target_ptr,
    grad_ptr,
    loss_ptr,
    n_valid_ptr,
    ignore_index,
    smoothing,
    n_cols,
    stride_xm,
    stride_gm,
    BLOCK_V: tl.constexpr,
    SMOOTH_IGNORED: tl.constexpr = False,
    DENOM_ALL: tl.constexpr = False,
    NO_MAX: tl.constexpr = False,
    NO_MEAN: tl.constexpr = False,
    FIXED_BLOCK: tl.constexpr = False,
    FIRST_NOT_MAX: tl.constexpr = False,
    BLOCK_MEAN: tl.constexpr = False,
    ZERO_BY_PRODUCT: tl.constexpr = False,
):
    row = tl.program_id(axis=0)
    if FIXED_BLOCK:  # a block hard-coded in the kernel: right for rows up to 1024, wrong past them
        offs = tl.arange(0, 1024)
    else:
        offs = tl.arange(0, BLOCK_V)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=float("-inf")).to(tl.float32)
    y = tl.load(target_ptr + row)
    valid = y != ignore_index
    if NO_MAX:
        m = 0.0
    elif FIRST_NOT_MAX:  # held out: shifted by the row's first logit
        m = tl.sum(tl.where(offs == 0, x, 0.0), axis=0)
    else:
        m = tl.max(x, axis=0)
    e = tl.exp(x - m)
    d = tl.sum(e, axis=0)
    lse = tl.log(d) + m
    x_y = tl.sum(tl.where(offs == y, x, 0.0), axis=0)
    if BLOCK_MEAN:  # held out: the smoothing term averaged over the block, not the row
        mean_x = tl.sum(tl.where(mask, x, 0.0), axis=0) / BLOCK_V
        grad = e / d - (1.0 - smoothing) * tl.where(offs == y, 1.0, 0.0) - smoothing / BLOCK_V
    else:
        mean_x = tl.sum(tl.where(mask, x, 0.0), axis=0) / n_cols
        grad = e / d - (1.0 - smoothing) * tl.where(offs == y, 1.0, 0.0) - smoothing / n_cols
    loss = (1.0 - smoothing) * (lse - x_y) + smoothing * (lse - mean_x)
    if DENOM_ALL:
        n = tl.num_programs(axis=0).to(tl.float32)
    else:
        n = tl.load(n_valid_ptr).to(tl.float32)
    if not NO_MEAN:
        grad = grad / n
    if SMOOTH_IGNORED:  # the peers' bug: the smoothing term survives on ignored rows
        loss = tl.where(valid, loss, smoothing * (lse - mean_x))
        grad = tl.where(valid, grad, smoothing * (e / d - 1.0 / n_cols) / n)
    elif ZERO_BY_PRODUCT:  # held out: zeroed by a product, and 0 * NaN (every row ignored: 0 / 0) is NaN
        keep = valid.to(tl.float32)
        loss = loss * keep
        grad = grad * keep
    else:
        loss = tl.where(valid, loss, 0.0)
        grad = tl.where(valid, grad, 0.0)
    tl.store(loss_ptr + row, loss)
    tl.store(grad_ptr + row * stride_gm + offs, grad.to(grad_ptr.dtype.element_ty), mask=mask)


def _ce_ignore(logits, target, ignore_index, label_smoothing=0.0, denom_all=False, **flags):
    n_rows, n_cols = logits.shape
    grad = torch.empty_like(logits)
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    n_valid = (target != ignore_index).sum()
    _ce_ignore_kernel[(n_rows,)](
        logits,
        target,
        grad,
        loss_rows,
        n_valid,
        ignore_index,
        float(label_smoothing),
        n_cols,
        logits.stride(0),
        grad.stride(0),
        BLOCK_V=triton.next_power_of_2(n_cols),
        DENOM_ALL=denom_all,
        **flags,
    )
    return loss_rows.sum() / (n_rows if denom_all else n_valid), grad


def solution_cross_entropy_ignore(logits, target, ignore_index):
    return _ce_ignore(logits, target, ignore_index)


def solution_cross_entropy_smoothing(logits, target, ignore_index, label_smoothing=0.0):
    return _ce_ignore(logits, target, ignore_index, label_smoothing)


def test_cross_entropy_accepts_the_solution(capsys):
    assert ex.check_cross_entropy(solution_cross_entropy).startswith("✓ cross_entropy: 14 checks passed")
    assert capsys.readouterr().out.count("✓ cross_entropy") == 1


def test_cross_entropy_ignore_accepts_the_solutions():
    msg = ex.check_cross_entropy_ignore(solution_cross_entropy_ignore)
    assert msg.startswith("✓ cross_entropy_ignore: 16 checks passed") and "add a label_smoothing" in msg
    msg = ex.check_cross_entropy_ignore(solution_cross_entropy_smoothing)
    assert msg.startswith("✓ cross_entropy_ignore: 18 checks passed") and "label_smoothing=0.1" in msg


def test_cross_entropy_rejects_a_gradient_without_the_mean():
    with pytest.raises(CheckFailed, match=r"gradient is \d+ times too large.*1/N"):
        ex.check_cross_entropy(lambda x, t: _ce_ignore(x, t, -100, NO_MEAN=True))
    with pytest.raises(CheckFailed, match=r"gradient is \d+ times too large"):
        ex.check_cross_entropy_ignore(lambda x, t, ii: _ce_ignore(x, t, ii, NO_MEAN=True))


def test_cross_entropy_rejects_a_block_hard_coded_in_the_kernel():
    with pytest.raises(CheckFailed, match=r"\(5, 3001\).*Columns 0-1023 of it were written.*cover all 3001"):
        ex.check_cross_entropy(lambda x, t: _ce_ignore(x, t, -100, FIXED_BLOCK=True))
    with pytest.raises(CheckFailed, match=r"\(5, 3001\)"):
        ex.check_cross_entropy_ignore(lambda x, t, ii: _ce_ignore(x, t, ii, FIXED_BLOCK=True))


def test_cross_entropy_rejects_no_max_subtraction():
    with pytest.raises(CheckFailed, match=r"logits near 10000.*inf/NaN.*Subtract the row's maximum"):
        ex.check_cross_entropy(lambda x, t: _ce_ignore(x, t, -100, NO_MAX=True))


def test_cross_entropy_ignore_rejects_ignored_rows_in_the_denominator():
    with pytest.raises(CheckFailed, match=r"divides by all \d+ rows; only the \d+ rows that are not ignored"):
        ex.check_cross_entropy_ignore(lambda x, t, ii: _ce_ignore(x, t, ii, denom_all=True))


def test_cross_entropy_ignore_rejects_smoothing_on_ignored_rows():
    def wrong(logits, target, ignore_index, label_smoothing=0.0):
        # (without smoothing it is right: the bug shows only when label_smoothing > 0)
        return _ce_ignore(logits, target, ignore_index, label_smoothing, SMOOTH_IGNORED=label_smoothing > 0)

    with pytest.raises(CheckFailed, match=r"label_smoothing=0.1: \d+ ignored rows have a nonzero gradient.*smoothing"):
        ex.check_cross_entropy_ignore(wrong)


def test_cross_entropy_ignore_rejects_a_gradient_on_ignored_rows():
    def ignores_nothing(logits, target, ignore_index):
        safe = torch.where(target == ignore_index, 0, target)  # (T,): a small torch op, allowed
        return _ce_ignore(logits, safe, ignore_index)

    with pytest.raises(CheckFailed, match="ignored rows have a nonzero gradient"):
        ex.check_cross_entropy_ignore(ignores_nothing)


def test_cross_entropy_ignore_rejects_unwritten_ignored_rows():
    def skips_ignored(logits, target, ignore_index):
        # the kernel returns early on ignored rows without writing their (zero) gradient
        return _launch_ce(_ce_skip_kernel, logits, target, ignore_index, n=(target != ignore_index).sum())

    with pytest.raises(CheckFailed, match="never written.*That row is ignored"):
        ex.check_cross_entropy_ignore(skips_ignored)


@triton.jit
def _ce_skip_kernel(
    x_ptr, target_ptr, grad_ptr, loss_ptr, ignore_index, n_cols, stride_xm, stride_gm, BLOCK_V: tl.constexpr
):
    row = tl.program_id(axis=0)
    offs = tl.arange(0, BLOCK_V)
    mask = offs < n_cols
    y = tl.load(target_ptr + row)
    tl.store(loss_ptr + row, 0.0)
    if y != ignore_index:
        x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=float("-inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        e = tl.exp(x - m)
        d = tl.sum(e, axis=0)
        x_y = tl.sum(tl.where(offs == y, x, 0.0), axis=0)
        tl.store(loss_ptr + row, tl.log(d) + m - x_y)
        tl.store(
            grad_ptr + row * stride_gm + offs,
            (e / d - tl.where(offs == y, 1.0, 0.0)).to(grad_ptr.dtype.element_ty),
            mask=mask,
        )


# a materialised probability tensor: one kernel writes softmax to a (T, V) buffer, a second the gradient
@triton.jit
def _probs_kernel(x_ptr, target_ptr, p_ptr, loss_ptr, n_cols, stride_xm, BLOCK_V: tl.constexpr):
    row = tl.program_id(axis=0)
    offs = tl.arange(0, BLOCK_V)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=float("-inf")).to(tl.float32)
    y = tl.load(target_ptr + row)
    m = tl.max(x, axis=0)
    e = tl.exp(x - m)
    d = tl.sum(e, axis=0)
    x_y = tl.sum(tl.where(offs == y, x, 0.0), axis=0)
    tl.store(loss_ptr + row, tl.log(d) + m - x_y)
    tl.store(p_ptr + row * n_cols + offs, e / d, mask=mask)


@triton.jit
def _grad_from_probs_kernel(p_ptr, target_ptr, grad_ptr, n_rows, n_cols, stride_gm, BLOCK_V: tl.constexpr):
    row = tl.program_id(axis=0)
    offs = tl.arange(0, BLOCK_V)
    mask = offs < n_cols
    p = tl.load(p_ptr + row * n_cols + offs, mask=mask)
    y = tl.load(target_ptr + row)
    grad = (p - tl.where(offs == y, 1.0, 0.0)) / n_rows
    tl.store(grad_ptr + row * stride_gm + offs, grad.to(grad_ptr.dtype.element_ty), mask=mask)


def with_probabilities(logits, target):
    n_rows, n_cols = logits.shape
    probs = torch.empty(n_rows, n_cols, dtype=torch.float32, device=logits.device)
    grad = torch.empty_like(logits)
    loss_rows = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    block = triton.next_power_of_2(n_cols)
    _probs_kernel[(n_rows,)](logits, target, probs, loss_rows, n_cols, logits.stride(0), BLOCK_V=block)
    _grad_from_probs_kernel[(n_rows,)](probs, target, grad, n_rows, n_cols, grad.stride(0), BLOCK_V=block)
    return loss_rows.sum() / n_rows, grad


def test_cross_entropy_rejects_a_materialised_probability_tensor():
    with pytest.raises(CheckFailed, match=r"allocates 2 tensors the size of the logits.*probabilities"):
        ex.check_cross_entropy(with_probabilities)


def test_cross_entropy_rejects_torch_on_the_logits_and_extra_launches():
    def torch_softmax(logits, target):
        p = torch.softmax(logits.float(), dim=-1)
        return solution_cross_entropy(logits, target)[0], (p / logits.shape[0]).to(logits.dtype)

    with pytest.raises(CheckFailed, match=r"torch runs .*on a tensor the size of the logits"):
        ex.check_cross_entropy(torch_softmax)

    def zeros_first(logits, target):
        loss, grad = solution_cross_entropy(logits, target)
        return loss, grad.zero_().add_(grad)

    with pytest.raises(CheckFailed, match=r"torch runs .*zero_"):
        ex.check_cross_entropy(zeros_first)

    def twice(logits, target):
        solution_cross_entropy(logits, target)
        return solution_cross_entropy(logits, target)

    with pytest.raises(CheckFailed, match="allocates 2 tensors the size of the logits"):
        ex.check_cross_entropy(twice)

    def package(logits, target):
        x = logits.detach().clone().requires_grad_()
        loss = cross_entropy(x, target)
        return loss, torch.autograd.grad(loss, x)[0]

    with pytest.raises(CheckFailed, match="fusionlab's own kernel"):
        ex.check_cross_entropy(package)


def test_cross_entropy_reports_stubs_and_shapes():
    def stub(logits, target):
        raise NotImplementedError("Exercise: write the kernel")

    with pytest.raises(CheckFailed, match="not done yet"):
        ex.check_cross_entropy(stub)
    with pytest.raises(CheckFailed, match=r"return \(loss, grad\)"):
        ex.check_cross_entropy(lambda x, t: solution_cross_entropy(x, t)[1])

    def summed(logits, target):
        loss, grad = solution_cross_entropy(logits, target)
        return loss * logits.shape[0], grad

    with pytest.raises(CheckFailed, match="is the sum over rows"):
        ex.check_cross_entropy(summed)


# -- exercise 3: the peak memory of eager cross-entropy -----------------------------------------------
GIB = 2**30
LOGITS = ex.PEAK_TOKENS * ex.PEAK_VOCAB * 4


def test_eager_peak_accepts_the_answer():
    assert ex.check_eager_peak_gib(3 * LOGITS / GIB).startswith("✓ eager peak")
    assert ex.check_eager_peak_gib(round(3 * LOGITS / GIB, 2)).startswith("✓ eager peak")


@pytest.mark.parametrize(
    "wrong,tip",
    [
        (LOGITS / GIB, "one \\(T, V\\) tensor"),
        (2 * LOGITS / GIB, "gradient of the log-probabilities"),
        (4 * LOGITS / GIB, "counts the logits too"),
        (6 * LOGITS / GIB, "number of \\(T, V\\) trips"),
        (3 * LOGITS / 2 / GIB, "fp32"),
        (3 * LOGITS / 1e9, "GB \\(1e9 bytes\\)"),
        (3 * LOGITS, "in bytes"),
        (3 * LOGITS / 4 / GIB, "counts elements"),
        (None, "finite number"),
    ],
)
def test_eager_peak_rejects_miscounts(wrong, tip):
    with pytest.raises(CheckFailed, match=tip):
        ex.check_eager_peak_gib(wrong)


# -- the suite's peak-memory cases read back from a run ------------------------------------------------
def test_peak_memory_cases_round_trip_through_results():
    from fusionlab.bench import Result
    from fusionlab.lessons.l5 import suite

    results = [
        Result(suite.peak_name(v, V), 1.0, nbytes=k * V)
        for V in suite.PEAK_VOCABS
        for k, v in enumerate(suite.PEAK_VARIANTS)
    ]
    results += [Result(suite.peak_name(v), 1.0, nbytes=7) for v in suite.LCE_PEAK_VARIANTS]
    results.append(Result("swiglu fwd fused", 1.0, nbytes=123))  # a timing case: not a peak
    peaks = suite.peaks_from(results)
    assert len(peaks) == len(suite.PEAK_VOCABS) * len(suite.PEAK_VARIANTS) + len(suite.LCE_PEAK_VARIANTS)
    assert all(
        p.tokens == suite.PEAK_TOKENS and p.peak_bytes == suite.PEAK_VARIANTS.index(p.variant) * p.vocab
        for p in peaks
        if p.variant in suite.PEAK_VARIANTS
    )
    assert suite.peaks_from([]) == []


# -- exercise 4: the GeGLU prediction ---------------------------------------------------------------------
def test_geglu_prediction_accepts_the_trips_and_rejects_other_counts():
    assert ex.check_geglu_prediction({"forward": 5 / 3, "backward": 1.8}).checks == 2
    with pytest.raises(CheckFailed, match="Both inputs"):
        ex.check_geglu_prediction({"forward": 2.0, "backward": 1.8})  # one input forgotten
    with pytest.raises(CheckFailed, match="three kernels"):
        ex.check_geglu_prediction({"forward": 5 / 3, "backward": 5 / 3})
    with pytest.raises(CheckFailed, match="a dict"):
        ex.check_geglu_prediction(1.67)


# -- exercise 5: GeGLU forward and backward kernels ----------------------------------------------------------
@triton.jit
def _geglu_kernel(g_ptr, u_ptr, h_ptr, n, TANH: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask).to(tl.float32)
    if TANH:  # the tanh approximation: not the exact GELU the exercise asks for
        t = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        gelu = 0.5 * g * (1.0 + (2.0 / (1.0 + tl.exp(-2.0 * t)) - 1.0))
    else:
        gelu = g * 0.5 * (1.0 + tl.math.erf(g * 0.7071067811865476))
    tl.store(h_ptr + offs, (gelu * u).to(h_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _geglu_bwd_kernel(dh_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, n, WHICH: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dh = tl.load(dh_ptr + offs, mask=mask).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask).to(tl.float32)
    cdf = 0.5 * (1.0 + tl.math.erf(g * 0.7071067811865476))
    pdf = tl.exp(-0.5 * g * g) * 0.3989422804014327
    if WHICH != 1:  # 0: both; 2: du only (a second kernel writes dg)
        tl.store(du_ptr + offs, (dh * g * cdf).to(du_ptr.dtype.element_ty), mask=mask)
    if WHICH != 2:
        tl.store(dg_ptr + offs, (dh * u * (cdf + g * pdf)).to(dg_ptr.dtype.element_ty), mask=mask)


def _geglu(g, u, tanh=False):
    h = torch.empty_like(g)
    _geglu_kernel[(triton.cdiv(g.numel(), 1024),)](g, u, h, g.numel(), tanh, BLOCK=1024)
    return h


def _geglu_bwd(dh, g, u, split=False):
    dg, du = torch.empty_like(g), torch.empty_like(u)
    grid = (triton.cdiv(g.numel(), 1024),)
    for which in (2, 1) if split else (0,):
        _geglu_bwd_kernel[grid](dh, g, u, dg, du, g.numel(), which, BLOCK=1024)
    return dg, du


def test_geglu_accepts_the_solution_and_rejects_the_tanh_approximation():
    assert ex.check_geglu(_geglu).checks == 2 * len(ex.GEGLU_SHAPES) + 2
    with pytest.raises(CheckFailed, match="differ"):
        ex.check_geglu(lambda g, u: _geglu(g, u, tanh=True))


def test_geglu_backward_accepts_the_solution_and_rejects_two_kernels_and_torch():
    assert ex.check_geglu_backward(_geglu_bwd).checks == 2 * (2 * len(ex.GEGLU_SHAPES) + 2)  # dg, then du
    with pytest.raises(CheckFailed, match="expected 1 Triton kernel launch"):
        ex.check_geglu_backward(lambda dh, g, u: _geglu_bwd(dh, g, u, split=True))
    with pytest.raises(CheckFailed, match="torch"):
        ex.check_geglu_backward(lambda dh, g, u: (dh * u, dh * F.gelu(g)))


def test_geglu_backward_asks_for_the_pair():
    with pytest.raises(CheckFailed, match="a pair of tensors"):
        ex.check_geglu_backward(lambda dh, g, u: _geglu_bwd(dh, g, u)[0])


# -- held out: mistakes and cheats the checks once let through ----------------------------------------------
def test_cross_entropy_rejects_a_shift_by_the_first_logit():
    with pytest.raises(CheckFailed, match=r"logits near 10000.*the loss or the gradient is inf/NaN.*maximum"):
        ex.check_cross_entropy_ignore(lambda x, t, ii: _ce_ignore(x, t, ii, FIRST_NOT_MAX=True))


def test_cross_entropy_rejects_smoothing_averaged_over_the_block():
    with pytest.raises(CheckFailed, match=r"label_smoothing=0.1.*(loss|differ)"):
        ex.check_cross_entropy_ignore(lambda x, t, ii, label_smoothing=0.0: _ce_ignore(x, t, ii, label_smoothing,
                                                                                       BLOCK_MEAN=True))  # fmt: skip


def test_cross_entropy_names_nan_on_ignored_rows_not_an_overflow():
    with pytest.raises(CheckFailed, match=r"on every row: .*ignored rows have an inf/NaN gradient.*0 \* NaN"):
        ex.check_cross_entropy_ignore(lambda x, t, ii: _ce_ignore(x, t, ii, ZERO_BY_PRODUCT=True))


def torch_a_row_at_a_time(logits, target):
    """The loss from torch, one row at a time (no op the size of the logits), the gradient from a kernel."""
    _, grad = solution_cross_entropy(logits, target)
    rows = [torch.logsumexp(logits[i].float(), 0) - logits[i, target[i]].float() for i in range(logits.shape[0])]
    return torch.stack(rows).mean(), grad


def test_cross_entropy_rejects_torch_on_pieces_of_the_logits():
    with pytest.raises(CheckFailed, match=r"torch reads \d+ elements in all .*a piece at a time"):
        ex.check_cross_entropy(torch_a_row_at_a_time)
