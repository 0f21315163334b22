"""Lesson 5's SwiGLU: silu(g) * u in one kernel forward and one backward that recomputes silu."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import refusal

from fusionlab import runtime
from fusionlab.grading import Sandbox
from fusionlab.instrument import LaunchCounter
from fusionlab.kernels import KernelInputError
from fusionlab.kernels.swiglu import (
    swiglu,
    swiglu_config,
    swiglu_eager,
    swiglu_flops,
    swiglu_ledger,
    swiglu_reference,
)

pytestmark = [
    pytest.mark.lesson5,
    # the interpreter's numpy sigmoid overflows exp for g << 0 (the answer, 0, is right)
    pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),  # inf * 0 where torch has NaN too
]

FWD, BWD = "_swiglu_kernel", "_swiglu_bwd_kernel"
SHAPES = [
    (1, 1),  # one element, almost all lanes masked
    (3, 5),
    (37, 129),  # odd both ways: masks on rows and columns
    (257, 4097),  # one past a block in both directions, many programs
    (64, 256),  # tiles divide the tensor: the unmasked (EVEN) path
    (2, 3, 37),  # leading dimensions are rows
]
DTYPES = [
    pytest.param(torch.float32, 1e-5, 1e-5, id="fp32"),
    pytest.param(torch.float16, 2e-3, 2e-3, id="fp16"),
]
if runtime.is_gpu():
    DTYPES.append(pytest.param(torch.bfloat16, 1.6e-2, 1.6e-2, id="bf16"))  # the interpreter has no bf16


def _inputs(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(shape, generator=gen) * 3  # both tails of the sigmoid
    u = torch.randn(shape, generator=gen)
    return g.to(runtime.DEVICE, dtype), u.to(runtime.DEVICE, dtype)


def _float64_grads(g, u, dh):
    gd, ud = g.detach().double().requires_grad_(), u.detach().double().requires_grad_()
    (F.silu(gd) * ud).backward(dh.double())
    return gd.grad, ud.grad


@pytest.mark.parametrize("dtype,atol,rtol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_and_backward_match_float64(shape, dtype, atol, rtol):
    g, u = _inputs(shape, dtype)
    g.requires_grad_()
    u.requires_grad_()
    with Sandbox() as fwd:
        h = swiglu(g, u)
    assert h.shape == g.shape and h.dtype == dtype
    assert fwd.names == [FWD] and fwd.torch_ops == [], "one kernel, nothing else computing"
    want = (F.silu(g.detach().double()) * u.detach().double()).to(dtype)
    torch.testing.assert_close(h, want, atol=atol, rtol=rtol)
    dh = torch.randn(shape, generator=torch.Generator().manual_seed(1)).to(runtime.DEVICE, dtype)
    with Sandbox() as bwd:
        h.backward(dh)
    assert bwd.names == [BWD], "dg and du from one kernel"
    want_dg, want_du = _float64_grads(g, u, dh)
    torch.testing.assert_close(g.grad.double(), want_dg, atol=atol * 2, rtol=rtol * 2)
    torch.testing.assert_close(u.grad.double(), want_du, atol=atol * 2, rtol=rtol * 2)


def test_backward_saves_inputs_not_silu():
    g, u = _inputs((8, 64), torch.float32)
    g.requires_grad_()
    h = swiglu(g, u)
    saved = h.grad_fn.saved_tensors
    assert len(saved) == 2 and saved[0].data_ptr() == g.data_ptr() and saved[1].data_ptr() == u.data_ptr()


def test_halves_of_one_projection():
    # the two halves of one (T, 2F) matmul output: row stride 2F, no copy
    x = torch.randn(33, 2 * 150, device=runtime.DEVICE, requires_grad=True)
    g, u = x.chunk(2, dim=-1)
    with LaunchCounter() as counter:
        h = swiglu(g, u)
    assert counter.passes == [], "strided halves are read in place"
    torch.testing.assert_close(h, swiglu_reference(g, u), atol=1e-6, rtol=1e-5)
    dh = torch.randn_like(h)
    h.backward(dh)
    xd = x.detach().double().requires_grad_()
    gd, ud = xd.chunk(2, dim=-1)
    (F.silu(gd) * ud).backward(dh.double())
    torch.testing.assert_close(x.grad.double(), xd.grad, atol=1e-5, rtol=1e-5)


def test_upstream_gradient_strided():
    g, u = _inputs((16, 40), torch.float32)
    g.requires_grad_()
    h = swiglu(g, u)
    dh = torch.randn(40, 16, device=runtime.DEVICE).t()  # column-major upstream gradient
    h.backward(dh)
    want_dg, _ = _float64_grads(g, u, dh)
    torch.testing.assert_close(g.grad.double(), want_dg, atol=1e-5, rtol=1e-5)


def test_non_finite_inputs_match_torch():
    g = torch.tensor([[float("inf"), float("-inf"), float("nan"), 0.0, -100.0, 100.0]], device=runtime.DEVICE)
    u = torch.tensor([[2.0, 2.0, 1.0, 1.0, 1.0, float("inf")]], device=runtime.DEVICE)
    torch.testing.assert_close(swiglu(g, u), swiglu_eager(g, u), equal_nan=True)


def test_empty_and_no_grad():
    g, u = _inputs((0, 8), torch.float32)
    with Sandbox() as counter:
        h = swiglu(g, u)
    assert h.shape == (0, 8) and counter.names == []
    g2, u2 = _inputs((4, 8), torch.float32)
    g2.requires_grad_()
    with torch.no_grad():
        assert swiglu(g2, u2).grad_fn is None


def test_reference_and_eager():
    g, u = _inputs((5, 7), torch.float32)
    torch.testing.assert_close(swiglu_reference(g, u), F.silu(g) * u, atol=0, rtol=0)
    with LaunchCounter() as counter:
        swiglu_eager(g, u)
    assert counter.torch_ops == ["silu", "mul"], "the eager baseline is two kernels, as the ledger counts"


def test_ledger_5_3_and_9_5():
    n = 1000
    fwd = swiglu_ledger(n, torch.bfloat16)
    assert fwd.unfused_bytes == 5 * n * 2 and fwd.fused_bytes == 3 * n * 2 and fwd.kernels_unfused == 2
    bwd = swiglu_ledger(n, torch.bfloat16, backward=True)
    assert bwd.unfused_bytes == 9 * n * 2 and bwd.fused_bytes == 5 * n * 2 and bwd.kernels_unfused == 3
    fused = {(t.tensor, t.direction) for t in bwd.trips(fused=True)}
    assert fused == {("dh", "read"), ("g", "read"), ("u", "read"), ("dg", "write"), ("du", "write")}
    assert "s recomputed" in bwd.table()
    assert swiglu_flops(n) == 5 * n and swiglu_flops(n, backward=True) == 11 * n


def test_config_is_the_elementwise_tile(monkeypatch):
    monkeypatch.setattr(runtime, "is_gpu", lambda: True)
    assert swiglu_config(8192, 14336, torch.bfloat16) == {"BLOCK_M": 2, "BLOCK_N": 1024, "num_warps": 4}
    assert swiglu_config(8192, 14336, torch.float32) == {"BLOCK_M": 1, "BLOCK_N": 1024, "num_warps": 4}


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda g, u: (g.long(), u.long()), "dtype"),
        (lambda g, u: (g, u.half()), "share a dtype"),
        (lambda g, u: (g, u[:, :-1]), "same shape"),
        (lambda g, u: (g.t(), u.t()), "stride"),
        (lambda g, u: (g[0, 0], u[0, 0]), "at least one dimension"),
        (lambda g, u: (g._neg_view(), u), "negated"),
    ],
    ids=["int", "mixed-dtype", "shape", "column-major", "scalar", "neg-view"],
)
def test_bad_inputs(make, match):
    g, u = _inputs((4, 8), torch.float32)
    bg, bu = make(g, u)
    with pytest.raises(KernelInputError, match=match):
        swiglu(bg, bu)


def test_rows_that_cannot_be_viewed():
    x = torch.randn(4, 6, 8, device=runtime.DEVICE)
    g = x.transpose(0, 1)  # (6, 4, 8), last dim contiguous but the rows do not flatten
    with pytest.raises(KernelInputError, match="contiguous"):
        swiglu(g, g)


# -- plans by call signature -------------------------------------------------------------------------
# A call whose signature (each tensor's type, device, dtype, shape, strides, negation flag, requires_grad
# and 16-byte alignment; the grad mode) equals that of a call that passed every check skips the checks and
# launches the kept plan. Any other call is checked in full: a bad call after good ones raises as fresh.
def _halves(n_cols, seed):
    gen = torch.Generator().manual_seed(seed)
    gu = (torch.randn(1, 1, 2 * n_cols, generator=gen) * 3).to(runtime.DEVICE)
    return gu[..., :n_cols], gu[..., n_cols:]  # the decode step's two halves of one projection


def test_a_repeated_call_launches_its_kept_plan_without_the_checks(monkeypatch):
    import fusionlab.kernels.swiglu as SG

    g, u = _halves(40, seed=60)
    SG._PLANS.clear()
    with torch.no_grad():
        first = swiglu(g, u)
    assert len(SG._PLANS) == 1
    calls = []
    for name in ("check_tensor", "_forward_plan"):
        fn = getattr(SG, name)
        monkeypatch.setattr(SG, name, lambda *a, fn=fn, **k: calls.append(a) or fn(*a, **k))
    g2, u2 = _halves(40, seed=61)
    with torch.no_grad():
        again, other = swiglu(g, u), swiglu(g2, u2)
    assert not calls
    assert torch.equal(again, first)
    monkeypatch.undo()
    SG._PLANS.clear()
    with torch.no_grad():
        assert torch.equal(other, swiglu(g2, u2))  # the full path's bits
    assert torch.allclose(first, swiglu_reference(g, u), 1e-5, 1e-5)


def test_grad_mode_and_requires_grad_pick_the_path_after_a_kept_plan():
    import fusionlab.kernels.swiglu as SG

    g, u = _halves(24, seed=62)
    SG._PLANS.clear()
    with torch.no_grad():
        swiglu(g, u)
        swiglu(g, u)
    gg = g.detach().clone().requires_grad_(True)
    for _ in range(2):  # the second call runs the autograd forward from its kept plan
        gg.grad = None
        h = swiglu(gg, u)
        assert h.requires_grad
        dh = torch.ones_like(h)
        h.backward(dh)
        assert torch.allclose(gg.grad, _float64_grads(g, u, dh)[0].to(g.dtype), 1e-5, 1e-5)
    assert not swiglu(g, u).requires_grad  # grad on, nothing requires it: no graph
    with torch.no_grad():
        assert not swiglu(gg, u).requires_grad
    assert len(SG._PLANS) == 4


def _swiglu_bad_after_good():
    """(name, a bad call's arguments made from a good call's g and u) differing from it in one field of
    the signature only."""
    dev = runtime.DEVICE
    return [
        ("negated g", lambda g, u: (torch._neg_view(g), u)),
        ("negated u", lambda g, u: (g, torch._neg_view(u))),
        ("g of another dtype", lambda g, u: (g.long(), u)),
        ("u of another dtype", lambda g, u: (g, u.half())),
        ("u on another device", lambda g, u: (g, u.to("meta"))),
        ("u of another shape", lambda g, u: (g, u[..., :-1])),
        ("g's last dimension strided", lambda g, u: (torch.randn(1, 1, 2 * g.shape[-1], device=dev)[..., ::2], u)),
        ("rows that cannot be viewed", lambda g, u: (torch.randn(4, 2, 6, device=dev).transpose(0, 1)[..., :5],
                                                     torch.randn(2, 4, 5, device=dev))),
        ("u not a tensor", lambda g, u: (g, [0.0])),
    ]  # fmt: skip


@pytest.mark.parametrize("bad", [c[1] for c in _swiglu_bad_after_good()], ids=[c[0] for c in _swiglu_bad_after_good()])
def test_a_bad_call_after_good_ones_of_the_same_shape_still_raises(bad):
    import fusionlab.kernels.swiglu as SG

    g, u = _halves(5, seed=63)
    bg, bu = bad(g, u)
    SG._PLANS.clear()
    fresh = refusal(lambda: swiglu(bg, bu))
    good = [(g, u)]
    if isinstance(bg, torch.Tensor) and isinstance(bu, torch.Tensor) and bg.dim() == 3 and bg.shape == bu.shape:
        good.append((torch.randn(bg.shape, device=g.device), torch.randn(bu.shape, device=g.device)))
    with torch.no_grad():
        for _ in range(2):  # the second good call launches the kept plan
            for a, b in good:
                swiglu(a, b)
    assert len(SG._PLANS) == len(good)
    with torch.no_grad():
        assert refusal(lambda: swiglu(bg, bu)) == fresh
