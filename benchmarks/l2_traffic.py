"""Lesson 1's evidence: how many bytes each kernel moved to and from HBM, and how many through L2.

    PYTHONPATH=. python3 benchmarks/l2_traffic.py [--ncu /usr/local/cuda/bin/ncu] [--out FILE]

Lesson 1 says that eager ``x.cos().cos()`` pays less than its two passes while its intermediate fits
in the L2 cache, and that a kernel timed at (or a hair above) the copy bandwidth moved the ledger's
bytes to and from HBM. A timing cannot show either; Nsight Compute's counters can. Per kernel:

- ``dram__bytes_read.sum`` and ``dram__bytes_write.sum``: bytes between HBM and the chip;
- ``lts__t_bytes.sum``: bytes through the L2 (every load and store of the kernel passes there);
- ``gpu__time_duration.sum``: the kernel's time under the profiler.

Cases (fp32, from 4 MiB to 1 GiB, sizes inside the L2 among them): eager ``x.cos().cos()`` (two
kernels: the second reads the first's output), the package's fused ``cos_cos`` (one), and the copy that
is the course's ceiling (``y.copy_(x)``). Each size and case runs once in a child process between
``cudaProfilerStart`` and ``cudaProfilerStop`` (its warm-up and set-up outside), under ``ncu`` twice:

- ``warm`` (``--cache-control none``): the L2 as the program leaves it, so eager's second kernel finds
  what the first just wrote, as it does in a real run;
- ``flushed`` (``--cache-control all``): every kernel starts with an empty L2, as ``do_bench`` times it.

The child prints the order of its windows; the parent reads ncu's CSV (one row a metric a kernel, values
with thousands separators), assigns the kernels to the windows in order, and writes one JSON file for the
lesson: ``fusionlab/recorded/l2_traffic/<device>-<date>.json``, with device, date and versions.
GPU only; a few minutes on an H100 (each pass of the profiler reruns the child).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum", "gpu__time_duration.sum")
#: fp32 elements: 4 MiB to 1 GiB; 16 and 32 MiB sit inside an H100's or H200's L2 (50 or 60 MiB) with room
#: for eager's intermediate, 64 MiB and up do not
LOG2_SIZES = (20, 22, 23, 24, 26, 28)
#: case -> kernels it launches
CASES = {"eager cos().cos()": 2, "fused cos_cos": 1, "copy": 1}
MODES = {"warm": "none", "flushed": "all"}
OUT_DIR = Path(__file__).resolve().parents[1] / "fusionlab" / "recorded" / "l2_traffic"


def child() -> None:
    """Run every case at every size once, each in its own profiler window; print the windows' order."""
    import torch

    import fusionlab  # noqa: F401  (decides the mode before any kernel is defined)
    from fusionlab.kernels.cos import cos_cos, cos_cos_eager

    windows = []
    for log2 in LOG2_SIZES:
        x = torch.randn(2**log2, device="cuda")
        y = torch.empty_like(x)
        fns = {
            "eager cos().cos()": lambda x=x: cos_cos_eager(x),
            "fused cos_cos": lambda x=x: cos_cos(x),
            "copy": lambda x=x, y=y: y.copy_(x),
        }
        for name, fn in fns.items():
            fn()  # compile and warm up outside the window
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStart()
            fn()
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
            windows.append({"case": name, "elements": 2**log2, "bytes": 4 * 2**log2, "kernels": CASES[name]})
        del x, y
    print("WINDOWS " + json.dumps(windows), flush=True)


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def parse_ncu_csv(text: str) -> list[dict]:
    """Kernels in launch order: ``{"kernel", metric name: value}`` from ncu's ``--csv`` output."""
    start = text.find('"ID"')
    if start < 0:
        raise ValueError("no CSV header in ncu's output:\n" + text[-2000:])
    kernels: dict[int, dict] = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        if not row.get("ID", "").strip().isdigit():
            continue
        k = kernels.setdefault(int(row["ID"]), {"kernel": row["Kernel Name"]})
        k[row["Metric Name"]] = _number(row["Metric Value"])
    return [kernels[i] for i in sorted(kernels)]


def profile(ncu: str, mode: str) -> list[dict]:
    # application replay: when the counters need several passes, each pass reruns the whole child, so
    # every pass sees the L2 as the program left it (kernel replay restores memory between passes)
    cmd = [
        ncu, "--profile-from-start", "off", "--cache-control", MODES[mode], "--replay-mode", "application",
        "--metrics", ",".join(METRICS), "--csv", "--print-units", "base", sys.executable, __file__, "--child",
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    if out.returncode != 0:
        raise SystemExit(f"ncu failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    line = next((x for x in out.stdout.splitlines() if x.startswith("WINDOWS ")), None)
    if line is None:
        raise SystemExit("the child printed no windows:\n" + out.stdout[-3000:])
    windows = json.loads(line[len("WINDOWS ") :])
    kernels = parse_ncu_csv(out.stdout)
    want = sum(w["kernels"] for w in windows)
    if len(kernels) != want:
        names = [k["kernel"][:40] for k in kernels]
        raise SystemExit(f"{mode}: ncu profiled {len(kernels)} kernels, the windows hold {want}: {names}")
    rows, i = [], 0
    for w in windows:
        ks = kernels[i : i + w["kernels"]]
        i += w["kernels"]
        rows.append(
            {
                **w,
                "mode": mode,
                "per_kernel": [
                    {
                        "kernel": k["kernel"],
                        "dram_read": k["dram__bytes_read.sum"],
                        "dram_write": k["dram__bytes_write.sum"],
                        "l2_bytes": k["lts__t_bytes.sum"],
                        "ns": k["gpu__time_duration.sum"],
                    }
                    for k in ks
                ],
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--ncu", default="/usr/local/cuda/bin/ncu")
    ap.add_argument("--out", default=None, help="default: fusionlab/recorded/l2_traffic/<device>-<date>.json")
    args = ap.parse_args()
    if args.child:
        return child()
    import torch

    from fusionlab import bench, runtime

    if not runtime.is_gpu():
        raise SystemExit("needs a GPU Triton supports (and Nsight Compute)")
    version = subprocess.run([args.ncu, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    meta = bench.metadata() | {
        "ncu": version[-1] if version else "?",
        "command": "python3 benchmarks/l2_traffic.py",
        "L2_bytes": torch.cuda.get_device_properties(0).L2_cache_size,
    }
    rows = [r for mode in MODES for r in profile(args.ncu, mode)]
    slug = re.sub(r"[^a-z0-9]+", "-", meta["device"].lower()).strip("-")
    out = Path(args.out) if args.out else OUT_DIR / f"{slug}-{meta['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    print(
        f"{'mode':<8} {'case':<18} {'tensor':>9} {'kernel':>6} {'HBM read':>10} {'HBM write':>10} {'L2':>10} {'us':>8}"
    )
    for r in rows:
        for j, k in enumerate(r["per_kernel"]):
            mib = [v / 2**20 for v in (r["bytes"], k["dram_read"], k["dram_write"], k["l2_bytes"])]
            print(
                f"{r['mode']:<8} {r['case']:<18} {mib[0]:7.0f}Mi {j + 1:>6} {mib[1]:8.1f}Mi "
                f"{mib[2]:8.1f}Mi {mib[3]:8.1f}Mi {k['ns'] / 1e3:8.1f}"
            )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
