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
import inspect
import json
import re
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from . import bench, runtime
from .kernels.bias_gelu import bias_gelu, bias_gelu_ledger
from .kernels.cos import cos_cos, cos_cos_eager, cos_cos_ledger
from .kernels.layernorm import layernorm, layernorm_ledger
from .kernels.rmsnorm import rmsnorm, rmsnorm_ledger
from .kernels.softmax import softmax, softmax_eager, softmax_ledger
from .kernels.swiglu import swiglu, swiglu_ledger
from .ledger import human_bytes
from .lessons import SUITES, suite_module
from .lessons.l4 import suite as l4
from .measure import ncu
from .measure import recorded as trips_files

#: groups whose ``nbytes`` is not traffic (peak memory allocated): no bandwidth, no trips
NOT_TRAFFIC = frozenset({"peak memory"})
#: words of a case's name or group that put it under the tensor cores' roof (else the vector units')
TENSOR_CORE_WORDS = ("matmul", "linear", "cublas", "gemm", "attention", "sdpa", "flash", "cudnn", "layer", "lce")
#: recorded counters, one file a run (a folder of its own: recorded/*.json are timings)
TRIPS_DIR = trips_files.TRIPS_DIR


# -- choosing cases ------------------------------------------------------------------------------------
def course_order(suites) -> list[str]:
    """Suites in the order the course teaches them: ``lesson4b`` after ``lesson4``, before ``lesson5``."""
    return sorted(suites, key=lambda s: (int(re.sub(r"\D", "", s)), s))


def suites_for(lesson: int | str | None) -> list[str]:
    """The suites of ``--lesson`` (a number, or a lesson such as ``4b``; None: every lesson's, in course
    order)."""
    if lesson is None:
        return course_order(SUITES)
    name = f"lesson{str(lesson).lower().removeprefix('lesson')}"
    if name not in SUITES:
        raise SystemExit(f"no lesson {lesson}; the lessons with a suite: {', '.join(s[6:] for s in SUITES)}")
    return [name]


def matches(name: str, group: str, op: str | None) -> bool:
    """Whether a case belongs to ``--op``: the words of ``op`` all appear in its name or group."""
    if not op:
        return True
    text = f"{name} {group}".lower()
    return all(w in text for w in op.lower().split())


#: suites whose every case with FLOPs is tensor-core work (lesson 7: attention, named by its shapes)
TENSOR_CORE_SUITES = frozenset({"lesson7"})


def on_tensor_cores(name: str, group: str, suite: str | None = None) -> bool:
    text = f"{name} {group}".lower()
    return suite in TENSOR_CORE_SUITES or any(w in text for w in TENSOR_CORE_WORDS)


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
def row(res: bench.Result, ceil: bench.Ceilings, trips: dict | None = None, suite: str | None = None) -> dict:
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
        if res.TFLOPs and ceil.matmul_TFLOPs and on_tensor_cores(res.name, res.group, suite)
        else None,
        "ledger_bytes": res.nbytes if traffic else None,
        "flops": res.flops,
        "tensor_cores": on_tensor_cores(res.name, res.group, suite),
        "dram_bytes": None,
    }
    t = (trips or {}).get(res.name)
    if t and traffic and "all" in t:
        out["dram_bytes"] = t["all"]["dram_read"] + t["all"]["dram_write"]
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


#: a roofline with more points than this keeps the fastest case of each group
MAX_POINTS = 16
#: past this many points, each is labelled by its number and named in a key under the chart: the names of
#: a suite's cases, close together on the chart, cannot all sit beside their points without overlapping
NAMED_POINTS = 4


def roofline_points(rows: list[dict], roofs: list[tuple[str, float]]) -> list[tuple]:
    """Roofline points ``(name, FLOP/byte, TFLOP/s, roof)`` of the cases with FLOPs, intensity from the
    counted DRAM bytes where there are some, else the ledger's; past :data:`MAX_POINTS`, the fastest case
    of each group."""
    points = []
    for r in rows:
        nbytes = r.get("dram_bytes") or r.get("ledger_bytes")
        if not r["flops"] or not nbytes or not r["TFLOPs"]:
            continue
        # a rate above the vector units' roof can only come from the tensor cores
        tc = r.get("tensor_cores") or on_tensor_cores(r["name"], r["group"])
        roof = roofs[0][0] if tc or len(roofs) == 1 or r["TFLOPs"] > roofs[1][1] else roofs[1][0]
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
        try:  # the notebooks' drawing stack (matplotlib, IPython, ipywidgets): a GPU box may lack it
            from .viz import roofline_figure
            from .viz._style import png
        except ImportError as e:
            print(f"no roofline PNG for {label}: the charts need the notebook packages ({e}); "
                  "the JSON holds every number", file=sys.stderr)  # fmt: skip
            return 0
        numbered = len(points) > NAMED_POINTS
        path.write_bytes(png(roofline_figure(ceil.copy_GBps, roofs, points, label, numbered=numbered)))
    return len(points)


# -- the counters: the trips suite --------------------------------------------------------------------
#: the recorded counters' format (:mod:`fusionlab.measure.recorded` reads it)
TRIPS_SCHEMA = trips_files.SCHEMA


def schedule_kwargs(make_cases) -> dict:
    """Ceilings that turn a case's ``predicted_ms`` into the bytes of its own schedule: the suites state
    those bytes only through the predicted time, so at 1 GB/s and with compute taken as free (1e12
    TFLOP/s), ``predicted_ms * 1e6`` is the schedule's bytes."""
    return bench.ceiling_kwargs(make_cases, bench.Ceilings(copy_GBps=1.0, matmul_TFLOPs=1e12, vector_TFLOPs=1e12))


#: cases the trips suite leaves out, with why: the bench still times them
TRIPS_LEAVE_OUT = {
    "adamw gpt2-small loop": "a per-tensor loop launches about 1,200 kernels (148 tensors, 8 ops each), each "
    "profiled alone; foreach makes the same trips in a few dozen launches, and is counted",
    # the H100 recording of 2026-11-27: 480 launches, about a fifth of the whole flushed recording's time,
    # at 2.57x its ledger where GPT-2 small's foreach (56 launches) moved 2.53x
    "adamw llama-1b foreach": "480 launches over the 1B list, each profiled alone; GPT-2 small's foreach makes "
    "the same trips an element in 56, and is counted",
}


def suite_cases(suite: str, *names: str, part: str | None = None):
    """The ncu cases of a suite: its cases (those named, or all but peak-memory ones and
    :data:`TRIPS_LEAVE_OUT`), each with the fused ledger's bytes and its own schedule's, as a thunk
    (:func:`fusionlab.measure.ncu.cases_thunk`)."""
    make_cases = suite_module(suite).cases
    kwargs = schedule_kwargs(make_cases)
    if "graphs" in inspect.signature(make_cases).parameters:  # a graph's replay counts no other bytes
        kwargs["graphs"] = False
    cases = [c for c in make_cases(**kwargs) if c.group not in NOT_TRAFFIC]
    cases = [c for c in cases if c.name in names] if names else [c for c in cases if c.name not in TRIPS_LEAVE_OUT]
    return ncu.cases_thunk(
        (
            (
                {
                    "name": c.name,
                    "group": c.group,
                    "ledger_bytes": c.nbytes,
                    "schedule_bytes": c.predicted_ms * 1e6 if c.predicted_ms else None,
                },
                c.fn,
            )
            for c in cases
        ),
        part,
    )


def suite_thunk(suite: str, *names: str):
    """The ncu target for a suite (:func:`fusionlab.measure.ncu.measure_cases`): :func:`suite_cases`."""
    return suite_cases(suite, *names)


def _info(name: str, group: str, led, fused: bool = True, **extra) -> dict:
    """A counter case's description: the fused ledger's bytes and those of the schedule it runs."""
    return {"name": name, "group": group, "ledger_bytes": led.fused_bytes, "schedule_bytes": led.bytes(fused), **extra}


def _no_grad(fn):
    def run():
        with torch.no_grad():
            return fn()

    return run


#: elements of the ≥ 1 GiB cases: 2**28 fp32 or 2**29 bf16 elements a tensor
GIB_ROWS_BF16 = (131072, 4096)


def trips_large():
    """Element-wise and row-wise kernels with every tensor of 1 GiB or more, where the L2 (50-60 MiB)
    holds too little to matter: their DRAM bytes should be the ledger's (the bar: within 2%)."""

    n = 2**28
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    cc = cos_cos_ledger(n, torch.float32)
    out = [
        (_info("cos_cos fused (lesson 1)", "element-wise", cc), lambda: cos_cos(x)),
        (_info("eager cos (lesson 1)", "element-wise", cc), lambda: torch.cos(x, out=y)),
        (_info("eager cos().cos() (lesson 1)", "element-wise", cc, fused=False), lambda: torch.cos(torch.cos(x))),
    ]
    m, k = 16384, 16384  # lesson 2's fp32 shape: 1 GiB
    xb, b = torch.randn(m, k, device="cuda"), torch.randn(k, device="cuda")
    out.append((_info("bias_gelu fused fp32 (lesson 2)", "element-wise", bias_gelu_ledger(m, k, torch.float32)),
                lambda: bias_gelu(xb, b)))  # fmt: skip
    rows, cols = GIB_ROWS_BF16
    bf = torch.bfloat16
    xs = (torch.randn(rows, cols, device="cuda") * 3).to(bf)
    out.append((_info("softmax fused (lesson 4)", "row-wise", softmax_ledger(rows, cols, bf, block=cols)),
                _no_grad(lambda: softmax(xs))))  # fmt: skip
    xr, rr = torch.randn(rows, cols, device="cuda", dtype=bf), torch.randn(rows, cols, device="cuda", dtype=bf)
    w = torch.ones(cols, device="cuda", dtype=bf)
    out.append((_info("rmsnorm + residual fused (lesson 4)", "row-wise", rmsnorm_ledger(rows, cols, bf, residual=True)),
                _no_grad(lambda: rmsnorm(xr, w, 1e-6, rr))))  # fmt: skip
    out.append((_info("layernorm fused (lesson 4)", "row-wise", layernorm_ledger(rows, cols, bf)),
                _no_grad(lambda: layernorm(xr, w, w))))  # fmt: skip
    g, u = xr, rr  # swiglu(g, u): two 1 GiB inputs, one output
    out.append((_info("swiglu fused (lesson 5)", "element-wise", swiglu_ledger(rows * cols, bf)),
                _no_grad(lambda: swiglu(g, u))))  # fmt: skip
    return out


#: lesson 1's sizes (fp32 elements): 4 MiB to 1 GiB; 16 and 32 MiB fit an H100's or H200's L2 (50 or 60 MiB)
#: with eager's intermediate, 64 MiB and up do not
REGIME_LOG2 = (20, 22, 23, 24, 26, 28)


#: the group of the cases that only empty the L2 (readers leave them out)
FLUSH = trips_files.FLUSH


def trips_regimes():
    """Lesson 1's regimes: eager ``x.cos().cos()``, the fused kernel and one eager cos from 4 MiB to
    1 GiB, each run twice in a row ("first", "again") after a kernel that reads 256 MiB of something
    else (a case of group :data:`FLUSH`: it leaves the L2 full of clean lines of its own, so "first"
    starts cold even without ncu's flush, and pays no write-back of another case's output). The second
    call is what a timing loop's every repetition meets: its input left in L2 by the first where it fits.
    (A copy, ``y.copy_(x)``, is a copy-engine transfer, not a kernel: the counters do not see it.)"""
    big = torch.ones(2**26, device="cuda")
    flush = lambda: big.sum()  # noqa: E731
    out = []
    for log2 in REGIME_LOG2:
        n = 2**log2
        x = torch.randn(n, device="cuda")
        y = torch.empty_like(x)
        led = cos_cos_ledger(n, torch.float32)
        size = human_bytes(4 * n)
        fns = {
            "eager cos().cos()": (lambda x=x: cos_cos_eager(x), False),
            "fused cos_cos": (lambda x=x: cos_cos(x), True),
            "eager cos": (lambda x=x, y=y: torch.cos(x, out=y), True),
        }
        for case, (fn, fused) in fns.items():
            out.append(({"name": f"flush before {case} {size}", "group": FLUSH}, flush))
            for when in ("first", "again"):
                info = _info(f"{case} {size} {when}", case, led, fused, tensor_bytes=4 * n, call=when)
                out.append((info, fn))
    return out


#: lesson 4's cliff: 256 MiB of bf16 at each width, rows ever wider until the rows in flight
#: (one a program, a program or more an SM) hold more than the L2
CLIFF_WIDTHS = (32768, 65536, 131072, 262144, 524288, 1048576)
CLIFF_RMS_WIDTHS = (8192, 32768, 131072, 524288)


def trips_cliff():
    """Lesson 4's re-read cliff: the softmax on its one-program-a-row online path (reads each row twice:
    the second read is served by L2 while the rows in flight fit it) against the split schedule (reads
    once), and RMSNorm forced onto its two-pass path (tiles of 4096), at widths past what L2 holds."""
    out = []
    for n in CLIFF_WIDTHS:
        rows = l4.sweep_rows(n)
        x = (torch.randn(rows, n, device="cuda") * 3).to(l4.DTYPE)
        row_bytes = n * l4.DTYPE.itemsize
        for online in (True, False):
            led = l4.sm_ledger(rows, n, split=not online)
            name = f"softmax {'one program a row' if online else 'split rows'} n={n}"
            info = _info(name, "softmax", led, rows=rows, n=n, row_bytes=row_bytes)
            out.append((info, _no_grad(lambda x=x, online=online: softmax(x, split=not online))))
    for n in CLIFF_RMS_WIDTHS:
        rows = l4.SWEEP_ELEMENTS // n
        x, r, _, _, w = l4.rms_inputs(rows, n)
        led = l4.rms_fwd_ledger(rows, n, block=l4.TWO_PASS_BLOCK)
        info = _info(f"rmsnorm two-pass n={n}", "rmsnorm", led, rows=rows, n=n, row_bytes=n * l4.DTYPE.itemsize)
        cfg = {"BLOCK_N": l4.TWO_PASS_BLOCK}
        out.append((info, _no_grad(lambda x=x, r=r, w=w, cfg=cfg: rmsnorm(x, w, l4.EPS, r, fwd_config=cfg))))
    return out


def trips_eager_softmax():
    """What ``torch.softmax`` reads (lesson 4 times it against the fused ledger): PyTorch's kernel at
    lesson 4's two shapes beside the package's, the L2 bytes counting every re-read of a row."""
    out = []
    for rows, n in (l4.SOFTMAX_NARROW, l4.SOFTMAX_WIDE):
        x = (torch.randn(rows, n, device="cuda") * 3).to(l4.DTYPE)
        led = l4.sm_ledger(rows, n)
        shape = l4.shape_name(rows, n)
        out.append((_info(f"torch.softmax {shape}", "eager", led), _no_grad(lambda x=x: softmax_eager(x))))
        out.append((_info(f"softmax fused {shape}", "fused", led), _no_grad(lambda x=x: softmax(x))))
    return out


#: the trips suite's experiments beyond the lessons' own suites, most wanted first
EXPERIMENTS = {
    "large": trips_large,
    "eager_softmax": trips_eager_softmax,
    "cliff": trips_cliff,
    "regimes": trips_regimes,
}
#: the cache settings each experiment is run under: only lesson 1's regimes ask what L2 keeps between
#: kernels (the others' tensors are far larger than L2, or their question is within one kernel); each
#: run without a flush replays the whole program once per pass of the profiler, so it is not spent where
#: it answers nothing
EXPERIMENT_CONTROLS = {"regimes": ncu.CACHE_CONTROLS}


def experiment_thunk(name: str):
    """The ncu target of one of :data:`EXPERIMENTS` (its cases, through :func:`ncu.cases_thunk`)."""
    return ncu.cases_thunk(EXPERIMENTS[name]())


def parts_thunk(*parts: str):
    """The ncu target of several parts in one process: a stage a part
    (:func:`fusionlab.measure.ncu.stages_child`), each built when its turn comes and freed after."""

    def build(part: str):
        if part in EXPERIMENTS:
            return lambda: ncu.cases_thunk(EXPERIMENTS[part](), part)
        return lambda: suite_cases(part, part=part)

    return [(part, build(part)) for part in parts]


def target_of(part: str) -> tuple[str, tuple[str, ...]]:
    """The ncu target and arguments of a part of the trips suite: an experiment or a lesson's suite."""
    if part in EXPERIMENTS:
        return "fusionlab.benchcli:experiment_thunk", (part,)
    if part in SUITES:
        return "fusionlab.benchcli:suite_thunk", (part,)
    raise SystemExit(f"no part {part!r}: the experiments {', '.join(EXPERIMENTS)}; the suites {', '.join(SUITES)}")


#: the trips suite's parts in the order they are recorded: the experiments, then the lessons in course order
TRIPS_PARTS = (*EXPERIMENTS, *course_order(SUITES))


def trips_runs(specs=(), cache_controls=ncu.CACHE_CONTROLS) -> list[tuple[str, str]]:
    """The ``(part, cache control)`` runs that ``specs`` ask for, in the order they are recorded. A spec is
    a part (``lesson4b``: under the settings it has by default: the experiments :data:`EXPERIMENT_CONTROLS`,
    the suites both) or a part and one setting (``lesson4b:none``); none: every part of :data:`TRIPS_PARTS`.
    Only settings among ``cache_controls`` run. The order: the experiments (what the lessons cite), then
    every suite flushed, then every suite not."""
    want: dict[str, list[str]] = {}
    for spec in specs or TRIPS_PARTS:
        part, _, cc = spec.partition(":")
        target_of(part)  # an unknown part fails here, before any run
        if cc and cc not in ncu.CACHE_CONTROLS:
            raise SystemExit(f"{spec!r}: the cache settings are {', '.join(ncu.CACHE_CONTROLS)}")
        default = EXPERIMENT_CONTROLS.get(part, ("all",)) if part in EXPERIMENTS else ncu.CACHE_CONTROLS
        for c in [cc] if cc else default:
            if c in cache_controls and c not in want.setdefault(part, []):
                want[part].append(c)
    order = {p: i for i, p in enumerate(TRIPS_PARTS)}
    parts = sorted(want, key=order.__getitem__)
    runs = [(p, cc) for p in parts if p in EXPERIMENTS for cc in ncu.CACHE_CONTROLS if cc in want[p]]
    return runs + [(p, cc) for cc in ncu.CACHE_CONTROLS for p in parts if p not in EXPERIMENTS and cc in want[p]]


#: parts in one ncu run at most: each run starts Python, torch and the profiler once for all its parts,
#: but a run killed past its time keeps nothing, so a run holds a few parts, not all of them
MAX_BATCH = 4


def trips_batches(runs: list[tuple[str, str]]) -> list[tuple[list[str], str]]:
    """Consecutive runs of one cache setting, and of experiments or of suites, as one ncu run each
    (:func:`parts_thunk`), :data:`MAX_BATCH` parts at most."""
    out: list[tuple[list[str], str]] = []
    for part, cc in runs:
        kind = part in EXPERIMENTS
        if out and out[-1][1] == cc and (out[-1][0][-1] in EXPERIMENTS) == kind and len(out[-1][0]) < MAX_BATCH:
            out[-1][0].append(part)
        else:
            out.append(([part], cc))
    return out


def measure_trips(suite: str, names=(), cache_controls=("all",), timeout: float = 600) -> dict[str, dict]:
    """Counters of each case of a lesson's suite (those named, or all): ``{case: {"ledger_bytes",
    "schedule_bytes", cache_control: {"dram_read", "dram_write", "l2_bytes", "time_ns", "kernels"}}}``."""
    return ncu.measure_cases(
        "fusionlab.benchcli:suite_thunk", suite, *names, cache_controls=cache_controls, timeout=timeout
    )


def trips_meta(command: str) -> dict:
    """What every recorded counter carries: device, date, versions, ncu's version, the L2's size."""
    meta = {**bench.metadata(), "command": command}
    try:
        lines = subprocess.run([ncu.find_ncu(), "--version"], capture_output=True, text=True).stdout.split("\n")
        meta["ncu"] = next((x for x in reversed(lines) if x.strip()), "?").strip()
    except (ncu.NcuUnavailable, OSError):
        meta["ncu"] = None
    if torch.cuda.is_available():
        meta["L2_bytes"] = torch.cuda.get_device_properties(0).L2_cache_size
        meta["SMs"] = torch.cuda.get_device_properties(0).multi_processor_count
    return meta


def trips_path(out_dir: Path, meta: dict) -> Path:
    """``<device>-<date>-<time>.json``: two runs of one day (some parts each) keep both files; a reader
    takes each part from the newest file that holds it (:func:`recorded_trips`)."""
    slug = re.sub(r"[^a-z0-9]+", "-", meta["device"].lower()).strip("-")
    return out_dir / f"{slug}-{meta['date']}-{meta['time'].replace(':', '').rstrip('Z')}.json"


#: seconds kept back from a batch's deadline for the stage under way when it passes, and ncu's report
DEADLINE_MARGIN_S = 75
#: an unflushed batch replays the whole program once a pass of the profiler: its first pass gets this share
#: of the time left to start stages in. On the H100 (2026-11-27) lessons 1 and 2 unflushed stopped starting
#: stages 25 s in and ended at 29 s: one run of the program for these counters, not several
APPLICATION_REPLAY_SHARE = 0.8
#: a batch whose window to start stages in is shorter than this is not run (nothing would start)
MIN_WINDOW_S = 10


def record_trips(
    parts=(), out_dir: Path = TRIPS_DIR, *, budget_s: float = 450, cache_controls=ncu.CACHE_CONTROLS, command: str = ""
) -> Path:
    """The trips suite: the runs :func:`trips_runs` makes of ``parts`` (default: all), grouped into one ncu
    run a batch (:func:`trips_batches`), while ``budget_s`` lasts. Each batch starts no part past its
    deadline (the budget less :data:`DEADLINE_MARGIN_S`; an unflushed one, whose passes each run the whole
    program, :data:`APPLICATION_REPLAY_SHARE` of it), so a batch that would overrun keeps the parts it
    finished; a batch that fails outright is run again a part at a time. One JSON file (schema
    :data:`TRIPS_SCHEMA`, :func:`trips_path`), rewritten after every run so that what was measured survives
    a part that fails or a budget that runs out (those are listed under ``"missing"``); ``meta["runs"]``
    holds each ncu run's parts, setting and seconds."""
    t0 = time.perf_counter()
    meta = trips_meta(command or "python benchmarks/record_trips.py")
    meta["runs"] = []
    path = trips_path(out_dir, meta)
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {"schema": TRIPS_SCHEMA, "meta": meta, "metrics": list(ncu.METRICS), "parts": {}, "missing": {}}

    def save():
        meta["elapsed_s"] = round(time.perf_counter() - t0, 1)
        path.write_text(json.dumps(data, indent=1) + "\n")

    def run(batch: list[str], cc: str) -> bool:
        """One ncu run of ``batch``; False where it failed outright (nothing of it kept)."""
        left = budget_s - (time.perf_counter() - t0)
        if left < 20:
            for part in batch:
                data["missing"][f"{part} {cc}"] = f"the budget of {budget_s:.0f} s ran out"
            return True
        share = 1.0 if cc == ncu.CACHE_CONTROLS[0] else APPLICATION_REPLAY_SHARE
        window = share * (left - DEADLINE_MARGIN_S)
        if window < MIN_WINDOW_S:
            for part in batch:
                data["missing"][f"{part} {cc}"] = f"the budget of {budget_s:.0f} s ran out ({left:.0f} s left)"
            return True
        deadline = time.time() + window
        t1 = time.perf_counter()
        ok, got, failed = True, {}, {}
        try:
            got, failed = ncu.measure_stages(
                "fusionlab.benchcli:parts_thunk", *batch, cache_control=cc, timeout=left, deadline=deadline
            )
        except subprocess.TimeoutExpired:
            failed = {p: f"ncu ran past the {left:.0f} s left of the budget" for p in batch}
        except ncu.NcuUnavailable as e:  # no counters on this machine at all: nothing else will run
            data["missing"]["everything"] = str(e)
            save()
            raise
        except Exception as e:  # noqa: BLE001 - ncu failed, or its output did not fit: this run's loss only
            failed = {p: f"{type(e).__name__}: {e}"[-1500:] for p in batch}
            ok = False
        seconds = time.perf_counter() - t1
        for part in batch:
            if part in got:
                cases = data["parts"].setdefault(part, {})
                for name, entry in got[part].items():
                    cases.setdefault(name, {}).update(entry)
                data["missing"].pop(f"{part} {cc}", None)
            else:
                why = "no counters came back: not started before the batch's deadline, or none of its cases ran"
                data["missing"][f"{part} {cc}"] = failed.get(part, why)
        kernels = sum(len(c.get(cc, {}).get("kernels", [])) for p in got.values() for c in p.values())
        run_log = {"parts": batch, "cache_control": cc, "seconds": round(seconds, 1), "kernels": kernels}
        meta["runs"].append({**run_log, "program_runs": ncu.last_passes() if ok and got else None})
        print(f"{' '.join(batch)} ({'flushed' if cc == 'all' else 'not flushed'}): "
              f"{sum(len(v) for v in got.values())} cases, {kernels} kernels, {seconds:.0f} s, "
              f"program run {meta['runs'][-1]['program_runs']} time(s)", flush=True)  # fmt: skip
        save()
        return ok

    for batch, cc in trips_batches(trips_runs(parts, cache_controls)):
        if not run(batch, cc) and len(batch) > 1:
            for part in batch:  # one part that crashes its process costs only itself
                run([part], cc)
    save()
    return path


read_trips = trips_files.read


def counters_here_or_recorded(part: str, device: str | None = None, controls=("all",)) -> trips_files.Part | None:
    """A part's counters (caches flushed, and not if ``controls`` says so) measured here where ncu can
    read this GPU's counters (a minute or two a part), else the newest recording on ``device`` (this GPU
    by default), or where that device has none, another's (None while no device has one:
    :func:`fusionlab.measure.recorded.for_device`); a lesson shows either with its
    :attr:`~fusionlab.measure.recorded.Part.label`, which names the device."""
    if runtime.is_gpu():
        try:
            target, args = target_of(part)
            cases = ncu.measure_cases(target, *args, cache_controls=controls, timeout=300)
            return trips_files.Part(part, trips_meta("fusionlab.benchcli.counters_here_or_recorded"), cases, True)
        except ncu.NcuUnavailable as e:
            print(f"No counters on this machine ({str(e).split(':')[0]}); reading the recording.", file=sys.stderr)
        except (ncu.NcuFailed, subprocess.TimeoutExpired) as e:
            print(f"ncu could not count {part!r} here ({type(e).__name__}: {ncu.failure(e)}); reading the recording.",
                  file=sys.stderr)  # fmt: skip
    return trips_files.for_device(part, device, TRIPS_DIR)


def recorded_trips(part: str, device: str | None = None) -> tuple[dict, dict] | None:
    """The newest recorded counters of a part (a lesson's suite or an experiment) on a device whose
    name contains ``device``: ``(meta, cases)``, or None where none is recorded."""
    found = trips_files.newest(part, device, TRIPS_DIR)
    return None if found is None else (found.meta, found.cases)


#: the bar at >= 1 GiB: a kernel's DRAM bytes (caches flushed) within this share of its schedule's ledger
LEDGER_BAR = 0.02


def trips_bars(cases: dict) -> list[tuple[str, bool, str]]:
    """The ledger bar for each case of the ``large`` part: ``(case, met, DRAM over ledger)``. The writes may
    fall short by what L2 still holds when the kernel ends (at most its size: under 2.5% of 2 GiB)."""
    out = []
    for name, c in cases.items():
        if "error" in c or "all" not in c or not c.get("schedule_bytes"):
            continue
        r = (c["all"]["dram_read"] + c["all"]["dram_write"]) / c["schedule_bytes"]
        out.append((name, abs(r - 1) <= LEDGER_BAR, f"{r:.4f}x"))
    return out


def trips_table(cases: dict) -> str:
    """Each case's ledger beside its DRAM bytes (flushed) and, not flushed, its DRAM and L2 bytes."""
    head = f"{'case':<44} {'schedule':>10} {'DRAM':>10} {'/sched':>7} {'L2':>10} | {'DRAM warm':>10} {'L2 warm':>10}"
    lines = [head]
    for name, c in cases.items():
        if c.get("group") == FLUSH:
            continue
        if "error" in c:
            lines.append(f"{name[:44]:<44} could not run: {c['error'][:60]}")
            continue
        a, w = c.get("all"), c.get("none")
        sched = c.get("schedule_bytes") or c.get("ledger_bytes")
        cells = [f"{name[:44]:<44}", f"{human_bytes(sched):>10}" if sched else f"{'':10}"]
        if a:
            dram = a["dram_read"] + a["dram_write"]
            cells += [f"{human_bytes(dram):>10}", f"{dram / sched:6.3f}x" if sched else f"{'':7}",
                      f"{human_bytes(a['l2_bytes']):>10}"]  # fmt: skip
        else:
            cells += [f"{'':10}", f"{'':7}", f"{'':10}"]
        if w:
            cells += ["|", f"{human_bytes(w['dram_read'] + w['dram_write']):>10}", f"{human_bytes(w['l2_bytes']):>10}"]
        lines.append(" ".join(cells))
    return "\n".join(lines)


# -- the two paths --------------------------------------------------------------------------------------
#: what the whole course's live bench promises to fit on a GPU (the issue's bar: under ten minutes)
BENCH_BUDGET_S = 600
#: the whole bench's wall time per suite, one file a GPU run (``bench-time-<device>-<date>-<time>.json``,
#: written next to the bench's JSON by every live run of all the lessons and copied here)
BENCH_TIME_DIR = bench.RECORDED_DIR / "bench"


def left_out_by_budget(
    suite: str, elapsed_s: float, budget_s: float | None, estimates: dict[str, float], longest_s: float = 0.0
) -> str | None:
    """Why ``suite`` is not started ``elapsed_s`` into a bench of ``budget_s`` seconds (None: it is): the
    budget is spent, or this suite's recorded wall time on this GPU (``estimates``) would overrun it, or,
    never timed here, the longest suite of this run so far (``longest_s``) would."""
    if budget_s is None:
        return None
    if elapsed_s >= budget_s:
        return f"the bench's budget of {budget_s:.0f} s was spent ({elapsed_s:.0f} s)"
    guess, how = (estimates[suite], "it took") if suite in estimates else (longest_s, "the longest suite so far took")
    if elapsed_s + guess > budget_s:
        return (
            f"{how} {guess:.0f} s, past the {budget_s - elapsed_s:.0f} s left of the bench's budget of {budget_s:.0f} s"
        )
    return None


def bench_timings(device: str | None = None, directory: Path | None = None) -> list[dict]:
    """The recorded wall times of the whole live bench (:data:`BENCH_TIME_DIR`), oldest first, of devices
    whose name contains ``device`` (every device if None)."""
    d = BENCH_TIME_DIR if directory is None else Path(directory)
    found = [json.loads(p.read_text()) for p in sorted(d.glob("bench-time-*.json"))] if d.is_dir() else []
    found = [t for t in found if device is None or device.lower() in t["meta"]["device"].lower()]
    return sorted(found, key=lambda t: (t["meta"]["date"], t["meta"].get("time", "")))


def describe_timing(t: dict) -> str:
    """One recorded bench timing in a line: device, date, whole time against the budget, each suite's."""
    m = t["meta"]
    suites = ", ".join(f"{s} {sec:.0f} s" for s, sec in t["wall_s"].items())
    left = f"; left out: {', '.join(t['left_out'])}" if t.get("left_out") else ""
    left += "" if t.get("complete", True) else "; CUT SHORT before its end"
    ncu_note = " with --ncu" if t.get("ncu") else ""
    return (
        f"{m['device']}, {m['date']}, torch {m['torch']}, triton {m['triton']}: the whole bench{ncu_note} took "
        f"{t['total_s'] / 60:.1f} min (budget {t['budget_s'] / 60:.3g} min) — {suites}{left}"
    )


def live(suites, op, use_ncu: bool, budget_s: float | None = None, on_suite=None) -> dict[str, dict]:
    """Each suite timed here: ``{suite: {"rows", "ceilings", "label", "wall_s"}}``; a suite that the
    budget (``budget_s`` seconds from the start, :func:`left_out_by_budget`) leaves out is said so and
    kept as ``{"left_out": why}``. ``on_suite(out)`` is called after each suite (a record kept as it goes)."""
    t0 = time.perf_counter()
    ceil = bench.ceilings()
    label = bench.source_label()
    print(label, f"\ncopy {ceil.copy_GBps:.0f} GB/s, matmul {ceil.matmul_TFLOPs:.0f} TFLOP/s", flush=True)
    timed = bench_timings(runtime.info().device_name)
    estimates = timed[-1]["wall_s"] if timed and not op and bool(timed[-1].get("ncu")) == use_ncu else {}
    out: dict[str, dict] = {}
    for suite in suites:
        t1 = time.perf_counter()
        longest = max((r["wall_s"] for r in out.values() if "wall_s" in r), default=0.0)
        if why := left_out_by_budget(suite, t1 - t0, budget_s, estimates, longest):
            print(f"\n[{suite}] left out: {why}", flush=True)
            out[suite] = {"left_out": why}
            continue
        make_cases = suite_module(suite).cases
        cases = [c for c in make_cases(**bench.ceiling_kwargs(make_cases, ceil)) if matches(c.name, c.group, op)]
        if not cases:
            continue
        # building a suite's cases makes its inputs and compiles what it times (torch.compile, autotuning):
        # kept apart from the timing itself, the part a cache or a shared shape would save
        build = time.perf_counter() - t1
        print(f"[{suite}] {len(cases)} cases built in {build:.0f} s (inputs, compiles); timing them...", flush=True)
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
        rows = [row(r, ceil, trips, suite) for r in results]
        wall = time.perf_counter() - t1
        out[suite] = {
            "rows": rows,
            "ceilings": ceil,
            "label": label,
            "wall_s": round(wall, 1),
            "build_s": round(build, 1),
        }
        print(f"\n[{suite}] {wall:.0f} s ({build:.0f} s of it building the cases)\n{table(rows)}", flush=True)
        if on_suite is not None:
            on_suite(out)
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
        rows = [row(r, rec.ceilings, trips[1] if trips else None, suite) for r in rec.results(suite)]
        rows = [r for r in rows if matches(r["name"], r["group"], op)]
        if not rows:
            continue
        out[suite] = {"rows": rows, "ceilings": rec.ceilings, "label": rec.label()}
        counted = f"; DRAM counters recorded {trips[0]['date']}" if trips else ""
        print(f"\n[{suite}] {rec.label()}{counted}\n{table(rows)}", flush=True)
    return out


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--lesson", default=None, help="one lesson's suite, e.g. 4 or 4b (default: every lesson)")
    ap.add_argument("--op", default=None, help="only cases whose name or group has these words (e.g. rmsnorm)")
    ap.add_argument("--ncu", action="store_true", help="also count DRAM bytes with Nsight Compute (GPU)")
    ap.add_argument("--recorded", action="store_true", help="show the recorded results even on a GPU")
    ap.add_argument(
        "--trips",
        action="store_true",
        help="the trips suite: ledger against DRAM and L2 bytes (recorded; with --ncu on a GPU, counted here)",
    )
    ap.add_argument("--device", default=None, help="recorded results of this device (e.g. H100)")
    ap.add_argument(
        "--budget",
        type=float,
        default=BENCH_BUDGET_S,
        help=f"seconds the live bench may take: no suite starts past it (default {BENCH_BUDGET_S})",
    )
    ap.add_argument("--timings", action="store_true", help="how long the whole bench took on each recorded GPU")
    ap.add_argument("--out", type=Path, default=Path("."), help="folder for the JSON and the roofline PNG")


def show_trips(parts, device: str | None, directory: Path | None = None) -> int:
    """Each part's newest recorded counters (ledger against DRAM and L2 bytes), labelled; how many found."""
    found = 0
    for part in parts:
        p = trips_files.newest(part, device, directory if directory is not None else TRIPS_DIR)
        if p is None:
            print(f"\n[{part}] {trips_files.missing_message(part, device)}")
            continue
        found += 1
        print(f"\n[{part}] {p.label}\n{trips_table(p.cases)}")
        wanted = EXPERIMENT_CONTROLS.get(part, ("all",)) if part in EXPERIMENTS else ncu.CACHE_CONTROLS
        for cc in wanted:  # a setting no file of this device holds: said, with the command that records it
            if not any(cc in c for c in p.cases.values()):
                how = "caches flushed" if cc == "all" else "not flushed"
                print(f"  ({how}: not recorded on {p.device} yet; `python {trips_files.SCRIPT} --parts {part}:{cc}`)")
        if part == "large":
            for name, met, ratio in trips_bars(p.cases):
                print(f"  {'MET ' if met else 'MISS'} DRAM within {LEDGER_BAR:.0%} of the ledger: {name} {ratio}")
    return found


def main(a: argparse.Namespace) -> int:
    """``python -m fusionlab bench``, with the arguments :func:`add_arguments` declares."""
    suites = suites_for(a.lesson)
    if a.trips:
        parts = [*EXPERIMENTS, *suites] if a.lesson is None else suites
        if a.ncu and runtime.is_gpu() and not a.recorded:
            path = record_trips(parts, a.out, command="python -m fusionlab bench --trips --ncu")
            print(f"wrote {path}")
            return 0 if show_trips(parts, None, a.out) else 1
        return 0 if show_trips(parts, a.device) else 1
    if a.timings:
        timings = bench_timings(a.device)
        for t in timings:
            print(describe_timing(t))
        if not timings:
            print(f"no bench timed yet in {BENCH_TIME_DIR}: `python -m fusionlab bench` on a GPU writes one")
        return 0 if timings else 1
    if runtime.is_gpu() and not a.recorded:
        t0 = time.perf_counter()
        meta = {**bench.metadata(), "command": f"python -m fusionlab bench --budget {a.budget:.0f}" + " --ncu" * a.ncu}
        slug = re.sub(r"[^a-z0-9]+", "-", meta["device"].lower()).strip("-")
        tp = a.out / f"bench-time-{slug}-{meta['date']}-{meta['time'].replace(':', '').rstrip('Z')}.json"

        def keep_time(timed: dict, done: bool = False) -> None:
            """The whole course's bench time (what the README points to), rewritten after each suite so
            that a run cut short keeps what it timed (``"complete": false``)."""
            if a.lesson is not None or a.op:
                return
            a.out.mkdir(parents=True, exist_ok=True)
            timing = {
                "meta": meta,
                "budget_s": a.budget,
                "total_s": round(time.perf_counter() - t0, 1),
                "ncu": a.ncu,
                "complete": done,
                "wall_s": {s: r["wall_s"] for s, r in timed.items() if "rows" in r},
                "build_s": {s: r["build_s"] for s, r in timed.items() if "rows" in r},
                "left_out": [s for s, r in timed.items() if "left_out" in r],
            }
            tp.write_text(json.dumps(timing, indent=1) + "\n")

        timed = live(suites, a.op, a.ncu, a.budget, on_suite=keep_time)
        total = time.perf_counter() - t0
        results = {s: r for s, r in timed.items() if "rows" in r}
        source = "measured"
        left_out = [s for s, r in timed.items() if "left_out" in r]
        print(f"\nthe whole bench: {total:.0f} s ({total / 60:.1f} min) of its {a.budget:.0f} s budget; "
              + ", ".join(f"{s} {r['wall_s']:.0f} s" for s, r in results.items())
              + (f"; left out: {', '.join(left_out)}" if left_out else ""), flush=True)  # fmt: skip
        keep_time(timed, done=True)
        if a.lesson is None and not a.op:
            print(f"wrote {tp} (the whole bench's time on this GPU; fusionlab/recorded/bench/ keeps them)")
    else:
        if not a.recorded:
            print(f"No GPU Triton supports here ({runtime.REASON}): showing RECORDED GPU results.", flush=True)
            for t in {t["meta"]["device"]: t for t in bench_timings(a.device)}.values():  # newest a GPU
                print(f"  live, it takes: {describe_timing(t)}")
        results = recorded(suites, a.op, a.device)
        source = "recorded"
    date = _dt.datetime.now(_dt.timezone.utc).date().isoformat()
    stem = f"bench-{source}-{date}" + (f"-{suites[0]}" if a.lesson is not None else "")
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
