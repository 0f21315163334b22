"""Lesson 9's training runs as recorded on a GPU: ``benchmarks/train_layer.py`` trains a small model of the
package's layers beside eager's, loss for loss, and its JSON output is kept here as the script wrote it,
one file per device and date (``train-<device>-<date>.json``). The lesson draws its loss curves from
these files: every number comes from a run, none is typed. Each file's ``meta`` names the device, torch
and triton that measured it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent


@dataclass(frozen=True)
class TrainingRun:
    """One recorded run: ``meta`` (device, date, versions, the model's config, the script's arguments) and
    ``log`` (every logged step: ``{"step", "eager", "fused", "rel_diff"}``)."""

    meta: dict
    log: list
    worst_rel_diff: float
    ms_per_step: dict
    path: Path

    def label(self) -> str:
        m = self.meta
        where = f"{m.get('device', '?')}, {m.get('date', '?')}, torch {m.get('torch', '?')}"
        return f"RECORDED on {where}, triton {m.get('triton', '?')} (benchmarks/train_layer.py) — not measured here"

    def curve(self, which: str) -> tuple[list[int], list[float]]:
        """``(steps, losses)`` of ``which``: "eager" or "fused"."""
        return [r["step"] for r in self.log], [r[which] for r in self.log]


def training_runs(folder: Path = HERE) -> list[TrainingRun]:
    """Every recorded training run, oldest file name first (empty when none is shipped)."""
    out = []
    for path in sorted(folder.glob("train-*.json")):
        d = json.loads(path.read_text())
        out.append(TrainingRun(d["meta"], d["log"], d["worst_rel_diff"], d["ms_per_step"], path))
    return out
