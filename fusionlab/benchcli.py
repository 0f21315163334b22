"""``python -m fusionlab bench``: every kernel of the course against its peers, on this GPU or as recorded.

    python -m fusionlab bench                         # every lesson
    python -m fusionlab bench --lesson 4 --op rmsnorm
    python -m fusionlab bench --lesson 1 --ncu            # also DRAM bytes from Nsight Compute's counters

On a GPU Triton supports, each lesson's suite (its ``suite.py`` in ``fusionlab/lessons/``: the cases
the lesson times: eager, ``torch.compile``, cuBLAS/SDPA where the lesson has them, and the course's kernels) is
timed here, once each, with a progress bar; each case is shown as a percentage of the measured copy
bandwidth (memory-bound work) and of the measured matmul rate (cases with FLOPs), beside the bytes its
ledger says the fused schedule must move and, with ``--ncu``, the DRAM bytes the counters saw (caches
flushed before each kernel). It writes a JSON of it all and a roofline PNG with every case that has
FLOPs placed under this GPU's two ceilings (tensor cores, vector units).

Elsewhere (a laptop, the interpreter) nothing is timed: the recorded GPU results of
``fusionlab/recorded/`` are shown, labelled with the device and date they come from, and so are the
recorded counters of ``fusionlab/recorded/trips/`` where a recording holds them.

A tool on top of the lessons (it imports them), like :mod:`fusionlab.record`, not a library module.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from . import bench, runtime
from .ledger import human_bytes
from .lessons import SUITES, suite_module
from .measure import ncu
from .viz import roofline_figure
from .viz._style import png

#: groups whose ``nbytes`` is not traffic (peak memory allocated): no bandwidth, no trips
NOT_TRAFFIC = frozenset({"peak memory"})
#: words of a case's name or group that put it under the tensor cores' roof (else the vector units')
TENSOR_CORE_WORDS = ("matmul", "linear", "cublas", "gemm", "attention", "sdpa", "flash", "cudnn", "layer", "lce")
#: recorded counters, one file per device, day and suite (a folder of its own: recorded/*.json are timings)
TRIPS_DIR = bench.RECORDED_DIR / "trips"


# -- choosing cases ------------------------------------------------------------------------------------
def suites_for(lesson: int | None) -> list[str]:
    if lesson is None:
        return list(SUITES)
    name = f"lesson{lesson}"
    if name not in SUITES:
        raise SystemExit(f"no lesson {lesson}; the lessons with a suite: {', '.join(s[6:] for s in SUITES)}")
    return [name]


def matches(name: str, group: str, op: str | None) -> bool:
    """Whether a case belongs to ``--op``: the words of ``op`` all appear in its name or group."""
    if not op:
        return True
    text = f"{name} {group}".lower()
    return all(w in text for w in op.lower().split())


def on_tensor_cores(name: str, group: str) -> bool:
    text = f"{name} {group}".lower()
    return any(w in text for w in TENSOR_CORE_WORDS)


# -- a progress bar (stderr, one line redrawn) -----------------------------------------------------------
class Progress:
    def __init__(self, total: int, stream=None, width: int = 30):
        self.total, self.done, self.width = max(total, 1), 0, width
        self.stream = stream or sys.stderr

    def step(self, label: str) -> None:
        self.done += 1
        filled = round(self.width * self.done / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        end = "\n" if self.done >= self.total else ""
        self.stream.write(f"\r[{bar}] {self.done}/{self.total} {label[:50]:<50}{end}")
        self.stream.flush()


# -- rows: one per case, whatever the source -------------------------------------------------------------
def row(res: bench.Result, ceil: bench.Ceilings, trips: dict | None = None) -> dict:
    """A case's numbers as the bench shows them: time, % of copy, % of matmul peak, ledger vs counted."""
    traffic = res.group not in NOT_TRAFFIC
    out = {
        "name": res.name,
        "group": res.group,
        "ms": res.ms,
        "GBps": res.GBps if traffic else None,
        "pct_copy": 100 * res.GBps / ceil.copy_GBps if traffic and res.GBps else None,
        "TFLOPs": res.TFLOPs,
        # the matmul peak is the ceiling of tensor-core work only: element-wise FLOPs never reach it
        "pct_matmul": 100 * res.TFLOPs / ceil.matmul_TFLOPs
        if res.TFLOPs and ceil.matmul_TFLOPs and on_tensor_cores(res.name, res.group)
        else None,
        "ledger_bytes": res.nbytes if traffic else None,
        "flops": res.flops,
        "dram_bytes": None,
    }
    t = (trips or {}).get(res.name)
    if t and traffic:
        out["dram_bytes"] = t["dram_read"] + t["dram_write"]
        out["schedule_bytes"] = t.get("schedule_bytes")
    return out


def table(rows: list[dict]) -> str:
    head = f"{'case':<40} {'ms':>9} {'% copy':>7} {'% mm':>6} {'ledger':>11} {'DRAM':>11} {'DRAM/led':>8}"
    lines, group = [head], None
    for r in rows:
        if r["group"] != group:
            group = r["group"]
            lines.append(f"-- {group or '(no group)'}")
        ratio = r["dram_bytes"] / r["ledger_bytes"] if r.get("dram_bytes") and r.get("ledger_bytes") else None
        lines.append(
            " ".join(
                [
                    f"{r['name'][:40]:<40}",
                    f"{r['ms']:9.3f}",
                    f"{r['pct_copy']:6.0f}%" if r["pct_copy"] is not None else f"{'':7}",
                    f"{r['pct_matmul']:5.0f}%" if r["pct_matmul"] is not None else f"{'':6}",
                    f"{human_bytes(r['ledger_bytes']):>11}" if r["ledger_bytes"] else f"{'':11}",
                    f"{human_bytes(r['dram_bytes']):>11}" if r.get("dram_bytes") else f"{'':11}",
                    f"{ratio:7.2f}x" if ratio else "",
                ]
            )
        )
    return "\n".join(lines)


#: a roofline with more points than this keeps the fastest case of each group (its labels stay legible)
MAX_POINTS = 16


def roofline_points(rows: list[dict], roofs: list[tuple[str, float]]) -> list[tuple]:
    """Roofline points ``(name, FLOP/byte, TFLOP/s, roof)`` of the cases with FLOPs, intensity from the
    counted DRAM bytes where there are some, else the ledger's; past :data:`MAX_POINTS`, the fastest case
    of each group."""
    points = []
    for r in rows:
        nbytes = r.get("dram_bytes") or r.get("ledger_bytes")
        if not r["flops"] or not nbytes or not r["TFLOPs"]:
            continue
        roof = roofs[0][0] if on_tensor_cores(r["name"], r["group"]) or len(roofs) == 1 else roofs[1][0]
        points.append((r["group"], (r["name"], r["flops"] / nbytes, r["TFLOPs"], roof)))
    if len(points) > MAX_POINTS:
        best: dict[str, tuple] = {}
        for group, p in points:
            if group not in best or p[2] > best[group][2]:
                best[group] = p
        return list(best.values())
    return [p for _, p in points]


def roofline_png(rows: list[dict], ceil: bench.Ceilings, label: str, path: Path) -> int:
    """The cases' roofline (:func:`roofline_points`) under this GPU's two ceilings, as a PNG; returns how
    many points it drew (none: no PNG)."""
    roofs = [("tensor cores, " + ceil.matmul_dtype + " matmul", ceil.matmul_TFLOPs)]
    if ceil.vector_TFLOPs:
        roofs.append(("vector units, fp32 FMA", ceil.vector_TFLOPs))
    points = roofline_points(rows, roofs)
    if points:
        path.write_bytes(png(roofline_figure(ceil.copy_GBps, roofs, points, label)))
    return len(points)


# -- the counters: one ncu run per suite -----------------------------------------------------------------
def schedule_kwargs(make_cases) -> dict:
    """Ceilings that turn a case's ``predicted_ms`` into the bytes of its own schedule: the suites state
    those bytes only through the predicted time, so at 1 GB/s and with compute taken as free (1e12
    TFLOP/s), ``predicted_ms * 1e6`` is the schedule's bytes."""
    return bench.ceiling_kwargs(make_cases, bench.Ceilings(copy_GBps=1.0, matmul_TFLOPs=1e12, vector_TFLOPs=1e12))


def suite_thunk(suite: str, *names: str):
    """The ncu target for a suite (:func:`fusionlab.measure.ncu.profile`): builds the suite's cases (those
    named, or all but peak-memory ones), writes their names and schedule bytes to the file named by
    ``FUSIONLAB_NCU_CASES``, and returns a thunk that runs each once after the marker kernel."""
    make_cases = suite_module(suite).cases
    cases = [c for c in make_cases(**schedule_kwargs(make_cases)) if c.group not in NOT_TRAFFIC]
    if names:
        cases = [c for c in cases if c.name in names]
    info = [
        {
            "name": c.name,
            "group": c.group,
            "ledger_bytes": c.nbytes,
            "schedule_bytes": c.predicted_ms * 1e6 if c.predicted_ms else None,
        }
        for c in cases
    ]
    Path(os.environ["FUSIONLAB_NCU_CASES"]).write_text(json.dumps(info))

    def thunk():
        for c in cases:
            ncu.marker()
            c.fn()

    return thunk


def measure_trips(suite: str, names=(), cache_controls=("all",), timeout: float = 600) -> dict[str, dict]:
    """Counters of each case of ``suite`` (those named, or all): ``{case: {"dram_read", "dram_write",
    "l2_bytes", "time_ns", "ledger_bytes", "schedule_bytes", "kernels": [...]}}``, with a ``"none"``
    entry of the same counters when ``cache_controls`` has it."""
    out: dict[str, dict] = {}
    for cc in cache_controls:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            side = f.name
        os.environ["FUSIONLAB_NCU_CASES"] = side
        try:
            kernels = ncu.profile("fusionlab.benchcli:suite_thunk", suite, *names, cache_control=cc, timeout=timeout)
            info = json.loads(Path(side).read_text())
        finally:
            os.environ.pop("FUSIONLAB_NCU_CASES", None)
            Path(side).unlink(missing_ok=True)
        by_case = ncu.split_cases(kernels, [c["name"] for c in info])
        for c in info:
            ks = [k for k in by_case if k.case == c["name"]]
            counters = {
                "dram_read": sum(k.dram_read for k in ks),
                "dram_write": sum(k.dram_write for k in ks),
                "l2_bytes": sum(k.l2_bytes for k in ks),
                "time_ns": sum(k.time_ns for k in ks),
                "kernels": [{**asdict(k), "name": ncu.short_name(k.name)} for k in ks],
            }
            entry = out.setdefault(c["name"], {**c})
            if cc == "all":
                entry.update(counters)
            else:
                entry[cc] = counters
    return out


def record_trips(
    suites, out_dir: Path = TRIPS_DIR, timeout: float = 600, cache_controls=ncu.CACHE_CONTROLS
) -> list[Path]:
    """Counters of every case of each suite (caches flushed, and without a flush unless ``cache_controls``
    leaves it out), written to ``out_dir`` one file a suite."""
    meta = {**bench.metadata(), "command": "python benchmarks/record_trips.py"}
    slug = re.sub(r"[^a-z0-9]+", "-", meta["device"].lower()).strip("-")
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for suite in suites:
        trips = measure_trips(suite, cache_controls=cache_controls, timeout=timeout)
        path = out_dir / f"{slug}-{meta['date']}-{suite}.json"
        path.write_text(json.dumps({"meta": meta, "suite": suite, "cases": trips}, indent=1) + "\n")
        print(f"wrote {path} ({len(trips)} cases)", flush=True)
        paths.append(path)
    return paths


def recorded_trips(suite: str, device: str | None = None) -> tuple[dict, dict] | None:
    """The newest recorded counters of ``suite`` (on a device whose name contains ``device``):
    ``(meta, cases)``, or None where none is recorded."""
    found = []
    for p in sorted(TRIPS_DIR.glob("*.json")):
        data = json.loads(p.read_text())
        if data.get("suite") == suite and (device is None or device.lower() in data["meta"]["device"].lower()):
            found.append(data)
    if not found:
        return None
    newest = max(found, key=lambda d: (d["meta"]["date"], d["meta"].get("time", "")))
    return newest["meta"], newest["cases"]


# -- the two paths --------------------------------------------------------------------------------------
def live(suites, op, use_ncu: bool) -> dict[str, dict]:
    """Each suite timed here: ``{suite: {"rows", "ceilings", "label"}}``."""
    import torch

    ceil = bench.ceilings()
    label = bench.source_label()
    print(label, f"\ncopy {ceil.copy_GBps:.0f} GB/s, matmul {ceil.matmul_TFLOPs:.0f} TFLOP/s", flush=True)
    out: dict[str, dict] = {}
    for suite in suites:
        make_cases = suite_module(suite).cases
        cases = [c for c in make_cases(**bench.ceiling_kwargs(make_cases, ceil)) if matches(c.name, c.group, op)]
        if not cases:
            continue
        bar = Progress(len(cases))
        results = bench.run(cases, ceil=ceil, on_result=lambda r, bar=bar: bar.step(r.name))
        names = [c.name for c in cases if c.group not in NOT_TRAFFIC]
        del cases
        torch.cuda.empty_cache()
        trips = None
        if use_ncu and names:
            try:
                print(f"  counting {suite}'s trips under Nsight Compute...", file=sys.stderr, flush=True)
                trips = measure_trips(suite, names)
            except ncu.NcuUnavailable as e:  # no counters here at all: say so once
                print(f"  no counters: {e}", file=sys.stderr)
                use_ncu = False
            except (ncu.NcuFailed, subprocess.TimeoutExpired) as e:  # this suite's only
                print(f"  no counters for {suite}: {e}", file=sys.stderr)
        rows = [row(r, ceil, trips) for r in results]
        out[suite] = {"rows": rows, "ceilings": ceil, "label": label}
        print(f"\n[{suite}]\n{table(rows)}", flush=True)
    return out


def recorded(suites, op, device: str | None) -> dict[str, dict]:
    """Each suite as recorded: ``{suite: {"rows", "ceilings", "label"}}``."""
    out: dict[str, dict] = {}
    for suite in suites:
        try:
            rec = bench.recorded(suite=suite, device=device)
        except FileNotFoundError as e:
            print(f"[{suite}] {e}", file=sys.stderr)
            continue
        trips = recorded_trips(suite, rec.meta["device"])
        rows = [row(r, rec.ceilings, trips[1] if trips else None) for r in rec.results(suite)]
        rows = [r for r in rows if matches(r["name"], r["group"], op)]
        if not rows:
            continue
        out[suite] = {"rows": rows, "ceilings": rec.ceilings, "label": rec.label()}
        counted = f"; DRAM counters recorded {trips[0]['date']}" if trips else ""
        print(f"\n[{suite}] {rec.label()}{counted}\n{table(rows)}", flush=True)
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--lesson", type=int, default=None, help="one lesson's suite (default: every lesson)")
    ap.add_argument("--op", default=None, help="only cases whose name or group has these words (e.g. rmsnorm)")
    ap.add_argument("--ncu", action="store_true", help="also count DRAM bytes with Nsight Compute (GPU)")
    ap.add_argument("--recorded", action="store_true", help="show the recorded results even on a GPU")
    ap.add_argument("--device", default=None, help="recorded results of this device (e.g. H100)")
    ap.add_argument("--out", type=Path, default=Path("."), help="folder for the JSON and the roofline PNG")


def main(a: argparse.Namespace) -> int:
    """``python -m fusionlab bench``, with the arguments :func:`add_arguments` declares."""
    suites = suites_for(a.lesson)
    if runtime.is_gpu() and not a.recorded:
        results = live(suites, a.op, a.ncu)
        source = "measured"
    else:
        if not a.recorded:
            print(f"No GPU Triton supports here ({runtime.REASON}): showing RECORDED GPU results.", flush=True)
        results = recorded(suites, a.op, a.device)
        source = "recorded"
    if not results:
        print("no case matched", file=sys.stderr)
        return 1
    date = _dt.datetime.now(_dt.timezone.utc).date().isoformat()
    stem = f"bench-{source}-{date}" + (f"-lesson{a.lesson}" if a.lesson else "")
    a.out.mkdir(parents=True, exist_ok=True)
    js = a.out / f"{stem}.json"
    suites_js = {s: {**r, "ceilings": asdict(r["ceilings"])} for s, r in results.items()}
    js.write_text(json.dumps({"source": source, "suites": suites_js}, indent=1))
    print(f"\nwrote {js}")
    for suite, r in results.items():
        path = a.out / f"bench-{source}-{date}-{suite}-roofline.png"
        if drawn := roofline_png(r["rows"], r["ceilings"], f"{suite}, " + r["label"].split(" — ")[0], path):
            print(f"wrote {path} ({drawn} cases on this GPU's two ceilings)")
    return 0
