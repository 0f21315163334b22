"""Lesson 4's checkers accept the reference solutions and reject each kind of wrong answer.

The right answers below are the ones in solutions/04_fused_reductions.ipynb; the wrong ones are the
mistakes the checkers are there to catch: residual + RMSNorm without the residual, without writing the
residual sum, with eps outside the square root, with statistics from one tile of a wide row, as two
kernels; a softmax without max subtraction, with lanes past the row's end counted or unmasked, in
torch; wrong byte counts of the fused kernel.
"""

from __future__ import annotations  # noqa: I001  (fusionlab before triton: see test_checkers_lesson2.py)

import pytest
import torch

from fusionlab import runtime
import triton
import triton.language as tl

from fusionlab.grading import CheckFailed
from fusionlab.kernels.rmsnorm import rmsnorm
from fusionlab.kernels.softmax import softmax
from fusionlab.lessons.l4 import checkers as ex

pytestmark = [
    pytest.mark.lesson4,
    # the interpreter computes masked lanes with numpy, which warns on exp(-inf - -inf) and overflows
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning"),
]

MAX_BLOCK = runtime.pick(gpu=4096, interpreter=1024)


# -- exercise 1: residual + RMSNorm, the solution ------------------------------------------------------
@triton.jit
def _add_rmsnorm_kernel(x_ptr, r_ptr, w_ptr, h_ptr, y_ptr, n_cols, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(axis=0).to(tl.int64)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):  # pass 1: h = x + r, written; sum of h² in fp32
        offs = start + tl.arange(0, BLOCK_N)
        mask = offs < n_cols
        x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(r_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
        h = (x + r).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + row * n_cols + offs, h, mask=mask)
        hf = h.to(tl.float32)
        acc += hf * hf
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK_N):  # pass 2: re-read h, write y
        offs = start + tl.arange(0, BLOCK_N)
        mask = offs < n_cols
        h = tl.load(h_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        n = (h * rstd).to(y_ptr.dtype.element_ty).to(tl.float32)  # the model's cast order
        tl.store(y_ptr + row * n_cols + offs, (n * w).to(y_ptr.dtype.element_ty), mask=mask)


def _launch_rms(kernel, x, r, w, eps, block=None):
    n_rows, n_cols = x.shape
    h, y = torch.empty_like(x), torch.empty_like(x)
    block = block or min(triton.next_power_of_2(n_cols), MAX_BLOCK)
    kernel[(n_rows,)](x, r, w, h, y, n_cols, eps, BLOCK_N=block)
    return y, h


def solution_add_rmsnorm(x, r, w, eps):
    return _launch_rms(_add_rmsnorm_kernel, x, r, w, eps)


# -- exercise 1: wrong answers ------------------------------------------------------------------------------
@triton.jit
def _wrong_rms_kernel(x_ptr, r_ptr, w_ptr, h_ptr, y_ptr, n_cols, eps, BLOCK_N: tl.constexpr, MISTAKE: tl.constexpr):
    # MISTAKE: 1 normalises x, 2 never stores h, 3 eps on the rms, 4 eps on rsqrt, 5 stats of one tile,
    # 6 one tile hard-coded (launched with a tile of 16384 and no loop: right for rows up to 16384),
    # 7 h² formed in the input's dtype (held out: right in fp32, inside fp16's tolerance on rows near 0)
    row = tl.program_id(axis=0).to(tl.int64)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    end = n_cols if MISTAKE != 6 else 1
    for start in range(0, end, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        mask = offs < n_cols
        x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(r_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
        h = (x + r).to(h_ptr.dtype.element_ty)
        if MISTAKE != 2:
            tl.store(h_ptr + row * n_cols + offs, h, mask=mask)
        hf = x if MISTAKE == 1 else h.to(tl.float32)
        sq = hf * hf
        if MISTAKE == 7:  # the square in the input's dtype: no fp32 upcast before it
            sq = (h * h).to(tl.float32)
        if MISTAKE == 5:
            if start == 0:
                acc += sq
        else:
            acc += sq
    denom = n_cols if MISTAKE != 5 else tl.minimum(n_cols, BLOCK_N)
    ms = tl.sum(acc, axis=0) / denom
    if MISTAKE == 3:
        rstd = 1.0 / (tl.sqrt(ms) + eps)
    elif MISTAKE == 4:
        rstd = 1.0 / tl.sqrt(ms) + eps
    else:
        rstd = 1.0 / tl.sqrt(ms + eps)
    for start in range(0, end, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        mask = offs < n_cols
        if MISTAKE == 1 or MISTAKE == 2:
            x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
            r = tl.load(r_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
            h = x if MISTAKE == 1 else (x + r).to(y_ptr.dtype.element_ty).to(tl.float32)
        else:
            h = tl.load(h_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        n = (h * rstd).to(y_ptr.dtype.element_ty).to(tl.float32)
        tl.store(y_ptr + row * n_cols + offs, (n * w).to(y_ptr.dtype.element_ty), mask=mask)


def _wrong_rms(mistake):
    def fn(x, r, w, eps):
        n_rows, n_cols = x.shape
        h, y = torch.empty_like(x), torch.empty_like(x)
        block = 16384 if mistake == 6 else min(triton.next_power_of_2(n_cols), MAX_BLOCK)
        _wrong_rms_kernel[(n_rows,)](x, r, w, h, y, n_cols, eps, BLOCK_N=block, MISTAKE=mistake)
        return y, h

    return fn


@triton.jit
def _add_kernel(x_ptr, r_ptr, h_ptr, n_cols, BLOCK_N: tl.constexpr):
    row = tl.program_id(axis=0).to(tl.int64)
    for start in range(0, n_cols, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        mask = offs < n_cols
        x = tl.load(x_ptr + row * n_cols + offs, mask=mask)
        r = tl.load(r_ptr + row * n_cols + offs, mask=mask)
        tl.store(h_ptr + row * n_cols + offs, x + r, mask=mask)


@triton.jit
def _rmsnorm_only_kernel(h_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK_N: tl.constexpr):
    row = tl.program_id(axis=0).to(tl.int64)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        h = tl.load(h_ptr + row * n_cols + offs, mask=offs < n_cols, other=0.0).to(tl.float32)
        acc += h * h
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        mask = offs < n_cols
        h = tl.load(h_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        n = (h * rstd).to(y_ptr.dtype.element_ty).to(tl.float32)
        tl.store(y_ptr + row * n_cols + offs, (n * w).to(y_ptr.dtype.element_ty), mask=mask)


def add_then_rmsnorm(x, r, w, eps):
    """Right values, two kernels: h written by one, read back by the next (eager's schedule in Triton)."""
    n_rows, n_cols = x.shape
    h, y = torch.empty_like(x), torch.empty_like(x)
    block = min(triton.next_power_of_2(n_cols), MAX_BLOCK)
    _add_kernel[(n_rows,)](x, r, h, n_cols, BLOCK_N=block)
    _rmsnorm_only_kernel[(n_rows,)](h, w, y, n_cols, eps, BLOCK_N=block)
    return y, h


def test_add_rmsnorm_accepts_the_solution(capsys):
    msg = ex.check_add_rmsnorm(solution_add_rmsnorm)
    # a GPU's half type is bf16: fp16 rows are checked too there (4 more checks)
    assert msg.startswith(f"✓ add_rmsnorm: {17 if runtime.HALF == torch.float16 else 21} checks passed")
    assert capsys.readouterr().out.count("✓ add_rmsnorm") == 1


def test_add_rmsnorm_accepts_one_tile_a_row_whatever_the_width():
    # a learner's launcher that gives every row one tile (next power of two) is right too
    ex.check_add_rmsnorm(
        lambda x, r, w, eps: _launch_rms(_add_rmsnorm_kernel, x, r, w, eps, block=triton.next_power_of_2(x.shape[1]))
    )


@triton.jit
def _add_rmsnorm_other_order(x_ptr, r_ptr, w_ptr, h_ptr, y_ptr, n_cols, eps, BLOCK_N: tl.constexpr):
    # right, in another order: h² summed from the unrounded fp32 sum, y rounded once at the end, and pass 2
    # re-reading x and r instead of h (more bytes, the same numbers to within one rounding)
    row = tl.program_id(axis=0).to(tl.int64)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        mask = offs < n_cols
        x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(r_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(h_ptr + row * n_cols + offs, (x + r).to(h_ptr.dtype.element_ty), mask=mask)
        acc += (x + r) * (x + r)
    rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / n_cols + eps)
    for start in range(0, n_cols, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        mask = offs < n_cols
        x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
        r = tl.load(r_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * n_cols + offs, ((x + r) * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


def test_add_rmsnorm_accepts_another_rounding_order_and_rereading_x_and_r():
    def fn(x, r, w, eps):
        h, y = torch.empty_like(x), torch.empty_like(x)
        block = min(triton.next_power_of_2(x.shape[1]), MAX_BLOCK)
        _add_rmsnorm_other_order[(x.shape[0],)](x, r, w, h, y, x.shape[1], eps, BLOCK_N=block)
        return y, h

    assert ex.check_add_rmsnorm(fn).startswith("✓ add_rmsnorm")


def test_add_rmsnorm_refuses_the_package_kernel_and_torch():
    with pytest.raises(CheckFailed, match="fusionlab's own kernel"):
        ex.check_add_rmsnorm(lambda x, r, w, eps: rmsnorm(x, w, eps, r))
    with pytest.raises(CheckFailed, match=r"torch does part of the work \(add"):
        ex.check_add_rmsnorm(lambda x, r, w, eps: solution_add_rmsnorm(x + 0, r, w, eps))


def test_add_rmsnorm_rejects_a_missing_residual():
    with pytest.raises(CheckFailed, match="eps=0.25: your y is RMSNorm of x: the residual is missing"):
        ex.check_add_rmsnorm(_wrong_rms(1))


def test_add_rmsnorm_rejects_the_residual_sum_not_written():
    with pytest.raises(CheckFailed, match="h was never written. The residual sum h = x \\+ r is an output"):
        ex.check_add_rmsnorm(_wrong_rms(2))


def test_add_rmsnorm_rejects_eps_outside_the_square_root():
    with pytest.raises(CheckFailed, match=r"sqrt\(mean\(h²\)\) \+ eps: eps sits on the rms"):
        ex.check_add_rmsnorm(_wrong_rms(3))
    with pytest.raises(CheckFailed, match=r"rsqrt\(mean\(h²\)\) \+ eps: eps is outside the square root"):
        ex.check_add_rmsnorm(_wrong_rms(4))


def test_add_rmsnorm_rejects_statistics_of_one_tile():
    with pytest.raises(CheckFailed, match=r"shape \(3, 4097\).*wider than one tile. The statistics need the whole row"):
        ex.check_add_rmsnorm(_wrong_rms(5))


def test_add_rmsnorm_rejects_one_hard_coded_tile():
    with pytest.raises(CheckFailed, match=r"\(2, 40009\).*Columns 0-16383 of it were written, 16384 on were not"):
        ex.check_add_rmsnorm(_wrong_rms(6))


def test_add_rmsnorm_rejects_two_kernels():
    with pytest.raises(CheckFailed, match=r"expected 1 Triton kernel launch, saw 2.*fuse them"):
        ex.check_add_rmsnorm(add_then_rmsnorm)


def test_add_rmsnorm_rejects_outputs_of_the_wrong_kind():
    with pytest.raises(CheckFailed, match=r"return \(y, h\), a pair"):
        ex.check_add_rmsnorm(lambda x, r, w, eps: solution_add_rmsnorm(x, r, w, eps)[0])
    with pytest.raises(CheckFailed, match="h is one of the inputs"):
        ex.check_add_rmsnorm(lambda x, r, w, eps: (solution_add_rmsnorm(x, r, w, eps)[0], x))
    with pytest.raises(CheckFailed, match="pass your function"):
        ex.check_add_rmsnorm(None)


# -- exercise 2: softmax, the solution ----------------------------------------------------------------------
@triton.jit
def _softmax_kernel(x_ptr, y_ptr, n_cols, stride_xm, stride_ym, BLOCK_N: tl.constexpr):
    row = tl.program_id(axis=0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    e = tl.exp(x - m)
    y = e / tl.sum(e, axis=0)
    tl.store(y_ptr + row * stride_ym + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch_softmax(kernel, x, **meta):
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    kernel[(n_rows,)](x, y, n_cols, x.stride(0), y.stride(0), BLOCK_N=triton.next_power_of_2(n_cols), **meta)
    return y


def solution_softmax(x):
    return _launch_softmax(_softmax_kernel, x)


@triton.jit
def _wrong_softmax_kernel(x_ptr, y_ptr, n_cols, stride_xm, stride_ym, BLOCK_N: tl.constexpr, MISTAKE: tl.constexpr):
    # MISTAKE: 1 no max subtraction, 2 tail loaded as 0, 3 no masks at all, 4 a block of 1024 hard-coded,
    # 5 x - x[0] for x - max(x)
    row = tl.program_id(axis=0).to(tl.int64)
    if MISTAKE == 4:
        offs = tl.arange(0, 1024)
    else:
        offs = tl.arange(0, BLOCK_N)
    mask = offs < n_cols
    if MISTAKE == 2:
        x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    elif MISTAKE == 3:
        x = tl.load(x_ptr + row * stride_xm + offs).to(tl.float32)
    else:
        x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=float("-inf")).to(tl.float32)
    if MISTAKE == 1:
        e = tl.exp(x)
    elif MISTAKE == 5:  # shifted by the row's first logit, not its max (held out)
        e = tl.exp(x - tl.sum(tl.where(offs == 0, x, 0.0), axis=0))
    else:
        e = tl.exp(x - tl.max(x, axis=0))
    y = e / tl.sum(e, axis=0)
    if MISTAKE == 3:
        tl.store(y_ptr + row * stride_ym + offs, y.to(y_ptr.dtype.element_ty))
    else:
        tl.store(y_ptr + row * stride_ym + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def test_softmax_accepts_the_solution(capsys):
    msg = ex.check_softmax(solution_softmax)
    assert msg.startswith("✓ softmax: 17 checks passed")
    assert capsys.readouterr().out.count("✓ softmax") == 1


@triton.jit
def _softmax_zero_rows_kernel(x_ptr, y_ptr, n_cols, stride_xm, stride_ym, BLOCK_N: tl.constexpr):
    # attention kernels' convention: a row with no logit left gives 0, not NaN
    row = tl.program_id(axis=0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    m = tl.where(m == float("-inf"), 0.0, m)
    e = tl.exp(x - m)
    s = tl.sum(e, axis=0)
    y = e / tl.where(s == 0.0, 1.0, s)
    tl.store(y_ptr + row * stride_ym + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


def test_softmax_accepts_zeros_for_rows_entirely_masked():
    ex.check_softmax(lambda x: _launch_softmax(_softmax_zero_rows_kernel, x))


def test_softmax_rejects_no_max_subtraction():
    with pytest.raises(CheckFailed, match=r"logits near 10000: inf or NaN.*Subtract the row's maximum"):
        ex.check_softmax(lambda x: _launch_softmax(_wrong_softmax_kernel, x, MISTAKE=1))


def test_softmax_rejects_an_unmasked_tail():
    with pytest.raises(CheckFailed, match=r"sums to less than 1.*Load them as -inf"):
        ex.check_softmax(lambda x: _launch_softmax(_wrong_softmax_kernel, x, MISTAKE=2))
    with pytest.raises(CheckFailed, match="past the end|differ"):
        ex.check_softmax(lambda x: _launch_softmax(_wrong_softmax_kernel, x, MISTAKE=3))


def test_softmax_rejects_a_block_hard_coded_in_the_kernel():
    # right for rows up to 1024 wide: the checker's row of 3001 says where the block stopped
    with pytest.raises(CheckFailed, match=r"\(5, 3001\).*Columns 0-1023 of it were written.*cover all 3001"):
        ex.check_softmax(lambda x: _launch_softmax(_wrong_softmax_kernel, x, MISTAKE=4))


def test_softmax_rejects_torch_and_the_package_kernel():
    with pytest.raises(CheckFailed, match="torch does part of the work"):
        ex.check_softmax(lambda x: torch.softmax(x, -1))
    with pytest.raises(CheckFailed, match="fusionlab's own kernel"):
        ex.check_softmax(softmax)


# -- exercise 3: the bytes of the fused kernel --------------------------------------------------------------
def solution_fused_bytes(rows, n, dtype, block):
    b = torch.empty((), dtype=dtype).element_size()
    reads = 2 * rows * n + n + (rows * n if n > block else 0)  # x, r, w once; pass 2 re-reads h
    writes = 2 * rows * n  # h and y
    return (reads + writes) * b


def test_fused_bytes_accepts_the_solution():
    assert ex.check_fused_bytes(solution_fused_bytes).startswith("✓ fused_bytes: 4 shapes")


@pytest.mark.parametrize(
    "wrong, tip",
    [
        (lambda rows, n, d, block: (2 * rows * n + n) * 2, "also reads r and writes h"),
        (lambda rows, n, d, block: (4 * rows * n + n) * 2, "pass 2 re-reads h"),
        (
            lambda rows, n, d, block: (6 * rows * n + n) * 2 if n > block else solution_fused_bytes(rows, n, d, block),
            "not x and r",
        ),
        (lambda rows, n, d, block: 4 * rows * n + n + (rows * n if n > block else 0), "counts elements"),
        (lambda rows, n, d, block: solution_fused_bytes(rows, n, d, block) + 4 * rows, "fp32 rstd a row"),
        (lambda rows, n, d, block: "a lot", "expected a finite number"),
    ],
)
def test_fused_bytes_rejects_wrong_counts(wrong, tip):
    with pytest.raises(CheckFailed, match=tip):
        ex.check_fused_bytes(wrong)


# -- the suite's bars, read off a run -------------------------------------------------------------------
def test_the_bars_read_a_run_and_can_fail():
    from fusionlab.bench import Result
    from fusionlab.lessons.l4 import suite

    names = [suite.ln_fwd(s) for s in suite.SCHEDULES]
    for rows, n in suite.RMS_SHAPES:
        names += [f(s, rows, n) for f in (suite.rms_fwd, suite.rms_bwd) for s in suite.SCHEDULES]
    for shape in (suite.SOFTMAX_NARROW, suite.SOFTMAX_WIDE):
        names += [suite.sm_fwd(s, *shape) for s in suite.SCHEDULES]
    names += [suite.sweep_name(n) for n in suite.SOFTMAX_SWEEP]
    two_trips = 2 * suite.SWEEP_ELEMENTS * suite.DTYPE.itemsize  # a sweep row read once, written once

    def res(name, ms=None, frac=0.95, nbytes=None):
        ms = (1.0 if "compiled" in name else 0.9) if ms is None else ms
        return Result(name, ms, nbytes=nbytes or (two_trips if "sweep" in name else 1), frac_copy=frac)

    # a run recorded before the backward's queued cases: the call's share is the bar
    old = [res(name) for name in names]
    assert len(suite.bars(old)) == 16 and all(met for _, met, _ in suite.bars(old))
    for rows, n in suite.RMS_SHAPES:
        names += [suite.rms_bwd(f"{s} {suite.QUEUED}", rows, n) for s in suite.SCHEDULES]
    good = [res(name) for name in names]
    bars = suite.bars(good)
    assert len(bars) == 18 and all(met for _, met, _ in bars)
    # the backward's share of copy is the queued one: a host-bound call does not fail it, a slow GPU does
    rows, n = suite.RMS_SHAPES[1]
    host_bound = [res(r.name, r.ms, 0.4 if r.name == suite.rms_bwd("fused", rows, n) else 0.95) for r in good]
    assert all(met for _, met, _ in suite.bars(host_bound))
    queued = suite.rms_bwd(f"fused {suite.QUEUED}", rows, n)
    slow_gpu = [res(r.name, r.ms * (3 if r.name == queued else 1), 0.5 if r.name == queued else 0.95) for r in good]
    shape = suite.shape_name(rows, n)
    assert [b for b, met, _ in suite.bars(slow_gpu) if not met] == [
        f"rms bwd {shape} >= 75% of copy (GPU time)",
        f"rms bwd {shape} >= 1.0x compiled (GPU time)",
    ]
    # a sweep width below 90% fails; so does one whose ledger counts a re-read it got from L2 (120% of
    # copy by three trips is 80% by the two every softmax must make)
    sweep = suite.sweep_name(32768)
    for frac, nbytes in ((0.85, two_trips), (1.2, 3 * two_trips // 2)):
        run = [res(r.name, r.ms, frac, nbytes) if r.name == sweep else r for r in good]
        assert [b for b, met, _ in suite.bars(run) if not met] == ["softmax n=32768 >= 90% of copy (read x + write y)"]
    slow = [res(r.name, r.ms * (2 if r.name == suite.sm_fwd("fused", *suite.SOFTMAX_WIDE) else 1)) for r in good]
    assert [b for b, met, _ in suite.bars(slow) if not met] == ["softmax wide >= 0.8x the narrow rate per element"]


# -- exercise 4: the cliff prediction ---------------------------------------------------------------------
def test_cliff_prediction_accepts_a_reasoning_from_l2_and_rejects_no_l2():
    # the band is around the recording the checker reads (the newest: its GPU decides how much of the
    # re-read L2 hides), so the cases are drawn from that measurement, not from one GPU's numbers
    measured, fits, _ = ex.cliff_measured()
    assert fits == {65536: True, 262144: False}  # 132 SMs of 128 KiB rows fit a 50 MB L2; of 512 KiB, not
    assert ex.check_cliff_prediction(dict(measured)).checks == 2
    assert ex.check_cliff_prediction({65536: 1.0, 262144: measured[262144]}).checks == 2  # L2 hides it all
    past = ex.CLIFF_BAND + 0.05
    with pytest.raises(CheckFailed, match="fit in L2"):
        ex.check_cliff_prediction({65536: measured[65536] + past, 262144: measured[262144]})
    with pytest.raises(CheckFailed, match="do not fit"):
        ex.check_cliff_prediction({65536: measured[65536], 262144: measured[262144] - past})
    with pytest.raises(CheckFailed, match="a dict"):
        ex.check_cliff_prediction({65536: 1.0})


# -- exercise 5: LayerNorm's dγ and dβ -------------------------------------------------------------------
@triton.jit
def _dwdb_kernel(
    x_ptr,
    dy_ptr,
    mean_ptr,
    rstd_ptr,
    dw_ptr,
    db_ptr,
    n_rows,
    n_cols,
    stride_m,
    PLAIN: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    cols = tl.program_id(axis=0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n_cols
    dw = tl.zeros([BLOCK_N], dtype=tl.float32)
    db = tl.zeros([BLOCK_N], dtype=tl.float32)
    for start in range(0, n_rows, BLOCK_M):
        rows = start + tl.arange(0, BLOCK_M)
        row_mask = rows < n_rows
        mask = row_mask[:, None] & col_mask[None, :]
        offs = rows[:, None].to(tl.int64) * stride_m + cols[None, :]
        x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=row_mask, other=0.0)
        rstd = tl.load(rstd_ptr + rows, mask=row_mask, other=0.0)
        xhat = x if PLAIN else (x - mean[:, None]) * rstd[:, None]  # PLAIN: the mistake of summing dy * x
        dw += tl.sum(dy * xhat, axis=0)
        db += tl.sum(dy, axis=0)
    tl.store(dw_ptr + cols, dw.to(dw_ptr.dtype.element_ty), mask=col_mask)
    tl.store(db_ptr + cols, db.to(db_ptr.dtype.element_ty), mask=col_mask)


def _dwdb(x, dy, mean, rstd, plain=False, launches=1):
    n_rows, n_cols = x.shape
    dw, db = torch.empty(n_cols, dtype=x.dtype, device=x.device), torch.empty(n_cols, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(n_cols, 64),)
    for _ in range(launches):  # launches=2: the same work twice, as an answer of two kernels would launch
        _dwdb_kernel[grid](x, dy, mean, rstd, dw, db, n_rows, n_cols, x.stride(0), plain, BLOCK_M=32, BLOCK_N=64)
    return dw, db


def test_layernorm_dwdb_accepts_the_solution():
    # dw, then db; then both on rows that cancel, in 16 bits (that shape and one repeated)
    assert ex.check_layernorm_dwdb(_dwdb).checks == 2 * (2 * len(ex.DWDB_SHAPES) + 2) + 2 * 2


def test_layernorm_dwdb_rejects_dy_times_x():
    with pytest.raises(CheckFailed, match="normalised"):
        ex.check_layernorm_dwdb(lambda *a: _dwdb(*a, plain=True))


def test_layernorm_dwdb_rejects_two_kernels_and_torch():
    with pytest.raises(CheckFailed, match="expected 1 Triton kernel launch"):
        ex.check_layernorm_dwdb(lambda *a: _dwdb(*a, launches=2))
    with pytest.raises(CheckFailed, match="torch"):
        ex.check_layernorm_dwdb(
            lambda x, dy, mean, rstd: ((dy * ((x - mean[:, None]) * rstd[:, None])).sum(0), dy.sum(0))
        )


# -- held out: mistakes the checks once let through ---------------------------------------------------------
def test_softmax_rejects_a_shift_by_the_first_logit():
    # logits near 1e4 with each row's first one 100 below the rest: exp(x - x[0]) overflows
    with pytest.raises(CheckFailed, match=r"logits near 10000: inf or NaN.*Subtract the row's maximum"):
        ex.check_softmax(lambda x: _launch_softmax(_wrong_softmax_kernel, x, MISTAKE=5))


def test_add_rmsnorm_rejects_squares_in_fp16():
    # right in fp32; in fp16 the rows sit near 300, whose square overflows fp16
    with pytest.raises(CheckFailed, match=r"float16.*(inf|differ)"):
        ex.check_add_rmsnorm(_wrong_rms(7))
