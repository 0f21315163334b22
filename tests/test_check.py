"""The checkers must accept a right answer and reject each kind of wrong one, with a useful message."""

import pytest
import torch
import triton
import triton.language as tl

from fusionlab import check, runtime
from fusionlab.kernels import cos, cos_cos, cos_cos_reference

pytestmark = pytest.mark.lesson1


def make_x(n, dtype, gen):
    return (check.randn(n, dtype, gen=gen),)


def run(student, **kw):
    return check.check_function(student, cos_cos_reference, make_x, name="cos_cos", **kw)


@triton.jit
def _unmasked(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < (n // BLOCK) * BLOCK  # "forgot" the tail: only full blocks are written
    x = tl.load(x_ptr + offs, mask=keep)
    tl.store(y_ptr + offs, tl.cos(tl.cos(x)), mask=keep)


def unmasked(x):
    y = torch.empty_like(x)
    _unmasked[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
    return y


@triton.jit
def _overshooting(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(y_ptr + offs, tl.cos(tl.cos(x)), mask=offs < n + 1)  # one element too far


def overshooting(x):
    y = torch.empty_like(x)
    _overshooting[(triton.cdiv(x.numel(), 256),)](x, y, x.numel(), BLOCK=256)
    return y


def test_a_store_past_the_end_lands_in_the_guard_zone():
    with pytest.raises(check.CheckFailed, match=r"wrote 1 elements past the end .*right after the end"):
        run(overshooting)


def test_right_answer_passes(capsys):
    msg = run(cos_cos)
    assert msg.startswith("✓ cos_cos")
    assert "1 launch each" in capsys.readouterr().out


def test_two_launches_are_not_fusion():
    with pytest.raises(check.CheckFailed, match="expected 1 Triton kernel launch, saw 2"):
        run(lambda x: cos(cos(x)))


def test_calling_torch_is_not_a_kernel():
    with pytest.raises(check.CheckFailed, match=r"computes with torch \(cos\)"):
        run(cos_cos_reference)


def test_ignoring_the_tail_is_caught_by_the_poison():
    with pytest.raises(check.CheckFailed, match="never written"):
        run(unmasked)


def test_wrong_values_are_located():
    with pytest.raises(check.CheckFailed, match="elements differ"):
        run(lambda x: cos(x))


def test_not_implemented_is_reported_as_such():
    def stub(x):
        raise NotImplementedError("write the kernel")

    with pytest.raises(check.CheckFailed, match="not implemented yet"):
        run(stub)


def test_inputs_are_fresh_each_check():
    seen = []
    check.check_function(
        lambda x: (seen.append(x.clone()), cos_cos(x))[1], cos_cos_reference, make_x,
        name="cos_cos", sizes=(64,), dtypes=(torch.float32,),
    )
    check.check_function(
        lambda x: (seen.append(x.clone()), cos_cos(x))[1], cos_cos_reference, make_x,
        name="cos_cos", sizes=(64,), dtypes=(torch.float32,),
    )
    assert not torch.equal(seen[0], seen[1])


def test_odd_sizes_are_not_block_multiples():
    assert all(n % 64 for n in check.ODD_SIZES)


def test_poisoned_allocations_fill_nan_and_restore():
    with check.poisoned_allocations():
        t = torch.empty(10, device=runtime.DEVICE)
        u = torch.empty_like(t)
    assert torch.isnan(t).all() and torch.isnan(u).all()
    assert torch.empty is not None and torch.empty.__module__ != check.__name__


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_tolerance_fits_dtype(dtype):
    atol, rtol = check.tolerance(dtype)
    assert rtol >= torch.finfo(dtype).eps  # a one-ulp difference passes
    assert rtol <= 100 * torch.finfo(dtype).eps  # but not a loose "roughly right"
