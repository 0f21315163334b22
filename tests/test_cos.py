import pytest
import torch
from conftest import DTYPES

from fusionlab import grading as check
from fusionlab import runtime
from fusionlab.kernels import KernelInputError
from fusionlab.kernels.cos import cos, cos_cos, cos_cos_reference

pytestmark = pytest.mark.lesson1

SHAPES = [
    (1,),  # a single element: one program, almost all of it masked
    (4095,),  # one short of the block
    (4097,),  # one past the block: the second program holds one element
    (37, 129),  # 2-D, odd both ways: the kernel sees the flat view
    (3, 5, 7),
]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype, atol, rtol", DTYPES)
@pytest.mark.parametrize(
    "fn, ref",
    [(cos_cos, cos_cos_reference), (lambda x: cos_cos(x, second="precise"), cos_cos_reference), (cos, torch.cos)],
    ids=["cos_cos", "cos_cos_precise", "cos"],
)
def test_matches_reference_in_one_launch(shape, dtype, atol, rtol, fn, ref):
    x = (torch.randn(shape) * 10).to(device=runtime.DEVICE, dtype=dtype)
    with check.Sandbox() as counter:
        y = fn(x)
    assert counter.names == ["_cos_kernel"]
    assert counter.torch_ops == []
    expected = ref(x.float()).to(dtype)
    torch.testing.assert_close(y, expected, atol=atol, rtol=rtol)


def test_polynomial_second_cosine_is_cos_to_fp32_rounding():
    # the second cosine's argument covers all of [-1, 1]; compare with float64 over x where it matters
    x = torch.linspace(-50, 50, 100_003, device=runtime.DEVICE)
    exact = torch.cos(torch.cos(x.double()))
    assert (cos_cos(x).double() - exact).abs().max().item() < 2.5e-7  # ~2 ulp at |y| <= 1
    assert (cos_cos(x, second="precise").double() - exact).abs().max().item() < 2.5e-7


def test_unknown_second_is_refused():
    with pytest.raises(KernelInputError, match="second='fast'"):
        cos_cos(torch.randn(8, device=runtime.DEVICE), second="fast")


def test_empty_tensor():
    x = torch.empty(0, device=runtime.DEVICE)
    assert cos_cos(x).shape == (0,)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: torch.randn(8, device="meta"), "is on meta"),
        (lambda: torch.randn(8, dtype=torch.float64, device=runtime.DEVICE), "dtype float64"),
        (lambda: torch.arange(8, device=runtime.DEVICE), "dtype int64"),
        (lambda: torch.randn(8, 6, device=runtime.DEVICE).t(), "not contiguous"),
        (lambda: [1.0, 2.0], "must be a torch.Tensor"),
    ],
)
@pytest.mark.parametrize("fn", [cos, cos_cos])
def test_bad_input_gets_a_clear_error(make, match, fn):
    with pytest.raises(KernelInputError, match=match):
        fn(make())


@pytest.mark.skipif(runtime.is_gpu(), reason="bf16 is refused only by the interpreter")
def test_bf16_refused_in_interpreter_with_a_reason():
    with pytest.raises(KernelInputError, match="interpreter does not support bfloat16"):
        cos_cos(torch.randn(8, dtype=torch.bfloat16))
