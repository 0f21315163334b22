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
