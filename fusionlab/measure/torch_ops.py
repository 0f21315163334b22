"""The bytes each aten op of torch code reads and writes: the trips of an eager chain, op by op.

:class:`TorchTrips` is a :class:`fusionlab.instrument.LaunchCounter` (it tells compute ops, passes and
free ops apart, and leaves out the torch ops Triton's interpreter runs inside a launch) that also adds
up, for each op it sees, the bytes of its tensor inputs (reads) and of its tensor outputs (writes):

    >>> with TorchTrips() as t:
    ...     y = x.cos().cos()
    >>> [(o.op, o.read_bytes, o.write_bytes) for o in t.ops]
    [('cos', 4096, 4096), ('cos', 4096, 4096)]

What an op is counted for is what it must move if each input is read once and each output written
once, as the ledger counts an eager op: a view, an allocation or a metadata read (:data:`FREE`) moves
nothing and counts zero; an ``out=`` tensor and the destination of ``copy_``/``fill_``/``zero_`` are
written, not read; an in-place op (``add_``) reads and writes its first argument. A tensor's bytes are
those its elements occupy once (a broadcast ``expand`` of a vector is the vector). Any device: the
count reads shapes and dtypes, not counters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..instrument import FREE, PASSES, LaunchCounter, op_name
from ..ledger import human_bytes
from .compare import Totals

#: ops whose first argument is only written (its old contents are never read)
WRITE_ONLY_FIRST = frozenset({"copy_", "fill_", "zero_", "_copy_from", "_copy_from_and_resize"})


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes the elements of ``t`` occupy, each counted once: dimensions of stride 0 (a broadcast) add none."""
    n = 1
    for size, stride in zip(t.shape, t.stride(), strict=True):
        if stride != 0:
            n *= size
    return n * t.element_size() if t.numel() else 0


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


@dataclass(frozen=True)
class OpTrips:
    """One aten op: its name, its kind (``"free"``, ``"pass"`` or ``"compute"``) and its bytes."""

    op: str
    kind: str
    read_bytes: int
    write_bytes: int

    @property
    def nbytes(self) -> int:
        return self.read_bytes + self.write_bytes


def op_trips(func, args, kwargs, out) -> OpTrips:
    """The bytes one dispatched aten op reads and writes."""
    name = op_name(func)
    kind = "free" if name in FREE else "pass" if name in PASSES else "compute"
    if kind == "free":
        return OpTrips(name, kind, 0, 0)
    kwargs = dict(kwargs or {})
    out_args = _tensors({k: kwargs.pop(k) for k in list(kwargs) if k == "out" or k.startswith("out")})
    inputs = _tensors(list(args)) + _tensors(kwargs)
    if name in WRITE_ONLY_FIRST and args and isinstance(args[0], torch.Tensor):
        inputs = inputs[1:]
    outputs = out_args or _tensors(out)
    return OpTrips(name, kind, sum(map(tensor_bytes, inputs)), sum(map(tensor_bytes, outputs)))


class TorchTrips(LaunchCounter, Totals):
    """Count the bytes of every aten op inside a ``with`` block (and, as a LaunchCounter, every Triton
    launch). ``ops``: one :class:`OpTrips` per op that moves data, in order."""

    def __init__(self):
        super().__init__()
        self.ops: list[OpTrips] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if self._state is None or self._state.depth == 0:
            trips = op_trips(func, args, kwargs, out)
            if trips.kind != "free":
                self.ops.append(trips)
        return out

    def _parts(self):
        return self.ops

    def table(self) -> str:
        lines = [f"{'op':<24} {'kind':<8} {'read':>12} {'written':>12}"]
        lines += [
            f"{o.op:<24} {o.kind:<8} {human_bytes(o.read_bytes):>12} {human_bytes(o.write_bytes):>12}" for o in self.ops
        ]
        lines.append(f"{'total':<33} {human_bytes(self.read_bytes):>12} {human_bytes(self.write_bytes):>12}")
        return "\n".join(lines)
