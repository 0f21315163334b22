"""Record the trips suite: every lesson's cases under Nsight Compute's counters, on a GPU with ncu.

    python benchmarks/record_trips.py                          # every lesson, into fusionlab/recorded/trips/
    python benchmarks/record_trips.py lesson1 lesson4 --out $OUT

For each case of each lesson's suite (its ``suite.py`` in ``fusionlab/lessons/``; peak-memory cases left
out) it writes the ledger's bytes (the fused schedule's, ``ledger_bytes``; the case's own schedule's,
``schedule_bytes``) beside the DRAM bytes read and written, the L2 bytes and the time of each kernel the
case launches, with caches flushed before each kernel and (under ``"none"``) without: one JSON file per
suite, named after the device, the date and the suite, which ``python -m fusionlab bench`` shows
beside the recorded timings on a machine without a GPU. One ncu process per suite and cache setting;
a suite that fails costs only itself.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from fusionlab import benchcli, runtime
from fusionlab.lessons import SUITES
from fusionlab.measure import ncu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suites", nargs="*", default=list(SUITES))
    ap.add_argument("--out", type=Path, default=benchcli.TRIPS_DIR)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per ncu run")
    ap.add_argument("--flushed-only", action="store_true", help="skip the unflushed run (it replays the program)")
    a = ap.parse_args(argv)
    if not runtime.is_gpu():
        print(f"record_trips needs a GPU Triton supports ({runtime.REASON}).", file=sys.stderr)
        return 2
    try:
        ncu.find_ncu()
    except ncu.NcuUnavailable as e:
        print(e, file=sys.stderr)
        return 2
    failed = []
    for suite in a.suites:
        t0 = time.perf_counter()
        try:
            controls = ("all",) if a.flushed_only else ncu.CACHE_CONTROLS
            benchcli.record_trips([suite], a.out, timeout=a.timeout, cache_controls=controls)
        except (ncu.NcuFailed, subprocess.TimeoutExpired, OSError) as e:
            print(f"{suite}: FAILED: {e}", file=sys.stderr, flush=True)
            failed.append(suite)
        print(f"{suite} took {time.perf_counter() - t0:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
