"""Lesson 7b: lesson 7's forward with a score modification and a block mask, against the float64 reference
(N not a multiple of a tile, N_q != N_k, grouped-query heads), the block lists against the mask they come
from, empty blocks never loaded, the reference against ``torch.nn.attention.flex_attention`` (eager), and
clear errors. Interpreter sizes (32 x 16 tiles); the GPU cases (marked ``gpu``) run bf16 at head dims 64
and 128 and the mask's 128 x 64 tiles."""

from __future__ import annotations

import warnings

import pytest
import torch
import triton
import triton.language as tl
from conftest import gpu_only

from fusionlab import runtime
from fusionlab.kernels import KernelInputError
from fusionlab.kernels.attention import attention, attention_reference
from fusionlab.kernels.attention_mods import (
    MOD_TILE,
    MOD_TILE_INTERPRETER,
    MaskMod,
    ScoreMod,
    _mods,
    alibi,
    block_mask,
    causal_mask,
    document_mask,
    prefix_lm,
    relative_bias,
    sliding_window,
    softcap,
)

pytestmark = [
    pytest.mark.lesson7,
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]

DEV = runtime.DEVICE
GPU = runtime.is_gpu()
DT = torch.bfloat16 if GPU else torch.float32
TOL = 2e-2 if GPU else 1e-5  # norm-relative on O; bf16 rounds P before P V


def _qkv(B, H, H_kv, N_q, N_k, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, N_q, D, generator=g).to(DEV, DT)
    k = torch.randn(B, H_kv, N_k, D, generator=g).to(DEV, DT)
    v = torch.randn(B, H_kv, N_k, D, generator=g).to(DEV, DT)
    return q, k, v


def _close(got, ref, tol=TOL):
    o, lse = got
    ro, rlse = ref
    assert torch.equal(torch.isneginf(lse), torch.isneginf(rlse)), "a row the mask empties differs"
    fin = torch.isfinite(rlse)
    assert (lse[fin] - rlse[fin]).abs().max() < (5e-2 if GPU else 1e-4)
    err = (o.double() - ro.double()).norm() / ro.double().norm().clamp_min(1e-30)
    assert err < tol, f"O off by {err:.2e} of its norm"


def _docs(n, sizes):
    ids = torch.cat([torch.full((s,), i) for i, s in enumerate(sizes)])
    return ids[:n] if ids.numel() >= n else torch.cat([ids, torch.full((n - ids.numel(),), len(sizes))])


SCORE_MODS = {
    "softcap": lambda H: softcap(2.0),
    "alibi": lambda H: alibi(H),
    "relative_bias": lambda H: relative_bias(torch.linspace(-1, 1, H * 9).view(H, 9).to(DEV)),
}
MASKS = {
    "causal": lambda n: causal_mask(),
    "sliding_window": lambda n: sliding_window(7),
    "prefix_lm": lambda n: prefix_lm(12),
    "document": lambda n: document_mask(_docs(n, [10, 20, 3]).to(DEV)),
    "document_bidirectional": lambda n: document_mask(_docs(n, [17, 9]).to(DEV), causal=False),
}


#: the two softmax loops of the modification path: online (a running max), and against a reference max
#: (lesson 7's REF_MAX: the tile's first block's max, no rescale; the GPU's default on the TMA path)
LOOPS = [pytest.param(0, id="online"), pytest.param(2, id="ref_max")]


@pytest.mark.parametrize("ref", LOOPS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mod", list(SCORE_MODS))
def test_score_mod_matches_reference(mod, causal, ref):
    # N_q = 45 (a partial Q tile and a partial key block), N_k = 45; GQA 4:2
    q, k, v = _qkv(1, 4, 2, 45, 45, 32, seed=1)
    sm = SCORE_MODS[mod](4)
    got = attention(q, k, v, causal, score_mod=sm, config={"REF_MAX": ref})
    _close(got, attention_reference(q, k, v, causal, score_mod=sm))


def test_score_mod_changes_the_answer():
    # a modification that reached the kernel: the output moves, by the reference's amount
    q, k, v = _qkv(1, 2, 2, 33, 40, 16, seed=2)
    plain = attention(q, k, v)[0]
    capped = attention(q * 4, k, v, score_mod=softcap(1.0))
    assert (capped[0] - plain).abs().max() > 1e-2
    _close(capped, attention_reference(q * 4, k, v, score_mod=softcap(1.0)))


@pytest.mark.parametrize("ref", LOOPS)
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("with_mod", [False, True], ids=["mask", "mask+softcap"])
def test_block_mask_matches_reference(mask, with_mod, ref):
    n = 45
    q, k, v = _qkv(2, 2, 1, n, n, 32, seed=3)
    bm = block_mask(MASKS[mask](n), None, None, n, n, device=DEV)
    sm = softcap(3.0) if with_mod else None
    got = attention(q, k, v, score_mod=sm, block_mask=bm, config={"REF_MAX": ref})
    _close(got, attention_reference(q, k, v, score_mod=sm, block_mask=bm))


@triton.jit
def _steep(score, b, h, q_idx, kv_idx, aux, a0, a1):
    return score + 4.0 * kv_idx.to(tl.float32)


def test_an_unbounded_modification_takes_the_online_loop():
    # a bias that grows with the distance overflows a reference max taken in key order and runs tiles twice,
    # so the plan takes the online loop; softcap's scores are bounded and keep the table's REF_MAX; ALiBi
    # (rising: it only raises later keys) keeps it too, its keys walked backwards, but not with a block mask
    # (walked forwards); a config decides first
    from fusionlab.kernels.attention import _config, _plan

    q = torch.empty(1, 2, 45, 32, device=DEV, dtype=DT)
    table = _config(45, 45, 32, False, False, GPU)["REF_MAX"]
    bm = block_mask(causal_mask(), None, None, 45, 45, device=DEV)
    unbounded = ScoreMod(_steep, name="steep")
    for sm, mask, want in ((unbounded, None, 0), (alibi(2), bm, 0), (softcap(3.0), None, table),
                           (alibi(2), None, table)):  # fmt: skip
        mods = _mods(q, q, False, sm, mask)
        assert mods.kwargs.get("MOD_RISING", False) == (sm.rising and mask is None), sm.name
        for key, ref in (((("REF_MAX", 2),), 2), ((), want)):
            plan = _plan(q.shape, q.stride(), q.shape, q.stride(), q.stride(), q.dtype, False, None, key, mods.tiles)
            assert plan.meta["REF_MAX"] == ref, (sm.name, key)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n_q, n_k", [(64, 64), (40, 72), (72, 40)])
def test_a_rising_modification_walks_its_keys_back(n_q, n_k, causal):
    # ALiBi against a reference max: the masked blocks first (online), then the rest from the last block back;
    # with nothing masked (64 keys, full) the last block sets the reference. A steep rising bias (4 a key:
    # hundreds of base-2 units across the row, past fp32's 2**128) overflows a forward walk, not one walked back
    q, k, v = _qkv(1, 4, 2, n_q, n_k, 32, seed=12)
    for sm in (alibi(4), ScoreMod(_steep, lambda s, b, h, qi, kv, aux, a0, a1: s + 4.0 * kv, name="steep",
                                  rising=True)):  # fmt: skip
        got = attention(q, k, v, causal, score_mod=sm, config={"REF_MAX": 1})
        _close(got, attention_reference(q, k, v, causal, score_mod=sm))


def test_ref_max_overflow_falls_back_to_the_online_loop():
    # the first block's max far below a later one (2**127 in base 2 overflows exp2): the tile reruns online
    q, k, v = _qkv(1, 1, 1, 40, 40, 16, seed=9)
    q, k = q * 0.1, k * 0.1
    q[..., 0], k[..., 0] = 30.0, 0.0
    k[0, 0, 30:, 0] = 30.0  # scores near 900 / 4 = 225 nats, 325 in base 2, in the last blocks only
    for bm in (None, block_mask(prefix_lm(40), None, None, 40, 40, device=DEV)):
        # scores near 225 carry an fp32 rounding of about 1e-5 into every exp (lesson 7's SHIFT_O_TOL)
        _close(attention(q, k, v, block_mask=bm, score_mod=alibi(1), config={"REF_MAX": 2}),
               attention_reference(q, k, v, block_mask=bm, score_mod=alibi(1)), max(TOL, 1e-3))  # fmt: skip


@pytest.mark.parametrize("kernel_m, kernel_n", [(32, 16), (16, 64)])
def test_kernel_tiles_inside_the_masks(kernel_m, kernel_n):
    # a mask built at 64 x 64 tiles, the kernel's inside them: each kernel Q tile reads its mask tile's lists,
    # each listed key block runs as 64 / kernel_n of the kernel's. N = 96: the mask's last key block hangs past
    # the keys, and with kernel_n = 16 a part of it lies wholly past them, though 16 divides N
    n = 96
    q, k, v = _qkv(1, 2, 2, n, n, 16, seed=10)
    for mask in (sliding_window(20), document_mask(_docs(n, [30, 41, 25]).to(DEV))):
        bm = block_mask(mask, None, None, n, n, device=DEV, block_m=64, block_n=64)
        for ref in (0, 2):
            got = attention(q, k, v, block_mask=bm, config={"BLOCK_M": kernel_m, "BLOCK_N": kernel_n, "REF_MAX": ref})
            _close(got, attention_reference(q, k, v, block_mask=bm))


@triton.jit
def _stripes(b, h, q_idx, kv_idx, aux, width, a1):
    return (kv_idx // width) % 2 == 0


@pytest.mark.parametrize("loop, ref", [("lists", 0), ("ranges", 2), ("one", 0), ("one", 2)],
                         ids=["lists-online", "ranges-ref_max", "one-online", "one-ref_max"])  # fmt: skip
def test_sparse_loops(loop, ref, monkeypatch):
    # the kernel's walks over a block mask (SPARSE_LOOP): every block through the lists; the full blocks as a
    # range where they are consecutive (every ready-made mask); all visited blocks as one loop where they are
    # consecutive, entered at the first full block. Stripes (key blocks 0 and 2 full, 1 and 3 empty) are
    # neither, and take the lists whatever the setting
    import fusionlab.kernels.attention_mods as M

    monkeypatch.setattr(M, "SPARSE_LOOP", loop)
    n = 200
    q, k, v = _qkv(1, 1, 1, n, n, 16, seed=12)
    stripes = MaskMod(_stripes, lambda b, h, q, kv, aux, w, a1: (kv // w) % 2 == 0, None, 64, None, "stripes")
    for mask, consecutive in ((sliding_window(150), True), (document_mask(_docs(n, [20, 220]).to(DEV)), True),
                              (stripes, False)):  # fmt: skip
        bm = block_mask(mask, None, None, n, n, device=DEV, block_m=64, block_n=64)
        assert bm.contiguous == bm.one_run == consecutive and bm.blocks()[0] > 0, mask.name
        want = {"lists": 1, "ranges": 2, "one": 3}[loop] if consecutive else 1
        assert _mods(q, k, False, None, bm).kwargs["SPARSE"] == want
        got = attention(q, k, v, block_mask=bm, config={"REF_MAX": ref})
        _close(got, attention_reference(q, k, v, block_mask=bm))


@triton.jit
def _gaps(b, h, q_idx, kv_idx, aux, a0, a1):
    return (kv_idx < 64) | ((kv_idx >= 160) & (kv_idx % 2 == 0))


def test_the_default_walk_by_head_dim():
    # SPARSE_LOOP None: the lists at head dim 64 and below, one loop at 128 (the probe's answer), the ranges
    # where one loop cannot run (gaps: the full blocks consecutive, the visited ones not), the lists at 256
    import fusionlab.kernels.attention_mods as M

    assert M.SPARSE_LOOP is None
    n = 260
    window = block_mask(sliding_window(150), None, None, n, n, device=DEV, block_m=64, block_n=64)
    gaps = MaskMod(_gaps, lambda b, h, q, kv, aux, a0, a1: (kv < 64) | ((kv >= 160) & (kv % 2 == 0)), name="gaps")
    gaps = block_mask(gaps, None, None, n, n, device=DEV, block_m=64, block_n=32)
    assert gaps.contiguous and not gaps.one_run
    for d, want_window, want_gaps in ((16, 1, 1), (64, 1, 1), (128, 3, 2), (256, 1, 1)):
        q = torch.empty(1, 1, n, d, device=DEV, dtype=DT)
        assert _mods(q, q, False, None, window).kwargs["SPARSE"] == want_window, d
        assert _mods(q, q, False, None, gaps).kwargs["SPARSE"] == want_gaps, d


def test_heads_side_by_side_layout():
    # q, k, v as (B, N, H, D) transposed, read in place: the modification path addresses tiles as lesson 7 does
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in _qkv(1, 2, 2, 40, 40, 16, seed=11))
    assert not q.is_contiguous()
    bm = block_mask(sliding_window(9), None, None, 40, 40, device=DEV)
    sm = softcap(2.0)
    _close(attention(q, k, v, score_mod=sm, block_mask=bm), attention_reference(q, k, v, score_mod=sm, block_mask=bm))


@triton.jit
def _head_window(b, h, q_idx, kv_idx, aux, a0, a1):
    return (q_idx >= kv_idx) & (q_idx - kv_idx < 4 + 8 * h + 20 * b)


def test_mask_by_batch_and_head_and_rectangular():
    # a mask that differs per batch row and head (B' = B, H' = H) on N_q != N_k: the lists are indexed by both
    m = MaskMod(_head_window, lambda b, h, q, kv, aux, a0, a1: (q >= kv) & (q - kv < 4 + 8 * h + 20 * b),
                name="head_window")  # fmt: skip
    q, k, v = _qkv(2, 3, 3, 37, 50, 16, seed=4)
    bm = block_mask(m, 2, 3, 37, 50, device=DEV)
    assert bm.num.shape[:2] == (2, 3)
    _close(attention(q, k, v, block_mask=bm), attention_reference(q, k, v, block_mask=bm))


@triton.jit
def _future_only(b, h, q_idx, kv_idx, aux, a0, a1):
    return kv_idx > q_idx


def test_empty_row_gives_zero_and_minus_inf():
    m = MaskMod(_future_only, lambda b, h, q, kv, aux, a0, a1: kv > q, name="future_only")
    n = 40
    q, k, v = _qkv(1, 1, 1, n, n, 16, seed=5)
    bm = block_mask(m, None, None, n, n, device=DEV)
    o, lse = attention(q, k, v, block_mask=bm)
    assert torch.isneginf(lse[0, 0, -1]) and torch.all(o[0, 0, -1] == 0)
    _close((o, lse), attention_reference(q, k, v, block_mask=bm))


# the block mask's tiles on each device, both run on any: a GPU builds its lists at MOD_TILE (the H100 run of
# 2026-11-27 caught tests that assumed the interpreter's), and the interpreter runs the kernel's own tiles
# inside the GPU's mask tiles (BM_DIV, BN_DIV > 1) as the GPU does at head dim 128
TILES = {"gpu_tiles": MOD_TILE, "interpreter_tiles": MOD_TILE_INTERPRETER}


def _tiled_mask(mask, n_q, n_k, tiles, device):
    bm = block_mask(mask, None, None, n_q, n_k, device=device, block_m=tiles[0], block_n=tiles[1])
    if tiles == (MOD_TILE if GPU else MOD_TILE_INTERPRETER):  # the default is this device's tiles
        default = block_mask(mask, None, None, n_q, n_k, device=device)
        assert (default.block_m, default.block_n) == tiles and torch.equal(default.idx, bm.idx)
    return bm


@pytest.mark.parametrize("tiles", TILES.values(), ids=TILES.keys())
@pytest.mark.parametrize("mask", ["sliding_window", "document", "prefix_lm"])
def test_block_lists_match_the_mask(mask, tiles):
    # full: every (query < N_q, key) pair of the block visible; partial: some; neither: none. Neither N a
    # multiple of its tile, and enough key blocks that each mask leaves some empty
    n_q, n_k = 4 * tiles[0] + 13, 2 * tiles[1] + 7
    m = MASKS[mask](max(n_q, n_k))
    bm = _tiled_mask(m, n_q, n_k, tiles, "cpu" if m.aux is None else m.aux.device)
    dense = m.ref(torch.tensor(0), torch.tensor(0), torch.arange(n_q).view(-1, 1), torch.arange(n_k).view(1, -1),
                  None if m.aux is None else m.aux.cpu(), m.a0, m.a1)  # fmt: skip
    T_m, T_n = bm.num.shape[2], bm.idx.shape[-1]
    assert (T_m, T_n) == (5, 3)
    for t in range(T_m):
        rows = dense[t * bm.block_m : (t + 1) * bm.block_m]
        want_full, want_part = [], []
        for j in range(T_n):
            blk = rows[:, j * bm.block_n : (j + 1) * bm.block_n]
            whole = blk.all() and (j + 1) * bm.block_n <= n_k
            (want_full if whole else want_part if blk.any() else []).append(j)
        nf, np_ = bm.num[0, 0, t].tolist()
        assert bm.idx[0, 0, t, 0, :nf].tolist() == want_full, f"tile {t}: full blocks"
        assert bm.idx[0, 0, t, 1, :np_].tolist() == want_part, f"tile {t}: partial blocks"
    assert bm.visible == int(dense.sum())
    full, part, total = bm.blocks()
    assert 0 < full + part < total and bm.density() == (full + part) / total


@pytest.mark.parametrize("tiles", TILES.values(), ids=TILES.keys())
def test_empty_blocks_are_never_loaded(tiles):
    # V's key 2 is NaN: a Q tile that loads its block gets NaN (0 * NaN in P V); a tile whose lists
    # leave the block out never reads it and stays finite. N reaches past the window's first two key blocks
    w = 5
    n = 2 * tiles[1] + 2 * tiles[0] + 3
    q, k, v = _qkv(1, 1, 1, n, n, 16, seed=6)
    v[0, 0, 2] = float("nan")
    bm = _tiled_mask(sliding_window(w), n, n, tiles, DEV)
    o, _ = attention(q, k, v, block_mask=bm)
    blk = 2 // bm.block_n
    skipped = 0
    for t in range(bm.num.shape[2]):
        nf, np_ = bm.num[0, 0, t].tolist()
        visits = blk in bm.idx[0, 0, t, 0, :nf].tolist() + bm.idx[0, 0, t, 1, :np_].tolist()
        rows = o[0, 0, t * bm.block_m : (t + 1) * bm.block_m]
        assert bool(torch.isnan(rows).any()) == visits, f"tile {t}: visits={visits}"
        skipped += not visits
    assert skipped >= 2  # tiles past the window's reach, each of which never loads key 2


def test_reference_agrees_with_flex_attention():
    # the semantics of softcap, ALiBi and the sliding window are flex_attention's common examples
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    n, H = 45, 2
    q, k, v = (t.double().cpu() for t in _qkv(1, H, H, n, n, 16, seed=7))

    def flex_alibi(s, b, h, qi, ki):
        return s + torch.exp2(-8.0 * (h + 1) / H) * (ki - qi)

    def flex_sw(b, h, qi, ki):
        return (qi >= ki) & (qi - ki < 7)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fbm = create_block_mask(flex_sw, None, None, n, n, device="cpu")
        for ours, theirs in [(softcap(2.0), lambda s, b, h, qi, ki: 2.0 * torch.tanh(s / 2.0)), (alibi(H), flex_alibi)]:
            want, want_lse = flex_attention(q, k, v, score_mod=theirs, block_mask=fbm, return_lse=True)
            got, got_lse = attention_reference(q, k, v, score_mod=ours, block_mask=sliding_window(7))
            assert (got - want).abs().max() < 1e-10 and (got_lse.double() - want_lse).abs().max() < 1e-5


@triton.jit
def _not_a_score(score, b, h, q_idx, kv_idx, aux, a0, a1):
    return score + tl.no_such_function(score)


def test_errors():
    q, k, v = _qkv(1, 2, 2, 20, 20, 16)
    with pytest.raises(KernelInputError, match="decorate it with @triton.jit"):
        attention(q, k, v, score_mod=lambda s, *a: s)
    with pytest.raises(KernelInputError, match="_not_a_score.*did not compile"):
        attention(q, k, v, score_mod=_not_a_score)
    with pytest.raises(KernelInputError, match="did not compile"):
        attention(q, k, v, score_mod=ScoreMod(_head_window, name="a mask as a score_mod"))  # wrong arity
    bm = block_mask(causal_mask(), None, None, 20, 20, device=DEV)
    with pytest.raises(KernelInputError, match="put causality in the mask"):
        attention(q, k, v, True, block_mask=bm)
    with pytest.raises(KernelInputError, match="built for"):
        attention(q[:, :, :10], k, v, block_mask=bm)
    with pytest.raises(KernelInputError, match="forward only"):
        attention(q.requires_grad_(), k, v, score_mod=softcap(5.0))
    for name, size in (("BLOCK_N", bm.block_n), ("BLOCK_M", bm.block_m)):
        with pytest.raises(KernelInputError, match=f"config {name}=.* does not divide"):
            attention(q.detach(), k, v, block_mask=bm, config={name: 2 * size})
    with pytest.raises(KernelInputError, match="reads a tensor on meta"):
        attention(q.detach(), k, v, score_mod=relative_bias(torch.zeros(2, 3, device="meta")))
    with pytest.raises(KernelInputError, match="MaskMod"):
        block_mask(lambda b, h, qi, ki: qi >= ki, None, None, 20, 20)
    with pytest.raises(KernelInputError, match="window of at least 1"):
        sliding_window(0)
    with pytest.raises(KernelInputError, match="positive cap"):
        softcap(-1.0)


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("case", ["softcap", "alibi", "sliding_window", "document", "causal_mask"])
def test_gpu_bf16(case, D):
    n = 1000  # not a multiple of 128 or 64
    q, k, v = _qkv(2, 4, 2, n, n, D, seed=8)
    sm = {"softcap": softcap(20.0), "alibi": alibi(4)}.get(case)
    mask = {"sliding_window": sliding_window(100), "document": document_mask(_docs(n, [300, 500, 200]).to(DEV)),
            "causal_mask": causal_mask()}.get(case)  # fmt: skip
    bm = None if mask is None else block_mask(mask, None, None, n, n)
    for variant in ("plain", "tma") if torch.cuda.get_device_capability() >= (9, 0) else ("plain",):
        _close(attention(q, k, v, score_mod=sm, block_mask=bm, variant=variant),
               attention_reference(q, k, v, score_mod=sm, block_mask=bm))  # fmt: skip
