"""Read what ``torch.compile`` wrote: the code Inductor generates for a function, and its kernels.

Lesson 3 asks *what the compiler fused*. The answer is in the code Inductor emits: on a GPU a Python
module with one ``@triton.jit`` kernel per fused group (``triton_poi_fused_add_gelu_0``: "poi" for
pointwise, then the ops it fused); on a CPU the same module with C++ kernels
(``cpp_fused_add_gelu_0``, an ``extern "C"`` function with OpenMP loops). Matmuls are not generated
but called from a library (``extern_kernels.mm``/``addmm``: cuBLAS, or MKL/oneDNN on a CPU).

    >>> code = generated_code(lambda x, b: F.gelu(x + b), x, b)
    >>> kernel_names(code)
    ['cpp_fused_add_gelu_0']            # on a GPU: ['triton_poi_fused_add_gelu_0']
    >>> eager_ops(lambda x, b: F.gelu(x + b), x, b)
    ['add', 'gelu']                     # eager: one kernel per op
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable

import torch

# `name = async_compile.triton('name', '''...` (GPU) or `name = async_compile.cpp_pybinding([...], r'''`
# (CPU): each generated kernel is bound to a module-level name once, however often `call` launches it.
_ASYNC_KERNEL = re.compile(r"^(\w+)\s*=\s*async_compile\.(?:triton|cpp_pybinding|cpp|cuda|halide)\(", re.M)
# A Triton kernel's own definition inside the source string (also what older Inductor versions show)
_TRITON_DEF = re.compile(r"@triton\.jit\s*\n\s*def\s+(\w+)\s*\(")
# Library calls Inductor does not generate code for: matmuls, convolutions, ...
_EXTERN_CALL = re.compile(r"\bextern_kernels\.(\w+)\(")

_SEPARATOR = "\n\n# ---- next compiled graph ----\n\n"
_LOGGERS = ("torch._inductor.graph.__output_code", "torch._inductor.codecache.__output_code")


def _run_with_logs(compiled: Callable, inputs: tuple) -> list[str]:
    """Fallback for a torch without ``run_and_get_code``: switch on the ``output_code`` log
    (what ``TORCH_LOGS=output_code`` does) and keep the records that carry the code."""
    codes: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record):
            if str(record.msg).startswith("Output code:") and record.args:
                codes.append(str(record.args[0]))

    handler = _Keep(level=logging.DEBUG)
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    torch._logging.set_logs(output_code=True)
    for lg in loggers:
        lg.addHandler(handler)
    try:
        torch._dynamo.reset()
        compiled(*inputs)
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
        torch._logging.set_logs()  # back to the defaults (this also drops any earlier set_logs call)
    return list(dict.fromkeys(codes))  # the codecache logs a cache hit's code a second time


def generated_code(fn: Callable, *example_inputs, method: str = "auto", **compile_kwargs) -> str:
    """Compile ``fn`` with ``torch.compile`` (Inductor), run it once on ``example_inputs`` and
    return the code Inductor generated: C++ kernels on a CPU, Triton kernels on a GPU.

    Inductor caches compiled graphs, so the code is only generated (and seen) on a fresh compile:
    this calls ``torch._dynamo.reset()`` first, and every function compiled earlier in the session
    recompiles on its next call (keep that out of a timing: warm up again). Several graphs (graph
    breaks) come back joined by a ``# ---- next compiled graph ----`` line. ``compile_kwargs`` go to
    ``torch.compile`` (e.g. ``mode="max-autotune"``). ``method``: ``"auto"`` uses
    ``torch._inductor.utils.run_and_get_code`` where it exists, ``"logs"`` the ``output_code`` log.
    """
    if method not in ("auto", "logs"):
        raise ValueError(f"method={method!r}; choose 'auto' or 'logs'.")
    compiled = torch.compile(fn, **compile_kwargs)
    run_and_get_code = None
    if method == "auto":
        with contextlib.suppress(ImportError, AttributeError):
            from torch._inductor.utils import run_and_get_code
    if run_and_get_code is not None:
        _, codes = run_and_get_code(compiled, *example_inputs)  # it resets dynamo itself
    else:
        codes = _run_with_logs(compiled, example_inputs)
    if not codes:
        raise RuntimeError(
            "torch.compile generated no code for this function: nothing to compile (no tensor ops), "
            "or a backend other than Inductor ran."
        )
    return _SEPARATOR.join(codes)


def kernel_names(code: str) -> list[str]:
    """The kernels Inductor generated, in order of definition: ``triton_*`` on a GPU, ``cpp_*`` on a CPU.

    Library calls (``extern_kernels.mm``) are not generated kernels: see :func:`extern_calls`.
    """
    names = _ASYNC_KERNEL.findall(code) + _TRITON_DEF.findall(code)
    return list(dict.fromkeys(names))  # a Triton kernel is named twice: its binding and its def


def extern_calls(code: str) -> list[str]:
    """Library kernels the generated code calls (``mm``, ``addmm``, ``bmm``, ...), one per call."""
    return _EXTERN_CALL.findall(code)


def count_kernels(code: str, *, include_extern: bool = False) -> int:
    """How many kernels Inductor generated (fused groups); with ``include_extern``, plus the
    library calls, i.e. every kernel the compiled function launches once per call."""
    return len(kernel_names(code)) + (len(extern_calls(code)) if include_extern else 0)


def eager_ops(fn: Callable, *inputs) -> list[str]:
    """The compute ops eager PyTorch runs for ``fn(*inputs)``, one kernel each (aten names; views,
    allocations and copies left out), for comparison with :func:`count_kernels` of the compiled code."""
    from .check import LaunchCounter

    with torch.no_grad(), LaunchCounter() as counter:
        fn(*inputs)
    return counter.torch_ops
