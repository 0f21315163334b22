"""Bad input gets a clear error, never a wrong answer: a sweep over the public launchers of lessons 1–3.

Each launcher is run on the same classes of awkward input: non-finite values (must give what the torch
reference gives), lazily negated views (torch keeps the sign as a flag; the memory is unchanged),
tensors that require grad (these ops have no backward), non-tensors, wrong devices and dtypes.
"""

from __future__ import annotations

import pytest
import torch

from fusionlab import runtime
from fusionlab.kernels import KernelInputError
from fusionlab.kernels.bias_gelu import bias_gelu, bias_gelu_reference
from fusionlab.kernels.chain import chain, chain_reference
from fusionlab.kernels.cos import cos, cos_cos, cos_cos_reference

DEV = runtime.DEVICE


def _bias(x):
    dtype = x.dtype if isinstance(x, torch.Tensor) and x.is_floating_point() else torch.float32
    return torch.linspace(-1, 1, 64, device=DEV, dtype=dtype)


#: name -> (launcher taking one tensor x of shape (rows, 64), its reference)
LAUNCHERS = {
    "cos": (cos, lambda x: x.float().cos().to(x.dtype)),
    "cos_cos": (cos_cos, cos_cos_reference),
    "cos_cos precise": (lambda x: cos_cos(x, second="precise"), cos_cos_reference),
    "chain k=4": (lambda x: chain(x, 4), lambda x: chain_reference(x, 4)),
    "chain k=8": (lambda x: chain(x, 8), lambda x: chain_reference(x, 8)),
    **{
        f"bias_gelu {a}": (
            lambda x, a=a: bias_gelu(x, _bias(x), a),
            lambda x, a=a: bias_gelu_reference(x, _bias(x), a),
        )
        for a in ("none", "tanh", "erf_fast")
    },
}
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's overflow warnings in the interpreter


@pytest.mark.parametrize("name", LAUNCHERS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_non_finite_inputs_give_what_the_reference_gives(name, dtype):
    fn, ref = LAUNCHERS[name]
    x = torch.randn(3, 64, device=DEV).to(dtype)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e4, -1e4, 65504.0])
    x[0, : special.numel()] = special.to(dtype)
    torch.testing.assert_close(fn(x), ref(x), atol=2e-3, rtol=2e-3, equal_nan=True)


@pytest.mark.parametrize("name", LAUNCHERS)
def test_a_negated_view_is_refused_not_read_raw(name):
    fn, _ = LAUNCHERS[name]
    x = torch.randn(3, 64, device=DEV)
    neg = torch._neg_view(x)
    assert neg.is_neg()
    with pytest.raises(KernelInputError, match="negated"):
        fn(neg)


@pytest.mark.parametrize("name", LAUNCHERS)
def test_an_input_that_requires_grad_is_refused(name):
    fn, _ = LAUNCHERS[name]
    x = torch.randn(3, 64, device=DEV, requires_grad=True)
    with pytest.raises(KernelInputError, match="no backward"):
        fn(x)
    with torch.no_grad():
        fn(x)  # fine without autograd


@pytest.mark.parametrize("name", LAUNCHERS)
@pytest.mark.parametrize("bad", [None, 3.0, [1.0, 2.0]], ids=["None", "float", "list"])
def test_a_non_tensor_is_refused(name, bad):
    fn, _ = LAUNCHERS[name]
    with pytest.raises((KernelInputError, AttributeError, TypeError)) as err:
        fn(bad)
    assert isinstance(err.value, KernelInputError) or "Tensor" in str(err.value)


@pytest.mark.parametrize("name", LAUNCHERS)
def test_wrong_device_and_dtype_are_refused(name):
    fn, _ = LAUNCHERS[name]
    with pytest.raises(KernelInputError, match="is on meta"):
        fn(torch.empty(3, 64, device="meta"))
    with pytest.raises(KernelInputError, match="dtype"):
        fn(torch.ones(3, 64, device=DEV, dtype=torch.int32))


@pytest.mark.parametrize("bad", [0, -8, 3, 2**21, True, 4.0])
def test_block_sizes_are_checked(bad):
    x = torch.randn(4, 64, device=DEV)
    with pytest.raises(KernelInputError):
        chain(x, 2, block_size=bad)
    with pytest.raises(KernelInputError):
        bias_gelu(x, torch.zeros(64, device=DEV), block_m=bad)


# -- arguments that used to fail far inside, with a raw Python error ------------------------------------
@pytest.mark.parametrize("bad", [[], {}, None, 1, "exact", torch.ones(1)], ids=repr)
def test_a_bad_choice_gets_the_courses_error(bad):
    from fusionlab.kernels.linear import linear
    from fusionlab.kernels.matmul import gemm

    x = torch.randn(4, 64, device=DEV)
    with pytest.raises(KernelInputError, match="approximate"):
        bias_gelu(x, torch.zeros(64, device=DEV), approximate=bad)  # [] was "unhashable type: 'list'"
    with pytest.raises(KernelInputError, match="activation"):
        linear(x, torch.randn(16, 64, device=DEV), activation=bad if bad is not None else "relu")
    with pytest.raises(KernelInputError, match="activation"):
        gemm(x, torch.randn(64, 16, device=DEV), activation=9 if bad in (None, 1) else bad)  # 1 is a code


@pytest.mark.parametrize("bad", ["BLOCK_N=1024", ["BLOCK_N"], 3], ids=repr)
def test_a_configuration_override_that_is_not_a_dict_is_refused(bad):
    from fusionlab.kernels.layernorm import layernorm
    from fusionlab.kernels.rmsnorm import rmsnorm

    x, w = torch.randn(4, 64, device=DEV), torch.ones(64, device=DEV)
    for call in (
        lambda: rmsnorm(x, w, fwd_config=bad),  # a string was "AttributeError: 'str' object has no attribute 'items'"
        lambda: rmsnorm(x, w, bwd_config=bad),
        lambda: layernorm(x, w, None, fwd_config=bad),
    ):
        with pytest.raises(KernelInputError, match="must be a dict"):
            call()


@pytest.mark.skipif(runtime.is_gpu(), reason="the refusal is for a machine without a GPU")
def test_wall_s_without_a_gpu_is_the_courses_refusal():
    from fusionlab import bench

    with pytest.raises(bench.NotOnGPU, match="wall_s"):  # was torch's "Torch not compiled with CUDA" assertion
        bench.wall_s(lambda: None, 3)


def test_a_chain_of_one_named_op():
    from fusionlab.ledger import Ledger

    one = Ledger.chain("cos", 10)  # list("cos") would be three ops, "c", "o", "s"
    assert [op.name for op in one.ops] == ["cos"]
    assert one.unfused_bytes == Ledger.chain(["cos"], 10).unfused_bytes == 2 * 10 * 4
    with pytest.raises(ValueError, match="named by strings"):
        Ledger.chain([1, 2], 10)
