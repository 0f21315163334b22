"""Probe: which of lesson 9's case families ends in an illegal memory access under Nsight Compute
(benchmarks/notes_lesson9.md, "2026-11-27: lesson 9's trips under Nsight Compute"). GPU with ``ncu`` only.

`python benchmarks/record_trips.py --parts lesson9` failed on the H100 (10:11 UTC) and the H200 (10:18 UTC,
``CUDA_LAUNCH_BLOCKING=1``) of 2026-11-27: "an illegal memory access was encountered", raised at the
``torch.cuda.empty_cache()`` after the suite's stage, with no case counted. Outside ncu the same suite runs
(the whole bench, the GPU tests and lesson 9's strict nbval passed on both GPUs that day). Only lesson 9's
suite captures CUDA graphs (the decode step's ``fused graph``, ``compile reduce-overhead``, and every
flash-decoding case), so graphs are the first suspect, not yet the cause.

This probe builds each family of the suite alone, each in its own ncu process (a lost context costs only
its family), with ``CUDA_LAUNCH_BLOCKING=1`` so that a failing launch raises where it is made:

- ``parts``: the prefill layer's parts, eager and fused (no graph);
- ``layer eager`` / ``layer fused`` / ``layer compile``: the prefill layer whole (no graph);
- ``decode eager`` / ``decode fused`` (no graph), ``decode fused graph``, ``decode compile reduce-overhead``;
- ``split graph``: flash-decoding as the suite runs it (graphed), ``split plain``: the same calls ungraphed.

Each row: the family, ``ok`` with its kernels and cases counted, or the failure's last lines.

    PYTHONPATH=. python3 benchmarks/probes/probe_ncu_lesson9.py [--families parts "decode fused graph" ...]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

FAMILIES = ("parts", "layer eager", "layer fused", "layer compile", "decode eager", "decode fused",
            "decode fused graph", "decode compile reduce-overhead", "split plain", "split graph")  # fmt: skip


def family(name: str):
    """The ncu target: the lesson 9 cases of one family, as :func:`fusionlab.measure.ncu.cases_thunk`."""
    from fusionlab.lessons.l9 import suite as S
    from fusionlab.measure import ncu

    if name.startswith("split"):
        made = S.split_cases(graphs=name == "split graph")
        return ncu.cases_thunk(({"name": f"{name} {c.name}"}, c.fn) for c in made)
    ref, lay = S.make_layers(max(S.PREFILL[1], S.N_CACHE))
    if name == "parts":
        made = S.part_cases(ref, lay)
    elif name.startswith("layer "):
        made = S.layer_cases(ref, lay, impls=(name.removeprefix("layer "),))
    else:
        made = S.decode_cases(ref, lay, impls=(name.removeprefix("decode "),))
    made = [c for c in made if c.group != S.PEAK_GROUP]
    return ncu.cases_thunk(({"name": c.name}, c.fn) for c in made)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument("--timeout", type=float, default=240, help="seconds for each family's ncu run")
    a = ap.parse_args()
    os.environ["CUDA_LAUNCH_BLOCKING"] = "1"  # the ncu child inherits it: a failing launch raises where made
    from fusionlab.measure import ncu

    for name in a.families:
        t0 = time.time()
        try:
            target = f"benchmarks.probes.{Path(__file__).stem}:family"
            out = ncu.measure_cases(target, name, cache_controls=("all",), timeout=a.timeout)
        except Exception as e:  # noqa: BLE001 - the failure is the answer
            tail = "\n    ".join(str(e).strip().splitlines()[-14:])
            print(f"{name}: FAILED after {time.time() - t0:.0f} s\n    {tail}", flush=True)
            continue
        counted = sum("all" in c for c in out.values())
        errors = {k: c["error"] for k, c in out.items() if "error" in c}
        print(f"{name}: ok, {counted} of {len(out)} cases counted, {time.time() - t0:.0f} s", flush=True)
        for k, e in errors.items():
            print(f"    {k}: {e[:300]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
