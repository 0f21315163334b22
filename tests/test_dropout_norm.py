"""Residual + dropout + norm (fusionlab/kernels/dropout_norm.py): values against float64 forward and
backward, the mask's statistics, its reproducibility whatever the tiling, and its streams."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fusionlab import _triton, runtime
from fusionlab.kernels import KernelInputError
from fusionlab.kernels import dropout_norm as D

DEV = runtime.DEVICE
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if runtime.is_gpu() else [])
TOL = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 6e-2}


def _inputs(shape, dtype, norm, grad=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, r = (torch.randn(shape, generator=g).to(DEV, dtype) for _ in range(2))
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).to(DEV, dtype)
    b = (0.1 * torch.randn(shape[-1], generator=g)).to(DEV, dtype) if norm == "layernorm" else None
    ins = [x, r, w] + ([b] if b is not None else [])
    return [t.requires_grad_(grad) for t in ins]


def _bias(a):
    return a[3] if len(a) > 3 else None


def _values_and_grads(fn, ins, gy, gh):
    y, h = fn(*ins)
    grads = torch.autograd.grad((y, h), ins, (gy, gh))
    return (y, h, *grads)


@pytest.mark.parametrize("norm", D.NORMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape,cfg",
    [((3, 37), None), ((2, 3, 64), None), ((3, 100), {"BLOCK_N": 16}),
     pytest.param((257, 4096), None, marks=pytest.mark.skipif(not runtime.is_gpu(), reason="GPU launch table"))],
)  # fmt: skip
def test_forward_and_backward_match_float64(norm, dtype, shape, cfg):
    """Odd widths (a partial quad of four), leading dimensions, and the wide path (BLOCK_N < N); on a GPU,
    hidden 4096 at the GPU's own launch (an H200's: two rows a step, the last step half full)."""
    ins = _inputs(shape, dtype, norm)
    kw = dict(norm=norm, seed=1234, offset=5)
    gy, gh = torch.randn(shape, device=DEV, dtype=dtype), torch.randn(shape, device=DEV, dtype=dtype)
    got = _values_and_grads(lambda *a: D.dropout_norm(*a[:3], _bias(a), 0.25, fwd_config=cfg, bwd_config=cfg, **kw),
                            ins, gy, gh)  # fmt: skip
    ref_ins = [t.detach().double().requires_grad_() for t in ins]
    want = _values_and_grads(lambda *a: D.dropout_norm_reference(*a[:3], _bias(a), 0.25, **kw), ref_ins,
                             gy.double(), gh.double())  # fmt: skip
    tol = TOL[dtype]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        scale = 1 + w.abs().max().item() if i >= 4 else 1  # dw, db: sums over rows
        torch.testing.assert_close(g.double(), w.double(), atol=tol * scale, rtol=tol, msg=lambda m, i=i: f"{i}: {m}")


def test_the_mask_is_regenerated_in_the_backward():
    """dx is dh where the forward kept x (times 1/(1-p)) and exactly 0 where it dropped it."""
    p = 0.4
    x, r, w = _inputs((8, 64), torch.float32, "rmsnorm")
    y, h = D.dropout_norm(x, r, w, None, p, norm="rmsnorm", seed=99)
    dx, dr = torch.autograd.grad(h.sum() + 0 * y.sum(), (x, r))
    keep = D.dropout_keep_reference((8, 64), p, 99).to(DEV)
    assert torch.equal(dr, torch.ones_like(dr))
    assert torch.equal(dx == 0, ~keep)
    torch.testing.assert_close(dx[keep], torch.full_like(dx[keep], 1 / (1 - p)))
    # and the forward applied that same mask, scaled
    with torch.no_grad():
        _, h2 = D.dropout_norm(x, r, w, None, p, norm="rmsnorm", seed=99)
    torch.testing.assert_close(h2, r + torch.where(keep, x / (1 - p), 0.0))


@pytest.mark.parametrize("used", ["h only", "y only", "strided grads"])
def test_backward_with_one_output_or_strided_gradients(used):
    """The backward reads dy and grad_h as row-contiguous tensors: a missing one (autograd passes None) or a
    row-strided or expanded one gives the gradients of the float64 spec all the same."""
    ins = _inputs((6, 48), torch.float32, "layernorm")
    wide = torch.randn(6, 96, device=DEV)
    gy, gh = wide[:, ::2], wide[:, 1::2]  # non-unit last stride: copied; then row-contiguous

    def loss(fn, a):
        y, h = fn(*a)
        if used == "h only":
            return (h * gh).sum()
        if used == "y only":
            return y.sum()  # an expanded gradient
        return (y * gy).sum() + (h * gh[:, :1]).sum()  # and a stride-0 column broadcast

    kw = dict(seed=5, offset=3)
    got = torch.autograd.grad(loss(lambda *a: D.dropout_norm(*a, 0.3, **kw), ins), ins, allow_unused=True)
    ref = [t.detach().double().requires_grad_() for t in ins]
    want = torch.autograd.grad(loss(lambda *a: D.dropout_norm_reference(*a, 0.3, **kw), ref), ref, allow_unused=True)
    for g, w in zip(got, want, strict=True):
        w = torch.zeros_like(g, dtype=torch.float64) if w is None else w  # h alone: dw = db = 0
        torch.testing.assert_close(g.double(), w, atol=1e-4 * (1 + w.abs().max().item()), rtol=1e-4)


@pytest.mark.parametrize("p", [0.3, 0.75, 0.999])  # 0.75, 0.999: round(p 2**31) past 2**30 (doubled: past 2**31)
def test_kernel_philox_is_the_numpy_philox(p):
    """The kernel's keep mask, read off h with x = 1 and r = 0, is the one numpy's Philox gives; the
    backward's (dx zero where dropped) too."""
    shape = (16, 250)
    ones, zeros = torch.ones(shape, device=DEV), torch.zeros(shape, device=DEV)
    w = torch.ones(250, device=DEV)
    for seed, offset in ((0, 0), (2**40 + 3, 2**33)):  # a seed past 32 bits, a counter past 32 bits
        x = ones.clone().requires_grad_()
        _, h = D.dropout_norm(x, zeros, w, None, p, norm="rmsnorm", seed=seed, offset=offset)
        want = D.dropout_keep_reference(shape, p, seed, offset)
        assert torch.equal((h != 0).cpu(), want)
        (dx,) = torch.autograd.grad(h, x, ones)
        assert torch.equal((dx != 0).cpu(), want)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_within_binomial_bounds_and_scaling(p):
    shape = (64, 512)
    n = math.prod(shape)
    ones, zeros = torch.ones(shape, device=DEV), torch.zeros(shape, device=DEV)
    _, h = D.dropout_norm(ones, zeros, torch.ones(512, device=DEV), None, p, norm="rmsnorm", seed=7)
    kept = (h != 0).sum().item()
    sd = math.sqrt(n * p * (1 - p))
    assert abs(kept - n * (1 - p)) < 5 * sd, (kept, n * (1 - p), sd)  # 5 sigma: a false alarm ~1e-6
    torch.testing.assert_close(h[h != 0], torch.full_like(h[h != 0], 1 / (1 - p)))  # the 1/(1-p) scaling
    assert abs(h.mean().item() - 1) < 5 * math.sqrt(p / (1 - p) / n)  # the expectation is kept


def test_p_zero_and_eval_are_exact():
    x, r, w, b = _inputs((4, 96), torch.float32, "layernorm", grad=False)
    want_y, want_h = D.dropout_norm_reference(x, r, w, b, 0.0)
    assert torch.equal(want_h, r + x)
    for kw in (dict(p=0.0), dict(p=0.5, training=False)):
        y, h = D.dropout_norm(x, r, w, b, **kw)
        assert torch.equal(h, r + x)
        torch.testing.assert_close(y, want_y, atol=1e-5, rtol=1e-5)


def test_p_outside_zero_one_is_refused():
    x, r, w = _inputs((2, 16), torch.float32, "rmsnorm", grad=False)
    for p in (1.0, -0.1, 1.5, float("nan"), "0.1", True):
        with pytest.raises(KernelInputError, match=r"\[0, 1\)"):
            D.dropout_norm(x, r, w, None, p, norm="rmsnorm")
    with pytest.raises(KernelInputError, match="norm"):
        D.dropout_norm(x, r, w, None, 0.1, norm="batchnorm")
    with pytest.raises(KernelInputError, match="seed"):
        D.dropout_norm(x, r, w, None, 0.1, norm="rmsnorm", seed=-1)


@pytest.mark.parametrize("cfg", [{"BLOCK_N": 32}, {"BLOCK_M": 1}, {"BLOCK_M": 4, "BLOCK_N": 256}])
def test_same_seed_same_mask_whatever_the_tiling(cfg):
    shape = (6, 100)
    ones, zeros = torch.ones(shape, device=DEV), torch.zeros(shape, device=DEV)
    w = torch.ones(100, device=DEV)
    _, base = D.dropout_norm(ones, zeros, w, None, 0.5, norm="rmsnorm", seed=42)
    _, h = D.dropout_norm(ones, zeros, w, None, 0.5, norm="rmsnorm", seed=42, fwd_config=cfg)
    assert torch.equal(h, base)
    # the backward's regenerated mask, under another tiling, too
    x = ones.clone().requires_grad_()
    _, h = D.dropout_norm(x, zeros, w, None, 0.5, norm="rmsnorm", seed=42, bwd_config={**cfg, "programs": 3})
    (dx,) = torch.autograd.grad(h.sum(), x)
    assert torch.equal(dx != 0, base != 0)


def test_streams_differ_by_seed_offset_and_call():
    shape = (8, 128)
    ones, zeros = torch.ones(shape, device=DEV), torch.zeros(shape, device=DEV)
    w = torch.ones(128, device=DEV)

    def mask(**kw):
        return D.dropout_norm(ones, zeros, w, None, 0.5, norm="rmsnorm", **kw)[1] != 0

    a = mask(seed=1)
    assert torch.equal(a, mask(seed=1))
    for other in (mask(seed=2), mask(seed=1, offset=D.philox_counters(shape)), mask(), mask()):
        agree = (a == other).float().mean().item()
        assert 0.3 < agree < 0.7, agree  # independent masks agree about half the time
    # a layer that starts where this one's counters end overlaps none of them: row 0 of a taller call
    tall = D.dropout_norm(torch.ones(16, 128, device=DEV), torch.zeros(16, 128, device=DEV), w, None, 0.5,
                          norm="rmsnorm", seed=1)[1] != 0  # fmt: skip
    assert torch.equal(tall[:8], a) and torch.equal(tall[8:], mask(seed=1, offset=D.philox_counters(shape)))
    torch.manual_seed(3)
    s1 = mask()
    torch.manual_seed(3)
    assert torch.equal(s1, mask()), "seed=None follows torch.manual_seed"


def test_one_launch_forward_and_no_mask_saved():
    x, r, w, b = _inputs((4, 64), torch.float32, "layernorm")
    names = []
    with _triton.launch_hook(lambda launch: names.append(launch.name)):
        y, h = D.dropout_norm(x, r, w, b, 0.2)
    assert names == ["_dropout_norm_fwd_kernel"]
    saved = [t for t in y.grad_fn.saved_tensors]
    assert not any(t.dtype == torch.bool or t.dtype == torch.uint8 for t in saved)
    assert sum(t.numel() for t in saved) <= 4 * 64 + 64 + 8  # h, w, mean, rstd: no mask


def test_ledger_counts_the_mask_eager_and_not_fused():
    fwd = D.dropout_norm_ledger(4096, 4096, torch.bfloat16)
    bwd = D.dropout_norm_ledger(4096, 4096, torch.bfloat16, backward=True, grad_h=False)
    rn = 4096 * 4096
    assert fwd.fused_bytes == 4 * rn * 2 + 2 * 4096 * 4 + 2 * 4096 * 2  # x, r, w, b in; h, y, mean, rstd out
    assert any(t.tensor == "mask" for t in fwd.trips(fused=False))
    assert not any(t.tensor == "mask" for t in fwd.trips(fused=True) + bwd.trips(fused=True))
    assert np.isclose(bwd.fused_bytes, 4 * rn * 2 + 2 * 4096 * 4 + 4096 * 2)  # dy, h in; dh, dx out


def test_backward_configuration_by_what_the_gpu_can_do():
    """A GPU whose DRAM outruns its SMs (an H200, by its bandwidth) takes the backward launch measured there
    at the widths it lists, for 16-bit rows; an H100, fp32 rows and every forward keep the rule by elements a
    thread."""
    bf16, fast = torch.bfloat16, D.GPU_TUNING["fast_bwd"]
    for n, want in fast.items():
        h200 = D.dropout_norm_config(32768, n, bf16, backward=True, gpu=True, device="NVIDIA H200")
        assert {k: h200[k] for k in want} == want
        h100 = D.dropout_norm_config(32768, n, bf16, backward=True, gpu=True, device="NVIDIA H100 80GB HBM3")
        assert h100 != h200 and h100["BLOCK_M"] == 1
        assert D.dropout_norm_config(32768, n, bf16, gpu=True, device="NVIDIA H200")["BLOCK_M"] == 1
        fp32 = D.dropout_norm_config(32768, n, torch.float32, backward=True, gpu=True, device="NVIDIA H200")
        assert fp32["BLOCK_M"] == 1  # measured with 16-bit rows only


# -- plans by call signature ---------------------------------------------------------------------------------
# A call whose tensors' signature (type, device, dtype, shape, strides, negation flag, requires_grad,
# 16-byte alignment; the grad mode), p, eps, norm and training equal those of a call that passed every check,
# without overrides, launches that call's plan (D._PLANS) without the checks; its seed and offset are its own.
# Any other call is checked in full: a bad call after good ones of the same shape raises what it raises on a
# fresh start. An override (even {}) takes the full path every time: the reference the kept plans must match.
def _error(fn) -> str:
    with pytest.raises(KernelInputError) as err:
        fn()
    return str(err.value)


def _counting_checks(monkeypatch) -> list:
    calls, check = [], D.check_tensor
    monkeypatch.setattr(D, "check_tensor", lambda *a, **k: calls.append(a[1]) or check(*a, **k))
    return calls


@pytest.mark.parametrize("grad", [False, True], ids=["no_grad", "autograd"])
def test_a_kept_plan_gives_the_full_paths_bits_without_the_checks(grad, monkeypatch):
    D._PLANS.clear()
    kw = dict(p=0.3, seed=2**40 + 3, offset=7)
    first = _inputs((2, 3, 40), torch.float32, "layernorm", grad=grad)
    with torch.set_grad_enabled(grad):
        D.dropout_norm(*first, **kw)
        assert len(D._PLANS) == 1
        calls = _counting_checks(monkeypatch)
        ins = _inputs((2, 3, 40), torch.float32, "layernorm", grad=grad, seed=1)  # other tensors, one signature
        kept = D.dropout_norm(*ins, **kw)
        assert not calls, "a kept plan's call checks nothing again"
        full = D.dropout_norm(*ins, **kw, fwd_config={}, bwd_config={})
    assert calls and len(D._PLANS) == 1
    for a, b in zip(kept, full, strict=True):
        assert torch.equal(a, b) and a.shape == (2, 3, 40) and a.requires_grad == grad
    if grad:
        gy, gh = torch.randn(2, 3, 40, device=DEV), torch.randn(2, 3, 40, device=DEV)
        want = torch.autograd.grad(full, ins, (gy, gh))
        for a, b in zip(torch.autograd.grad(kept, ins, (gy, gh)), want, strict=True):
            assert torch.equal(a, b)


def _bad_after_good():
    """(name, a bad call's (x, residual, weight, bias, keywords) made from a good call's tensors): each
    differs from a kept call in one argument only."""
    return [
        ("x of another dtype", lambda x, r, w, b: (x.half(), r, w, b, {})),
        ("x and residual as integers", lambda x, r, w, b: (x.long(), r.long(), w, b, {})),
        ("negated x", lambda x, r, w, b: (torch._neg_view(x), r, w, b, {})),
        ("negated residual", lambda x, r, w, b: (x, torch._neg_view(r), w, b, {})),
        ("negated weight", lambda x, r, w, b: (x, r, torch._neg_view(w), b, {})),
        ("x on another device", lambda x, r, w, b: (x.to("meta"), r, w, b, {})),
        ("x's last dimension strided", lambda x, r, w, b: (torch.randn(2, 3, 80, device=DEV)[..., ::2], r, w, b, {})),
        ("weight of another length", lambda x, r, w, b: (x, r, w[:-1], b, {})),
        ("a bias with RMSNorm", lambda x, r, w, b: (x, r, w, b, {"norm": "rmsnorm"})),
        ("p 1", lambda x, r, w, b: (x, r, w, b, {"p": 1.0})),
        ("p negative", lambda x, r, w, b: (x, r, w, b, {"p": -0.1})),
        ("p nan", lambda x, r, w, b: (x, r, w, b, {"p": math.nan})),
        ("p False after p 0", lambda x, r, w, b: (x, r, w, b, {"p": False})),
        ("p a string", lambda x, r, w, b: (x, r, w, b, {"p": "0.1"})),
        ("eps True after eps 1", lambda x, r, w, b: (x, r, w, b, {"eps": True})),
        ("eps nan", lambda x, r, w, b: (x, r, w, b, {"eps": math.nan})),
        ("eps negative", lambda x, r, w, b: (x, r, w, b, {"eps": -1e-5})),
        ("norm unknown", lambda x, r, w, b: (x, r, w, b, {"norm": "batchnorm"})),
        ("norm a list", lambda x, r, w, b: (x, r, w, b, {"norm": ["layernorm"]})),
        ("training 1 after True", lambda x, r, w, b: (x, r, w, b, {"training": 1})),
        ("seed negative", lambda x, r, w, b: (x, r, w, b, {"seed": -1})),
        ("seed past 63 bits", lambda x, r, w, b: (x, r, w, b, {"seed": 2**63})),
        ("seed True", lambda x, r, w, b: (x, r, w, b, {"seed": True})),
        ("seed a float", lambda x, r, w, b: (x, r, w, b, {"seed": 1.0})),
        ("offset negative", lambda x, r, w, b: (x, r, w, b, {"offset": -1})),
        ("offset past 62 bits", lambda x, r, w, b: (x, r, w, b, {"offset": 2**62})),
        ("bad fwd_config", lambda x, r, w, b: (x, r, w, b, {"fwd_config": {"BLOCK_N": 2}})),
        ("bad bwd_config", lambda x, r, w, b: (x, r, w, b, {"bwd_config": {"programs": 0}})),
    ]  # fmt: skip


@pytest.mark.parametrize("bad", [c[1] for c in _bad_after_good()], ids=[c[0] for c in _bad_after_good()])
def test_a_bad_call_after_good_ones_of_the_same_shape_still_raises(bad):
    x, r, w, b = _inputs((2, 3, 40), torch.float32, "layernorm", grad=False)
    bx, br, bw, bb, bkw = bad(x, r, w, b)
    call = dict(p=0.2, norm="layernorm", eps=1e-5, training=True, seed=3, offset=0)
    D._PLANS.clear()
    with torch.no_grad():
        fresh = _error(lambda: D.dropout_norm(bx, br, bw, bb, **{**call, **bkw}))
        for _ in range(2):  # the second round launches the kept plans
            D.dropout_norm(x, r, w, b, **call)
            D.dropout_norm(x, r, w, b, **{**call, "p": 0, "eps": 1})  # (False == 0, True == 1 must not find these)
        assert len(D._PLANS) == 2
        assert _error(lambda: D.dropout_norm(bx, br, bw, bb, **{**call, **bkw})) == fresh


def _layouts(n):
    """(name, x, residual) in layouts the op takes: rows that view as (rows, N) in place, rows that do not
    (copied), stride-0 rows."""
    wide = torch.randn(2, 4, n, device=DEV)
    return [
        ("row-strided rows", torch.randn(6, 2 * n, device=DEV)[:, :n], torch.randn(6, n, device=DEV)),
        ("expanded rows", torch.randn(1, n, device=DEV).expand(6, n), torch.randn(6, n, device=DEV)),
        ("rows that do not merge", wide[:, :3], torch.randn(2, 3, n, device=DEV)),
        ("expanded, do not merge", torch.randn(1, 3, n, device=DEV).expand(2, 3, n), wide[:, 1:]),
    ]


@pytest.mark.parametrize("layout", range(4), ids=[c[0] for c in _layouts(8)])
def test_layouts_on_a_kept_plan_read_what_the_full_path_reads(layout):
    """Each layout twice (the second call launches its kept plan), then its contiguous twin (another
    signature: a plan of its own), then the layout again: the full path's bits and the float64 spec's
    values every time; with a gradient too, shaped like the layout's x."""
    _, x, r = _layouts(40)[layout]
    w = torch.randn(40, device=DEV)
    kw = dict(p=0.25, norm="rmsnorm", seed=11, offset=2)
    D._PLANS.clear()
    want_y, want_h = D.dropout_norm_reference(x.double(), r.double(), w.double(), None, **kw)
    for xs in (x, x, x.contiguous(), x):
        with torch.no_grad():
            got = D.dropout_norm(xs, r, w, None, **kw)
            full = D.dropout_norm(xs, r, w, None, **kw, fwd_config={})
        for g, f, want in zip(got, full, (want_y, want_h), strict=True):
            assert torch.equal(g, f) and g.shape == x.shape
            torch.testing.assert_close(g.double(), want, atol=TOL[torch.float32], rtol=TOL[torch.float32])
    assert len(D._PLANS) == 2
    xg, wg = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    grads = []
    for cfg in (None, None, {}):  # kept twice, then the full path
        y, h = D.dropout_norm(xg, r, wg, None, **kw, fwd_config=cfg)
        grads.append(torch.autograd.grad((y.sum() + (h * h).sum()), (xg, wg)))
    for got in grads[:2]:
        assert all(torch.equal(a, b) for a, b in zip(got, grads[2], strict=True))
    assert grads[0][0].shape == x.shape


def test_each_call_on_a_kept_plan_draws_its_own_stream():
    """The seed and offset are no part of a plan: on one kept plan, each (seed, offset) gives numpy Philox's
    mask in the forward and the backward, across the int32/int64 widths (a seed past 32 bits, an offset
    past 32 bits, and one whose counters pass 2**31); another seed another mask; seed=None a fresh one that
    follows torch.manual_seed."""
    shape, p = (16, 250), 0.3
    ones, zeros, w = torch.ones(shape, device=DEV), torch.zeros(shape, device=DEV), torch.ones(250, device=DEV)
    x = ones.clone().requires_grad_()
    D._PLANS.clear()
    masks = []
    for seed, offset in ((1, 0), (1, 0), (2, 0), (2**40 + 3, 2**33), (5, 2**31 - 8), (1, 0)):
        _, h = D.dropout_norm(x, zeros, w, None, p, norm="rmsnorm", seed=seed, offset=offset)
        want = D.dropout_keep_reference(shape, p, seed, offset)
        assert torch.equal((h != 0).cpu(), want), (seed, offset)
        (dx,) = torch.autograd.grad(h, x, ones)
        assert torch.equal((dx != 0).cpu(), want), (seed, offset)
        masks.append(want)
    assert len(D._PLANS) == 1
    (plan,) = D._PLANS._plans.values()
    assert len(plan.keys) == 3  # the launcher's keys by width: (32, 32, 32), (64, 64, 64), (32, 32, 64)
    agree = (masks[0] == masks[2]).float().mean().item()
    assert 0.3 < agree < 0.7, agree
    with torch.no_grad():
        fresh = [D.dropout_norm(ones, zeros, w, None, p, norm="rmsnorm")[1] != 0 for _ in range(2)]
        torch.manual_seed(3)
        again = D.dropout_norm(ones, zeros, w, None, p, norm="rmsnorm")[1] != 0
        torch.manual_seed(3)
        assert torch.equal(again, D.dropout_norm(ones, zeros, w, None, p, norm="rmsnorm")[1] != 0)
    assert 0.3 < (fresh[0] == fresh[1]).float().mean().item() < 0.7


def test_eval_and_p_zero_between_training_calls_on_kept_plans():
    """training=False after True, p = 0 after p > 0 (each its own plan): h = residual + x exactly; then
    training again: the mask of the seed."""
    x, r, w, b = _inputs((4, 96), torch.float32, "layernorm", grad=False)
    D._PLANS.clear()
    keep = D.dropout_keep_reference((4, 96), 0.5, 9)
    for kw in (dict(p=0.5), dict(p=0.5), dict(p=0.5, training=False), dict(p=0.0), dict(p=0), dict(p=0.5)):
        _, h = D.dropout_norm(x, r, w, b, seed=9, **kw)
        if kw.get("training", True) and kw["p"]:
            torch.testing.assert_close(h, r + torch.where(keep.to(DEV), x / 0.5, 0.0))
        else:
            assert torch.equal(h, r + x)
    assert len(D._PLANS) == 3  # p 0 and 0.0 share one


def test_the_backward_configuration_is_looked_up_only_for_a_gradient(monkeypatch):
    looked, real = [], D.dropout_norm_config

    def config(*a, **k):
        looked.append(k.get("backward", False))
        return real(*a, **k)

    monkeypatch.setattr(D, "dropout_norm_config", config)
    x, r, w = _inputs((4, 32), torch.float32, "rmsnorm")
    D._PLANS.clear()
    with torch.no_grad():
        for _ in range(2):
            D.dropout_norm(x, r, w, None, 0.1, norm="rmsnorm", seed=1)
    assert looked == [False]  # one forward lookup, for the plan; none for a backward under no_grad
    y, h = D.dropout_norm(x, r, w, None, 0.1, norm="rmsnorm", seed=1)
    assert looked == [False, False]  # the autograd path's own plan: still no backward
    y.sum().backward()
    assert looked == [False, False, True]
    with torch.no_grad():  # an override of the backward's is checked at the call, gradient or not
        D.dropout_norm(x, r, w, None, 0.1, norm="rmsnorm", seed=1, bwd_config={"programs": 2})
    assert looked[-1] is True
