"""The launchers' shared machinery: checks, configurations, and the direct launch path."""

import pytest
import torch
from conftest import gpu_only

from fusionlab import runtime
from fusionlab.instrument import LaunchCounter
from fusionlab.kernels import _launch
from fusionlab.kernels.bias_gelu import _launch as bias_gelu_launcher
from fusionlab.kernels.bias_gelu import bias_gelu, bias_gelu_reference
from fusionlab.kernels.cos import cos_cos, cos_cos_reference

DEV = runtime.DEVICE


def test_key_tells_apart_what_triton_specialises_on():
    x = torch.zeros(64, device=DEV)
    assert _launch._key((x, 16)) == _launch._key((torch.ones(64, device=DEV), 32))  # both multiples of 16
    assert _launch._key((x, 16)) != _launch._key((x, 17))
    assert _launch._key((x, 1)) != _launch._key((x, 3))  # 1 is specialised
    assert _launch._key((x, 16)) != _launch._key((x[1:], 16))  # 16-byte alignment
    assert _launch._key((x, 16)) != _launch._key((x.half(), 16))  # dtype
    assert _launch._key((x, 2**31)) != _launch._key((x, 16))  # 64-bit ints


@pytest.mark.parametrize("n", [1, 7, 1000, 4097])
def test_row_config_holds_the_row_or_tiles_it(n):
    cfg = _launch.row_config(n, torch.float32, max_block=1024)
    assert cfg["BLOCK_N"] >= min(n, 1024) and cfg["SINGLE_TILE"] == (n <= 1024)
    assert cfg["BLOCK_N"] & (cfg["BLOCK_N"] - 1) == 0


def test_a_watched_launch_takes_tritons_own_path():
    x = torch.randn(37, 129, device=DEV)
    b = torch.randn(129, device=DEV)
    bias_gelu(x, b)
    with LaunchCounter() as c:  # the counter hooks Triton's own run(): the direct path must step aside
        bias_gelu(x, b)
    assert c.names == ["_bias_gelu_kernel"]


@gpu_only
def test_the_direct_path_is_right_on_repeats_and_realignments():
    for shape in [(8, 4096), (37, 129), (1024, 4096)]:
        for _ in range(3):
            base = torch.randn(shape[0] * shape[1] + 8, device=DEV, dtype=torch.bfloat16)
            b = torch.randn(shape[1], device=DEV, dtype=torch.bfloat16)
            for offset in (0, 1, 8):  # 16-byte aligned, misaligned, aligned again
                x = base[offset : offset + shape[0] * shape[1]].view(shape)
                for approximate in ("none", "tanh"):
                    torch.testing.assert_close(
                        bias_gelu(x, b, approximate), bias_gelu_reference(x, b, approximate), atol=2e-2, rtol=2e-2
                    )
                torch.testing.assert_close(cos_cos(x), cos_cos_reference(x), atol=2e-2, rtol=2e-2)
    assert bias_gelu_launcher._compiled  # the direct path was used and cached


@pytest.mark.parametrize(
    "gpu,capability,want", [(False, None, False), (True, (8, 0), False), (True, (8, 9), False), (True, (9, 0), True)]
)
def test_dependent_launch_only_where_the_gpu_has_it(monkeypatch, gpu, capability, want):
    # griddepcontrol is sm_90's: an A100 or L4 launch must not ask for it, the interpreter takes no options
    monkeypatch.setattr(runtime, "is_gpu", lambda: gpu)
    monkeypatch.setattr(runtime, "CAPABILITY", capability)
    assert _launch.pdl_supported() is want
    assert _launch.launch_kwargs(4, pdl=True).get("launch_pdl", False) is want
    assert "launch_pdl" not in _launch.launch_kwargs(4)
