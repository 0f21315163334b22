"""What each form of bias + GELU costs in instructions per element, read from the compiled machine
code before anything is timed — on any Linux machine, GPU or not (Triton compiles for a Hopper GPU
without one).

The lesson compares the count with the GPU's budget (its vector rate divided by its copy bandwidth,
per element): a kernel whose count fits the budget can run at copy speed; one over it is
compute-bound, and can reach at most about budget / count of copy speed.
"""

from __future__ import annotations

import torch

from ...instrument import InstructionCount, count_instructions
from ...kernels._launch import elementwise_config
from ...kernels.bias_gelu import APPROXIMATIONS, _bias_gelu_kernel
from ...kernels.fma_chain import GPU_BLOCK, NUM_WARPS, _check_k, _fma_chain_kernel

_TRITON_TYPE = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def bias_gelu_instructions(dtype: torch.dtype, approximate: str = "none", arch: int = 90) -> InstructionCount:
    """The package's bias + GELU kernel as it runs on a GPU (its GPU tile, the unmasked path taken
    for 1 GiB tensors), compiled for compute capability ``arch``, its instructions counted."""
    if dtype not in _TRITON_TYPE:
        raise ValueError(f"bias_gelu_instructions: dtype must be one of {list(_TRITON_TYPE)}, got {dtype}")
    cfg = elementwise_config(16384, 16384, dtype, gpu=True)
    t = _TRITON_TYPE[dtype]
    signature = {"x_ptr": f"*{t}", "bias_ptr": f"*{t}", "y_ptr": f"*{t}"}
    signature |= dict.fromkeys(("n_rows", "n_cols", "stride_xm", "stride_ym"), "i32")
    signature |= dict.fromkeys(("BLOCK_M", "BLOCK_N", "APPROX", "EVEN"), "constexpr")
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"bias_gelu_instructions: approximate must be one of {list(APPROXIMATIONS)}")
    constexprs = {"BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"], "EVEN": True}
    constexprs["APPROX"] = APPROXIMATIONS[approximate]
    return count_instructions(
        _bias_gelu_kernel,
        signature,
        constexprs,
        elements=cfg["BLOCK_M"] * cfg["BLOCK_N"],
        num_warps=cfg["num_warps"],
        arch=arch,
    )


def fma_chain_instructions(dtype: torch.dtype, k: int, arch: int = 90) -> InstructionCount:
    """The k-FMA kernel of the lesson's sweep as it runs on a GPU, compiled for compute capability
    ``arch``, its instructions counted: k FMAs per element plus what every element costs besides them
    (the load and its conversion, address arithmetic, the store)."""
    if dtype not in _TRITON_TYPE:
        raise ValueError(f"fma_chain_instructions: dtype must be one of {list(_TRITON_TYPE)}, got {dtype}")
    k = _check_k(k, "fma_chain_instructions")
    t = _TRITON_TYPE[dtype]
    signature = {"x_ptr": f"*{t}", "y_ptr": f"*{t}", "n_elements": "i32", "K4": "constexpr", "BLOCK_SIZE": "constexpr"}
    return count_instructions(
        _fma_chain_kernel,
        signature,
        {"K4": k // 4, "BLOCK_SIZE": GPU_BLOCK},
        elements=GPU_BLOCK,
        num_warps=NUM_WARPS,
        arch=arch,
    )
