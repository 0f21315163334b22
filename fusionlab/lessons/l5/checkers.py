"""Checkers for lesson 5's exercises (solutions/05_gates_and_losses.ipynb).

1. ``check_swiglu``: a fused SwiGLU forward kernel, ``silu(g) * u``, reading g and u in place as the two
   halves of one ``(T, 2F)`` projection (rows ``2F`` apart). Rejects two kernels (the ``silu`` result
   written and read back), the gate on the wrong input, and 16-bit arithmetic that overflows.
2. ``check_cross_entropy``: loss (the mean over rows) and gradient of cross-entropy in one kernel,
   one row per program, the whole row in one block. ``check_cross_entropy_ignore``: the same with
   ``ignore_index`` (and, if the answer takes ``label_smoothing``, smoothing too). Rejects a gradient
   without the mean's 1/N, ignored rows in the denominator or with a gradient, no max subtraction
   (logits near 1e4 overflow ``exp``), and a materialised probability tensor: the answer may allocate
   one tensor of the logits' size (the gradient), counted in the sandbox's ``allocations``.
3. ``check_eager_peak_gib``: the peak memory of eager ``F.cross_entropy`` forward + backward.
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_leaves

from ... import grading, runtime
from ...grading import CheckFailed, answer_key, call_learner, fail, number
from ...instrument import FREE, op_name
from ...kernels.swiglu import swiglu_reference

Passed, _passed = grading.Passed, grading.passed
_ALLOCS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})

# -- exercise 1: the fused SwiGLU forward ---------------------------------------------------------------
#: (rows, F): one element, shapes no power-of-two tile divides, more rows than a row block
SWIGLU_SHAPES = ((1, 1), (37, 129), (130, 7), (257, 1000))
#: many programs at any tile (1 x 1024 on a GPU: 1031; 64 x 256 in the interpreter: 85)
SWIGLU_MANY = (1031, 1031)


def swiglu_inputs(shape, dtype, gen):
    """``g, u``: the two halves of one ``(rows, 2F)`` projection, as ``gu.chunk(2, dim=-1)`` gives them
    (views, rows ``2F`` elements apart), spread enough to reach silu's bend and both tails."""
    rows, cols = shape
    gu = grading.with_room_after(grading.randn((rows, 2 * cols), dtype, gen=gen))
    return gu[:, :cols], gu[:, cols:]


def _swiglu_overflow_inputs(gen):
    """fp16 inputs where ``g * u`` overflows (|g u| > 65504) but ``silu(g) * u`` is small: g in [-40, -20]
    (silu(g) ~ 1e-8), u of a few thousand; every other column ordinary values."""
    rows, cols = 37, 129
    g = torch.randn(rows, 2 * cols, generator=gen)
    g[:, 0:cols:2] = -20 - 20 * torch.rand(rows, (cols + 1) // 2, generator=gen)
    g[:, cols + 0 :: 2] = (4000 + 4000 * torch.rand(rows, (cols + 1) // 2, generator=gen)) * torch.sign(
        torch.randn(rows, (cols + 1) // 2, generator=gen)
    )
    gu = grading.with_room_after(g.to(device=runtime.DEVICE, dtype=torch.float16))
    return gu[:, :cols], gu[:, cols:]


def _swapped(g, u):
    return (F.silu(u.double()) * g.double()).to(g.dtype)


def check_swiglu(swiglu_fn) -> Passed:
    """Exercise 1: ``swiglu_fn(g, u)`` returns ``silu(g) * u`` (fp32 inside, stored in g's dtype) for g
    and u the two halves of one ``(T, 2F)`` tensor, in one Triton kernel."""
    name = "swiglu"
    seed = grading.new_seed()
    with grading.seeded(seed):
        # the two mistakes with a message of their own, on inputs where they show
        g, u = swiglu_inputs((37, 129), torch.float32, grading.fresh_generator())
        with grading.Sandbox():  # guarded allocations: a store past the end lands in a guard zone
            h = call_learner(swiglu_fn, g, u, name=name, where=f"{name}, shape (37, 129), float32", seed=seed)
        if isinstance(h, torch.Tensor) and h.shape == g.shape and not grading.poisoned(h).any():
            atol, rtol = grading.tolerance(torch.float32)
            right = torch.allclose(h.double().cpu(), swiglu_reference(g, u).double().cpu(), atol=atol, rtol=rtol)
            if not right and torch.allclose(h.double().cpu(), _swapped(g, u).double().cpu(), atol=atol, rtol=rtol):
                raise fail(
                    f"{name}: your kernel computes silu(u) * g. The gate is g, the first argument: silu goes on g, "
                    "and u is the value it lets through.",
                    seed,
                )
        g, u = _swiglu_overflow_inputs(grading.fresh_generator())
        where = f"{name}, shape (37, 129), float16 with |g * u| > 65504"
        with grading.Sandbox():
            h = call_learner(swiglu_fn, g, u, name=name, where=where, seed=seed)
        if isinstance(h, torch.Tensor) and h.shape == g.shape and h.dtype == g.dtype:
            ref, got = swiglu_reference(g, u).double().cpu(), h.double().cpu()
            atol, rtol = grading.tolerance(torch.float16)
            # right on the ordinary (odd) columns, inf or NaN on the others: 16-bit arithmetic overflowed
            right_elsewhere = torch.allclose(got[:, 1::2], ref[:, 1::2], atol=atol, rtol=rtol)
            bad = ~torch.isfinite(got) & torch.isfinite(ref)
            if right_elsewhere and bad.any():
                raise fail(
                    f"{where}: {int(bad.sum())} results are inf or NaN where silu(g) * u is small and finite. An "
                    "intermediate overflowed fp16 (largest value 65504): g * u is formed in 16 bits. Convert what "
                    "you load to fp32 first and store in h's dtype once, at the end.",
                    seed,
                )
    res = grading.check_function(
        swiglu_fn,
        swiglu_reference,
        swiglu_inputs,
        name=name,
        sizes=SWIGLU_SHAPES,
        many=SWIGLU_MANY,
        launches=1,
        quiet=True,
        hint="Look at the row stride of each tensor (g.stride(0) is 2F, not F) and compute in fp32.",
    )
    # one row a program (the GPU's BLOCK_M = 1) leaves no partial row tile: the row mask is tried with taller ones
    with grading.seeded(seed):
        inputs = swiglu_inputs((37, 129), torch.float32, grading.fresh_generator())
        grading.check_taller_tiles(swiglu_fn, inputs, swiglu_reference, name=name, seed=seed)
    msg = (
        f"✓ swiglu: {res.checks + 2} checks passed (shapes {', '.join(map(str, SWIGLU_SHAPES))} × 2 dtypes, one of "
        f"{SWIGLU_MANY[0]} × {SWIGLU_MANY[1]}, one repeated, one with |g·u| past fp16's range; g and u read in place "
        "from one (T, 2F) tensor, poisoned outputs, nothing written past the end, inputs unchanged, 1 launch each)"
    )
    return _passed(msg)


# -- exercise 2: cross-entropy, loss and gradient in one pass ----------------------------------------------
#: (rows, vocabulary): a handful, odd sizes, one class; each row is one program. (1, 1) is not first: the
#: checks that count tensors the size of the logits need logits larger than a row of losses.
#: (5, 3001): wider than any fixed block a kernel might hard-code below 4096 (a row is one block here)
CE_SHAPES = ((7, 5), (37, 129), (1, 1), (5, 3001), (130, 1000))
#: many programs (one per row)
CE_MANY = (300, 77)
#: logits this large overflow exp() in fp32 (e^88 is its largest) unless the row max is subtracted
BIG_LOGITS = 1e4
SMOOTHING = 0.1
#: the logits' mean in the label-smoothing cases
SMOOTHING_MEAN = 20.0


def ce_inputs(shape, dtype, gen, *, shift=0.0, ignore_frac=0.0, ignore_index=-100, all_ignored=False):
    """``logits, target``: logits ~ 3 N(0, 1) + ``shift``; targets uniform over the classes, a share
    ``ignore_frac`` of them set to ``ignore_index`` (at least one row kept and, with two rows or more,
    one ignored); every row ignored with ``all_ignored``."""
    rows, cols = shape
    logits = torch.randn(shape, generator=gen) * 3 + shift
    if shift >= 1000:  # each row's first logit far below the rest: shifting by x[0], not the max, overflows
        logits[:, 0] -= 100
    logits = logits.to(device=runtime.DEVICE, dtype=dtype)
    target = torch.randint(0, cols, (rows,), generator=gen)
    if all_ignored:
        target[:] = ignore_index
    elif ignore_frac:
        drop = torch.rand(rows, generator=gen) < ignore_frac
        if rows >= 2:
            drop[0], drop[-1] = True, False
        else:
            drop[:] = False
        target[drop] = ignore_index
    return grading.with_room_after(logits), grading.with_room_after(target.to(runtime.DEVICE))


def ce_reference(logits, target, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """The mean (or ``reduction``) loss and its gradient, in float64 from the same inputs."""
    x = logits.detach().double().requires_grad_()
    loss = F.cross_entropy(x, target, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction=reduction)
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad


class _Watch(grading.Sandbox):
    """The grading sandbox, also noting every torch op at the top level whose output is at least
    ``big`` elements (the logits' size): a (T, V) tensor computed or filled by torch; and how many
    elements torch's ops read in all (``touched``): torch run on pieces of the logits, a row or a chunk
    at a time, reads as many elements as the logits hold, where the per-row losses and the targets
    (what an answer may sum or compare in torch) are a few times the rows."""

    def __init__(self, big: int, rows: int = 0):
        super().__init__()
        self.big = big
        self.rows = rows
        self.big_ops: list[str] = []
        self.touched = 0
        self.touched_ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        name = op_name(func)
        if (self._state is None or self._state.depth == 0) and name not in _ALLOCS and name not in FREE:
            if any(isinstance(t, torch.Tensor) and t.numel() >= self.big for t in tree_leaves(out)):
                self.big_ops.append(name)
            self.touched += sum(t.numel() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor))
            self.touched_ops.append(name)
        return out

    def torch_on_pieces(self) -> bool:
        """Whether torch's ops read, in all, as many elements as the logits hold (and more than a few
        vectors of one number a row)."""
        return self.touched >= self.big and self.touched > 8 * max(self.rows, 1)

    def remote_spec(self) -> dict:
        return {"big": self.big, "rows": self.rows}

    def take_report(self, report: dict) -> None:
        super().take_report(report)
        self.big_ops += report.get("big_ops", [])
        self.touched += report.get("touched", 0)
        self.touched_ops += report.get("touched_ops", [])

    def report(self) -> dict:
        return {**super().report(), "big_ops": self.big_ops, "touched": self.touched, "touched_ops": self.touched_ops}


def _takes(fn, param: str) -> bool:
    try:
        return param in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _as_loss(loss, where, seed) -> float:
    if isinstance(loss, torch.Tensor):
        if loss.numel() != 1:
            raise fail(
                f"{where}: the loss should be one number (the mean over rows), got shape {tuple(loss.shape)}.", seed
            )
        return float(loss.detach().double().cpu().reshape(()))
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        return float(loss)
    raise fail(f"{where}: the loss should be a number or a 0-d tensor, got {type(loss).__name__}.", seed)


def _close(a: torch.Tensor, b: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    return torch.isclose(a, b, atol=atol, rtol=rtol, equal_nan=True)


def _ce_case(fn, name, shape, dtype, seed, *, shift=0.0, ignore=False, all_ignored=False, smoothing=0.0, ii=-100):
    gen = grading.fresh_generator()
    logits, target = ce_inputs(
        shape, dtype, gen, shift=shift, ignore_frac=0.3 if ignore else 0.0, ignore_index=ii, all_ignored=all_ignored
    )
    rows, cols = shape
    parts = [f"{name}, shape {shape}, {grading.dtype_name(dtype)}"]
    if shift:
        parts.append(f"logits near {shift:g}")
    if ignore:
        parts.append(f"ignore_index={ii}" + (" on every row" if all_ignored else ""))
    if smoothing:
        parts.append(f"label_smoothing={smoothing}")
    where = ", ".join(parts)
    args = (logits, target, ii) if ignore else (logits, target)
    kwargs = {"label_smoothing": smoothing} if smoothing else {}
    out, box = grading.run_answer(
        fn,
        args,
        kwargs=kwargs,
        name=name,
        where=where,
        seed=seed,
        box=_Watch(logits.numel(), rows),
        allow_torch_ops=True,  # on the per-row losses and the targets; the logits' work is checked below
        conceal=(0,),  # the logits: only the kernel sees them (torch may read the targets)
        store_hint="Mask every store (offs < n_cols) and check the grid: one program per row.",
    )
    ref_loss, ref_grad = ce_reference(logits, target, ii, smoothing)  # only now: the answer cannot read it

    # -- what came back, and what the answer did to get it
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise fail(f"{where}: return (loss, grad), a pair; got {type(out).__name__}.", seed)
    loss, grad = out
    if not isinstance(grad, torch.Tensor) or grad.shape != logits.shape or grad.dtype != logits.dtype:
        got = f"{tuple(grad.shape)} {grading.dtype_name(grad.dtype)}" if isinstance(grad, torch.Tensor) else type(grad)
        raise fail(f"{where}: the gradient should be a tensor like the logits ({shape}, {dtype}), got {got}.", seed)
    if cols > 1:
        big = [a for a in box.allocations if a.numel() >= logits.numel()]
        if len(big) > 1:
            raise fail(
                f"{where}: your code allocates {len(big)} tensors the size of the logits; the gradient is the only "
                "one it needs. A (T, V) tensor of probabilities is the memory this exercise removes: keep each "
                "row's exp() in registers and write the gradient directly.",
                seed,
            )
        if box.big_ops:
            ops = ", ".join(sorted(set(box.big_ops)))
            raise fail(
                f"{where}: torch runs {ops} on a tensor the size of the logits. Each such op is a (T, V) pass "
                "through memory (and often a (T, V) tensor more): do that work in your kernel, and allocate the "
                "gradient with torch.empty_like.",
                seed,
            )
    if box.torch_on_pieces():
        raise fail(
            f"{where}: torch reads {box.touched} elements in all ({', '.join(sorted(set(box.touched_ops)))}), as "
            f"many as the logits hold ({logits.numel()}): the logits' work done by torch a piece at a time. Only "
            "the per-row losses (and the targets) may meet torch; the rows themselves belong to your kernel.",
            seed,
        )
    if len(box.launches) != 1:
        what = ", ".join(box.names) or "none"
        raise fail(
            f"{where}: expected 1 Triton kernel launch, saw {len(box.launches)} ({what}). The loss and the gradient "
            "come from the same pass over each row: one kernel.",
            seed,
        )
    given = {grading._storage(t) for t in box.launches[0].tensors}
    if grading._storage(grad) not in given or grading._storage(logits) not in given:
        raise fail(f"{where}: the kernel itself must read the logits and write the gradient you return.", seed)
    unwritten = grading.poisoned(grad)
    if unwritten.any():
        row, tip = grading.first_unwritten(unwritten, cols)
        if target[row] == ii:
            tip = " That row is ignored: its gradient is zero, and zero must be written."
        raise fail(
            f"{where}: {int(unwritten.sum())} gradient elements were never written, the first in row {row}.{tip} "
            "Check the grid (one program per row) and the store mask.",
            seed,
        )

    # -- the numbers
    got_loss = _as_loss(loss, where, seed)
    g = grad.detach().double().cpu()
    want, loss_want = ref_grad.cpu(), float(ref_loss)
    valid = (target != ii).cpu()
    n_valid = int(valid.sum())
    finite_ref = torch.isfinite(want)
    bad_rows = (~torch.isfinite(g) & finite_ref).any(dim=1)
    loss_blew = math.isfinite(loss_want) and not math.isfinite(got_loss)
    if shift and dtype != torch.float32 and loss_blew and not bad_rows.any():
        # only the loss, only on large logits (the cases before had ignored rows too): a sum of the logits in 16 bits
        raise fail(
            f"{where}: the loss is inf/NaN while the gradient is finite. {cols} logits near {shift:g} add up past "
            f"{grading.dtype_name(dtype)}'s range: a sum over the row of x itself (such as the smoothing's mean of "
            "the logits; 0 * inf is NaN even where label_smoothing is 0) is kept in 16 bits. Convert the logits to "
            "fp32 as they are loaded (.to(tl.float32)).",
            seed,
        )
    if ignore and not valid.all() and (bad_rows.any() or loss_blew) and not bad_rows[valid].any():
        # only the ignored rows are not finite: no overflow, a target that is no column was used
        raise fail(
            f"{where}: "
            + (
                f"{int(bad_rows.sum())} ignored rows have an inf/NaN gradient"
                if bad_rows.any()
                else "the loss is inf/NaN"
            )
            + f" while every row that counts is finite. An ignored row's target ({ii}) is no column: do not "
            "load or index with it, and keep its results out with tl.where(valid, ..., 0.0) (0 * NaN is still NaN).",
            seed,
        )
    if bad_rows.any() or loss_blew:
        tip = (
            f" The logits are near {shift:g}: exp() of them overflows fp32 (e^88 is the largest). Subtract the row's "
            "maximum before exp(): softmax and logsumexp do not change, and every exponent is then <= 0."
            if shift
            else " Look for exp() of a large number, or a division by zero."
        )
        raise fail(f"{where}: the loss or the gradient is inf/NaN where the answer is finite.{tip}", seed)
    if ignore and not valid.all():
        rows_bad = (g[~valid] != 0).any(dim=1)
        if rows_bad.any():
            tip = (
                " Label smoothing too: an ignored row has no target, so it gets no smoothing either."
                if smoothing
                else ""
            )
            raise fail(
                f"{where}: {int(rows_bad.sum())} ignored rows have a nonzero gradient. A row whose target is "
                f"ignore_index has zero loss and zero gradient.{tip}",
                seed,
            )
    # compare the gradient as if the loss were a sum (times n_valid): values of order 1, so the dtype's
    # tolerance means the same for every batch size; logits near 1e4 carry fp32's rounding of them
    atol, rtol = grading.tolerance(dtype)
    if shift:
        atol, rtol = max(atol, 4 * 2**-24 * shift), max(rtol, 4 * 2**-24 * shift)
    n = max(n_valid, 1)
    ok_grad = _close(g * n, want * n, atol, rtol).all()
    loss_tol = 1e-4 + 1e-6 * abs(shift)
    ok_loss = (
        math.isnan(loss_want) and math.isnan(got_loss) or abs(got_loss - loss_want) <= loss_tol * (1 + abs(loss_want))
    )
    if ok_grad and ok_loss:
        return
    # first: the gradient of the decoys the logits held outside the kernel? (as a sum, as above). Not where the
    # gradient is right: every row ignored, it is zero for any logits and would match the decoys' too
    if not ok_grad:
        spec = lambda lg, tg: (ce_reference(lg, tg, ii, smoothing)[1] * n).to(lg.dtype)  # noqa: E731
        outside = grading.computed_outside(box, grad.detach() * n, spec, (logits, target), where, seed)
        if outside is not None:
            raise outside
    ref_sum, _ = ce_reference(logits, target, ii, smoothing, reduction="sum")
    ref_sum = float(ref_sum)
    if not ok_grad:
        if n > 1 and _close(g, want * n, atol, rtol).all():
            raise fail(
                f"{where}: the gradient is {n} times too large: the loss is the mean over {n} rows, so each row's "
                "gradient carries the mean's 1/N too.",
                seed,
            )
        if ignore and n_valid < rows and _close(g * rows, want * n, atol, rtol).all():
            raise fail(
                f"{where}: the gradient divides by all {rows} rows; only the {n_valid} rows that are not ignored "
                "count in the mean.",
                seed,
            )
    if not ok_loss and math.isfinite(loss_want):
        if ignore and n_valid < rows and abs(got_loss - ref_sum / rows) <= loss_tol * (1 + abs(ref_sum / rows)):
            raise fail(
                f"{where}: loss {got_loss:.6g}, expected {loss_want:.6g}: you divided by all {rows} rows; the mean "
                f"is over the {n_valid} rows that are not ignored.",
                seed,
            )
        if n > 1 and abs(got_loss - ref_sum) <= loss_tol * (1 + abs(ref_sum)):
            raise fail(f"{where}: loss {got_loss:.6g} is the sum over rows; the mean divides it by {n}.", seed)
        raise fail(f"{where}: loss {got_loss:.6g}, expected {loss_want:.6g}.", seed)
    if not ok_loss:
        raise fail(
            f"{where}: loss {got_loss:.6g}, expected {loss_want:.6g} (every row ignored: 0 / 0). Divide by the "
            "count of rows that are not ignored as it is, zero included: torch's mean over no rows is NaN.",
            seed,
        )
    bad = ~_close(g * n, want * n, atol, rtol)
    i = int(bad.flatten().nonzero()[0][0])
    r, c = divmod(i, cols)
    tip = " That is the target's column." if c == int(target[r]) else ""
    raise fail(
        f"{where}: {int(bad.sum())} of {g.numel()} gradient elements differ; first at row {r}, column {c}: got "
        f"{g[r, c].item():.6g}, expected {want[r, c].item():.6g}.{tip}",
        seed,
    )


def _plan(ignore: bool, smoothing: bool) -> list[dict]:
    half = runtime.HALF
    plan = [dict(shape=s, dtype=d) for d in (torch.float32, half) for s in CE_SHAPES]
    plan.append(dict(shape=CE_MANY, dtype=torch.float32))
    plan += [dict(shape=(37, 129), dtype=d, shift=BIG_LOGITS) for d in (torch.float32, half)]
    if ignore:
        plan += [dict(shape=(7, 5), dtype=torch.float32, all_ignored=True), dict(shape=(37, 129), dtype=half, ii=-1)]
        if smoothing:
            # logits with a large mean: the smoothing term's mean over the row is then large too, so a mean
            # taken over the block (1024 lanes for 1000 classes) instead of the row is far off
            plan += [
                dict(shape=s, dtype=d, smoothing=SMOOTHING, shift=SMOOTHING_MEAN)
                for s, d in (((37, 129), torch.float32), ((130, 1000), half))
            ]
    plan.append(dict(shape=CE_SHAPES[-1], dtype=half))  # the same size again, fresh values
    return plan


def _check_ce(fn, name: str, ignore: bool) -> tuple[int, bool]:
    if not callable(fn):
        raise CheckFailed(f"{name}: pass your function, got {type(fn).__name__}.")
    smoothing = ignore and _takes(fn, "label_smoothing")
    seed = grading.new_seed()
    plan = _plan(ignore, smoothing)
    with grading.seeded(seed):
        if grading.GRADING[0]:  # the grading command: a shape no list fixed, each dtype
            plan += [dict(shape=grading.drawn_shape(lo=2, hi=12), dtype=d) for d in (torch.float32, runtime.HALF)]
        for case in plan:
            _ce_case(fn, name, case.pop("shape"), case.pop("dtype"), seed, ignore=ignore, **case)
    return len(plan), smoothing


def check_cross_entropy(ce_fn) -> Passed:
    """Exercise 2a: ``ce_fn(logits, target)`` -> ``(loss, grad)``: the mean cross-entropy over rows and its
    gradient with respect to the logits, from one Triton kernel (one row per program)."""
    checks, _ = _check_ce(ce_fn, "cross_entropy", ignore=False)
    msg = (
        f"✓ cross_entropy: {checks} checks passed (shapes {', '.join(map(str, CE_SHAPES))} × 2 dtypes, "
        f"{CE_MANY[0]} rows, logits near {BIG_LOGITS:g}, one repeated; loss and gradient against float64, "
        "1 launch, no (T, V) tensor but the gradient)"
    )
    return _passed(msg)


def check_cross_entropy_ignore(ce_fn) -> Passed:
    """Exercise 2b: ``ce_fn(logits, target, ignore_index)`` -> ``(loss, grad)``: rows whose target is
    ``ignore_index`` have zero loss and zero gradient and leave the mean's denominator; every row
    ignored gives a NaN loss, as torch. With a ``label_smoothing`` parameter, smoothing is checked too."""
    checks, smoothing = _check_ce(ce_fn, "cross_entropy_ignore", ignore=True)
    extra = f", label_smoothing={SMOOTHING}" if smoothing else " (add a label_smoothing parameter to check it too)"
    msg = (
        f"✓ cross_entropy_ignore: {checks} checks passed (30% of rows ignored, every row ignored, "
        f"ignore_index -100 and -1, logits near {BIG_LOGITS:g}{extra}; 1 launch, no (T, V) tensor but the gradient)"
    )
    return _passed(msg)


# -- exercise 3: the peak memory of eager cross-entropy -----------------------------------------------------
#: the exercise's logits: 4096 tokens x Qwen's vocabulary of 151936, fp32
PEAK_TOKENS, PEAK_VOCAB, PEAK_DTYPE_BYTES = 4096, 151936, 4
GIB = 2**30


@answer_key
def eager_peak_bytes(tokens: int, vocab: int, dtype_bytes: int) -> int:
    """Peak bytes eager ``F.cross_entropy`` forward + backward allocates beyond the logits (the gradient
    it returns included): the log-probabilities (saved by the forward), then in the backward their
    gradient and the logits' gradient, all three alive at once."""
    return 3 * tokens * vocab * dtype_bytes


def check_eager_peak_gib(peak_gib) -> Passed:
    """Exercise 3: the peak memory in GiB, beyond the logits, of eager ``F.cross_entropy`` forward +
    backward on 4096 × 151936 fp32 logits."""
    got = number(peak_gib, "my_eager_peak_gib", "GiB")
    logits = PEAK_TOKENS * PEAK_VOCAB * PEAK_DTYPE_BYTES
    want = eager_peak_bytes(PEAK_TOKENS, PEAK_VOCAB, PEAK_DTYPE_BYTES) / GIB
    if abs(got - want) <= 0.01 * want:
        return _passed(
            f"✓ eager peak: {want:.2f} GiB beyond the logits = 3 (T, V) tensors of {logits / GIB:.2f} GiB "
            "(log-probabilities, their gradient, the logits' gradient), alive together in the backward"
        )
    tips = {
        1: "That is one (T, V) tensor: the log-probabilities the forward keeps. The backward makes more.",
        2: "Two (T, V) tensors: the backward also writes the gradient of the log-probabilities "
        "(nll_loss's backward) before it writes the logits' gradient, and both are alive together.",
        4: "That counts the logits too; the question is what eager allocates beyond them.",
        6: "Six is the number of (T, V) trips eager makes, not the tensors alive at once.",
        1.5: "Bytes per element: these logits are fp32.",
    }
    tip = grading.memory_answer_tip(got, want, logits / GIB, tips, PEAK_DTYPE_BYTES)
    raise CheckFailed(f"my_eager_peak_gib = {got:.4g}, expected about {want:.2f} GiB.{tip}")


# -- exercise 4: GeGLU, a prediction before any kernel ------------------------------------------------------
#: how far a predicted speedup may sit from the ledger's: the ledger is a count, the band only rounding
GEGLU_BAND = 0.05


def geglu_ledger_speedups() -> dict[str, float]:
    """The ledger's speedups of a fused GeGLU, ``gelu(g) * u``: forward, eager two kernels (gelu: read g,
    write s; mul: read s, u, write h: five trips) against one (read g, u, write h: three); backward, eager
    three kernels (du = dh * s; ds = dh * u; dg = gelu_backward(ds, g): nine trips) against one that
    recomputes gelu(g) (read dh, g, u; write dg, du: five)."""
    return {"forward": 5 / 3, "backward": 9 / 5}


def check_geglu_prediction(predicted) -> Passed:
    """Exercise 4: ``predicted`` is ``{"forward": x, "backward": y}``, the speedups of a fused GeGLU over
    eager PyTorch, written before any kernel; each within :data:`GEGLU_BAND` of the ledger's count."""
    name = "geglu prediction"
    want = geglu_ledger_speedups()
    if not isinstance(predicted, dict) or sorted(predicted) != sorted(want):
        raise CheckFailed(f"{name}: a dict {{'forward': ..., 'backward': ...}}, got {predicted!r}.")
    tips = {
        "forward": "Eager: gelu reads g and writes s; mul reads s and u and writes h. Fused: read g and u, "
        "write h. Both inputs must still be read.",
        "backward": "Eager autograd saves s = gelu(g) and runs three kernels: du = dh * s, ds = dh * u, "
        "dg = gelu_backward(ds, g); count each read and write. Fused: read dh, g, u; write dg, du "
        "(gelu(g) recomputed in registers).",
    }
    for key in ("forward", "backward"):
        got = number(predicted[key], f"{name}[{key!r}]", "x")
        if abs(got - want[key]) > GEGLU_BAND:
            raise CheckFailed(f"{name}: {key} {got:.2f}x; the trips give {want[key]:.2f}x. {tips[key]}")
    return _passed(f"✓ {name}: forward {want['forward']:.2f}x, backward {want['backward']:.2f}x, as the trips count", 2)


# -- exercise 5: GeGLU forward and backward kernels ---------------------------------------------------------
#: (rows, F): one element, sizes around a block of 1024, more rows than a block
GEGLU_SHAPES = ((1, 1), (3, 1023), (2, 1025), (37, 129))
GEGLU_MANY = (257, 1000)


def geglu_inputs(shape, dtype, gen):
    """``g, u``: contiguous ``(rows, F)``, spread enough to reach GELU's bend and both tails."""
    g = grading.with_room_after(grading.randn(shape, dtype, gen=gen, scale=3.0))
    u = grading.with_room_after(grading.randn(shape, dtype, gen=gen, scale=2.0))
    return g, u


def geglu_reference(g, u):
    """``gelu(g) * u`` with the exact (erf) GELU, in float64, stored in g's dtype."""
    return (F.gelu(g.double()) * u.double()).to(g.dtype)


def geglu_bwd_reference(dh, g, u):
    """``(dg, du)``: ``du = dh · gelu(g)``, ``dg = dh · u · gelu'(g)``, ``gelu'(g) = Φ(g) + g · φ(g)``."""
    gd = g.double()
    cdf = 0.5 * (1 + torch.erf(gd / math.sqrt(2)))
    pdf = torch.exp(-0.5 * gd * gd) / math.sqrt(2 * math.pi)
    dhd, ud = dh.double(), u.double()
    return (dhd * ud * (cdf + gd * pdf)).to(g.dtype), (dhd * gd * cdf).to(g.dtype)


def check_geglu(geglu_fn) -> Passed:
    """Exercise 5a: ``geglu_fn(g, u)`` -> ``gelu(g) * u`` (exact GELU, fp32 inside, g's dtype), one kernel."""
    if not callable(geglu_fn):
        raise CheckFailed(f"geglu: pass your function, got {type(geglu_fn).__name__}.")
    return grading.check_function(
        geglu_fn,
        geglu_reference,
        geglu_inputs,
        name="geglu",
        sizes=GEGLU_SHAPES,
        many=GEGLU_MANY,
        hint="h = gelu(g) * u with the exact GELU: g * 0.5 * (1 + erf(g / sqrt(2))), in fp32.",
    )


def _geglu_bwd_inputs(shape, dtype, gen):
    g, u = geglu_inputs(shape, dtype, gen)
    return grading.with_room_after(grading.randn(shape, dtype, gen=gen, scale=1.0)), g, u


def check_geglu_backward(bwd_fn) -> Passed:
    """Exercise 5b: ``bwd_fn(dh, g, u)`` -> ``(dg, du)`` of ``h = gelu(g) * u`` (exact GELU), from one kernel
    that recomputes ``gelu(g)`` instead of reading a saved one."""
    name = "geglu_backward"
    if not callable(bwd_fn):
        raise CheckFailed(f"{name}: pass your function, got {type(bwd_fn).__name__}.")
    hints = (
        "dg = dh * u * gelu'(g), gelu'(g) = Phi(g) + g * phi(g) (Phi the normal CDF, phi its density), in fp32; "
        "dg and du from the same kernel, gelu(g) recomputed in registers.",
        "du = dh * gelu(g), in fp32; dg and du from the same kernel.",
    )
    checks = grading.check_function_pair(
        bwd_fn,
        geglu_bwd_reference,
        _geglu_bwd_inputs,
        name=name,
        parts=("dg", "du"),
        hints=hints,
        sizes=GEGLU_SHAPES,
        many=GEGLU_MANY,
    )
    return _passed(
        f"✓ {name}: {checks} checks passed (dg and du; shapes {', '.join(map(str, GEGLU_SHAPES))} × 2 dtypes, "
        f"{GEGLU_MANY}, one repeated; against float64, poisoned outputs, inputs unchanged, 1 launch each)",
        checks,
    )
