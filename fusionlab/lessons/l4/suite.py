"""Lesson 4 on a GPU: residual + RMSNorm (forward and backward), LayerNorm and the row softmax, bf16.

- Residual + RMSNorm forward at :data:`RMS_SHAPES` (rows × hidden): eager (Hugging Face's order, about
  nine kernels), ``torch.compile`` and the fused kernel; at the narrower shape also the fused kernel
  forced onto its two-pass path (``BLOCK_N`` = :data:`TWO_PASS_BLOCK` < N: a row "too wide for one
  tile", h re-read), and the fused kernel on :data:`FEW_ROWS` rows (one program a row: most SMs idle).
- Residual + RMSNorm backward (dx = d residual and dw, gradients arriving for both y and h): eager
  autograd, the compiled training graph and the fused kernels, each timed as the backward alone, twice:
  the call (``torch.autograd.grad``, host work included: do_bench) and the GPU's time alone
  (:data:`QUEUED`: twenty calls queued while a sleep kernel holds the GPU, then run back to back,
  :func:`fusionlab.bench.queued_ms`). Below about 8192 x 8192 one autograd call costs the host more
  than its kernels cost the GPU (``benchmarks/notes_rms_backward.md``), so the two differ.
- LayerNorm forward at :data:`LN_SHAPE`: ``F.layer_norm`` (itself one kernel), compiled, fused.
- Softmax forward at a narrow width (one tile) and a wide one (split across programs on a GPU, read
  once): eager ``torch.softmax``, compiled, fused, and the fused kernel forced onto one program a row
  (:data:`ONLINE`: the online path, read twice); and the fused kernel over :data:`SOFTMAX_SWEEP`
  widths at a fixed 256 MiB, both schedules past the one-tile limit, where its cliff shows.

``nbytes`` of every case is its op's **fused ledger** (what the fused kernel must move at that shape,
re-read term included), so "% of copy" is an effective bandwidth comparable across schedules.
``predicted_ms`` (with ``copy_GBps``): the bytes that *its* schedule moves over the measured copy
bandwidth: eager RMSNorm and its autograd from the unfused ledger, the rest from the fused one
(``F.layer_norm`` and ``torch.softmax`` are single kernels). Memory: a few GiB; GPU time about half a
minute plus the compiles (an estimate from the case count, before its first GPU run). :func:`bars`
reads the issue's speed bars off a run.
"""

from __future__ import annotations

import contextlib

import torch

from ...bench import QUEUED, Case, queued_ms
from ...kernels.layernorm import layernorm, layernorm_eager, layernorm_flops, layernorm_ledger
from ...kernels.rmsnorm import rmsnorm, rmsnorm_config, rmsnorm_eager, rmsnorm_flops, rmsnorm_ledger
from ...kernels.softmax import softmax, softmax_config, softmax_eager, softmax_flops, softmax_ledger
from ...ledger import Ledger

DTYPE = torch.bfloat16
EPS = 1e-6
#: rows × hidden: a long batch of a 4096-wide model (Llama-2-7B), fewer rows of an 8192-wide one
RMS_SHAPES = ((32768, 4096), (4096, 8192))
#: the two-pass path forced at RMS_SHAPES[1] with tiles of this width (the GPU's one tile holds 32768)
TWO_PASS_BLOCK = 4096
#: few rows of a wide hidden size: one program a row leaves most SMs idle
FEW_ROWS = (64, 16384)
LN_SHAPE = (32768, 4096)
#: softmax: a row that fits one tile, and one that does not (GPU tile limit 32768): split, or online
SOFTMAX_NARROW = (32768, 4096)
SOFTMAX_WIDE = (2048, 65536)
#: the row-width sweep: 256 MiB of bf16 at every width
SOFTMAX_SWEEP = (1024, 4096, 16384, 32768, 65536, 131072, 262144)
SWEEP_ELEMENTS = 2**27


def sweep_rows(n: int) -> int:
    """Rows of the sweep at width ``n``: :data:`SWEEP_ELEMENTS` elements in all."""
    return SWEEP_ELEMENTS // n


def shape_name(rows: int, n: int) -> str:
    return f"{rows}x{n}"


# the case names, one place (the notebook reads results back by them)
def rms_fwd(schedule: str, rows: int, n: int) -> str:
    return f"rms fwd {schedule} {shape_name(rows, n)}"


def rms_bwd(schedule: str, rows: int, n: int) -> str:
    return f"rms bwd {schedule} {shape_name(rows, n)}"


def ln_fwd(schedule: str) -> str:
    return f"ln fwd {schedule} {shape_name(*LN_SHAPE)}"


def sm_fwd(schedule: str, rows: int, n: int) -> str:
    return f"softmax {schedule} {shape_name(rows, n)}"


def sweep_name(n: int, online: bool = False) -> str:
    return f"softmax sweep {'online ' if online else ''}n={n}"


def split_on_gpu(rows: int, n: int) -> bool:
    """Whether the GPU kernel splits these rows across programs (else one program a row)."""
    return bool(softmax_config(rows, n, DTYPE, gpu=True).get("SPLIT"))


SCHEDULES = ("eager", "compiled", "fused")
TWO_PASS = "fused 2-pass"
#: the softmax forced onto one program a row (the online path) where the GPU would split the row
ONLINE = "fused online"


# -- ledgers (also what a CPU notebook uses to predict the GPU's bytes) ------------------------------------
def rms_fwd_ledger(rows: int, n: int, block: int | None = None) -> Ledger:
    """The forward's ledger at this shape: the GPU kernel's tile unless ``block`` forces another."""
    return rmsnorm_ledger(rows, n, DTYPE, residual=True, block=block)


def rms_bwd_ledger(rows: int, n: int) -> Ledger:
    """The backward's ledger (gradients for y and h), with the GPU kernel's number of dw partials."""
    programs = rmsnorm_config(rows, n, DTYPE, backward=True, gpu=True)["programs"]
    return rmsnorm_ledger(rows, n, DTYPE, backward=True, grad_h=True, programs=programs)


def sm_ledger(rows: int, n: int, split: bool = True) -> Ledger:
    """The softmax forward's ledger with the GPU kernel's schedule: rows on the online path get the
    re-read term; rows in one tile (a head and a tail too), or split across programs (``SPLIT``), are
    read once. ``split=False``: one program a row (the online path past one tile), as the lesson first
    counts it."""
    cfg = softmax_config(rows, n, DTYPE, gpu=True, split=split)
    once = cfg.get("SPLIT") or (cfg["SINGLE_TILE"] and cfg.get("TAIL_N"))
    return softmax_ledger(rows, n, DTYPE, block=n if once else cfg["BLOCK_N"])


def _predict(led: Ledger, copy_GBps: float | None, fused: bool) -> float | None:
    return led.predict_ms(copy_GBps, fused=fused) if copy_GBps else None


def _compile(fn):
    return torch.compile(fn, dynamic=False)  # one specialised graph a shape, as a Triton kernel is


@contextlib.contextmanager
def _no_donated_buffers():
    """The backward is timed alone, many times over one graph (``retain_graph=True``), which donated
    buffers forbid; the setting is read when the graph compiles (the first call, made under it) and
    changes no kernel of the backward."""
    try:
        import torch._functorch.config as fconfig
    except ImportError:  # pragma: no cover - older torch: nothing to switch off
        yield
        return
    if not hasattr(fconfig, "donated_buffer"):
        yield
        return
    with fconfig.patch(donated_buffer=False):
        yield


def _rand(shape, gen, device):
    return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(DTYPE)


# -- residual + RMSNorm -------------------------------------------------------------------------------------
def rms_inputs(rows: int, n: int, device="cuda") -> tuple[torch.Tensor, ...]:
    """``(x, r, dy, dh, w)`` for residual + RMSNorm at ``rows x n``: activations, residual and the two
    upstream gradients in bf16, a weight near 1; seeded by the shape, so a script that studies one of the
    suite's cases (``benchmarks/*rms_bwd*.py``) times the same inputs."""
    gen = torch.Generator(device=device).manual_seed(rows + n)
    x, r, dy, dh = (_rand((rows, n), gen, device) for _ in range(4))
    w = (1 + 0.1 * torch.randn(n, generator=gen, device=device)).to(DTYPE)
    return x, r, dy, dh, w


def rms_cases(copy_GBps: float | None = None, device="cuda") -> list[Case]:
    out = []
    comp_fwd = _compile(rmsnorm_eager)
    for rows, n in RMS_SHAPES:
        x, r, dy, dh, w = rms_inputs(rows, n, device)
        fwd, bwd = rms_fwd_ledger(rows, n), rms_bwd_ledger(rows, n)
        group = f"rms fwd {shape_name(rows, n)}"
        flops = rmsnorm_flops(rows, n)
        with torch.no_grad():
            comp_fwd(x, w, EPS, r)  # compile outside the timing
            rmsnorm(x, w, EPS, r)
        thunks = {
            "eager": lambda x=x, r=r, w=w: rmsnorm_eager(x, w, EPS, r),
            "compiled": lambda x=x, r=r, w=w: comp_fwd(x, w, EPS, r),
            "fused": lambda x=x, r=r, w=w: rmsnorm(x, w, EPS, r),
        }
        for schedule, fn in thunks.items():
            predicted = _predict(fwd, copy_GBps, fused=schedule != "eager")
            out.append(Case(rms_fwd(schedule, rows, n), _no_grad(fn), fwd.fused_bytes, flops, group, predicted))
        if n > TWO_PASS_BLOCK:
            two = rms_fwd_ledger(rows, n, block=TWO_PASS_BLOCK)
            cfg = {"BLOCK_N": TWO_PASS_BLOCK}
            fn = _no_grad(lambda x=x, r=r, w=w, cfg=cfg: rmsnorm(x, w, EPS, r, fwd_config=cfg))
            fn()
            out.append(
                Case(rms_fwd(TWO_PASS, rows, n), fn, two.fused_bytes, flops, group, _predict(two, copy_GBps, True))
            )

        # backward alone: the forward's graph kept, gradients for y and h
        group = f"rms bwd {shape_name(rows, n)}"
        flops = rmsnorm_flops(rows, n, backward=True)
        xg, rg, wg = (t.clone().requires_grad_() for t in (x, r, w))
        comp_train = _compile(rmsnorm_eager)
        with _no_donated_buffers():
            outs = {
                "eager": rmsnorm_eager(xg, wg, EPS, rg),
                "compiled": comp_train(xg, wg, EPS, rg),
                "fused": rmsnorm(xg, wg, EPS, rg),
            }
            for schedule, (y, h) in outs.items():
                fn = _grad_thunk((y, h), (xg, wg, rg), (dy, dh))
                fn()  # the backward compiles here (Inductor's, Triton's)
                predicted = _predict(bwd, copy_GBps, fused=schedule != "eager")
                out.append(Case(rms_bwd(schedule, rows, n), fn, bwd.fused_bytes, flops, group, predicted))
            for schedule, (y, h) in outs.items():  # the same calls, the host queued ahead of the GPU
                fn = _grad_thunk((y, h), (xg, wg, rg), (dy, dh))
                predicted = _predict(bwd, copy_GBps, fused=schedule != "eager")
                name = rms_bwd(f"{schedule} {QUEUED}", rows, n)
                out.append(Case(name, fn, bwd.fused_bytes, flops, f"{group} {QUEUED}", predicted, queued_ms))

    rows, n = FEW_ROWS
    gen = torch.Generator(device=device).manual_seed(7)
    x, r = _rand((rows, n), gen, device), _rand((rows, n), gen, device)
    w = torch.ones(n, device=device, dtype=DTYPE)
    fwd = rms_fwd_ledger(rows, n)
    fn = _no_grad(lambda: rmsnorm(x, w, EPS, r))
    fn()
    out.append(
        Case(
            rms_fwd("fused", rows, n),
            fn,
            fwd.fused_bytes,
            rmsnorm_flops(rows, n),
            "rms fwd few rows",
            _predict(fwd, copy_GBps, True),
        )
    )
    return out


def _no_grad(fn):
    def run():
        with torch.no_grad():
            return fn()

    return run


def _grad_thunk(outputs, inputs, grads):
    return lambda: torch.autograd.grad(outputs, inputs, grads, retain_graph=True)


# -- LayerNorm ----------------------------------------------------------------------------------------------
def ln_cases(copy_GBps: float | None = None, device="cuda") -> list[Case]:
    rows, n = LN_SHAPE
    gen = torch.Generator(device=device).manual_seed(11)
    x = _rand((rows, n), gen, device)
    w, b = _rand(n, gen, device), _rand(n, gen, device)
    led = layernorm_ledger(rows, n, DTYPE)
    comp = _compile(layernorm_eager)
    with torch.no_grad():
        comp(x, w, b)
        layernorm(x, w, b)
    thunks = {
        "eager": lambda: layernorm_eager(x, w, b),
        "compiled": lambda: comp(x, w, b),
        "fused": lambda: layernorm(x, w, b),
    }
    flops, group, predicted = layernorm_flops(rows, n), "ln fwd", _predict(led, copy_GBps, True)
    return [Case(ln_fwd(s), _no_grad(fn), led.fused_bytes, flops, group, predicted) for s, fn in thunks.items()]


# -- softmax ------------------------------------------------------------------------------------------------
def softmax_cases(copy_GBps: float | None = None, device="cuda") -> list[Case]:
    out = []
    gen = torch.Generator(device=device).manual_seed(13)
    for rows, n in (SOFTMAX_NARROW, SOFTMAX_WIDE):
        x = _rand((rows, n), gen, device) * 3
        led = sm_ledger(rows, n)
        comp = _compile(softmax_eager)
        with torch.no_grad():
            comp(x)
            softmax(x)
        thunks = {
            "eager": lambda x=x: softmax_eager(x),
            "compiled": lambda x=x, comp=comp: comp(x),
            "fused": lambda x=x: softmax(x),
        }
        group, flops = f"softmax {shape_name(rows, n)}", softmax_flops(rows, n)
        # torch.softmax and the compiled kernel are one kernel each: the fused ledger is their floor too
        predicted = _predict(led, copy_GBps, True)
        out += [
            Case(sm_fwd(s, rows, n), _no_grad(fn), led.fused_bytes, flops, group, predicted) for s, fn in thunks.items()
        ]
        if split_on_gpu(rows, n):  # the same rows, one program a row: read twice
            online = sm_ledger(rows, n, split=False)
            fn = _no_grad(lambda x=x: softmax(x, split=False))
            fn()
            out.append(
                Case(sm_fwd(ONLINE, rows, n), fn, online.fused_bytes, flops, group, _predict(online, copy_GBps, True))
            )
    for n in SOFTMAX_SWEEP:
        rows = sweep_rows(n)
        x = _rand((rows, n), gen, device) * 3
        for online in (False, True) if split_on_gpu(rows, n) else (False,):
            led = sm_ledger(rows, n, split=not online)
            fn = _no_grad(lambda x=x, online=online: softmax(x, split=not online))
            fn()
            out.append(
                Case(
                    sweep_name(n, online),
                    fn,
                    led.fused_bytes,
                    softmax_flops(rows, n),
                    "softmax sweep",
                    _predict(led, copy_GBps, True),
                )
            )
    return out


def cases(copy_GBps: float | None = None, device="cuda") -> list[Case]:
    """All lesson 4 cases. With the measured copy bandwidth (``fusionlab.bench.ceilings()``) each case
    also carries ``predicted_ms``."""
    import torch._dynamo

    # one compiled function a shape (dynamic=False): more than dynamo's default of 8 recompiles a code
    # object would silently fall back to eager
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))
    return [*rms_cases(copy_GBps, device), *ln_cases(copy_GBps, device), *softmax_cases(copy_GBps, device)]


def bars(results) -> list[tuple[str, bool, str]]:
    """The issue's speed bars at this suite's shapes, read off a run (live or recorded): ``(bar, met,
    detail)``. Shares of copy are by the fused ledger (``Result.frac_copy``); "x compiled" is compiled
    time over fused time; the wide softmax's rate is its time per element against the narrow one's."""
    r = {x.name: x for x in results}
    out = []
    for rows, n in RMS_SHAPES:
        shape = shape_name(rows, n)
        fused, comp = r[rms_fwd("fused", rows, n)], r[rms_fwd("compiled", rows, n)]
        out.append((f"rms fwd {shape} >= 90% of copy", fused.frac_copy >= 0.90, f"{fused.frac_copy:.1%}"))
        out.append((f"rms fwd {shape} >= 1.0x compiled", comp.ms >= fused.ms, f"{comp.ms / fused.ms:.3f}x"))
        # the backward's share of copy is the GPU's (calls queued ahead); the call's, host work included,
        # is shown beside it. "x compiled" holds for both: the call and the GPU time.
        call, gpu = r[rms_bwd("fused", rows, n)], r.get(rms_bwd(f"fused {QUEUED}", rows, n))
        if gpu is None:  # a run recorded before the queued cases existed: the call is all there is
            out.append((f"rms bwd {shape} >= 75% of copy", call.frac_copy >= 0.75, f"{call.frac_copy:.1%} (call)"))
        else:
            detail = f"{gpu.frac_copy:.1%} (the call, host work included: {call.frac_copy:.1%})"
            out.append((f"rms bwd {shape} >= 75% of copy (GPU time)", gpu.frac_copy >= 0.75, detail))
        pairs = [("call", call, r[rms_bwd("compiled", rows, n)])]
        if gpu is not None:
            pairs.append(("GPU time", gpu, r[rms_bwd(f"compiled {QUEUED}", rows, n)]))
        for how, ours, theirs in pairs:
            out.append(
                (f"rms bwd {shape} >= 1.0x compiled ({how})", theirs.ms >= ours.ms, f"{theirs.ms / ours.ms:.3f}x")
            )
    ln = r[ln_fwd("fused")]
    out.append(("ln fwd >= 90% of copy", ln.frac_copy >= 0.90, f"{ln.frac_copy:.1%}"))
    narrow, comp = r[sm_fwd("fused", *SOFTMAX_NARROW)], r[sm_fwd("compiled", *SOFTMAX_NARROW)]
    out.append(("softmax narrow >= 90% of copy", narrow.frac_copy >= 0.90, f"{narrow.frac_copy:.1%}"))
    out.append(("softmax narrow >= 1.0x compiled", comp.ms >= narrow.ms, f"{comp.ms / narrow.ms:.3f}x"))
    for n in (w for w in SOFTMAX_SWEEP if w <= 32768):  # "up to 32k", by the fewest bytes: read x, write y
        case = r[sweep_name(n)]
        share = case.frac_copy * (2 * SWEEP_ELEMENTS * DTYPE.itemsize) / case.nbytes
        out.append((f"softmax n={n} >= 90% of copy (read x + write y)", share >= 0.90, f"{share:.1%}"))
    wide = r[sm_fwd("fused", *SOFTMAX_WIDE)]
    rate = (narrow.ms / (SOFTMAX_NARROW[0] * SOFTMAX_NARROW[1])) / (wide.ms / (SOFTMAX_WIDE[0] * SOFTMAX_WIDE[1]))
    out.append(("softmax wide >= 0.8x the narrow rate per element", rate >= 0.8, f"{rate:.2f}x"))
    return out
