"""Set a new recording against a kept one, case by case: did a change move any kernel's time?

    python3 benchmarks/compare_recorded.py NEW.json [NEW2.json ...] [--date 2026-11-25] [--tolerance 0.03]

Each NEW file (``python -m fusionlab.record --out NEW.json``) is compared with the recordings in
``fusionlab/recorded/`` of the same device and ``--date`` that hold its suites. Prints each case's time
then and now and the ratio; lists the package's own kernels slower by more than ``--tolerance``, and
exits 1 if there are any. PyTorch's baselines (eager, compiled, SDPA, naive) are shown, not judged:
their spread says how noisy the machine was. Peak-memory cases are left out of the verdict.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

RECORDED = Path(__file__).resolve().parents[1] / "fusionlab" / "recorded"


def _slug(device: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")


def _times(data: dict) -> dict[tuple[str, str], float]:
    return {(suite, r["name"]): r["ms"] for suite, rows in data["suites"].items() for r in rows}


#: words that name a case PyTorch runs (eager, torch.compile, SDPA, the lesson's naive version)
THEIRS = ("eager", "compiled", "sdpa", "naive")


def _ours(name: str) -> bool:
    """A case that times the package's kernel (judged), not a baseline or a peak-memory reading."""
    return not any(w in name for w in THEIRS) and not name.startswith("peak")


def compare(new_path: Path, date: str, tolerance: float) -> list[str]:
    """Print the comparison of one new recording; return the package's cases that got slower."""
    new = json.loads(new_path.read_text())
    device = new["meta"]["device"]
    old: dict[tuple[str, str], float] = {}
    for suite in new["suites"]:
        path = RECORDED / f"{_slug(device)}-{date}-{suite}.json"
        if not path.exists():
            print(f"{new_path.name}: no {path.name} to compare {suite} with")
            continue
        old.update(_times(json.loads(path.read_text())))
    now = _times(new)
    print(f"\n{new_path.name}: {device}, {new['meta']['date']} against {date} (ms, then -> now)")
    slower = []
    for key in sorted(now):
        if key not in old:
            print(f"  {key[0]:8} {key[1]:45} {'(new)':>9} -> {now[key]:9.4f}")
            continue
        ratio = now[key] / old[key]
        judged = _ours(key[1])
        flag = " SLOWER" if judged and ratio > 1 + tolerance else ""
        print(f"  {key[0]:8} {key[1]:45} {old[key]:9.4f} -> {now[key]:9.4f}  x{ratio:5.3f}{flag}")
        if flag:
            slower.append(f"{device} {key[0]} {key[1]}: x{ratio:.3f}")
    for key in sorted(set(old) - set(now)):
        print(f"  {key[0]:8} {key[1]:45} {old[key]:9.4f} -> (not run)")
    return slower


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("new", nargs="+", type=Path)
    ap.add_argument("--date", default="2026-11-25", help="the kept recordings' date")
    ap.add_argument("--tolerance", type=float, default=0.03, help="slower than this fraction fails")
    args = ap.parse_args(argv)
    slower = [s for path in args.new for s in compare(path, args.date, args.tolerance)]
    print(f"\n{len(slower)} case(s) of the package slower by more than {args.tolerance:.0%}")
    for s in slower:
        print("  " + s)
    return 1 if slower else 0


if __name__ == "__main__":
    sys.exit(main())
