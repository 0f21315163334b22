"""Record the trips suite: the ledger's bytes beside the bytes the GPU moved, from Nsight Compute's counters.

    python benchmarks/record_trips.py --out $OUT/trips                     # everything, within 450 s
    python benchmarks/record_trips.py --parts lesson4b regimes:none        # some parts (settings)

For each case it writes the bytes the ledger predicts (``ledger_bytes``: the fused schedule's;
``schedule_bytes``: the case's own) beside, per kernel, the DRAM bytes read and written, the bytes
through the L2 and the time, with caches flushed before each kernel (``"all"``) and, for lesson 1's
regimes and the lessons' suites, without (``"none"``: the program replayed whole for each pass of the
profiler, so each kernel meets the L2 as the kernel before it left it: re-reads served by the L2 show
as DRAM bytes the flushed run has and this one lacks). The parts, in the order they run:

- ``large``: element-wise and row-wise kernels of lessons 1, 2, 4 and 5 on tensors of 1 GiB and more
  (the bar: DRAM bytes within 2% of the ledger);
- ``eager_softmax``: what ``torch.softmax`` reads at lesson 4's two shapes, beside the fused kernel;
- ``cliff``: lesson 4's re-read cliff, the online softmax (two reads a row) against the split one (one)
  and RMSNorm's two-pass path, at row widths past what the L2 holds;
- ``regimes``: lesson 1's sizes from 4 MiB (inside the L2) to 1 GiB, each case run twice in a row;
- then each lesson's suite (``fusionlab/lessons/l*/suite.py``) in course order, lesson 4b's dropout +
  norm and AdamW among them: every schedule the lessons time (``benchcli.TRIPS_LEAVE_OUT`` says which
  are not counted, and why), flushed, then all of them again unflushed.

A part is named alone (the settings above) or with one setting, ``lesson4b:none``. Parts of one kind
and setting run in one process under one ncu (``benchcli.trips_batches``); each run's parts and seconds
are kept in the file's ``meta["runs"]``. One JSON file a run (``<device>-<date>-<time>.json``, schema
``benchcli.TRIPS_SCHEMA``, with device, date, torch/triton/CUDA/ncu versions and the L2's size),
rewritten after every ncu run, so that a part that fails or a budget that runs out costs only what was
left (listed under ``"missing"``, and recorded by naming those parts in a later run: a reader merges the
recordings of one device, each case and setting from the newest that holds it). The lessons and
``python -m fusionlab bench --trips`` read them from ``fusionlab/recorded/trips/``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

# this checkout's fusionlab, whatever is installed (ncu's child process gets the same: its PYTHONPATH)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fusionlab import benchcli, runtime  # noqa: E402
from fusionlab.measure import ncu  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("parts", nargs="*", default=[], help="parts, or part:setting (default: every part)")
    ap.add_argument("--parts", dest="more", nargs="+", default=[], metavar="PART", help="the same, after an option")
    ap.add_argument("--out", type=Path, default=benchcli.TRIPS_DIR)
    ap.add_argument("--budget", type=float, default=450, help="seconds for everything (default 450)")
    ap.add_argument("--flushed-only", action="store_true", help="skip the runs without a flush")
    a = ap.parse_args(argv)
    if not runtime.is_gpu():
        print(f"record_trips needs a GPU Triton supports ({runtime.REASON}).", file=sys.stderr)
        return 2
    try:
        ncu.find_ncu()
    except ncu.NcuUnavailable as e:
        print(e, file=sys.stderr)
        return 2
    parts = [*a.parts, *a.more]
    benchcli.trips_runs(parts)  # an unknown part or setting fails here, before any run
    t0 = time.perf_counter()
    controls = ("all",) if a.flushed_only else ncu.CACHE_CONTROLS
    cmd = "python benchmarks/record_trips.py " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        path = benchcli.record_trips(parts, a.out, budget_s=a.budget, cache_controls=controls, command=cmd.strip())
    except ncu.NcuUnavailable as e:
        print(e, file=sys.stderr)
        return 2
    data = benchcli.read_trips(path)
    for part, cases in data["parts"].items():
        print(f"\n[{part}]\n{benchcli.trips_table(cases)}")
    if "large" in data["parts"]:
        print(f"\nthe bar: DRAM bytes within {benchcli.LEDGER_BAR:.0%} of the ledger at >= 1 GiB (caches flushed)")
        for name, met, ratio in benchcli.trips_bars(data["parts"]["large"]):
            print(f"  {'MET ' if met else 'MISS'} {name:<44} {ratio}")
    for what, why in data["missing"].items():
        print(f"MISSING {what}: {why[-300:]}")
    print(f"\nwrote {path} in {time.perf_counter() - t0:.0f} s")
    return 1 if data["missing"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
