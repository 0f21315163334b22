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

What several ops share lives in private modules: ``_launch`` (input checks, launch options, the
direct launch path), ``_rows`` (row layouts, the 16-byte unit, a row's body and fragments, split
rows' synchronisation) and ``_norms`` (what RMSNorm and LayerNorm share). One op is built on
another's kernel: ``linear_cross_entropy`` launches ``cross_entropy``'s, chunk by chunk, through its
public ``cross_entropy_rows`` and the private ``_cross_entropy_kernels`` that both import (never the
other's private code). An op's GPU-only schedules may live in a private module of their own
(``_cross_entropy_kernels``, ``_softmax_split``), so that the op's module reads top to bottom.

``fusionlab.runtime`` has already decided GPU or interpreter before any kernel below is defined (and,
without Triton, put ``fusionlab._no_triton``'s stand-ins in its place: the modules import, a launch
raises ``TritonUnavailable``). Call an op through its module:
``from fusionlab.kernels.bias_gelu import bias_gelu``.
"""

from .. import runtime  # noqa: F401  (first: it decides the mode before any kernel is defined)
from . import (
    adamw,
    attention,
    attention_backward,
    attention_decode,
    bias_gelu,
    chain,
    cos,
    cross_entropy,
    dropout_norm,
    fma_chain,
    layernorm,
    linear,
    linear_cross_entropy,
    matmul,
    rmsnorm,
    rmsnorm_linear,
    rope,
    softmax,
    swiglu,
)
from ._launch import KernelInputError, pdl_supported
from ._tensors import TargetOutOfRange

__all__ = [
    "KernelInputError",
    "TargetOutOfRange",
    "adamw",
    "attention",
    "attention_backward",
    "bias_gelu",
    "chain",
    "cos",
    "cross_entropy",
    "dropout_norm",
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
    "rope",
    "attention_decode",
]
