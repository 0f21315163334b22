"""Lesson 4: its benchmark suite (``suite``) and exercise checkers (``checkers``)."""

from __future__ import annotations

import json
from pathlib import Path

from ... import bench
from . import suite

SUITE = "lesson4"


def measure(on_result=None, **case_kwargs) -> bench.SuiteRun:
    """This lesson's timings: measured here on a GPU, the recorded run elsewhere (``KeyError`` while no
    recording holds this lesson's suite yet)."""
    return bench.measure_suite(SUITE, suite.cases, on_result=on_result, **case_kwargs)


# -- the ncu recording: bytes that reached HBM against the L2's, per case (benchmarks/ncu_lesson4.py) ----------
PROFILES_DIR = Path(__file__).resolve().parents[2] / "recorded" / "profiles"
#: the schema versions this reader understands (a new field is ignored; a new schema is refused)
PROFILE_SCHEMAS = (1,)
NO_PROFILE = (
    "The ncu recording of lesson 4 (HBM bytes against L2 bytes per case) is not there yet: no file "
    "recorded/profiles/ncu-lesson4-DEVICE-DATE.json in the package. On a GPU, "
    "`python benchmarks/ncu_lesson4.py` records it."
)


def recorded_bytes(device: str | None = None) -> dict | None:
    """The newest ncu recording of this lesson's cases (``device``: a part of the GPU's name), or None."""
    files = sorted(PROFILES_DIR.glob("ncu-lesson4-*.json"), key=lambda p: p.name[-15:])  # by the date at the end
    found = []
    for p in files:
        data = json.loads(p.read_text())
        if data.get("schema") not in PROFILE_SCHEMAS:
            continue
        if device is None or device.lower() in data["meta"]["device"].lower():
            found.append(data)
    return found[-1] if found else None


def describe_bytes(profile: dict) -> str:
    """The recording as a table: per case, the ledger's bytes, HBM's and L2's, and HBM over the ledger."""
    m = profile["meta"]
    lines = [
        f"ncu on {m['device']}, {m['date']}, torch {m['torch']}, triton {m['triton']} ({m.get('ncu', 'ncu')})",
        f"{'case':<32} {'ledger MiB':>11} {'HBM MiB':>9} {'HBM/ledger':>11} {'L2 MiB':>9}",
    ]
    for c in profile["cases"]:
        hbm = c["dram_read"] + c["dram_write"]
        lines.append(
            f"{c['name']:<32} {c['ledger_bytes'] / 2**20:11.1f} {hbm / 2**20:9.1f} "
            f"{hbm / c['ledger_bytes']:10.2f}x {c['lts_bytes'] / 2**20:9.1f}"
        )
    return "\n".join(lines)
