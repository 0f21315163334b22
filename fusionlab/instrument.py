"""See what a piece of code launches: Triton kernels, torch ops that compute, torch passes over memory.

A fused answer is one kernel and nothing else touching the tensor's data. Three kinds of aten op are
told apart:

- :data:`FREE`: allocations, views and metadata. They move no tensor data (``empty`` reserves memory,
  ``view``/``t``/``permute`` relabel it, ``sym_size`` reads a shape).
- :data:`PASSES`: ops that move tensor data without computing on it: a copy, a cast (``.to(dtype)`` is
  ``_to_copy``), ``clone``, a fill. Each is a trip through memory, so an answer that upcasts its input
  in torch before launching, or computes into an fp32 scratch buffer and casts it back with ``.to``,
  makes extra passes: not fused.
- everything else computes.

:class:`LaunchCounter` records all three, and every outermost Triton launch (one per call, also for
an ``@triton.autotune`` kernel whose autotuner launches each config while it benchmarks).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from torch.utils._python_dispatch import TorchDispatchMode

from . import _triton
from ._triton import Launch

#: aten ops that allocate, view or read metadata: no tensor data moves
FREE = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "view",
        "_unsafe_view",
        "reshape",
        "as_strided",
        "detach",
        "alias",
        "lift_fresh",
        "t",
        "expand",
        "squeeze",
        "unsqueeze",
        "flatten",
        "numel",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "is_same_size",
        "_local_scalar_dense",
        "resolve_conj",
        "resolve_neg",
        "slice",
        "select",
        "permute",
        "transpose",
        "unbind",
        "split",
        "split_with_sizes",
        "chunk",
        "narrow",
        "view_as",
        "contiguous",
        "to",
        "set_",
        "is_nonzero",
        "size",
        "stride",
        "dim",
        "_reshape_alias",
        "unfold",
        "diagonal",
        "movedim",
    }
)
#: aten ops that move tensor data without computing: each one a pass through memory
PASSES = frozenset(
    {
        "copy_",
        "_to_copy",
        "clone",
        "fill_",
        "zero_",
        "zeros",
        "zeros_like",
        "ones",
        "ones_like",
        "full",
        "full_like",
        "new_zeros",
        "new_ones",
        "new_full",
        "_copy_from",
        "_copy_from_and_resize",
        "index_put_",
        "masked_fill_",
        "masked_fill",
        "cat",
        "stack",
        "copy",
    }
)


def op_name(func) -> str:
    """``aten.add.Tensor`` -> ``add``."""
    return func.__name__.split(".")[0]


class LaunchCounter(TorchDispatchMode):
    """Count Triton launches, torch compute ops and torch passes inside a ``with`` block.

    >>> with LaunchCounter() as c:
    ...     y = my_fused_fn(x)
    >>> c.names, c.torch_ops, c.passes
    (['my_kernel'], [], [])

    Torch ops that Triton's interpreter runs *inside* a launch (it copies tensors to and from numpy
    with torch) are not the caller's and are not counted.
    """

    def __init__(self):
        super().__init__()
        self.launches: list[Launch] = []
        self.torch_ops: list[str] = []
        self.passes: list[str] = []
        self._hook = None
        self._state = None

    @property
    def names(self) -> list[str]:
        return [launch.name for launch in self.launches]

    # kept for callers of the first edition
    triton_launches = names

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._state is None or self._state.depth == 0:
            name = op_name(func)
            if name in PASSES:
                self.passes.append(name)
            elif name not in FREE:
                self.torch_ops.append(name)
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self._hook = _triton.launch_hook(self.launches.append)
        self._state = self._hook.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._hook.__exit__(*exc)
            self._hook = None


#: an instruction line of ``cuobjdump -sass`` (``/*0040*/  @!P0 FFMA R1, ...``) or of Triton's own
#: disassembly (``--:-:-:Y:4<TAB>FFMA R1, ...``): the opcode, without predicate or modifiers
_SASS_LINE = re.compile(r"(?:/\*[0-9a-f]{4}\*/|^[-0-9a-fA-Z:]+\t)\s*(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
#: a PTX instruction line: opcode first, then operands, ending in ';' (directives start with '.')
_PTX_LINE = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][a-z0-9_]*)(?:\.[\w.]+)?\s[^;]*;")
#: special-function-unit opcodes (ex2, rsqrt, rcp, sin, cos, lg2...): 16 results per clock per SM on
#: Hopper against 128 fp32 FMAs (CUDA C++ Programming Guide, arithmetic instruction throughput)
SPECIAL = frozenset({"MUFU", "ex2", "rsqrt", "rcp", "sin", "cos", "lg2", "sqrt", "tanh"})


@dataclass(frozen=True)
class InstructionCount:
    """Instructions of one compiled kernel, per element it processes."""

    opcodes: Counter  # opcode -> how many in the program (padding NOPs left out)
    elements_per_thread: float
    listing: str  # "sass" (machine code) or "ptx" (the virtual ISA, when SASS is unavailable)
    arch: int

    @property
    def total(self) -> int:
        return sum(self.opcodes.values())

    @property
    def per_element(self) -> float:
        """Instructions each thread issues per element it owns (the program's set-up included)."""
        return self.total / self.elements_per_thread

    @property
    def special_per_element(self) -> float:
        return sum(n for op, n in self.opcodes.items() if op in SPECIAL) / self.elements_per_thread


def count_instructions(
    kernel, signature: dict, constexprs: dict, *, elements: int, num_warps: int, arch: int = 90
) -> InstructionCount:
    """Compile ``kernel`` for ``arch`` (no GPU needed: :func:`fusionlab._triton.compile_for`) and count
    its instructions per element, where one program handles ``elements`` elements with ``num_warps``
    warps of 32 threads. The count is of the program's straight-line code: right for element-wise
    kernels without loops, which is what it is for."""
    asm = _triton.compile_for(kernel, signature, constexprs, num_warps=num_warps, arch=arch)
    if asm.get("sass"):
        listing, ops = "sass", [m.group(1) for m in map(_SASS_LINE.search, asm["sass"].splitlines()) if m]
    else:
        listing, ops = "ptx", [m.group(1) for m in map(_PTX_LINE.match, asm["ptx"].splitlines()) if m]
        ops = [op for op in ops if op not in {"ret"}]
    opcodes = Counter(op for op in ops if op != "NOP")
    return InstructionCount(opcodes, elements / (32 * num_warps), listing, arch)
