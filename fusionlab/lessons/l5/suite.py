"""Lesson 5 on a GPU: SwiGLU, cross-entropy over a large vocabulary, linear + cross-entropy, and the
peak memory of cross-entropy against the vocabulary. All in bf16.

- SwiGLU ``silu(g) * u`` at 8192 × 14336 (a Llama-3-8B MLP's width): forward and backward, eager,
  compiled and fused, plus eager's two forward kernels one at a time. ``nbytes``: the fused ledger
  (forward 3N, backward 5N elements); ``predicted_ms``: the bytes *its* schedule moves (eager 5N and
  9N) over the copy bandwidth.
- Cross-entropy forward + backward at 8192 tokens × 32000 and × 128256: eager ``F.cross_entropy``,
  compiled, fused (gradient in a new buffer), fused in place (over the logits), and the fused loss
  alone (no gradient: one read). ``nbytes``: the fused ledger of a row kept on chip (read the logits
  once, write the gradient once); eager's prediction is its six (T, V) trips. Fused and compiled are
  timed a second time on the GPU's clock alone (:data:`QUEUED`: calls queued behind a sleep kernel,
  :func:`fusionlab.bench.queued_ms`): one autograd call costs the host a few hundred microseconds, as
  much as the kernel at 32000 columns, and the 85% bar is about the kernel.
- Linear + cross-entropy at 8192 × 4096 → 128256: eager against the chunked kernel. Compute-bound:
  ``flops`` = the three matmuls, ``predicted_ms`` = their FLOPs at the matmul rate plus the loss's trips
  at the copy bandwidth (eager six, fused two).

**Peak memory** is recorded through the cases of group :data:`PEAK_GROUP`: for those, ``nbytes`` is not
traffic but the peak bytes allocated by one forward + backward beyond what was allocated before it
(the gradient it returns included), measured with ``torch.cuda.max_memory_allocated`` when the case
is built; their ``ms`` is that forward + backward's time, and their GB/s means nothing.
:func:`peaks_from` reads them back from a run, live or recorded. :func:`peak_memory` measures the same
on a GPU without timing anything.

Memory: about 20 GB of GPU memory while the suite runs (its inputs, plus eager's temporaries).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...bench import QUEUED, Case, compiled, peak_bytes, queued_ms
from ...kernels.cross_entropy import (
    cross_entropy,
    cross_entropy_eager,
    cross_entropy_flops,
    cross_entropy_ledger,
)
from ...kernels.linear_cross_entropy import (
    linear_cross_entropy,
    linear_cross_entropy_eager,
    linear_cross_entropy_flops,
)
from ...kernels.swiglu import swiglu, swiglu_eager, swiglu_flops, swiglu_ledger
from ...ledger import Ledger

DTYPE = torch.bfloat16
SWIGLU_SHAPE = (8192, 14336)  # tokens × MLP width
CE_TOKENS = 8192
CE_VOCABS = (32000, 128256)  # Llama 2's vocabulary, Llama 3's
LCE_SHAPE = (8192, 4096, 128256)  # tokens, hidden width, vocabulary
#: the peak-memory sweep: fewer tokens, so that the widest vocabulary's logits are 1 GiB
PEAK_TOKENS = 2048
PEAK_VOCABS = (8192, 32000, 65536, 128256, 262144)
PEAK_VARIANTS = ("eager", "fused", "fused in place")
PEAK_GROUP = "peak memory"
LCE_PEAK_VARIANTS = ("linear+ce eager", "linear+ce fused")


def peak_name(variant: str, vocab: int | None = None) -> str:
    """The case name of a peak-memory measurement (``vocab`` for the cross-entropy sweep)."""
    return f"peak {variant}" if vocab is None else f"peak ce {vocab} {variant}"


@dataclass(frozen=True)
class Peak:
    """One peak-memory measurement: bytes allocated at the peak of one forward + backward, beyond what
    was allocated before it (the returned gradient included)."""

    variant: str
    tokens: int
    vocab: int
    peak_bytes: int


def _predict(led: Ledger, copy_GBps: float | None, fused: bool) -> float | None:
    return led.predict_ms(copy_GBps, fused=fused) if copy_GBps else None


def _grad(loss_fn: Callable[[], torch.Tensor], wrt) -> Callable[[], object]:
    """A forward + backward thunk: the gradient of ``loss_fn()`` with respect to ``wrt``."""
    return lambda: torch.autograd.grad(loss_fn(), wrt)


def _loss_only(x, t):
    with torch.no_grad():  # no gradient wanted: the fused kernel reads the logits once
        return cross_entropy(x, t)


# -- SwiGLU ---------------------------------------------------------------------------------------------
def swiglu_cases(copy_GBps: float | None = None, device="cuda") -> list[Case]:
    rows, cols = SWIGLU_SHAPE
    gen = torch.Generator(device=device).manual_seed(0)
    g, u, dh = (torch.randn(rows, cols, device=device, dtype=DTYPE, generator=gen) for _ in range(3))
    n = rows * cols
    fwd, bwd = swiglu_ledger(n, DTYPE), swiglu_ledger(n, DTYPE, backward=True)
    silu_led = Ledger.chain(["silu"], n, DTYPE, x="g")  # eager's first kernel: read g, write s
    mul_led = Ledger(dtype_bytes=DTYPE).op("mul", reads={"s": n, "u": n}, writes={"h": n})  # the second
    s = F.silu(g)
    comp_fwd = compiled(swiglu_eager, g, u)  # the inference graph
    gr, ur = g.clone().requires_grad_(), u.clone().requires_grad_()
    comp_train = torch.compile(swiglu_eager, dynamic=False)  # the training graph: forward and backward
    outs = {"eager": swiglu_eager(gr, ur), "compiled": comp_train(gr, ur), "fused": swiglu(gr, ur)}

    def bwd_thunk(h):  # the backward alone, the forward's graph kept
        return lambda: torch.autograd.grad(h, (gr, ur), dh, retain_graph=True)

    for h in outs.values():
        bwd_thunk(h)()  # compile (Triton, Inductor's backward) before timing
    swiglu(g, u)
    f_fl, b_fl = swiglu_flops(n), swiglu_flops(n, backward=True)
    out = [
        Case(
            "swiglu fwd eager",
            lambda: swiglu_eager(g, u),
            fwd.fused_bytes,
            f_fl,
            "swiglu fwd",
            _predict(fwd, copy_GBps, False),
        ),
        Case(
            "swiglu fwd compiled",
            lambda: comp_fwd(g, u),
            fwd.fused_bytes,
            f_fl,
            "swiglu fwd",
            _predict(fwd, copy_GBps, True),
        ),
        Case(
            "swiglu fwd fused",
            lambda: swiglu(g, u),
            fwd.fused_bytes,
            f_fl,
            "swiglu fwd",
            _predict(fwd, copy_GBps, True),
        ),
        # eager's two kernels one at a time: does each run at the copy bandwidth?
        Case(
            "swiglu fwd: eager silu alone",
            lambda: F.silu(g),
            silu_led.fused_bytes,
            0,
            "swiglu fwd",
            _predict(silu_led, copy_GBps, True),
        ),
        Case(
            "swiglu fwd: eager mul alone",
            lambda: s * u,
            mul_led.fused_bytes,
            0,
            "swiglu fwd",
            _predict(mul_led, copy_GBps, True),
        ),
    ]
    for schedule, h in outs.items():
        fused = schedule != "eager"
        out.append(
            Case(
                f"swiglu bwd {schedule}",
                bwd_thunk(h),
                bwd.fused_bytes,
                b_fl,
                "swiglu bwd",
                _predict(bwd, copy_GBps, fused),
            )
        )
    return out


# -- cross-entropy ----------------------------------------------------------------------------------------
def _ce_inputs(tokens: int, vocab: int, device, seed: int = 0):
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, vocab, device=device, dtype=DTYPE, generator=gen) * 2
    t = torch.randint(0, vocab, (tokens,), device=device, generator=gen)
    return x, t


def _ce_thunks(tokens: int, vocab: int, device, timed: bool = False) -> dict[str, Callable[[], object]]:
    """Forward + backward of eager, fused (gradient in a new buffer) and fused in place (over the logits;
    each call overwrites the logits with their gradient, which serves as the next call's logits). With
    ``timed``, also compiled and the fused loss alone (no gradient), on the same logits."""
    x, t = _ce_inputs(tokens, vocab, device)
    xg = x.requires_grad_()
    xi = x.detach().clone().requires_grad_()
    thunks = {
        "eager": _grad(lambda: F.cross_entropy(xg, t), xg),
        "fused": _grad(lambda: cross_entropy(xg, t), xg),
        "fused in place": _grad(lambda: cross_entropy(xi, t, inplace_grad=True), xi),
    }
    if timed:
        comp = torch.compile(cross_entropy_eager, dynamic=False)
        thunks["compiled"] = _grad(lambda: comp(xg, t), xg)
        thunks["fused loss only"] = lambda: _loss_only(xg, t)
    for fn in thunks.values():
        fn()  # compile before timing or measuring: the numbers of a run, not of the compiler
    return thunks


def ce_cases(copy_GBps: float | None = None, device="cuda", tokens: int = CE_TOKENS, vocabs=CE_VOCABS) -> list[Case]:
    out = []
    for vocab in vocabs:
        thunks = _ce_thunks(tokens, vocab, device, timed=True)
        # a row kept on chip: read the logits once, write the gradient once (the bar's bytes)
        led = cross_entropy_ledger(tokens, vocab, DTYPE, head=vocab)
        fwd = cross_entropy_ledger(tokens, vocab, DTYPE, backward=False, head=vocab)
        group, flops = f"ce {vocab}", cross_entropy_flops(tokens, vocab)
        for schedule in ("eager", "compiled", "fused", "fused in place"):
            predicted = _predict(led, copy_GBps, fused=schedule != "eager")
            out.append(Case(f"ce {vocab} {schedule}", thunks[schedule], led.fused_bytes, flops, group, predicted))
        for schedule in ("compiled", "fused"):  # the same calls, the host queued ahead of the GPU
            predicted = _predict(led, copy_GBps, fused=True)
            name, qgroup = f"ce {vocab} {schedule} {QUEUED}", f"{group} {QUEUED}"
            out.append(Case(name, thunks[schedule], led.fused_bytes, flops, qgroup, predicted, queued_ms))
        fwd_flops = cross_entropy_flops(tokens, vocab, backward=False)
        predicted = _predict(fwd, copy_GBps, fused=True)
        out.append(
            Case(f"ce {vocab} fused loss only", thunks["fused loss only"], fwd.fused_bytes, fwd_flops, group, predicted)
        )
    return out


# -- linear + cross-entropy ---------------------------------------------------------------------------------
def _lce_thunks(device) -> dict[str, Callable[[], object]]:
    tokens, hidden, vocab = LCE_SHAPE
    gen = torch.Generator(device=device).manual_seed(3)
    h = torch.randn(tokens, hidden, device=device, dtype=DTYPE, generator=gen).requires_grad_()
    w = (torch.randn(vocab, hidden, device=device, generator=gen) * hidden**-0.5).to(DTYPE).requires_grad_()
    t = torch.randint(0, vocab, (tokens,), device=device, generator=gen)
    t[::10] = -100  # padding, as a real batch has
    thunks = {
        "eager": _grad(lambda: linear_cross_entropy_eager(h, w, t), (h, w)),
        "fused": _grad(lambda: linear_cross_entropy(h, w, t), (h, w)),
    }
    for fn in thunks.values():
        fn()
    return thunks


def lce_cases(copy_GBps=None, matmul_TFLOPs=None, device="cuda", thunks=None) -> list[Case]:
    tokens, hidden, vocab = LCE_SHAPE
    thunks = thunks or _lce_thunks(device)
    flops = linear_cross_entropy_flops(tokens, hidden, vocab)
    loss = cross_entropy_ledger(tokens, vocab, DTYPE, head=vocab)

    def predict(fused: bool) -> float | None:
        if not (copy_GBps and matmul_TFLOPs):
            return None
        return flops / (matmul_TFLOPs * 1e12) * 1e3 + loss.predict_ms(copy_GBps, fused=fused)

    return [Case(f"linear+ce {k}", fn, 0, flops, "linear+ce", predict(k != "eager")) for k, fn in thunks.items()]


# -- peak memory --------------------------------------------------------------------------------------------
def _peaks(tokens, vocabs, device, lce_thunks=None) -> list[tuple[Peak, Callable[[], object]]]:
    out = []
    for vocab in vocabs:
        for variant, fn in _ce_thunks(tokens, vocab, device).items():
            out.append((Peak(variant, tokens, vocab, peak_bytes(fn)), fn))
    if lce_thunks is not None:
        t, _, v = LCE_SHAPE
        for variant, fn in zip(LCE_PEAK_VARIANTS, lce_thunks.values(), strict=True):
            out.append((Peak(variant, t, v, peak_bytes(fn)), fn))
    return out


def peak_memory(tokens: int = PEAK_TOKENS, vocabs: Iterable[int] = PEAK_VOCABS, device="cuda") -> list[Peak]:
    """Peak bytes of one cross-entropy forward + backward (bf16 logits, ``tokens`` × each vocabulary),
    eager and fused, measured on this GPU (``torch.cuda.max_memory_allocated``; GPU only)."""
    return [p for p, _ in _peaks(tokens, tuple(vocabs), device)]


def peak_cases(device="cuda", lce_thunks=None) -> list[Case]:
    """The peak-memory sweep as cases of group :data:`PEAK_GROUP` (``nbytes`` = the peak; see the module
    docstring), so that a recording keeps it."""
    out = []
    for p, fn in _peaks(PEAK_TOKENS, PEAK_VOCABS, device, lce_thunks):
        vocab = p.vocab if p.variant in PEAK_VARIANTS else None
        out.append(Case(peak_name(p.variant, vocab), fn, p.peak_bytes, 0, PEAK_GROUP))
    return out


def peaks_from(results) -> list[Peak]:
    """The peak-memory measurements of a run (``SuiteRun.results`` or a recorded suite), in sweep order;
    empty when the run has none."""
    by_name = {r.name: r for r in results}
    out = []
    for vocab in PEAK_VOCABS:
        for variant in PEAK_VARIANTS:
            r = by_name.get(peak_name(variant, vocab))
            if r is not None:
                out.append(Peak(variant, PEAK_TOKENS, vocab, int(r.nbytes)))
    t, _, v = LCE_SHAPE
    for variant in LCE_PEAK_VARIANTS:
        r = by_name.get(peak_name(variant))
        if r is not None:
            out.append(Peak(variant, t, v, int(r.nbytes)))
    return out


def cases(copy_GBps: float | None = None, matmul_TFLOPs: float | None = None, device="cuda") -> list[Case]:
    """All lesson 5 cases. With the measured ceilings (``fusionlab.bench.ceilings()``) each timing case
    also carries ``predicted_ms``."""
    lce = _lce_thunks(device)
    return [
        *swiglu_cases(copy_GBps, device),
        *ce_cases(copy_GBps, device),
        *lce_cases(copy_GBps, matmul_TFLOPs, device, lce),
        *peak_cases(device, lce),
    ]


def bars(results) -> list[tuple[str, bool, str]]:
    """The issue's bars at this suite's shapes, read off a run (live or recorded): ``(bar, met, detail)``.
    Shares of copy are by the fused ledger (``Result.frac_copy``: cross-entropy's two trips, read the
    logits and write the gradient); "x compiled" is compiled time over fused time, a 1% difference
    counted as a tie; peaks are beyond what existed before the call, the returned gradient included."""
    r = {x.name: x for x in results}
    out = []
    fwd, bwd, comp = r["swiglu fwd fused"], r["swiglu bwd fused"], r["swiglu fwd compiled"]
    out.append(("swiglu fwd >= 90% of copy", fwd.frac_copy >= 0.90, f"{fwd.frac_copy:.1%}"))
    out.append(("swiglu fwd >= 1.0x compiled (1% tie)", comp.ms >= 0.99 * fwd.ms, f"{comp.ms / fwd.ms:.3f}x"))
    out.append(("swiglu bwd >= 80% of copy", bwd.frac_copy >= 0.80, f"{bwd.frac_copy:.1%}"))
    for vocab in CE_VOCABS:
        fused = r[f"ce {vocab} fused"]
        gpu = r.get(f"ce {vocab} fused {QUEUED}")
        if gpu is None:  # a run recorded before the queued cases existed: the call is all there is
            out.append((f"ce {vocab} fwd+bwd >= 85% of copy", fused.frac_copy >= 0.85, f"{fused.frac_copy:.1%}"))
        else:  # the bar on the GPU's clock; the call's share, host work included, beside it
            detail = f"{gpu.frac_copy:.1%} on the GPU clock ({fused.frac_copy:.1%} a call)"
            out.append((f"ce {vocab} fwd+bwd >= 85% of copy (GPU time)", gpu.frac_copy >= 0.85, detail))
        for other in ("compiled", "eager"):
            o = r[f"ce {vocab} {other}"]
            out.append((f"ce {vocab} >= 1.0x {other}", o.ms >= fused.ms, f"{o.ms / fused.ms:.2f}x"))
    peaks = {(p.variant, p.vocab): p.peak_bytes for p in peaks_from(results)}
    for vocab in PEAK_VOCABS:
        if ("fused", vocab) not in peaks:
            continue
        logits = PEAK_TOKENS * vocab * DTYPE.itemsize
        extra = max(peaks[("fused", vocab)] - logits, peaks[("fused in place", vocab)]) / logits
        out.append((f"ce {vocab} peak beyond the gradient <= 10% of the logits", extra <= 0.10, f"{extra:.1%}"))
    t, _, v = LCE_SHAPE
    if ("linear+ce eager", v) in peaks:
        ratio = peaks[("linear+ce fused", v)] / peaks[("linear+ce eager", v)]
        out.append(("linear+ce peak <= 1/4 of eager's", ratio <= 0.25, f"{ratio:.2f}x"))
    e, f = r["linear+ce eager"], r["linear+ce fused"]
    out.append(("linear+ce time <= 1.3x eager's", f.ms <= 1.3 * e.ms, f"{f.ms / e.ms:.2f}x"))
    return out
