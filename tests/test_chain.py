"""Lesson 2's k-op chain: eager is k kernels, fused is one, and they agree for every k."""

from __future__ import annotations

import pytest
import torch
from conftest import DTYPES

from fusionlab import runtime
from fusionlab.grading import Sandbox
from fusionlab.instrument import LaunchCounter
from fusionlab.kernels import KernelInputError
from fusionlab.kernels.chain import CHAIN_OPS, MAX_K, chain, chain_names, chain_reference
from fusionlab.ledger import Ledger

pytestmark = pytest.mark.lesson2

SHAPES = [(1, 1), (3, 5), (37, 129), (128, 1000), (257, 4097)]
KS = range(1, MAX_K + 1)


def _x(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 3).to(runtime.DEVICE, dtype)


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("dtype,atol,rtol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_fused_matches_eager_in_one_launch(shape, dtype, atol, rtol, k):
    x = _x(shape, dtype)
    with Sandbox() as counter:
        y = chain(x, k)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert not torch.isnan(y).any(), f"{int(torch.isnan(y).sum())} elements never written"
    torch.testing.assert_close(y, chain_reference(x, k), atol=atol, rtol=rtol)
    assert counter.names == ["_chain_kernel"]
    assert counter.torch_ops == [], "the work must happen in the Triton kernel"


@pytest.mark.parametrize("k", KS)
def test_eager_is_one_torch_op_per_link(k):
    # in fp32 the reference is exactly the eager chain: k ops, named as the ledger names them
    x = _x((4, 8), torch.float32)
    with LaunchCounter() as counter:
        chain_reference(x, k)
    assert counter.torch_ops == chain_names(k)


@pytest.mark.parametrize("k", KS)
def test_ledger_with_chain_names_counts_2kN_vs_2N(k):
    n = 1000
    led = Ledger.chain(chain_names(k), n, torch.float32)
    assert led.kernels_unfused == k
    assert led.unfused_bytes == 2 * k * n * 4
    assert led.fused_bytes == 2 * n * 4


def test_chain_names_cycle():
    assert chain_names(3) == ["add", "relu", "mul"]
    assert chain_names(8) == [name for name, _ in CHAIN_OPS] * 2
    # k=4 is sigmoid(relu(x + 0.5) * 1.5): at x = -1 that is sigmoid(0) = 0.5, at x = 0 sigmoid(0.75)
    got = chain_reference(torch.tensor([-1.0, 0.0]), 4)
    torch.testing.assert_close(got, torch.sigmoid(torch.tensor([0.0, 0.75])))


def test_small_blocks_many_programs():
    x = _x((37, 129), torch.float32, seed=1)
    with Sandbox() as counter:
        y = chain(x, 5, block_size=256)  # 19 programs, the last one partial
    torch.testing.assert_close(y, chain_reference(x, 5), atol=1e-5, rtol=1e-5)
    assert counter.names == ["_chain_kernel"]


def test_empty_input_launches_nothing():
    x = _x((0, 3), torch.float32)
    with LaunchCounter() as counter:
        y = chain(x, 2)
    assert y.shape == (0, 3) and counter.names == []


# -- bad input --------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, MAX_K + 1, -1])
def test_k_out_of_range(k):
    with pytest.raises(KernelInputError, match=f"k={k}"):
        chain(_x((4,), torch.float32), k)


@pytest.mark.parametrize("k", [2.0, True, "3"])
def test_k_not_an_int(k):
    with pytest.raises(KernelInputError, match="k must be an int"):
        chain(_x((4,), torch.float32), k)


def test_wrong_device():
    with pytest.raises(KernelInputError, match="x is on meta"):
        chain(torch.empty(4, 8, device="meta"), 2)


@pytest.mark.parametrize("dtype", [torch.int32, torch.float64], ids=["int32", "float64"])
def test_wrong_dtype(dtype):
    with pytest.raises(KernelInputError, match="x has dtype"):
        chain(_x((4, 8), torch.float32).to(dtype), 2)


def test_non_contiguous():
    with pytest.raises(KernelInputError, match="not contiguous"):
        chain(_x((8, 4), torch.float32).t(), 2)


def test_bad_block_size():
    with pytest.raises(KernelInputError, match="block_size"):
        chain(_x((4, 8), torch.float32), 2, block_size=100)
