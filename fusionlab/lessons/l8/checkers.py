"""Checkers for lesson 8's exercises (solutions/08_flash_attention_backward.ipynb).

1. ``check_attention_grads``: the backward in float64 torch from the formulas,
   ``(q, k, v, o, lse, do, causal) -> (dq, dk, dv)``, grouped-query attention included. Checked against
   the spec on awkward shapes (one token, N_q != N_k both ways, causal, GQA 4/2) and on a probe whose
   ``lse`` is shifted row by row (P must be ``exp(s - lse)`` with the lse it is given: recomputing the
   softmax, or autograd through it, gives another answer there).
2. ``check_flash_dkdv``: the kernel: the preprocess ``D = rowsum(dO * O)`` and the dK/dV loop (one
   program per key tile of one K/V head, every query block and every query head of its group streamed
   through), exactly two launches, ``(q, k, v, o, lse, do, causal) -> (dk, dv)``; nothing allocated of
   the scores' size (a kernel that stores P), torch doing none of the work.
3. ``check_eager_backward_gib``: the bytes eager autograd's backward moves at one size.

Both gradient checks name the mistake an answer matches (:data:`MISTAKES`): D from dO and V instead
of dO and O (or D = rowsum(dP)), P without the log-sum-exp (``exp(s)``, ``exp(s - rowmax)``) or with
the wrong base (``2 ** (s - lse)``), the scale missing from dQ or dK, dS without the D term, the causal
mask forgotten in the backward, and GQA's dK/dV not summed over the group (one head's, or the mean).
"""

from __future__ import annotations

import math

import torch

from ... import grading, runtime
from ...grading import CheckFailed, answer_key, call_learner, fail, number
from ...kernels.attention import attention_reference
from ...kernels.attention_backward import attention_backward_ledger

Passed, _passed = grading.Passed, grading.passed
GIB = 2**30

#: mistake -> what to do about it; each is a variant of :func:`grads_with` the checks compare against
MISTAKES = {
    "D from dO and V": "D is rowsum(dO * O), one number per query row, from the forward's output O, not from V.",
    "D = rowsum(dP)": (
        "D is rowsum(P * dP) = rowsum(dO * O): the sum of dP weighted by P, not dP's plain row sum. Compute it "
        "from dO and O."
    ),
    "P = exp(s)": "P is exp(s - lse): without subtracting the forward's lse the rows are not normalised.",
    "P = exp(s - rowmax)": (
        "P is exp(s - lse), with the forward's log-sum-exp: exp(s - max) is the numerator of a softmax, not P. "
        "The lse already holds the max and the sum; nothing about the row needs recomputing."
    ),
    "P in base 2": (
        "P = 2 ** (s - lse) mixes bases: the lse is a natural log. Use exp(s - lse), or exp2 with s and lse "
        "both multiplied by log2(e)."
    ),
    "dQ without the scale": "dQ = dS K * scale: S = Q K^T * scale, so the scale comes back in the chain rule.",
    "dK without the scale": "dK = dS^T Q * scale: S = Q K^T * scale, so the scale comes back in the chain rule.",
    "dS without D": "dS = P * (dP - D): softmax's backward subtracts D = rowsum(dO * O) from every dP of the row.",
    "no causal mask in the backward": (
        "the forward masked keys j > i; P must be 0 there in the backward too (recompute it with the same mask), "
        "or those keys receive gradient they never earned."
    ),
    "GQA: one head of the group": (
        "a K/V head is read by every query head of its group: its dK and dV are the sum over all of them, not "
        "one head's."
    ),
    "GQA: the mean over the group": (
        "a K/V head's dK and dV are the sum over the query heads of its group, not their mean."
    ),
}


@answer_key
def grads_with(q, k, v, o, lse, do, causal: bool = False, mistake: str | None = None):
    """``(dq, dk, dv)`` in float64 from the formulas, as :func:`~fusionlab.kernels.attention_backward.
    attention_backward_reference` computes them, or with one of :data:`MISTAKES` made on purpose."""
    if mistake is not None and mistake not in MISTAKES:
        raise KeyError(mistake)
    B, H, n_q, d = q.shape
    H_kv, n_k = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(d)
    group = H // H_kv
    qd, od, dod = (t.detach().double() for t in (q, o, do))
    kd = k.detach().double().repeat_interleave(group, dim=1)
    vd = v.detach().double().repeat_interleave(group, dim=1)
    s = (qd @ kd.transpose(-2, -1)) * scale
    if causal and mistake != "no causal mask in the backward":
        keep = torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    lse_d = lse.detach().double()[..., None]
    if mistake == "P = exp(s)":
        p = torch.exp(s)
    elif mistake == "P = exp(s - rowmax)":
        p = torch.exp(s - s.amax(-1, keepdim=True))
    elif mistake == "P in base 2":
        p = torch.exp2(s - lse_d)
    else:
        p = torch.exp(s - lse_d)
    dp = dod @ vd.transpose(-2, -1)
    if mistake == "D from dO and V" and n_q == n_k:
        delta = (dod * vd).sum(-1)
    elif mistake == "D = rowsum(dP)":
        delta = dp.sum(-1)
    else:
        delta = (dod * od).sum(-1)
    ds = p * dp if mistake == "dS without D" else p * (dp - delta[..., None])
    dv = p.transpose(-2, -1) @ dod
    dq = ds @ kd * (1.0 if mistake == "dQ without the scale" else scale)
    dk = ds.transpose(-2, -1) @ qd * (1.0 if mistake == "dK without the scale" else scale)
    dk, dv = (t.view(B, H_kv, group, n_k, d) for t in (dk, dv))
    if mistake == "GQA: one head of the group" and group > 1:
        return dq, dk[:, :, 0], dv[:, :, 0]
    if mistake == "GQA: the mean over the group" and group > 1:
        return dq, dk.mean(2), dv.mean(2)
    return dq, dk.sum(2), dv.sum(2)


def backward_inputs(shape, dtype, gen, causal: bool, lse_shift: bool = False):
    """``q, k, v, o, lse, do`` for ``shape = (B, H, H_kv, N_q, N_k, D)``: o and lse the forward's (float64
    reference; o in ``dtype``, lse fp32 as a kernel returns it, float64 for float64 inputs), each tensor at
    the front of a longer NaN-padded buffer. ``lse_shift``: lse raised by 0.3 to 1.3 row by row (the probe
    that P uses the lse it is given)."""
    B, H, H_kv, n_q, n_k, d = shape
    q = torch.randn(B, H, n_q, d, generator=gen).to(runtime.DEVICE, dtype)
    k = torch.randn(B, H_kv, n_k, d, generator=gen).to(runtime.DEVICE, dtype)
    v = torch.randn(B, H_kv, n_k, d, generator=gen).to(runtime.DEVICE, dtype)
    do = torch.randn(B, H, n_q, d, generator=gen).to(runtime.DEVICE, dtype)
    o, lse = attention_reference(q, k, v, causal)
    if dtype == torch.float64:  # the reference's lse is fp32, as a kernel's: float64 work needs its own
        s = (q @ k.repeat_interleave(H // H_kv, dim=1).transpose(-2, -1)) / math.sqrt(d)
        if causal:
            s = s.masked_fill(~torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).tril(), float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
    if lse_shift:
        lse = lse + (0.3 + torch.rand(B, H, n_q, generator=gen)).to(lse.device)
    return tuple(grading.with_room_after(t) for t in (q, k, v, o, lse, do))


def magnitudes(q, k, v, o, lse, do, causal: bool = False):
    """The size of the terms each gradient sums, row by row: the formulas with every factor's absolute value
    (``|dP| + |D|`` for ``dP - D``). A rounding error is relative to them, not to the result, which can
    cancel to 0 (one key: dS = 0)."""
    B, H, n_q, d = q.shape
    H_kv, n_k = k.shape[1], k.shape[2]
    group = H // H_kv
    qa, oa, doa = (t.detach().double().abs() for t in (q, o, do))
    ka = k.detach().double().abs().repeat_interleave(group, dim=1)
    va = v.detach().double().abs().repeat_interleave(group, dim=1)
    s = (q.detach().double() @ k.detach().double().repeat_interleave(group, dim=1).transpose(-2, -1)) / math.sqrt(d)
    if causal:
        s = s.masked_fill(~torch.ones(n_q, n_k, dtype=torch.bool, device=s.device).tril(), float("-inf"))
    p = torch.exp(s - lse.detach().double()[..., None])
    ds = p * (doa @ va.transpose(-2, -1) + (doa * oa).sum(-1)[..., None])
    dq = ds @ ka / math.sqrt(d)
    dk = (ds.transpose(-2, -1) @ qa / math.sqrt(d)).view(B, H_kv, group, n_k, d).sum(2)
    dv = (p.transpose(-2, -1) @ doa).view(B, H_kv, group, n_k, d).sum(2)
    return {"dq": dq, "dk": dk, "dv": dv}


def _matching_mistake(got, inputs, causal, tol, names=("dq", "dk", "dv")) -> str | None:
    """The first of :data:`MISTAKES` whose gradients ``got`` (a dict by name) match within ``tol``."""
    mag = magnitudes(*inputs, causal)
    right = dict(zip(("dq", "dk", "dv"), grads_with(*inputs, causal), strict=True))
    for mistake in MISTAKES:
        alt = dict(zip(("dq", "dk", "dv"), grads_with(*inputs, causal, mistake), strict=True))
        # measured against the mistake's own size too: a P without the mask or the lse can be far larger
        if all(
            got[n].shape == alt[n].shape and _rel(got[n], alt[n], torch.maximum(mag[n], alt[n].abs())) <= tol
            for n in names
        ):
            if all(_rel(alt[n], right[n], mag[n]) <= tol for n in names):
                continue  # this input cannot tell the mistake from the right answer
            return mistake
    return None


def _rel(x: torch.Tensor, ref: torch.Tensor, mag: torch.Tensor) -> float:
    """The worst row's norm of the difference over the norm of the terms it sums (:func:`magnitudes`)."""
    x, ref, mag = (t.detach().double().cpu() for t in (x, ref, mag))
    if not x.numel():
        return 0.0
    if not torch.isfinite(x).all():
        return math.inf
    return ((x - ref).norm(dim=-1) / mag.norm(dim=-1).clamp_min(1e-30)).max().item()


# -- exercise 1: the gradients from the formulas, in float64 ---------------------------------------------
#: (B, H, H_kv, N_q, N_k, D): one token; N_q = N_k; N_q < N_k and N_q > N_k; grouped-query 4 / 2
GRAD_SHAPES = ((1, 1, 1, 1, 1, 4), (1, 2, 2, 9, 9, 8), (1, 2, 2, 5, 11, 8), (2, 1, 1, 11, 6, 8), (1, 4, 2, 10, 10, 8))
GRAD_TOL = 1e-9


def _grads(out, where, seed, want_shapes):
    if not (isinstance(out, (tuple, list)) and len(out) == len(want_shapes)):
        raise fail(f"{where}: return {len(want_shapes)} tensors; got {type(out).__name__}.", seed)
    names = ("dq", "dk", "dv")[-len(want_shapes) :]
    for name, t, shape in zip(names, out, want_shapes, strict=True):
        if not isinstance(t, torch.Tensor):
            raise fail(f"{where}: {name} should be a tensor, got {type(t).__name__}.", seed)
        if tuple(t.shape) != tuple(shape):
            hint = ""
            if name in ("dk", "dv") and t.dim() == 4 and t.shape[1] != shape[1]:
                hint = (
                    f" It has {t.shape[1]} heads, k has {shape[1]}: with grouped-query attention a K/V head's "
                    "gradient is the sum over the query heads of its group."
                )
            raise fail(f"{where}: {name} has shape {tuple(t.shape)}, expected {tuple(shape)}.{hint}", seed)
    return dict(zip(names, out, strict=True))


def check_attention_grads(fn) -> Passed:
    """Exercise 1: ``fn(q, k, v, o, lse, do, causal) -> (dq, dk, dv)`` in float64 torch, from the formulas
    (P recomputed as ``exp(s - lse)``), q (B, H, N_q, D), k and v (B, H_kv, N_k, D), H a multiple of
    H_kv, scale ``1 / sqrt(D)``, causal top-left (query i sees keys j <= i)."""
    name = "attention_grads"
    if not callable(fn):
        raise CheckFailed(f"{name}: pass your function, got {type(fn).__name__}.")
    seed = grading.new_seed()
    checks = 0
    plan = [(s, c, False) for s in GRAD_SHAPES for c in (False, True)] + [(GRAD_SHAPES[-1], True, True)]
    with grading.seeded(seed):
        for shape, causal, shift in plan:
            inputs = backward_inputs(shape, torch.float64, grading.fresh_generator(), causal, lse_shift=shift)
            q, k = inputs[0], inputs[1]
            where = f"{name}, (B, H, H_kv, N_q, N_k, D) = {shape}" + (", causal" if causal else "")
            where += ", lse shifted row by row" if shift else ""
            out = call_learner(fn, *(t.clone() for t in inputs), causal, name=name, where=where, seed=seed)
            got = _grads(out, where, seed, (q.shape, k.shape, k.shape))
            want = dict(zip(("dq", "dk", "dv"), grads_with(*inputs, causal), strict=True))
            mag = magnitudes(*inputs, causal)
            bad = [n for n in want if _rel(got[n], want[n], mag[n]) > GRAD_TOL]
            if bad:
                if shift:
                    raise fail(
                        f"{where}: {', '.join(bad)} differ from exp(s - lse)'s. The lse handed over here is not "
                        "the row's own log-sum-exp, so a P recomputed by a softmax (or by autograd through one) "
                        "gives another answer: recompute P as exp(s - lse) from the lse you are given, as the "
                        "kernel does.",
                        seed,
                    )
                mistake = _matching_mistake(got, inputs, causal, 1e-6)
                if mistake is not None:
                    raise fail(f"{where}: your gradients match the mistake «{mistake}»: {MISTAKES[mistake]}", seed)
                raise fail(
                    f"{where}: {', '.join(bad)} differ from the formulas beyond a relative {GRAD_TOL:g} "
                    "(float64 in, float64 out: keep the dtype).",
                    seed,
                )
            checks += 1
    return _passed(
        f"✓ attention_grads: {checks} checks passed ({len(GRAD_SHAPES)} shapes × causal and not: one token, "
        "N_q != N_k both ways, GQA 4/2; a probe with lse shifted row by row). dQ, dK, dV against the formulas in "
        "float64",
        checks,
    )


# -- exercise 2: the kernel: D, then dK and dV per key tile -------------------------------------------------
#: (B, H, H_kv, N_q, N_k, D), causal: one token; N past a tile; N_q != N_k both ways; GQA 4/2; a head dim
#: that needs padding; more queries than a few blocks (many programs over the query loop)
DKDV_CASES = (
    ((1, 2, 2, 40, 40, 16), False),  # first: a shape where every named mistake shows (not so at one token)
    ((1, 1, 1, 1, 1, 16), False),
    ((2, 1, 1, 37, 70, 16), False),
    ((1, 2, 2, 70, 37, 32), False),
    ((1, 4, 2, 45, 45, 16), False),
    ((1, 1, 1, 1, 1, 16), True),
    ((1, 2, 2, 50, 50, 16), True),
    ((1, 1, 1, 40, 70, 16), True),
    ((1, 4, 2, 45, 45, 24), True),
    ((1, 1, 1, 130, 130, 16), True),
)
#: the lse probe: P must use the lse it is given
DKDV_PROBE = ((1, 2, 1, 40, 40, 16), True)
#: tolerance on dK and dV, the worst row's error over the size of the terms it sums (:func:`magnitudes`);
#: the solution's worst over 3 seeds of every case, on this interpreter: 3e-7 (fp32), 5e-4 (fp16)
DKDV_TOL = {torch.float32: 1e-5, torch.float16: 5e-3, torch.bfloat16: 2e-2}
#: a mistake is named when the answer is this close to it (the mistakes lie 0.03 or more from the right answer)
MISTAKE_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}


def _dtypes():
    return [torch.float32, torch.float16] if runtime.is_interpreter() else [torch.float16, torch.bfloat16]


def _run_dkdv(fn, shape, causal, dtype, seed, shift=False):
    name = "flash_dkdv"
    inputs = backward_inputs(shape, dtype, grading.fresh_generator(), causal, lse_shift=shift)
    k = inputs[1]
    B, H, H_kv, n_q, n_k, d = shape
    where = f"{name}, (B, H, H_kv, N_q, N_k, D) = {shape}, {grading.dtype_name(dtype)}" + (", causal" if causal else "")
    where += ", lse shifted row by row" if shift else ""
    out, box = grading.run_answer(
        fn,
        (*inputs, causal),
        name=name,
        where=where,
        seed=seed,
        store_hint="Mask the stores of D with the query rows and of dK, dV with offs_n < N_k (and the head dim).",
        torch_message=lambda ops: (
            f"the answer computes or copies with torch ({ops}); D, dK and dV are your kernels' work (allocate "
            "with torch.empty and nothing else)."
        ),
        before_torch=lambda box, out: _grads(out, where, seed, (k.shape, k.shape)),
    )
    got = _grads(out, where, seed, (k.shape, k.shape))
    scores = B * H * n_q * n_k
    # only where the scores outnumber every tensor the answer needs (D, dK, dV) is an allocation that size P's
    needed = max(B * H * n_q, B * H_kv * n_k * d)
    big = [a for a in box.allocations if scores > needed and a.numel() >= scores]
    if big:
        raise fail(
            f"{where}: your code allocates a {tuple(big[0].shape)} tensor, at least the {scores} entries of P "
            "(B * H * N_q * N_k). The backward's point is that P, dP and dS never reach HBM: recompute each tile "
            "of P from Q, K and lse in registers, use it, and let it go.",
            seed,
        )
    for n, t in got.items():
        if grading.poisoned(t).any():
            raise fail(
                f"{where}: {int(grading.poisoned(t).sum())} elements of {n} were never written. Check the grid "
                "(key tiles x B * H_kv) and the store masks; a key tile no query sees stores zeros.",
                seed,
            )
    want = dict(zip(("dk", "dv"), grads_with(*inputs, causal)[1:], strict=True))
    mag = magnitudes(*inputs, causal)
    bad = [n for n in ("dk", "dv") if _rel(got[n], want[n], mag[n]) > DKDV_TOL[dtype]]
    if not bad:  # right values, then the launches: a named mistake (below) tells more than a launch count
        grading.require_launches(
            box,
            out,
            inputs,
            where,
            seed,
            launches=2,
            why="Two kernels: the preprocess that writes D, then the dK/dV loop that reads it.",
        )
        return
    if shift:
        raise fail(
            f"{where}: {', '.join(bad)} differ from exp(s - lse)'s. The lse handed over here is not the row's own "
            "log-sum-exp: recompute P as exp(s - lse) from the lse you are given.",
            seed,
        )
    mistake = _matching_mistake(got, inputs, causal, MISTAKE_TOL[dtype], names=("dk", "dv"))
    if mistake is not None:
        raise fail(f"{where}: your dK, dV match the mistake «{mistake}»: {MISTAKES[mistake]}", seed)
    if not all(torch.isfinite(t.detach().double().cpu()).all() for t in got.values()):
        raise fail(
            f"{where}: dK or dV holds inf or NaN. Rows past N_q must load lse = +inf (their P is 0) and D = 0; "
            "keys past N_k and head-dim columns past D must load as 0.",
            seed,
        )
    hint = (
        " Causal: a key tile's loop starts at the query block holding its first key, and the blocks on the "
        "diagonal need the mask (query i sees key j only where j <= i)."
        if causal
        else ""
    )
    raise fail(f"{where}: {', '.join(bad)} differ from float64 beyond {DKDV_TOL[dtype]:g} (worst row).{hint}", seed)


def check_flash_dkdv(fn) -> Passed:
    """Exercise 2: ``fn(q, k, v, o, lse, do, causal) -> (dk, dv)``: two Triton launches, the preprocess
    ``D = rowsum(dO * O)`` (fp32, one per query row) and the dK/dV kernel, one program per key tile of a
    K/V head, streaming every query block (causal: those at or below the tile) of every query head of its
    group, P recomputed as ``exp(s - lse)`` on chip. q, o, do (B, H, N_q, D); k, v (B, H_kv, N_k, D)."""
    name = "flash_dkdv"
    if not callable(fn):
        raise CheckFailed(f"{name}: pass your function, got {type(fn).__name__}.")
    seed = grading.new_seed()
    checks = 0
    with grading.seeded(seed):
        for dtype in _dtypes():
            for shape, causal in DKDV_CASES:
                _run_dkdv(fn, shape, causal, dtype, seed)
                checks += 1
        _run_dkdv(fn, DKDV_CASES[2][0], False, _dtypes()[0], seed)  # a shape again, fresh values
        _run_dkdv(fn, *DKDV_PROBE, _dtypes()[0], seed, shift=True)
        checks += 2
    return _passed(
        f"✓ flash_dkdv: {checks} checks passed ({len(DKDV_CASES)} shapes × 2 dtypes: one token, N_q != N_k both "
        "ways, GQA 4/2, D = 24, causal and not; one repeated; an lse probe). dK, dV against float64, 2 launches, "
        "nothing the size of P, no torch compute",
        checks,
    )


# -- exercise 3: eager's backward trips ----------------------------------------------------------------------
#: the size of the question: (B, H, N, D), bf16, not causal
EAGER_SHAPE = (1, 16, 8192, 128)


def check_eager_backward_gib(gib) -> Passed:
    """Exercise 3: the GiB eager autograd's backward of naive attention moves through HBM (reads plus writes,
    the ledger's count) at :data:`EAGER_SHAPE`, bf16, not causal. Within 2% (the N x d terms are small)."""
    got = number(gib, "my_eager_backward_gib", "GiB")
    B, H, N, D = EAGER_SHAPE
    led = attention_backward_ledger(B, H, N, N, D, torch.bfloat16)
    want = led.unfused_bytes / GIB
    one = B * H * N * N * 2 / GIB  # one N x N bf16 trip
    if abs(got - want) <= 0.02 * want:
        return _passed(
            f"✓ eager backward: {want:.2f} GiB, of which {8 * one:.0f} GiB are eight trips of an N x N matrix "
            "(P read twice; dP written and read; dS written and read; the scaled dS written and read)"
        )
    tips = {
        4: "Four N x N trips counts each intermediate once: count every write and every read (P is read by two "
        "kernels, and dP, dS and the scaled dS are each written and read back).",
        6: "Six: the scale's backward is a kernel of its own, reading dS and writing the scaled dS.",
        7: "Seven: nearly; P is read by two kernels (PV's backward and softmax's).",
        16: "Sixteen N x N bf16 trips is eight in fp32; these are bf16 (2 bytes).",
    }
    tip = grading.memory_answer_tip(got, want, one, tips, 2)
    raise CheckFailed(f"my_eager_backward_gib = {got:.4g}, expected about {want:.2f} GiB.{tip}")
