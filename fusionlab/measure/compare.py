"""Measured trips beside the ledger's prediction, tensor by tensor."""

from __future__ import annotations

from dataclasses import dataclass

from ..ledger import Ledger


class Totals:
    """``read_bytes``, ``write_bytes`` and ``nbytes`` of a count made of parts (kernels, ops), each with its
    own ``read_bytes`` and ``write_bytes``: a subclass says which in ``_parts()``."""

    def _parts(self):
        raise NotImplementedError

    @property
    def read_bytes(self) -> int:
        return sum(p.read_bytes for p in self._parts())

    @property
    def write_bytes(self) -> int:
        return sum(p.write_bytes for p in self._parts())

    @property
    def nbytes(self) -> int:
        return self.read_bytes + self.write_bytes


@dataclass(frozen=True)
class TripCheck:
    """One tensor's trips in one direction: what the ledger predicts and what was counted."""

    tensor: str
    direction: str
    predicted: int
    measured: int

    @property
    def difference(self) -> int:
        return self.measured - self.predicted


def ledger_by_tensor(led: Ledger, fused: bool = True) -> dict[tuple[str, str], int]:
    """The ledger's bytes by ``(tensor, direction)`` (re-reads and every step of a schedule added up)."""
    out: dict[tuple[str, str], int] = {}
    for t in led.trips(fused):
        out[t.tensor, t.direction] = out.get((t.tensor, t.direction), 0) + t.nbytes
    return out


def resolve_aliases(measured: dict[tuple[str, str], int], known) -> dict[tuple[str, str], int]:
    """Name each group of parameters that were given one tensor (``"h|y"``: a launcher's placeholder for
    a pointer its kernel leaves unused) after its one member in ``known`` (the ``(tensor, direction)``
    pairs of a ledger); a group with none or several such members keeps its name."""
    out: dict[tuple[str, str], int] = {}
    for (t, d), n in measured.items():
        if "|" in t and len(hits := [p for p in t.split("|") if (p, d) in known]) == 1:
            t = hits[0]
        out[t, d] = out.get((t, d), 0) + n
    return out


def against_ledger(measured: dict[tuple[str, str], int], led: Ledger, fused: bool = True) -> list[TripCheck]:
    """Every ``(tensor, direction)`` either side names, the ledger's first, then any it does not have
    (measured groups of aliased parameters named by :func:`resolve_aliases`)."""
    predicted = ledger_by_tensor(led, fused)
    measured = resolve_aliases(measured, predicted)
    keys = list(predicted) + [k for k in measured if k not in predicted]
    return [TripCheck(t, d, predicted.get((t, d), 0), measured.get((t, d), 0)) for t, d in keys]
