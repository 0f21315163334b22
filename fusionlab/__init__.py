"""fusionlab: the package behind the operator-fusion course.

``runtime`` is imported first, on purpose: it decides GPU or interpreter (and sets
``TRITON_INTERPRET``) before any Triton kernel, ours or a notebook's, is defined.
"""

from . import runtime  # noqa: I001  (must stay first)
from . import bench, trips, widgets
from .runtime import DEVICE, info, pick

__version__ = "0.1.0"
__all__ = ["DEVICE", "bench", "info", "pick", "runtime", "trips", "widgets"]
