"""Checkers for lesson 7's exercises (solutions/07_flash_attention.ipynb).

1. ``check_online_update``: one step of the online softmax, ``(m, l, acc, s, v) -> (m, l, acc)``, in
   float64 torch. Checked block by block against the one-pass softmax of every prefix: rejects an
   accumulator not rescaled (or ``l`` rescaled but not ``acc``), a max that forgets the old one, a
   division inside the step, and no max subtraction (scores near 1000 overflow ``exp``).
2. ``check_flash_forward``: the tiled forward kernel, ``fn(q, k, v) -> (O, lse)``, non-causal, one
   launch. ``check_flash_forward_causal``: the same with the top-left causal mask. Both reject, besides
   wrong values on awkward shapes: ``m`` initialised to 0 (every score below -100: ``exp`` underflows),
   no max subtraction (scores near +400 overflow ``exp``), an accumulator not rescaled (found by a
   second input whose row maxima all sit in the first key block), a division by ``l`` inside the key
   loop (read from the kernel's source), a causal mask off by one (strict or one key late), a base-2
   log-sum-exp, and a kernel that materialises the scores: the answer may allocate nothing of the
   scores' size ``B * H * N_q * N_k``, counted in the grading sandbox's allocations.
3. ``check_naive_peak_gib``: the peak memory of naive attention at one size.
"""

from __future__ import annotations

import ast
import inspect
import math
import textwrap

import torch

from ... import _triton, grading, runtime
from ...grading import CheckFailed, answer_key, call_learner, fail, number
from ...kernels.attention import attention_reference

Passed, _passed = grading.Passed, grading.passed
GIB = 2**30

# -- exercise 1: the online-softmax update ------------------------------------------------------------
#: rows, keys per block, blocks, value width
UPDATE_ROWS, UPDATE_BLOCK, UPDATE_BLOCKS, UPDATE_D = 6, 5, 4, 3
#: scores this large overflow exp() in float64 (e^709 is its largest) unless the max is subtracted
BIG_SCORE = 1000.0


def _update_inputs(gen, shift: float = 0.0, rising: bool = False):
    """Scores (rows, blocks * block) and values (blocks * block, D) in float64. ``rising``: the scores
    grow from block to block, so the max moves in every block (a missing rescale shows at once). Every
    row has a finite score in its first block; a few later scores are -inf (masked keys)."""
    n = UPDATE_BLOCK * UPDATE_BLOCKS
    s = torch.randn(UPDATE_ROWS, n, generator=gen, dtype=torch.float64) * 2 + shift
    if shift > 0:  # each row's first score far below the rest: the first score taken for the max overflows
        s[:, 0] -= 800
    if rising:
        s = s + torch.arange(n, dtype=torch.float64) * 0.7
    s[1, UPDATE_BLOCK + 1] = float("-inf")
    s[2, 2 * UPDATE_BLOCK :] = float("-inf")  # a row whose last blocks are all masked
    v = torch.randn(n, UPDATE_D, generator=gen, dtype=torch.float64)
    return s, v


def _prefix_state(s: torch.Tensor, v: torch.Tensor, upto: int):
    """(m, l, acc) after the first ``upto`` keys, from the one-pass formulas."""
    sp, vp = s[:, :upto], v[:upto]
    m = sp.max(dim=1).values
    p = torch.exp(sp - m[:, None])
    return m, p.sum(dim=1), p @ vp


def _as_state(out, where):
    if not (isinstance(out, (tuple, list)) and len(out) == 3):
        raise CheckFailed(f"{where}: return (m, l, acc), three tensors; got {type(out).__name__}.")
    for name, t in zip(("m", "l", "acc"), out, strict=True):
        if not isinstance(t, torch.Tensor):
            raise CheckFailed(f"{where}: {name} should be a tensor, got {type(t).__name__}.")
    return out


def check_online_update(update_fn) -> Passed:
    """Exercise 1: ``update_fn(m, l, acc, s, v) -> (m_new, l_new, acc_new)`` folds one block of scores
    ``s`` (rows, B) and values ``v`` (B, D) into the running max ``m`` (rows,), the running sum
    ``l = sum exp(s - m)`` (rows,) and the unnormalised accumulator ``acc = sum exp(s - m) v`` (rows, D)."""
    name = "online_update"
    if not callable(update_fn):
        raise CheckFailed(f"{name}: pass your function, got {type(update_fn).__name__}.")
    seed = grading.new_seed()
    checks = 0
    with grading.seeded(seed):
        for shift, rising in ((0.0, True), (0.0, False), (BIG_SCORE, True), (-BIG_SCORE, False)):
            s, v = _update_inputs(grading.fresh_generator(), shift, rising)
            m = torch.full((UPDATE_ROWS,), float("-inf"), dtype=torch.float64)
            l = torch.zeros(UPDATE_ROWS, dtype=torch.float64)  # noqa: E741  (the papers' name)
            acc = torch.zeros(UPDATE_ROWS, UPDATE_D, dtype=torch.float64)
            for b in range(UPDATE_BLOCKS):
                blk = slice(b * UPDATE_BLOCK, (b + 1) * UPDATE_BLOCK)
                where = f"{name}, block {b + 1} of {UPDATE_BLOCKS}" + (f", scores near {shift:g}" if shift else "")
                args = (m.clone(), l.clone(), acc.clone(), s[:, blk].clone(), v[blk].clone())
                m, l, acc = _as_state(call_learner(update_fn, *args, name=name, where=where, seed=seed), where)  # noqa: E741
                want_m, want_l, want_acc = _prefix_state(s, v, (b + 1) * UPDATE_BLOCK)
                _compare_state(where, (m, l, acc), (want_m, want_l, want_acc), seed)
                checks += 1
            o = acc / l[:, None]
            ref = torch.softmax(s, dim=1) @ v
            if not torch.allclose(o, ref, atol=1e-10, rtol=1e-10):  # pragma: no cover - implied by the states
                raise fail(f"{name}: acc / l after the last block is not softmax(s) @ v.", seed)
    return _passed(
        f"✓ online_update: {checks} block steps match the one-pass softmax of every prefix in float64 (max rising "
        f"in every block, masked keys, scores near ±{BIG_SCORE:g}); acc / l after the last block = softmax(s) @ v"
    )


def _compare_state(where, got, want, seed):
    names = ("m", "l", "acc")
    for name, g, w in zip(names, got, want, strict=True):
        if g.shape != w.shape:
            raise fail(f"{where}: {name} has shape {tuple(g.shape)}, expected {tuple(w.shape)}.", seed)
    low = [name for name, g in zip(names, got, strict=True) if g.dtype != torch.float64]
    m, l, acc = (t.detach().double() for t in got)  # noqa: E741
    wm, wl, wacc = want
    near = [
        n
        for n, g, w in zip(names, (m, l, acc), want, strict=True)
        if not torch.allclose(g, w, atol=1e-12, rtol=1e-12) and torch.allclose(g, w, atol=1e-5, rtol=1e-5)
    ]
    if low or near:
        # right to a float32's precision, not to float64's: a precision slip, not a wrong formula
        if low:
            dtype = grading.dtype_name(got[names.index(low[0])].dtype)
            what = f"{', '.join(low)} {'are' if len(low) > 1 else 'is'} {dtype}"
        else:
            what = f"{', '.join(near)} {'agree' if len(near) > 1 else 'agrees'} to about 1e-6 only"
        raise fail(
            f"{where}: {what}"
            + ": the state is computed in float32 somewhere. The exercise works in float64 (its check asks "
            "1e-12): keep the dtype of what you are given (torch.full(..., dtype=s.dtype), no .float()).",
            seed,
        )
    if not torch.allclose(m, wm, atol=1e-12, rtol=1e-12):
        raise fail(
            f"{where}: m is not the max of every score so far. m_new = max(m_old, the block's row max): the old "
            "max must survive a block whose scores are smaller.",
            seed,
        )
    if not (torch.isfinite(l).all() and torch.isfinite(acc).all()):
        raise fail(
            f"{where}: l or acc is inf or NaN where the true values are finite. Subtract the running max before "
            "exp(): exp(s - m_new) is at most 1, exp(s) overflows (float64's largest exp is e^709).",
            seed,
        )
    ok_acc = torch.allclose(acc, wacc, atol=1e-10, rtol=1e-10)
    if not ok_acc and torch.allclose(acc, wacc / wl[:, None], atol=1e-9, rtol=1e-9):
        raise fail(
            f"{where}: acc is already divided by l. Keep the accumulator unnormalised, sum exp(s - m) v, and "
            "divide once, after the last block: a division per block is work the end does once.",
            seed,
        )
    ok_l = torch.allclose(l, wl, atol=1e-10, rtol=1e-10)
    if not ok_l and torch.allclose(l, wl * torch.exp(wm), atol=1e-10, rtol=1e-9):
        raise fail(
            f"{where}: l is the sum of exp(s), not of exp(s - m). Subtract the running max before exp(): the "
            "state is kept relative to m, so that every exponent is <= 0 and nothing overflows.",
            seed,
        )
    if ok_l and ok_acc:
        return
    if ok_l:
        raise fail(
            f"{where}: l is right but acc is not. acc was summed against the old max: multiply it by "
            "alpha = exp(m_old - m_new), as you did l, before adding exp(s - m_new) @ v.",
            seed,
        )
    raise fail(
        f"{where}: l (the running sum) is off"
        + ("" if ok_acc else " and so is acc")
        + ". When the max rises from m_old to m_new, what was summed against m_old must be multiplied by "
        "alpha = exp(m_old - m_new): l_new = alpha * l + sum exp(s - m_new).",
        seed,
    )


# -- exercises 2 and 3: the tiled forward kernel ----------------------------------------------------------
#: (B, H, N_q, N_k, D): one query and key, odd lengths, N_q != N_k both ways, a head dim that is not a
#: power of two, more keys than a tile
SHAPES = ((1, 1, 1, 1, 16), (1, 2, 17, 17, 16), (2, 1, 40, 70, 32), (1, 1, 70, 40, 24), (1, 2, 129, 129, 16))
CAUSAL_SHAPES = ((1, 1, 1, 1, 16), (1, 2, 17, 17, 16), (1, 1, 64, 64, 16), (2, 1, 100, 100, 32), (1, 1, 40, 70, 16))
#: many programs at any tile (128 query rows: 5 tiles x 6 heads; 32 in the interpreter: 17 x 6)
MANY = (2, 3, 520, 24, 16)
#: more keys than any block a kernel might hard-code (all keys in one tile, no online softmax, is right
#: for the short rows above): 4099 keys for 40 queries; causal, 600 x 600 (rows of up to 600 keys)
LONG, LONG_CAUSAL = (1, 1, 40, 4099, 16), (1, 1, 600, 600, 16)
#: shifted scores: q and k carry +-SHIFT in their first coordinate, so every score is near +-SHIFT^2 * scale
SHIFT_SHAPE = (1, 2, 37, 45, 16)
SHIFT = 40.0
#: per-row norm-relative tolerance on O; absolute + relative on lse (scores are fp32 from exact products)
O_TOL = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}
LSE_ATOL, LSE_RTOL = 2e-4, 2e-5
#: O's tolerance where every score is near +-SHIFT^2 / sqrt(D) = +-400: an fp32 score that large carries a
#: rounding of about 1e-4 (a few steps of |s| * 2^-24 in the dot product), which becomes the same relative
#: error in every exp(s - m); the solutions measured up to 1.2e-4 (60 seeds), above O_TOL's 1e-4
SHIFT_O_TOL = 1e-3


def _o_tol(dtype, shift: float) -> float:
    return max(O_TOL[dtype], SHIFT_O_TOL) if shift else O_TOL[dtype]


def _dtypes():
    return [torch.float32, torch.float16] if runtime.is_interpreter() else [torch.float16, torch.bfloat16]


def flash_inputs(shape, dtype, gen, shift: float = 0.0, max_first: bool = False):
    """``q, k, v`` of ``shape = (B, H, N_q, N_k, D)``, each at the front of a longer buffer (a load past
    the end reads zeros). ``shift``: q's first coordinate is +|shift|, k's is ``shift``, the rest small,
    so every score is near ``shift * |shift| * scale``. ``max_first``: key 0 carries the largest score
    of every row (its first coordinate is large, q's positive, every other key's 0), so no row's max
    ever rises after the first key block."""
    B, H, n_q, n_k, d = shape
    q = torch.randn(B, H, n_q, d, generator=gen)
    k = torch.randn(B, H, n_k, d, generator=gen)
    v = torch.randn(B, H, n_k, d, generator=gen)
    if shift:
        q, k = q * 0.5, k * 0.5
        q[..., 0], k[..., 0] = abs(shift), shift
        if shift > 0:  # key 0's score far below the rest: a kernel that takes it for the max overflows
            k[:, :, 0, 0] = shift / 2
    if max_first:
        q = q * 0.3
        q[..., 0] = 2 + torch.rand(B, H, n_q, generator=gen) * 2
        k[..., 0] = 0.0
        k[:, :, 0] = 0.0
        k[:, :, 0, 0] = 8.0
    return tuple(grading.with_room_after(t.to(device=runtime.DEVICE, dtype=dtype)) for t in (q, k, v))


def _reference_masked(q, k, v, diagonal: int):
    """O and lse in float64 with query i seeing keys j <= i + diagonal (top-left); NaN rows where none."""
    scale = 1 / math.sqrt(q.shape[-1])
    s = (q.double() @ k.double().transpose(-2, -1)) * scale
    keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(diagonal)
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v.double(), torch.logsumexp(s, dim=-1)


def _row_err(o: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per-row relative error of O (rows flattened over B, H, N): |o - ref| / max(|ref|, 1e-3)."""
    o, ref = o.detach().double().cpu(), ref.detach().double().cpu()
    num = (o - ref).norm(dim=-1)
    return (num / ref.norm(dim=-1).clamp_min(1e-3)).nan_to_num(nan=math.inf).flatten()


def _close_lse(lse, ref) -> torch.Tensor:
    lse, ref = lse.detach().double().cpu().flatten(), ref.detach().double().cpu().flatten()
    return torch.isclose(lse, ref, atol=LSE_ATOL, rtol=LSE_RTOL)


class _KernelSources:
    """The source of the Triton kernels an answer launched, and of the jit helpers they call: found by
    name among the globals of the learner's function (a notebook cell's, a test file's)."""

    def __init__(self, fn, names):
        self.sources: dict[str, str] = {}
        remote = getattr(fn, "kernel_sources", None)  # an answer graded in another process sends them
        if remote is not None:
            todo = list(names)
            while todo:
                name = todo.pop()
                if name in self.sources or name not in remote:
                    continue
                self.sources[name] = remote[name]
                todo += [n.id for n in ast.walk(ast.parse(remote[name])) if isinstance(n, ast.Name)]
            return
        scope = dict(getattr(fn, "__globals__", {}))
        closure = getattr(fn, "__closure__", None) or ()
        code = getattr(fn, "__code__", None)
        if code is not None:
            scope.update({n: c.cell_contents for n, c in zip(code.co_freevars, closure, strict=False)})
        todo = list(names)
        while todo:
            name = todo.pop()
            obj = scope.get(name)
            base = _triton._base_fn(obj) if obj is not None else None
            if name in self.sources or base is None or base is obj or not inspect.isfunction(base):
                continue
            try:
                src = textwrap.dedent(inspect.getsource(base))
            except (OSError, TypeError):
                continue
            self.sources[name] = src
            scope.update(base.__globals__)
            todo += [n.id for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Name) and n.id not in self.sources]

    @staticmethod
    def _divisions(tree: ast.AST, src: str, names: set[str]) -> list[str]:
        """The divisions in ``tree`` whose divisor reads one of ``names``."""
        out = []
        for node in ast.walk(tree):
            divisor = None
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
                divisor = node.right
            elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Div):
                divisor = node.value
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("fdiv", "div_rn"):
                divisor = node.args[1] if len(node.args) > 1 else None
            if divisor is not None and {n.id for n in ast.walk(divisor) if isinstance(n, ast.Name)} & names:
                out.append(ast.get_source_segment(src, node) or "a division")
        return out

    def _helper_divisions(self, call: ast.Call, tainted: set[str], seen: frozenset = frozenset()) -> list[str]:
        """The divisions a jit helper called as ``call`` makes by a value derived from its arguments that
        read ``tainted`` names, in it or in the helpers it calls: what the kernel it is inlined into
        computes (Triton inlines every helper)."""
        name = getattr(call.func, "id", None) or getattr(call.func, "attr", None)
        src = self.sources.get(name)
        if src is None or name in seen:
            return []
        fn = next((n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.FunctionDef)), None)
        if fn is None:
            return []
        reads = lambda e: {n.id for n in ast.walk(e) if isinstance(n, ast.Name)}  # noqa: E731
        params = [a.arg for a in fn.args.args]
        bound = dict(zip(params, call.args, strict=False)) | {k.arg: k.value for k in call.keywords if k.arg}
        hot = {p for p, e in bound.items() if reads(e) & tainted}
        for node in ast.walk(fn):  # what the helper computes from them is hot too (one pass, in order)
            if isinstance(node, ast.Assign) and reads(node.value) & hot:
                hot |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        out = [f"{name}(): {d}" for d in self._divisions(fn, src, hot)]
        for inner in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            out += self._helper_divisions(inner, hot, seen | {name})
        return out

    def divisions_in_loops(self) -> list[str]:
        """Lines that divide by a value the loop itself updates (``acc / l_i``, ``1 / l_new``) inside a
        ``for`` or ``while`` loop: a normalisation per key block; also a jit helper called in such a loop
        with a value the loop updates that divides by its parameter (the same division, moved)."""
        out = []
        for src in self.sources.values():
            tree = ast.parse(src)
            for loop in (n for n in ast.walk(tree) if isinstance(n, (ast.For, ast.While))):
                assigned = set()
                for node in ast.walk(loop):
                    targets = node.targets if isinstance(node, ast.Assign) else []
                    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                        targets = [node.target]
                    for t in targets:
                        assigned |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
                out += self._divisions(loop, src, assigned)
                for call in (n for n in ast.walk(loop) if isinstance(n, ast.Call)):
                    out += self._helper_divisions(call, assigned)
        return out


def _a_pair(out, where, seed) -> None:
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise fail(f"{where}: return (O, lse), a pair; got {type(out).__name__}.", seed)


def _run_kernel(fn, name, shape, dtype, seed, *, causal, shift=0.0, max_first=False, first=False):
    """One call of the answer on fresh inputs, every structural check, then the values against float64.
    Returns None when right, else (the failure message, o, lse, inputs) for a diagnosis."""
    gen = grading.fresh_generator()
    q, k, v = flash_inputs(shape, dtype, gen, shift=shift, max_first=max_first)
    B, H, n_q, n_k, d = shape
    where = f"{name}, (B, H, N_q, N_k, D) = {shape}, {grading.dtype_name(dtype)}"
    if shift:
        where += f", every score near {shift * abs(shift) / math.sqrt(d):+g}"
    out, box = grading.run_answer(
        fn,
        (q, k, v),
        name=name,
        where=where,
        seed=seed,
        store_hint="Mask the stores of O and lse with offs_m < N_q (and the head dim).",
        torch_message=lambda ops: f"the answer computes or copies with torch ({ops}); do the work in your kernel.",
        before_torch=lambda box, out: _a_pair(out, where, seed),
    )
    ref_o, ref_lse = attention_reference(q, k, v, causal)  # only now: the answer cannot read it
    o, lse = out
    if not isinstance(o, torch.Tensor) or o.shape != q.shape or o.dtype != q.dtype:
        got = f"{tuple(o.shape)} {grading.dtype_name(o.dtype)}" if isinstance(o, torch.Tensor) else type(o).__name__
        raise fail(f"{where}: O should be like q, {tuple(q.shape)} {grading.dtype_name(dtype)}; got {got}.", seed)
    if not isinstance(lse, torch.Tensor) or lse.shape != (B, H, n_q) or lse.dtype != torch.float32:
        got = (
            f"{tuple(lse.shape)} {grading.dtype_name(lse.dtype)}"
            if isinstance(lse, torch.Tensor)
            else type(lse).__name__
        )
        raise fail(f"{where}: lse should be ({B}, {H}, {n_q}) float32, one number per query row; got {got}.", seed)
    scores = B * H * n_q * n_k
    if n_k > d:  # then the scores outnumber O's elements: an allocation that large can only hold them
        big = [tuple(a.shape) for a in box.allocations if a.numel() >= scores]
        if big:
            raise fail(
                f"{where}: your code allocates a tensor of {big[0]} = at least the {scores} scores "
                f"(B * H * N_q * N_k). The N x N scores are what this kernel keeps off HBM: hold one "
                "BLOCK_M x BLOCK_N tile of them in registers at a time, and allocate only O and lse.",
                seed,
            )
    grading.require_launches(
        box,
        out,
        (q, k, v),
        where,
        seed,
        why="The scores, the softmax and P V all happen in one kernel: that is what keeps S and P on chip.",
    )
    if first:
        divs = _KernelSources(fn, box.names).divisions_in_loops()
        if divs:
            raise fail(
                f"{name}: your kernel divides inside its key loop ({divs[0]}). Keep acc unnormalised and divide "
                "once, after the loop: O = acc / l. A division per block is work (and rounding) the end does once.",
                seed,
            )
    for t, what in ((o, "O"), (lse, "lse")):
        unwritten = grading.poisoned(t)
        if unwritten.any():
            raise fail(
                f"{where}: {int(unwritten.sum())} elements of {what} were never written. Check the grid "
                "(query tiles x B * H) and the store masks.",
                seed,
            )
    err, tol = _row_err(o, ref_o), _o_tol(dtype, shift)
    lse_ok = _close_lse(lse, ref_lse)
    finite = torch.isfinite(o.detach().double().cpu()).all() and torch.isfinite(lse.detach().double().cpu()).all()
    if err.max() <= tol and lse_ok.all():
        return None
    outside = grading.computed_outside(
        box, o, lambda *qkv: attention_reference(*qkv, causal)[0], (q, k, v), where, seed
    )
    if outside is not None:  # before any diagnosis of the values, which would rerun the answer
        raise outside
    if not finite:
        if shift > 0:
            msg = (
                f"{where}: O or lse is inf or NaN. exp() of a score near {shift * shift / math.sqrt(d):g} "
                "overflows fp32 (e^88 is its largest): subtract the running max m before exp()."
            )
        elif shift < 0:
            msg = (
                f"{where}: O or lse is NaN or inf. Every score of these rows is far below 0: exp(s - m) must "
                "reach 1 at the row's max, so m must start at -inf (not 0) and be the max of the scores seen."
            )
        elif causal and not torch.isfinite(o.detach().double().cpu()[..., 0, :]).all():
            msg = (
                f"{where}: O or lse is inf or NaN on the first query row, which sees key 0 alone: your key loop "
                "stops before the diagonal block, so a query tile's first rows get no key at all (l = 0). Run "
                "the causal loop up to and including the diagonal block, to (start_m + 1) * BLOCK_M, and mask "
                "inside it (j <= i)."
            )
        else:
            msg = f"{where}: O or lse is inf or NaN where the answer is finite."
        return msg, o, lse, (q, k, v)
    bad = int((err > tol).sum())
    if bad == 0:
        ln2 = torch.isclose(
            lse.detach().double().cpu().flatten() * math.log(2), ref_lse.double().cpu().flatten(), atol=1e-4, rtol=1e-4
        )
        if ln2.all():
            msg = f"{where}: lse is in base 2. Return the natural log: lse = ln 2 * (m2 + log2(l)), or use exp and log."
        else:
            i = int((~lse_ok).nonzero()[0][0])
            got, want = lse.detach().flatten()[i].item(), ref_lse.flatten()[i].item()
            msg = f"{where}: O is right, lse is off at row {i}: got {got:.6g}, expected {want:.6g} (lse = m + log l)."
        return msg, o, lse, (q, k, v)
    i = int((err > tol).nonzero()[0][0])
    msg = (
        f"{where}: {bad} of {err.numel()} rows of O differ from float64 beyond a relative {tol:g}; "
        f"the first is row {i % n_q} of head {i // n_q}."
    )
    return msg, o, lse, (q, k, v)


#: the diagnosis runs here: enough rows that a mask off by one shows on rows that have keys either way
DIAG_SHAPE = (1, 2, 40, 40, 16)


def _diagnose(fn, name, dtype, seed, causal, msg):
    """A better message for a wrong answer: an off-by-one causal mask, or a missing rescale."""
    if causal:
        res = _run_kernel(fn, name, DIAG_SHAPE, dtype, seed, causal=True)
        if res is not None:
            _, o, _, (q, k, v) = res
            for diagonal, what in ((-1, "strict (j < i): query i must also see key i itself"),
                                   (1, "one key late (j <= i + 1)")):  # fmt: skip
                ref_o, _ = _reference_masked(q, k, v, diagonal)
                rows = torch.isfinite(ref_o.cpu()).all(dim=-1).flatten()
                err = _row_err(o, ref_o)
                if rows.any() and (err[rows] <= O_TOL[dtype]).all():
                    raise fail(f"{name}: your causal mask is {what}. Keep key j for query i where j <= i.", seed)
    # a second input where every row's max sits in key 0: a kernel that never rescales is right there
    if _run_kernel(fn, name, DIAG_SHAPE, dtype, seed, causal=causal, max_first=True) is None:
        raise fail(
            f"{msg}\n  Your kernel is right when each row's max is in the first key block and wrong otherwise: when "
            "m rises, multiply l AND acc by alpha = exp(m_old - m_new) before adding the new block.",
            seed,
        )
    raise fail(msg, seed)


def _check_kernel(fn, name: str, causal: bool) -> int:
    if not callable(fn):
        raise CheckFailed(f"{name}: pass your function, got {type(fn).__name__}.")
    seed = grading.new_seed()
    dtypes = _dtypes()
    shapes = CAUSAL_SHAPES if causal else SHAPES
    plan = [dict(shape=s, dtype=d) for d in dtypes for s in shapes]
    plan.append(dict(shape=MANY, dtype=dtypes[0]))
    plan += [dict(shape=SHIFT_SHAPE, dtype=d, shift=sh) for d in dtypes for sh in (SHIFT, -SHIFT)]
    plan.append(dict(shape=shapes[-1], dtype=dtypes[-1]))  # the same shape again, fresh values
    plan.append(dict(shape=LONG_CAUSAL if causal else LONG, dtype=dtypes[0]))  # last: the cases above keep their seeds
    with grading.seeded(seed):
        if grading.GRADING[0]:  # the grading command: lengths no list fixed, at block boundaries
            drawn = [(1, 2, grading.drawn_length(2, 7), grading.drawn_length(2, 7), 16) for _ in dtypes]
            if causal:
                drawn = [(b, h, n_q, n_q, d) for b, h, n_q, _, d in drawn]
            plan[-1:-1] = [dict(shape=s, dtype=d) for s, d in zip(drawn, dtypes, strict=True)]
        for i, case in enumerate(plan):
            res = _run_kernel(fn, name, case["shape"], case["dtype"], seed, causal=causal,
                              shift=case.get("shift", 0.0), first=i == 0)  # fmt: skip
            if res is not None:
                if case.get("shift"):
                    raise fail(res[0], seed)
                if case["shape"] in (LONG, LONG_CAUSAL):  # every shorter row was right
                    n_k = case["shape"][3]
                    raise fail(
                        f"{res[0]}\n  Your kernel was right on rows of up to {max(sh[3] for sh in shapes)} keys and is "
                        f"wrong on {n_k}: does it walk every key, block after block (the loop over start_n), "
                        "rather than one block of a fixed size?",
                        seed,
                    )
                _diagnose(fn, name, case["dtype"], seed, causal, res[0])
    return len(plan)


def check_flash_forward(flash_fn) -> Passed:
    """Exercise 2: ``flash_fn(q, k, v) -> (O, lse)`` for q (B, H, N_q, D), k and v (B, H, N_k, D): O =
    softmax(q k^T / sqrt(D)) v in q's dtype, lse = the natural log-sum-exp of each row's scaled scores
    (fp32), from one Triton kernel that never allocates the scores."""
    n = _check_kernel(flash_fn, "flash_forward", causal=False)
    return _passed(
        f"✓ flash_forward: {n} checks passed ({len(SHAPES)} shapes × 2 dtypes: N from 1 to 129, N_q != N_k both ways, "
        f"D = 24; {MANY[0] * MANY[1]} heads of {MANY[2]} queries; {LONG[3]} keys; scores near ±{SHIFT**2 / 4:g}; "
        "one repeated. O and "
        "lse against float64, 1 launch, nothing allocated the size of the scores, one division after the key loop)"
    )


def check_flash_forward_causal(flash_fn) -> Passed:
    """Exercise 3: ``flash_fn(q, k, v) -> (O, lse)`` with the top-left causal mask: query i sees keys
    j <= i, as ``F.scaled_dot_product_attention(is_causal=True)``."""
    n = _check_kernel(flash_fn, "flash_forward_causal", causal=True) + _causal_probe(flash_fn)
    return _passed(
        f"✓ flash_forward_causal: {n} checks passed ({len(CAUSAL_SHAPES)} shapes × 2 dtypes: N from 1 to 100, "
        f"N_q < N_k; {MANY[0] * MANY[1]} heads of {MANY[2]} queries; N = {LONG_CAUSAL[2]}; scores near "
        f"±{SHIFT**2 / 4:g}; one repeated. "
        "Top-left mask j <= i, O and lse against float64, 1 launch, nothing allocated the size of the scores; "
        "a skip probe: keys past a tile's diagonal are never loaded)"
    )


def _causal_probe(flash_fn) -> int:
    """NaN in the last keys: the rows of the tiles before them (any tile up to 128 rows) never need them, so a
    kernel that stops each Q tile's key loop at its diagonal keeps those rows right, and one that walks every
    key block (right answers, twice the work) turns them into NaN (a NaN key it loads and masks still turns
    P V into NaN: 0 * NaN). Exercise 5's end probe with a window as long as the sequence."""
    seed = grading.new_seed()
    dtype = _dtypes()[0]
    with grading.seeded(seed):
        q, k, v = flash_inputs((1, 2, SKIP_N, SKIP_N, 16), dtype, grading.fresh_generator())
        clean = [t.clone() for t in (q, k, v)]
        keys = slice(SKIP_N - POISON_KEYS, SKIP_N)
        for t in (k, v):
            t[:, :, keys] = float("nan")
        where = f"flash_forward_causal skip probe, N = {SKIP_N}, NaN in keys {keys.start}..{keys.stop - 1}"
        o, lse, box = _window_call(
            lambda q, k, v, window: flash_fn(q, k, v), q, k, v, SKIP_N, where, seed, name="flash_forward_causal"
        )
        rows = slice(0, SKIP_N - 2 * SKIP_TILE - POISON_KEYS)
        hint = (
            f"Rows 0..{rows.stop - 1} never see those keys, yet your kernel read them: it walks every key block. "
            "Stop each Q tile's key loop after its last row's key, hi = min(N_k, (pid_m + 1) * BLOCK_M): the "
            "blocks above the diagonal are all masked, and skipping them halves the work."
        )
        _window_values(o, lse, *clean, SKIP_N, rows, where, seed, dtype, hint, skip_probe=True, box=box, seen=(q, k, v))
    return 1


# -- exercise 4: the peak memory of naive attention -----------------------------------------------------
#: the exercise's size: one sequence of 8192 tokens, 32 heads of 128, fp16
PEAK_SHAPE, PEAK_DTYPE_BYTES = (1, 32, 8192, 128), 2


@answer_key
def naive_peak_bytes(B: int, H: int, N: int, D: int, dtype_bytes: int) -> int:
    """Peak bytes naive attention (``attention_eager``, non-causal) allocates beyond q, k, v: the scaled
    scores and the probabilities, two (B, H, N, N) tensors alive together (S itself is freed once
    scaled), and the output O."""
    return (2 * B * H * N * N + B * H * N * D) * dtype_bytes


def check_naive_peak_gib(peak_gib) -> Passed:
    """Exercise 4: the peak memory in GiB, beyond q, k and v, of naive attention (non-causal) at
    B = 1, H = 32, N = 8192, D = 128 in fp16."""
    got = number(peak_gib, "my_naive_peak_gib", "GiB")
    B, H, N, D = PEAK_SHAPE
    want = naive_peak_bytes(B, H, N, D, PEAK_DTYPE_BYTES) / GIB
    one = B * H * N * N * PEAK_DTYPE_BYTES / GIB
    o_gib = B * H * N * D * PEAK_DTYPE_BYTES / GIB
    # within the 1% below, yet exactly the two N x N tensors: the output left out (O is 0.8% of the peak)
    if abs(got - 2 * one) <= 1e-3 * one:
        raise CheckFailed(
            f"my_naive_peak_gib = {got:.4g}: the scaled scores and P without O. The output (B, H, N, D) = "
            f"{o_gib:.4g} GiB is allocated by P @ v while P is still alive: add it."
        )
    if abs(got - want) <= 0.01 * want:
        return _passed(
            f"✓ naive peak: {want:.2f} GiB beyond q, k, v = two (B, H, N, N) fp16 tensors of {one:.2f} GiB "
            "(the scaled scores and P, alive together) + O"
        )
    tips = {
        1: "That is one N x N tensor. softmax writes P while its input, the scaled scores, is still alive.",
        3: "Three counts S too; the unscaled S is freed as soon as `S * scale` has been computed.",
        4: "Four N x N tensors: that is fp32, but these are fp16 (2 bytes).",
    }
    tip = grading.memory_answer_tip(got, want, one, tips, PEAK_DTYPE_BYTES)
    raise CheckFailed(f"my_naive_peak_gib = {got:.4g}, expected about {want:.2f} GiB.{tip}")


# -- exercise 5: sliding-window causal attention, the blocks outside the window skipped --------------------
#: (B, H, N, D, window): one token; a window of one key (each row sees itself); windows shorter than,
#: equal to and longer than a tile; a window as long as the sequence (plain causal); N not a multiple of a tile
WINDOW_CASES = (
    (1, 1, 1, 16, 1),
    (1, 2, 100, 32, 1),
    (1, 2, 100, 16, 7),
    (2, 1, 130, 16, 33),
    (1, 1, 70, 24, 64),
    (1, 1, 64, 16, 64),
    (1, 3, 200, 16, 200),
)
#: the skip probes: N keys, a short window, NaN in the first or the last POISON_KEYS keys. A kernel with
#: tiles up to 128 x 128 that starts each Q tile's loop at its window and stops it at its diagonal never
#: loads key 0 for rows >= 2 * 128 + WINDOW_PROBE, nor the last keys for rows < N - 2 * 128 - POISON_KEYS
#: (a NaN key it loads and masks still turns P V into NaN: 0 * NaN); rows in between may be anything
SKIP_N, WINDOW_PROBE, POISON_KEYS, SKIP_TILE = 600, 8, 8, 128


@answer_key
def window_reference(q, k, v, window: int):
    """O and lse in float64 of causal attention in a window: query i sees keys i - window < j <= i."""
    scale = 1 / math.sqrt(q.shape[-1])
    s = (q.double() @ k.double().transpose(-2, -1)) * scale
    n_q, n_k = s.shape[-2:]
    i = torch.arange(n_q, device=s.device)[:, None]
    j = torch.arange(n_k, device=s.device)[None, :]
    s = s.masked_fill(~((j <= i) & (j > i - window)), float("-inf"))
    return torch.softmax(s, dim=-1) @ v.double(), torch.logsumexp(s, dim=-1)


def _window_call(fn, q, k, v, window, where, seed, name="sliding_window"):
    """Call the answer through the checkers' common sequence (:func:`grading.run_answer`: inputs concealed
    outside its kernel's run, unchanged, no store past the end, no torch, no result written after the kernel)
    and this exercise's own checks; returns (o, lse, sandbox)."""
    B, H, n, d = q.shape
    out, box = grading.run_answer(
        fn,
        (q, k, v, window),
        name=name,
        where=where,
        seed=seed,
        store_hint="Mask the stores of O and lse with offs_m < N (and the head dim).",
        torch_message=lambda ops: f"the answer computes or copies with torch ({ops}); do the work in your kernel.",
        before_torch=lambda box, out: _a_pair(out, where, seed),
    )
    o, lse = out
    ok_o = isinstance(o, torch.Tensor) and o.shape == q.shape and o.dtype == q.dtype
    ok_lse = isinstance(lse, torch.Tensor) and lse.shape == (B, H, n) and lse.dtype == torch.float32
    if not (ok_o and ok_lse):
        raise fail(f"{where}: return O like q {tuple(q.shape)} and lse ({B}, {H}, {n}) float32.", seed)
    if n > d and any(a.numel() >= B * H * n * n for a in box.allocations):
        raise fail(f"{where}: your code allocates a tensor the size of the N x N scores; keep them on chip.", seed)
    grading.require_launches(box, out, (q, k, v), where, seed)
    for t, what in ((o, "O"), (lse, "lse")):
        if grading.poisoned(t).any():
            raise fail(f"{where}: {int(grading.poisoned(t).sum())} elements of {what} were never written.", seed)
    return o, lse, box


def _window_values(o, lse, q, k, v, window, rows, where, seed, dtype, hint, skip_probe=False, box=None, seen=()):
    """O and lse of query ``rows`` (a slice) against float64. ``hint`` is said where O holds NaN in a skip
    probe (a NaN key was loaded); finite but wrong values get the mask's hint. ``box``, ``seen``: the sandbox
    the answer ran in and the inputs it was handed, to name a result computed outside the kernel first."""
    ref_o, ref_lse = window_reference(q, k, v, window)
    err = _row_err(o[:, :, rows], ref_o[:, :, rows])
    lse_ok = _close_lse(lse[:, :, rows], ref_lse[:, :, rows])
    if err.max() <= O_TOL[dtype] and lse_ok.all():
        return
    if box is not None:
        spec = lambda q, k, v: window_reference(q, k, v, window)[0].to(q.dtype)  # noqa: E731
        outside = grading.computed_outside(box, o, spec, seen or (q, k, v), where, seed)
        if outside is not None:
            raise outside
    bad = int((err > O_TOL[dtype]).sum()) + int((~lse_ok).sum())
    if torch.isfinite(o[:, :, rows].detach().double()).all():
        hint = "Mask keys j > i (the future) and j <= i - window (out of the window) with -inf."
    elif not skip_probe:
        hint = (
            "O holds NaN: in a block where a row has no key in its window yet, m stays -inf and "
            "exp(-inf - (-inf)) is NaN. Subtract 0 instead where m is still -inf (exp(-inf - 0) = 0)."
        )
    raise fail(
        f"{where}: {bad} rows of O or lse differ from float64 (query i sees keys i - window < j <= i). {hint}", seed
    )


def check_sliding_window(window_fn) -> Passed:
    """``window_fn(q, k, v, window) -> (O, lse)``: causal attention in which query i sees only the
    ``window`` keys ``i - window < j <= i``, for q, k, v (B, H, N, D), N_q = N_k. Checked on fresh inputs
    of awkward sizes in the dtypes of the mode, one launch, poisoned outputs, inputs unchanged, nothing
    of the scores' size; then the skip probes: NaN in keys the kernel must never load (those before
    every window of a far-away Q tile, and those after the diagonal of an early one)."""
    seed = grading.new_seed()
    checks = 0
    with grading.seeded(seed):
        for dtype in _dtypes():
            for B, H, n, d, window in WINDOW_CASES:
                gen = grading.fresh_generator()
                q, k, v = flash_inputs((B, H, n, n, d), dtype, gen)
                where = f"sliding_window, (B, H, N, D) = {(B, H, n, d)}, window {window}, {grading.dtype_name(dtype)}"
                o, lse, box = _window_call(window_fn, q, k, v, window, where, seed)
                _window_values(o, lse, q, k, v, window, slice(None), where, seed, dtype, "", box=box)
                checks += 1
            if dtype == _dtypes()[0]:  # the skip probes once, between the dtypes: a kernel that loads
                checks += _window_probes(window_fn, seed, dtype)  # every block fails before the second dtype
    return _passed(
        f"✓ sliding_window: {checks} checks passed ({len(WINDOW_CASES)} awkward shapes and windows x "
        f"{len(_dtypes())} dtypes, fresh inputs, poisoned outputs, inputs unchanged, one launch; and two skip "
        "probes: keys outside every window of a tile are never loaded)",
        checks,
    )


def _window_probes(window_fn, seed, dtype) -> int:
    """NaN in the first keys, then in the last: rows whose tiles never need them must stay right."""
    checks = 0
    for side in ("start", "end"):
        gen = grading.fresh_generator()
        q, k, v = flash_inputs((1, 2, SKIP_N, SKIP_N, 16), dtype, gen)
        clean = [t.clone() for t in (q, k, v)]
        keys = slice(0, POISON_KEYS) if side == "start" else slice(SKIP_N - POISON_KEYS, SKIP_N)
        for t in (k, v):
            t[:, :, keys] = float("nan")
        where = (
            f"sliding_window skip probe, N = {SKIP_N}, window {WINDOW_PROBE}, NaN in keys {keys.start}..{keys.stop - 1}"
        )
        o, lse, box = _window_call(window_fn, q, k, v, WINDOW_PROBE, where, seed)
        if side == "start":
            rows = slice(2 * SKIP_TILE + WINDOW_PROBE, SKIP_N)
            hint = (
                "Those rows' windows end far from key 0, yet your kernel read it: start each Q tile's key "
                "loop at its window, lo = max(0, start_m - window + 1) rounded down to a BLOCK_N boundary."
            )
        else:
            rows = slice(0, SKIP_N - 2 * SKIP_TILE - POISON_KEYS)
            hint = "Stop each Q tile's key loop after its last row's key, as causal attention does."
        _window_values(
            o, lse, *clean, WINDOW_PROBE, rows, where, seed, dtype, hint, skip_probe=True, box=box, seen=(q, k, v)
        )
        checks += 1
    return checks


#: the block count the prediction of exercise 5 is checked against: N, window, BLOCK_M, BLOCK_N
WINDOW_PREDICTION = (16384, 1024, 128, 64)


def window_block_fraction(n: int, window: int, block_m: int, block_n: int) -> float:
    """Key blocks a sliding-window kernel computes (each Q tile from its window's first block to its
    diagonal) over the blocks full attention computes."""
    done = 0
    for start_m in range(0, n, block_m):
        lo = max(0, start_m - window + 1) // block_n * block_n
        hi = min(n, start_m + block_m)
        done += -(-(hi - lo) // block_n)
    return done / (-(-n // block_m) * -(-n // block_n))


def check_window_prediction(fraction) -> Passed:
    """The learner's predicted fraction of key blocks computed at :data:`WINDOW_PREDICTION`, within 2% of
    the count (the count is exact; 2% leaves room for rounding the diagonal's share by hand)."""
    got = number(fraction, "my_window_fraction")
    want = window_block_fraction(*WINDOW_PREDICTION)
    n, window, bm, bn = WINDOW_PREDICTION
    if abs(got - want) > 0.02 * want:
        raise fail(
            f"my_window_fraction = {got:.4g}; the block count at N = {n}, window {window}, tiles {bm} x {bn} "
            f"gives a different fraction of full attention's blocks. Count per Q tile: the blocks from the "
            "one holding its first row's first key to the one holding its last row's diagonal."
        )
    return _passed(f"✓ your prediction {got:.4g} matches the block count ({want:.4f} of full attention's blocks)")
