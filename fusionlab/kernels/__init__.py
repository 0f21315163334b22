"""The course's kernels: one op, one module, one name.

``fusionlab.kernels.<op>`` holds everything the op is, in this order:

- ``_<op>_kernel`` (and ``_<op>_bwd_kernel``...): the ``@triton.jit`` code;
- ``<op>_reference``: the spec in torch, computed in fp32 (or float64), imported by tests, checkers,
  benchmarks and lessons — never written twice;
- ``<op>_eager``: what eager PyTorch runs for the op, the baseline every benchmark compares with;
- ``<op>_ledger(...)``: the bytes each schedule moves (a :class:`fusionlab.ledger.Ledger`, op by op as
  eager runs it; its fused total is what the kernel moves), and ``<op>_flops(...)``;
- ``<op>_config(...)``: the launch configuration, through :mod:`fusionlab.kernels._launch`;
- ``<op>(...)``: the launcher and public entry: checks its inputs, allocates, launches (an
  ``autograd.Function`` where the op has a backward).

Importing this package needs Triton (Linux); ``fusionlab.runtime`` has already decided GPU or
interpreter before any kernel below is defined. Call an op through its module:
``from fusionlab.kernels.bias_gelu import bias_gelu``.
"""

from .. import runtime

runtime.require_triton()

from . import (  # noqa: E402
    attention,
    attention_backward,
    bias_gelu,
    chain,
    cos,
    cross_entropy,
    fma_chain,
    layernorm,
    linear,
    linear_cross_entropy,
    matmul,
    rmsnorm,
    rmsnorm_linear,
    softmax,
    swiglu,
)
from ._launch import KernelInputError, pdl_supported  # noqa: E402
from ._tensors import TargetOutOfRange  # noqa: E402

__all__ = [
    "KernelInputError",
    "TargetOutOfRange",
    "attention",
    "attention_backward",
    "bias_gelu",
    "chain",
    "cos",
    "cross_entropy",
    "fma_chain",
    "layernorm",
    "linear",
    "linear_cross_entropy",
    "matmul",
    "rmsnorm",
    "rmsnorm_linear",
    "softmax",
    "swiglu",
    "pdl_supported",
]
