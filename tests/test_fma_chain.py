import pytest
import torch
from conftest import DTYPES

from fusionlab import runtime
from fusionlab.instrument import LaunchCounter
from fusionlab.kernels import KernelInputError
from fusionlab.kernels.fma_chain import fma_chain, fma_chain_flops, fma_chain_ledger, fma_chain_reference

DEV = runtime.DEVICE


@pytest.mark.parametrize("dtype, atol, rtol", DTYPES)
@pytest.mark.parametrize("n", [1, 1000, 4097])
@pytest.mark.parametrize("k", [4, 64, 256])
def test_matches_reference_in_one_launch(n, k, dtype, atol, rtol):
    x = torch.randn(n, device=DEV).to(dtype)
    with LaunchCounter() as c:
        y = fma_chain(x, k)
    assert c.names == ["_fma_chain_kernel"] and not c.torch_ops
    torch.testing.assert_close(y, fma_chain_reference(x, k), atol=max(atol, 1e-5 * k), rtol=rtol)


def test_bytes_do_not_grow_with_k_but_flops_do():
    assert fma_chain_ledger(1000).fused_bytes == 8000
    assert fma_chain_flops(1000, 64) == 2 * fma_chain_flops(1000, 32)


@pytest.mark.parametrize("k", [0, 3, 6, -4, 2**20, 4.0, True])
def test_bad_k(k):
    with pytest.raises(KernelInputError, match="multiple of 4"):
        fma_chain(torch.ones(8, device=DEV), k)


def test_lesson2_fma_sweep_cases_predict_a_knee(monkeypatch):
    from fusionlab.lessons.l2 import suite

    monkeypatch.setattr(suite, "FMA_N", {torch.float32: 4099, torch.bfloat16: 4099})
    copy, vector = 3000.0, 60.0  # GB/s, TFLOP/s: a budget of 60e12 / 2 / (3000e9 / 8) = 80 FMAs per fp32 element
    cases = suite.fma_cases(copy, vector, device=runtime.DEVICE)
    assert [c.name for c in cases[:2]] == ["fma fp32 k=4", "fma fp32 k=8"] and len(cases) == 2 * len(suite.FMA_KS)
    for c in cases[:3]:
        assert c.fn().shape == (4099,)
    pred = {c.name: c.predicted_ms for c in cases}
    assert pred["fma fp32 k=4"] == pred["fma fp32 k=64"] < pred["fma fp32 k=96"]  # memory-bound up to the budget
    assert pred["fma bf16 k=32"] == pred["fma bf16 k=4"] < pred["fma bf16 k=48"]  # half the bytes: half the budget
    assert all(c.predicted_ms is None for c in suite.fma_cases(device=runtime.DEVICE))
