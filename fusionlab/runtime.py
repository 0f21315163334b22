"""Where the course's kernels run: on a GPU, or through Triton's interpreter on the CPU.

The decision is made once, when fusionlab is imported, and *before* any kernel is defined:
``TRITON_INTERPRET=1`` only takes effect for ``@triton.jit`` functions decorated after it is set.
That is why every notebook imports fusionlab before it defines a kernel of its own.

Override with the environment variable ``FUSIONLAB_MODE``:

- ``auto`` (default): GPU if CUDA is there and Triton supports it (compute capability >= 8.0),
  otherwise the interpreter.
- ``gpu``: insist on the GPU (also on a T4, where Triton may work at times: element-wise kernels
  usually compile, ``tl.dot`` falls back to slow FMA code or fails).
- ``interpreter``: run every Triton kernel on the CPU, even when a GPU is present.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
import warnings
from dataclasses import dataclass, field

import torch

from . import _triton

MIN_CAPABILITY = (8, 0)  # Triton's supported floor (Ampere); a T4 is (7, 5)

GPU = "gpu"
INTERPRETER = "interpreter"
_VALID = ("auto", GPU, INTERPRETER)


def _cuda_capability() -> tuple[int, int] | None:
    try:
        if torch.cuda.is_available():
            return torch.cuda.get_device_capability(0)
    except Exception:  # a broken driver reads as "no GPU", never as a crash on import
        return None
    return None


def decide_mode(requested: str, capability: tuple[int, int] | None, triton_env: str | None) -> tuple[str, str]:
    """Return ``(mode, reason)``. Pure function of its inputs, so it can be tested on any machine."""
    requested = (requested or "auto").strip().lower()
    if requested not in _VALID:
        raise ValueError(f"FUSIONLAB_MODE={requested!r} is not one of {', '.join(_VALID)}.")
    if triton_env and triton_env not in ("0", ""):
        if requested == GPU:
            raise RuntimeError("FUSIONLAB_MODE=gpu but TRITON_INTERPRET is set: unset one of them.")
        return INTERPRETER, "TRITON_INTERPRET is set in the environment"
    if requested == INTERPRETER:
        return INTERPRETER, "FUSIONLAB_MODE=interpreter"
    if capability is None:
        if requested == GPU:
            raise RuntimeError(
                "FUSIONLAB_MODE=gpu, but torch sees no CUDA GPU. Unset FUSIONLAB_MODE to run the "
                "course through Triton's interpreter on the CPU."
            )
        return INTERPRETER, "no CUDA GPU found"
    if requested == GPU:
        return GPU, f"FUSIONLAB_MODE=gpu (compute capability {capability[0]}.{capability[1]})"
    if capability < MIN_CAPABILITY:
        return INTERPRETER, (
            f"this GPU has compute capability {capability[0]}.{capability[1]}; Triton supports "
            f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} and newer. Triton kernels run in the interpreter "
            "(correct, slow) and the lessons show recorded GPU timings. To try Triton on this GPU anyway "
            "(element-wise kernels often work; tl.dot is slow or fails), set FUSIONLAB_MODE=gpu before "
            "`import fusionlab`, in a fresh kernel (Jupyter: `%env FUSIONLAB_MODE=gpu` as the first cell)."
        )
    return GPU, f"CUDA GPU with compute capability {capability[0]}.{capability[1]}"


def _has_triton() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # an import hook that refuses it, or a module without a spec
        return False


#: whether a real Triton is importable; without one (macOS, Windows) the stand-ins of
#: ``fusionlab._no_triton`` take its place, so the torch cells run and the Triton cells say what they need
HAS_TRITON = _has_triton()
if not HAS_TRITON:
    from . import _no_triton

    _no_triton.install()
CAPABILITY = _cuda_capability()
MODE, REASON = decide_mode(os.environ.get("FUSIONLAB_MODE", "auto"), CAPABILITY, os.environ.get("TRITON_INTERPRET"))
if not HAS_TRITON:  # no kernel can run, on a GPU or not: the lessons take their CPU sizes and recorded timings
    MODE = INTERPRETER
    REASON = (
        "Triton is not installed (Triton publishes wheels for Linux only): torch cells run on the CPU, "
        "Triton cells say they need Linux or Colab, timings shown are recorded"
    )


if MODE == INTERPRETER:
    # Must happen before any @triton.jit below (or in a notebook) is decorated.
    os.environ["TRITON_INTERPRET"] = "1"
    if HAS_TRITON and "triton.language" in sys.modules:  # imported before us: mend what it already compiled
        _triton.reinterpret_helpers()

#: where Triton kernels' tensors live
DEVICE = torch.device("cuda" if MODE == GPU else "cpu")
if MODE == GPU:
    # torch warns once a process, from autograd's worker thread, that its first cuBLAS call found "no current
    # CUDA context" and set the primary one: harmless, and on a GPU it showed under a lesson's backward cells
    warnings.filterwarnings("ignore", message="Attempting to run cuBLAS, but there was no current CUDA context")
#: dtypes a lesson may use; the interpreter does not support bf16
DTYPES = (torch.float32, torch.bfloat16, torch.float16) if MODE == GPU else (torch.float32, torch.float16)
#: the low-precision dtype a lesson shows beside fp32
HALF = torch.bfloat16 if MODE == GPU else torch.float16


def is_gpu() -> bool:
    return MODE == GPU


def is_interpreter() -> bool:
    return MODE == INTERPRETER


def pick(*, gpu, interpreter):
    """The value for this mode: full sizes on a GPU, small ones for the interpreter."""
    return gpu if MODE == GPU else interpreter


def version(mod: str) -> str | None:
    try:
        return __import__(mod).__version__
    except Exception:
        return None


@dataclass(frozen=True)
class RuntimeInfo:
    mode: str
    reason: str
    device: str
    device_name: str
    capability: str | None
    torch: str
    triton: str | None
    python: str
    dtypes: tuple[str, ...] = field(default_factory=tuple)

    def label(self) -> str:
        """One line that travels with every timing: where it was measured, with which software."""
        return f"{self.device_name} · torch {self.torch} · triton {self.triton}"

    def __str__(self) -> str:
        rows = [
            ("mode", self.mode),
            ("why", self.reason),
            ("Triton kernels run on", self.device),
            ("device", self.device_name + (f" (sm_{self.capability.replace('.', '')})" if self.capability else "")),
            ("torch", self.torch),
            ("triton", self.triton or "not installed"),
            ("python", self.python),
            ("dtypes", ", ".join(self.dtypes)),
        ]
        w = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:>{w}} : {v}" for k, v in rows)

    def _repr_pretty_(self, p, cycle):  # IPython shows the table, not the dataclass repr
        p.text(str(self))


def info() -> RuntimeInfo:
    """What this machine can do, in one call: mode, device, capability and versions."""
    if CAPABILITY is not None:
        name = torch.cuda.get_device_name(0)
        cap = f"{CAPABILITY[0]}.{CAPABILITY[1]}"
    else:
        name = f"CPU ({platform.machine()})"
        cap = None
    return RuntimeInfo(
        mode=MODE,
        reason=REASON,
        device=str(DEVICE),
        device_name=name,
        capability=cap,
        torch=torch.__version__.split("+")[0],
        triton=version("triton"),
        python=sys.version.split()[0],
        dtypes=tuple(str(d).replace("torch.", "") for d in DTYPES),
    )
