"""Lesson 4's bytes as the GPU moved them: HBM (DRAM) traffic against L2 traffic, per case, from Nsight Compute.

The lesson's clock says how long a kernel took; it cannot say whether a re-read went to HBM or was served by
L2. ``ncu`` can: ``dram__bytes_read.sum`` and ``dram__bytes_write.sum`` are the bytes that crossed the HBM
interface, ``lts__t_bytes.sum`` all the bytes the L2 served (hits and misses). This script profiles each case
once (after a warm-up that compiles it) and writes the sums, beside the case's ledger bytes, to
``recorded/profiles/ncu-lesson4-DEVICE-DATE.json`` in the package (schema 1, with device, date and versions),
which lesson 4 reads.

The cases: ``torch.softmax`` and the package's softmax at the narrow width (does eager make more trips
than the ledger, or the same trips slowly?); the softmax forced onto one program a row (the online path,
read twice) at widths on both sides of the re-read cliff, where the rows in flight stop fitting in L2, and
the package's split schedule at the same widths (read once); RMSNorm at one tile and forced onto two passes.

Run on a GPU, from the repository root (ncu needs the permission to read the GPU's counters):

    python benchmarks/ncu_lesson4.py                     # every case; writes the JSON
    python benchmarks/ncu_lesson4.py --cases "softmax online n=262144"   # some; prints, writes nothing

``ncu`` flushes the caches before each kernel it profiles (its default ``--cache-control all``), so a
multi-kernel case (eager) gets no L2 reuse between its kernels; within a kernel, what L2 serves is real.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NCU = os.environ.get("NCU", "/usr/local/cuda/bin/ncu")
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum")
SCHEMA = 1


def _cases():
    """name -> (make, ledger bytes): ``make()`` builds the inputs and returns the thunk to profile."""
    import torch

    from fusionlab.kernels.rmsnorm import rmsnorm
    from fusionlab.kernels.softmax import softmax
    from fusionlab.lessons.l4.suite import (
        DTYPE,
        EPS,
        RMS_SHAPES,
        SOFTMAX_NARROW,
        TWO_PASS,
        TWO_PASS_BLOCK,
        rms_fwd,
        rms_fwd_ledger,
        rms_inputs,
        sm_fwd,
        sm_ledger,
        sweep_name,
        sweep_rows,
    )

    def rand(rows, n):
        return (torch.randn(rows, n, device="cuda") * 3).to(DTYPE)

    out = {}
    rows, n = SOFTMAX_NARROW
    out[sm_fwd("eager", rows, n)] = (
        lambda: (lambda x: lambda: torch.softmax(x, -1))(rand(rows, n)),
        sm_ledger(rows, n).fused_bytes,
    )
    out[sm_fwd("fused", rows, n)] = (
        lambda: (lambda x: lambda: softmax(x))(rand(rows, n)),
        sm_ledger(rows, n).fused_bytes,
    )
    for w in (65536, 131072, 262144):
        r = sweep_rows(w)
        out[sweep_name(w, online=True)] = (
            lambda r=r, w=w: (lambda x: lambda: softmax(x, split=False))(rand(r, w)),
            sm_ledger(r, w, split=False).fused_bytes,
        )
        out[sweep_name(w)] = (lambda r=r, w=w: (lambda x: lambda: softmax(x))(rand(r, w)), sm_ledger(r, w).fused_bytes)
    rows, n = RMS_SHAPES[1]

    def rms(cfg):
        x, r, _, _, w = rms_inputs(rows, n)
        return lambda: rmsnorm(x, w, EPS, r, fwd_config=cfg)

    out[rms_fwd("fused", rows, n)] = (lambda: rms(None), rms_fwd_ledger(rows, n).fused_bytes)
    out[rms_fwd(TWO_PASS, rows, n)] = (
        lambda: rms({"BLOCK_N": TWO_PASS_BLOCK}),
        rms_fwd_ledger(rows, n, block=TWO_PASS_BLOCK).fused_bytes,
    )
    return out


def child(name: str) -> None:
    """Run one case: warm up (compiles), then once between cudaProfilerStart/Stop, which ncu profiles."""
    import torch

    import fusionlab  # noqa: F401  (the GPU path, before Triton)

    make, _ = _cases()[name]
    fn = make()
    with torch.no_grad():
        fn()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


def profile(name: str) -> dict:
    """ncu's byte counts for one case, summed over the kernels it launched."""
    cmd = [
        NCU,
        "--profile-from-start",
        "off",
        "--metrics",
        ",".join(METRICS),
        "--csv",
        "--print-units",
        "base",
        sys.executable,
        __file__,
        "--child",
        name,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    rows = [line for line in proc.stdout.splitlines() if line.startswith('"')]
    if proc.returncode != 0 or not rows:
        raise RuntimeError(
            f"ncu failed on {name!r} (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    sums, kernels = dict.fromkeys(METRICS, 0.0), []
    for rec in csv.DictReader(io.StringIO("\n".join(rows))):
        metric = rec["Metric Name"]
        if metric in sums:
            sums[metric] += float(rec["Metric Value"].replace(",", ""))
        if rec["Kernel Name"] not in kernels:
            kernels.append(rec["Kernel Name"])
    return {
        "dram_read": sums[METRICS[0]],
        "dram_write": sums[METRICS[1]],
        "lts_bytes": sums[METRICS[2]],
        "kernels": kernels,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--cases", nargs="*", help="case names (default: all; then the JSON is written)")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.child:
        child(args.child)
        return 0

    import subprocess as sp

    from fusionlab import bench

    cases = _cases()
    names = args.cases or list(cases)
    results = []
    for name in names:
        got = profile(name)
        ledger = cases[name][1]
        results.append({"name": name, "ledger_bytes": ledger, **got})
        print(
            f"{name:<32} ledger {ledger / 2**20:9.1f} MiB  DRAM read {got['dram_read'] / 2**20:9.1f} MiB  "
            f"write {got['dram_write'] / 2**20:9.1f} MiB  L2 {got['lts_bytes'] / 2**20:9.1f} MiB  "
            f"({len(got['kernels'])} kernels)"
        )
    if args.cases:
        return 0
    meta = bench.metadata()
    meta["command"] = "python benchmarks/ncu_lesson4.py"
    meta["ncu"] = sp.run([NCU, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    slug = meta["device"].lower().replace(" ", "-")
    out = ROOT / "fusionlab" / "recorded" / "profiles" / f"ncu-lesson4-{slug}-{meta['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"schema": SCHEMA, "meta": meta, "metrics": list(METRICS), "cases": results}, indent=1) + "\n"
    )
    print(f"wrote {out.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
