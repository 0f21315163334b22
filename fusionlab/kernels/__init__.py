"""The kernels the lessons build, one module per op, each beside its torch reference.

Importing this package needs Triton (Linux); ``fusionlab.runtime`` has already decided GPU or
interpreter before any kernel below is defined.
"""

from .. import runtime

runtime.require_triton()

from ._validate import KernelInputError  # noqa: E402
from .cos import cos, cos_cos, cos_cos_reference  # noqa: E402

__all__ = ["KernelInputError", "cos", "cos_cos", "cos_cos_reference"]
