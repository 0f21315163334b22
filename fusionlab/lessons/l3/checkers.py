"""Checkers for lesson 3's exercises (solutions/03_what_the_compiler_fuses.ipynb).

Exercise 1 has no fixed answer: what ``torch.compile`` fuses depends on the torch version and the
device. So the checker compiles the function itself, on inputs like the learner's (same shapes,
dtypes and device), and compares with that. Compiling costs seconds on a CPU; the truth is cached per
function and inputs, so running a checker cell again is instant.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from ... import grading
from ...grading import CheckFailed, answer_key, call_learner, number
from ...inductor import eager_ops, extern_calls, generated_code, kernel_names

# -- exercise 1: what did it fuse? ------------------------------------------------------------------


@dataclass(frozen=True)
class Fused:
    """What eager PyTorch runs for a function and what ``torch.compile`` generates for it."""

    eager: tuple[str, ...]  # aten ops eager runs, one kernel each
    generated: tuple[str, ...]  # kernels Inductor generated
    library: tuple[str, ...]  # library calls (extern kernels: mm, addmm, ...)


_TRUTH: dict[tuple, Fused] = {}


def _key(fn, inputs) -> tuple:
    code = getattr(fn, "__code__", None)
    ident = (code.co_code, code.co_consts, code.co_names) if code is not None else id(fn)
    shapes = tuple((tuple(t.shape), t.dtype, t.device.type) if isinstance(t, torch.Tensor) else repr(t) for t in inputs)
    return (getattr(fn, "__qualname__", repr(fn)), ident, shapes)


def what_it_fused(fn, inputs) -> Fused:
    """The truth on this machine: eager ops, generated kernels and library calls for ``fn(*inputs)``.

    Compiled on fresh inputs like ``inputs`` (same shapes, dtypes and device); cached."""
    inputs = tuple(inputs)
    key = _key(fn, inputs)
    if key not in _TRUTH:
        like = tuple(
            torch.randn_like(t) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs
        )
        code = generated_code(fn, *like)
        _TRUTH[key] = Fused(tuple(eager_ops(fn, *like)), tuple(kernel_names(code)), tuple(extern_calls(code)))
    return _TRUTH[key]


def _count(value, what: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # a numpy int is a count too
        if isinstance(value, (list, tuple)):
            raise CheckFailed(f"{name}: {what} should be a number; you gave a list — count it with len(...).")
        raise CheckFailed(f"{name}: {what} should be a whole number, got {value!r}.")
    return int(value)


def check_what_it_fused(fn, inputs, *, n_eager, n_generated, n_library) -> grading.Passed:
    """Exercise 1: ``n_eager`` ops eager runs, ``n_generated`` kernels Inductor generates and
    ``n_library`` library calls it makes instead, for ``fn(*inputs)`` on this machine."""
    name = getattr(fn, "__name__", "fn")
    got = {
        k: _count(v, k, name) for k, v in (("n_eager", n_eager), ("n_generated", n_generated), ("n_library", n_library))
    }
    if not callable(fn) or not isinstance(inputs, (tuple, list)):
        raise CheckFailed(
            f"{name}: pass the function and a tuple of its inputs, got {type(fn).__name__} and {type(inputs).__name__}."
        )
    # the learner's function runs here (eager and compiled): an error in it becomes a message
    truth = call_learner(what_it_fused, fn, tuple(inputs), name=name, where=f"{name}(*inputs)")
    want = {"n_eager": len(truth.eager), "n_generated": len(truth.generated), "n_library": len(truth.library)}
    if got["n_eager"] != want["n_eager"]:
        raise CheckFailed(
            f"{name}: n_eager = {got['n_eager']} is not the number of ops eager PyTorch runs here. Every "
            "op is its own kernel — a `* 2` and a `.relu()` count too, a view does not. Let "
            "ic.eager_ops(fn, *inputs) list them, and count the list."
        )
    if got["n_generated"] != want["n_generated"]:
        if want["n_library"] and got["n_generated"] == want["n_generated"] + want["n_library"]:
            tip = (
                "You counted the library call as well: Inductor does not generate the matmul, it calls "
                "a library (extern_calls(code)). Count it in n_library, not in n_generated."
            )
        elif got["n_generated"] == want["n_eager"]:
            tip = (
                "That is the eager count, one kernel per op. Compiled, ops that feed each other are fused: "
                "count the kernels in the generated code with ic.count_kernels(code)."
            )
        else:
            tip = "Count the kernels in the code ic.generated_code(fn, *inputs) returns: ic.count_kernels(code)."
        raise CheckFailed(f"{name}: n_generated = {got['n_generated']} is not what Inductor generates here. {tip}")
    if got["n_library"] != want["n_library"]:
        raise CheckFailed(
            f"{name}: n_library = {got['n_library']} is not right. Library calls are the `extern_kernels.*` "
            "lines of the generated code (ic.extern_calls(code)): the operations Inductor hands to a library "
            "instead of generating a kernel, such as a matmul."
        )
    launches = want["n_generated"] + want["n_library"]
    msg = (
        f"✓ {name}: eager runs {grading.plural(want['n_eager'], 'kernel')}; compiled, {want['n_generated']} "
        f"generated + {want['n_library']} library = {launches} launch{'es' if launches != 1 else ''}"
    )
    return grading.passed(msg)


# -- exercise 2: Amdahl for the layer ---------------------------------------------------------------


@answer_key
def layer_speedup(matmul_ms: float, small_eager_ms: float, small_compiled_ms: float) -> float:
    """The layer's predicted speedup from fusing its small ops: the matmul's time does not change."""
    return (matmul_ms + small_eager_ms) / (matmul_ms + small_compiled_ms)


_PERCENT = " That is the gain in percent; a speedup is a ratio, time before over time after (1.3, not 30)."
_AMDAHL_CASES = ((1.6385, 0.5012, 0.2098), (1.0, 1.0, 0.5), (0.0, 0.8, 0.2), (10.0, 0.4, 0.1), (0.3, 2.0, 0.5))


def check_layer_speedup(predict) -> grading.Passed:
    """Exercise 2: ``predict(matmul_ms, small_eager_ms, small_compiled_ms)`` -> the layer's speedup."""
    for mm, se, sc in _AMDAHL_CASES:
        call = f"predict({mm}, {se}, {sc})"
        got = number(call_learner(predict, mm, se, sc, name="predict", where=call), call, "(a ratio, no unit)")
        want = layer_speedup(mm, se, sc)
        if abs(got - want) <= 1e-6 * want:
            continue
        tip = ""
        if abs(got - se / sc) < 1e-6 * (se / sc) and mm > 0:
            tip = (
                " That is the speedup of the small ops alone; the layer also runs the matmul, which "
                "fusion does not touch."
            )
        elif abs(got - 1 / want) < 1e-6 / want:
            tip = " Upside down: a speedup is the time before (eager) divided by the time after (compiled)."
        elif mm > 0 and abs(got - (mm + se) / mm) < 1e-6 * (mm + se) / mm:
            tip = (
                " That is the layer with the small ops costing nothing at all (exercise 3); compiled, they "
                "still take small_compiled_ms."
            )
        elif abs(got - (want - 1) * 100) < 1e-6 * max(want * 100, 1.0):
            tip = _PERCENT
        raise CheckFailed(f"{call} = {got:.6g}, expected {want:.6g}.{tip}")
    msg = "✓ layer speedup: (matmul + small ops eager) / (matmul + small ops compiled) — the matmul does not move"
    return grading.passed(msg)


# -- exercise 3: the ceiling of fusion -------------------------------------------------------------


@answer_key
def fusion_ceiling(matmul_ms: float, small_eager_ms: float) -> float:
    """The most fusing the small ops can give the layer: they cost nothing, the matmul remains."""
    return (matmul_ms + small_eager_ms) / matmul_ms


def check_fusion_ceiling(ceiling) -> grading.Passed:
    """Exercise 3: ``ceiling(matmul_ms, small_eager_ms)`` -> the layer's speedup if the small ops were free."""
    for mm, se, _ in _AMDAHL_CASES:
        if mm == 0:
            continue
        call = f"ceiling({mm}, {se})"
        got = number(call_learner(ceiling, mm, se, name="ceiling", where=call), call, "(a ratio, no unit)")
        want = fusion_ceiling(mm, se)
        if abs(got - want) <= 1e-6 * want:
            continue
        tip = ""
        if abs(got - 1 / want) < 1e-6 / want:
            tip = " Upside down: time before (matmul + small ops) divided by time after (matmul alone)."
        elif abs(got - se / mm) < 1e-6 * max(se / mm, 1e-12):
            tip = " Close: the time saved over the time left — but a speedup is time before over time after."
        elif abs(got - (want - 1) * 100) < 1e-6 * max(want * 100, 1.0):
            tip = _PERCENT
        raise CheckFailed(f"{call} = {got:.6g}, expected {want:.6g}.{tip}")
    msg = "✓ ceiling: (matmul + small ops) / matmul — with the small ops free, only the matmul is left"
    return grading.passed(msg)
