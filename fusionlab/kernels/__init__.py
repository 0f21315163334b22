"""The kernels the lessons build, one module per op, each beside its torch reference.

Importing this package needs Triton (Linux); ``fusionlab.runtime`` has already decided GPU or
interpreter before any kernel below is defined.
"""

from .. import runtime

runtime.require_triton()

from ._validate import KernelInputError  # noqa: E402
from .bias_gelu import bias_gelu, bias_gelu_config, bias_gelu_reference  # noqa: E402
from .chain import chain, chain_names, chain_reference  # noqa: E402
from .cos import cos, cos_cos, cos_cos_reference  # noqa: E402

__all__ = [
    "KernelInputError",
    "bias_gelu",
    "bias_gelu_config",
    "bias_gelu_reference",
    "chain",
    "chain_names",
    "chain_reference",
    "cos",
    "cos_cos",
    "cos_cos_reference",
]
