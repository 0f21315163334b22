"""Lesson 3's window into torch.compile: the code Inductor generates, and how many kernels it holds.

Each compilation costs seconds on a CPU (Inductor writes and builds C++), so the module compiles
twice in all: bias + GELU through ``run_and_get_code``, and a small linear layer through the
``output_code`` log fallback.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fusionlab.inductor import count_kernels, eager_ops, extern_calls, generated_code, kernel_names

pytestmark = [
    pytest.mark.lesson3,
    # raised inside torch when Inductor starts, not by this code
    pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"),
]


def bias_gelu(x, b):
    return F.gelu(x + b)


def layer(x, w, b):
    return F.gelu(x @ w.t() + b)


@pytest.fixture(scope="module")
def bias_gelu_code():
    # on the CPU, whatever the mode: Inductor's CPU backend is what this machine can compile for
    return generated_code(bias_gelu, torch.randn(37, 129), torch.randn(129))


def test_eager_runs_two_ops():
    assert eager_ops(bias_gelu, torch.randn(4, 8), torch.randn(8)) == ["add", "gelu"]


def test_compiled_bias_gelu_is_one_fused_kernel(bias_gelu_code):
    names = kernel_names(bias_gelu_code)
    assert count_kernels(bias_gelu_code) == 1, names
    assert "fused" in names[0] and "add" in names[0] and "gelu" in names[0], names
    assert extern_calls(bias_gelu_code) == []
    assert 'extern "C"' in bias_gelu_code  # C++ on a CPU


def test_layer_matmul_stays_a_library_call():
    x, w, b = torch.randn(16, 32), torch.randn(24, 32), torch.randn(24)
    code = generated_code(layer, x, w, b, method="logs")
    # the matmul goes to a library (mm, or addmm with the bias folded in); what is left of
    # bias + GELU is generated, fused into one kernel
    calls = extern_calls(code)
    assert len(calls) == 1 and calls[0] in ("mm", "addmm"), calls
    assert count_kernels(code) == 1, kernel_names(code)
    assert count_kernels(code, include_extern=True) == 2
    assert eager_ops(layer, x, w, b) == ["mm", "add", "gelu"]


GPU_STYLE = '''
triton_poi_fused_add_gelu_0 = async_compile.triton('triton_poi_fused_add_gelu_0', """
@triton_heuristics.pointwise(size_hints={'x': 268435456}, filename=__file__)
@triton.jit
def triton_poi_fused_add_gelu_0(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK : tl.constexpr):
    xoffset = tl.program_id(0) * XBLOCK
""", device_str='cuda')

def call(args):
    extern_kernels.mm(arg0_1, reinterpret_tensor(arg1_1, (4096, 16384), (1, 4096), 0), out=buf0)
    triton_poi_fused_add_gelu_0.run(buf0, arg2_1, buf1, 134217728, stream=stream0)
'''


def test_counts_gpu_style_code_once_per_kernel():
    # Inductor's GPU output names each Triton kernel twice (its binding and its def): count it once
    assert kernel_names(GPU_STYLE) == ["triton_poi_fused_add_gelu_0"]
    assert count_kernels(GPU_STYLE) == 1
    assert count_kernels(GPU_STYLE, include_extern=True) == 2


def test_bad_method():
    with pytest.raises(ValueError, match="method"):
        generated_code(bias_gelu, torch.randn(2), torch.randn(2), method="magic")
