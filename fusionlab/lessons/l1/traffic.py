"""Lesson 1's evidence from the profiler: where each kernel's bytes went, HBM or only the L2.

A timing says how long a kernel took, not where its bytes came from. ``benchmarks/l2_traffic.py`` runs
eager ``x.cos().cos()``, the fused ``cos_cos`` and a copy under Nsight Compute and records, per kernel,
the bytes read from and written to HBM (``dram__bytes_read.sum``, ``dram__bytes_write.sum``) and the
bytes through the L2 (``lts__t_bytes.sum``), into ``fusionlab/recorded/l2_traffic/<device>-<date>.json``.
This module reads those files; it measures nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

#: the recordings, one per device and date (device and versions inside)
TRAFFIC_DIR = Path(__file__).resolve().parents[2] / "recorded" / "l2_traffic"
SCRIPT = "benchmarks/l2_traffic.py"


@dataclass
class Traffic:
    meta: dict
    rows: list[dict]

    @property
    def label(self) -> str:
        m = self.meta
        return (
            f"RECORDED with Nsight Compute ({m.get('ncu', '?')}) on {m['device']}, {m['date']}, torch {m['torch']}, "
            f"triton {m['triton']} — not measured on this machine"
        )

    def row(self, case: str, nbytes: int, mode: str = "warm") -> dict:
        for r in self.rows:
            if r["case"] == case and r["bytes"] == nbytes and r["mode"] == mode:
                return r
        raise KeyError(f"no {mode} row for {case!r} at {nbytes} bytes")

    def sizes(self) -> list[int]:
        return sorted({r["bytes"] for r in self.rows})

    def intermediate_from_hbm(self, nbytes: int, mode: str = "warm") -> float:
        """The share of eager's intermediate that its second kernel read from HBM (1.0: all of it; near
        0: the L2 served it)."""
        second = self.row("eager cos().cos()", nbytes, mode)["per_kernel"][1]
        return second["dram_read"] / nbytes

    def hbm_over_ledger(self, case: str, nbytes: int, mode: str = "warm") -> float:
        """HBM bytes (read + written, all the case's kernels) over the ledger's count for the case: one
        read and one write of the tensor for the fused kernel and the copy, two of each for eager."""
        r = self.row(case, nbytes, mode)
        hbm = sum(k["dram_read"] + k["dram_write"] for k in r["per_kernel"])
        return hbm / (2 * nbytes * len(r["per_kernel"]))


def recorded(device: str | None = None, directory: Path = TRAFFIC_DIR) -> Traffic | None:
    """The newest recording on a device whose name contains ``device`` (any device if None), or None
    when there is none yet."""
    files = sorted(directory.glob("*.json")) if directory.is_dir() else []
    runs = [json.loads(p.read_text()) for p in files]
    if device is not None:
        runs = [d for d in runs if device.lower() in d["meta"]["device"].lower()]
    if not runs:
        return None
    runs.sort(key=lambda d: (d["meta"]["date"], d["meta"].get("time", "")))
    return Traffic(runs[-1]["meta"], runs[-1]["rows"])
