"""Lesson 8's FA3 steps as recorded on a GPU: the FP8 forward and Triton's warp specialisation.

Two scripts measure them, each in one GPU call, and their JSON output is kept here as they wrote it, one
file per script, device and date (``fp8-<device>-<date>.json`` from ``benchmarks/bench_attention_fp8.py``,
``ws-<device>-<date>.json`` from ``benchmarks/probes/probe_ws_attention.py``). The deep dive renders
its tables from these files: every number comes from a run, none is typed. Each file's first row names
the device, torch and triton that measured it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Recording:
    """One script's rows from one GPU call: ``kind`` "fp8" or "ws", the device row, the other rows."""

    kind: str
    device: dict
    rows: list
    path: Path

    def label(self) -> str:
        d = self.device
        versions = f"torch {d.get('torch', '?')}, triton {d.get('triton', '?')}"
        return f"recorded {d.get('date', '?')} on {d.get('name', '?')}, {versions}"

    def of(self, kind: str) -> list[dict]:
        return [r for r in self.rows if r.get("kind") == kind]


def recordings(kind: str, folder: Path = HERE) -> list[Recording]:
    """The recordings of one script (``"fp8"`` or ``"ws"``), oldest file name first."""
    out = []
    for path in sorted(folder.glob(f"{kind}-*.json")):
        rows = json.loads(path.read_text())
        device = next((r for r in rows if r.get("kind") == "device"), {})
        out.append(Recording(kind, device, [r for r in rows if r.get("kind") != "device"], path))
    return out


def fp8_summary(rec: Recording) -> dict:
    """What the FP8 recording says, per timed shape and over the gate: ``"times"`` (d, n, causal, bf16 and
    FP8 TFLOP/s, the speedup of the kernel alone and with the quantisation), ``"gate"`` (the worst error
    of O and lse against float64, of O against the dequantised inputs' exact attention, and bf16's own
    error of O, over the gate's shapes, and whether every case passed)."""
    times = [r for r in rec.of("time") if "speedup" in r]
    gate = rec.of("gate")
    ok = [g for g in gate if "o" in g]
    worst = {k: max((g[k] for g in ok), default=None) for k in ("o", "lse", "o_kernel", "o_bf16")}
    return {"times": times, "gate": worst, "gate_passed": bool(gate) and all(g.get("ok") for g in gate)}


def ws_summary(rec: Recording) -> list[dict]:
    """Per shape of the warp-specialisation probe: the package's forward, the tutorial's fastest correct
    plain and warp-specialised configurations, and every configuration that returned non-finite values,
    a wrong result (error above 1e-2 of O's norm) or did not compile."""
    out = []
    shapes = []
    for r in rec.rows:
        key = (r.get("d"), r.get("n"), r.get("dtype"))
        if None not in key and key not in shapes:
            shapes.append(key)
    for d, n, dtype in shapes:
        rows = [r for r in rec.rows if (r.get("d"), r.get("n"), r.get("dtype")) == (d, n, dtype)]
        package = next((r for r in rows if r["kind"] == "package"), None)
        tut = [r for r in rows if r["kind"] == "tutorial"]

        def good(r):
            return "error" not in r and r.get("nonfinite") == 0 and r.get("err", 1.0) < 1e-2

        best = {}
        for ws in (False, True):
            ok = [r for r in tut if r["ws"] == ws and good(r)]
            best[ws] = max(ok, key=lambda r: r["tflops"]) if ok else None
        out.append({"d": d, "n": n, "dtype": dtype, "package": package, "plain": best[False], "ws": best[True],
                    "bad": [r for r in tut if not good(r)]})  # fmt: skip
    return out


def ws_fp8(rec: Recording) -> list[dict]:
    """The FP8 forward's rows of the warp-specialisation probe (kind "fp8"), per tile: ``"tile"``, and
    ``"plain"``/``"ws"`` (each the row, or None where it was not measured)."""
    out: dict = {}
    for r in rec.of("fp8"):
        out.setdefault(tuple(r["tile"]), {"tile": tuple(r["tile"]), "plain": None, "ws": None})[
            "ws" if r["ws"] else "plain"
        ] = r
    return list(out.values())
