"""Every file in ``fusionlab/recorded/`` is read by something: the package keeps what the notebooks read
(the newest complete run of each device, and a file a notebook names), not every run ever recorded.

What reads a recording: ``bench.recorded()`` (the newest run of the whole course), the same per device
(``recorded(device=...)``) and per suite (``recorded(suite=...)``, with or without a device), and a
tracked notebook or module that names a file. A run superseded on every one of these counts is dead
weight in every install; git history keeps it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from fusionlab import bench

ROOT = Path(__file__).resolve().parents[1]


def _runs_read() -> set[tuple[str, str]]:
    """(device, date) of every run that one of bench's pickers returns."""
    runs = bench.recorded_runs()
    devices = {r.meta["device"] for r in runs}
    suites = {s for r in runs for s in r.suites}
    picked = [bench.recorded()]
    for d in devices:
        picked.append(bench.recorded(device=d))
        picked += [
            bench.recorded(device=d, suite=s)
            for s in suites
            if any(s in r.suites and r.meta["device"] == d for r in runs)
        ]
    picked += [bench.recorded(suite=s) for s in suites]
    return {(r.meta["device"], r.meta["date"]) for r in picked}


def _named_in_tracked_files(name: str) -> list[str]:
    out = subprocess.run(
        ["git", "grep", "-l", "-F", name, "--", "*.ipynb", "*.py"], cwd=ROOT, capture_output=True, text=True
    )
    return [p for p in out.stdout.split() if p != "tests/test_recorded_files.py"]


def unread_files() -> list[str]:
    read = _runs_read()
    unread = []
    for path in bench.recorded_files():
        rec = bench.recorded(path)
        if (rec.meta["device"], rec.meta["date"]) not in read and not _named_in_tracked_files(path.name):
            unread.append(path.name)
    return unread


def test_every_recorded_file_is_read():
    unread = unread_files()
    assert not unread, f"superseded recordings nothing reads (git history keeps them): {unread}"


def test_a_superseded_run_is_found(tmp_path, monkeypatch):
    # an older one-suite run beside a newer complete one: no picker returns it, nothing names it
    newest = bench.recorded()
    old_meta = {**newest.meta, "date": "2000-01-01"}
    old = bench.Recorded(old_meta, newest.ceilings, {"lesson1": newest.results("lesson1")}, None)
    (tmp_path / "zz-superseded-2000-01-01.json").write_text(json.dumps(old.to_json()))
    (tmp_path / "zz-newest.json").write_text(json.dumps(newest.to_json()))
    monkeypatch.setattr(bench, "RECORDED_DIR", tmp_path)
    assert unread_files() == ["zz-superseded-2000-01-01.json"]


def test_every_trips_recording_is_read():
    # each recording of the trips suite gives a reader some case or cache setting of a part: the readers take
    # each part from the newest file that holds it, and what that file lacks from the older ones of its
    # device (fusionlab.measure.recorded.newest)
    from fusionlab.measure import recorded

    runs = recorded.runs()
    read = set()
    for d in runs:
        for part in d["parts"]:
            newest = recorded.newest(part, d["meta"]["device"])
            read.update((newest.meta["device"], date, time) for date, time in newest.sources)
    unread = [d["meta"] for d in runs if (d["meta"]["device"], d["meta"]["date"], d["meta"]["time"]) not in read]
    assert not unread, f"superseded trips recordings (git history keeps them): {unread}"
