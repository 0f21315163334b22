"""Lesson 7's FlashAttention forward: O and the natural-log lse against float64, every output written in
one launch, both load paths (pointers; TMA descriptors, which the interpreter also runs), causal
top-left as SDPA, grouped-query heads, strided layouts, clear errors. GPU-only cases (marked ``gpu``)
run the big shapes, B x H = 512, every head dim in bf16 and fp16, and N = 131072 in under 1 GiB."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import gpu_only

from fusionlab import runtime
from fusionlab.grading import Sandbox
from fusionlab.kernels import KernelInputError
from fusionlab.kernels.attention import (
    LONG,
    TMA_MIN_FLOPS,
    TMA_TABLE,
    _config,
    attention,
    attention_bytes,
    attention_config,
    attention_eager,
    attention_flops,
    attention_ledger,
    attention_reference,
)

pytestmark = pytest.mark.lesson7

GPU = runtime.is_gpu()
HOPPER = GPU and torch.cuda.get_device_capability() >= (9, 0)
DEV = runtime.DEVICE

# (dtype, norm-relative tolerance on O, absolute tolerance on lse). fp32 exists only in the
# interpreter (full fp32 there); fp16/bf16 round P to the input dtype before P V (~2e-3 / 1e-2
# relative), the brief's bar is 1e-2.
DTYPES = [
    pytest.param(
        torch.float32, 1e-5, 1e-5, id="fp32", marks=pytest.mark.skipif(GPU, reason="the GPU kernel takes fp16/bf16")
    ),
    pytest.param(torch.float16, 1e-2, 2e-3, id="fp16"),
    pytest.param(
        torch.bfloat16,
        1e-2,
        2e-2,
        id="bf16",
        marks=pytest.mark.skipif(torch.bfloat16 not in runtime.DTYPES, reason=f"no bf16 in {runtime.MODE} mode"),
    ),
]
VARIANTS = ["plain", pytest.param("tma", marks=pytest.mark.skipif(GPU and not HOPPER, reason="TMA needs Hopper"))]

# (B, H_q, H_kv, N_q, N_k, D), each with the code path it reaches (interpreter tiles are 32 x 16)
SHAPES = [
    (1, 1, 1, 1, 1, 32),  # one query, one key: one row of one tile, every mask almost all off
    (1, 2, 2, 17, 17, 64),  # N = 17: one past a key block; causal: the partial block is also the diagonal
    (2, 2, 1, 33, 33, 80),  # D = 80 padded to 128 (masked / zero-filled columns); GQA 2:1; Q tile 2 of 2
    (1, 2, 1, 70, 37, 96),  # N_q > N_k: causal rows past N_k see every key; D = 96 padded
    (1, 4, 2, 37, 70, 128),  # N_q < N_k; GQA 2:1; several unmasked key blocks before the diagonal
    (1, 1, 1, 64, 64, 32),  # blocks divide N exactly: no partial block, causal masks only the diagonal
]


def _qkv(B, H, H_kv, N_q, N_k, D, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, N_q, D, generator=g)
    k = torch.randn(B, H_kv, N_k, D, generator=g)
    v = torch.randn(B, H_kv, N_k, D, generator=g)
    return q.to(DEV, dtype), k.to(DEV, dtype), v.to(DEV, dtype)


def rel_err(y, ref) -> float:
    y, ref = y.double(), ref.double()
    return ((y - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def assert_attention(o, lse, ref_o, ref_lse, tol, lse_tol):
    assert o.shape == ref_o.shape and o.dtype == ref_o.dtype and lse.dtype == torch.float32
    assert lse.shape == ref_lse.shape
    assert not torch.isnan(o).any(), f"{int(torch.isnan(o).sum())} elements of O NaN (never written?)"
    assert not torch.isnan(lse).any(), f"{int(torch.isnan(lse).sum())} lse entries NaN (never written?)"
    err = rel_err(o, ref_o)
    assert err < tol, f"relative error of O {err:.2e} >= {tol:.0e}"
    lse_err = (lse.double() - ref_lse.double()).abs().max().item()
    assert lse_err < lse_tol, f"lse off by {lse_err:.2e}"


def _run(*args, **kw):
    with Sandbox() as box:
        out = attention(*args, **kw)
    assert box.writes_past_the_end() is None, "a store landed past the end of an output"
    return out, box


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype,tol,lse_tol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64_in_one_launch(shape, dtype, tol, lse_tol, causal, variant):
    q, k, v = _qkv(*shape, dtype)
    (o, lse), box = _run(q, k, v, causal=causal, variant=variant)
    assert_attention(o, lse, *attention_reference(q, k, v, causal), tol, lse_tol)
    assert box.names == ["_attention_kernel"]
    assert box.torch_ops == [] and box.passes == [], "the work must happen in the Triton kernel"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "shape",
    [(1, 2, 1, 64, 64, 80), (2, 2, 2, 48, 32, 64), (1, 2, 2, 40, 48, 32)],
    ids=["even-D80", "even-Nq>Nk", "partial-Q-tile"],
)
def test_even_keys_and_descriptor_store(shape, variant):
    # BLOCK_N divides N_k: the masked blocks carry only the causal mask (EVEN_N). TMA_STORE writes O
    # through a descriptor where BLOCK_M divides N_q (and falls back to masked stores where not);
    # D = 80: the store is clipped at the descriptor's 80 columns
    q, k, v = _qkv(*shape, torch.float16, seed=12)
    for causal in (False, True):
        (o, lse), _ = _run(q, k, v, causal=causal, variant=variant, config={"TMA_STORE": True})
        assert_attention(o, lse, *attention_reference(q, k, v, causal), 1e-2, 2e-3)


# -- scores that climb along the keys ------------------------------------------------------------
LOG2E = 1.4426950408889634
FIXED_TILE = {"BLOCK_M": 32, "BLOCK_N": 16}  # fixed, so the blocks a row's max climbs over are known


def _rising_qkv(B, H, H_kv, N_q, N_k, D, dtype, seed=0):
    """q, k, v whose scores climb along the keys at a rate set per row (base-2 units per key).

    Key j carries ``j / 8`` along the first dimension and query row i a component that turns it into
    ``rate_i * j`` (plus unit-variance noise from the other dimensions, ~1.4 in these units). Head 0
    mixes rows in every Q tile: fast (+1 per key: 16 per key block), slow (+0.2), flat and falling
    (their max never moves after the first block). Other heads: slow rows only (+0.15 to +0.3, 2.4
    to 4.8 per block)."""
    g = torch.Generator().manual_seed(seed)
    scale = 1.0 / math.sqrt(D)
    q = torch.randn(B, H, N_q, D, generator=g)
    k = torch.randn(B, H_kv, N_k, D, generator=g)
    v = torch.randn(B, H_kv, N_k, D, generator=g)
    step = 0.125
    k[..., 0] = torch.arange(N_k) * step
    rows = torch.arange(N_q)
    rates = torch.empty(H, N_q)
    rates[0] = torch.tensor([1.0, 0.2, 0.0, -0.5])[rows % 4]
    rates[1:] = 0.15 + 0.15 * ((rows * 7) % 5) / 4
    q[..., 0] = rates / (step * scale * LOG2E)
    return q.to(DEV, dtype), k.to(DEV, dtype), v.to(DEV, dtype)


# (B, H_q, H_kv, N_q, N_k, D), each with the code path it adds (tiles 32 x 16)
RISING_SHAPES = [
    (1, 2, 1, 70, 100, 32),  # N_q < N_k, neither a block multiple; GQA 2:1; a partial last Q tile
    (1, 2, 2, 100, 45, 64),  # N_q > N_k: causal rows past N_k see every key, the partial block last
    (1, 2, 1, 64, 112, 32),  # blocks divide N (EVEN_N): causal masks only the diagonal
    (2, 3, 3, 37, 37, 80),  # D = 80 padded; B = 2; causal N not a block multiple
]


# -- REF_MAX: every block against block 0's row max, no running max ------------------------------
#: REF_MAX's two ways to sum P: a tile reduced once (1), a row sum a block (2)
REF_SUMS = pytest.mark.parametrize("ref", [1, 2], ids=["tile_sum", "row_sum"])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype,tol,lse_tol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@REF_SUMS
def test_ref_max_on_every_shape(ref, shape, dtype, tol, lse_tol, causal, variant):
    # block 0 under the general mask (diagonal, partial, or a whole row of keys), then both loops
    q, k, v = _qkv(*shape, dtype, seed=15)
    cfg = {"REF_MAX": ref}
    (o, lse), box = _run(q, k, v, causal=causal, variant=variant, config=cfg)
    assert_attention(o, lse, *attention_reference(q, k, v, causal), tol, lse_tol)
    assert box.names == ["_attention_kernel"]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype,tol,lse_tol", DTYPES)
@pytest.mark.parametrize("shape", RISING_SHAPES, ids=lambda s: "x".join(map(str, s)))
@REF_SUMS
def test_ref_max_with_rising_scores(ref, shape, dtype, tol, lse_tol, causal, variant):
    # scores that climb to ~80 above block 0's: p = exp(s - m_ref) reaches 2**115. In fp32 that is
    # still exact (the fixed reference holds); a 16-bit P overflows, and the tile must fall back to
    # the online loop: a tile that kept its overflowed sums is inf or NaN in those rows
    q, k, v = _rising_qkv(*shape, dtype, seed=sum(shape))
    ref_o, ref_lse = attention_reference(q, k, v, causal)
    lse_tol = lse_tol + 2e-7 * ref_lse.abs().max().item()
    cfg = {**FIXED_TILE, "REF_MAX": ref}
    (o, lse), box = _run(q, k, v, causal=causal, variant=variant, config=cfg)
    assert_attention(o, lse, ref_o, ref_lse, tol, lse_tol)
    assert box.names == ["_attention_kernel"]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@REF_SUMS
def test_ref_max_falls_back_past_fp32(ref, variant, causal):
    # one key scores ~226 above the rest: exp(226) is inf even in fp32, so p = inf for the rows that
    # see it; softmax there is one-hot on that key, O its V row, lse its score
    D = 32
    q = torch.ones(1, 2, 50, D, device=DEV, dtype=runtime.HALF)
    k = (0.1 * torch.randn(1, 2, 50, D, device=DEV)).to(runtime.HALF)
    k[:, :, 40] = 40.0
    v = torch.randn(1, 2, 50, D, device=DEV, dtype=runtime.HALF)
    cfg = {**FIXED_TILE, "REF_MAX": ref}
    (o, lse), _ = _run(q, k, v, causal=causal, variant=variant, config=cfg)
    ref_o, ref_lse = attention_reference(q, k, v, causal)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    assert_attention(o, lse, ref_o, ref_lse, 1e-2, 2e-7 * ref_lse.abs().max().item() + 1e-3)


def test_lse_is_natural_log_and_o_the_mean():
    # q = 0: every score is 0, so softmax is uniform: lse = ln(N_k) exactly (log2 would give 4.39 for
    # N_k = 21) and O is the mean of V's rows
    n_k = 21
    q = torch.zeros(1, 2, 5, 64, device=DEV, dtype=runtime.HALF)
    k = torch.randn(1, 2, n_k, 64, device=DEV, dtype=runtime.HALF)
    v = torch.randn(1, 2, n_k, 64, device=DEV, dtype=runtime.HALF)
    o, lse = attention(q, k, v)
    torch.testing.assert_close(lse, torch.full_like(lse, math.log(n_k)), atol=1e-5, rtol=1e-6)
    mean = v.double().mean(dim=2, keepdim=True).expand(1, 2, 5, 64)
    assert rel_err(o, mean) < 1e-2
    # causal: row i averages keys 0..i, lse = ln(i + 1)
    o, lse = attention(q, k, v, causal=True)
    torch.testing.assert_close(lse[0, 0], torch.log(torch.arange(1.0, 6.0, device=DEV)), atol=1e-5, rtol=1e-6)
    assert rel_err(o[0, 0, 2], v[0, 0, :3].double().mean(0)) < 1e-2


@pytest.mark.parametrize("n_q,n_k", [(40, 40), (40, 23), (23, 40), (1, 17)])
def test_causal_is_top_left_as_sdpa(n_q, n_k):
    # query i sees keys j <= i, whatever N_q and N_k: the convention of
    # F.scaled_dot_product_attention(is_causal=True)
    q, k, v = _qkv(1, 2, 2, n_q, n_k, 32, torch.float16, seed=4)
    o, _ = attention(q, k, v, causal=True)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert rel_err(o, ref) < 1e-2


def test_grouped_query_heads_read_their_kv_head():
    # 4 query heads on 2 kv heads: heads 0, 1 read kv head 0; heads 2, 3 read kv head 1
    q, k, v = _qkv(2, 4, 2, 33, 29, 64, torch.float16, seed=5)
    o, lse = attention(q, k, v)
    o_rep, lse_rep = attention(q, k.repeat_interleave(2, 1).contiguous(), v.repeat_interleave(2, 1).contiguous())
    torch.testing.assert_close(o, o_rep, atol=0, rtol=0)
    torch.testing.assert_close(lse, lse_rep, atol=0, rtol=0)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), enable_gqa=True)
    assert rel_err(o, ref) < 1e-2


def _strided_layouts(D):
    """(name, q, k, v) views that are not contiguous (B, H, N, D) tensors, all read in place."""
    g = torch.Generator().manual_seed(6)
    B, H, N = 2, 3, 37
    bnhd = torch.randn(B, N, H, D, generator=g).to(DEV, torch.float16)
    qkv = torch.randn(B, N, 3, H, D, generator=g).to(DEV, torch.float16)  # a fused QKV projection's output
    wide = torch.randn(B, H, 2 * N, D, generator=g).to(DEV, torch.float16)
    return [
        ("(B, N, H, D) transposed", bnhd.transpose(1, 2), bnhd.transpose(1, 2), bnhd.transpose(1, 2)),
        ("packed qkv", *(qkv[:, :, i].transpose(1, 2) for i in range(3))),
        ("every other token", wide[:, :, ::2], wide[:, :, 1::2], wide[:, :, ::2]),
    ]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("D", [64, 80])
@pytest.mark.parametrize("which", [0, 1, 2], ids=["bnhd", "qkv", "every_other"])
def test_strided_inputs_read_in_place(which, D, variant):
    name, q, k, v = _strided_layouts(D)[which]
    assert not q.is_contiguous()
    if variant == "tma" and D == 80 and which in (0, 1):
        # heads side by side in a row and a padded head dim: the padding would read the next head
        with pytest.raises(KernelInputError, match="variant='tma'"):
            attention(q, k, v, variant="tma")
        variant = None  # the default path falls back to pointers
    for causal in (False, True):
        (o, lse), box = _run(q, k, v, causal=causal, variant=variant)
        assert_attention(o, lse, *attention_reference(q, k, v, causal), 1e-2, 2e-3)
        assert box.passes == [], f"{name}: no copy of a strided input"


@pytest.mark.parametrize("variant", [None, "tma"])
def test_misaligned_base(variant):
    # a view starting one element into a buffer: no 16-byte aligned base for a descriptor. The
    # default path falls back to pointers; forcing the descriptors is refused
    buf = torch.randn(1 + 3 * 2 * 24 * 32, device=DEV).to(torch.float16)
    q, k, v = buf[1:].view(3, 1, 2, 24, 32).unbind(0)
    if variant == "tma":
        with pytest.raises(KernelInputError, match="16-byte|Hopper"):
            attention(q, k, v, variant=variant)
    else:
        o, lse = attention(q, k, v, causal=True)
        assert_attention(o, lse, *attention_reference(q, k, v, True), 1e-2, 2e-3)


def test_inputs_unchanged():
    q, k, v = _qkv(1, 2, 1, 40, 50, 64, torch.float16, seed=7)
    before = [t.clone() for t in (q, k, v)]
    attention(q, k, v, causal=True)
    for t, b in zip((q, k, v), before, strict=True):
        assert torch.equal(t, b)


@pytest.mark.parametrize("scale", [0.3, -0.2, 0.0])
def test_scale_of_any_sign(scale):
    # the unmasked loop takes the row max from the unscaled scores: for a negative scale that is
    # the min; scale 0 gives the mean of V
    q, k, v = _qkv(1, 2, 2, 40, 40, 32, torch.float16, seed=8)
    for causal in (False, True):
        o, lse = attention(q, k, v, causal=causal, scale=scale)
        assert_attention(o, lse, *attention_reference(q, k, v, causal, scale), 1e-2, 2e-3)


@pytest.mark.parametrize("shape", [(0, 2, 2, 5, 5, 32), (1, 2, 2, 0, 5, 32)], ids=["B=0", "N_q=0"])
def test_empty(shape):
    q, k, v = _qkv(*shape, torch.float16)
    o, lse = attention(q, k, v)
    assert o.shape == q.shape and lse.shape == q.shape[:3]


def test_no_keys_gives_zero_and_minus_inf():
    # N_k = 0: a softmax over nothing; SDPA's math path returns zeros, and log(0) = -inf
    q, k, v = _qkv(1, 2, 2, 6, 0, 32, torch.float16)
    o, lse = attention(q, k, v, causal=True)
    assert torch.equal(o, torch.zeros_like(o))
    assert torch.equal(lse, torch.full_like(lse, float("-inf")))
    torch.testing.assert_close(o.float(), F.scaled_dot_product_attention(q.float(), k.float(), v.float()))


NUMPY_NAN_WARNINGS = [  # the interpreter's numpy meets the NaN and inf on purpose
    pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]


#: the online loop and the fixed reference (its fallback runs on such inputs)
MODES = {
    "eager": {},
    "ref": {"REF_MAX": 1},
    "ref_rows": {"REF_MAX": 2},
}


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("variant", VARIANTS)
@NUMPY_NAN_WARNINGS[0]
@NUMPY_NAN_WARNINGS[1]
def test_non_finite_inputs(variant, mode):
    # REF_MAX: a NaN row fails the overflow check and sends its tile through the online loop, which
    # must keep the NaN in that row and out of the tile's others
    q, k, v = _qkv(1, 2, 2, 40, 40, 32, torch.float16, seed=9)
    q[0, 0, 3] = float("nan")  # one query row: only that row is NaN
    k[0, 1, 20] = float("nan")  # one key: causal rows < 20 never see it (masked or never loaded)
    for causal in (False, True):
        o, lse = attention(q, k, v, causal=causal, variant=variant, config=MODES[mode])
        ref_o, ref_lse = attention_reference(q, k, v, causal)
        assert torch.equal(torch.isnan(o), torch.isnan(ref_o))
        fin = ~torch.isnan(ref_o)
        assert rel_err(o[fin], ref_o[fin]) < 1e-2
        assert torch.equal(torch.isnan(lse), torch.isnan(ref_lse))


def infinite_scores(dtype=torch.float16):
    """Rows of every kind of infinite score, one head each (also used by the backward's tests): head 0's
    even rows see only -inf (an inf in Q against keys all of the other sign): lse -inf; head 1's rows
    with q[:, 7] > 0 meet a +inf (an inf in K): lse +inf, the others a -inf among finite scores; head 2's
    row 12 sees only +inf, its row 10 an inf and a NaN: lse NaN."""
    q, k, v = _qkv(1, 3, 3, 40, 40, 32, dtype, seed=4)
    q[0, 0, ::2, 3] = float("inf")
    k[0, 0, :, 3] = -k[0, 0, :, 3].abs() - 0.5
    k[0, 1, 5, 7] = float("inf")
    k[0, 2, :, 0] = k[0, 2, :, 0].abs() + 0.5
    q[0, 2, 12, 0] = float("inf")
    q[0, 2, 10, 0], q[0, 2, 10, 1] = float("inf"), float("nan")
    return q, k, v


def assert_same_values(got, want, what):
    """NaN, +inf and -inf exactly where ``want`` has them; the finite values close."""
    for cls in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(cls(got), cls(want)), f"{what}: {cls.__name__} at {(cls(got) != cls(want)).nonzero()[:4]}"
    fin = want.isfinite()
    assert rel_err(got[fin], want[fin]) < 1e-2, what


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("variant", VARIANTS)
@NUMPY_NAN_WARNINGS[0]
@NUMPY_NAN_WARNINGS[1]
@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")
def test_infinite_scores_give_float64s_lse(variant, mode):
    # a row max of -inf or +inf would make exp2(s - m) NaN: the online loop (REF_MAX's fallback too)
    # subtracts 0 there, so lse is float64's -inf, +inf (or NaN where a score is NaN), never a NaN of its own
    q, k, v = infinite_scores()
    for causal in (False, True):
        o, lse = attention(q, k, v, causal=causal, variant=variant, config=MODES[mode])
        ref_o, ref_lse = attention_reference(q, k, v, causal)
        assert ref_lse.isneginf().any() and ref_lse.isposinf().any() and ref_lse.isnan().any()  # every kind met
        assert_same_values(lse, ref_lse, f"lse, causal={causal}")
        assert_same_values(o, ref_o, f"O, causal={causal}")


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("variant", VARIANTS)
@NUMPY_NAN_WARNINGS[1]
def test_keys_past_the_end_are_masked_and_zeroed(variant, mode):
    # N_k = 20: the last key tile hangs over. On the TMA path it reads the next head's rows; an inf
    # in those K or V rows must not reach this head (masked to -inf; V zeroed, since 0 * inf = NaN)
    base_k = torch.randn(1, 2, 20, 32, device=DEV, dtype=torch.float16)
    base_v = torch.randn(1, 2, 20, 32, device=DEV, dtype=torch.float16)
    q = torch.randn(1, 2, 8, 32, device=DEV, dtype=torch.float16)
    k, v = base_k.clone(), base_v.clone()
    k[0, 1, :4] = float("inf")
    v[0, 1, :4] = float("inf")
    o, lse = attention(q, k, v, variant=variant, config=MODES[mode])
    ref_o, ref_lse = attention_reference(q[:, :1], base_k[:, :1], base_v[:, :1])
    assert torch.isfinite(o[:, 0]).all() and torch.isfinite(lse[:, 0]).all()
    assert rel_err(o[:, :1], ref_o) < 1e-2


def test_eager_materialises_the_scores_and_agrees():
    q, k, v = _qkv(1, 4, 2, 30, 30, 32, torch.float32 if not GPU else torch.float16, seed=10)
    q, k, v = q.float(), k.float(), v.float()  # eager in fp32 on either device
    for causal in (False, True):
        ref, _ = attention_reference(q, k, v, causal)
        assert rel_err(attention_eager(q, k, v, causal), ref) < 1e-5


# -- counting -------------------------------------------------------------------------------------
def test_flops():
    assert attention_flops(2, 3, 5, 7, 16) == 4 * 2 * 3 * 5 * 7 * 16
    assert attention_flops(1, 1, 1024, 1024, 64, causal=True) == 2 * 1024 * 1024 * 64  # half, by convention
    # N_q != N_k: the (query, key) pairs the top-left mask keeps: rows 0..3 see 1..4 keys, rows 4..5 see 4
    assert attention_flops(1, 1, 6, 4, 8, causal=True) == 4 * (1 + 2 + 3 + 4 + 4 + 4) * 8
    assert attention_flops(1, 1, 3, 5, 8, causal=True) == 4 * (1 + 2 + 3) * 8


def test_ledger_eager_and_tiled():
    B, H, N, D = 2, 4, 1000, 64
    led = attention_ledger(B, H, N, N, D, torch.bfloat16)
    q = B * H * N * D
    s = B * H * N * N
    # eager: QK^T (Q, K -> S), scale (S -> S), softmax (S -> P), PV (P, V -> O)
    assert led.unfused_bytes == 2 * (2 * q + s + 2 * s + 2 * s + s + q + q)
    assert led.kernels_unfused == 4
    # ideal fused: Q, K, V read once, O written once (bf16), lse once (fp32)
    assert led.fused_bytes == 2 * 4 * q + 4 * B * H * N == attention_bytes(B, H, N, N, D)
    # tiled: K and V re-read once per Q tile: ceil(1000 / 128) = 8 tiles
    tiled = attention_ledger(B, H, N, N, D, torch.bfloat16, block_m=128)
    assert tiled.fused_bytes == 2 * (2 * q + 2 * 8 * q) + 4 * B * H * N
    # causal: tile i reads keys up to min(128 (i + 1), N): 128 + 256 + ... + 896 + 1000 = 4584 per row
    causal = attention_ledger(B, H, N, N, D, torch.bfloat16, causal=True, block_m=128)
    kv = B * H * 4584 * D
    assert causal.fused_bytes == 2 * (2 * q + 2 * kv) + 4 * B * H * N
    assert causal.kernels_unfused == 5  # the mask is its own kernel, reading the boolean buffer
    # grouped-query: eager repeats K and V; the ideal fused kernel reads the kv heads once
    gqa = attention_ledger(B, H, N, N, D, torch.bfloat16, h_kv=1)
    assert gqa.kernels_unfused == 5
    assert gqa.fused_bytes == attention_bytes(B, H, N, N, D, h_kv=1)


def test_config():
    cfg = attention_config(1, 16, 4096, 4096, 80, torch.float16, causal=True)
    assert cfg["BLOCK_D"] == 128 and cfg["BLOCK_M"] % cfg["BLOCK_N"] == 0
    tiny = attention_config(1, 1, 5, 3, 32, torch.float16)
    assert tiny["BLOCK_M"] == 16 and tiny["BLOCK_N"] == 16
    # REF_MAX from the Hopper table on the TMA path; the interpreter and the pointer path run the online loop
    assert cfg["REF_MAX"] == (TMA_TABLE[(128, True, True)][5] if cfg["variant"] == "tma" else 0)


def test_small_calls_take_the_pointer_path_on_hopper(monkeypatch):
    # the descriptors cost the host ~40 us a call: below TMA_MIN_FLOPS the pointer path is cheaper per call
    import fusionlab.kernels.attention as A

    monkeypatch.setattr(A, "_hopper", lambda: True)
    monkeypatch.setattr(A, "TensorDescriptor", object)  # any non-None: "descriptors available"
    small = dict(B=2, H=16, N_q=1024, N_k=1024, D=128)  # 8.6 GFLOP causal: a kernel shorter than the host work
    big = dict(B=16, H=16, N_q=1024, N_k=1024, D=64)  # 34 GFLOP causal: lesson 7's smallest timing shape
    assert attention_flops(**small, causal=True) < TMA_MIN_FLOPS <= attention_flops(**big, causal=True)
    assert attention_config(**small, causal=True)["variant"] == "plain"
    assert attention_config(**big, causal=True)["variant"] == "tma"
    assert attention_config(**small, causal=True, tma=True)["variant"] == "tma"


@pytest.mark.parametrize("key", sorted(TMA_TABLE), ids=str)
def test_config_follows_tables(key):
    d_class, causal, long = key
    n = 2 * LONG if long else LONG
    bm, bn, nw, ns, store, ref = TMA_TABLE[key]
    cfg = _config(n, n, d_class, causal, True, True)  # what a Hopper GPU picks, checked on any machine
    assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"], cfg["num_stages"]) == (bm, bn, nw, ns)
    assert (cfg["TMA_STORE"], cfg["REF_MAX"]) == (store, ref) and ref in (0, 1, 2)
    assert _config(n, n, d_class, causal, False, True)["REF_MAX"] == 0  # the pointer path: not measured
    assert _config(n, n, d_class, causal, False, False)["REF_MAX"] == 0  # the interpreter


# -- errors ---------------------------------------------------------------------------------------
def _bad_inputs():
    half = torch.float16
    T = lambda *s, dt=half: torch.randn(*s, device=DEV).to(dt)  # noqa: E731  (fresh tensors per case)
    ok = lambda: (T(1, 2, 8, 32), T(1, 2, 8, 32), T(1, 2, 8, 32))  # noqa: E731
    cases = [
        (
            "mixed dtypes",
            lambda: (T(1, 2, 8, 32), T(1, 2, 8, 32, dt=torch.float32), T(1, 2, 8, 32)),
            {},
            "dtype|float32",
        ),
        ("int", lambda: tuple(t.int() for t in ok()), {}, "dtype"),
        ("3-D", lambda: (T(2, 8, 32), T(2, 8, 32), T(2, 8, 32)), {}, "dimension"),
        ("k, v differ", lambda: (T(1, 2, 8, 32), T(1, 2, 8, 32), T(1, 2, 9, 32)), {}, "same shape"),
        ("head dims differ", lambda: (T(1, 2, 8, 32), T(1, 2, 8, 64), T(1, 2, 8, 64)), {}, "head dim"),
        ("heads not a multiple", lambda: (T(1, 3, 8, 32), T(1, 2, 8, 32), T(1, 2, 8, 32)), {}, "multiple"),
        ("head dim 512", lambda: (T(1, 1, 2, 512), T(1, 1, 2, 512), T(1, 1, 2, 512)), {}, "256"),
        ("no unit stride", lambda: (T(1, 2, 8, 64)[..., ::2], T(1, 2, 8, 32), T(1, 2, 8, 32)), {}, "stride"),
        ("broadcast along N", lambda: (T(1, 2, 1, 32).expand(1, 2, 8, 32), *ok()[1:]), {}, "broadcast"),
        ("negated view", lambda: (torch._neg_view(T(1, 2, 8, 32)), *ok()[1:]), {}, "negated"),
        ("bad scale", ok, {"scale": float("nan")}, "scale"),
        ("bad causal", ok, {"causal": "yes"}, "causal"),
        ("bad variant", ok, {"variant": "fast"}, "variant"),
        ("bad config key", ok, {"config": {"BLOCK_X": 16}}, "config"),
        ("tiny block", ok, {"config": {"BLOCK_N": 8}}, "16"),
        ("causal block ratio", ok, {"causal": True, "config": {"BLOCK_M": 16, "BLOCK_N": 32}}, "multiple"),
        ("ref max out of range", ok, {"config": {"REF_MAX": 3}}, "REF_MAX"),
        ("ref max not a number", ok, {"config": {"REF_MAX": "rows"}}, "REF_MAX"),
    ]
    if GPU:
        cases.append(("fp32 on GPU", lambda: tuple(t.float() for t in ok()), {}, "float32"))
        cases.append(("on the CPU", lambda: tuple(t.cpu() for t in ok()), {}, "cpu"))
    if GPU and not HOPPER:
        cases.append(("tma unavailable", ok, {"variant": "tma"}, "Hopper"))
    return cases


@pytest.mark.parametrize("make,kw,match", [c[1:] for c in _bad_inputs()], ids=[c[0] for c in _bad_inputs()])
def test_bad_inputs_raise(make, kw, match):
    q, k, v = make()
    with pytest.raises(KernelInputError, match=match):
        attention(q, k, v, **kw)


@pytest.mark.skipif(torch.bfloat16 in runtime.DTYPES, reason="only the interpreter lacks bf16")
def test_bf16_refused_in_interpreter():
    q = torch.randn(1, 1, 4, 32).bfloat16()
    with pytest.raises(KernelInputError, match="bfloat16"):
        attention(q, q, q)


# -- GPU: the sizes of the brief ------------------------------------------------------------------
def _gpu_cases():
    """(N, D, dtype, variant): every head dim at the brief's lengths in bf16 on the default path; fp16
    and the short lengths (their own, shrunk tiles) at D = 64 and 128; the pointer path at three
    head dims. Chosen so the GPU compiles ~40 kernels, not every product of the axes."""
    cases = [(n, d, torch.bfloat16, None) for n in (1000, 1025, 4097) for d in (32, 64, 80, 96, 128, 256)]
    cases += [(n, d, torch.float16, None) for n in (1, 17, 1025) for d in (64, 128)]
    cases += [(n, d, torch.bfloat16, None) for n in (1, 17) for d in (64, 128)]
    cases += [(1025, d, torch.bfloat16, "plain") for d in (64, 80, 128)]
    return [
        pytest.param(n, d, dt, var, id=f"N{n}-D{d}-{str(dt)[6:]}" + (f"-{var}" if var else ""))
        for n, d, dt, var in cases
    ]


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("N,D,dtype,variant", _gpu_cases())
def test_gpu_sizes_against_float64(N, D, dtype, variant, causal):
    # B x H = 2 (one kv head for two query heads); N = 1000, 1025, 4097: partial Q and key tiles of
    # every GPU tile; the causal diagonal not on a block boundary
    q, k, v = _qkv(1, 2, 1, N, N, D, dtype, seed=N + D)
    (o, lse), box = _run(q, k, v, causal=causal, variant=variant)
    assert_attention(o, lse, *attention_reference(q, k, v, causal), 1e-2, 2e-2)
    assert box.names == ["_attention_kernel"]


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("store", [False, True], ids=["ptr-store", "tma-store"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 80, 128])
@pytest.mark.parametrize("N", [1024, 4096])
def test_gpu_block_multiples(N, D, causal, store):
    # N a multiple of every tile: no partial block (EVEN_N), whole Q tiles (the descriptor store)
    q, k, v = _qkv(2, 2, 1, N, N, D, torch.bfloat16, seed=13)
    (o, lse), _ = _run(q, k, v, causal=causal, config={"TMA_STORE": store})
    assert_attention(o, lse, *attention_reference(q, k, v, causal), 1e-2, 2e-2)


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1000, 1000, 128), (8, 64, 16, 300, 257, 64)], ids=["BH=1", "BH=512"])
def test_gpu_many_and_one_program_rows(shape, causal):
    q, k, v = _qkv(*shape, torch.bfloat16, seed=11)
    o, lse = attention(q, k, v, causal=causal)
    assert_attention(o, lse, *attention_reference(q, k, v, causal), 1e-2, 2e-2)
    sd = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    assert rel_err(o, sd) < 1e-2


@gpu_only
@pytest.mark.gpu
def test_gpu_n131072_in_under_1gib_extra():
    B, H, N, D = 1, 16, 131072, 128
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    o, lse = attention(q, k, v, causal=True)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    assert extra < 2**30, f"{extra / 2**30:.2f} GiB extra"
    # the last 64 queries see every key (causal, bottom rows): check them in float64
    rows = slice(N - 64, N)
    s = (q[0, :, rows].double() @ k[0].double().transpose(-2, -1)) / math.sqrt(D)  # (H, 64, N)
    keep = torch.arange(N, device="cuda")[None, :] <= torch.arange(N - 64, N, device="cuda")[:, None]
    s = s.masked_fill(~keep, float("-inf"))
    ref = torch.softmax(s, -1) @ v[0].double()
    assert rel_err(o[0, :, rows], ref) < 1e-2
    torch.testing.assert_close(lse[0, :, rows].double(), torch.logsumexp(s, -1), atol=2e-2, rtol=0)
