"""fusionlab: the package behind the operator-fusion course.

``runtime`` is imported first, on purpose: it decides GPU or interpreter (and sets
``TRITON_INTERPRET``) before any Triton kernel, ours or a notebook's, is defined.

The layers, each importing only those before it:
runtime → ledger → kernels → bench, grading, instrument, inductor → viz → lessons → notebooks.
"""

from . import runtime  # noqa: I001  (must stay first)
from . import bench, ledger
from .runtime import DEVICE, info, pick

__version__ = "0.2.0"


def said(guess, unit: str = "") -> str:
    """A learner's prediction as text beside the measurement: ``"(not set)"`` while it is still None,
    so an unanswered question never prints as "None x"."""
    return "(not set)" if guess is None else f"{guess}{unit}"


def __getattr__(name):
    # viz pulls in ipywidgets and matplotlib: loaded on first use, so `python -m fusionlab.record`
    # runs on a bare GPU machine that has neither. (Not a cycle: viz is simply optional.)
    if name == "viz":
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DEVICE", "bench", "info", "ledger", "pick", "runtime", "said", "viz"]
