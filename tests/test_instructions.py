"""Counting a kernel's instructions from its compiled code, without a GPU (lesson 2's evidence)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from fusionlab import runtime
from fusionlab.instrument import count_instructions
from fusionlab.lessons.l2.instructions import bias_gelu_instructions, fma_chain_instructions

pytestmark = pytest.mark.lesson2


@triton.jit
def _k_fmas_kernel(x_ptr, y_ptr, n, K: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n)
    for _ in tl.static_range(K):  # unrolled: K FMAs per element in straight-line code
        v = v * 0.999 + 0.001
    tl.store(y_ptr + offs, v, mask=offs < n)


def _fmas(k: int):
    sig = {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "K": "constexpr", "BLOCK": "constexpr"}
    return count_instructions(_k_fmas_kernel, sig, {"K": k, "BLOCK": 1024}, elements=1024, num_warps=4)


def test_k_fmas_cost_k_instructions_per_element():
    base, more = _fmas(0), _fmas(48)
    assert more.listing == base.listing
    added = more.per_element - base.per_element
    assert 47 <= added <= 49, f"48 FMAs per element added {added:.1f} instructions per element"
    if more.listing == "sass":
        assert (more.opcodes["FFMA"] - base.opcodes["FFMA"]) / more.elements_per_thread == 48


def test_gelu_forms_ranked_by_their_arithmetic():
    exact, tanh, fast = (bias_gelu_instructions(torch.bfloat16, a) for a in ("none", "tanh", "erf_fast"))
    # the accurate erf is a long polynomial; tanh and A&S's erf each cost two or three special functions
    assert exact.per_element > 1.3 * max(tanh.per_element, fast.per_element)
    assert fast.special_per_element >= 2 and tanh.special_per_element >= 1
    # bf16 tiles hold twice the elements per thread: the per-program set-up is shared by more of them
    assert 8 < fast.per_element < 60 and exact.arch == 90


def test_compiling_leaves_the_interpreter_working():
    bias_gelu_instructions(torch.float32, "tanh")
    x = torch.randn(1000, device=runtime.DEVICE)
    y = torch.empty_like(x)
    _k_fmas_kernel[(1,)](x, y, x.numel(), K=2, BLOCK=1024)
    torch.testing.assert_close(y, (x * 0.999 + 0.001) * 0.999 + 0.001)


@pytest.mark.parametrize("bad", [dict(dtype=torch.int32), dict(approximate="fast")])
def test_bad_arguments_are_named(bad):
    kwargs = {"dtype": torch.float32, "approximate": "none"} | bad
    with pytest.raises(ValueError, match="bias_gelu_instructions"):
        bias_gelu_instructions(**kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_sweeps_kernel_costs_k_instructions_plus_what_every_element_costs(dtype):
    few, many = fma_chain_instructions(dtype, 16), fma_chain_instructions(dtype, 64)
    assert 47 <= many.per_element - few.per_element <= 49  # 48 more FMAs per element
    overhead = few.per_element - 16  # the load, its conversion, addresses, the chains' ends, the store
    assert 5 < overhead < 40, f"{overhead:.1f} instructions per element besides the FMAs"


@pytest.mark.parametrize("k", [0, 6, True, 4.0])
def test_the_sweeps_kernel_refuses_a_k_it_cannot_run(k):
    with pytest.raises(ValueError, match="k must be a multiple of 4"):
        fma_chain_instructions(torch.float32, k)
