"""Timing, measured ceilings and recorded results.

On a GPU: the median of many timed runs after a warm-up (``triton.testing.do_bench``, CUDA events),
on inputs large enough that they do not fit in L2. Rates are reported against *measured* ceilings:
the copy bandwidth (bytes read + bytes written by a large device-to-device copy) and the bf16 matmul
rate. Under the interpreter nothing is timed — a programme that runs one block after another on the
CPU says nothing about a GPU — and the recorded GPU results shipped in ``fusionlab/recorded/`` are
shown instead, labelled with the device, date and versions that produced them.
"""

from __future__ import annotations

import datetime as _dt
import inspect
import json
import math
import textwrap
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import runtime
from .ledger import human_bytes

try:  # Triton kernels need Triton (Linux); without it there is nothing to time anyway
    from .kernels.fma_chain import fma_chain, fma_chain_flops
except ImportError:
    fma_chain = fma_chain_flops = None

RECORDED_DIR = Path(__file__).parent / "recorded"


class NotOnGPU(RuntimeError):
    """Raised instead of returning a meaningless interpreter time."""


def _require_gpu(what: str) -> None:
    # The mode decides, not a device argument: on a T4 in interpreter mode, CUDA is there but the
    # Triton kernels are not on it, and a timing would compare a GPU with the interpreter.
    if not runtime.is_gpu():
        raise NotOnGPU(
            f"{what}: nothing to time here ({runtime.MODE} mode, {runtime.REASON}). Interpreter "
            "timings measure Python, not a GPU; use fusionlab.bench.recorded(...) for GPU results."
        )


def time_ms(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median time of ``fn()`` in milliseconds, measured with CUDA events after a warm-up.

    Warm-up keeps compilation and autotuning out of the number. do_bench also flushes L2 between
    runs, so a tensor smaller than L2 is not timed from cache.
    """
    _require_gpu("time_ms")
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def wall_s(fn: Callable[[], object], calls: int) -> float:
    """Wall seconds of ``calls`` back-to-back calls of ``fn()``, the GPU queue drained at both ends
    (host and GPU together: whichever is slower sets it). GPU only."""
    _require_gpu("wall_s")
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


#: the word a suite adds to a case's name and group when :func:`queued_ms` times it (the GPU's clock
#: alone), beside the same case timed as a call
QUEUED = "queued"


def queued_ms(fn: Callable[[], object], *, calls: int = 20, rounds: int = 3) -> float:
    """GPU time per call of ``fn()`` with the host out of the way, in milliseconds (fastest of
    ``rounds``): a sleep kernel holds the stream while the host queues ``calls`` calls, which then run
    back to back between two events. Use it where one call costs the host more than the GPU (an
    autograd backward at moderate sizes): :func:`time_ms` then times the host. The sleep is twice the
    host's measured queueing time, so a host slower than that only makes the result larger, never
    smaller. No L2 flush between the calls: meant for tensors far larger than L2. A CUDA graph would
    do the same, but a ``torch.autograd.grad`` call does not capture (torch 2.11: "operation would
    make the legacy stream depend on a capturing blocking stream")."""
    _require_gpu("queued_ms")
    fn()
    host_s = wall_s(fn, calls)  # queueing and running together: an upper bound on queueing
    clock_hz = 2e9  # _sleep counts cycles; no data-centre GPU clocks faster, so the sleep is at least this long
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(rounds):
        torch.cuda._sleep(int(2 * host_s * clock_hz))
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / calls)
    return best


def peak_bytes(fn: Callable[..., object], *args, **kwargs) -> int:
    """Peak bytes allocated while ``fn(*args, **kwargs)`` runs, beyond what was allocated before it
    (``torch.cuda.max_memory_allocated``). The result of ``fn`` counts, since it is alive at the end;
    call ``fn`` once before to keep compilation out of the number. GPU only."""
    _require_gpu("peak_bytes")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn(*args, **kwargs)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak


def _positive_int(v, name: str, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"{name} must be a whole number >= {minimum}, got {v!r}")
    return v


def _finite(v, name: str, *, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (positive and v == 0):
        raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {v!r}")
    return float(v)


def gbps(nbytes: float, ms: float) -> float:
    """Achieved bandwidth in GB/s (1e9 bytes per second)."""
    return _finite(nbytes, "nbytes") / (_finite(ms, "ms", positive=True) * 1e-3) / 1e9


def tflops(flops: float, ms: float) -> float:
    return _finite(flops, "flops") / (_finite(ms, "ms", positive=True) * 1e-3) / 1e12


# -- ceilings -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ceilings:
    """What this GPU can do, measured: the two numbers every prediction divides by."""

    copy_GBps: float  # device-to-device copy, bytes read + bytes written
    matmul_TFLOPs: float  # bf16 (fp16 where bf16 is missing) square matmul through cuBLAS
    copy_bytes: int = 0
    matmul_n: int = 0
    matmul_dtype: str = "bfloat16"
    #: fp32 FMAs on the vector units (a long FMA chain per element): the ceiling of element-wise work,
    #: which never runs on tensor cores. 0 in recordings made before it was measured.
    vector_TFLOPs: float = 0.0

    @property
    def balance(self) -> float:
        """FLOPs per byte at the tensor cores' ridge: the matmul's balance point."""
        return self.matmul_TFLOPs * 1e12 / (self.copy_GBps * 1e9)

    @property
    def vector_balance(self) -> float:
        """FLOPs per byte at the vector units' ridge: the balance point of element-wise work."""
        if not self.vector_TFLOPs:
            raise ValueError("this recording has no vector-unit ceiling (made before it was measured)")
        return self.vector_TFLOPs * 1e12 / (self.copy_GBps * 1e9)


_CEILINGS: Ceilings | None = None


def measure_copy_bandwidth(nbytes: int = 2**30) -> float:
    """GB/s of ``y.copy_(x)`` on ``nbytes`` of fp32, counting the read and the write."""
    _require_gpu("measure_copy_bandwidth")
    _positive_int(nbytes, "nbytes", minimum=8)
    n = nbytes // 4
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    ms = time_ms(lambda: y.copy_(x))
    return gbps(2 * n * 4, ms)


def measure_matmul_rate(n: int = 8192, dtype=torch.bfloat16) -> float:
    """TFLOP/s of an n×n×n matmul on random data (zeros run faster than real data)."""
    _require_gpu("measure_matmul_rate")
    _positive_int(n, "n")
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    ms = time_ms(lambda: a @ b)
    return tflops(2 * n**3, ms)


def measure_vector_rate(n: int = 2**24, k: int = 2048) -> float:
    """TFLOP/s of ``k`` fp32 FMAs per element on ``n`` elements: far past the copy ceiling, so the
    vector units set the time."""
    _require_gpu("measure_vector_rate")
    x = torch.randn(_positive_int(n, "n"), device="cuda")
    fma_chain(x, k)  # compile before timing
    return tflops(fma_chain_flops(n, k), time_ms(lambda: fma_chain(x, k)))


def ceilings(refresh: bool = False, copy_bytes: int = 2**30, matmul_n: int = 8192) -> Ceilings:
    """Measured ceilings of this GPU (cached for the process); recorded ones under the interpreter."""
    global _CEILINGS
    if not runtime.is_gpu():
        return recorded().ceilings
    if _CEILINGS is None or refresh:
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        _CEILINGS = Ceilings(
            copy_GBps=measure_copy_bandwidth(copy_bytes),
            matmul_TFLOPs=measure_matmul_rate(matmul_n, dtype),
            copy_bytes=copy_bytes,
            matmul_n=matmul_n,
            matmul_dtype=str(dtype).replace("torch.", ""),
            vector_TFLOPs=measure_vector_rate(),
        )
    return _CEILINGS


# -- cases and results ----------------------------------------------------------------------------
@dataclass
class Case:
    """One thing to time: a thunk, the bytes it must move and the FLOPs it must do."""

    name: str
    fn: Callable[[], object]
    nbytes: float = 0
    flops: float = 0
    group: str = ""
    predicted_ms: float | None = None
    #: how to time it: :func:`time_ms` (do_bench, L2 flushed) unless named, e.g. :func:`queued_ms`
    timer: Callable[[Callable[[], object]], float] | None = None


@dataclass
class Result:
    name: str
    ms: float
    nbytes: float = 0
    flops: float = 0
    group: str = ""
    predicted_ms: float | None = None
    GBps: float | None = None
    TFLOPs: float | None = None
    frac_copy: float | None = None  # achieved bandwidth / measured copy bandwidth
    ms_rounds: list[float] | None = None  # each round's median when timed in several rounds

    @classmethod
    def of(cls, case: Case, ms: float, ceil: Ceilings | None) -> Result:
        r = cls(case.name, ms, case.nbytes, case.flops, case.group, case.predicted_ms)
        if case.nbytes:
            r.GBps = gbps(case.nbytes, ms)
            if ceil is not None:
                r.frac_copy = r.GBps / ceil.copy_GBps
        if case.flops:
            r.TFLOPs = tflops(case.flops, ms)
        return r


def run(
    cases: Iterable[Case], *, ceil: Ceilings | None = None, on_result=None, rounds: int = 1, **timing
) -> list[Result]:
    """Time each case in turn; ``on_result(result)`` is called as each one arrives (live bars).

    ``rounds > 1`` times the whole list again, round-robin, and keeps each case's fastest median:
    a slow spell of the machine (clocks, a neighbour) then has to hit the same case every round to
    show. ``Result.ms_rounds`` keeps every round's median, so the spread can be reported.
    """
    cases = list(cases)
    times: list[list[float]] = [[] for _ in cases]
    out: list[Result] = []
    for r in range(max(1, rounds)):
        last = r == max(1, rounds) - 1
        for i, case in enumerate(cases):
            times[i].append(case.timer(case.fn) if case.timer is not None else time_ms(case.fn, **timing))
            if last:  # report each case as soon as its final round is in
                res = Result.of(case, min(times[i]), ceil)
                res.ms_rounds = times[i] if len(times[i]) > 1 else None
                out.append(res)
                if on_result is not None:
                    on_result(res)
    return out


def table(results: Iterable[Result], baseline: str | None = None) -> str:
    results = list(results)
    base = next((r.ms for r in results if r.name == baseline), None)
    head = f"{'case':<34} {'ms':>8} {'GB/s':>8} {'% copy':>7} {'TFLOP/s':>8}" + (" vs base" if base else "")
    lines = [head]
    for r in results:
        cells = [
            f"{r.name:<34}",
            f"{r.ms:8.3f}",
            f"{r.GBps:8.0f}" if r.GBps else f"{'':8}",
            f"{100 * r.frac_copy:6.0f}%" if r.frac_copy else f"{'':7}",
            f"{r.TFLOPs:8.1f}" if r.TFLOPs else f"{'':8}",
        ]
        if base:
            cells.append(f"{r.ms / base:7.2f}x")
        lines.append(" ".join(cells))
    return "\n".join(lines)


# -- recorded results -----------------------------------------------------------------------------
@dataclass
class Recorded:
    """GPU results produced by ``python -m fusionlab.record`` and committed to the package."""

    meta: dict
    ceilings: Ceilings
    suites: dict[str, list[Result]] = field(default_factory=dict)
    path: Path | None = None

    def label(self) -> str:
        m = self.meta
        return (
            f"RECORDED on {m['device']} (sm_{m['capability'].replace('.', '')}), {m['date']}, "
            f"torch {m['torch']}, triton {m['triton']} — not measured on this machine"
        )

    def results(self, suite: str) -> list[Result]:
        if suite not in self.suites:
            raise KeyError(
                f"no recorded suite {suite!r} in {self.path.name if self.path else 'recording'}; "
                f"have: {', '.join(self.suites)}"
            )
        return self.suites[suite]

    def get(self, suite: str, name: str) -> Result:
        for r in self.results(suite):
            if r.name == name:
                return r
        raise KeyError(f"no case {name!r} in recorded suite {suite!r}")

    def to_json(self) -> dict:
        return {
            "meta": self.meta,
            "ceilings": asdict(self.ceilings),
            "suites": {k: [asdict(r) for r in v] for k, v in self.suites.items()},
        }

    @classmethod
    def from_json(cls, data: dict, path: Path | None = None) -> Recorded:
        suites = {k: [Result(**r) for r in v] for k, v in data["suites"].items()}
        return cls(data["meta"], Ceilings(**data["ceilings"]), suites, path)


def recorded_files() -> list[Path]:
    return sorted(RECORDED_DIR.glob("*.json"))


def recorded_runs() -> list[Recorded]:
    """Every recorded GPU run shipped with the package, oldest first. Files of one device and one day
    are one run: a recording of its suites one process at a time (``benchmarks/gpu_run.sh``)
    writes a file per suite, and they are read back together (suites merged; meta and ceilings from
    the file that holds the most suites, the first of them on a tie)."""
    groups: dict[tuple[str, str], list[Recorded]] = {}
    for p in recorded_files():
        r = Recorded.from_json(json.loads(p.read_text()), p)
        groups.setdefault((r.meta["device"], r.meta["date"]), []).append(r)
    runs = []
    for parts in groups.values():
        base = max(parts, key=lambda r: len(r.suites))  # max keeps the first of equals
        suites = {name: res for r in parts for name, res in r.suites.items()}
        meta = {**base.meta, "time": max(r.meta.get("time", "") for r in parts)}
        runs.append(Recorded(meta, base.ceilings, suites, base.path))
    return sorted(runs, key=lambda r: (r.meta["date"], r.meta.get("time", "")))


#: the suites a run of the whole course starts with: a run that holds them is a base for the CPU view
BASE_SUITES = ("lesson1", "lesson2", "lesson3")


def recorded(path: str | Path | None = None, *, device: str | None = None, suite: str | None = None) -> Recorded:
    """The recorded GPU run the CPU view is built on: the newest run that holds :data:`BASE_SUITES` (a
    later run of a few suites, a lesson recorded again, does not lend its label and ceilings to lessons
    it does not hold; where no run holds them, the newest of those that hold the most suites).
    ``device`` (e.g. ``"H100"``) picks among runs on a device whose name contains it; ``suite``, the
    newest run that holds that suite; ``path``, one file as it is."""
    if path is not None:
        p = Path(path)
        return Recorded.from_json(json.loads(p.read_text()), p)
    runs = recorded_runs()
    if device is not None:
        runs = [r for r in runs if device.lower() in r.meta["device"].lower()]
    if suite is not None:
        runs = [r for r in runs if suite in r.suites]
    if not runs:
        where = (f" on a device matching {device!r}" if device else "") + (f" with suite {suite!r}" if suite else "")
        raise FileNotFoundError(
            f"no recorded GPU results{where} in {RECORDED_DIR}; run `python -m fusionlab.record` on a GPU"
        )
    if suite is None:
        base = [r for r in runs if set(BASE_SUITES) <= set(r.suites)]
        most = max(len(r.suites) for r in runs)
        runs = base or [r for r in runs if len(r.suites) == most]
    return runs[-1]


def recorded_suite_ceilings(suite: str) -> Ceilings:
    """The ceilings recorded **with** suite ``suite``: those of the file that holds it, in the newest run
    that holds it. A run recorded one suite a process keeps one set of ceilings a file, and
    :func:`recorded_runs` lends the run one of them; a lesson's predictions must use the set its suite's
    own predictions (``predicted_ms``) were made with."""
    rec = recorded(suite=suite)
    best = None
    for p in recorded_files():
        data = json.loads(p.read_text())
        meta = data["meta"]
        if suite in data["suites"] and (meta["device"], meta["date"]) == (rec.meta["device"], rec.meta["date"]):
            if best is None or meta.get("time", "") >= best["meta"].get("time", ""):
                best = data
    return Ceilings(**best["ceilings"]) if best is not None else rec.ceilings


def metadata() -> dict:
    """Device, date and versions: what every recorded number carries."""
    info = runtime.info()
    now = _dt.datetime.now(_dt.timezone.utc)
    return {
        "device": info.device_name,
        "capability": info.capability or "cpu",
        "date": now.date().isoformat(),
        "time": now.strftime("%H:%M:%SZ"),
        "torch": info.torch,
        "triton": info.triton,
        "cuda": torch.version.cuda,
        "python": info.python,
        "command": "python -m fusionlab.record",
    }


def describe(res: Result, ceil: Ceilings) -> str:
    """One sentence for a result: time, bandwidth, fraction of the copy ceiling."""
    parts = [f"{res.name}: {res.ms:.3f} ms"]
    if res.GBps:
        parts.append(
            f"{res.GBps:.0f} GB/s ({100 * res.GBps / ceil.copy_GBps:.0f}% of copy, {human_bytes(res.nbytes)} moved)"
        )
    if res.TFLOPs:
        parts.append(f"{res.TFLOPs:.1f} TFLOP/s")
    return ", ".join(parts)


# -- one call for a lesson: live on a GPU, recorded elsewhere ----------------------------------------
def compiled(fn, *inputs):
    """``torch.compile(fn, dynamic=False)``, compiled and warmed on ``inputs`` outside any timing.

    ``dynamic=False``: one specialised kernel per shape, as a Triton kernel is; without it a second
    shape of the same function could trigger a dynamic-shape recompile with a slower kernel."""
    out = torch.compile(fn, dynamic=False)
    out(*inputs)
    return out


@dataclass
class SuiteRun:
    """A lesson's benchmark results, with where they come from."""

    suite: str
    results: list[Result]
    ceilings: Ceilings
    label: str
    live: bool
    #: the GPU the results come from (its name as torch gives it): configurations that differ between
    #: GPUs are asked for this one's
    device: str = ""

    def get(self, name: str) -> Result:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"no case {name!r} in suite {self.suite!r}; have: {', '.join(r.name for r in self.results)}")

    def ms(self, name: str) -> float:
        return self.get(name).ms

    def ratio(self, name: str, baseline: str) -> float:
        return self.ms(name) / self.ms(baseline)

    def table(self, baseline: str | None = None) -> str:
        # the label wraps at 100 columns, so a printed table never wraps mid-number in a narrow window
        return "\n".join([*textwrap.wrap(self.label, 100), table(self.results, baseline)])


def source_label() -> str:
    """Where this machine's lesson timings come from: measured here, or recorded elsewhere (and when)."""
    if runtime.is_gpu():
        return f"MEASURED here: {runtime.info().label()}"
    return recorded().label()


def ceiling_kwargs(make_cases: Callable, ceil: Ceilings) -> dict:
    """The measured ceilings that ``make_cases`` takes (by parameter name) to fill in predictions."""
    params = inspect.signature(make_cases).parameters
    have = {"copy_GBps": ceil.copy_GBps, "matmul_TFLOPs": ceil.matmul_TFLOPs, "vector_TFLOPs": ceil.vector_TFLOPs}
    return {k: v for k, v in have.items() if k in params}


#: rounds of a suite, live or recorded: the lessons report the spread of ``Result.ms_rounds``, so a live
#: run times as many rounds as the recording it stands in for
ROUNDS = 3


def measure_suite(suite: str, make_cases: Callable[..., list[Case]], on_result=None, **case_kwargs) -> SuiteRun:
    """Time ``make_cases()`` here if this is a GPU Triton supports; otherwise load suite ``suite`` of the
    recorded run. ``on_result`` is called per result either way, so live bars fill as numbers arrive
    (on a GPU) or all at once (recorded)."""
    if runtime.is_gpu():
        ceil = ceilings()
        cases = make_cases(**{**ceiling_kwargs(make_cases, ceil), **case_kwargs})
        results = run(cases, ceil=ceil, on_result=on_result, rounds=ROUNDS)
        return SuiteRun(suite, results, ceil, source_label(), live=True, device=runtime.info().device_name)
    try:
        rec = recorded(suite=suite)
    except FileNotFoundError as e:  # a lesson whose suite no recording holds yet
        raise KeyError(str(e)) from None
    results = rec.results(suite)
    for r in results:
        if on_result is not None:
            on_result(r)
    ceil = recorded_suite_ceilings(suite)  # the set its predictions were made with
    return SuiteRun(suite, results, ceil, rec.label(), live=False, device=rec.meta["device"])
