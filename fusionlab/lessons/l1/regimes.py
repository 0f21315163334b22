"""Lesson 1's size sweep: the three regimes a learner meets, on ``cos(cos(x))`` in fp32.

From 4 KiB to 1 GiB, eager ``x.cos().cos()`` (two launches), ``torch.compile`` and the fused Triton
kernel, each timed per call back to back (what a loop of calls costs: host and GPU together) and by
``do_bench`` (GPU time, L2 flushed between calls):

- **launch-bound**: small tensors; a call costs its launches, not its bytes;
- **L2-resident**: up to the L2's size, eager's intermediate never reaches HBM;
- **HBM-bound**: past the L2, the ledger's 2× appears.

Live on a GPU (about a minute); elsewhere the recorded sweep shipped beside this module.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ... import bench, runtime
from ...kernels.cos import cos_cos, cos_cos_eager

#: the recorded sweep (``benchmarks/small_tensors.py`` on an H100, device and versions inside)
RECORDED = Path(__file__).parent / "regimes-nvidia-h100-80gb-hbm3-2026-11-22.json"
CASES = ("eager", "compiled", "fused")


@dataclass
class Regimes:
    """A sweep: per size, each case's time per call (µs, back to back) and GPU time (ms, do_bench)."""

    bytes: list[int]
    per_call_us: dict[str, list[float]]
    gpu_ms: dict[str, list[float]]
    l2_bytes: int
    label: str
    live: bool
    meta: dict = field(default_factory=dict)

    @property
    def launch_floor_us(self) -> float:
        """The least a call of the fused kernel costs: one launch, whatever the bytes."""
        return min(self.per_call_us["fused"])

    @property
    def launch_bytes(self) -> int:
        """The largest tensor whose fused call still costs under twice the launch floor: up to here,
        the launch, not the bytes, sets the time."""
        return max(
            b for b, t in zip(self.bytes, self.per_call_us["fused"], strict=True) if t <= 2 * self.launch_floor_us
        )

    def ratio(self, i: int, per_call: bool = True) -> float:
        """eager / fused at size index ``i``."""
        d = self.per_call_us if per_call else self.gpu_ms
        return d["eager"][i] / d["fused"][i]


def per_call_us(fn, calls: int = 1000, repeats: int = 5) -> float:
    """Wall time per call of ``calls`` back-to-back calls (the GPU queue drained at both ends), the best of
    ``repeats``: the host's own noise (clock ramps, a neighbour) only ever adds time."""
    best = float("inf")
    for _ in range(repeats):
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def sweep(log2_sizes=range(10, 29, 2)) -> list[dict]:
    """Time the three cases at 2**k fp32 elements for each k (GPU only)."""
    rows = []
    for log2 in log2_sizes:
        n = 2**log2
        x = torch.randn(n, device="cuda")
        # one compile per size, specialised to it: a single compiled function would pass dynamo's
        # recompile limit (8 shapes) part-way through the sweep and quietly run the rest eagerly
        torch._dynamo.reset()
        compiled = torch.compile(cos_cos_eager, dynamic=False)
        compiled(x)
        fns = {
            "eager": lambda x=x: cos_cos_eager(x),
            "compiled": lambda x=x: compiled(x),
            "fused": lambda x=x: cos_cos(x),
        }
        row = {"n": n, "bytes": 4 * n}
        for name, fn in fns.items():
            row[f"{name} do_bench ms"] = bench.time_ms(fn)
            row[f"{name} per call us"] = per_call_us(fn, calls=50 if n >= 2**24 else 500, repeats=3)
        rows.append(row)
    return rows


def _from_rows(rows, l2_bytes, label, live, meta) -> Regimes:
    return Regimes(
        bytes=[r["bytes"] for r in rows],
        per_call_us={c: [r[f"{c} per call us"] for r in rows] for c in CASES},
        gpu_ms={c: [r[f"{c} do_bench ms"] for r in rows] for c in CASES},
        l2_bytes=l2_bytes,
        label=label,
        live=live,
        meta=meta,
    )


def measure() -> Regimes:
    """The sweep: measured here on a GPU Triton supports, the recorded one elsewhere."""
    if runtime.is_gpu():
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        return _from_rows(sweep(), l2, bench.source_label(), True, bench.metadata())
    data = json.loads(RECORDED.read_text())
    m = data["meta"]
    label = (
        f"RECORDED on {m['device']} (sm_{m['capability'].replace('.', '')}), {m['date']}, torch {m['torch']}, "
        f"triton {m['triton']} — not measured on this machine"
    )
    return _from_rows(data["sweep"], data["L2_bytes"], label, False, m)
