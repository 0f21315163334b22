"""Lesson 2's checkers accept the reference solutions and reject each kind of wrong answer.

The right answers below are the ones in solutions/02_count_the_trips.ipynb; the wrong ones are the
mistakes the checkers are there to catch: right but unfused (two launches), torch instead of a kernel,
a mask that misses the tail (unwritten elements, or writes past the end), wrong values.
"""

from __future__ import annotations  # noqa: I001  (fusionlab before triton: see below)

import pytest
import torch

# fusionlab first: on a CPU it sets TRITON_INTERPRET, which Triton reads when it is imported (its own
# jit helpers such as tl.cdiv are defined then); imported the other way round they fail in the interpreter
from fusionlab import grading as check
from fusionlab import runtime
import triton
import triton.language as tl

from fusionlab.grading import CheckFailed
from fusionlab.lessons.l2 import checkers as ex
from fusionlab.kernels.bias_gelu import bias_gelu, bias_gelu_reference
from fusionlab.kernels.chain import chain, chain_reference
from fusionlab.kernels.bias_gelu import bias_gelu_ledger
from fusionlab.ledger import Ledger

pytestmark = [
    pytest.mark.lesson2,
    # the interpreter evaluates sigmoid in numpy, whose exp overflows (to the right answer) with a warning
    pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),
]

BLOCK_M, BLOCK_N = runtime.pick(gpu=(1, 1024), interpreter=(64, 256))
BLOCK = runtime.pick(gpu=1024, interpreter=4096)


# -- exercise 1: the reference solution (a 1-D grid of tiles numbered row by row) ---------------------
@triton.jit
def _bias_gelu_kernel(
    x_ptr, bias_ptr, y_ptr, n_rows, n_cols, stride_xm, stride_ym, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    pid = tl.program_id(axis=0)
    n_tiles_n = tl.cdiv(n_cols, BLOCK_N)
    pid_m = pid // n_tiles_n
    pid_n = pid % n_tiles_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < n_cols
    mask = (offs_m[:, None] < n_rows) & mask_n[None, :]
    b = tl.load(bias_ptr + offs_n, mask=mask_n).to(tl.float32)
    x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :], mask=mask).to(tl.float32)
    v = x + b[None, :]
    y = 0.5 * v * (1.0 + tl.erf(v * 0.7071067811865476))
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch(kernel, x, bias, block_m=BLOCK_M, block_n=BLOCK_N):
    n_rows, n_cols = x.shape
    y = torch.empty_like(x)
    grid = (triton.cdiv(n_rows, block_m) * triton.cdiv(n_cols, block_n),)
    kernel[grid](x, bias, y, n_rows, n_cols, x.stride(0), y.stride(0), BLOCK_M=block_m, BLOCK_N=block_n)
    return y


def solution_bias_gelu(x, bias):
    return _launch(_bias_gelu_kernel, x, bias)


# -- exercise 1: wrong answers ---------------------------------------------------------------------
@triton.jit
def _add_bias_kernel(x_ptr, bias_ptr, t_ptr, n_rows, n_cols, BLOCK_N: tl.constexpr):
    row = tl.program_id(axis=0)
    offs_n = tl.arange(0, BLOCK_N)
    for start in range(0, n_cols, BLOCK_N):
        mask = start + offs_n < n_cols
        x = tl.load(x_ptr + row * n_cols + start + offs_n, mask=mask)
        b = tl.load(bias_ptr + start + offs_n, mask=mask)
        tl.store(t_ptr + row * n_cols + start + offs_n, x + b, mask=mask)


@triton.jit
def _gelu_kernel(t_ptr, y_ptr, n_elements, BLOCK: tl.constexpr):
    offs = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    v = tl.load(t_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + offs, (0.5 * v * (1.0 + tl.erf(v * 0.7071067811865476))).to(y_ptr.dtype.element_ty), mask=mask)


def add_then_gelu(x, bias):
    """Right values in fp32, but two kernels: t goes to HBM and back."""
    n_rows, n_cols = x.shape
    t, y = torch.empty_like(x), torch.empty_like(x)
    _add_bias_kernel[(n_rows,)](x, bias, t, n_rows, n_cols, BLOCK_N=256)
    _gelu_kernel[(triton.cdiv(x.numel(), BLOCK),)](t, y, x.numel(), BLOCK=BLOCK)
    return y


@triton.jit
def _full_tiles_only_kernel(
    x_ptr, bias_ptr, y_ptr, n_rows, n_cols, stride_xm, stride_ym, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    # "forgot" the tails: only tiles that lie wholly inside the tensor are written
    pid = tl.program_id(axis=0)
    n_tiles_n = tl.cdiv(n_cols, BLOCK_N)
    offs_m = (pid // n_tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid % n_tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = (offs_m[:, None] < (n_rows // BLOCK_M) * BLOCK_M) & (offs_n[None, :] < (n_cols // BLOCK_N) * BLOCK_N)
    b = tl.load(bias_ptr + offs_n[None, :], mask=keep).to(tl.float32)
    v = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :], mask=keep).to(tl.float32) + b
    y = 0.5 * v * (1.0 + tl.erf(v * 0.7071067811865476))
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], y.to(y_ptr.dtype.element_ty), mask=keep)


@triton.jit
def _no_row_mask_kernel(
    x_ptr,
    bias_ptr,
    y_ptr,
    n_rows,
    n_cols,
    stride_xm,
    stride_ym,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    OFF_BY_ONE: tl.constexpr = False,
):
    # masks the columns but not the rows: the last row block stores past the end of y
    pid = tl.program_id(axis=0)
    n_tiles_n = tl.cdiv(n_cols, BLOCK_N)
    offs_m = (pid // n_tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (pid % n_tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    if OFF_BY_ONE:  # held out: the row mask lets one row too many through
        mask = (offs_m[:, None] <= n_rows) & (offs_n[None, :] < n_cols)
    else:
        mask = (offs_m[:, None] >= 0) & (offs_n[None, :] < n_cols)
    b = tl.load(bias_ptr + offs_n, mask=offs_n < n_cols).to(tl.float32)
    v = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_n[None, :], mask=mask).to(tl.float32) + b[None, :]
    y = 0.5 * v * (1.0 + tl.erf(v * 0.7071067811865476))
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


def test_bias_gelu_accepts_the_solution_and_refuses_the_package_kernel(capsys):
    msg = ex.check_bias_gelu(solution_bias_gelu)
    assert msg.startswith("✓ bias_gelu: 10 checks passed")
    assert msg._ipython_display_() is None  # printed once; as a cell's last value it shows nothing more
    out = capsys.readouterr().out
    assert out.count("✓ bias_gelu") == 1 and "nothing written past the end" in out
    with pytest.raises(CheckFailed, match="fusionlab's own kernel"):
        ex.check_bias_gelu(bias_gelu)


@pytest.mark.parametrize(
    "unfused",
    [
        pytest.param(lambda x, b: (solution_bias_gelu(x, b), solution_bias_gelu(x, b))[1], id="solution-twice"),
        pytest.param(add_then_gelu, id="add-then-gelu-kernels"),
    ],
)
def test_bias_gelu_rejects_two_launches(unfused):
    with pytest.raises(CheckFailed, match=r"expected 1 Triton kernel launch, saw 2.*fuse them"):
        ex.check_bias_gelu(unfused)


def test_bias_gelu_rejects_the_torch_reference():
    with pytest.raises(CheckFailed, match=r"computes with torch \(add, gelu\)"):
        ex.check_bias_gelu(lambda x, b: torch.nn.functional.gelu(x.float() + b.float()).to(x.dtype))
    with pytest.raises(CheckFailed, match="answer keys"):
        ex.check_bias_gelu(bias_gelu_reference)


# tiles of several rows in every mode, so that a missing row mask matters (the GPU default has one row)
def test_bias_gelu_rejects_unwritten_tails():
    with pytest.raises(CheckFailed, match="never written"):
        ex.check_bias_gelu(lambda x, b: _launch(_full_tiles_only_kernel, x, b, 64, 256))


def test_bias_gelu_rejects_writes_past_the_end():
    with pytest.raises(CheckFailed, match=r"shape \(1, 1\), float32: the kernel wrote \d+ elements past the end"):
        ex.check_bias_gelu(lambda x, b: _launch(_no_row_mask_kernel, x, b, 64, 256))


def test_bias_gelu_rejects_a_row_mask_off_by_one():
    # a guard zone behind every output, on a GPU as in the interpreter (runtime.DEVICE); with one row per
    # program (the GPU solution's BLOCK_M = 1) this mistake writes nothing out of place, so 16 rows here
    def off_by_one(x, b):
        n_rows, n_cols = x.shape
        y = torch.empty_like(x)
        grid = (triton.cdiv(n_rows, 16) * triton.cdiv(n_cols, 256),)
        _no_row_mask_kernel[grid](x, b, y, n_rows, n_cols, x.stride(0), y.stride(0), BLOCK_M=16, BLOCK_N=256,
                                  OFF_BY_ONE=True)  # fmt: skip
        return y

    with pytest.raises(CheckFailed, match=r"the kernel wrote \d+ elements? past the end"):
        ex.check_bias_gelu(off_by_one)


@pytest.mark.parametrize(
    "off_by_one, count",
    [pytest.param(False, "4773 elements", id="no-row-mask"), pytest.param(True, "129 elements", id="le-n-rows")],
)
def test_bias_gelu_rejects_a_row_mask_hidden_by_one_row_tiles(off_by_one, count):
    # one row a program (the GPU solution's BLOCK_M = 1): no row tile is partial, so the mistake writes
    # nothing out of place at the answer's own block sizes; the checker runs the kernel with 2-row tiles
    def one_row(x, b):
        n_rows, n_cols = x.shape
        y = torch.empty_like(x)
        grid = (n_rows * triton.cdiv(n_cols, 256),)
        _no_row_mask_kernel[grid](x, b, y, n_rows, n_cols, x.stride(0), y.stride(0), BLOCK_M=1, BLOCK_N=256,
                                  OFF_BY_ONE=off_by_one)  # fmt: skip
        return y

    with check.seeded(1):
        inputs = ex.bias_gelu_inputs(ex.TALL_SHAPE, torch.float32, check.fresh_generator())
    with pytest.raises(
        CheckFailed, match=rf"BLOCK_M = 2 \(you launch it with BLOCK_M = 1\).*wrote {count} past the end"
    ):
        check.check_taller_tiles(one_row, inputs, bias_gelu_reference, name="bias_gelu", seed=1)
    right = lambda x, b: _launch(_bias_gelu_kernel, x, b, 1, 256)  # noqa: E731
    assert check.check_taller_tiles(right, inputs, bias_gelu_reference, name="bias_gelu", seed=1)
    # the solution is tried so where it has one row a program (the GPU), and passes
    tried = check.check_taller_tiles(solution_bias_gelu, inputs, bias_gelu_reference, name="bias_gelu", seed=1)
    assert tried == (BLOCK_M == 1)


def gelu_without_bias(x, bias):
    y = torch.empty_like(x)
    _gelu_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), BLOCK=BLOCK)
    return y


@pytest.mark.parametrize(
    "wrong, message",
    [
        pytest.param(lambda x, b: bias_gelu(x, b, "tanh"), "own kernel", id="tanh-form-borrowed"),
        pytest.param(gelu_without_bias, "input 1 is not passed to your kernel", id="bias-ignored"),
    ],
)
def test_bias_gelu_rejects_wrong_values(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        ex.check_bias_gelu(wrong)


def test_bias_gelu_reports_an_unfilled_stub():
    def stub(x, bias):
        raise NotImplementedError("Exercise: write the kernel body")

    with pytest.raises(CheckFailed, match="not done yet"):
        ex.check_bias_gelu(stub)


def test_guard_zones_catch_a_store_just_past_the_end():
    with check.Sandbox() as box:
        y = torch.empty(3, 5, device=runtime.DEVICE)
        z = torch.empty_like(y)
        w = y.new_empty((4,))
        v = torch.empty_strided((2, 3), (1, 2), device=runtime.DEVICE)
    assert y.shape == (3, 5) and y.is_contiguous() and v.stride() == (1, 2)
    assert all(check.poisoned(t).all() for t in (y, z, w, v))
    assert len(box.guards) == 4 and box.writes_past_the_end() is None
    y.view(-1).as_strided((1,), (1,), 15).fill_(1.0)  # one element just past the end of y
    assert box.writes_past_the_end() == (1, 0)


# -- exercise 2: bytes of bias + GELU ----------------------------------------------------------------
def solution_bias_gelu_bytes(m, n, dtype_bytes, fused):
    if fused:
        return (m * n + n + m * n) * dtype_bytes
    return (m * n + n + m * n + m * n + m * n) * dtype_bytes


def test_bias_gelu_bytes_accepts_the_solution():
    assert ex.check_bias_gelu_bytes(solution_bias_gelu_bytes).startswith("✓ bias_gelu bytes")
    with pytest.raises(CheckFailed, match="answer keys"):  # the package's ledger is the answer key
        ex.check_bias_gelu_bytes(lambda m, n, b, fused: bias_gelu_ledger(m, n, b).bytes(fused))


@pytest.mark.parametrize(
    "wrong,tip",
    [
        (lambda m, n, b, fused: (2 if fused else 4) * m * n * b, "left out the bias"),
        (lambda m, n, b, fused: ((2 if fused else 4) * m * n + m * n) * b, "not m × n"),
        (lambda m, n, b, fused: ((2 if fused else 4) * m * n + (n if fused else 2 * n)) * b, "Only the add kernel"),
        (lambda m, n, b, fused: (4 * m * n + n) * b, "Count the passes"),
        (lambda m, n, b, fused: (2 if fused else 4) * m * n + n, "Count bytes"),
    ],
)
def test_bias_gelu_bytes_rejects_miscounts(wrong, tip):
    with pytest.raises(CheckFailed, match=tip):
        ex.check_bias_gelu_bytes(wrong)


# -- exercise 3: predict the chain ------------------------------------------------------------------
def solution_predict_chain_ms(k, n, dtype_bytes, copy_GBps, fused):
    passes = 2 if fused else 2 * k
    return passes * n * dtype_bytes / (copy_GBps * 1e9) * 1e3


def test_predict_chain_accepts_the_solution():
    assert ex.check_predict_chain_ms(solution_predict_chain_ms).startswith("✓ chain prediction")


@pytest.mark.parametrize(
    "wrong,tip",
    [
        (lambda k, n, b, bw, fused: 2 * k * n * b / (bw * 1e9) * 1e3, "whatever k is"),
        (lambda k, n, b, bw, fused: (2 if fused else 2) * n * b / (bw * 1e9) * 1e3, "its own kernel"),
        (lambda k, n, b, bw, fused: (1 if fused else k) * n * b / (bw * 1e9) * 1e3, "both directions"),
        (lambda k, n, b, bw, fused: (2 if fused else 2 * k) * n * b / (bw * 1e9), "units"),
    ],
)
def test_predict_chain_rejects_wrong_predictions(wrong, tip):
    with pytest.raises(CheckFailed, match=tip):
        ex.check_predict_chain_ms(wrong)


# -- exercise 4: the fused chain kernel -------------------------------------------------------------
@triton.jit
def _chain_kernel(x_ptr, y_ptr, n_elements, K: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offs = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    t = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    for i in tl.static_range(K):
        if i % 4 == 0:
            t = t + 0.5
        elif i % 4 == 1:
            t = tl.maximum(t, 0.0)
        elif i % 4 == 2:
            t = t * 1.5
        else:
            t = tl.sigmoid(t)
    tl.store(y_ptr + offs, t.to(y_ptr.dtype.element_ty), mask=mask)


def solution_chain(x, k):
    y = torch.empty_like(x)
    n = x.numel()
    _chain_kernel[(triton.cdiv(n, BLOCK),)](x, y, n, K=k, BLOCK_SIZE=BLOCK)
    return y


@triton.jit
def _one_op_kernel(x_ptr, y_ptr, n_elements, OP: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(axis=0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    t = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    if OP == 0:
        t = t + 0.5
    elif OP == 1:
        t = tl.maximum(t, 0.0)
    elif OP == 2:
        t = t * 1.5
    else:
        t = tl.sigmoid(t)
    tl.store(y_ptr + offs, t.to(y_ptr.dtype.element_ty), mask=mask)


def chain_one_kernel_per_op(x, k):
    """Right values in fp32, but k kernels: every intermediate goes to HBM and back."""
    t = x
    for i in range(k):
        y = torch.empty_like(x)
        _one_op_kernel[(triton.cdiv(x.numel(), BLOCK),)](t, y, x.numel(), OP=i % 4, BLOCK_SIZE=BLOCK)
        t = y
    return t


@triton.jit
def _chain_unmasked_kernel(x_ptr, y_ptr, n_elements, K: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(axis=0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    t = tl.load(x_ptr + offs).to(tl.float32)  # no mask: reads and writes a whole block, even past the end
    for i in tl.static_range(K):
        if i % 4 == 0:
            t = t + 0.5
        elif i % 4 == 1:
            t = tl.maximum(t, 0.0)
        elif i % 4 == 2:
            t = t * 1.5
        else:
            t = tl.sigmoid(t)
    tl.store(y_ptr + offs, t.to(y_ptr.dtype.element_ty))


def test_chain_accepts_the_solution_and_refuses_the_package_kernel(capsys):
    assert "k = 1, 2, 3, 4, 5, 8" in ex.check_chain(solution_chain)
    with pytest.raises(CheckFailed, match="fusionlab's own kernel"):
        ex.check_chain(chain)
    assert capsys.readouterr().out.count("✓ chain") == 1


def test_chain_rejects_one_kernel_per_op():
    with pytest.raises(CheckFailed, match=r"chain k=2 .*expected 1 Triton kernel launch, saw 2"):
        ex.check_chain(chain_one_kernel_per_op)


def test_chain_rejects_the_torch_reference():
    with pytest.raises(CheckFailed, match=r"computes with torch \(add\)"):
        ex.check_chain(lambda x, k: (x.float() + 0.5).to(x.dtype))
    with pytest.raises(CheckFailed, match="answer keys"):
        ex.check_chain(chain_reference)


def test_chain_rejects_an_unmasked_kernel():
    def unmasked(x, k):
        y = torch.empty_like(x)
        _chain_unmasked_kernel[(triton.cdiv(x.numel(), BLOCK),)](x, y, x.numel(), K=k, BLOCK_SIZE=BLOCK)
        return y

    past_the_end = r"chain k=1 \(add\), size 1, float32: the kernel wrote \d+ elements past the end"
    with pytest.raises(CheckFailed, match=past_the_end):
        ex.check_chain(unmasked)


def test_chain_rejects_wrong_values():
    with pytest.raises(CheckFailed, match=r"chain k=1 \(add\), size .* elements differ"):
        ex.check_chain(lambda x, k: solution_chain(x, min(k + 1, 8)))


def test_chain_prediction_matches_the_ledger():
    # the exercise's formula and the ledger the notebook plots agree
    for k in (1, 4, 8):
        led = Ledger.chain(["op"] * k, 2**28, torch.float32)
        assert solution_predict_chain_ms(k, 2**28, 4, 4000.0, False) == pytest.approx(led.predict_ms(4000.0, False))
        assert solution_predict_chain_ms(k, 2**28, 4, 4000.0, True) == pytest.approx(led.predict_ms(4000.0, True))
