"""The ledger: how many bytes a chain of operations moves through slow memory (HBM).

Unfused, every op is its own kernel: it reads each of its inputs from HBM and writes its output back.
Fused, the chain is one kernel: it reads each *external* input once (one produced by no op of the
chain) and writes only the chain's *outputs*; every intermediate stays on chip, in registers.

For a chain of k same-shape element-wise ops on N elements that is 2kN elements unfused and 2N fused:
the IO reduction that the whole course builds on.

    >>> led = Ledger(dtype_bytes=4)
    >>> led.op("add", reads={"x": 1024, "bias": 8}, writes={"t": 1024})
    >>> led.op("gelu", reads={"t": 1024}, writes={"y": 1024})
    >>> led.unfused_bytes, led.fused_bytes
    (16416, 8224)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

READ = "read"
WRITE = "write"


def _elements(v, what: str) -> int:
    """A count of elements: a whole number >= 0 (an int, or a float that is one), else a clear error."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or int(v) != v:
        raise ValueError(f"{what} has {v!r} elements; expected a whole number >= 0")
    return int(v)


def dtype_bytes(dtype: torch.dtype | int) -> int:
    """Bytes per element: a torch dtype, or a positive int given directly."""
    if isinstance(dtype, torch.dtype):
        return torch.empty((), dtype=dtype).element_size()
    if isinstance(dtype, bool) or not isinstance(dtype, int) or dtype <= 0:
        raise ValueError(f"dtype_bytes must be a torch dtype or a whole number of bytes > 0, got {dtype!r}")
    return dtype


@dataclass(frozen=True)
class Trip:
    """One tensor crossing between HBM and the chip: the unit the course counts."""

    op: str  # the op (kernel) that makes the trip
    tensor: str
    direction: str  # READ: HBM -> chip; WRITE: chip -> HBM
    elements: int
    nbytes: int


@dataclass
class Op:
    name: str
    reads: dict[str, int]
    writes: dict[str, int]


@dataclass
class Ledger:
    """Bytes moved by a chain of ops, unfused (one kernel each) and fused (one kernel in all)."""

    dtype_bytes: int = 4
    ops: list[Op] = field(default_factory=list)
    outputs: tuple[str, ...] | None = None  # default: what the last op writes
    #: bytes (or a dtype) per element by tensor name, for tensors not of ``dtype_bytes`` (fp32
    #: statistics beside bf16 activations, an fp32 weight)
    sizes: dict = field(default_factory=dict)
    #: the fused kernel(s) written out trip by trip, ``(step, tensor, direction, elements)``, built with
    #: :meth:`fused`; when empty, the fused schedule follows the rule "first read of each external
    #: input, write of each output". A reduction needs it: it writes statistics no eager op writes,
    #: re-reads rows too wide for one tile, and moves partial sums.
    schedule: list = field(default_factory=list)
    #: elements the fused kernel reads a second time, by tensor: a row too wide for one tile is read
    #: once for its statistics and again to write the outputs. Added to the rule-based fused schedule
    #: as the step ``reread_step``.
    rereads: dict = field(default_factory=dict)
    reread_step: str = "pass 2"
    #: inputs of the eager chain the fused kernel never reads, because it recomputes them on chip
    #: from other inputs (SwiGLU's backward recomputes silu(g) from g instead of reading it)
    recomputed: tuple = ()

    def __post_init__(self):
        self.dtype_bytes = dtype_bytes(self.dtype_bytes)
        self.sizes = {k: dtype_bytes(v) for k, v in self.sizes.items()}

    def size(self, tensor: str) -> int:
        """Bytes per element of ``tensor``."""
        return self.sizes.get(tensor, self.dtype_bytes)

    def fused(self, step: str, reads: dict | None = None, writes: dict | None = None) -> Ledger:
        """Add one step of the fused schedule: what it reads from and writes to HBM, in elements."""
        for d, trips in ((READ, reads or {}), (WRITE, writes or {})):
            for t, n in trips.items():
                self.schedule.append((step, t, d, _elements(n, f"fused step {step!r}: tensor {t!r}")))
        return self

    # -- building -----------------------------------------------------------------------------
    def op(self, name: str, reads: dict[str, int], writes: dict[str, int]) -> Ledger:
        if not isinstance(name, str) or not name:
            raise ValueError(f"an op needs a name (a non-empty string), got {name!r}")
        for what, d in (("reads", reads), ("writes", writes)):
            if not isinstance(d, dict):
                raise ValueError(
                    f"op {name!r}: {what} must be a dict {{tensor name: elements}}, got {type(d).__name__}"
                )
        for k, v in {**reads, **writes}.items():
            _elements(v, f"op {name!r}: tensor {k!r}")
        self.ops.append(Op(name, {k: int(v) for k, v in reads.items()}, {k: int(v) for k, v in writes.items()}))
        return self

    @classmethod
    def chain(cls, names, n: int, dtype=torch.float32, x: str = "x") -> Ledger:
        """k same-shape element-wise ops, each taking the previous one's output: ``x -> t1 -> ... -> y``.
        ``names``: the ops' names in order (a list); one name alone (a string) is a chain of one op."""
        led = cls(dtype_bytes=dtype_bytes(dtype))
        if isinstance(names, str):
            names = [names]  # list("cos") would be three ops named "c", "o", "s"
        names = list(names)
        if not all(isinstance(name, str) for name in names):
            raise ValueError(f"a chain's ops are named by strings, got {names!r}")
        if not names:
            raise ValueError("a chain needs at least one op")
        _elements(n, "the chain's tensor")
        src = x
        for i, name in enumerate(names):
            dst = "y" if i == len(names) - 1 else f"t{i + 1}"
            led.op(name, reads={src: n}, writes={dst: n})
            src = dst
        return led

    # -- counting -----------------------------------------------------------------------------
    def _outputs(self) -> set[str]:
        if self.outputs is not None:
            return set(self.outputs)
        return set(self.ops[-1].writes) if self.ops else set()

    def _trip(self, op, tensor, direction, n) -> Trip:
        return Trip(op, tensor, direction, n, n * self.size(tensor))

    def trips(self, fused: bool) -> list[Trip]:
        """Every HBM crossing in launch order. Fused keeps only the first read of each external
        input and the writes of the outputs; the rest never leaves the chip."""
        out: list[Trip] = []
        if fused and self.schedule:
            return [self._trip(*step) for step in self.schedule if step[3]]
        if not fused:
            for op in self.ops:
                out += [self._trip(op.name, t, READ, n) for t, n in op.reads.items()]
                out += [self._trip(op.name, t, WRITE, n) for t, n in op.writes.items()]
            return out
        produced: set[str] = set()
        seen: set[str] = set()
        outputs = self._outputs()
        rereads = [
            self._trip(self.reread_step, t, READ, _elements(n, f"re-read of {t!r}"))
            for t, n in self.rereads.items()
            if n
        ]
        for op in self.ops:
            for t, n in op.reads.items():
                if t not in produced and t not in seen:
                    out.append(self._trip(op.name, t, READ, n))
                    seen.add(t)
            for t, n in op.writes.items():
                produced.add(t)
                if t in outputs:
                    out.append(self._trip(op.name, t, WRITE, n))
        out = [t for t in out if t.tensor not in self.recomputed]
        first_write = next((i for i, t in enumerate(out) if t.direction == WRITE), len(out))
        return out[:first_write] + rereads + out[first_write:]

    def bytes(self, fused: bool) -> int:
        return sum(t.nbytes for t in self.trips(fused))

    @property
    def unfused_bytes(self) -> int:
        return self.bytes(fused=False)

    @property
    def fused_bytes(self) -> int:
        return self.bytes(fused=True)

    @property
    def kernels_unfused(self) -> int:
        return len(self.ops)

    @property
    def saving(self) -> float:
        """Predicted speedup of fusion for memory-bound ops: unfused bytes / fused bytes."""
        if self.fused_bytes == 0:
            raise ValueError("the fused schedule moves no bytes (empty tensors?): a speedup is undefined")
        return self.unfused_bytes / self.fused_bytes

    def predict_ms(self, bandwidth_GBps: float, fused: bool) -> float:
        """Time to move the bytes at the given bandwidth (GB/s, 1e9 bytes): the memory-bound floor."""
        _positive(bandwidth_GBps, "bandwidth_GBps")
        return self.bytes(fused) / (bandwidth_GBps * 1e9) * 1e3

    def table(self) -> str:
        """A plain-text ledger: one line per trip, unfused beside fused (or one after the other, when
        the fused schedule is written out)."""
        if self.schedule:
            return self._table_by_schedule()
        lines = [f"{'kernel':<10} {'tensor':<8} {'trip':<6} {'unfused':>14} {'fused':>14}"]
        fused = {(t.op, t.tensor, t.direction) for t in self.trips(fused=True)}
        for t in self.trips(fused=False):
            kept = (t.op, t.tensor, t.direction) in fused
            lines.append(
                f"{t.op:<10} {t.tensor:<8} {t.direction:<6} {human_bytes(t.nbytes):>14} "
                f"{human_bytes(t.nbytes) if kept else 'stays on chip':>14}"
            )
        for t in self.trips(fused=True):
            if t.op == self.reread_step and t.tensor in self.rereads:
                lines.append(f"{t.op:<10} {t.tensor:<8} {'reread':<6} {'-':>14} {human_bytes(t.nbytes):>14}")
        if self.recomputed:
            lines.append(f"(fused: {', '.join(self.recomputed)} recomputed on chip, never read)")
        lines.append(f"{'total':<26} {human_bytes(self.unfused_bytes):>14} {human_bytes(self.fused_bytes):>14}")
        lines.append(f"predicted speedup from fusion (memory-bound): {self.saving:.2f}x")
        return "\n".join(lines)

    def _table_by_schedule(self) -> str:
        lines = [f"{'kernel':<20} {'tensor':<8} {'trip':<6} {'bytes':>12}", "eager (one kernel per op):"]
        for t in self.trips(fused=False):
            lines.append(f"  {t.op:<18} {t.tensor:<8} {t.direction:<6} {human_bytes(t.nbytes):>12}")
        lines.append("fused:")
        for t in self.trips(fused=True):
            lines.append(f"  {t.op:<18} {t.tensor:<8} {t.direction:<6} {human_bytes(t.nbytes):>12}")
        lines.append(
            f"total: eager {human_bytes(self.unfused_bytes)} in {self.kernels_unfused} kernels, "
            f"fused {human_bytes(self.fused_bytes)}"
        )
        lines.append(f"predicted speedup from fusion (memory-bound): {self.saving:.2f}x")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _positive(v, what: str, *, zero_ok: bool = False) -> float:
    bad = isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
    if bad or v < 0 or (v == 0 and not zero_ok):
        raise ValueError(f"{what} must be a finite number {'>= 0' if zero_ok else '> 0'}, got {v!r}")
    return float(v)


def arithmetic_intensity(flops: float, nbytes: float) -> float:
    """FLOPs per byte moved: below the machine's balance point, memory sets the time."""
    return _positive(flops, "flops", zero_ok=True) / _positive(nbytes, "bytes moved")


def machine_balance(tflops: float, bandwidth_GBps: float) -> float:
    """FLOPs the chip can do per byte it can move: the ridge of the roofline."""
    return _positive(tflops, "tflops") * 1e12 / (_positive(bandwidth_GBps, "bandwidth_GBps") * 1e9)


def roofline_tflops(intensity: float, peak_tflops: float, bandwidth_GBps: float) -> float:
    """Attainable rate at an intensity: min(peak, bandwidth × intensity)."""
    intensity = _positive(intensity, "intensity", zero_ok=True)
    memory = _positive(bandwidth_GBps, "bandwidth_GBps") * 1e9 * intensity / 1e12
    return min(_positive(peak_tflops, "peak_tflops"), memory)
