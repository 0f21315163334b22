"""The recorded trips: Nsight Compute's counters of every lesson's cases, read back on any machine.

``benchmarks/record_trips.py`` writes, on a GPU with ``ncu``, one JSON file a run into
``fusionlab/recorded/trips/`` (``<device>-<date>-<time>.json``)::

    {"schema": 2,
     "meta": {"device", "capability", "date", "time", "torch", "triton", "cuda", "ncu", "L2_bytes", "SMs", ...},
     "metrics": [the ncu metrics],
     "parts": {part: {case: {"name", "group", "ledger_bytes", "schedule_bytes", ...,
                             "all":  {"dram_read", "dram_write", "l2_bytes", "time_ns", "kernels": [...]},
                             "none": {... the same, caches not flushed}}}},
     "missing": {"part cache-setting": why}}

A part is one of the recorder's experiments (``large``, ``eager_softmax``, ``cliff``, ``regimes``) or a
lesson's suite (``lesson1``...). ``"all"``: caches flushed before each kernel (ncu's default); ``"none"``:
not, so a kernel meets the L2 as the one before it left it. A case that could not run holds ``"error"``
and no counters; cases of group :data:`FLUSH` only empty the L2 for the next one. This module reads
the files; it measures nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..bench import RECORDED_DIR
from ..bench import recorded as recorded_timings

#: the recorded counters, one file a run
TRIPS_DIR = RECORDED_DIR / "trips"
#: the format this reader understands (a new field is ignored; another schema is refused)
SCHEMA = 2
#: the group of the cases that only empty the L2 before the next one
FLUSH = "flush"
#: the script that records them
SCRIPT = "benchmarks/record_trips.py"
FLUSHED, WARM = "all", "none"
CACHE_CONTROLS = (FLUSHED, WARM)


def read(path: Path) -> dict:
    """A recorded trips file, checked for its schema."""
    data = json.loads(Path(path).read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: trips schema {data.get('schema')}, this fusionlab reads {SCHEMA}")
    return data


@dataclass
class Part:
    """One part of a recording: its cases' counters, with the recording's device, date and versions."""

    name: str
    meta: dict
    cases: dict[str, dict]
    #: counted here, now (not read from a recording)
    live: bool = False
    #: (date, time) of every recording a case or setting was taken from, newest first (:func:`newest`)
    sources: tuple[tuple[str, str], ...] = ()
    #: the device the reader asked for, where the recording is of another (:func:`for_device`)
    wanted: str | None = None

    @property
    def dates(self) -> tuple[str, ...]:
        """The dates of :attr:`sources`, each once, newest first."""
        return tuple(dict.fromkeys(date for date, _ in self.sources))

    @property
    def device(self) -> str:
        return self.meta["device"]

    @property
    def label(self) -> str:
        m = self.meta
        if self.live:
            return f"measured here with Nsight Compute on {m['device']}, torch {m['torch']}, triton {m['triton']}"
        dates = " and ".join(self.dates) if len(self.dates) > 1 else m["date"]
        other = f" (none recorded on {self.wanted} yet)" if self.wanted else ""
        return (
            f"RECORDED with Nsight Compute ({m.get('ncu') or 'ncu'}) on {m['device']}{other}, {dates}, "
            f"torch {m['torch']}, triton {m['triton']} — not measured on this machine"
        )

    def case(self, name: str) -> dict:
        if name not in self.cases:
            raise KeyError(f"no case {name!r} in the recorded {self.name!r}; it has {list(self.cases)}")
        return self.cases[name]

    def counted(self, name: str, mode: str = FLUSHED) -> dict | None:
        """A case's counters under ``mode`` (:data:`FLUSHED` or :data:`WARM`), or None where the case
        could not run or was not recorded that way."""
        return self.case(name).get(mode)

    def names(self, group: str | None = None) -> list[str]:
        """The cases that ran (of ``group`` if given), in the order they ran; flushes left out."""
        return [
            n
            for n, c in self.cases.items()
            if c.get("group") != FLUSH and "error" not in c and (group is None or c.get("group") == group)
        ]

    def dram(self, name: str, mode: str = FLUSHED) -> float:
        """Bytes read from and written to DRAM (HBM) by the case's kernels."""
        c = self._need(name, mode)
        return c["dram_read"] + c["dram_write"]

    def over_schedule(self, name: str, mode: str = FLUSHED) -> float:
        """DRAM bytes over the bytes the case's own schedule's ledger counts (1.0: the ledger's trips)."""
        return self.dram(name, mode) / self.case(name)["schedule_bytes"]

    def l2_over_schedule(self, name: str, mode: str = FLUSHED) -> float:
        """Bytes through the L2 over the schedule's ledger: every load and store passes the L2, so where
        this exceeds the DRAM ratio, the difference was served by (or left in) the L2."""
        return self._need(name, mode)["l2_bytes"] / self.case(name)["schedule_bytes"]

    def summary(self, names, mode: str = FLUSHED) -> str:
        """One line a case: HBM bytes and L2 bytes over its schedule's ledger, then the recording's label.
        Where L2's ratio is far above HBM's, the kernel's re-reads were served by the L2."""
        width = max(map(len, names), default=0)
        lines = [
            f"{n:<{width}}  HBM {self.over_schedule(n, mode):5.2f}× its ledger, "
            f"through L2 {self.l2_over_schedule(n, mode):5.2f}×"
            for n in names
            if n in self.cases and self.counted(n, mode) is not None
        ]
        return "\n".join([*lines, self.label])

    def _need(self, name: str, mode: str) -> dict:
        c = self.counted(name, mode)
        if c is None:
            why = self.case(name).get("error", f"not recorded with cache control {mode!r}")
            raise KeyError(f"{name!r} in {self.name!r} has no counters: {why}")
        return c


def runs(directory: Path | None = None) -> list[dict]:
    """Every recording in ``directory`` (default :data:`TRIPS_DIR`), oldest first."""
    directory = TRIPS_DIR if directory is None else directory
    found = [read(p) for p in sorted(Path(directory).glob("*.json"))] if Path(directory).is_dir() else []
    return sorted(found, key=lambda d: (d["meta"]["date"], d["meta"].get("time", "")))


def _on(device: str | None, meta: dict) -> bool:
    return device is None or device.lower() in meta["device"].lower()


def newest(part: str, device: str | None = None, directory: Path | None = None) -> Part | None:
    """The newest recording of ``part`` on a device whose name contains ``device`` (that of the newest
    recording holding it if None), or None while there is none. A recording that lacks a case or a cache
    setting of it (one recorded the flushed runs, a later one the unflushed) is filled in from the older
    recordings of the same device, each case and setting from the newest that holds it."""
    found = [d for d in reversed(runs(directory)) if part in d["parts"] and _on(device, d["meta"])]
    if not found:
        return None
    base = found[0]
    same = [d for d in found if d["meta"]["device"] == base["meta"]["device"]]
    cases = {name: dict(c) for name, c in base["parts"][part].items()}
    sources = [(base["meta"]["date"], base["meta"].get("time", ""))]
    for older in same[1:]:
        used = False
        for name, c in older["parts"][part].items():
            mine = cases.setdefault(name, {k: v for k, v in c.items() if k not in CACHE_CONTROLS})
            for cc in CACHE_CONTROLS:
                if cc in c and cc not in mine:
                    mine[cc] = c[cc]
                    mine.pop("error", None)
                    used = True
        if used:
            sources.append((older["meta"]["date"], older["meta"].get("time", "")))
    return Part(part, base["meta"], cases, sources=tuple(sources))


def this_device() -> str | None:
    """The GPU whose recordings a lesson shows by default: this machine's CUDA GPU, or on a machine
    without one the device of the recorded timings the lessons show (:func:`fusionlab.bench.recorded`),
    so that counters and timings are of one device; None where there are neither."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    try:
        return recorded_timings().meta["device"]
    except FileNotFoundError:
        return None


def for_device(part: str, device: str | None = None, directory: Path | None = None) -> Part | None:
    """The recording of ``part`` a lesson shows: that of ``device`` (default: :func:`this_device`) where
    there is one, else the newest of any device, its label naming the device it is of and the one that
    has none yet; None while no device has one."""
    device = device or this_device()
    found = newest(part, device, directory) if device else None
    if found is not None:
        return found
    other = newest(part, None, directory)
    if other is not None and device:
        other.wanted = device
    return other


def missing_message(part: str, device: str | None) -> str:
    on = f" on {device}" if device else ""
    return (
        f"The counters of {part!r}{on} are not recorded yet (no file in fusionlab/recorded/trips/ holds "
        f"them). On a GPU with Nsight Compute, `python {SCRIPT} {part}` records them."
    )
