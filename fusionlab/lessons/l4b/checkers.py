"""Checkers for lesson 4b's exercises (solutions/04b_randomness_and_many_tensors.ipynb).

1. ``check_dropout_add``: ``h = residual + dropout(x, p)`` in one Triton kernel, the random numbers made
   in registers from ``(seed, position)``. Rejects: a missing ``1/(1 - p)``, a keep rate outside the
   binomial bounds, random numbers that are not each element's own (one a program, or the same in
   every block), a result that changes between two calls with one seed (or does not change with the
   seed), and a mask stored beside h (any allocation but h of a bit an element or more); it runs as
   every kernel check runs (:func:`fusionlab.grading.run_answer`: stores past the end, inputs changed,
   torch or anything else computing the result outside the kernel).
2. ``check_dropout_backward``: ``dx = dh * keep / (1 - p)`` with the mask **regenerated** from the seed.
   Rejects a backward whose zeros are not the forward's (not regenerated identically), and one that
   only works after the forward ran with that seed (a mask stashed and re-read): the backward is
   called first, for a seed the forward has never seen.
3. ``check_streams``: ``stream_for(step, layer) -> (seed, offset)`` for a model whose every dropout call
   uses ``counters`` Philox counters from its offset. Rejects two (step, layer) pairs whose streams
   overlap (the same mask in two layers, or in two steps).
4. ``check_adamw``: one AdamW step for a list of tensors, in place, in **one** launch. Rejects one launch
   per tensor, torch doing the update, a store past a tensor's end (each sits before a guard), a missing
   bias correction or that of the step before, weight decay added to the gradient (Adam's L2) in place
   of decoupled decay or applied after the update, and eps inside the square root (one tensor's
   gradients are tiny, where it shows) — each named when the answer matches that mistake.
"""

from __future__ import annotations

import math
import numbers

import torch

from ... import grading, runtime
from ...grading import call_learner, fail
from ...kernels.adamw import adamw_reference

Passed, _passed = grading.Passed, grading.passed

DROPOUT_SHAPES = ((1, 1), (7, 37), (64, 515))
P_VALUES = (0.1, 0.5)


def _inputs(shape, gen):
    """x at least 0.5 from zero (a kept element always changes h, a dropped one never does), r any."""
    x = grading.randn(shape, gen=gen)
    x = torch.where(x >= 0, x + 0.5, x - 0.5)
    r = grading.randn(shape, gen=gen)
    return grading.with_room_after(x), grading.with_room_after(r)  # an unmasked load reads NaN, not the heap


def _kept(h, r):
    return h != r  # x is never exactly 0 in these inputs, so h == r only where x was dropped


def _refuse_a_stored_mask(x: torch.Tensor, where: str, seed: int):
    """The check run before the torch check (filling a mask is a torch pass, and the mask the mistake): any
    allocation beside h of a bit an element or more (bool or uint8: a byte; packed: a bit) is a mask."""

    def check(box, h) -> None:
        big = [a for a in box.allocations if 8 * a.numel() * a.element_size() >= x.numel()]
        if isinstance(h, torch.Tensor):
            # h itself: the same memory, or (the grading command's report, allocations as meta tensors of their
            # shapes) the first of h's shape and dtype
            own = [a for a in big if a.device.type != "meta" and a.data_ptr() == h.data_ptr()]
            own = own or [a for a in big if a.device.type == "meta" and (a.shape, a.dtype) == (h.shape, h.dtype)][:1]
            big = [a for a in big if not any(a is o for o in own)]
        if big:
            raise fail(
                f"{where}: your answer allocates a {tuple(big[0].shape)} {big[0].dtype} tensor beside h: a "
                "mask stored in memory. Make the random numbers in registers (tl.rand(seed, offsets)) and keep "
                "the decision there; the backward makes them again from the seed.",
                seed,
            )

    return check


def _refuse_a_mask_that_repeats(keep: torch.Tensor, where: str, seed: int) -> None:
    """A mask whose random numbers are not each element's own: the same within a block (seeded by the program
    id), or the same in every block (seeded by tl.arange alone). Independent elements agree with a neighbour k
    apart a fraction (1 - p)² + p² of the time (0.5 to 0.82 here); such masks nearly always."""
    keep = keep.cpu()
    for k in [1] + [2**i for i in range(4, 13)]:
        if keep.numel() > 4 * k and float((keep[:-k] == keep[k:]).double().mean()) > 0.99:
            if k == 1:
                why = (
                    "neighbouring elements are kept or dropped together: one random number serves many of them "
                    "(tl.rand(seed, pid)?). Give each element its own: tl.rand(seed, offs), offs its position."
                )
            else:
                why = (
                    f"the mask repeats every {k} elements: each block makes the same random numbers (tl.rand(seed, "
                    "tl.arange(0, BLOCK))?). Use each element's position in the tensor, pid * BLOCK + tl.arange(0, "
                    "BLOCK), as the offset."
                )
            raise fail(f"{where}: {why}", seed)


def _run(fn, args, *, name: str, where: str, seed: int, like: torch.Tensor, before_torch=None, why: str = ""):
    """``fn(*args)`` run as every kernel check runs it (:func:`grading.run_answer`: inputs unchanged, no store
    past the end, no torch, inputs concealed outside the kernel), one launch handed its input and output,
    returning a tensor of ``like``'s shape."""
    out, box = grading.run_answer(fn, args, name=name, where=where, seed=seed, before_torch=before_torch)
    if not isinstance(out, torch.Tensor) or out.shape != like.shape:
        raise fail(f"{where}: return a tensor of the shape of {name.split()[0]}'s input ({tuple(like.shape)}).", seed)
    inputs = [a for a in args if isinstance(a, torch.Tensor)]
    grading.require_launches(box, out, inputs, where, seed, why=why or "The dropout and the add are one kernel.")
    return out, box


def _dropped_or_scaled(out: torch.Tensor, base: torch.Tensor, x: torch.Tensor, p: float) -> bool:
    """Whether every element of ``out`` is ``base`` (dropped) or ``base + x / (1 - p)`` (kept)."""
    kept = torch.isclose(out, base + x / (1 - p), atol=1e-5, rtol=1e-5)
    return bool((kept | torch.isclose(out, base, atol=1e-5, rtol=1e-5)).all())


def _outside(box, out, inputs, p, where, seed, *, backward: bool = False):
    """The failure naming a result that is dropout of the decoys the inputs held outside the kernel: computed
    elsewhere (numpy, torch out of sight) and copied in; None if it is not."""
    decoys = [box.decoy_of(t) for t in inputs]
    if any(d is None for d in decoys):
        return None
    if backward:
        (dh,) = decoys
        match = _dropped_or_scaled(out, torch.zeros_like(dh), dh, p)
    else:
        x, r = decoys
        match = _dropped_or_scaled(out, r, x, p)
    if not match:
        return None
    return fail(
        f"{where}: your result is dropout of the values the inputs held outside your kernel, values your kernel "
        "never read: it was computed outside the kernel (numpy, a library, torch out of sight) and copied in. The "
        "kernel must compute it from the inputs it is handed.",
        seed,
    )


def check_dropout_add(fn) -> Passed:
    """``fn(x, residual, p, seed)`` returns ``residual + dropout(x, p)``: kept elements ``x / (1 - p)``."""
    name = "dropout_add"
    seed = grading.new_seed()
    checks = 0
    with grading.seeded(seed):
        for shape in DROPOUT_SHAPES:
            for p in P_VALUES:
                x, r = _inputs(shape, grading.fresh_generator())
                s = seed % 2**31 + checks
                where = f"{name}, shape {shape}, p={p}"
                guard = _refuse_a_stored_mask(x, where, seed)
                h, box = _run(fn, (x, r, p, s), name=name, where=where, seed=seed, like=x, before_torch=guard)
                keep = _kept(h, r)
                want = torch.where(keep, r + x / (1 - p), r)
                if not torch.allclose(h, want, atol=1e-5, rtol=1e-5):
                    if torch.allclose(h, torch.where(keep, r + x, r), atol=1e-5, rtol=1e-5):
                        raise fail(
                            f"{where}: kept elements are x, not x / (1 - p). Without the 1/(1 - p) scaling the "
                            "expected value of dropout(x) is (1 - p) x, and eval mode (no dropout) would see a "
                            "different scale than training.",
                            seed,
                        )
                    outside = _outside(box, h, (x, r), p, where, seed)
                    if outside is not None:
                        raise outside
                    raise fail(f"{where}: h is neither residual nor residual + x / (1 - p) somewhere.", seed)
                n = x.numel()
                if n >= 1000:
                    _refuse_a_mask_that_repeats(keep.flatten(), where, seed)
                    kept = int(keep.sum())
                    sd = math.sqrt(n * p * (1 - p))
                    if abs(kept - n * (1 - p)) > 5 * sd:
                        raise fail(
                            f"{where}: {kept} of {n} kept; a keep probability of 1 - p = {1 - p} gives "
                            f"{n * (1 - p):.0f} ± {5 * sd:.0f} (5 standard deviations). Keep where rand >= p.",
                            seed,
                        )
                again, _ = _run(fn, (x, r, p, s), name=name, where=where, seed=seed, like=x, before_torch=guard)
                if not torch.equal(again, h):
                    raise fail(f"{where}: two calls with the same seed gave different masks.", seed)
                if n >= 1000:
                    other, _ = _run(fn, (x, r, p, s + 1), name=name, where=where, seed=seed, like=x)
                    if torch.equal(other, h):
                        raise fail(f"{where}: seed {s} and seed {s + 1} gave the same mask: use the seed.", seed)
                checks += 1
    return _passed(
        f"✓ {name}: {checks} checks passed (shapes {', '.join(map(str, DROPOUT_SHAPES))} × p in {P_VALUES}: the "
        "1/(1 - p) scaling, keep rate within 5 sigma, same seed same mask, another seed another, nothing stored, "
        "1 launch each)",
        checks,
    )


def check_dropout_backward(forward, backward) -> Passed:
    """``backward(dh, p, seed)`` returns ``dh * keep / (1 - p)`` with ``keep`` the mask ``forward(x, r, p,
    seed)`` applied: regenerated from the seed, not read from memory."""
    name = "dropout_add backward"
    seed = grading.new_seed()
    checks = 0
    with grading.seeded(seed):
        for shape in DROPOUT_SHAPES[1:]:
            for p in P_VALUES:
                s = (seed + 7919 * (checks + 1)) % 2**31  # a seed no forward has used yet
                where = f"{name}, shape {shape}, p={p}"
                dh = grading.randn(shape, gen=grading.fresh_generator())
                dh = torch.where(dh == 0, torch.ones_like(dh), dh)
                # the backward first: nothing can have been stashed for s
                dx, box = _run(backward, (dh, p, s), name=name, where=where, seed=seed, like=dh,
                               why="The backward is one kernel.")  # fmt: skip
                x, r = _inputs(shape, grading.fresh_generator())
                h, _ = _run(forward, (x, r, p, s), name="dropout_add", where=where, seed=seed, like=x)
                keep = _kept(h, r)
                if not torch.equal(dx != 0, keep):
                    outside = _outside(box, dx, (dh,), p, where, seed, backward=True)
                    if outside is not None:
                        raise outside
                    differ = int((dx != 0).ne(keep).sum())
                    raise fail(
                        f"{where}: called before any forward with seed {s}, your backward's mask differs from the "
                        f"forward's in {differ} of {dh.numel()} places. The backward must make the very same random "
                        "numbers: the same seed and the same offsets (each element's position), the same rule "
                        "(keep where rand >= p). A mask saved by the forward and read back is not available here.",
                        seed,
                    )
                want = torch.where(keep, dh / (1 - p), torch.zeros_like(dh))
                if not torch.allclose(dx, want, atol=1e-5, rtol=1e-5):
                    raise fail(f"{where}: kept elements of dx must be dh / (1 - p), the forward's scaling.", seed)
                checks += 1
    return _passed(
        f"✓ {name}: {checks} checks passed (the backward called first for an unseen seed; its mask the "
        "forward's, element for element; the 1/(1 - p) scaling; 1 launch each)",
        checks,
    )


def check_streams(stream_for, counters: int, steps: int = 4, layers: int = 6) -> Passed:
    """``stream_for(step, layer)`` gives ``(seed, offset)``; each call uses ``counters`` counters from the
    offset. No two (step, layer) pairs may share a counter under one seed."""
    name = "stream_for"
    spans = {}
    for step in range(steps):
        for layer in range(layers):
            got = call_learner(stream_for, step, layer, name=name, where=f"{name}({step}, {layer})")
            # a pair of whole numbers of any integer type (a numpy int from arithmetic on an array is one)
            if not (
                isinstance(got, (tuple, list))
                and len(got) == 2
                and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in got)
            ):
                raise fail(f"{name}({step}, {layer}): return (seed, offset), two ints; got {got!r}.")
            spans[(step, layer)] = (int(got[0]), int(got[1]))
    by_seed: dict = {}
    for key, (s, off) in spans.items():
        by_seed.setdefault(s, []).append((off, key))
    for s, items in by_seed.items():
        items.sort()
        for (o1, k1), (o2, k2) in zip(items, items[1:], strict=False):
            if o2 < o1 + counters:
                what = "two layers" if k1[0] == k2[0] else ("two steps" if k1[1] == k2[1] else "two calls")
                raise fail(
                    f"{name}: step {k1[0]} layer {k1[1]} and step {k2[0]} layer {k2[1]} share seed {s} and their "
                    f"counters overlap (offsets {o1} and {o2}, {counters} counters a call): {what} would drop the "
                    "same elements. Give each (step, layer) its own seed, or offsets at least a call's counters apart."
                )
    n = steps * layers
    return _passed(f"✓ {name}: {n} (step, layer) streams, no two sharing a counter", n)


# -- AdamW ---------------------------------------------------------------------------------------------------
ADAMW_SHAPES = ((3,), (17, 9), (1000,), (130, 33))
#: beta2 = 0.999 (torch's default), not 0.99: with beta1 = 0.9 and beta2 = 0.99 the first step's two corrections
#: cancel ((1 - beta1) / sqrt(1 - beta2) = 1), and a step without them passed as one with them
HP = dict(lr=0.05, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.2)


#: the scale of the last tensor's gradients (its moments follow: m ~ g, v ~ g²): a parameter whose gradients are
#: tiny, where sqrt(v_hat) is far below eps's square root, so eps inside the root shows (elsewhere it hides)
TINY = 1e-7


def _adamw_state(gen, shapes=ADAMW_SHAPES):
    dev = runtime.DEVICE
    scales = [1.0] * (len(shapes) - 1) + [TINY]
    ps = [torch.randn(s, generator=gen).to(dev) for s in shapes]
    gs = [k * torch.randn(s, generator=gen).to(dev) for s, k in zip(shapes, scales, strict=True)]
    ms = [0.1 * k * torch.randn(s, generator=gen).to(dev) for s, k in zip(shapes, scales, strict=True)]
    vs = [0.1 * k * k * torch.rand(s, generator=gen).to(dev) for s, k in zip(shapes, scales, strict=True)]
    return ps, gs, ms, vs


def _guarded(ts):
    """Each of ``ts`` copied to the front of a longer buffer whose tail (the guard, poisoned) a store past the
    tensor's end lands in, where it would otherwise write over another tensor's memory: (copies, guards)."""
    views, guards = [], []
    for t in ts:
        n = t.numel()
        big = grading.poison_(torch.empty(n + max(n, grading.GUARD_MIN), dtype=t.dtype, device=t.device))
        big[:n] = t.reshape(-1)
        views.append(big[:n].view(t.shape))
        guards.append(big[n:])
    return views, guards


def _mistake(p, g, m, v, step, kind):
    """The answer a known mistake gives (float64)."""
    p, g, m, v = (t.double() for t in (p, g, m, v))
    lr, b1, b2, eps, wd = HP["lr"], HP["beta1"], HP["beta2"], HP["eps"], HP["weight_decay"]
    if kind.startswith("weight decay added"):
        g = g + wd * p
        wd = 0.0
    if kind != "the decay after the update":
        p = p * (1 - lr * wd)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    k = step - 1 if kind == "the bias correction of the step before" else step
    bc1, bc2 = (1.0, 1.0) if kind == "no bias correction" or k == 0 else (1 - b1**k, 1 - b2**k)
    if kind == "eps inside the square root":
        p = p - (lr / bc1) * m / (v / bc2 + eps).sqrt()
    else:
        p = p - (lr / bc1) * m / (v.sqrt() / math.sqrt(bc2) + eps)
    return p * (1 - lr * wd) if kind == "the decay after the update" else p


def check_adamw(fn) -> Passed:
    """``fn(params, grads, exp_avgs, exp_avg_sqs, step, lr, beta1, beta2, eps, weight_decay)`` updates the
    lists in place (step: the count after this step), one launch for all tensors."""
    name = "adamw_step"
    seed = grading.new_seed()
    checks = 0
    with grading.seeded(seed):
        for step in (1, 2, 10):
            ps, gs, ms, vs = _adamw_state(grading.fresh_generator())
            (ps, ms, vs), guards = zip(*(_guarded(ts) for ts in (ps, ms, vs)), strict=True)
            ps, ms, vs = list(ps), list(ms), list(vs)
            want = [adamw_reference(p, g, m, v, step=step, **HP) for p, g, m, v in zip(ps, gs, ms, vs, strict=True)]
            before = [(p.clone(), g.clone(), m.clone(), v.clone()) for p, g, m, v in zip(ps, gs, ms, vs, strict=True)]
            where = f"{name}, {len(ps)} tensors, step {step}"
            box = grading.Sandbox(guard=False)
            box.conceal(ps + gs + ms + vs)  # real values only while a kernel runs: computed elsewhere, it is wrong
            with box:
                call_learner(fn, ps, gs, ms, vs, step, *HP.values(), name=name, where=where, seed=seed)
            grading.refuse_own_kernels(box, where, seed, "Write the kernel yourself: that is the exercise.")
            torch_ops = sorted(set(box.torch_ops) | set(box.hidden_ops))
            if torch_ops:
                raise fail(
                    f"{where}: the answer computes with torch ({', '.join(torch_ops)}). The update must happen "
                    "inside your one Triton kernel; torch only builds the table of addresses.",
                    seed,
                )
            for what, gs_of in zip(("params", "exp_avgs", "exp_avg_sqs"), guards, strict=True):
                for i, g in enumerate(gs_of):
                    hit = ~grading.poisoned(g)
                    if hit.any():
                        raise fail(
                            f"{where}: your kernel wrote {grading.plural(int(hit.sum()), 'element')} past the end of "
                            f"{what}[{i}], into whatever follows it in memory. Mask "
                            "each chunk's loads and stores with offs < the tensor's numel (not <=).",
                            seed,
                        )
            n = len(box.launches)
            if n == len(ps) and n > 1:
                raise fail(
                    f"{where}: {n} Triton launches, one a tensor. One launch was asked: pass a table of the "
                    "tensors' addresses (an int64 tensor of data_ptr()s) and sizes, and map programs to chunks.",
                    seed,
                )
            if n != 1:
                raise fail(f"{where}: {n} Triton launches; one for all tensors was asked.", seed)
            for i, (p, (wp, _, _)) in enumerate(zip(ps, want, strict=True)):
                if torch.allclose(p.double().cpu(), wp.cpu(), atol=1e-5, rtol=1e-5):
                    continue
                p0, g0, m0, v0 = before[i]
                for kind, advice in (
                    ("no bias correction", "divide m by 1 - beta1**step and v by 1 - beta2**step (bias correction)"),
                    (
                        "the bias correction of the step before",
                        "step is the count after this step (1 on the first): 1 - beta1**step, not beta1**(step - 1)",
                    ),
                    (
                        "the decay after the update",
                        "decay the parameter before the Adam step (p *= 1 - lr * weight_decay, then the update), as "
                        "torch.optim.AdamW does",
                    ),
                    (
                        "eps inside the square root",
                        "add eps to the root of v's correction, sqrt(v / (1 - beta2**step)) + eps, not under it: on a "
                        "parameter of tiny gradients (this one's are near 1e-7) the two differ",
                    ),
                    (
                        "weight decay added to the gradient (Adam's L2)",
                        "decay the parameter itself, p *= 1 - lr * weight_decay, not the gradient (that is Adam's "
                        "L2, which the moments then rescale)",
                    ),
                ):  # fmt: skip
                    if torch.allclose(p.double().cpu(), _mistake(p0, g0, m0, v0, step, kind).cpu(), atol=1e-5):
                        raise fail(f"{where}: tensor {i} matches AdamW with {kind}: {advice}.", seed)
                raise fail(f"{where}: tensor {i}'s parameters differ from AdamW's.", seed)
            for i, (m, v, (_, wm, wv)) in enumerate(zip(ms, vs, want, strict=True)):
                if not (
                    torch.allclose(m.double().cpu(), wm.cpu(), atol=1e-6)
                    and torch.allclose(v.double().cpu(), wv.cpu(), atol=1e-6)
                ):
                    raise fail(f"{where}: tensor {i}'s exp_avg or exp_avg_sq differs from AdamW's.", seed)
            checks += 1
    return _passed(
        f"✓ {name}: {checks} steps checked ({len(ADAMW_SHAPES)} tensors each, steps 1, 2, 10: bias correction, "
        "decoupled weight decay, the moments, 1 launch for all tensors)",
        checks,
    )
