"""Lesson 1's size sweep: the three regimes a learner meets, on ``cos(cos(x))`` in fp32.

From 4 KiB to 1 GiB (:data:`LOG2_SIZES`), eager ``x.cos().cos()`` (two launches), ``torch.compile`` and the fused Triton
kernel, each timed per call back to back (what a loop of calls costs: host and GPU together) and by
``do_bench`` (GPU time, L2 flushed between calls):

- **launch-bound**: small tensors; a call costs its launches, not its bytes;
- **L2-resident**: up to the L2's size, eager's intermediate never reaches HBM;
- **HBM-bound**: past the L2, the ledger's 2× appears.

Live on a GPU (about a minute); elsewhere the recorded sweep shipped beside this module. Beside it,
:func:`launch_costs`: the launch-bound regime up close, at three small bf16 shapes, each call timed
back to back and as a CUDA graph replay (the cure for launch costs, measured).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ... import bench, runtime
from ...kernels.bias_gelu import bias_gelu, bias_gelu_eager
from ...kernels.cos import cos_cos, cos_cos_eager

#: the recorded sweeps, one per device (``benchmarks/small_tensors.py``; device and versions inside)
RECORDED_FILES = tuple(sorted(Path(__file__).parent.glob("regimes-*.json")))
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
        best = min(best, bench.wall_s(fn, calls) / calls * 1e6)
    return best


def per_call_round_robin(fns: dict, *, calls: int = 1000, rounds: int = 7) -> dict[str, float]:
    """:func:`per_call_us` of several functions, taken in turns: each round times every function once,
    and each keeps its best round. A quiet or noisy spell of the host then falls on all of them alike,
    so their ratio (ours against eager, same op) is not at the mercy of which one ran first."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], per_call_us(fn, calls=calls, repeats=1))
    return best


def graph_us(fn, calls: int = 100) -> float:
    """GPU time per call: a CUDA graph of ``calls`` calls, replayed (no host work in the loop)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    reps = 20
    return bench.wall_s(g.replay, reps) / (reps * calls) * 1e6


#: the small-tensor shapes (bf16): a decode step's activations, a small batch through an MLP, a prefill chunk
LAUNCH_SHAPES = ((8, 4096), (128, 11008), (1024, 4096))


def launch_costs(shapes=LAUNCH_SHAPES) -> list[dict]:
    """The launch-bound regime, measured (GPU only): per shape, for eager PyTorch and the package's
    launchers (bias + GELU, cos·cos) and one-launch torch ops, the time per call back to back
    (:func:`per_call_round_robin`: host and GPU together) and as a CUDA graph replay (:func:`graph_us`:
    the GPU alone, no host work per call). Rows: ``{"shape", "case", "per_call_us", "graph_us"}``."""
    rows = []
    for m, n in shapes:
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        xc = x.flatten()
        cases = {
            "eager gelu(x + b) tanh": lambda x=x, b=b: bias_gelu_eager(x, b, "tanh"),
            "eager gelu(x + b) erf": lambda x=x, b=b: bias_gelu_eager(x, b),
            "fusionlab bias_gelu tanh": lambda x=x, b=b: bias_gelu(x, b, "tanh"),
            "fusionlab bias_gelu erf_fast": lambda x=x, b=b: bias_gelu(x, b, "erf_fast"),
            "fusionlab bias_gelu erf": lambda x=x, b=b: bias_gelu(x, b),
            "eager cos().cos()": lambda xc=xc: cos_cos_eager(xc),
            "fusionlab cos_cos": lambda xc=xc: cos_cos(xc),
            "copy (clone)": lambda x=x: x.clone(),
            "torch x + 1 (one launch)": lambda x=x: x + 1,
        }
        per_call = per_call_round_robin(cases)
        for name, fn in cases.items():
            rows.append({"shape": [m, n], "case": name, "per_call_us": per_call[name], "graph_us": graph_us(fn)})
    return rows


def launch_costs_here_or_recorded(device: str | None = None) -> tuple[list[dict], str]:
    """``(rows, label)``: :func:`launch_costs` measured here on a GPU Triton supports, else the rows
    recorded with the sweep of :func:`recorded_sweep` (``device`` as there), labelled."""
    if runtime.is_gpu():
        return launch_costs(), bench.source_label()
    data = recorded_sweep(device)
    return data["small"], _recorded_label(data["meta"])


#: 2**k fp32 elements, 4 KiB to 1 GiB by fours, and 32 MiB: a point inside the L2-resident band of an H100
#: or H200 (their L2 is 50 and 60 MiB; at 16 MiB a call is still launch-bound)
LOG2_SIZES = (10, 12, 14, 16, 18, 20, 22, 23, 24, 26, 28)


def sweep(log2_sizes=LOG2_SIZES) -> list[dict]:
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
            "compiled": lambda x=x, compiled=compiled: compiled(x),
            "fused": lambda x=x: cos_cos(x),
        }
        row = {"n": n, "bytes": 4 * n}
        for name, fn in fns.items():
            row[f"{name} do_bench ms"] = bench.time_ms(fn)
        per_call = per_call_round_robin(fns, calls=50 if n >= 2**24 else 500, rounds=3)
        row |= {f"{name} per call us": us for name, us in per_call.items()}
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


def recorded_sweep(device: str | None = None) -> dict:
    """A recorded sweep: on ``device`` (a part of its name, e.g. ``"H100"``) if given, else on the
    device of the run the CPU view shows (``bench.recorded()``), so that lesson 1's sweep and its
    timings come from the same GPU; the newest such file."""
    runs = [json.loads(p.read_text()) for p in RECORDED_FILES]
    runs.sort(key=lambda d: (d["meta"]["date"], d["meta"].get("time", "")))
    want = device if device is not None else bench.recorded().meta["device"]
    match = [d for d in runs if want.lower() in d["meta"]["device"].lower()]
    if not match:
        have = sorted({d["meta"]["device"] for d in runs})
        raise FileNotFoundError(f"no recorded regimes sweep on a device matching {want!r}; have {have}")
    return match[-1]


def measure(device: str | None = None) -> Regimes:
    """The sweep: measured here on a GPU Triton supports, a recorded one elsewhere (``device``: see
    :func:`recorded_sweep`)."""
    if runtime.is_gpu():
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        return _from_rows(sweep(), l2, bench.source_label(), True, bench.metadata())
    data = recorded_sweep(device)
    return _from_rows(data["sweep"], data["L2_bytes"], _recorded_label(data["meta"]), False, data["meta"])


def inside_l2_band(reg: Regimes) -> list[int]:
    """The sizes of a sweep past the launch-bound regime and inside the L2: the band where eager's
    intermediate can be served by the L2. Empty where the launch-bound regime reaches past the sweep's last
    size inside the L2 (an H200: a launch covers the time to copy 32 MiB there)."""
    return [b for b in reg.bytes if reg.launch_bytes < b < reg.l2_bytes]


def _recorded_label(m: dict) -> str:
    return (
        f"RECORDED on {m['device']} (sm_{m['capability'].replace('.', '')}), {m['date']}, torch {m['torch']}, "
        f"triton {m['triton']} — not measured on this machine"
    )
