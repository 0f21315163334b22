"""Checkers for lesson 7b's exercises (solutions/07b_your_own_attention.ipynb).

1. ``check_masked_attention``: the spec in float64 torch, ``fn(q, k, v, keep, score_mod) -> O`` with a
   boolean mask ``keep`` (N_q, N_k) and a score modification (a torch function of the scaled scores, or
   None). Rejects a mask applied after the softmax (the hidden keys kept their share of the denominator),
   a modification applied after the mask (softcap turns -inf into -cap: the hidden keys come back), and
   NaN for a row that sees no key (O = 0 there, as ``flex_attention`` gives).
2. ``check_softcap``: a ``@triton.jit`` score modification ``(score, b, h, q_idx, kv_idx, aux, cap, a1)``
   run inside the package's kernel. Rejects a softcap applied after scaling twice (the kernel hands the
   function the score already times ``scale``), a tanh not multiplied back by ``cap``, a hard clamp, and
   a function that does not compile (named, with the compiler's reason).
3. ``check_sliding_window`` and ``check_document_mask``: a :class:`~fusionlab.kernels.attention.MaskMod`
   maker (its torch function builds the block lists, its jit function masks the partial blocks). Reject
   a window off by one either way (the first wrong (query, key) pair named), a document mask that leaks
   across documents or forgets causality, and a jit function that disagrees with its torch twin.
4. ``check_block_lists``: ``fn(keep, block_m, block_n) -> (full, partial)``, the block lists from a dense
   mask. Rejects a block skipped that was partly visible, a block called full that hides a pair (the
   kernel would run it unmasked), a block in both lists, and a key block that hangs past N_k called full.
"""

from __future__ import annotations

import math

import torch

from ... import grading, runtime
from ...grading import CheckFailed, call_learner, fail
from ...kernels import KernelInputError
from ...kernels.attention import attention, attention_reference
from ...kernels.attention_mods import MaskMod, ScoreMod, block_mask, mod_error_text, softcap

Passed, _passed = grading.Passed, grading.passed


# -- the masks the checks draw ------------------------------------------------------------------------
def _window_keep(n_q: int, n_k: int, w: int) -> torch.Tensor:
    i = torch.arange(n_q).view(-1, 1)
    j = torch.arange(n_k).view(1, -1)
    return (j <= i) & (j > i - w)


def _docs(n: int, gen: torch.Generator, docs: int) -> torch.Tensor:
    cuts = torch.sort(torch.randperm(n - 1, generator=gen)[: docs - 1] + 1).values
    ids = torch.zeros(n, dtype=torch.long)
    ids[cuts] = 1
    return ids.cumsum(0)


def _doc_keep(ids: torch.Tensor, causal: bool = True) -> torch.Tensor:
    keep = ids.view(-1, 1) == ids.view(1, -1)
    return keep & torch.ones_like(keep).tril() if causal else keep


def _first_pair(got: torch.Tensor, want: torch.Tensor) -> tuple[int, int, bool]:
    """The first (query, key) where two masks differ, and whether ``got`` keeps it: a pair kept that should
    be hidden first (a leak changes what the model reads; a hidden pair only loses a key)."""
    leaks = got & ~want
    i, j = (leaks if leaks.any() else got != want).nonzero()[0].tolist()
    return i, j, bool(got[i, j])


# -- exercise 1: the spec, masked and modified --------------------------------------------------------
def _spec(q, k, v, keep, mod, order="right"):
    """O in float64: ``order`` "right" (modify, mask, softmax, a row with no key 0); "after_softmax" (the
    mask zeroes probabilities); "mod_after_mask" (the modification sees the -inf)."""
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if order == "after_softmax":
        s = mod(s) if mod else s
        return (torch.softmax(s, -1) * keep) @ v
    if order == "mod_after_mask":
        s = s.masked_fill(~keep, float("-inf"))
        s = mod(s) if mod else s
    else:
        s = mod(s) if mod else s
        s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, -1)
    return p.masked_fill(~keep.any(-1, keepdim=True), 0.0).nan_to_num(0.0) @ v


def check_masked_attention(fn) -> Passed:
    """Exercise 1: ``fn(q, k, v, keep, score_mod) -> O``, float64, ``q`` (N_q, D), ``k`` and ``v`` (N_k, D),
    ``keep`` (N_q, N_k) bool (True: the query sees the key), ``score_mod`` a torch function of the scaled
    scores ``Q K^T / sqrt(D)`` or None. A row that sees no key gives zeros."""
    name = "masked_attention"
    if not callable(fn):
        raise CheckFailed(f"{name}: pass your function, got {type(fn).__name__}.")
    seed = grading.new_seed()
    checks = 0
    cap = 2.0

    def capped(s):
        return cap * torch.tanh(s / cap)

    with grading.seeded(seed):
        gen = grading.fresh_generator()
        cases = []
        for n_q, n_k, d in ((9, 9, 4), (13, 21, 8), (30, 30, 16)):
            ids = _docs(max(n_q, n_k), gen, 3)
            empty = torch.ones(n_q, n_k, dtype=torch.bool)
            empty[0] = False  # a row that sees nothing
            for keep, label in ((_window_keep(n_q, n_k, 3), "a 3-key window"),
                                (_doc_keep(ids)[:n_q, :n_k], "3 documents"), (empty, "a row with no key")):  # fmt: skip
                cases.append((n_q, n_k, d, keep, label))
        for n_q, n_k, d, keep, label in cases:
            for mod, mod_name in ((None, "no modification"), (capped, f"softcap({cap:g})")):
                q = torch.randn(n_q, d, generator=gen, dtype=torch.float64) * 2
                k = torch.randn(n_k, d, generator=gen, dtype=torch.float64) * 2
                v = torch.randn(n_k, d, generator=gen, dtype=torch.float64)
                where = f"{name}, N_q={n_q}, N_k={n_k}, {label}, {mod_name}"
                args = (q.clone(), k.clone(), v.clone(), keep.clone(), mod)
                o = call_learner(fn, *args, name=name, where=where, seed=seed)
                _judge_masked(o, q, k, v, keep, mod, where, seed)
                checks += 1
    return _passed(f"✓ {name}: {checks} checks passed (windows, documents, a row with no key, with and without "
                   "softcap; float64)", checks)  # fmt: skip


def _judge_masked(o, q, k, v, keep, mod, where, seed):
    want = _spec(q, k, v, keep, mod)
    if not isinstance(o, torch.Tensor) or o.shape != want.shape:
        raise fail(f"{where}: return O, a tensor of shape {tuple(want.shape)}; got "
                   f"{getattr(o, 'shape', type(o).__name__)}.", seed)  # fmt: skip
    o = o.detach().double()
    if torch.allclose(o, want, atol=1e-10, rtol=1e-10):
        return
    empty = ~keep.any(-1)
    if empty.any() and not torch.isfinite(o[empty]).all():
        raise fail(f"{where}: the row that sees no key is NaN: softmax over nothing but -inf is 0/0. Return zeros "
                   "there (flex_attention's convention): O = 0 where a row keeps no key.", seed)  # fmt: skip
    if torch.allclose(o, _spec(q, k, v, keep, mod, "after_softmax"), atol=1e-10, rtol=1e-10):
        raise fail(f"{where}: the mask was applied after the softmax: the hidden keys still took their share of "
                   "the denominator, so each row sums to less than 1. Hide them before: scores of -inf, then "
                   "softmax.", seed)  # fmt: skip
    if mod is not None and torch.allclose(o, _spec(q, k, v, keep, mod, "mod_after_mask"), atol=1e-10, rtol=1e-10):
        raise fail(f"{where}: the modification ran after the mask: softcap turned the hidden keys' -inf into -cap, "
                   "so they came back with weight exp(-cap). Modify the scores first, then mask (the kernel does "
                   "the same: the modification sees every score, the mask decides which count).", seed)  # fmt: skip
    raise fail(f"{where}: O is off by up to {float((o - want).abs().max()):.3g}. The spec: s = Q K^T / sqrt(D), "
               "s = score_mod(s), -inf where keep is False, softmax over the keys, P V.", seed)  # fmt: skip


# -- exercise 2: softcap in the kernel ----------------------------------------------------------------
#: (B, H, N_q, N_k, D, causal): N not a multiple of a tile, N_q != N_k
SOFTCAP_SHAPES = ((1, 2, 37, 37, 16, False), (1, 1, 45, 29, 32, True), (2, 1, 20, 53, 16, False))
SOFTCAP_CAP = 5.0


def check_softcap(fn) -> Passed:
    """Exercise 2: ``fn``, a ``@triton.jit`` score modification ``(score, b, h, q_idx, kv_idx, aux, cap, a1)
    -> cap * tanh(score / cap)``, run by the package's kernel (``attention(..., score_mod=ScoreMod(fn,
    a0=cap))``) against the float64 softcap."""
    name = "softcap"
    if isinstance(fn, ScoreMod):
        fn = fn.fn
    seed = grading.new_seed()
    checks = 0
    dtype = torch.float32 if runtime.is_interpreter() else torch.bfloat16
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    with grading.seeded(seed):
        gen = grading.fresh_generator()
        for B, H, n_q, n_k, d, causal in SOFTCAP_SHAPES:
            where = f"{name}, N_q={n_q}, N_k={n_k}, D={d}" + (", causal" if causal else "")
            # scores up to about +-20 (q scaled up), so the cap of 5 changes most of them
            q = (torch.randn(B, H, n_q, d, generator=gen) * 3).to(runtime.DEVICE, dtype)
            k, v = (torch.randn(B, H, n_k, d, generator=gen).to(runtime.DEVICE, dtype) for _ in range(2))
            mod = ScoreMod(fn, a0=SOFTCAP_CAP, name="your softcap")
            try:
                o, _ = call_learner(_run_score_mod, q, k, v, causal, mod, name=name, where=where, seed=seed)
            except CheckFailed as e:
                if "not done yet" in str(e):
                    raise
                raise fail(f"{where}: your function did not run inside the kernel. {_kernel_reason(e)}", seed) from None
            want = attention_reference(q, k, v, causal, score_mod=softcap(SOFTCAP_CAP))[0].double()
            err = _rel(o, want)
            if err < tol:
                checks += 1
                continue
            scale = 1 / math.sqrt(d)
            alts = {
                "scaled twice": lambda s, *a: SOFTCAP_CAP * torch.tanh(s * scale / SOFTCAP_CAP),  # noqa: B023
                "no cap outside": lambda s, *a: torch.tanh(s / SOFTCAP_CAP),
                "clamp": lambda s, *a: s.clamp(-SOFTCAP_CAP, SOFTCAP_CAP),
                "unchanged": lambda s, *a: s,
            }
            for what, ref in alts.items():
                alt = attention_reference(q, k, v, causal, score_mod=ScoreMod(None, ref))[0].double()
                if _rel(o, alt) < tol:
                    raise fail(f"{where}: {_SOFTCAP_HINTS[what]}", seed)
            raise fail(f"{where}: O is off by {err:.2e} of its norm against cap * tanh(score / cap) with cap = a0 "
                       f"({SOFTCAP_CAP:g}).", seed)  # fmt: skip
    return _passed(f"✓ {name}: {checks} shapes match the float64 softcap inside the kernel (N not a multiple of a "
                   "tile, N_q != N_k, causal and not)", checks)  # fmt: skip


_SOFTCAP_HINTS = {
    "scaled twice": "the score was scaled twice: the kernel hands your function score = Q K^T * scale already "
    "(the spec's scaled score), and you multiplied by the scale again. Use the score as it comes.",
    "no cap outside": "tanh(score / cap) lies in (-1, 1): multiply it back by cap, cap * tanh(score / cap).",
    "clamp": "that is a hard clamp to [-cap, cap]; softcap is smooth, cap * tanh(score / cap).",
    "unchanged": "the scores came back unchanged: return the capped score (and read cap from the argument a0).",
}


def _run_score_mod(q, k, v, causal, mod):
    try:
        return attention(q, k, v, causal, score_mod=mod)
    except KernelInputError as e:
        if e.__cause__ is None:
            raise
        # call_learner keeps an error's first line; the GPU's compiler writes the cause on its last
        raise KernelInputError(f"score_mod {mod.name!r} did not compile: {mod_error_text(e)}") from e


def _kernel_reason(e: CheckFailed) -> str:
    text = str(e)
    return text.split(": ", 1)[-1] if "KernelInputError" in text else text


def _rel(o, want) -> float:
    o = o.detach().double().cpu()
    want = want.detach().double().cpu()
    if not torch.isfinite(o).all():
        return math.inf
    return float((o - want).norm() / want.norm().clamp_min(1e-30))


# -- exercise 3: mask functions -----------------------------------------------------------------------
WINDOWS = (1, 4, 9)
MASK_N = (45, 70)


def _check_mask_grid(mask, want, where, seed, explain):
    zero = torch.tensor(0)
    n_q, n_k = want.shape
    i = torch.arange(n_q).view(-1, 1)
    j = torch.arange(n_k).view(1, -1)
    aux = mask.aux.cpu() if isinstance(mask.aux, torch.Tensor) else mask.aux
    got = call_learner(mask.ref, zero, zero, i, j, aux, mask.a0, mask.a1, name="mask", where=where, seed=seed)
    got = torch.as_tensor(got).expand(n_q, n_k).bool()
    if not torch.equal(got, want):
        qi, kj, kept = _first_pair(got, want)
        raise fail(f"{where}: your torch function {explain(qi, kj, kept, got)}", seed)


def _check_mask_kernel(mask, where, seed, n):
    """The jit function through the kernel (the block lists from the torch twin) against the reference of
    the torch twin: where they differ, the jit function disagrees with it."""
    dtype = torch.float32 if runtime.is_interpreter() else torch.bfloat16
    gen = grading.fresh_generator()
    q, k, v = (torch.randn(1, 1, n, 16, generator=gen).to(runtime.DEVICE, dtype) for _ in range(3))
    try:
        bm = block_mask(mask, None, None, n, n)
        o, _ = attention(q, k, v, block_mask=bm)
    except KernelInputError as e:
        raise fail(f"{where}: your mask did not run inside the kernel: {str(e).split(': ', 1)[-1]}", seed) from None
    want = attention_reference(q, k, v, block_mask=mask)[0]
    rows = ((o.double() - want.double()).norm(dim=-1) / want.double().norm(dim=-1).clamp_min(1e-6)).flatten()
    bad = (rows > (1e-4 if dtype == torch.float32 else 3e-2)) | ~torch.isfinite(rows)
    if bad.any():
        r = int(bad.nonzero()[0])
        raise fail(f"{where}: your torch function is right, but the kernel's output differs from it from query {r} "
                   "on: the @triton.jit function disagrees with its torch twin (the kernel runs the jit one on "
                   "the partial blocks, the block lists come from the torch one).", seed)  # fmt: skip


def check_sliding_window(make_mask) -> Passed:
    """Exercise 3a: ``make_mask(window) -> MaskMod``: query i sees the ``window`` keys ``i - window < j <= i``."""
    name = "sliding_window"
    seed = grading.new_seed()
    checks = 0
    with grading.seeded(seed):
        for w in WINDOWS:
            for n in MASK_N:
                where = f"{name}({w}), N={n}"
                mask = call_learner(make_mask, w, name=name, where=where, seed=seed)
                if not isinstance(mask, MaskMod):
                    raise fail(f"{where}: return a MaskMod(fn, ref, a0=window), got {type(mask).__name__}.", seed)
                want = _window_keep(n, n, w)

                def explain(i, j, kept, got, w=w):
                    width = int(got[min(got.shape[0] - 1, 3 * w + 5)].sum())
                    off = f" (a row holds {width} keys: off by one)" if abs(width - w) == 1 else ""
                    if kept:
                        return (f"lets query {i} see key {j}, outside the window: window {w} is the {w} keys "
                                f"{i - w + 1}..{i}, itself included{off}.")  # fmt: skip
                    return f"hides key {j} from query {i}, inside the window {i - w + 1}..{i}{off}."

                _check_mask_grid(mask, want, where, seed, explain)
                checks += 1
        _check_mask_kernel(call_learner(make_mask, 5, name=name, seed=seed), f"{name}(5) in the kernel", seed, 70)
        checks += 1
    return _passed(f"✓ {name}: {checks} checks passed (windows {', '.join(map(str, WINDOWS))} at N = "
                   f"{' and '.join(map(str, MASK_N))}, every (query, key) pair; the jit function in the kernel)",
                   checks)  # fmt: skip


def check_document_mask(make_mask) -> Passed:
    """Exercise 3b: ``make_mask(doc_ids) -> MaskMod``: causal inside each document, nothing across them."""
    name = "document_mask"
    seed = grading.new_seed()
    checks = 0
    with grading.seeded(seed):
        gen = grading.fresh_generator()
        for n, docs in ((45, 3), (70, 8), (70, 1)):
            ids = _docs(n, gen, docs)
            where = f"{name}, N={n}, {docs} documents"
            mask = call_learner(make_mask, ids.to(runtime.DEVICE), name=name, where=where, seed=seed)
            if not isinstance(mask, MaskMod):
                raise fail(f"{where}: return a MaskMod(fn, ref, aux=doc_ids, ...), got {type(mask).__name__}.", seed)
            want = _doc_keep(ids)

            def explain(i, j, kept, got, ids=ids):
                if kept and ids[i] != ids[j]:
                    return (f"leaks across documents: query {i} (document {int(ids[i])}) sees key {j} (document "
                            f"{int(ids[j])}). A packed batch's documents must not see each other.")  # fmt: skip
                if kept:
                    return f"lets query {i} see key {j}, a later token of its own document: keep it causal (j <= i)."
                return f"hides key {j} from query {i}, an earlier token of the same document {int(ids[i])}."

            _check_mask_grid(mask, want, where, seed, explain)
            checks += 1
            if docs == 8:
                _check_mask_kernel(mask, f"{where}, in the kernel", seed, n)
                checks += 1
    return _passed(f"✓ {name}: {checks} checks passed (1, 3 and 8 documents of drawn lengths, every (query, key) "
                   "pair; the jit function in the kernel)", checks)  # fmt: skip


# -- exercise 4: the block lists ----------------------------------------------------------------------
def _true_lists(keep: torch.Tensor, bm: int, bn: int):
    n_q, n_k = keep.shape
    T_m, T_n = -(-n_q // bm), -(-n_k // bn)
    pad = torch.zeros(T_m * bm, T_n * bn, dtype=torch.bool)
    pad[:n_q, :n_k] = keep
    real = torch.zeros_like(pad)
    real[:n_q] = True
    seen = pad.view(T_m, bm, T_n, bn).any(3).any(1)
    whole = (pad | ~real).view(T_m, bm, T_n, bn).all(3).all(1)
    return whole, seen & ~whole


def check_block_lists(fn) -> Passed:
    """Exercise 4: ``fn(keep, block_m, block_n) -> (full, partial)``: for a dense mask ``keep`` (N_q, N_k),
    two boolean (T_m, T_n) tensors: *full* blocks (every query of the tile that exists sees every key of
    the block: no element mask needed) and *partial* ones (some pair visible, some hidden); a block in
    neither is empty and never loaded. A key block that hangs past N_k is never full."""
    name = "block_lists"
    seed = grading.new_seed()
    checks = 0
    with grading.seeded(seed):
        gen = grading.fresh_generator()
        cases = [(_window_keep(70, 61, 9), "window 9, N_q=70, N_k=61"), (_window_keep(64, 64, 16), "window 16, N=64"),
                 (_doc_keep(_docs(70, gen, 4)), "4 documents, N=70"),
                 (_window_keep(40, 40, 40) | (torch.arange(40) < 20).view(1, -1), "prefix-LM 20, N=40"),
                 (torch.ones(40, 61, dtype=torch.bool), "no mask, N_q=40, N_k=61")]  # fmt: skip
        for keep, label in cases:
            for bm, bn in ((16, 16), (32, 16)):
                where = f"{name}, {label}, tiles {bm}x{bn}"
                out = call_learner(fn, keep.clone(), bm, bn, name=name, where=where, seed=seed)
                full, part = _true_lists(keep, bm, bn)
                _judge_lists(out, full, part, keep, bm, bn, where, seed)
                checks += 1
    return _passed(f"✓ {name}: {checks} checks passed (windows, documents, prefix-LM, no mask; N not a multiple of a "
                   "tile, N_q != N_k)", checks)  # fmt: skip


def _judge_lists(out, full, part, keep, bm, bn, where, seed):
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise fail(f"{where}: return (full, partial), two boolean tensors.", seed)
    got_full, got_part = (torch.as_tensor(x).bool().cpu() for x in out)
    for what, g in (("full", got_full), ("partial", got_part)):
        if g.shape != full.shape:
            raise fail(f"{where}: {what} has shape {tuple(g.shape)}; expected (T_m, T_n) = {tuple(full.shape)} "
                       "(ceil(N_q / block_m), ceil(N_k / block_n)).", seed)  # fmt: skip
    n_k = keep.shape[1]
    both = got_full & got_part
    if both.any():
        t, j = both.nonzero()[0].tolist()
        raise fail(f"{where}: Q tile {t}, key block {j} is in both lists; the kernel would run it twice.", seed)
    skipped = (full | part) & ~(got_full | got_part)
    if skipped.any():
        t, j = skipped.nonzero()[0].tolist()
        blk = keep[t * bm : (t + 1) * bm, j * bn : (j + 1) * bn]
        raise fail(f"{where}: Q tile {t}, key block {j} was skipped, but {int(blk.sum())} of its (query, key) pairs "
                   "are visible: a block is empty only when no pair is visible (any, not all). Skipping it drops "
                   "those keys from the softmax.", seed)  # fmt: skip
    wrong_full = got_full & ~full
    if wrong_full.any():
        t, j = wrong_full.nonzero()[0].tolist()
        if (j + 1) * bn > n_k:
            raise fail(f"{where}: key block {j} hangs past N_k = {n_k} but is called full: the kernel would read "
                       "keys that do not exist with no mask. A block past the end is partial at best.",
                       seed)  # fmt: skip
        blk = keep[t * bm : (t + 1) * bm, j * bn : (j + 1) * bn]
        raise fail(f"{where}: Q tile {t}, key block {j} is called full but hides {int((~blk).sum())} of its pairs: "
                   "the kernel runs a full block with no element mask, so those pairs would count. Full means every "
                   "pair is visible (all).", seed)  # fmt: skip
    if not torch.equal(got_full, full) or not torch.equal(got_part, part):
        t, j = ((got_full != full) | (got_part != part)).nonzero()[0].tolist()
        raise fail(f"{where}: Q tile {t}, key block {j}: expected "
                   f"{'full' if full[t, j] else 'partial' if part[t, j] else 'empty'}, got "
                   f"{'full' if got_full[t, j] else 'partial' if got_part[t, j] else 'empty'}. Rows past N_q do not "
                   "count (they are never stored).", seed)  # fmt: skip
