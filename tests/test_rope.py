"""RoPE: q and k rotated in one launch forward and one backward, against float64 and Hugging Face's code."""

from __future__ import annotations

import pytest
import torch

from fusionlab import runtime
from fusionlab.instrument import LaunchCounter
from fusionlab.kernels import KernelInputError
from fusionlab.kernels.rope import (
    rope,
    rope_cache_write,
    rope_cache_write_reference,
    rope_config,
    rope_eager,
    rope_flops,
    rope_ledger,
    rope_reference,
    rope_tables,
)

DEV = runtime.DEVICE
DTYPES = [
    pytest.param(torch.float32, 1e-5, id="fp32"),
    pytest.param(torch.float16, 2e-3, id="fp16"),
]
if runtime.is_gpu():
    DTYPES.append(pytest.param(torch.bfloat16, 1.6e-2, id="bf16"))  # the interpreter has no bf16

# (B, H_q, H_k, N, D): each comment names the path it exercises
SHAPES = [
    (1, 1, 1, 1, 2),  # one token, one pair: almost every lane masked
    (2, 4, 2, 7, 16),  # GQA head counts, an odd token count
    (3, 3, 1, 33, 10),  # a head dim whose half (5) is not a power of two: masked pairs
    (1, 2, 2, 70, 128),  # Llama's head dim, more tokens than one interpreter tile of pairs
]


def _qk(B, Hq, Hk, N, D, dtype, layout, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape = (lambda h: (B, h, N, D)) if layout == "bhnd" else (lambda h: (B, N, h, D))
    return (torch.randn(shape(Hq), generator=gen).to(DEV, dtype), torch.randn(shape(Hk), generator=gen).to(DEV, dtype))


def _close(got, want, tol):
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g.double(), w.double(), atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_forward_matches_float64(shape, layout, interleaved, dtype, tol):
    q, k = _qk(*shape, dtype, layout)
    cos, sin = rope_tables(shape[3] + 5, shape[4])
    got = rope(q, k, cos, sin, 5, layout, interleaved)
    want = rope_reference(q.double(), k.double(), cos, sin, 5, layout, interleaved)
    _close(got, [w.to(dtype) for w in want], tol)


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["half", "interleaved"])
def test_backward_matches_float64(layout, interleaved, dtype, tol):
    B, Hq, Hk, N, D = 2, 4, 2, 9, 24
    q, k = (t.requires_grad_() for t in _qk(B, Hq, Hk, N, D, dtype, layout, seed=1))
    cos, sin = rope_tables(64, D)
    offset = torch.tensor([0, 40], device=DEV)
    qo, ko = rope(q, k, cos, sin, offset, layout, interleaved)
    dqo, dko = torch.randn_like(qo), torch.randn_like(ko)
    torch.autograd.backward((qo, ko), (dqo, dko))
    qd, kd = (t.detach().double().requires_grad_() for t in (q, k))
    want = rope_reference(qd, kd, cos, sin, offset, layout, interleaved)
    torch.autograd.backward(want, (dqo.double(), dko.double()))
    _close((q.grad, k.grad), (qd.grad.to(dtype), kd.grad.to(dtype)), tol)


def test_rotate_half_is_hugging_faces_llama_convention():
    """The default pairs j with j + D/2: Hugging Face's ``x * cos + rotate_half(x) * sin`` (rope_eager)."""
    q, k = _qk(2, 4, 2, 11, 32, torch.float32, "bhnd")
    cos, sin = rope_tables(32, 32)
    _close(rope(q, k, cos, sin, 3), rope_eager(q, k, cos, sin, 3), 1e-5)
    # and the interleaved convention is not it: a kernel on the wrong pairs must fail this test
    assert not torch.allclose(rope(q, k, cos, sin, 3, interleaved=True)[0], rope_eager(q, k, cos, sin, 3)[0], atol=1e-3)


def test_interleaved_is_the_complex_number_form():
    """Meta's original Llama code: pairs (2j, 2j+1) as complex numbers, multiplied by e^{i p theta_j}."""
    B, N, H, D = 2, 6, 3, 16
    q, k = _qk(B, H, H, N, D, torch.float32, "bnhd", seed=3)
    cos, sin = rope_tables(N + 2, D)
    pos = torch.arange(2, N + 2, device=DEV)
    rot = torch.polar(torch.ones_like(cos[pos]), torch.atan2(sin[pos], cos[pos]))[None, :, None]  # (1, N, 1, D/2)
    want = [torch.view_as_real(torch.view_as_complex(x.reshape(B, N, H, D // 2, 2)) * rot).flatten(-2) for x in (q, k)]
    _close(rope(q, k, cos, sin, 2, "bnhd", interleaved=True), want, 1e-5)


def test_decoding_offsets_per_row_match_a_prefill():
    """Token t of a prefill and the same token decoded alone at offset t get the same rotation; a (B,)
    tensor of offsets gives each row its own cache length."""
    B, H, N, D = 3, 2, 12, 16
    q, k = _qk(B, H, H, N, D, torch.float32, "bhnd", seed=4)
    cos, sin = rope_tables(N, D)
    full_q, full_k = rope(q, k, cos, sin)
    lengths = torch.tensor([0, 5, 11], device=DEV)
    step_q = q[torch.arange(B), :, lengths][:, :, None]  # (B, H, 1, D): row b's token at lengths[b]
    step_k = k[torch.arange(B), :, lengths][:, :, None]
    got_q, got_k = rope(step_q, step_k, cos, sin, lengths)
    _close(
        (got_q[:, :, 0], got_k[:, :, 0]),
        (full_q[torch.arange(B), :, lengths], full_k[torch.arange(B), :, lengths]),
        1e-6,
    )
    # an int offset: every row at the same step
    got_q, _ = rope(q[:, :, 7:8], k[:, :, 7:8], cos, sin, 7)
    _close((got_q,), (full_q[:, :, 7:8],), 1e-6)


def test_strided_views_of_one_qkv_projection_are_read_in_place():
    """The QKV projection's output (B, N, (H_q + 2 H_k) D) viewed by heads: q and k are strided views in
    the (B, N, H, D) layout; the kernel reads them where they are, one launch, no copy."""
    B, N, Hq, Hk, D = 2, 5, 4, 2, 16
    qkv = torch.randn(B, N, (Hq + 2 * Hk) * D, device=DEV)
    q = qkv[..., : Hq * D].view(B, N, Hq, D)
    k = qkv[..., Hq * D : (Hq + Hk) * D].view(B, N, Hk, D)
    cos, sin = rope_tables(N, D)
    with LaunchCounter() as counter:
        got = rope(q, k, cos, sin, layout="bnhd")
    assert counter.names == ["_rope_kernel"] and counter.passes == [], (counter.names, counter.passes)
    assert got[0].is_contiguous() and got[0].shape == q.shape
    _close(got, rope_reference(q, k, cos, sin, layout="bnhd"), 1e-5)
    # the same heads transposed to (B, H, N, D): the same numbers
    got_t = rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    _close([g.transpose(1, 2) for g in got_t], got, 0)


def test_backward_is_one_launch_and_saves_no_activation():
    q, k = (t.requires_grad_() for t in _qk(1, 2, 1, 4, 8, torch.float32, "bhnd"))
    cos, sin = rope_tables(4, 8)
    qo, ko = rope(q, k, cos, sin)
    assert qo.grad_fn.saved_tensors[0] is cos and len(qo.grad_fn.saved_tensors) == 2  # the tables only
    with LaunchCounter() as counter:
        torch.autograd.backward((qo, ko), (torch.ones_like(qo), torch.ones_like(ko)))
    assert counter.names == ["_rope_kernel"]


def test_positions_outside_the_tables_are_refused():
    q, k = _qk(2, 1, 1, 4, 8, torch.float32, "bhnd")
    cos, sin = rope_tables(10, 8)
    rope(q, k, cos, sin, 6)  # positions 6..9: the last row of the tables
    with pytest.raises(KernelInputError, match="outside the tables"):
        rope(q, k, cos, sin, 7)
    with pytest.raises(KernelInputError, match="outside the tables"):
        rope(q, k, cos, sin, -1)
    if not runtime.is_gpu():  # free to read in the interpreter; on a GPU such rows are NaN (no sync)
        with pytest.raises(KernelInputError, match="outside the tables"):
            rope(q, k, cos, sin, torch.tensor([0, 8]))
    with pytest.raises(KernelInputError, match=r"shape \(B,\)"):
        rope(q, k, cos, sin, torch.tensor([0, 1, 2]))
    with pytest.raises(KernelInputError, match="D/2"):
        rope(q, k, cos[:, :3], sin[:, :3])
    with pytest.raises(KernelInputError, match="layout"):
        rope(q, k, cos, sin, layout="nbhd")
    with pytest.raises(KernelInputError, match="same B, N and D"):
        rope(q, k[:, :, :3], cos, sin)


def test_ledger_counts_eager_and_fused():
    led = rope_ledger(100, 40, 50, torch.float16)
    # eager, per tensor of n elements: neg n, cat 2n, two muls 2n each, add 3n (10n) and two table reads
    assert led.unfused_bytes == 2 * (10 * 140 + 4 * 50)
    assert led.fused_bytes == 2 * (2 * 140 + 2 * 25)  # x read, y written, each half-width table read once
    assert led.kernels_unfused == 10
    assert rope_flops(100, 40) == 420
    assert rope_config(1, 128, torch.bfloat16, gpu=True) == {"BLOCK_T": 1, "BLOCK_HALF": 64, "num_warps": 4}
    with LaunchCounter() as counter:
        q, k = _qk(1, 2, 1, 3, 8, torch.float32, "bhnd")
        rope_eager(q, k, *rope_tables(3, 8))
    assert [o for o in counter.torch_ops if o in ("neg", "cat", "mul", "add")].count("mul") >= 4


@pytest.mark.parametrize("dtype,tol", DTYPES)
@pytest.mark.parametrize("layout", ["bhnd", "bnhd"])
def test_cache_write_rotates_q_and_writes_k_and_v_at_each_rows_length(layout, dtype, tol):
    """One launch: q rotated and returned, k rotated into its cache and v copied into its cache at
    positions cache_len[b] + n; the rest of the caches untouched."""
    B, Hq, Hk, N, D, n_max = 3, 4, 2, 2, 16, 12
    q, k = _qk(B, Hq, Hk, N, D, dtype, layout, seed=5)
    v = torch.randn(k.shape, generator=torch.Generator().manual_seed(6)).to(DEV, dtype)
    cos, sin = rope_tables(n_max + 8, D)  # longer than the cache: the cache's end is what refuses
    lens = torch.tensor([0, 4, 10], device=DEV)  # the last row fills the cache to its end
    kc = torch.randn(B, Hk, n_max, D, device=DEV).to(dtype)
    vc = torch.randn(B, Hk, n_max, D, device=DEV).to(dtype)
    want_q, want_k, want_v = rope_cache_write_reference(q, k, v, cos, sin, kc, vc, lens, layout)
    with LaunchCounter() as counter:
        got_q = rope_cache_write(q, k, v, cos, sin, kc, vc, lens, layout)
    assert counter.names == ["_rope_kernel"] and counter.torch_ops == [], (counter.names, counter.torch_ops)
    _close((got_q, kc), (want_q, want_k), tol)
    assert torch.equal(vc, want_v), "v is copied bit for bit"
    # the same k as rope() gives, at the positions
    _, k_rot = rope(q, k, cos, sin, lens, layout)
    k_rot = k_rot if layout == "bnhd" else k_rot.transpose(1, 2)
    torch.testing.assert_close(kc[1, :, 4:6].transpose(0, 1), k_rot[1], atol=0, rtol=0)
    # a cache kept as (B, N_max, H_kv, D) and passed transposed is written in place
    kt = torch.zeros(B, n_max, Hk, D, device=DEV, dtype=dtype)
    vt = torch.zeros_like(kt)
    rope_cache_write(q, k, v, cos, sin, kt.transpose(1, 2), vt.transpose(1, 2), lens, layout)
    torch.testing.assert_close(kt.transpose(1, 2)[1, :, 4:6], kc[1, :, 4:6], atol=0, rtol=0)
    with pytest.raises(KernelInputError, match="do not fit"):
        rope_cache_write(q, k, v, cos, sin, kc, vc, 11, layout)
    if not lens.is_cuda:  # lengths in host memory are read once (by the table's check) and refused here too
        with pytest.raises(KernelInputError, match="up to 12 do not fit"):
            rope_cache_write(q, k, v, cos, sin, kc, vc, torch.tensor([0, 4, 11]), layout)
    with pytest.raises(KernelInputError, match="share memory"):
        rope_cache_write(q, k, v, cos, sin, kc[:, :1].expand(B, Hk, n_max, D), vc, 0, layout)


# -- the cache write's plans by call signature ---------------------------------------------------------
# A call whose signature (each tensor's type, device, dtype, shape, strides, negation flag,
# requires_grad and 16-byte alignment, the lengths' tensor among them; the grad mode; layout and
# interleaved) equals that of a call that passed every check launches from the kept plan. The lengths'
# values are not in the signature: where the checks read them (in host memory) they are checked on
# every call. Any other call is checked in full and raises what it raises on a fresh start.
def _cache_case(dtype=torch.float32, layout="bnhd", seed=20):
    B, Hq, Hk, N, D, n_max = 2, 4, 2, 1, 16, 12
    q, k = _qk(B, Hq, Hk, N, D, dtype, layout, seed=seed)
    v = torch.randn(k.shape, generator=torch.Generator().manual_seed(seed + 1)).to(DEV, dtype)
    cos, sin = rope_tables(n_max + 4, D)
    kc = torch.zeros(B, Hk, n_max, D, device=DEV, dtype=dtype)
    return q, k, v, cos, sin, kc, torch.zeros_like(kc)


def _error(fn) -> str:
    with pytest.raises(KernelInputError) as err:
        fn()
    return str(err.value)


def test_cache_write_of_a_kept_signature_skips_the_checks_but_the_lengths(monkeypatch):
    import fusionlab.kernels.rope as RP

    q, k, v, cos, sin, kc, vc = _cache_case()
    RP._PLANS.clear()
    rope_cache_write(q, k, v, cos, sin, kc, vc, torch.tensor([0, 3], device=DEV))
    assert len(RP._PLANS) == 1
    calls, check = [], RP._check
    monkeypatch.setattr(RP, "_check", lambda *a: calls.append(a) or check(*a))
    q2, k2, v2, *_ = _cache_case(seed=30)
    lens = torch.tensor([5, 1], device=DEV)  # other values, the same signature
    want = rope_cache_write_reference(q2, k2, v2, cos, sin, kc, vc, lens, "bnhd")
    got_q = rope_cache_write(q2, k2, v2, cos, sin, kc, vc, lens)
    assert not calls
    _close((got_q, kc), want[:2], 1e-5)
    assert torch.equal(vc, want[2])
    if not lens.is_cuda:  # lengths in host memory: their values are checked on every call
        for bad in ([0, 12], [-1, 0]):
            RP._PLANS.clear()
            fresh = _error(lambda bad=bad: rope_cache_write(q, k, v, cos, sin, kc, vc, torch.tensor(bad)))
            rope_cache_write(q, k, v, cos, sin, kc, vc, torch.tensor([0, 3]))
            assert len(RP._PLANS) == 1
            assert _error(lambda bad=bad: rope_cache_write(q, k, v, cos, sin, kc, vc, torch.tensor(bad))) == fresh
        table = rope_tables(8, 16)  # positions past the tables (8 rows), inside the cache (12)
        rope_cache_write(q, k, v, *table, kc, vc, torch.tensor([0, 3]))
        assert "outside the tables" in _error(lambda: rope_cache_write(q, k, v, *table, kc, vc, torch.tensor([0, 8])))


def _rope_bad_after_good():
    """(name, the bad call's arguments from a good call's) differing from it in one field of the signature."""
    return [
        ("negated q", lambda a: {**a, "q": torch._neg_view(a["q"])}),
        ("negated v", lambda a: {**a, "v": torch._neg_view(a["v"])}),
        ("negated sin", lambda a: {**a, "sin": torch._neg_view(a["sin"])}),
        ("k of another dtype", lambda a: {**a, "k": a["k"].half()}),
        ("a cache of another dtype", lambda a: {**a, "v_cache": a["v_cache"].half()}),
        ("a cache whose rows share memory", lambda a: {**a, "k_cache": a["k_cache"][:, :1].expand(a["k_cache"].shape)}),
        ("lengths of a float dtype", lambda a: {**a, "cache_len": a["cache_len"].float()}),
        ("lengths not contiguous", lambda a: {**a, "cache_len": torch.tensor([0, 9, 3, 9], device=DEV)[::2]}),
        ("lengths on another device", lambda a: {**a, "cache_len": a["cache_len"].to("meta")}),
        ("v requires grad", lambda a: {**a, "v": a["v"].detach().requires_grad_()}),
        ("another layout", lambda a: {**a, "layout": "bhnd"}),
        ("a layout that is not a str", lambda a: {**a, "layout": 1}),
        ("interleaved not a bool", lambda a: {**a, "interleaved": 1}),
    ]


@pytest.mark.parametrize("bad", [c[1] for c in _rope_bad_after_good()], ids=[c[0] for c in _rope_bad_after_good()])
def test_cache_write_a_bad_call_after_good_ones_of_the_same_shape_still_raises(bad):
    import fusionlab.kernels.rope as RP

    q, k, v, cos, sin, kc, vc = _cache_case()
    good = dict(q=q, k=k, v=v, cos=cos, sin=sin, k_cache=kc, v_cache=vc, cache_len=torch.tensor([0, 3], device=DEV))
    args = bad(good)
    RP._PLANS.clear()
    fresh = _error(lambda: rope_cache_write(**args))
    for _ in range(2):  # the second good call launches the kept plan
        rope_cache_write(**good)
    assert len(RP._PLANS) == 1
    assert _error(lambda: rope_cache_write(**args)) == fresh
