"""Checkers for lesson 4's exercises (solutions/04_fused_reductions.ipynb).

1. ``check_add_rmsnorm``: residual-add + RMSNorm forward in **one** kernel: ``h = x + r`` and
   ``y = h * rsqrt(mean(h²) + eps) * w``, both written. Rejects a missing residual (x normalised instead
   of h), the residual sum not written back, ``eps`` outside the square root (added to the rms, or to
   its reciprocal), statistics from one tile of a row wider than the kernel's tile, and two kernels.
2. ``check_softmax``: the row softmax, one kernel. Rejects no max subtraction (logits near 1e4), a max that
   is no logit of the row (lanes past its end loaded as 0, or a max started at 0: logits near -1e4), lanes
   past the row's end that count in the sum (loaded as 0, not -inf) or are read or written unmasked,
   and torch doing the work. Rows with masked (-inf) entries must work; a row masked entirely has no
   softmax: NaN (as torch gives) and 0 (as attention kernels write) are both accepted.
3. ``check_fused_bytes``: the bytes of the fused residual + RMSNorm forward, re-read term included.
"""

from __future__ import annotations

import torch

from ... import bench, grading, runtime
from ...grading import CheckFailed, call_learner, fail, number
from ...kernels.rmsnorm import DEFAULT_SMS, rmsnorm_ledger, rmsnorm_reference
from ...kernels.softmax import softmax_reference
from ...ledger import dtype_bytes, human_bytes
from ..l1 import regimes
from .suite import SWEEP_ELEMENTS, sweep_name

Passed, _passed = grading.Passed, grading.passed


def _run(fn, args, name, where, seed):
    """Call the answer in the sandbox; refuse what no fused answer does (whatever the numbers)."""
    return grading.run_answer(
        fn,
        args,
        name=name,
        where=where,
        seed=seed,
        store_hint="Mask every store (offs < n_cols): the last block of a row hangs over its end.",
        torch_message=lambda ops: (
            f"torch does part of the work ({ops}). Each torch op is a pass through memory "
            "of its own: do it inside your kernel, and allocate outputs with torch.empty_like."
        ),
    )


def _one_launch(box, out, where, seed, needed, what: str) -> None:
    grading.require_launches(
        box,
        out,
        needed,
        where,
        seed,
        why=f"{what} Each extra kernel is another round trip through HBM: fuse them into one.",
    )


def _tensor(out, like, what, where, seed) -> torch.Tensor:
    if not isinstance(out, torch.Tensor) or out.shape != like.shape or out.dtype != like.dtype:
        got = f"{tuple(out.shape)} {grading.dtype_name(out.dtype)}" if isinstance(out, torch.Tensor) else type(out)
        raise fail(
            f"{where}: {what} should be a tensor like x ({tuple(like.shape)}, {grading.dtype_name(like.dtype)}), "
            f"got {got}.",
            seed,
        )
    return out


def _close(a: torch.Tensor, b: torch.Tensor, dtype) -> bool:
    atol, rtol = grading.tolerance(dtype)
    return bool(grading._isclose(a.double().cpu(), b.double().cpu(), atol=atol, rtol=rtol, equal_nan=True).all())


# -- exercise 1: residual + RMSNorm, one kernel ---------------------------------------------------------
#: (rows, N) that fit one tile of any kernel a learner writes (one element, odd widths) ...
RMS_NARROW = ((1, 1), (7, 5), (37, 129), (130, 1000))
#: ... and rows wider than the tile of the lesson's kernel (BLOCK_N of at most 1024 or 4096), the last
#: wider than any one tile a kernel might hard-code instead of walking the row (a GPU's is 32768 at most)
RMS_WIDE = ((3, 4097), (2, 12_345), (2, 40_009))
#: many programs at one row each
RMS_MANY = (1031, 64)
#: an eps large enough beside a mean square near 1 that where it sits shows
BIG_EPS = 0.25


#: the mean of x in the fp16 cases: h² near 300² overflows fp16 (65504), so a sum of squares formed in
#: the input's dtype instead of fp32 shows, where N(0, 9) rows would leave it inside fp16's tolerance
FP16_MEAN = 300.0


def rms_inputs(shape, dtype, gen, scale: float = 3.0, mean: float = 0.0):
    """``x, r, w``: rows of ``scale`` N(0, 1) (their sum's mean square about 2 scale²), x shifted by ``mean``,
    w = 1 + N(0, 1)/2."""
    rows, n = shape
    x = grading.with_room_after((grading.randn(shape, torch.float32, gen=gen, scale=scale) + mean).to(dtype))
    r = grading.with_room_after(grading.randn(shape, dtype, gen=gen, scale=scale))
    w = grading.with_room_after((1 + 0.5 * torch.randn(n, generator=gen)).to(device=runtime.DEVICE, dtype=dtype))
    return x, r, w


def _rms_alternatives(x, r, w, eps):
    """The wrong answers with a message of their own, in float64 from the same inputs."""
    d = x.dtype
    h = (x.double() + r.double()).to(d).double()
    ms = h.pow(2).mean(-1, keepdim=True)
    wd = w.double()
    xd = x.double()
    return {
        "x normalised": (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * wd).to(d),
        "eps on the rms": (h / (ms.sqrt() + eps) * wd).to(d),
        "eps on rsqrt": (h * (torch.rsqrt(ms) + eps) * wd).to(d),
    }


_RMS_TIPS = {
    "x normalised": "your y is RMSNorm of x: the residual is missing. Normalise h = x + r, the new residual "
    "stream (the sum you also write out).",
    "eps on the rms": "your y divides by sqrt(mean(h²)) + eps: eps sits on the rms. It belongs inside the "
    "square root, added to the mean square: rsqrt(mean(h²) + eps).",
    "eps on rsqrt": "your y uses rsqrt(mean(h²)) + eps: eps is outside the square root. It belongs inside, "
    "added to the mean square: rsqrt(mean(h²) + eps).",
}


def _rms_case(fn, name, shape, dtype, eps, seed, *, narrow_passed: bool = False):
    gen = grading.fresh_generator()
    mean = FP16_MEAN if dtype == torch.float16 else 0.0
    x, r, w = rms_inputs(shape, dtype, gen, scale=1.0 if eps >= BIG_EPS else 3.0, mean=mean)
    where = f"{name}, shape {shape}, {grading.dtype_name(dtype)}, eps={eps:g}"
    out, box = _run(fn, (x, r, w, eps), name, where, seed)
    y_ref, h_ref = rmsnorm_reference(x, w, eps, residual=r)  # only now: the answer cannot read it
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise fail(f"{where}: return (y, h), a pair: the normalised output and the residual sum.", seed)
    y = _tensor(out[0], x, "y (the first of the pair)", where, seed)
    h = _tensor(out[1], x, "h (the second of the pair)", where, seed)
    if grading._storage(h) in {grading._storage(x), grading._storage(r)}:
        raise fail(f"{where}: h is one of the inputs. Write h = x + r into a tensor of its own.", seed)
    _one_launch(
        box,
        out,
        where,
        seed,
        (x, r, w),
        "The residual add and the norm read and write the same rows: one kernel can add, write h, and keep "
        "h on chip for its statistics.",
    )
    unwritten_h, unwritten_y = grading.poisoned(h), grading.poisoned(y)
    if unwritten_h.all() and not unwritten_y.any():
        raise fail(
            f"{where}: h was never written. The residual sum h = x + r is an output: the next layer adds its "
            "own result to it. Store it from the same kernel (it costs one write, no extra read).",
            seed,
        )
    for what, unwritten in (("h", unwritten_h), ("y", unwritten_y)):
        if unwritten.any():
            row, tip = grading.first_unwritten(unwritten, shape[1])
            raise fail(
                f"{where}: {int(unwritten.sum())} elements of {what} were never written, the first in row {row}.{tip} "
                "Check the grid (one program per row) and that every tile of a row is stored.",
                seed,
            )
    if not (_close(h, h_ref, dtype) and _close(y, y_ref, dtype)):  # first: were they computed from the decoys?
        for i, t in enumerate((y, h)):
            spec = lambda x, r, w, eps, i=i: rmsnorm_reference(x, w, eps, residual=r)[i]  # noqa: E731
            outside = grading.computed_outside(box, t, spec, (x, r, w, eps), where, seed)
            if outside is not None:
                raise outside
    if not _close(h, h_ref, dtype):
        if _close(h, x, dtype):
            raise fail(f"{where}: h equals x: the residual r was not added. h = x + r.", seed)
        grading.assert_close(h, h_ref, what=f"{where}: h", seed=seed, hint="h = x + r, stored in x's dtype.")
    if _close(y, y_ref, dtype):
        return
    for key, alt in _rms_alternatives(x, r, w, eps).items():
        if _close(y, alt, dtype):
            raise fail(f"{where}: {_RMS_TIPS[key]}", seed)
    if narrow_passed and shape in RMS_WIDE:
        raise fail(
            f"{where}: y is right on rows of up to {RMS_NARROW[-1][1]} elements but wrong on this row of "
            f"{shape[1]}, wider than one tile. The statistics need the whole row: sum h² over every tile of "
            "the row first (pass 1, writing h), then normalise every tile with that one rstd (pass 2, "
            "re-reading h).",
            seed,
        )
    grading.assert_close(
        y, y_ref, what=f"{where}: y", seed=seed, hint="y = h * rsqrt(mean(h²) + eps) * w, statistics in fp32."
    )


def check_add_rmsnorm(fn) -> Passed:
    """Exercise 1: ``fn(x, r, w, eps)`` -> ``(y, h)``: ``h = x + r`` and ``y = h * rsqrt(mean(h², -1) +
    eps) * w`` for ``(rows, N)`` x and r, from one Triton kernel, rows of any width."""
    name = "add_rmsnorm"
    if not callable(fn):
        raise CheckFailed(f"{name}: pass your function, got {type(fn).__name__}.")
    seed = grading.new_seed()
    half = runtime.HALF
    # a GPU's half type is bf16, whose range is fp32's: fp16 rows too, whose squares overflow (FP16_MEAN)
    dtypes = (torch.float32, half) if half == torch.float16 else (torch.float32, half, torch.float16)
    with grading.seeded(seed):
        _rms_case(fn, name, (37, 129), torch.float32, BIG_EPS, seed)  # where eps sits shows here
        plan = [(s, d, 1e-6) for d in dtypes for s in RMS_NARROW]
        plan.append((RMS_MANY, torch.float32, 1e-6))
        if grading.GRADING[0]:  # the grading command: a shape no list fixed, each dtype
            plan += [(grading.drawn_shape(lo=4, hi=13), d, 1e-6) for d in (torch.float32, half)]
        for s, d, eps in plan:
            _rms_case(fn, name, s, d, eps, seed)
        wide = [(s, d, 1e-5) for d in (torch.float32, half) for s in RMS_WIDE]
        wide.append((RMS_WIDE[-1], half, 1e-5))  # the same size again, fresh values
        for s, d, eps in wide:
            _rms_case(fn, name, s, d, eps, seed, narrow_passed=True)
    checks = 1 + len(plan) + len(wide)
    return _passed(
        f"✓ add_rmsnorm: {checks} checks passed (rows of {', '.join(str(s[1]) for s in RMS_NARROW + RMS_WIDE)} "
        f"elements × {len(dtypes)} dtypes, {RMS_MANY[0]} rows, eps={BIG_EPS:g} once, one repeated; y and h against "
        "float64, poisoned outputs, inputs unchanged, 1 launch each)",
        checks,
    )


# -- exercise 2: the row softmax -----------------------------------------------------------------------------
#: (5, 3001): wider than any fixed block a kernel might hard-code below 4096 (a row is one block here)
SM_SHAPES = ((1, 1), (7, 5), (37, 129), (5, 3001), (130, 1000))
SM_MANY = (1031, 33)
BIG_LOGITS = 1e4


def softmax_inputs(shape, dtype, gen, *, shift=0.0, masked=0.0, fully_masked=False):
    """Logits ``3 N(0, 1) + shift`` (with a shift, each row's first logit 100 lower); a share ``masked``
    of the entries set to -inf (each row keeps one), and
    with ``fully_masked`` every other row entirely -inf."""
    rows, n = shape
    x = torch.randn(shape, generator=gen) * 3 + shift
    if shift:  # the first logit of every row far below the rest: a shift by x[0] instead of the max overflows
        x[:, 0] -= 100
    if masked:
        drop = torch.rand(shape, generator=gen) < masked
        drop[:, 0] = False
        x[drop] = float("-inf")
    if fully_masked:
        x[::2] = float("-inf")
    return grading.with_room_after(x.to(device=runtime.DEVICE, dtype=dtype))


def _softmax_case(fn, name, shape, dtype, seed, *, shift=0.0, masked=0.0, fully_masked=False):
    gen = grading.fresh_generator()
    x = softmax_inputs(shape, dtype, gen, shift=shift, masked=masked, fully_masked=fully_masked)
    parts = [f"{name}, shape {shape}, {grading.dtype_name(dtype)}"]
    if shift:
        parts.append(f"logits near {shift:g}")
    if masked:
        parts.append(f"{masked:.0%} of the logits -inf")
    if fully_masked:
        parts.append("every other row entirely -inf")
    where = ", ".join(parts)
    out, box = _run(fn, (x,), name, where, seed)
    ref = softmax_reference(x).double().cpu()  # only now: the answer cannot read it
    y = _tensor(out, x, "the result", where, seed)
    _one_launch(box, y, where, seed, (x,), "A row's max, its sum and its outputs come from the same pass.")
    unwritten = grading.poisoned(y)
    if unwritten.any():
        row, tip = grading.first_unwritten(unwritten, shape[1])
        raise fail(
            f"{where}: {int(unwritten.sum())} elements were never written, the first in row {row}.{tip} "
            "Check the grid (one program per row) and the store mask.",
            seed,
        )
    got = y.double().cpu()
    if not _close(got, ref, dtype):  # before any diagnosis of the values: were they computed from the decoys?
        outside = grading.computed_outside(box, y, softmax_reference, (x,), where, seed)
        if outside is not None:
            raise outside
    dead = torch.isnan(ref).all(dim=1) if fully_masked else torch.zeros(shape[0], dtype=torch.bool)
    if dead.any():  # a row with no logit left: NaN (torch) or 0 (attention kernels), either accepted
        rows = got[dead]
        if not (torch.isnan(rows).all(dim=1) | (rows == 0).all(dim=1)).all():
            raise fail(
                f"{where}: a row whose logits are all -inf has no softmax. Write NaN there (as torch.softmax does: "
                "-inf - (-inf) is NaN) or 0 (as attention kernels do), the whole row the same.",
                seed,
            )
    live = ~dead
    g, e = got[live], ref[live]
    finite = torch.isfinite(e)
    if (~torch.isfinite(g) & finite).any():
        tip = (
            f" The logits are near {shift:g}: exp() of them overflows (fp32's largest is about e^88). Subtract the "
            "row's maximum before exp(): the softmax does not change, and every exponent is then <= 0."
            if shift > 0
            else f" The logits are near {shift:g}, and the max you subtract is not one of them: lanes past the row's "
            "end loaded as 0 (other=0.0), or a max that starts at 0, make it 0, so exp(x - 0) of every logit "
            "underflows to 0 and the sum is 0. Take the max over the row's logits alone: load the masked lanes as "
            "-inf (other=float('-inf')) and start a running max at -inf."
            if shift < 0
            else " Masked lanes and -inf logits must add exp(-inf) = 0 to the sum; look for exp() of a large number "
            "or -inf - (-inf)."
        )
        raise fail(f"{where}: inf or NaN where the softmax is finite.{tip}", seed)
    if _close(g, e, dtype):
        return
    sums = g.sum(dim=1)
    ratio = torch.where(e > 1e-3, g / e, torch.nan)
    spread = (torch.nanquantile(ratio, 0.99, dim=1) - torch.nanquantile(ratio, 0.01, dim=1)).nan_to_num(0)
    atol, rtol = grading.tolerance(dtype)
    if shape[1] > 1 and (sums < 1 - 10 * rtol).any() and (spread < 10 * rtol).all():
        raise fail(
            f"{where}: each row is the right shape but sums to less than 1 (row 0: {sums[0]:.4f}): lanes past the "
            "row's end count in the sum. Load them as -inf (tl.load(..., mask=mask, other=float('-inf'))): they "
            "add exp(-inf) = 0.",
            seed,
        )
    grading.assert_close(
        y.detach().cpu()[live],
        ref[live].to(dtype),
        what=where,
        seed=seed,
        hint="Mask the loads of the row's tail (other=-inf) and its stores; compute in fp32.",
    )


def check_softmax(fn) -> Passed:
    """Exercise 2: ``fn(x)`` -> ``softmax(x, dim=-1)`` for a ``(rows, N)`` x, from one Triton kernel."""
    name = "softmax"
    if not callable(fn):
        raise CheckFailed(f"{name}: pass your function, got {type(fn).__name__}.")
    seed = grading.new_seed()
    half = runtime.HALF
    plan = [dict(shape=s, dtype=d) for d in (torch.float32, half) for s in SM_SHAPES]
    plan.append(dict(shape=SM_MANY, dtype=torch.float32))
    plan += [dict(shape=(37, 129), dtype=d, shift=BIG_LOGITS) for d in (torch.float32, half)]
    # every logit far below 0: a max that takes in lanes past the row's end loaded as 0 (or starts at 0) is
    # then no logit of the row, and exp() of every logit minus it underflows to 0 (a row of 129 in a block of
    # 256 has such lanes)
    plan.append(dict(shape=(37, 129), dtype=torch.float32, shift=-BIG_LOGITS))
    plan.append(dict(shape=(37, 129), dtype=torch.float32, masked=0.3))
    plan.append(dict(shape=(8, 100), dtype=half, masked=0.3, fully_masked=True))
    plan.append(dict(shape=SM_SHAPES[-1], dtype=half))  # the same size again, fresh values
    with grading.seeded(seed):
        if grading.GRADING[0]:  # the grading command: a shape no list fixed, each dtype
            plan += [dict(shape=grading.drawn_shape(lo=4, hi=12), dtype=d) for d in (torch.float32, half)]
        for case in plan:
            _softmax_case(fn, name, case.pop("shape"), case.pop("dtype"), seed, **case)
    return _passed(
        f"✓ softmax: {len(plan)} checks passed (shapes {', '.join(map(str, SM_SHAPES))} × 2 dtypes, "
        f"{SM_MANY[0]} rows, logits near ±{BIG_LOGITS:g}, -inf logits, rows entirely -inf, one repeated; "
        "poisoned outputs, inputs unchanged, 1 launch each)",
        len(plan),
    )


# -- exercise 3: the fused kernel's bytes ------------------------------------------------------------------
#: (rows, N, dtype, block): rows that fit one tile, and rows wider than it
BYTES_CASES = (
    (32768, 4096, torch.bfloat16, 32768),
    (4096, 8192, torch.bfloat16, 4096),
    (1024, 131072, torch.float32, 16384),
    (7, 1000, torch.float16, 1024),
)


def fused_bytes_answer(rows: int, n: int, dtype, block: int) -> int:
    """The fused residual + RMSNorm forward's bytes (the package's ledger): read x, r, w; write h, y; a
    row wider than ``block`` re-reads h."""
    return rmsnorm_ledger(rows, n, dtype, block=block).fused_bytes


def check_fused_bytes(fn) -> Passed:
    """Exercise 3: ``fn(rows, n, dtype, block)`` -> the bytes the fused residual + RMSNorm forward moves
    through HBM (weight in the activations' dtype, read once; rows wider than ``block`` take two passes)."""
    name = "fused_bytes"
    if not callable(fn):
        raise CheckFailed(f"{name}: pass your function, got {type(fn).__name__}.")
    for rows, n, dtype, block in BYTES_CASES:
        call = f"{name}({rows}, {n}, {dtype}, block={block})"
        got = number(call_learner(fn, rows, n, dtype, block, name=name, where=call), call, "bytes")
        want = fused_bytes_answer(rows, n, dtype, block)
        if got == want:
            continue
        b, rn, wide = dtype_bytes(dtype), rows * n, n > block
        tips = {
            (2 * rn + n) * b: "That is read x, write y: with a residual the kernel also reads r and writes h.",
            (3 * rn + n) * b: "One row tensor short: the kernel reads x and r, writes h and y.",
            (4 * rn + rows * n) * b + (rn if wide else 0) * b: "The weight is read once (every program reads the "
            "same N elements, which stay in L2), not once a row.",
            (4 * rn + n) * b: "The row is wider than the block: pass 1 sums h² and writes h, pass 2 re-reads h "
            "to write y. One more row tensor.",
            (6 * rn + n) * b: "Pass 2 re-reads h, one tensor, not x and r: h was written in pass 1.",
            (4 * rn + n + (rn if wide else 0)): "That counts elements; multiply by the bytes per element.",
        }
        tips.setdefault(
            want + rows * 4, "That adds one fp32 rstd a row: at inference nothing needs it, and it is not stored."
        )
        tip = tips.get(int(got), "")
        if not tip and wide is False and got == (5 * rn + n) * b:
            tip = f"This row ({n}) fits the block ({block}): read once, no second pass."
        raise CheckFailed(f"{call} = {got:,.0f}, expected {want:,} ({human_bytes(want)}). {tip}".rstrip())
    return _passed(
        f"✓ fused_bytes: {len(BYTES_CASES)} shapes agree with the ledger (read x, r, w; write h, y; rows wider "
        "than the block re-read h)",
        len(BYTES_CASES),
    )


# -- exercise 4: predict the re-read cliff, before the measurement ------------------------------------------
#: the widths whose online-path time per element (against the narrow rows') the learner predicts
CLIFF_WIDTHS = (65536, 262144)
#: how far above (or, past the cliff, below) the measured ratio a prediction may sit: the ratios of one
#: GPU's rounds differ by a few hundredths, an H100's and an H200's by up to a quarter at one width
CLIFF_BAND = 0.2


def cliff_measured(run=None) -> tuple[dict[int, float], dict[int, bool], str]:
    """From ``run`` (a :class:`fusionlab.bench.SuiteRun`; default: the recording of this GPU if there is one,
    else the newest recording of lesson 4): the online softmax's time per element at each width of
    :data:`CLIFF_WIDTHS` over the narrow rows' (the sweep's 4096); whether that width's rows in flight
    (one program an SM) fit the GPU's L2; and the run's label."""
    if run is None:
        device = runtime.info().device_name if runtime.is_gpu() else None
        try:
            rec = bench.recorded(device=device, suite="lesson4")
        except FileNotFoundError:  # no recording of this GPU: the newest of any
            rec = bench.recorded(suite="lesson4")
        ms, device, label = {r.name: r.ms for r in rec.results("lesson4")}, rec.meta["device"], rec.label()
    else:
        ms, device, label = {r.name: r.ms for r in run.results}, run.device, run.label
    l2 = regimes.recorded_sweep(device)["L2_bytes"]
    narrow = ms[sweep_name(4096)] / SWEEP_ELEMENTS
    ratio = {w: ms[sweep_name(w, online=True)] / SWEEP_ELEMENTS / narrow for w in CLIFF_WIDTHS}
    fits = {w: DEFAULT_SMS * w * 2 <= l2 for w in CLIFF_WIDTHS}
    return ratio, fits, label


def check_cliff_prediction(predicted, run=None) -> Passed:
    """Exercise 4: ``predicted`` is ``{width: ratio}``, the online path's time per element at each width of
    :data:`CLIFF_WIDTHS` over the narrow rows', written **before** the measurement is shown. The band: up to
    :data:`CLIFF_BAND` above the measured ratio; below it, down to the narrow rows' own rate where the rows
    in flight fit L2 (a GPU may hide the whole re-read there), :data:`CLIFF_BAND` where they do not."""
    name = "cliff prediction"
    if not isinstance(predicted, dict) or sorted(predicted) != sorted(CLIFF_WIDTHS):
        raise CheckFailed(f"{name}: a dict {{width: ratio}} with the widths {list(CLIFF_WIDTHS)}, got {predicted!r}.")
    measured, fits, label = cliff_measured(run)
    lines = []
    for w in CLIFF_WIDTHS:
        got = number(predicted[w], f"{name}[{w}]", "x")
        low = 1.0 - CLIFF_BAND / 2 if fits[w] else measured[w] - CLIFF_BAND
        if not low <= got <= measured[w] + CLIFF_BAND:
            raise CheckFailed(
                f"{name}: at rows of {w} you predicted {got:.2f}x, the GPU measured {measured[w]:.2f}x ({label}). "
                f"The ledger says 1.50x for any width past one tile: a second read. Here the rows in flight (one "
                f"program an SM, each on a row of {human_bytes(2 * w)}) {'fit' if fits[w] else 'do not fit'} in "
                "L2: does the second read reach HBM?"
            )
        lines.append(f"{w}: you {got:.2f}x, measured {measured[w]:.2f}x")
    return _passed(f"✓ {name}: both widths within the band of the measurement ({'; '.join(lines)}; {label})", 2)


# -- exercise 5: LayerNorm's dγ and dβ, one kernel --------------------------------------------------------------
#: (rows, N): one element; widths around a block of 64 columns; rows around a block of 32; many programs
DWDB_SHAPES = ((1, 1), (7, 63), (33, 64), (129, 65), (100, 300))
#: many programs: one a block of columns
DWDB_MANY = (40, 2000)


def dwdb_inputs(shape, dtype, gen):
    """``x, dy`` in ``dtype`` and the forward's saved ``mean, rstd`` (fp32, one a row), rows with an offset."""
    rows, n = shape
    x = grading.with_room_after(grading.randn(shape, dtype, gen=gen, scale=2.0) + 0.5)
    dy = grading.with_room_after(grading.randn(shape, dtype, gen=gen, scale=1.0))
    xf = x.float()
    mean = grading.with_room_after(xf.mean(-1))
    rstd = grading.with_room_after(torch.rsqrt(xf.var(-1, unbiased=False) + 1e-5))
    return x, dy, mean, rstd


#: rows whose first and last carry dy = +DWDB_CANCEL and -DWDB_CANCEL on the same x: they cancel in the sums, so
#: a sum kept in 16 bits (its step near 2000 is 1 in fp16, 16 in bf16) rounds away what the other rows add,
#: where an fp32 one keeps it; many blocks of rows at any BLOCK_M
DWDB_CANCEL, DWDB_CANCEL_SHAPE = 2000.0, (4099, 40)


def dwdb_cancel_inputs(shape, dtype, gen):
    """:func:`dwdb_inputs` with the first and last rows cancelling (same x, dy = ±:data:`DWDB_CANCEL`)."""
    x, dy, _, _ = dwdb_inputs(shape, dtype, gen)
    x[-1] = x[0]
    dy[0], dy[-1] = DWDB_CANCEL, -DWDB_CANCEL
    xf = x.float()
    mean = grading.with_room_after(xf.mean(-1))
    rstd = grading.with_room_after(torch.rsqrt(xf.var(-1, unbiased=False) + 1e-5))
    return x, dy, mean, rstd


def dwdb_reference(x, dy, mean, rstd):
    """``(dγ, dβ)``: ``dγ = Σ_rows dy · x̂`` and ``dβ = Σ_rows dy``, ``x̂ = (x − mean) · rstd``, summed in
    float64 and stored in the activations' dtype."""
    xhat = (x.double() - mean.double()[:, None]) * rstd.double()[:, None]
    return (dy.double() * xhat).sum(0).to(x.dtype), dy.double().sum(0).to(x.dtype)


def check_layernorm_dwdb(fn) -> Passed:
    """Exercise 5: ``fn(x, dy, mean, rstd)`` -> ``(dw, db)``, LayerNorm's weight and bias gradients
    ``dw = Σ_rows dy · (x − mean) · rstd`` and ``db = Σ_rows dy`` for ``(rows, N)`` x and dy (``mean`` and
    ``rstd``: fp32, one a row, as the forward saved them), in x's dtype, from **one** Triton kernel."""
    name = "layernorm_dwdb"
    if not callable(fn):
        raise CheckFailed(f"{name}: pass your function, got {type(fn).__name__}.")
    hints = (
        "dw sums dy · x̂ over the rows, x̂ = (x − mean) · rstd with each row's own mean and rstd (the normalised "
        "x the weight multiplied in the forward, not x itself); accumulate over every block of rows in fp32.",
        "db sums dy over every row: a loop over blocks of rows, accumulated in fp32.",
    )
    checks = grading.check_function_pair(
        fn, dwdb_reference, dwdb_inputs, name=name, parts=("dw", "db"), hints=hints, sizes=DWDB_SHAPES, many=DWDB_MANY
    )
    acc = (
        f"The first and last rows cancel (dy = ±{DWDB_CANCEL:g}), so the sum passes near {DWDB_CANCEL:g} on its way: "
        "kept in 16 bits there, it rounds away what the rows between add. Accumulate in fp32 "
        "(tl.zeros(..., dtype=tl.float32)) and cast once, at the store."
    )
    checks += grading.check_function_pair(
        fn,
        dwdb_reference,
        dwdb_cancel_inputs,
        name=f"{name}, rows that cancel",
        parts=("dw", "db"),
        hints=(acc, acc),
        sizes=(DWDB_CANCEL_SHAPE,),
        many=None,
        dtypes=[runtime.HALF],
        draw=False,
    )
    return _passed(
        f"✓ {name}: {checks} checks passed (dw and db; shapes {', '.join(map(str, DWDB_SHAPES))} × 2 dtypes, "
        f"{DWDB_MANY}, one repeated; {DWDB_CANCEL_SHAPE} in 16 bits with rows that cancel; against float64, "
        "poisoned outputs, inputs unchanged, 1 launch each)",
        checks,
    )
