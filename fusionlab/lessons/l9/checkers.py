"""Checkers for lesson 9's exercises (solutions/09_the_whole_block.ipynb).

1. ``check_decode_floor``: ``fn(B, n_cache, hidden, n_heads, n_kv_heads, ffn, dtype_bytes) -> (flops, nbytes)``,
   the floor of one decode step of one layer (:func:`~fusionlab.lessons.l9.ledger.decode_floor`), at
   three real layers' shapes, batches 1 to 64 and cache lengths drawn afresh. Names the KV cache
   forgotten, the cache counted per query head (GQA ignored) or K without V, the weights read once per
   row, elements or bits for bytes, a missing MLP matrix, and attention's FLOPs forgotten or counted
   per KV head.
2. ``check_split_partials``: flash-decoding's first step in float64 torch, ``fn(q, k, v, n_splits) ->
   (acc, m, l)``: split ``s`` of ``n_splits`` takes keys ``[s L, min((s + 1) L, N))`` with
   ``L = ceil(N / n_splits)`` and writes the split's max score ``m``, ``l = sum exp(s - m)`` and the
   unnormalised ``acc = sum exp(s - m) v``. Names split ranges that drop or repeat a key, GQA's head
   mapping wrong (``h % H_kv`` for ``h // G``), the scale forgotten, ``acc`` already divided by ``l``,
   a consistent triple whose ``m`` is not the max (it overflows), and NaN in a split that holds no key.
3. ``check_combine``: the second step as a Triton kernel, ``fn(acc, m, l) -> o`` (one launch), with every
   check of the shared machinery (:func:`fusionlab.grading.run_answer`: fresh inputs, poisoned outputs,
   inputs unchanged, torch doing none of the work). Names the combine without rescaling by
   ``exp(m_s - M)``, ``l`` forgotten (no division, or a division by the weights alone), the mean of the
   splits' outputs, one split kept, ``exp2`` for ``exp``, and NaN where a split (or a whole row) saw no key.
4. ``check_rope_cache_write``: decoding's RoPE with the cache write, in float64 torch, ``fn(q, k, v, cos, sin,
   k_cache, v_cache, cache_len) -> q_rot``. Names GPT-J's interleaved pairs for Llama's rotate-half, the
   rotation backwards, positions one late or one early, the tokens written at 0 whatever the row's length,
   k cached unrotated, and q left unrotated.
"""

from __future__ import annotations

import math

import torch

from ... import grading, runtime
from ...grading import CheckFailed, answer_key, call_learner, fail, number
from ...kernels.rope import rope_reference, rope_tables
from .ledger import MODELS, decode_floor

Passed, _passed = grading.Passed, grading.passed


# -- exercise 1: the decode step's floor --------------------------------------------------------------
#: a named mistake is one the answer matches this closely (relative); the right answer must be this close
FLOOR_TOL = 1e-3


def _floor_mistakes(B, n_cache, hidden, H, H_kv, ffn, es) -> dict[str, tuple[float, float]]:
    """mistake -> the (flops, nbytes) it gives."""
    right = decode_floor(B, n_cache, hidden, H, H_kv, ffn, es)
    D = hidden // H
    f, w, c, o = right.flops, right.weight_bytes, right.cache_bytes, right.other_bytes
    attn = 4 * B * H * n_cache * D
    return {
        "no KV cache": (f, w + o),
        "cache per query head": (f, w + c * H // H_kv + o),
        "K without V": (f, w + c // 2 + o),
        "weights per row": (f, B * w + c + o),
        "elements": (f, (w + c + o) / es),
        "bits": (f, (w + c + o) * 8),
        "two MLP matrices": (f - 2 * B * hidden * ffn, w - hidden * ffn * es + c + o),
        "no attention FLOPs": (f - attn, w + c + o),
        "attention FLOPs per KV head": (f - attn + attn * H_kv // H, w + c + o),
        "one FLOP per weight": ((f - attn) / 2 + attn, w + c + o),
    }


FLOOR_HINTS = {
    "no KV cache": "your bytes are the weights alone: attention reads every row's whole KV cache, K and V, each step "
    "(B x H_kv x n_cache x D elements each). At long contexts and large batches the cache outweighs the weights.",
    "cache per query head": "you counted the cache once per query head. With grouped-query attention the G = H / "
    "H_kv query heads of a group share one KV head: the cache holds H_kv heads, and one program reads them for "
    "the whole group.",
    "K without V": "you counted one of the two caches: attention reads K (for the scores) and V (for the sum).",
    "weights per row": "you counted the weights once per row of the batch. One step multiplies all B rows by "
    "the same weight tiles: each weight is read once per step, whatever B. That is why batching decode pays.",
    "elements": "that is the count of elements, not bytes: multiply by dtype_bytes.",
    "bits": "that is bits: a byte is 8 of them.",
    "two MLP matrices": "the MLP has three matrices (gate, up and down, each hidden x ffn); one is missing.",
    "no attention FLOPs": "the FLOPs lack attention's: each query head scores n_cache keys (2 D FLOPs each) and "
    "sums n_cache values (2 D more): 4 B H n_cache D.",
    "attention FLOPs per KV head": "attention's FLOPs are counted per KV head: every query head computes its own "
    "scores (4 B H n_cache D), even where the group shares the K and V it reads.",
    "one FLOP per weight": "a multiply and an add per weight per row: 2 FLOPs, not 1.",
}


def _floor_cases(gen: torch.Generator) -> list[tuple]:
    """(B, n_cache, model, dtype_bytes): a GQA layer first (every mistake shows there), cache lengths drawn."""
    out = []
    for model, B, es in (("Llama-3-8B", 1, 2), ("Llama-3-8B", 64, 2), ("Llama-2-7B", 16, 2), ("Llama-3-70B", 8, 1)):
        n_cache = int(torch.randint(512, 32769, (1,), generator=gen))
        out.append((B, n_cache, model, es))
    return out


def check_decode_floor(fn) -> Passed:
    """Exercise 1: ``fn(B, n_cache, hidden, n_heads, n_kv_heads, ffn, dtype_bytes) -> (flops, nbytes)``."""
    name = "decode_floor"
    if not callable(fn):
        raise CheckFailed(f"{name}: pass your function, got {type(fn).__name__}.")
    seed = grading.new_seed()
    checks = 0
    with grading.seeded(seed):
        for B, n_cache, model, es in _floor_cases(grading.fresh_generator()):
            hidden, H, H_kv, ffn = MODELS[model]
            args = (B, n_cache, hidden, H, H_kv, ffn, es)
            where = f"{name}, {model} (hidden {hidden}, {H}/{H_kv} heads, FFN {ffn}), B={B}, n_cache={n_cache}, "
            where += f"{es}-byte elements"
            out = call_learner(fn, *args, name=name, where=where, seed=seed)
            if not (isinstance(out, (tuple, list)) and len(out) == 2):
                raise fail(f"{where}: return (flops, nbytes), two numbers; got {out!r}.", seed)
            got = tuple(number(x, f"{name}{args}", u) for x, u in zip(out, ("FLOPs", "bytes"), strict=True))
            want = decode_floor(*args)
            close = lambda a, b: abs(a - b) <= FLOOR_TOL * abs(b)  # noqa: E731
            # the norms' weights and the new token's own tensors (x, the output, the new k and v) are a sliver
            # of the step, and the exercise asks for the weights and the cache: an answer may leave them out
            optional = want.other_bytes + 2 * hidden * es
            lo, hi = (want.nbytes - optional) * (1 - FLOOR_TOL), want.nbytes * (1 + FLOOR_TOL)
            if close(got[0], want.flops) and lo <= got[1] <= hi:
                checks += 1
                continue
            for mistake, alt in _floor_mistakes(*args).items():
                if close(got[0], alt[0]) and close(got[1], alt[1]):
                    raise fail(f"{where}: {FLOOR_HINTS[mistake]}", seed)
            what = []
            if not close(got[0], want.flops):
                what.append(f"FLOPs {got[0]:.4g}, expected {want.flops:.4g}")
            if not close(got[1], want.nbytes):
                what.append(
                    f"bytes {got[1]:.4g}, expected {want.nbytes:.4g} (weights {want.weight_bytes:.3g}, KV cache "
                    f"{want.cache_bytes:.3g}, the rest {want.other_bytes:.3g})"
                )
            raise fail(f"{where}: {'; '.join(what)}.", seed)
    return _passed(f"✓ {name}: {checks} checks passed (Llama-3-8B, Llama-2-7B, Llama-3-70B; B 1 to 64; cache lengths "
                   "drawn afresh; 1- and 2-byte elements)", checks)  # fmt: skip


# -- exercise 2: the split, in torch ------------------------------------------------------------------
@answer_key
def split_partials_reference(q, k, v, n_splits: int, *, ranges: str = "right", heads: str = "right",
                             scale: bool = True):  # fmt: skip
    """The spec in float64: ``q`` (B, H, D), ``k``, ``v`` (B, H_kv, N, D) -> ``(acc, m, l)``, (B, H, S, D),
    (B, H, S), (B, H, S). ``ranges``: "right" (L = ceil(N / S)), "floor" (L = N // S: the tail dropped),
    "inclusive" (each split one key more: a key read twice); ``heads``: "right" (h // G) or "modulo"
    (h % H_kv); ``scale``: scores times 1/sqrt(D) or not (the mistakes the checker names)."""
    B, H, D = q.shape
    H_kv, N = k.shape[1], k.shape[2]
    G = H // H_kv
    kv_head = torch.arange(H) // G if heads == "right" else torch.arange(H) % H_kv
    kh, vh = k[:, kv_head], v[:, kv_head]  # (B, H, N, D)
    s_all = torch.einsum("bhd,bhnd->bhn", q, kh) * (1 / math.sqrt(D) if scale else 1.0)
    L = -(-N // n_splits) if ranges != "floor" else max(1, N // n_splits)
    acc = torch.zeros(B, H, n_splits, D, dtype=q.dtype)
    m = torch.full((B, H, n_splits), -math.inf, dtype=q.dtype)
    l = torch.zeros(B, H, n_splits, dtype=q.dtype)  # noqa: E741
    for s in range(n_splits):
        lo, hi = s * L, min((s + 1) * L + (ranges == "inclusive"), N)
        if lo >= hi:
            continue
        sc = s_all[..., lo:hi]
        m[..., s] = sc.amax(-1)
        p = torch.exp(sc - m[..., s : s + 1])
        l[..., s] = p.sum(-1)
        acc[..., s, :] = torch.einsum("bhn,bhnd->bhd", p, vh[:, :, lo:hi])
    return acc, m, l


#: (B, H, H_kv, N, D, n_splits): GQA 4/2 first (every mistake shows there), N not a multiple of S, a split
#: with no key (N 5 over 4 splits: 2, 2, 1, none), one split, more splits than keys
SPLIT_CASES = ((2, 4, 2, 37, 16, 4), (1, 4, 1, 50, 8, 3), (1, 2, 2, 5, 8, 4), (2, 6, 3, 29, 16, 1),
               (1, 2, 1, 3, 8, 5))  # fmt: skip
SPLIT_MISTAKES = {
    ("floor", "right", True): "the last keys are in no split: with L = N // S, N - S L keys fall past the last "
    "split. Round up, L = ceil(N / S) = (N + S - 1) // S, and cut the last split at N.",
    ("inclusive", "right", True): "a key is counted in two splits: split s takes keys s L up to (s + 1) L - 1; "
    "(s + 1) L is the next split's first key (Python's slice end is exclusive).",
    ("right", "modulo", True): "query head h read KV head h % H_kv; with grouped-query attention the G = H / H_kv "
    "consecutive query heads h = g G ... g G + G - 1 share KV head g = h // G (repeat_interleave's order).",
    ("right", "right", False): "the scores are not scaled: s = q . k / sqrt(D).",
}


def _split_got(out, shapes, where, seed):
    if not (isinstance(out, (tuple, list)) and len(out) == 3):
        raise fail(f"{where}: return (acc, m, l), three tensors; got {type(out).__name__}.", seed)
    got = []
    for what, t, shape in zip(("acc", "m", "l"), out, shapes, strict=True):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            raise fail(f"{where}: {what} must be a tensor of shape {shape}; got "
                       f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}.", seed)  # fmt: skip
        got.append(t.detach().double())
    return got


def _same(a, b, tol=1e-9) -> bool:
    fin = torch.isfinite(b)
    return bool((torch.isfinite(a) == fin).all() and (a[~fin] == b[~fin]).all() and
                torch.allclose(a[fin], b[fin], atol=tol, rtol=tol))  # fmt: skip


def check_split_partials(fn) -> Passed:
    """Exercise 2: ``fn(q, k, v, n_splits) -> (acc, m, l)`` in float64 (module docstring)."""
    name = "split_partials"
    if not callable(fn):
        raise CheckFailed(f"{name}: pass your function, got {type(fn).__name__}.")
    seed = grading.new_seed()
    checks = 0
    with grading.seeded(seed):
        gen = grading.fresh_generator()
        for B, H, H_kv, N, D, S in SPLIT_CASES:
            q = torch.randn(B, H, D, generator=gen, dtype=torch.float64) * 2
            k = torch.randn(B, H_kv, N, D, generator=gen, dtype=torch.float64) * 2
            v = torch.randn(B, H_kv, N, D, generator=gen, dtype=torch.float64)
            where = f"{name}, (B, H, H_kv, N, D) = {(B, H, H_kv, N, D)}, {S} splits"
            out = call_learner(fn, q.clone(), k.clone(), v.clone(), S, name=name, where=where, seed=seed)
            acc, m, l = _split_got(out, ((B, H, S, D), (B, H, S), (B, H, S)), where, seed)  # noqa: E741
            w_acc, w_m, w_l = split_partials_reference(q, k, v, S)
            if _same(acc, w_acc) and _same(m, w_m) and _same(l, w_l):
                checks += 1
                continue
            _judge_split(acc, m, l, (w_acc, w_m, w_l), (q, k, v, S), where, seed)
    return _passed(f"✓ {name}: {checks} checks passed (GQA 4/2, 4/1, 6/3 and none; N not a multiple of the splits, "
                   "a split with no key, one split, more splits than keys; float64)", checks)  # fmt: skip


def _judge_split(acc, m, l, want, args, where, seed):  # noqa: E741
    w_acc, w_m, w_l = want
    empty = w_l == 0
    if empty.any() and not (torch.isfinite(acc[empty]).all() and torch.isfinite(l[empty]).all()):
        raise fail(f"{where}: a split that holds no key has NaN in acc or l. Its partial is m = -inf, l = 0, acc = 0 "
                   "(exp(-inf - M) = 0 in the combine then weighs it out).", seed)  # fmt: skip
    for variant, hint in SPLIT_MISTAKES.items():
        r, h, sc = variant
        a2, m2, l2 = split_partials_reference(*args, ranges=r, heads=h, scale=sc)
        if _same(acc, a2, 1e-6) and _same(m, m2, 1e-6) and _same(l, l2, 1e-6):
            raise fail(f"{where}: {hint}", seed)
    full = ~empty
    if (
        _same(m, w_m, 1e-6)
        and _same(l, w_l, 1e-6)
        and torch.allclose((acc * l[..., None])[full], w_acc[full], atol=1e-6, rtol=1e-6)
    ):
        raise fail(f"{where}: acc is already divided by l. Keep it unnormalised, acc = sum exp(s - m) v: the combine "
                   "rescales every split's acc and l by exp(m_s - M) and divides once, at the end.", seed)  # fmt: skip
    # the same triple up to the shift m: acc e^m and l e^m agree, but m is not the split's max
    shift = (m - w_m)[full]
    if (
        torch.isfinite(m[full]).all()
        and torch.allclose(l[full] * torch.exp(shift), w_l[full], atol=1e-6, rtol=1e-6)
        and torch.allclose((acc[full] * torch.exp(shift)[..., None]), w_acc[full], atol=1e-6, rtol=1e-6)
    ):
        raise fail(f"{where}: your (acc, m, l) describe the right softmax, but m is not the split's largest score. "
                   "Shift by the max: exp(s - max) <= 1 never overflows, where exp(s) does past s = 88 in fp32 "
                   "(and the kernel keeps fp32).", seed)  # fmt: skip
    bad = [n for n, g, w in (("acc", acc, w_acc), ("m", m, w_m), ("l", l, w_l)) if not _same(g, w, 1e-9)]
    raise fail(f"{where}: {', '.join(bad)} differ from the spec: split s takes keys s L .. min((s + 1) L, N) - 1 with "
               "L = ceil(N / S); m = max of its scores q . k / sqrt(D), l = sum exp(s - m), acc = sum exp(s - m) v.",
               seed)  # fmt: skip


# -- exercise 3: the combine, a Triton kernel ---------------------------------------------------------
@answer_key
def combine_reference(acc, m, l, how: str = "right"):  # noqa: E741
    """O from the partials in float64: ``acc`` (R, S, D), ``m``, ``l`` (R, S) -> (R, D), a row that saw no
    key 0. ``how`` names the mistakes the checker recognises: "no rescale" (sum acc / sum l), "no l" (the
    rescaled sum, not divided), "weights" (divided by sum exp(m_s - M), not by sum l_s exp(...)), "mean"
    (the mean of acc_s / l_s), "first", "last" (one split), "exp2" (2 ** (m_s - M))."""
    acc, m, l = acc.double(), m.double(), l.double()  # noqa: E741
    seen = l > 0
    M = m.amax(-1, keepdim=True)
    M = torch.where(torch.isfinite(M), M, torch.zeros_like(M))
    w = torch.exp(m - M) if how != "exp2" else torch.exp2(m - M)
    w = torch.where(seen, w, torch.zeros_like(w))
    if how == "no rescale":
        num, den = acc.sum(1), l.sum(1, keepdim=True)
    elif how == "mean":
        per = torch.where(seen[..., None], acc / l.clamp_min(1e-300)[..., None], torch.zeros_like(acc))
        return per.sum(1) / seen.sum(1, keepdim=True).clamp_min(1)
    elif how == "first":
        num, den = acc[:, 0], l[:, :1]
    elif how == "last":
        num, den = acc[:, -1], l[:, -1:]
    else:
        num = (acc * w[..., None]).sum(1)
        den = (l * w).sum(1, keepdim=True) if how != "weights" else w.sum(1, keepdim=True)
        if how == "no l":
            den = torch.ones_like(den)
    return torch.where(den > 0, num / den.clamp_min(1e-300), torch.zeros_like(num))


COMBINE_MISTAKES = {
    "no rescale": "the splits were added without rescaling: each split's acc and l are relative to its own max "
    "m_s, so before adding they must be brought to the common max M = max_s m_s, times exp(m_s - M). "
    "O = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s.",
    "no l": "O is not divided by the softmax's sum: acc holds the unnormalised sum exp(s - m) v. Divide by "
    "L = sum_s exp(m_s - M) l_s.",
    "weights": "you divided by sum_s exp(m_s - M), the weights alone: each split's own sum l_s must be in it, "
    "L = sum_s exp(m_s - M) l_s.",
    "mean": "that is the mean of the splits' outputs acc_s / l_s: splits are not equal, each weighs in with its "
    "share of the softmax, exp(m_s - M) l_s.",
    "first": "O is the first split's alone: combine every split (a loop over s, or one tile of all S).",
    "last": "O is the last split's alone: combine every split (a loop over s, or one tile of all S).",
    "exp2": "exp2 where m is in natural units: these partials come from exp(s - m) (the package's kernel folds "
    "log2(e) into its scores and uses exp2 throughout; here use tl.exp).",
}
#: (R, S, D) rows x splits x head dim, and which rows and splits see no key: a split past the keys (S
#: larger than the splits the keys fill), one whole row with no key, one split alone, a head dim that
#: needs masking
COMBINE_SHAPES = ((6, 4, 16), (37, 3, 64), (5, 1, 32), (9, 13, 80), (130, 5, 16))


def combine_inputs(R: int, S: int, D: int, gen: torch.Generator, device=None):
    """Partials as the split writes them (:func:`split_partials_reference`), one query per row, each row's
    keys of its own count: row 0 with fewer keys than splits (its last splits empty: m -inf, l 0, acc 0), row 1
    with no key at all, the others drawn (some with empty splits too), every split's max its own (the scores
    spread so the maxima differ by tens)."""
    device = device or runtime.DEVICE
    acc = torch.zeros(R, S, D, dtype=torch.float64)
    m = torch.full((R, S), -math.inf, dtype=torch.float64)
    l = torch.zeros(R, S, dtype=torch.float64)  # noqa: E741
    L = 7
    for r in range(R):
        if r == 1 and R > 1:
            n = 0
        elif r == 0 and S > 1:
            n = int(torch.randint(1, S, (1,), generator=gen))
        else:
            n = int(torch.randint(1, S * L + 1, (1,), generator=gen))
        if n == 0:
            continue
        q = torch.randn(1, 1, D, generator=gen, dtype=torch.float64) * 3
        k = torch.randn(1, 1, S * L, D, generator=gen, dtype=torch.float64) * 3
        v = torch.randn(1, 1, S * L, D, generator=gen, dtype=torch.float64)
        a, mm, ll = split_partials_reference(q, k[:, :, :n], v[:, :, :n], S)
        acc[r], m[r], l[r] = a[0, 0], mm[0, 0], ll[0, 0]
    return tuple(t.to(device, torch.float32) for t in (acc, m, l))


def check_combine(fn) -> Passed:
    """Exercise 3: ``fn(acc, m, l) -> o``: ``acc`` (R, S, D), ``m`` and ``l`` (R, S), fp32, contiguous; O
    (R, D) fp32, ``sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s`` with ``M = max_s m_s``, 0 for a
    row whose splits all saw no key. One Triton launch; torch only to allocate O."""
    name = "combine"
    if not callable(fn):
        raise CheckFailed(f"{name}: pass your function, got {type(fn).__name__}.")
    seed = grading.new_seed()
    checks = 0
    with grading.seeded(seed):
        shapes = list(COMBINE_SHAPES)
        shapes.insert(-1, (grading.drawn_length(3, 6), shapes[1][1], 64))  # rows drawn afresh at a block boundary
        shapes.append(shapes[1])  # the same shape again, fresh values: no caching by shape
        for R, S, D in shapes:
            _run_combine(fn, R, S, D, seed)
            checks += 1
    what = "1 to 13 splits, empty splits and a row with no key, head dims 16 to 80, fresh inputs, poisoned output"
    return _passed(f"✓ {name}: {checks} checks passed ({what}, inputs unchanged, 1 launch each)", checks)


def _run_combine(fn, R, S, D, seed):
    name = "combine"
    inputs = combine_inputs(R, S, D, grading.fresh_generator())
    where = f"{name}, R={R} rows, S={S} splits, D={D}"
    out, box = grading.run_answer(
        fn, inputs, name=name, where=where, seed=seed,
        store_hint="Mask the store of O with the head dim (d < D) and the row.",
        torch_message=lambda ops: f"the answer computes or copies with torch ({ops}); the combine is your kernel's "
        "work (allocate O with torch.empty and nothing else).",
    )  # fmt: skip
    want = combine_reference(*inputs).to(torch.float32)
    if not isinstance(out, torch.Tensor) or out.shape != want.shape:
        raise fail(f"{where}: return O, a tensor of shape {tuple(want.shape)}; got "
                   f"{getattr(out, 'shape', type(out).__name__)}.", seed)  # fmt: skip
    o = out.detach().double().cpu()
    unwritten = grading.poisoned(out)
    if unwritten.any():
        raise fail(f"{where}: {int(unwritten.sum())} of {out.numel()} elements of O were never written. One program "
                   "per row (R programs), and a store masked by d < D only.", seed)  # fmt: skip
    w = want.double().cpu()
    tol = 1e-5
    if torch.allclose(o, w, atol=tol, rtol=tol):
        grading.require_launches(box, out, inputs, where, seed, launches=1)
        return
    empty_rows = (inputs[2].cpu() == 0).all(-1)
    if not torch.isfinite(o).all():
        if empty_rows.any() and not torch.isfinite(o[empty_rows]).all():
            raise fail(f"{where}: the row whose splits all saw no key gives NaN: there M = -inf and exp(m_s - M) is "
                       "exp(-inf + inf). Guard it (M = 0 where M is -inf) and write O = 0 where L = 0.",
                       seed)  # fmt: skip
        raise fail(f"{where}: O holds NaN or inf where a split saw no key (m = -inf, l = 0). Load masked splits as "
                   "m = -inf, l = 0 and let exp(-inf - M) = 0 weigh them out; never divide a split by its own l.",
                   seed)  # fmt: skip
    for how, hint in COMBINE_MISTAKES.items():
        alt = combine_reference(*inputs, how=how).to(torch.float32).double().cpu()
        if not torch.allclose(alt, w, atol=tol, rtol=tol) and torch.allclose(o, alt, atol=1e-4, rtol=1e-4):
            raise fail(f"{where}: {hint}", seed)
    outside = grading.computed_outside(box, out, lambda *a: combine_reference(*a).to(torch.float32), inputs, where,
                                       seed)  # fmt: skip
    if outside is not None:
        raise outside
    i = int(((o - w).abs() > tol + tol * w.abs()).any(-1).nonzero()[0])
    raise fail(f"{where}: row {i} of O is off by up to {float((o[i] - w[i]).abs().max()):.3g}. O = sum_s exp(m_s - M) "
               "acc_s / sum_s exp(m_s - M) l_s with M = max_s m_s.", seed)  # fmt: skip


# -- exercise 4: RoPE and the KV cache write, in torch ----------------------------------------------------
def _rope_write(q, k, v, cos, sin, kc, vc, lens, *, interleaved=False, sign=1, shift=0, at_zero=False,
                raw_k=False, raw_q=False):  # fmt: skip
    """The spec (all defaults) and the mistakes the checker names, float64, on copies: ``(q rotated, k_cache,
    v_cache)``. ``interleaved``: GPT-J's pairs; ``sign=-1``: the rotation backwards; ``shift``: every
    position off by that many; ``at_zero``: the new tokens written at 0, 1, ... (the cache length ignored,
    the rotation right); ``raw_k``: k written unrotated; ``raw_q``: q not rotated."""
    off = lens + shift
    qo, ko = rope_reference(q, k, cos, sign * sin, off, layout="bnhd", interleaved=interleaved)
    qo = q.clone() if raw_q else qo
    kc, vc = kc.clone(), vc.clone()
    B, N = k.shape[:2]
    pos = (torch.zeros_like(off) if at_zero else off)[:, None] + torch.arange(N)
    rows = torch.arange(B)[:, None].expand(B, N)
    kc.transpose(1, 2)[rows, pos] = k if raw_k else ko
    vc.transpose(1, 2)[rows, pos] = v
    return qo, kc, vc


ROPE_MISTAKES = {
    "interleaved": (
        dict(interleaved=True),
        "you rotated the interleaved pairs (2j, 2j + 1), GPT-J's convention; "
        "Llama's rotate-half pairs feature j with feature j + D/2 of the same head: x1 = x[..., :D/2], "
        "x2 = x[..., D/2:].",
    ),
    "backwards": (
        dict(sign=-1),
        "the rotation runs backwards: y1 = x1 cos - x2 sin, y2 = x2 cos + x1 sin (rotate_half(x) = cat(-x2, x1)).",
    ),
    "one late": (
        dict(shift=1),
        "every position is one too far: row b's new token n sits at cache_len[b] + n (the "
        "length before this step: the first new token takes the first free slot).",
    ),
    "one early": (
        dict(shift=-1),
        "every position is one too early: row b's new token n sits at cache_len[b] + n, "
        "and cache_len is the length before this step, not the index of the last token.",
    ),
    "at zero": (
        dict(at_zero=True),
        "the new tokens were written at positions 0, 1, ... of every row: each row "
        "has its own length, and its tokens go after it, at cache_len[b] + n (overwriting the row's "
        "first keys instead).",
    ),
    "raw k": (
        dict(raw_k=True),
        "the cache holds k before the rotation: attention reads the cached keys as they "
        "are, so write the rotated k (the queries of later steps are rotated by their own positions).",
    ),
    "raw q": (
        dict(raw_q=True),
        "q is not rotated: both q and k turn by their positions; only then does a score "
        "depend on the distance between the two tokens.",
    ),
}
#: (B, N new tokens, H, H_kv, D, cache slots): one token a row, then two; GQA 4/2 and none
ROPE_CASES = ((3, 1, 4, 2, 16, 40), (2, 2, 2, 2, 8, 24), (4, 1, 8, 2, 16, 70))


def check_rope_cache_write(fn) -> Passed:
    """Exercise 4: ``fn(q, k, v, cos, sin, k_cache, v_cache, cache_len) -> q_rot`` in float64 torch: ``q``
    (B, N, H, D), ``k`` and ``v`` (B, N, H_kv, D), tables (P, D/2), caches (B, H_kv, N_max, D) written in
    place: row b's new token n, rotated by position ``cache_len[b] + n`` (rotate-half), at that position."""
    name = "rope_cache_write"
    if not callable(fn):
        raise CheckFailed(f"{name}: pass your function, got {type(fn).__name__}.")
    seed = grading.new_seed()
    checks = 0
    with grading.seeded(seed):
        gen = grading.fresh_generator()
        for B, N, H, H_kv, D, slots in ROPE_CASES:
            cos, sin = rope_tables(slots + 8, D, device="cpu", dtype=torch.float64)
            q = torch.randn(B, N, H, D, generator=gen, dtype=torch.float64)
            k, v = (torch.randn(B, N, H_kv, D, generator=gen, dtype=torch.float64) for _ in range(2))
            kc, vc = (torch.randn(B, H_kv, slots, D, generator=gen, dtype=torch.float64) for _ in range(2))
            # each row its own length: one row empty, one near the end of the cache, the others drawn
            lens = torch.randperm(slots - N - 1, generator=gen)[:B]
            lens[0], lens[-1] = 0, slots - N - 1
            where = f"{name}, (B, N, H, H_kv, D) = {(B, N, H, H_kv, D)}, cache_len = {lens.tolist()}"
            kc_got, vc_got = kc.clone(), vc.clone()
            out = call_learner(fn, q.clone(), k.clone(), v.clone(), cos, sin, kc_got, vc_got, lens.clone(),
                               name=name, where=where, seed=seed)  # fmt: skip
            if not isinstance(out, torch.Tensor) or out.shape != q.shape:
                raise fail(f"{where}: return q rotated, a tensor of q's shape {tuple(q.shape)}; got "
                           f"{getattr(out, 'shape', type(out).__name__)}.", seed)  # fmt: skip
            got = (out.detach().double(), kc_got, vc_got)
            want = _rope_write(q, k, v, cos, sin, kc, vc, lens)
            if all(torch.allclose(g, w, atol=1e-10, rtol=1e-10) for g, w in zip(got, want, strict=True)):
                checks += 1
                continue
            for kw, hint in ROPE_MISTAKES.values():
                alt = _rope_write(q, k, v, cos, sin, kc, vc, lens, **kw)
                if all(torch.allclose(g, a, atol=1e-10, rtol=1e-10) for g, a in zip(got, alt, strict=True)):
                    raise fail(f"{where}: {hint}", seed)
            if torch.equal(kc_got, kc) and torch.equal(vc_got, vc):
                raise fail(f"{where}: the caches are unchanged: write row b's rotated k and its v into k_cache and "
                           "v_cache (in place) at positions cache_len[b] + n.", seed)  # fmt: skip
            bad = [n for n, g, w in zip(("q", "k_cache", "v_cache"), got, want, strict=True)
                   if not torch.allclose(g, w, atol=1e-10, rtol=1e-10)]  # fmt: skip
            raise fail(f"{where}: {', '.join(bad)} differ from the spec: token n of row b at position p = "
                       "cache_len[b] + n, y1 = x1 cos(p theta) - x2 sin(p theta), y2 = x2 cos + x1 sin with x1, x2 the "
                       "two halves of a head; k rotated and v as it is written at p.", seed)  # fmt: skip
    return _passed(f"✓ {name}: {checks} checks passed (one and two new tokens a row, each row its own length, "
                   "GQA 4/2 and none; float64)", checks)  # fmt: skip
