"""Record every lesson's GPU benchmarks into ``fusionlab/recorded/`` (run on a GPU, never by hand).

    python -m fusionlab.record                 # all suites, file named after device and date
    python -m fusionlab.record --suites lesson1 --out /tmp/run.json

A tool on top of the lessons (it imports them), not a library module.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch

from . import bench, runtime
from .lessons import SUITES, suite_module


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suites", default=",".join(SUITES))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=bench.ROUNDS)
    args = ap.parse_args(argv)
    if not runtime.is_gpu():
        print(f"fusionlab.record needs a GPU Triton supports ({runtime.REASON}).", file=sys.stderr)
        return 2
    meta = bench.metadata()
    ceil = bench.ceilings()
    print(runtime.info(), f"\ncopy {ceil.copy_GBps:.0f} GB/s, matmul {ceil.matmul_TFLOPs:.0f} TFLOP/s", flush=True)
    rec = bench.Recorded(meta, ceil)
    missed = 0
    for name in args.suites.split(","):
        make_cases = suite_module(name).cases
        cases = make_cases(**bench.ceiling_kwargs(make_cases, ceil))
        show = lambda r: print(" ", bench.describe(r, ceil), flush=True)  # noqa: B023
        # several rounds, fastest median kept: the recording outlives the run, so it must not catch a slow spell
        rec.suites[name] = bench.run(cases, ceil=ceil, on_result=show, rounds=args.rounds)
        del cases
        torch.cuda.empty_cache()
        print(f"\n[{name}]\n" + bench.table(rec.suites[name]), flush=True)
        gate = getattr(suite_module(name), "bars", None)
        for bar, met, detail in gate(rec.suites[name]) if gate else ():
            print(f"  {'met   ' if met else 'MISSED'} {bar}: {detail}", flush=True)
            missed += not met
    slug = re.sub(r"[^a-z0-9]+", "-", meta["device"].lower()).strip("-")
    names = args.suites.split(",")
    # a run of some suites only gets its own file: it must not replace a run of the others
    part = "" if set(names) >= set(SUITES) else "-" + "-".join(names)
    out = args.out or bench.RECORDED_DIR / f"{slug}-{meta['date']}{part}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rec.to_json(), indent=1) + "\n")
    print(f"wrote {out}" + (f"; {missed} bar(s) missed (see above)" if missed else "; every bar met"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
