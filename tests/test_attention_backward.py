"""Lesson 8's FlashAttention backward: dQ, dK, dV against float64 autograd of the forward's reference,
both schedules (dQ in its own pass; dQ by atomics), causal top-left as the forward, grouped-query
heads summed, N_q != N_k, N not a multiple of any block, the deterministic schedule bit for bit, the
upstream gradients in the layouts autograd hands over, the autograd entry (any layout of dO and dlse, a
padded head dim, a second derivative refused), and rows whose scores are all infinite. GPU-only cases (marked
``gpu``) run the bf16/fp16 sizes and the N = 131072 memory bound."""

from __future__ import annotations

import pytest
import torch
from conftest import gpu_only

from fusionlab import runtime
from fusionlab.kernels import KernelInputError
from fusionlab.kernels.attention import attention
from fusionlab.kernels.attention_backward import (
    attention_backward,
    attention_backward_bytes,
    attention_backward_config,
    attention_backward_flops,
    attention_backward_ledger,
    attention_backward_reference,
)
from fusionlab.measure.compare import against_ledger
from fusionlab.measure.interpreter import interpreter_trips

pytestmark = pytest.mark.lesson8

GPU = runtime.is_gpu()
DEV = runtime.DEVICE
DTYPE = torch.float16 if GPU else torch.float32


def _inputs(B, H, H_kv, N_q, N_k, D, dtype=DTYPE, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    q, k, v = (torch.randn(B, h, n, D, generator=g).to(DEV, dtype) for h, n in ((H, N_q), (H_kv, N_k), (H_kv, N_k)))
    do = torch.randn(B, H, N_q, D, generator=g).to(DEV, dtype)
    return q, k, v, do


def _grads(q, k, v, do, causal, scale, dlse):
    leaves = [t.detach().double().requires_grad_() for t in (q, k, v)]
    o, lse = _reference_float64(*leaves, causal=causal, scale=scale)
    outs, grads = [o], [do.double()]
    if dlse is not None:
        outs.append(lse)
        grads.append(dlse.double())
    return torch.autograd.grad(outs, leaves, grads)


def _reference_float64(q, k, v, causal, scale):
    """attention_reference keeps lse in fp32 and O in q's dtype; the gradient check wants both in float64."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    group = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ kr.transpose(-2, -1)) * scale
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril(), float("-inf"))
    return torch.softmax(s, -1) @ vr, torch.logsumexp(s, -1)


def _close(got, want, tol, what):
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        scale = w.abs().max().item() + 1.0  # gradients of O(1) inputs; an all-zero one compares absolutely
        torch.testing.assert_close(g.double(), w, atol=tol * scale, rtol=tol, msg=lambda m, n=name: f"{what} {n}: {m}")


TOL = 2e-2 if GPU else 1e-4

# (B, H_q, H_kv, N_q, N_k, D): each for the path it reaches (interpreter tiles: 16/32 and 32/16)
SHAPES = [
    (1, 2, 2, 1, 1, 32),  # one query, one key: every block partial
    (1, 2, 2, 17, 17, 32),  # one past the dK/dV pass's query block
    (2, 2, 1, 100, 100, 64),  # several blocks of every kind, none divides N; GQA 2
    (1, 4, 1, 64, 64, 64),  # the blocks divide N (the unmasked loads); GQA 4
    (1, 2, 2, 100, 37, 128),  # more queries than keys: rows past N_k see every key
    (1, 4, 2, 37, 100, 128),  # more keys than queries: causal key tiles no query sees
]


@pytest.mark.parametrize("deterministic", [True, False], ids=["dq-pass", "dq-atomic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gradients_match_float64_autograd(shape, causal, deterministic):
    if not deterministic and shape[-1] != 64:
        pytest.skip("the atomic schedule differs in dQ's sums only: one head dim covers it")
    q, k, v, do = _inputs(*shape)
    o, lse = attention(q, k, v, causal)
    got = attention_backward(q, k, v, o, lse, do, causal, deterministic=deterministic)
    _close(got, _grads(q, k, v, do, causal, None, None), TOL, f"{shape} causal={causal}")
    # the closed form of the spec, from the same O and lse, agrees with autograd
    ref = attention_backward_reference(q.double(), k.double(), v.double(), o.double(), lse, do.double(), causal)
    _close(ref, _grads(q, k, v, do, causal, None, None), TOL, "closed-form reference")


@pytest.mark.parametrize("scale", [0.3, -0.7])
def test_scale_and_lse_gradient(scale):
    """``scale`` of any sign reaches dQ and dK; a gradient of lse shifts D by dlse (P is lse's own
    gradient), so a loss on both outputs is right."""
    q, k, v, do = _inputs(1, 2, 2, 40, 50, 32)
    dlse = torch.randn(1, 2, 40, device=DEV)
    o, lse = attention(q, k, v, True, scale)
    got = attention_backward(q, k, v, o, lse, do, True, scale, dlse=dlse)
    _close(got, _grads(q, k, v, do, True, scale, dlse), TOL, f"scale={scale} with dlse")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 4, 2, 70, 50, 64), (2, 2, 2, 33, 100, 32)], ids=lambda s: "x".join(map(str, s)))
def test_descriptor_loads_give_the_pointer_paths_bits(shape, causal):
    """``config={"TMA": True}``: Q, dO (dK/dV pass) and K, V (dQ pass) through tensor descriptors, the partial
    last block through pointers: the same sums in the same order, so the same bits."""
    q, k, v, do = _inputs(*shape)
    o, lse = attention(q, k, v, causal)
    plain = attention_backward(q, k, v, o, lse, do, causal)
    tma = attention_backward(q, k, v, o, lse, do, causal, config={"TMA": True})
    if GPU:  # the same data, but the compiler may schedule the two kernels' sums differently
        _close(tma, [t.double() for t in plain], TOL, "TMA loads")
    else:
        assert all(torch.equal(a, b) for a, b in zip(plain, tma, strict=True))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_early_dp_product_gives_the_same_bits(causal):
    """``config={"EARLY_DP": True}``: dP's product issued before the exponentials in both passes (and the
    atomic schedule's), TMA loads or not: the same arithmetic in another order of issue."""
    q, k, v, do = _inputs(1, 4, 2, 70, 50, 64)
    o, lse = attention(q, k, v, causal)
    # a GPU compiles each combination (tens of seconds each): the default schedule with TMA loads there
    for det in (True,) if GPU else (True, False):
        for tma in (True,) if GPU else (False, True):
            plain = attention_backward(q, k, v, o, lse, do, causal, deterministic=det, config={"TMA": tma})
            early = attention_backward(q, k, v, o, lse, do, causal, deterministic=det,
                                       config={"TMA": tma, "EARLY_DP": True})  # fmt: skip
            if GPU:  # the compiler may schedule the sums differently, and atomics land in any order
                _close(early, [t.double() for t in plain], TOL, "EARLY_DP")
            else:  # the interpreter runs the programs, atomics included, in one order
                assert all(torch.equal(a, b) for a, b in zip(plain, early, strict=True))


def test_deterministic_schedule_is_bit_identical_and_atomics_agree():
    q, k, v, do = _inputs(1, 4, 2, 70, 70, 32)
    o, lse = attention(q, k, v, True)
    first = attention_backward(q, k, v, o, lse, do, True)
    for _ in range(2):
        again = attention_backward(q, k, v, o, lse, do, True)
        assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    atomic = attention_backward(q, k, v, o, lse, do, True, deterministic=False)
    assert torch.equal(atomic[1], first[1]) and torch.equal(atomic[2], first[2])  # dK, dV: the same sums
    torch.testing.assert_close(atomic[0], first[0], atol=TOL, rtol=TOL)


def test_upstream_gradient_in_any_layout():
    """dO negated (the backward of ``-O``), strided rows, transposed (copied) and expanded (stride 0)."""
    q, k, v, do = _inputs(1, 2, 2, 33, 33, 32)
    o, lse = attention(q, k, v, True)
    want = _grads(q, k, v, do, True, None, None)
    neg = torch._neg_view(-do)
    wide = torch.zeros(1, 2, 33, 70, device=DEV, dtype=DTYPE)
    wide[..., 5:37] = do
    transposed = do.transpose(-1, -2).contiguous().transpose(-1, -2)
    for name, view in (("negated", neg), ("strided", wide[..., 5:37]), ("transposed", transposed)):
        _close(attention_backward(q, k, v, o, lse, view, True), want, TOL, name)
    row = do[:, :, :1].expand(do.shape)
    _close(attention_backward(q, k, v, o, lse, row, True), _grads(q, k, v, row.contiguous(), True, None, None),
           TOL, "expanded")  # fmt: skip


def test_strided_inputs_read_in_place():
    """q, k, v as (B, N, H, D) transposed to (B, H, N, D), as a model's projection gives them."""
    B, N, H, D = 1, 40, 4, 32
    g = torch.Generator(device="cpu").manual_seed(3)
    q, k, v = (torch.randn(B, N, H, D, generator=g).to(DEV, DTYPE).transpose(1, 2) for _ in range(3))
    do = torch.randn(B, H, N, D, generator=g).to(DEV, DTYPE)
    o, lse = attention(q, k, v, True)
    _close(attention_backward(q, k, v, o, lse, do, True), _grads(q, k, v, do, True, None, None), TOL, "bnhd")


def test_autograd_entry_point():
    """:func:`attention` with inputs that require grad: O and lse both differentiable, gradients to
    the leaves; the forward alone without grad."""
    q, k, v, do = _inputs(1, 4, 2, 30, 45, 64)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, lse = attention(*leaves, causal=True)
    dlse = torch.randn_like(lse)
    got = torch.autograd.grad([o, lse], leaves, [do, dlse])
    _close(got, _grads(q, k, v, do, True, None, dlse), TOL, "autograd")
    (o_only,) = torch.autograd.grad(attention(*leaves, causal=False)[0].sum(), [leaves[0]])
    want = _grads(q, k, v, torch.ones_like(do), False, None, None)[0]
    torch.testing.assert_close(o_only.double(), want, atol=TOL * (want.abs().max().item() + 1), rtol=TOL)
    with torch.no_grad():
        o2, _ = attention(*leaves, causal=True)
    assert torch.equal(o2, o.detach())


def _infinite_scores(last: int):
    """Every kind of row whose lse is not finite, one head each, the last at query row ``last``: head 0's
    even rows (and ``last``) see only -inf (an inf in Q against keys all of the other sign); head 1's rows
    with q[:, 7] > 0 meet a +inf key; head 2's row ``last`` holds a NaN. Head 3 is finite."""
    q, k, v, do = _inputs(1, 4, 4, 40, 40, 32, seed=4)
    q[0, 0, ::2, 3] = q[0, 0, last, 3] = float("inf")
    k[0, 0, :, 3] = -k[0, 0, :, 3].abs() - 0.5
    k[0, 1, 5, 7] = float("inf")
    q[0, 1, last, 7] = q[0, 1, last, 7].abs() + 0.5
    q[0, 2, last, 0], q[0, 2, last, 1] = float("inf"), float("nan")
    return q, k, v, do


def _same_values(got, want, what):
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        for cls in (torch.isnan, torch.isposinf, torch.isneginf):
            where = (cls(g) != cls(w)).nonzero()[:4].tolist()
            assert torch.equal(cls(g), cls(w)), f"{what} {name}: {cls.__name__} differs at {where}"
        fin = w.isfinite()
        assert fin.any(), f"{what} {name}: nothing finite to compare"
        torch.testing.assert_close(g[fin].double(), w[fin], atol=TOL * (w[fin].abs().max().item() + 1), rtol=TOL)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy meets inf and NaN on purpose
@pytest.mark.parametrize("deterministic", [True, False], ids=["dq-pass", "dq-atomic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_rows_of_infinite_scores_have_float64s_gradients(causal, deterministic):
    """Rows with lse -inf, +inf or NaN: NaN in dQ's row and in dK, dV at every key the row sees, as
    float64 autograd gives (its softmax is NaN across such a row); every other gradient finite and right.
    The bad rows include the last, which sees every key, so the causal NaN pattern is float64's too."""
    q, k, v, do = _infinite_scores(last=39)
    dlse = torch.randn(1, 4, 40, device=DEV)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, lse = attention(*leaves, causal=causal, deterministic=deterministic)
    assert lse.isneginf().any() and lse.isposinf().any() and lse.isnan().any()
    got = torch.autograd.grad([o, lse], leaves, [do, dlse])
    want = _grads(q, k, v, do, causal, None, dlse)
    assert all(g[:, 3].isfinite().all() for g in got), "a non-finite row leaked into another head"
    _same_values(got, want, f"causal={causal}")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_causal_bad_row_reaches_only_what_it_sees():
    """Where the kernel differs from float64 (attention_backward's docstring): a causal row whose lse is
    not finite makes float64's dense dV NaN at every key (its softmax is NaN across the whole row, hidden
    keys included). The kernel's NaN stays in that row's dQ, the dK and dV of the keys it sees, and dK in
    its own diagonal block (0 * inf in ``dS^T Q``); every other gradient is finite and right."""
    q, k, v, do = _inputs(1, 1, 1, 40, 40, 32, seed=4)
    k[..., 3] = -k[..., 3].abs() - 0.5
    q[0, 0, 0, 3] = float("inf")  # row 0 sees key 0 alone, at -inf: lse -inf
    o, lse = attention(q, k, v, True)
    assert lse[0, 0, 0].isneginf() and lse[0, 0, 1:].isfinite().all()
    dq, dk, dv = attention_backward(q, k, v, o, lse, do, True)
    assert _grads(q, k, v, do, True, None, None)[2].isnan().all()  # float64: dV NaN at every key
    finite_q = q.clone()
    finite_q[0, 0, 0, 3] = 0.0  # in exact arithmetic nothing but row 0's dQ and key 0's dK, dV reads row 0
    want = _grads(finite_q, k, v, do, True, None, None)
    block = attention_backward_config(32, True)["BLOCK_N1"]  # keys past row 0's diagonal block
    for name, g, w, fine in (("dq", dq, want[0], 1), ("dk", dk, want[1], block), ("dv", dv, want[2], 1)):
        assert g[0, 0, 0].isnan().all(), f"{name}: row or key 0 should be NaN"
        assert g[0, 0, fine:].isfinite().all(), f"{name}: NaN past what row 0 reaches"
        ok = g.isfinite()
        torch.testing.assert_close(g[ok].double(), w[ok], atol=TOL * (w.abs().max().item() + 1), rtol=TOL)


def _autograd(q, k, v, grads, causal=True, scale=None, **kw):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o, lse = attention(*leaves, causal, scale, **kw)
    return torch.autograd.grad([o, lse], leaves, grads)


def test_autograd_upstream_gradients_in_any_layout():
    """What autograd may hand the Function: dO and dlse as negated views, rows apart in a wider buffer,
    with the last dimension strided (copied), or expanded (stride 0): the gradients of the plain ones."""
    q, k, v, do = _inputs(1, 2, 1, 33, 20, 32)
    dlse = torch.randn(1, 2, 33, device=DEV)
    want = _grads(q, k, v, do, True, None, dlse)
    wide = torch.zeros(1, 2, 33, 70, device=DEV, dtype=DTYPE)
    wide[..., 5:37] = do
    dlse_wide = torch.zeros(1, 2, 33, 3, device=DEV)
    dlse_wide[..., 1] = dlse
    layouts = {
        "negated": (torch._neg_view(-do), torch._neg_view(-dlse)),
        "strided": (wide[..., 5:37], dlse_wide[..., 1]),
        "last dim strided": (do.transpose(-1, -2).contiguous().transpose(-1, -2), dlse),
    }
    for name, grads in layouts.items():
        _close(_autograd(q, k, v, list(grads)), want, TOL, name)
    row, one = do[:, :, :1].expand(do.shape), torch.ones(1, device=DEV).expand(1, 2, 33)
    want = _grads(q, k, v, row.contiguous(), True, None, one.contiguous())
    _close(_autograd(q, k, v, [row, one]), want, TOL, "expanded")


@pytest.mark.parametrize("deterministic", [True, False], ids=["dq-pass", "dq-atomic"])
def test_autograd_padded_head_dim_gqa_scale_and_fewer_keys(deterministic):
    """Head dim 96 (padded to 128 on chip), GQA 4:2, N_q != N_k with neither a multiple of a block, a
    scale, causal: float64 autograd's gradients; the deterministic schedule bit-identical run to run."""
    q, k, v, do = _inputs(1, 4, 2, 45, 30, 96)
    dlse = torch.randn(1, 4, 45, device=DEV)
    got = _autograd(q, k, v, [do, dlse], True, 0.3, deterministic=deterministic)
    _close(got, _grads(q, k, v, do, True, 0.3, dlse), TOL, f"D 96 deterministic={deterministic}")
    if deterministic:
        again = _autograd(q, k, v, [do, dlse], True, 0.3)
        assert all(torch.equal(a, b) for a, b in zip(got, again, strict=True)), "not bit-identical"


def test_autograd_refuses_what_the_backward_cannot_take():
    q, k, v, do = _inputs(1, 2, 2, 8, 8, 32)
    leaf = q.clone().requires_grad_()
    with pytest.raises(KernelInputError, match="deterministic"):
        attention(leaf, k, v, deterministic="yes")
    with pytest.raises(KernelInputError, match="BLOCK_M1"):
        attention(leaf, k, v, backward_config={"BLOCK_M1": 8})
    with pytest.raises(KernelInputError, match="unknown config"):
        attention(leaf, k, v, backward_config={"BLOCK_X": 16})
    big = torch.randn(1, 1, 8, 256, device=DEV, dtype=DTYPE)
    with pytest.raises(KernelInputError, match="head dim 256"):
        attention(big.clone().requires_grad_(), big, big)
    o, _ = attention(leaf, k, v)
    (dq,) = torch.autograd.grad(o.square().sum(), leaf, create_graph=True)  # dO = 2 O has a graph
    with pytest.raises(RuntimeError, match="differentiate twice"):  # a second derivative: refused, not zero
        dq.sum().backward()


@pytest.mark.skipif(GPU, reason="fp16 in the interpreter; the GPU cases run fp16 and bf16")
def test_fp16_in_the_interpreter():
    q, k, v, do = _inputs(1, 2, 1, 50, 50, 64, dtype=torch.float16)
    o, lse = attention(q, k, v, True)
    got = attention_backward(q, k, v, o, lse, do, True)
    assert all(g.dtype == torch.float16 for g in got)
    _close(got, _grads(q, k, v, do, True, None, None), 2e-2, "fp16")


def test_empty_sequences():
    q, k, v, do = _inputs(1, 2, 2, 5, 0, 32)
    o, lse = attention(q, k, v)
    dq, dk, dv = attention_backward(q, k, v, o, lse, do)
    assert dq.shape == q.shape and not dq.any() and dk.shape == k.shape


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda a: {**a, "lse": a["lse"].double()}, "lse"),
        (lambda a: {**a, "lse": a["lse"][..., :-1]}, "lse must be"),
        (lambda a: {**a, "do": a["do"][:, :, :-1]}, "do must have"),
        (lambda a: {**a, "o": a["o"].to(torch.float16 if DTYPE == torch.float32 else torch.float32)}, "o has dtype"),
        (lambda a: {**a, "deterministic": 1}, "deterministic"),
        (lambda a: {**a, "config": {"BLOCK_M9": 16}}, "unknown config"),
        (lambda a: {**a, "causal": True, "config": {"BLOCK_M1": 64, "BLOCK_N1": 32}}, "multiple"),
    ],
)
def test_bad_inputs_raise(change, match):
    q, k, v, do = _inputs(1, 2, 2, 20, 20, 32)
    o, lse = attention(q, k, v)
    args = change({"q": q, "k": k, "v": v, "o": o, "lse": lse, "do": do})
    with pytest.raises(KernelInputError, match=match):
        attention_backward(**args)


def test_head_dim_outside_the_backward_is_refused_by_the_entry():
    q, k, v, _ = _inputs(1, 1, 1, 8, 8, 8)
    with pytest.raises(KernelInputError, match="head dim"):
        attention(q.requires_grad_(), k, v)


@pytest.mark.skipif(GPU, reason="counts the interpreter's loads and stores")
@pytest.mark.parametrize("deterministic", [True, False], ids=["dq-pass", "dq-atomic"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_ledger_is_the_interpreter_count(causal, deterministic):
    """Every tensor's bytes, read and written by the three kernels, as the ledger predicts them at the
    launcher's tiles (the atomic schedule's zeroing and cast of dQ are torch ops, not counted here)."""
    B, H, H_kv, N, D = 1, 4, 2, 64, 32
    q, k, v, do = _inputs(B, H, H_kv, N, N, D)
    o, lse = attention(q, k, v, causal)
    cfg = attention_backward_config(D, causal)
    _, trips = interpreter_trips(attention_backward, q, k, v, o, lse, do, causal, deterministic=deterministic)
    led = attention_backward_ledger(B, H, N, N, D, DTYPE, causal, h_kv=H_kv, block_m2=cfg["BLOCK_M2"],
                                    block_n1=cfg["BLOCK_N1"], deterministic=deterministic)  # fmt: skip
    names = {"o_ptr": "O", "do_ptr": "dO", "q_ptr": "Q", "k_ptr": "K", "v_ptr": "V", "lse_ptr": "lse",
             "lse_fwd_ptr": "lse_fwd", "delta_ptr": "D", "dk_ptr": "dK", "dv_ptr": "dV"}  # fmt: skip
    names["dq_ptr"] = "dQ" if deterministic else "dQ_acc"
    torch_ops = {("dQ_acc", "read"): B * H * N * D * 4, ("dQ_acc", "write"): B * H * N * D * 4,
                 ("dQ", "write"): B * H * N * D * 4} if not deterministic else {}  # fmt: skip
    checks = against_ledger(trips.by_tensor(names), led)
    got = {(c.tensor, c.direction): c.measured for c in checks if c.measured}
    want = {(c.tensor, c.direction): c.predicted - torch_ops.get((c.tensor, c.direction), 0) for c in checks}
    assert got == {key: n for key, n in want.items() if n}


def test_flops_ledger_and_config():
    assert attention_backward_flops(1, 1, 128, 128, 64) == 5 * 2 * 128 * 128 * 64
    assert attention_backward_flops(1, 1, 128, 128, 64, causal=True) == 5 * 128 * 128 * 64
    led = attention_backward_ledger(1, 4, 1024, 1024, 64, causal=True, h_kv=2, block_m2=128, block_n1=128)
    assert led.fused_bytes < led.unfused_bytes / 4  # no N x N matrix: far fewer bytes
    ideal = attention_backward_ledger(1, 4, 1024, 1024, 64, h_kv=2)
    assert ideal.fused_bytes >= attention_backward_bytes(1, 4, 1024, 1024, 64, h_kv=2)
    cfg = attention_backward_config(80, causal=True)
    assert cfg["BLOCK_D"] == 128 and cfg["BLOCK_N1"] % cfg["BLOCK_M1"] == 0 and cfg["BLOCK_M2"] % cfg["BLOCK_N2"] == 0


# -- GPU ------------------------------------------------------------------------------------------
@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "shape", [(2, 4, 4, 1000, 1000, 64), (1, 4, 4, 1025, 1025, 128), (1, 8, 2, 4097, 4097, 128),
              (1, 32, 8, 1000, 1000, 64), (1, 2, 2, 1000, 3000, 32), (1, 2, 2, 17, 17, 128)],
    ids=lambda s: "x".join(map(str, s)),
)  # fmt: skip
def test_gpu_sizes_against_float64(shape, causal, dtype):
    q, k, v, do = _inputs(*shape, dtype=dtype)
    o, lse = attention(q, k, v, causal)
    got = attention_backward(q, k, v, o, lse, do, causal)
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-2
    _close(got, _grads(q, k, v, do, causal, None, None), tol, f"{shape} {dtype}")
    runs = [attention_backward(q, k, v, o, lse, do, causal) for _ in range(10)]
    assert all(torch.equal(r[0], got[0]) and torch.equal(r[1], got[1]) for r in runs), "not bit-identical"


@gpu_only
@pytest.mark.gpu
def test_gpu_n131072_forward_backward_in_under_2gib_extra():
    B, H, N, D = 1, 16, 131072, 128
    q, k, v, do = (torch.randn(B, H, N, D, device=DEV, dtype=torch.bfloat16) for _ in range(4))
    leaves = [t.requires_grad_() for t in (q, k, v)]
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    o, lse = attention(*leaves, causal=True)
    grads = torch.autograd.grad(o, leaves, do)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    # O, lse and dq, dk, dv are what any forward + backward hands back (2 GiB of them here), not overhead
    outputs = sum(t.numel() * t.element_size() for t in (*grads, o, lse))
    workspace = extra - outputs
    assert workspace < 2 * 2**30, f"{workspace / 2**30:.2f} GiB beyond the inputs, O, lse and the gradients"
    # and it is the backward's fp32 row vectors (D, lse's copy), nothing the size of a head's N x D or more
    assert workspace <= 4 * B * H * N * 4, f"{workspace / 2**20:.1f} MiB of workspace"
    assert all(torch.isfinite(g).all() for g in grads)


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(
    "shape", [(2, 8, 2, 1000, 1000, 64), (1, 4, 4, 777, 1025, 128)], ids=lambda s: "x".join(map(str, s))
)
def test_gpu_atomic_schedules(shape, causal):
    """dQ by pointer atomics and by the copy engine's reduce-add (``TMA_REDUCE``, Hopper): the same
    gradients to rounding; dK and dV bit-identical to the deterministic schedule's."""
    q, k, v, do = _inputs(*shape, dtype=torch.bfloat16)
    o, lse = attention(q, k, v, causal)
    det = attention_backward(q, k, v, o, lse, do, causal)
    want = _grads(q, k, v, do, causal, None, None)
    for cfg in (None, {"TMA_REDUCE": True}):
        got = attention_backward(q, k, v, o, lse, do, causal, deterministic=False, config=cfg)
        _close(got, want, 3e-2, f"atomic {cfg}")
        assert torch.equal(got[1], det[1]) and torch.equal(got[2], det[2])
