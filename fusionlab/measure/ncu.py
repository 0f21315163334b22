"""DRAM and L2 bytes and time per kernel, from Nsight Compute's hardware counters.

The ledger predicts the bytes a schedule moves through HBM; the GPU counts them. :func:`profile` runs a
callable under Nsight Compute's command-line profiler (``ncu``) in a subprocess and returns, per kernel
launch, the counters of :data:`METRICS`:

- ``dram__bytes_read.sum``, ``dram__bytes_write.sum``: bytes between HBM and L2;
- ``lts__t_bytes.sum``: bytes through L2 (every request the SMs make of it, hits and misses);
- ``gpu__time_duration.sum``: the kernel's time.

``cache_control="all"`` (ncu's default) flushes every cache before each kernel, so a kernel's reads start
from HBM; ``"none"`` leaves them: a kernel that reads what the one before it just wrote finds it in L2,
and its DRAM reads drop (the regime :func:`profile_both` sets beside the flushed one). ``ncu`` may need
several passes to collect the counters: flushed, it replays each kernel alone (memory restored between
passes, so a kernel's numbers are of one launch whatever the pass count); unflushed, a kernel replayed
alone would find its own input in L2 from its previous pass, so the whole program is run again for each
pass instead (``--replay-mode application``) and every kernel finds L2 as the kernel before it left it.
``--clock-control none`` leaves the GPU's clocks as they are (ncu locks them to base by default, which
slows the time but not the bytes).

**What is profiled.** A target is ``"package.module:function"``, an importable function: called with
the given string arguments, it builds its inputs and returns a callable, the *thunk*, which is run once
to warm up (compile, autotune) outside the profiled window, then once inside it. Or a target is the
path of a Python script, run whole inside the profiled window (its compiles included). The child process
sends its own prints to stderr, so ncu's CSV has stdout to itself. A thunk that runs several cases
calls :func:`marker` before each, and :func:`split_cases` tells their kernels apart. A target may
instead return *stages*, ``(name, build)`` pairs: each is built, warmed up and profiled in its own
window, then freed, all in one process (:func:`stages_child`, :func:`measure_stages`): one start of
Python, torch and ncu for many parts of cases instead of one a part.

**Where ncu cannot run.** :class:`NcuUnavailable` says why, in words a learner can act on: no CUDA GPU
(then :mod:`fusionlab.measure.interpreter` counts a Triton kernel's logical trips on the CPU), no ``ncu``
(it comes with the CUDA toolkit: ``/usr/local/cuda/bin/ncu``), or no permission to read the counters
(``ERR_NVGPUCTRPERM``: the driver restricts them to administrators unless the machine's owner lifts it).
On Google Colab the GPU images carry the CUDA toolkit, ``ncu`` included, and the notebook runs as root in
a container; whether the counters can be read there is the VM's driver setting, which a Colab user cannot
change: where ncu answers ERR_NVGPUCTRPERM, the recorded trips (``fusionlab/recorded/``) and the
interpreter count are what Colab has.
"""

from __future__ import annotations

import argparse
import csv
import gc
import importlib
import io
import json
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from ..ledger import human_bytes

try:  # the marker kernel needs Triton, which is optional (no wheels for macOS or Windows)
    from ._marker import _fusionlab_case_marker
except ImportError:
    _fusionlab_case_marker = None

DRAM_READ, DRAM_WRITE, L2_BYTES, TIME = (
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "lts__t_bytes.sum",
    "gpu__time_duration.sum",
)
#: the counters every profile collects
METRICS = (DRAM_READ, DRAM_WRITE, L2_BYTES, TIME)
#: where the lent GPU machines and the CUDA toolkit's default install keep ncu
DEFAULT_PATHS = ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu")
#: the name of the marker kernel (:func:`marker`) a thunk of several cases launches before each
MARKER = "_fusionlab_case_marker"
CACHE_CONTROLS = ("all", "none")

#: units ncu may print, as multiples of the base unit (bytes; nanoseconds)
_UNITS = {
    "": 1,
    "byte": 1,
    "kbyte": 1e3,
    "mbyte": 1e6,
    "gbyte": 1e9,
    "tbyte": 1e12,
    "kibyte": 2**10,
    "mibyte": 2**20,
    "gibyte": 2**30,
    "nsecond": 1,
    "ns": 1,
    "usecond": 1e3,
    "us": 1e3,
    "msecond": 1e6,
    "ms": 1e6,
    "second": 1e9,
    "s": 1e9,
}
_NAME_COLUMNS = ("Kernel Name", "Function Name", "Demangled Name", "Name")


class NcuUnavailable(RuntimeError):
    """Nsight Compute cannot measure here; the message says why and what to use instead."""


class NcuFailed(RuntimeError):
    """ncu ran but gave no counters; the message holds the tail of its output."""


class NcuNoKernels(NcuFailed):
    """ncu ran the program and profiled no kernel: nothing launched inside the profiled window (every
    case failed before it, or the kernels ran in a process ncu does not follow)."""


#: what ncu prints when the profiled window held no kernel of the process it follows
NO_KERNELS = "No kernels were profiled"


@dataclass(frozen=True)
class KernelCounters:
    """One kernel launch as the counters saw it: bytes in bytes, time in nanoseconds."""

    name: str
    dram_read: float
    dram_write: float
    l2_bytes: float
    time_ns: float
    #: the case it belongs to (:func:`split_cases`), "" otherwise
    case: str = ""

    @property
    def dram_bytes(self) -> float:
        return self.dram_read + self.dram_write

    @property
    def ms(self) -> float:
        return self.time_ns / 1e6

    def describe(self) -> str:
        return (
            f"{self.name[:60]}: DRAM read {human_bytes(self.dram_read)}, written {human_bytes(self.dram_write)}, "
            f"L2 {human_bytes(self.l2_bytes)}, {self.ms:.3f} ms"
        )


def short_name(name: str) -> str:
    """A kernel's name without its C++ signature and template arguments (``void foo<...>(float*)`` is
    ``foo``), for tables; Triton kernels keep their Python name."""
    s = re.sub(r"\([^()]*\)$", "", name.strip())
    while "<" in s:  # innermost template arguments first
        t = re.sub(r"<[^<>]*>", "", s)
        if t == s:
            break
        s = t
    return s.split()[-1].split("::")[-1] if s.split() else name


# -- parsing ncu's CSV ------------------------------------------------------------------------------
def _number(text: str) -> float | None:
    t = text.strip().replace(",", "")
    if not t or t.lower() in {"n/a", "nan", "-"}:
        return None
    try:
        return float(t)
    except ValueError:
        return None


def _scale(unit: str) -> float:
    u = unit.strip().lower()
    if u not in _UNITS:
        raise ValueError(f"unknown ncu unit {unit!r}")
    return _UNITS[u]


def _csv_rows(text: str) -> list[list[str]]:
    """The CSV rows of ncu's output, from its header on: ncu's own ``==PROF==``/``==WARNING==`` lines and
    anything the program printed are left out."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise NcuFailed('no CSV header (a line starting with "ID") in ncu\'s output:\n' + _tail(text))
    body = [line for line in lines[start:] if line.startswith('"')]
    return list(csv.reader(io.StringIO("\n".join(body))))


def parse_csv(text: str) -> list[KernelCounters]:
    """Kernels from ncu's ``--csv`` output, in launch order. Both layouts are read: ``--page raw`` (one
    row a kernel, a column a metric, a second row of units) and the details page (one row a metric,
    with ``Metric Name``, ``Metric Unit`` and ``Metric Value`` columns). Values carry thousands
    separators; units (``byte``, ``Kbyte``, ``nsecond``, ``usecond``...) are converted to bytes and
    nanoseconds."""
    rows = _csv_rows(text)
    header, data = rows[0], rows[1:]
    col = {h: i for i, h in enumerate(header)}
    name_col = next((col[c] for c in _NAME_COLUMNS if c in col), None)
    if name_col is None:
        raise NcuFailed(f"ncu's CSV has no kernel name column; its header: {header}")
    found: dict[str, dict] = {}  # launch ID -> {"name": ..., metric: value}
    if "Metric Name" in col:  # the details page: one row per (kernel, metric)
        for r in data:
            if len(r) < len(header) or not r[col["ID"]]:
                continue
            value = _number(r[col["Metric Value"]])
            if value is None:
                continue
            k = found.setdefault(r[col["ID"]], {"name": r[name_col]})
            k[r[col["Metric Name"]]] = value * _scale(r[col.get("Metric Unit", -1)] if "Metric Unit" in col else "")
    else:  # the raw page: one row per kernel, the row after the header gives the units
        units = [""] * len(header)
        for r in data:
            if len(r) < len(header):
                continue
            if not r[col["ID"]]:  # the units row
                units = r
                continue
            k = found.setdefault(r[col["ID"]], {"name": r[name_col]})
            for m in METRICS:
                if m in col and (v := _number(r[col[m]])) is not None:
                    k[m] = v * _scale(units[col[m]])
    out = []
    for launch_id in sorted(found, key=lambda i: int(i) if i.isdigit() else i):
        k = found[launch_id]
        missing = [m for m in METRICS if m not in k]
        if missing:
            raise NcuFailed(f"ncu gave no {', '.join(missing)} for kernel {k['name']!r} (ID {launch_id})")
        out.append(KernelCounters(k["name"], k[DRAM_READ], k[DRAM_WRITE], k[L2_BYTES], k[TIME]))
    return out


def _tail(text: str, n: int = 2000) -> str:
    return text[-n:]


# -- running ncu ------------------------------------------------------------------------------------
def find_ncu() -> str:
    """The path of ``ncu``, or :class:`NcuUnavailable` saying where it was looked for."""
    for p in (os.environ.get("FUSIONLAB_NCU"), shutil.which("ncu"), *DEFAULT_PATHS):
        if p and Path(p).is_file() and os.access(p, os.X_OK):
            return p
    raise NcuUnavailable(
        "Nsight Compute's command-line profiler (ncu) is not on this machine: not on PATH, not in "
        f"{', '.join(DEFAULT_PATHS)} (set FUSIONLAB_NCU to its path if it is elsewhere). It comes with the "
        "CUDA toolkit and as the nsight-compute package. Without it, fusionlab.measure.interpreter counts a "
        "Triton kernel's logical trips on the CPU, and fusionlab/recorded/ holds counters recorded on an "
        "H100 and an H200."
    )


def _check_gpu() -> None:
    import torch

    if not torch.cuda.is_available():
        raise NcuUnavailable(
            "no CUDA GPU here: hardware counters need one. On a CPU, fusionlab.measure.interpreter counts "
            "the bytes every tl.load and tl.store of a Triton kernel touches (its logical trips)."
        )


def permission_message(output: str) -> str:
    return (
        "ncu is here but may not read the GPU's performance counters (ERR_NVGPUCTRPERM): the NVIDIA driver "
        "restricts them to administrators. The machine's owner lifts it with the driver option "
        "NVreg_RestrictProfilingToAdminUsers=0 (or runs ncu as root; in a container, one started with "
        "--cap-add=SYS_ADMIN); see https://developer.nvidia.com/ERR_NVGPUCTRPERM. A hosted notebook (Colab) "
        "cannot change it: use the recorded trips in fusionlab/recorded/ or fusionlab.measure.interpreter.\n"
        "ncu said:\n" + _tail(output, 600)
    )


def command(
    target: str, args=(), *, cache_control: str = "all", metrics=METRICS, ncu: str | None = None, kernels=None
) -> list[str]:
    """The ncu command line that profiles ``target`` (see the module docstring)."""
    if cache_control not in CACHE_CONTROLS:
        raise ValueError(f"cache_control must be one of {CACHE_CONTROLS}, got {cache_control!r}")
    cmd = [
        ncu or find_ncu(),
        "--metrics",
        ",".join(metrics),
        "--csv",  # the details page: one row a metric a kernel, the layout seen on the lent H100 and H200
        "--print-units",
        "base",
        "--cache-control",
        cache_control,
        "--replay-mode",
        "kernel" if cache_control == "all" else "application",
        "--clock-control",
        "none",
        "--profile-from-start",
        "off",  # only between the child's cudaProfilerStart and Stop: no warm-up, no compile kernels
        # the Python child is the application; torch.compile's worker processes launch no kernels
        "--target-processes",
        "application-only",
    ]
    if kernels:
        cmd += ["--kernel-name", f"regex:{kernels}"]
    # this module by its name, also when it runs as __main__ (python -m fusionlab.measure.ncu TARGET)
    return [*cmd, sys.executable, "-m", "fusionlab.measure.ncu", "--child", target, *map(str, args)]


def run_ncu(cmd: list[str], *, timeout: float = 600, env: dict | None = None) -> str:
    """Run an ncu command line; its stdout, or the error that says why there is none. Past ``timeout``
    seconds ncu and the program it profiles are killed together (a new process group: killing ncu alone
    would leave its child holding the GPU) and :class:`subprocess.TimeoutExpired` is raised."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    proc = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    out = proc.stdout + "\n" + proc.stderr
    if "ERR_NVGPUCTRPERM" in out:
        raise NcuUnavailable(permission_message(out))
    if '"ID"' not in proc.stdout and NO_KERNELS in out:
        raise NcuNoKernels(
            "ncu profiled no kernel: nothing was launched between the program's cudaProfilerStart and Stop "
            "(every case failed before its window, or its kernels ran in a process ncu does not follow). The "
            f"end of its output:\n{_tail(out)}"
        )
    if proc.returncode != 0 or '"ID"' not in proc.stdout:
        raise NcuFailed(f"ncu exited with {proc.returncode} and no counters; the end of its output:\n{_tail(out)}")
    return proc.stdout


def profile(
    target: str, *args, cache_control: str = "all", kernels: str | None = None, timeout: float = 600
) -> list[KernelCounters]:
    """Every kernel ``target`` launches, with its counters (see the module docstring). ``kernels``: a
    regular expression: only kernels whose name matches it are profiled."""
    _check_gpu()
    cmd = command(target, args, cache_control=cache_control, kernels=kernels)
    # the child imports this very fusionlab (the folder above the package), then the caller's own modules
    here = str(Path(__file__).resolve().parents[2])
    path = [here, os.getcwd(), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, path))}
    return parse_csv(run_ncu(cmd, timeout=timeout, env=env))


def profile_both(target: str, *args, **kwargs) -> dict[str, list[KernelCounters]]:
    """:func:`profile` with caches flushed before each kernel (``"all"``) and without (``"none"``)."""
    return {cc: profile(target, *args, cache_control=cc, **kwargs) for cc in CACHE_CONTROLS}


def split_cases(kernels: list[KernelCounters], names: list[str]) -> list[KernelCounters]:
    """Attribute kernels to cases by the marker kernel launched before each (:func:`marker`): the
    markers themselves are dropped, each other kernel gets the name of the case whose marker came last."""
    out, i = [], -1
    for k in kernels:
        if MARKER in k.name:
            i += 1
            continue
        if i < 0:
            raise NcuFailed(f"kernel {k.name!r} came before the first case's marker")
        if i >= len(names):
            raise NcuFailed(f"{i + 1} markers but only {len(names)} case names")
        out.append(KernelCounters(**{**asdict(k), "case": names[i]}))
    return out


#: the environment variable naming the file where a target of several cases (:func:`cases_thunk`) writes
#: what it knows of each case (its name, its ledger's bytes...), for the parent to read
CASES_ENV = "FUSIONLAB_NCU_CASES"
#: the environment variable holding the time (seconds since the epoch) after which a target of several
#: stages (:func:`stages_child`) starts no further stage, so that a run that would overrun its budget ends
#: with the stages it finished instead of being killed with none
DEADLINE_ENV = "FUSIONLAB_NCU_DEADLINE"
#: the suffix of the file, beside :data:`CASES_ENV`'s, where the first pass of an application replay
#: writes the stages it ran: every later pass runs the same ones (ncu matches kernels across passes)
PLAN_SUFFIX = ".plan"
#: the suffix of the file, beside :data:`CASES_ENV`'s, where each run of the program adds a line: how many
#: times the profiler ran it (an application replay runs it once a pass)
PASSES_SUFFIX = ".passes"


def _append_infos(infos: list[dict]) -> None:
    if path := os.environ.get(CASES_ENV):
        p = Path(path)
        old = json.loads(p.read_text()) if p.is_file() and p.read_text().strip() else []
        p.write_text(json.dumps(old + infos))


def cases_thunk(cases, part: str | None = None) -> object:
    """The thunk of a target that runs several cases: ``cases`` holds ``(info, fn)`` pairs, ``info`` a
    dict with at least ``"name"``. Each ``fn`` is called once here (compile, autotune): one that raises is
    left out, its error kept in its info, so that one case that cannot run at this size costs only
    itself. The infos (each with ``"part": part`` where given) are added, as JSON, to the file
    :data:`CASES_ENV` names; the thunk runs each remaining case once after the marker kernel
    (:func:`split_cases` tells their kernels apart)."""
    import torch

    infos, kept = [], []
    for info, fn in cases:
        info = {**info, "part": part} if part is not None else info
        try:
            fn()
            if torch.cuda.is_available():  # an asynchronous error shows here, charged to its case
                torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001 - any failure of one case is reported, the rest still run
            infos.append({**info, "error": f"{type(e).__name__}: {e}"[:400]})
            torch.cuda.empty_cache()
            continue
        infos.append(info)
        kept.append(fn)
    _append_infos(infos)

    def thunk():
        for fn in kept:
            marker()
            fn()

    return thunk


def counters_of(kernels: list[KernelCounters]) -> dict:
    """One case's counters summed over its kernels, and each kernel's own (short names)."""
    return {
        "dram_read": sum(k.dram_read for k in kernels),
        "dram_write": sum(k.dram_write for k in kernels),
        "l2_bytes": sum(k.l2_bytes for k in kernels),
        "time_ns": sum(k.time_ns for k in kernels),
        "kernels": [{**asdict(k), "name": short_name(k.name)} for k in kernels],
    }


def _profile_cases(target: str, args, cache_control: str, timeout: float, deadline: float | None = None):
    """Profile a target of several cases once: ``(infos, kernels)``, the infos its cases (and stages)
    wrote and every kernel ncu counted, in launch order."""
    fd, side = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    env = {CASES_ENV: side, DEADLINE_ENV: None if deadline is None else repr(deadline)}
    old = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        try:
            kernels = profile(target, *args, cache_control=cache_control, timeout=timeout)
        except NcuFailed as e:  # the cases' own errors say why better than ncu can
            raise type(e)(f"{e}{_case_errors(side)}") from e
        text = Path(side).read_text()
        infos = json.loads(text) if text.strip() else []
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        Path(side).unlink(missing_ok=True)
        passes = Path(side + PASSES_SUFFIX)
        runs = len(passes.read_text().splitlines()) if passes.is_file() else 0
        passes.unlink(missing_ok=True)
        Path(side + PLAN_SUFFIX).unlink(missing_ok=True)
    _PASSES[:] = [runs]
    return infos, kernels


def _case_errors(side: str) -> str:
    """What the cases and stages of a failed profile wrote of their own failures (a case that raised
    while warming up is left out of the profiled window: where all of them did, ncu profiles nothing)."""
    try:
        text = Path(side).read_text()
        infos = json.loads(text) if text.strip() else []
    except (OSError, ValueError):
        return ""
    bad = [f"{i.get('part') or i.get('name', '?')}: {i.get('error') or i.get('part_error')}" for i in infos
           if "error" in i or "part_error" in i]  # fmt: skip
    if not bad:
        return ""
    return f"\n{len(bad)} of {len(infos)} cases failed before the profiled window:\n" + "\n".join(bad[:8])


def failure(e: Exception) -> str:
    """An ncu failure in a few lines: its first line, then the cases' own errors where they wrote any
    (:func:`_case_errors`), else the end of ncu's output."""
    lines = str(e).split("\n")
    at = next((i for i, line in enumerate(lines) if "failed before the profiled window" in line), None)
    rest = "\n".join(lines[at:])[:1200] if at is not None else "\n".join(lines[1:])[-600:]
    return lines[0][:300] + "\n" + rest


#: how many times the program ran in the last :func:`_profile_cases` (:func:`last_passes`)
_PASSES: list[int] = []


def last_passes() -> int | None:
    """How many times the profiler ran the program in the last measurement (an application replay runs it
    once a pass; a kernel replay once), None before any."""
    return _PASSES[0] if _PASSES else None


def _attribute(infos: list[dict], kernels: list[KernelCounters]) -> list[tuple[dict, dict | None]]:
    """Each case's info with its counters (:func:`counters_of`), None for a case that failed to run.
    Cases are told apart by position (two parts may share a case name)."""
    ran = [i for i in infos if "error" not in i and "part_error" not in i]
    by_case = split_cases(kernels, [str(j) for j in range(len(ran))])
    grouped: dict[str, list[KernelCounters]] = {}
    for k in by_case:
        grouped.setdefault(k.case, []).append(k)
    out, j = [], 0
    for info in infos:
        if "part_error" in info:
            continue
        if "error" in info:
            out.append((info, None))
            continue
        out.append((info, counters_of(grouped.get(str(j), []))))
        j += 1
    return out


def measure_cases(target: str, *args: str, cache_controls=CACHE_CONTROLS, timeout: float = 600) -> dict[str, dict]:
    """The counters of every case of a target built with :func:`cases_thunk`: ``{case: {**info,
    cache_control: counters_of(its kernels)}}`` for each of ``cache_controls`` (``"all"``: caches flushed
    before each kernel; ``"none"``: not). A case that failed to run keeps its ``"error"`` and no counters.
    ``timeout``: seconds for each ncu run."""
    out: dict[str, dict] = {}
    for cc in cache_controls:
        infos, kernels = _profile_cases(target, args, cc, timeout)
        for info, counted in _attribute(infos, kernels):
            entry = out.setdefault(info["name"], dict(info))
            if counted is not None:
                entry[cc] = counted
    return out


def measure_stages(
    target: str, *args: str, cache_control: str = "all", timeout: float = 600, deadline: float | None = None
) -> tuple[dict[str, dict[str, dict]], dict[str, str]]:
    """One ncu run of a target of several stages (:func:`stages_child`; each stage a part of cases built
    with :func:`cases_thunk` and its ``part``): ``({part: {case: {**info, cache_control: counters}}},
    {part: why it has no counters})``. ``deadline`` (seconds since the epoch): no stage starts after it;
    the stages it left out are among the second dict's."""
    infos, kernels = _profile_cases(target, args, cache_control, timeout, deadline)
    parts: dict[str, dict[str, dict]] = {}
    failed: dict[str, str] = {}
    for info in infos:
        if "part_error" in info:
            failed[info["part"]] = info["part_error"]
    only = args[0] if len(args) == 1 else ""  # a target of one part may write infos without it
    for info, counted in _attribute(infos, kernels):
        entry = parts.setdefault(info.get("part") or only, {}).setdefault(info["name"], dict(info))
        if counted is not None:
            entry[cache_control] = counted
    return parts, failed


_MARKER_KERNEL: list = []


def marker() -> None:
    """Launch the marker kernel (one program, one store): a thunk that runs several cases calls it before
    each, so that :func:`split_cases` can tell the cases' kernels apart in ncu's list."""
    import torch

    if not _MARKER_KERNEL:
        _MARKER_KERNEL.extend((_fusionlab_case_marker, torch.zeros(1, device="cuda", dtype=torch.int32)))
    kernel, buf = _MARKER_KERNEL
    kernel[(1,)](buf)


# -- the child: what runs under ncu ---------------------------------------------------------------
def _resolve(target: str):
    if target.endswith(".py") or os.sep in target:
        return None
    module, _, fn = target.partition(":")
    if not fn:
        raise ValueError(f"a target is 'package.module:function' or a script's path, got {target!r}")
    return getattr(importlib.import_module(module), fn)


def _window(thunk) -> None:
    """Run ``thunk`` once to warm up (compile, autotune, allocate) outside the profiled window, then
    once inside it."""
    import torch

    cudart = torch.cuda.cudart()
    thunk()
    torch.cuda.synchronize()
    cudart.cudaProfilerStart()
    thunk()
    torch.cuda.synchronize()
    cudart.cudaProfilerStop()


def stages_child(stages) -> None:
    """Run a target's stages, ``(name, build)`` pairs, one after another in this one process (one start
    of Python, torch and the profiler for them all): each ``build()`` makes its inputs and returns its
    thunk, profiled in a window of its own (:func:`_window`), then freed before the next is built, so
    the stages' tensors never share the GPU's memory. A stage whose build fails is reported in the cases
    file (``part_error``) and costs only itself. After :data:`DEADLINE_ENV`'s time no stage starts; the
    stages run are written beside the cases file, and a later pass of an application replay runs those."""
    import torch

    side = os.environ.get(CASES_ENV)
    plan_path = Path(side + PLAN_SUFFIX) if side else None
    planned = json.loads(plan_path.read_text()) if plan_path and plan_path.is_file() else None
    deadline = float(os.environ.get(DEADLINE_ENV) or "inf")
    ran = []
    for name, build in stages:
        if planned is not None and name not in planned:
            continue
        if planned is None and time.time() > deadline:
            print(f"stage {name}: not started, past the deadline", file=sys.stderr)
            continue
        ran.append(name)
        try:
            thunk = build()
        except Exception as e:  # noqa: BLE001 - one stage's failure is its own loss
            traceback.print_exc()  # where it failed, in the recording's message (ncu keeps stderr's tail)
            _append_infos([{"part": name, "part_error": f"{type(e).__name__}: {e}"[:600]}])
        else:
            _window(thunk)
            del thunk
        gc.collect()
        torch.cuda.empty_cache()
    if plan_path is not None and planned is None:
        plan_path.write_text(json.dumps(ran))


def _child(target: str, args: list[str]) -> int:
    import torch

    os.dup2(2, 1)  # the program's prints go to stderr: stdout carries ncu's CSV alone
    sys.stdout = sys.stderr
    if side := os.environ.get(CASES_ENV):
        Path(side).write_text("[]")  # each pass of an application replay writes the cases file whole
        with open(side + PASSES_SUFFIX, "a") as f:
            f.write("run\n")
    factory = _resolve(target)
    if factory is None:  # a script, profiled whole
        cudart = torch.cuda.cudart()
        cudart.cudaProfilerStart()
        runpy.run_path(target, run_name="__main__")
        torch.cuda.synchronize()
        cudart.cudaProfilerStop()
        return 0
    thunk = factory(*args)
    if isinstance(thunk, list):  # stages, each built and profiled in turn
        stages_child(thunk)
        return 0
    if not callable(thunk):
        raise TypeError(f"{target} returned {type(thunk).__name__}, not the callable to profile (or stages)")
    _window(thunk)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Profile a target's kernels under Nsight Compute.")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cache-control", choices=CACHE_CONTROLS, default="all")
    ap.add_argument("target", help="package.module:function (returns the thunk to profile) or a script's path")
    ap.add_argument("args", nargs="*", help="string arguments for the function")
    a = ap.parse_args(argv)
    if a.child:
        return _child(a.target, a.args)
    try:
        for k in profile(a.target, *a.args, cache_control=a.cache_control):
            print(k.describe())
    except NcuUnavailable as e:
        print(e, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
