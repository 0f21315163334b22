"""The logical trips of a Triton kernel, counted in Triton's interpreter: the bytes every ``tl.load`` and
``tl.store`` touches, lanes the mask turns off left out, per tensor argument and per launch.

A laptop has no memory counters, but the interpreter runs every load and store of a kernel in Python,
so it can say exactly what the kernel asks of memory: each load counts, also a second load of bytes a
program already read (a re-read: on a GPU it may be served by L2, which only the hardware counters of
:mod:`fusionlab.measure.ncu` can tell). This is what the ledger predicts for a fused kernel, and
what a learner's own kernel can be checked against on a CPU.

    >>> with InterpreterTrips() as t:
    ...     y = cos_cos(x)
    >>> t.kernels[0].reads, t.kernels[0].writes
    ({'x_ptr': 4096}, {'y_ptr': 4096})

Addresses are mapped back to the tensor arguments of the launch by range (each argument's first to last
byte); an address in no argument's range (a pointer the kernel built from an integer) is counted under
:data:`UNKNOWN`. Launches are seen through :func:`fusionlab._triton.launch_hook`, memory ops through
:func:`fusionlab._triton.memory_hook`; an ``@triton.autotune`` kernel's benchmark runs of its configs are
dropped and the launch's final run kept.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np

from .. import _triton, runtime
from ..ledger import READ, WRITE, human_bytes
from .compare import Totals

#: the tensor name for an address inside no tensor argument of the launch
UNKNOWN = "?"


def _extent(t) -> tuple[int, int]:
    """First byte and one past the last byte a tensor's elements occupy (its view, not its storage)."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    span = 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, t.stride(), strict=True))
    return t.data_ptr(), t.data_ptr() + span * t.element_size()


@dataclass
class KernelTrips:
    """The bytes one launch read and wrote, by tensor argument (the kernel's parameter name)."""

    name: str
    reads: dict[str, int] = field(default_factory=dict)
    writes: dict[str, int] = field(default_factory=dict)

    @property
    def read_bytes(self) -> int:
        return sum(self.reads.values())

    @property
    def write_bytes(self) -> int:
        return sum(self.writes.values())

    @property
    def nbytes(self) -> int:
        return self.read_bytes + self.write_bytes

    def trips(self) -> list[tuple[str, str, int]]:
        """``(tensor, direction, bytes)`` in the ledger's words (``"read"``, ``"write"``)."""
        return [(t, READ, n) for t, n in self.reads.items()] + [(t, WRITE, n) for t, n in self.writes.items()]


class _Ranges:
    """Address ranges of a launch's tensor arguments, looked up a whole array of addresses at a time.

    A launcher may pass one tensor to several parameters (a placeholder for a pointer the kernel's
    flags leave unused, or an in-place kernel's input and output): the addresses cannot tell which
    parameter a load went through, so such bytes are named after all of them, ``"h_ptr|y_ptr"``. Where
    arguments only partly overlap (two views of one buffer), the parameter listed first keeps the
    bytes both cover."""

    def __init__(self, names, tensors):
        spans: dict[tuple[int, int], list[str]] = {}
        for n, t in zip(names, tensors, strict=True):
            if t.numel():
                spans.setdefault(_extent(t), []).append(n)
        self.starts = np.array([s for s, _ in spans], dtype=np.uint64)
        self.ends = np.array([e for _, e in spans], dtype=np.uint64)
        self.names = ["|".join(ns) for ns in spans.values()]

    def count(self, addrs: np.ndarray) -> dict[str, int]:
        """Lanes per tensor name."""
        owner = np.full(addrs.shape, -1)
        for i, (start, end) in enumerate(zip(self.starts, self.ends, strict=True)):
            owner[(owner < 0) & (addrs >= start) & (addrs < end)] = i
        out: dict[str, int] = {}
        for i, n in zip(*np.unique(owner, return_counts=True), strict=True):
            name = self.names[i] if i >= 0 else UNKNOWN
            out[name] = out.get(name, 0) + int(n)
        return out


class InterpreterTrips(Totals):
    """Count the bytes of every load and store of every Triton kernel launched inside a ``with`` block,
    in Triton's interpreter (``fusionlab.runtime`` in interpreter mode). ``kernels``: one
    :class:`KernelTrips` per launch, in launch order. On a GPU nothing is interpreted and nothing is
    counted, so entering the block raises: use :mod:`fusionlab.measure.ncu` there."""

    def __init__(self):
        self.kernels: list[KernelTrips] = []
        self._ranges: _Ranges | None = None
        self._hooks = None

    # -- the hooks' callbacks ----------------------------------------------------------------------
    def _on_launch(self, launch: _triton.Launch) -> None:
        names = launch.arg_names or [f"arg{i}" for i in range(len(launch.tensors))]
        self._ranges = _Ranges(names, launch.tensors)
        self.kernels.append(KernelTrips(launch.name))

    def _on_grid(self) -> None:
        # each run of the grid starts the count afresh: an autotuner's benchmark runs come before the
        # launch that counts, which is the last
        if self.kernels:
            self.kernels[-1].reads.clear()
            self.kernels[-1].writes.clear()

    def _on_access(self, direction: str, addrs, size: int) -> None:
        if not self.kernels or self._ranges is None:
            return
        into = self.kernels[-1].reads if direction == READ else self.kernels[-1].writes
        for name, lanes in self._ranges.count(addrs).items():
            into[name] = into.get(name, 0) + lanes * size

    def __enter__(self):
        if runtime.is_gpu():
            raise RuntimeError(
                "InterpreterTrips counts Triton's interpreter, and here the kernels run compiled on the GPU "
                "(nothing would be counted): fusionlab.measure.ncu reads the GPU's own counters."
            )
        self._hooks = contextlib.ExitStack()
        self._hooks.enter_context(_triton.launch_hook(self._on_launch))
        self._hooks.enter_context(_triton.memory_hook(self._on_access, self._on_grid))
        return self

    def __exit__(self, *exc):
        hooks, self._hooks = self._hooks, None
        return hooks.__exit__(*exc)

    # -- reading the count -------------------------------------------------------------------------
    def _parts(self):
        return self.kernels

    def by_tensor(self, names: dict[str, str] | None = None) -> dict[tuple[str, str], int]:
        """Bytes by ``(tensor, direction)`` over every launch, each kernel parameter named as the ledger
        names its tensor: ``names`` maps a parameter name (or a group of parameters given one tensor,
        ``"h_ptr|y_ptr"``) to a ledger name (``{"part_ptr": "dw_partial"}``); any other parameter loses a
        trailing ``_ptr`` (``x_ptr`` is ``x``, ``h_ptr|y_ptr`` is ``h|y``). Names mapped to one ledger
        name add up. :func:`fusionlab.measure.compare.against_ledger` names a group after the one member
        the ledger knows."""
        out: dict[tuple[str, str], int] = {}
        for k in self.kernels:
            for t, d, n in k.trips():
                names = names or {}
                name = names.get(t) or "|".join(names.get(p, p.removesuffix("_ptr")) for p in t.split("|"))
                out[name, d] = out.get((name, d), 0) + n
        return out

    def table(self) -> str:
        lines = [f"{'kernel':<28} {'tensor':<14} {'trip':<6} {'bytes':>12}"]
        for k in self.kernels:
            for t, d, n in k.trips():
                lines.append(f"{k.name:<28} {t:<14} {d:<6} {human_bytes(n):>12}")
        lines.append(f"{'total':<50} {human_bytes(self.nbytes):>12}")
        return "\n".join(lines)


def interpreter_trips(fn, *args, **kwargs) -> tuple[object, InterpreterTrips]:
    """Run ``fn(*args, **kwargs)`` and count its kernels' trips: ``(result, trips)``."""
    with InterpreterTrips() as t:
        out = fn(*args, **kwargs)
    return out, t
