"""fusionlab: the package behind the operator-fusion course.

``runtime`` is imported first, on purpose: it decides GPU or interpreter (and sets
``TRITON_INTERPRET``) before any Triton kernel, ours or a notebook's, is defined.
"""

from . import runtime  # noqa: I001  (must stay first)
from . import bench, trips
from .runtime import DEVICE, info, pick

__version__ = "0.1.0"


def __getattr__(name):
    # widgets pull in ipywidgets and matplotlib: loaded on first use, so `python -m fusionlab.record`
    # runs on a bare GPU machine that has neither.
    if name == "widgets":
        import importlib

        return importlib.import_module(f"{__name__}.widgets")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
__all__ = ["DEVICE", "bench", "info", "pick", "runtime", "trips", "widgets"]
