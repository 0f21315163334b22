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
