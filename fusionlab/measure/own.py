"""A learner's own kernel counted by the GPU: Nsight Compute's DRAM and L2 bytes of the kernel they wrote in
a notebook, for the measured-trips exercises (:mod:`fusionlab.measure.exercises`).

ncu profiles a process of its own (:func:`fusionlab.measure.ncu.profile`), and a function written in a
notebook cannot be imported by one. :func:`module_source` writes it out: the learner's functions, their
Triton kernels and whatever else of the notebook they use (helpers, constants), found by the names their
code uses, with the modules and package functions they use imported by name. That module, beside a
target that builds the exercise's inputs on the GPU (``fusionlab.measure.exercises.cases_target``), is
what ncu runs (:func:`counted`), caches flushed before each kernel.

Where ncu cannot count (no ``ncu``, no permission to read the counters, as on a hosted notebook such
as Colab; or the learner's code cannot be rebuilt in a process of its own), :func:`counted` raises
:class:`~fusionlab.measure.ncu.NcuUnavailable` once and :func:`unavailable` remembers why, so a notebook
pays for the discovery once, and the exercises fall back to their other count (saying so).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import tempfile
import textwrap
import types
from pathlib import Path

import torch

from . import ncu

#: names of the modules whose functions are written out as source (a notebook's; a module a fresh
#: process can import is imported instead)
INLINE_MODULES = frozenset({"__main__"})
_SIMPLE = (int, float, bool, str, type(None))
#: why counters cannot be had here, once found (None: not tried, or they can)
_UNAVAILABLE: list[str] = []


class SourceError(RuntimeError):
    """The learner's code cannot be written out as a module (a name it uses has no source or import)."""


def _names(code: types.CodeType) -> set[str]:
    """Every global name a function's code (and the code nested in it) may look up."""
    out = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            out |= _names(c)
    return out


def _python_function(obj):
    """The Python function behind a Triton kernel (``@triton.jit``, autotuned or not), else ``obj``."""
    while not isinstance(obj, types.FunctionType) and hasattr(obj, "fn"):
        obj = obj.fn
    return obj


def _is_kernel(obj) -> bool:
    return type(obj).__module__.startswith("triton.runtime") and hasattr(obj, "fn")


def module_source(fns: dict, inline=None) -> str:
    """The source of a module that defines each of ``fns`` (name -> function) as the notebook does: for
    every global name their code uses, the notebook's own functions and kernels as their source, modules
    and functions of importable modules as imports, and simple constants as values. ``inline``: the
    modules written out as source (default :data:`INLINE_MODULES`)."""
    inline = INLINE_MODULES if inline is None else inline
    imports: dict[str, str] = {"torch": "import torch", "triton": "import triton"}
    constants: dict[str, str] = {}
    sources: dict[str, str] = {}
    todo = list(fns.items())
    while todo:
        name, obj = todo.pop()
        if name in sources:
            continue
        py = _python_function(obj)
        if not isinstance(py, types.FunctionType):
            raise SourceError(f"{name} is a {type(obj).__name__}, not a function or a Triton kernel")
        if py.__module__ not in inline:
            imports[name] = _import_line(name, obj)
            continue
        try:
            sources[name] = textwrap.dedent(inspect.getsource(py))
        except (OSError, TypeError) as e:
            raise SourceError(f"the source of {name} cannot be read ({e})") from None
        g = py.__globals__
        for ref in sorted(_names(py.__code__)):
            if ref not in g or ref in sources or ref in imports or ref in constants:
                continue
            val = g[ref]
            if isinstance(val, types.ModuleType):
                imports[ref] = f"import {val.__name__} as {ref}" if val.__name__ != ref else f"import {ref}"
            elif isinstance(val, torch.dtype):
                constants[ref] = f"{ref} = {val!r}"
            elif isinstance(val, _SIMPLE):
                constants[ref] = f"{ref} = {val!r}"
            elif type(val).__name__ == "constexpr" and isinstance(getattr(val, "value", None), _SIMPLE):
                constants[ref] = f"{ref} = triton.language.constexpr({val.value!r})"
            elif _is_kernel(val) or isinstance(val, types.FunctionType) or isinstance(val, type):
                todo.append((ref, val))
            # anything else (data, objects) is left out: the learner's kernel code cannot use it
    body = "\n\n\n".join(sources[n] for n in sorted(sources))
    return "\n".join([*imports.values(), *constants.values(), "", "", body])


def _import_line(name: str, obj) -> str:
    py = _python_function(obj) if _is_kernel(obj) else obj
    module, qual = getattr(obj, "__module__", None), getattr(py, "__qualname__", "")
    if _is_kernel(obj):
        module = py.__module__
    if not module or "<" in qual or "." in qual:
        raise SourceError(f"{name} is defined in {module or 'no module'}, and is not importable from there")
    return f"from {module} import {qual} as {name}" if qual != name else f"from {module} import {name}"


#: the target the written-out module adds: it hands its own globals (the learner's functions) to the
#: function that builds the cases (``module:function``, called with them, the builder's name and the specs)
TARGET = """

def _fusionlab_target(builder, specs):
    import {module} as _cases

    return _cases.{function}(globals(), builder, specs)
"""


@contextlib.contextmanager
def _on_path(folder: str):
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [folder, old]))
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def unavailable() -> str | None:
    """Why the GPU's counters cannot count a learner's kernel here, where that was found; else None."""
    return _UNAVAILABLE[0] if _UNAVAILABLE else None


def counted(fns: dict, cases: str, builder: str, specs: list[list], timeout: float = 300) -> list[dict]:
    """Nsight Compute's counters of the learner's ``fns`` run at each of ``specs``, caches flushed before
    each kernel. ``cases`` (``module:function``) builds them in ncu's process, called with the
    written-out module's globals, ``builder`` and the specs as JSON, and returns the thunk of
    :func:`fusionlab.measure.ncu.cases_thunk` (a case a spec, named by its index): a dict a spec, ``dram_read``,
    ``dram_write``, ``l2_bytes``, ``time_ns`` and ``kernels`` (:func:`fusionlab.measure.ncu.counters_of`).
    :class:`~fusionlab.measure.ncu.NcuUnavailable` where they cannot be had (remembered: :func:`unavailable`)."""
    if _UNAVAILABLE:
        raise ncu.NcuUnavailable(_UNAVAILABLE[0])
    try:
        ncu.find_ncu()
        ncu._check_gpu()
    except ncu.NcuUnavailable as e:  # this machine's: the same on every try
        _UNAVAILABLE.append(str(e))
        raise
    module, _, function = cases.partition(":")
    try:
        source = module_source(fns) + TARGET.format(module=module, function=function)
    except SourceError as e:  # the learner's code's: it may change before the next check
        raise ncu.NcuUnavailable(f"your code cannot be run in a process of its own for the profiler: {e}") from None
    name = "_fusionlab_own_" + hashlib.sha1(source.encode()).hexdigest()[:12]
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, name + ".py").write_text(source)
        with _on_path(folder):
            try:
                got = ncu.measure_cases(
                    f"{name}:_fusionlab_target", builder, json.dumps(specs), cache_controls=("all",), timeout=timeout
                )
            except ncu.NcuUnavailable as e:  # no permission to read the counters: the same every time
                _UNAVAILABLE.append(str(e))
                raise
    out = []
    for i in range(len(specs)):
        case = got.get(str(i), {})
        if "all" not in case:
            raise ncu.NcuFailed(f"no counters for case {specs[i]}: {case.get('error', 'not profiled')}")
        out.append(case["all"])
    return out


def l2_size() -> int:
    """This GPU's L2 in bytes: what a kernel's last writes may still hold when it ends, never reaching DRAM
    while the profiler looks."""
    return torch.cuda.get_device_properties(0).L2_cache_size
