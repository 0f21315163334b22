"""Lesson 9's checkers, with answers written apart from them: each accepts a right answer and rejects
realistic wrong ones by name. The decode floor: the KV cache forgotten, counted per query head or K
alone, the weights read once per row, elements for bytes, a missing MLP matrix, attention's FLOPs
forgotten or counted per KV head. The split: ranges that drop the tail or read a key twice, GQA's head
mapping wrong, the scale forgotten, acc divided by l, m not the max, NaN in an empty split. The combine
(a Triton kernel): no rescaling by exp(m_s - M), l forgotten, the weights' sum for L, the mean of the
splits, one split, exp2, NaN where no key was seen, torch doing the work. RoPE with the cache write:
GPT-J's interleaved pairs, the rotation backwards, positions one late or early, the tokens written at 0,
k cached unrotated, q unrotated. And the floor agrees with the fused step's full ledger
(``fusionlab.model.llama_layer_ledger``)."""

from __future__ import annotations  # noqa: I001  (fusionlab before triton: see test_checkers_lesson2.py)

import math

import pytest
import torch

from fusionlab import grading, runtime  # noqa: F401  (runtime decides the interpreter before triton is imported)
import triton
import triton.language as tl

from fusionlab.grading import CheckFailed
from fusionlab.lessons.l9 import checkers as ex
from fusionlab.lessons.l9.ledger import MODELS, decode_floor
from fusionlab.model import llama_layer_ledger

pytestmark = pytest.mark.lesson9


# -- exercise 1: the floor --------------------------------------------------------------------------
def floor_right(B, n_cache, hidden, H, H_kv, ffn, es):
    D = hidden // H
    w = hidden * (H + 2 * H_kv) * D + H * D * hidden + 3 * hidden * ffn
    return 2 * B * w + 4 * B * H * n_cache * D, (w + 2 * B * H_kv * n_cache * D) * es


def _floor(kv_heads=None, kv_tensors=2, weight_rows=False, es_mult=True, mlp=3, attn_heads=None, per_weight=2):
    def fn(B, n_cache, hidden, H, H_kv, ffn, es):
        D = hidden // H
        w = hidden * (H + 2 * H_kv) * D + H * D * hidden + mlp * hidden * ffn
        kv = kv_tensors * B * (kv_heads(H, H_kv) if kv_heads else H_kv) * n_cache * D
        flops = per_weight * B * w + 4 * B * (attn_heads(H, H_kv) if attn_heads else H) * n_cache * D
        return flops, (w * (B if weight_rows else 1) + kv) * (es if es_mult else 1)

    return fn


FLOOR_WRONG = {
    "no KV cache": (_floor(kv_tensors=0), "reads every row's whole KV cache"),
    "per query head": (_floor(kv_heads=lambda H, H_kv: H), "share one KV head"),
    "K only": (_floor(kv_tensors=1), "K .for the scores. and V"),
    "weights per row": (_floor(weight_rows=True), "read once per step, whatever B"),
    "elements": (_floor(es_mult=False), "multiply by dtype_bytes"),
    "two MLP matrices": (_floor(mlp=2), "three matrices"),
    "no attention flops": (_floor(attn_heads=lambda H, H_kv: 0), "lack attention's"),
    "attention flops per kv head": (_floor(attn_heads=lambda H, H_kv: H_kv), "per KV head"),
    "one flop per weight": (_floor(per_weight=1), "2 FLOPs, not 1"),
    "a tensor back": (lambda *a: torch.tensor(floor_right(*a)), "return"),
    "off by a bit": (lambda *a: (floor_right(*a)[0], floor_right(*a)[1] * 1.01), "expected"),
}


def test_floor_accepts_the_right_count():
    assert "✓" in str(ex.check_decode_floor(floor_right))


def test_floor_accepts_the_small_terms_counted_or_not():
    # the draw that refused the weights-and-cache answer (B 64, a 635-key cache: the norms' weights, x, the
    # output and the new k and v are 0.2% of the step there), with and without the new k and v
    def with_new_kv(B, n_cache, hidden, H, H_kv, ffn, es):
        flops, nbytes = floor_right(B, n_cache, hidden, H, H_kv, ffn, es)
        return flops, nbytes + 2 * B * H_kv * (hidden // H) * es

    for fn in (floor_right, with_new_kv):
        with grading.replay(16247079730694):
            assert "✓" in str(ex.check_decode_floor(fn))


@pytest.mark.parametrize("mistake", FLOOR_WRONG)
def test_floor_rejects(mistake):
    fn, match = FLOOR_WRONG[mistake]
    with pytest.raises(CheckFailed, match=match):
        ex.check_decode_floor(fn)


@pytest.mark.parametrize("model", MODELS)
def test_the_floor_is_the_fused_steps_ledger_less_the_activations(model):
    hidden, H, H_kv, ffn = MODELS[model]
    for B in (1, 64):
        for n in (1024, 32768):
            floor = decode_floor(B, n, hidden, H, H_kv, ffn)
            parts = llama_layer_ledger(B, 1, hidden, H, H_kv, ffn, torch.bfloat16, n_cache=n)
            ratio = sum(p.fused_bytes for p in parts) / floor.nbytes
            assert 1.0 <= ratio < (1.005 if B == 1 else 1.04), (B, n, ratio)
            assert sum(p.flops for p in parts) == pytest.approx(floor.flops, rel=1e-3)


# -- exercise 2: the split --------------------------------------------------------------------------
def _split(L_of=lambda N, S: -(-N // S), extra=0, head=lambda h, G, H_kv: h // G, scale=True, normalise=False,
           shift=None, empty_nan=False):  # fmt: skip
    def fn(q, k, v, S):
        B, H, D = q.shape
        H_kv, N = k.shape[1], k.shape[2]
        G = H // H_kv
        L = L_of(N, S)
        acc = torch.zeros(B, H, S, D, dtype=q.dtype)
        m = torch.full((B, H, S), -math.inf, dtype=q.dtype)
        l = torch.zeros(B, H, S, dtype=q.dtype)  # noqa: E741
        for h in range(H):
            g = head(h, G, H_kv)
            for s in range(S):
                lo, hi = s * L, min((s + 1) * L + extra, N)
                if lo >= hi:
                    if empty_nan:
                        acc[:, h, s] = math.nan
                    continue
                sc = torch.einsum("bd,bnd->bn", q[:, h], k[:, g, lo:hi]) / (math.sqrt(D) if scale else 1)
                m[:, h, s] = sc.amax(-1) if shift is None else shift
                p = torch.exp(sc - m[:, h, s, None])
                l[:, h, s] = p.sum(-1)
                acc[:, h, s] = torch.einsum("bn,bnd->bd", p, v[:, g, lo:hi])
                if normalise:
                    acc[:, h, s] /= l[:, h, s, None]
        return acc, m, l

    return fn


SPLIT_WRONG = {
    "floor ranges": (_split(L_of=lambda N, S: max(1, N // S)), "in no split"),
    "inclusive ranges": (_split(extra=1), "counted in two splits"),
    "gqa modulo": (_split(head=lambda h, G, H_kv: h % H_kv), "h // G"),
    "no scale": (_split(scale=False), "not scaled"),
    "normalised acc": (_split(normalise=True), "already divided by l"),
    "m = 0": (_split(shift=0.0), "not the split's largest score"),
    "nan in an empty split": (_split(empty_nan=True), "holds no key has NaN"),
    "two outputs": (lambda q, k, v, S: _split()(q, k, v, S)[:2], "three tensors"),
}


def test_split_accepts_the_spec():
    assert "✓" in str(ex.check_split_partials(_split()))


@pytest.mark.parametrize("mistake", SPLIT_WRONG)
def test_split_rejects(mistake):
    fn, match = SPLIT_WRONG[mistake]
    with pytest.raises(CheckFailed, match=match):
        ex.check_split_partials(fn)


# -- exercise 3: the combine kernel ---------------------------------------------------------------------
@triton.jit
def _combine(acc_ptr, m_ptr, l_ptr, o_ptr, S, D, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, HOW: tl.constexpr):
    # HOW: 0 right; 1 no rescale; 2 no l; 3 weights for L; 4 first split; 5 exp2; 6 no guard (NaN rows);
    # 7 the mean of the splits' outputs
    row = tl.program_id(0)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, BLOCK_D)
    s_ok, d_ok = s < S, d < D
    if HOW == 4:
        s_ok = s < 1
    m = tl.load(m_ptr + row * S + s, mask=s_ok, other=float("-inf"))
    l = tl.load(l_ptr + row * S + s, mask=s_ok, other=0.0)  # noqa: E741
    acc = tl.load(acc_ptr + (row * S + s)[:, None] * D + d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    M = tl.max(m, 0)
    if HOW != 6:
        M = tl.where(M == float("-inf"), 0.0, M)
    if HOW == 5:
        w = tl.exp2(m - M)
    else:
        w = tl.exp(m - M)
    if HOW == 1:
        w = tl.where(s_ok, 1.0, 0.0)
    L = tl.sum(l * w, 0)
    if HOW == 2:
        L = 1.0 + 0.0 * L
    if HOW == 3:
        L = tl.sum(w, 0)
    o = tl.sum(acc * w[:, None], 0)
    if HOW == 7:
        seen = l > 0
        per = acc / tl.where(seen, l, 1.0)[:, None]
        n = tl.sum(tl.where(seen, 1.0, 0.0), 0)
        o = tl.sum(per, 0) / tl.where(n == 0, 1.0, n)
        L = 1.0 + 0.0 * L
    if HOW == 6:
        o = o / L
    else:
        o = tl.where(L == 0, 0.0, o / tl.where(L == 0, 1.0, L))
    tl.store(o_ptr + row * D + d, o, mask=d_ok)


def _combine_fn(how=0, unmasked_store=False, torch_work=False):
    def fn(acc, m, l):  # noqa: E741
        R, S, D = acc.shape
        if torch_work:
            w = torch.exp(m - m.amax(-1, keepdim=True).nan_to_num(0.0, neginf=0.0))
            return (acc * w[..., None]).sum(1) / (l * w).sum(1, keepdim=True)
        o = torch.empty((R, D), dtype=acc.dtype, device=acc.device)
        bd = triton.next_power_of_2(D)
        _combine[(R,)](acc, m, l, o, S, D if not unmasked_store else bd, BLOCK_S=triton.next_power_of_2(S),
                       BLOCK_D=bd, HOW=how)  # fmt: skip
        return o

    return fn


COMBINE_WRONG = {
    "no rescale": (_combine_fn(1), "without rescaling"),
    "forgot l": (_combine_fn(2), "not divided by the softmax's sum"),
    "weights for L": (_combine_fn(3), "the weights alone"),
    "first split only": (_combine_fn(4), "first split's alone"),
    "exp2": (_combine_fn(5), "exp2 where m is in natural units"),
    "no guard": (_combine_fn(6), "NaN"),
    "mean of the splits": (_combine_fn(7), "mean of the splits' outputs"),
    "torch does it": (_combine_fn(torch_work=True), "torch"),
    "store past D": (_combine_fn(unmasked_store=True), "past the end|loads past the end"),
}


def test_combine_accepts_the_kernel():
    assert "✓" in str(ex.check_combine(_combine_fn()))


@pytest.mark.parametrize("mistake", COMBINE_WRONG)
def test_combine_rejects(mistake):
    fn, match = COMBINE_WRONG[mistake]
    with pytest.raises(CheckFailed, match=match):
        ex.check_combine(fn)


def test_combine_inputs_hold_empty_splits_and_an_empty_row():
    for seed in range(40):  # every draw: the checker must never run without these cases
        gen = torch.Generator().manual_seed(seed)
        acc, m, l = ex.combine_inputs(9, 5, 16, gen, device="cpu")  # noqa: E741
        assert (l[1] == 0).all() and torch.isinf(m[1]).all() and (acc[1] == 0).all()
        assert ((l == 0) & (l.sum(-1, keepdim=True) > 0)).any(), seed  # a split with no key in a row that has keys


# -- exercise 4: RoPE and the cache write ---------------------------------------------------------------
def _rope_write(interleaved=False, sign=1, shift=0, at_zero=False, raw_k=False, raw_q=False, no_write=False,
                swap_halves=False):  # fmt: skip
    def fn(q, k, v, cos, sin, k_cache, v_cache, cache_len):
        B, N = q.shape[:2]
        pos = cache_len[:, None] + shift + torch.arange(N)
        c, s = cos[pos][:, :, None], sign * sin[pos][:, :, None]

        def rot(x):
            if interleaved:
                x1, x2 = x[..., 0::2], x[..., 1::2]
                return torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
            half = x.shape[-1] // 2
            x1, x2 = x[..., :half], x[..., half:]
            if swap_halves:
                return torch.cat((x2 * c + x1 * s, x1 * c - x2 * s), dim=-1)
            return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

        kr = k if raw_k else rot(k)
        at = torch.arange(N)[None, :].expand(B, N) if at_zero else pos
        for b in range(B):
            for n in range(N):
                if not no_write:
                    k_cache[b, :, at[b, n]] = kr[b, n]
                    v_cache[b, :, at[b, n]] = v[b, n]
        return q.clone() if raw_q else rot(q)

    return fn


ROPE_WRONG = {
    "interleaved pairs": (_rope_write(interleaved=True), "interleaved pairs"),
    "rotation backwards": (_rope_write(sign=-1), "backwards"),
    "one late": (_rope_write(shift=1), "one too far"),
    "one early": (_rope_write(shift=-1), "one too early"),
    "written at zero": (_rope_write(at_zero=True), "positions 0, 1"),
    "k cached unrotated": (_rope_write(raw_k=True), "before the rotation"),
    "q unrotated": (_rope_write(raw_q=True), "q is not rotated"),
    "no write": (_rope_write(no_write=True), "caches are unchanged"),
    "halves swapped": (_rope_write(swap_halves=True), "differ from the spec"),
}


def test_rope_cache_write_accepts_the_spec():
    assert "✓" in str(ex.check_rope_cache_write(_rope_write()))


@pytest.mark.parametrize("mistake", ROPE_WRONG)
def test_rope_cache_write_rejects(mistake):
    fn, match = ROPE_WRONG[mistake]
    with pytest.raises(CheckFailed, match=match):
        ex.check_rope_cache_write(fn)


def test_an_answer_that_calls_the_packages_floor_is_refused():
    with pytest.raises(CheckFailed, match="answer key"):
        ex.check_decode_floor(lambda *a: (decode_floor(*a).flops, decode_floor(*a).nbytes))
