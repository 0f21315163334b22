"""Lesson 6's linear layer with its epilogue: ``act(x W^T + b) + r`` against float64, in one launch,
bias along the right axis, each activation, residual, M = 1, bias absent; ledger; clear errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close_rel, gpu_only

from fusionlab import runtime
from fusionlab.grading import Sandbox
from fusionlab.kernels import KernelInputError
from fusionlab.kernels.linear import (
    ACTIVATIONS,
    linear,
    linear_config,
    linear_eager,
    linear_flops,
    linear_ledger,
    linear_reference,
)

GPU = runtime.is_gpu()
HOPPER = GPU and torch.cuda.get_device_capability() >= (9, 0)

pytestmark = [
    # the interpreter's sigmoid is numpy's 1 / (1 + exp(-z)): exp overflows to inf for z << 0, the
    # result is the right 0, and numpy warns
    pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning"),
]

# (M, K, N): M != N everywhere, so a bias added along the wrong axis reads the wrong numbers (or
# past the end) and fails the comparison
SHAPES = [
    (1, 33, 17),  # a GEMV: one row of x
    (65, 127, 129),  # ragged in M, N and K
    (20, 257, 48),  # K = 257: the last K step is one element wide
    (64, 64, 32),  # tiles divide the problem (interpreter): unmasked K
]
DTYPES = [
    pytest.param(torch.float32, *((2e-3, 1e-2) if GPU else (1e-6, 1e-5)), id="fp32"),
    pytest.param(torch.float16, 1e-3, 4e-3, id="fp16"),
]
if torch.bfloat16 in runtime.DTYPES:
    DTYPES.append(pytest.param(torch.bfloat16, 8e-3, 3e-2, id="bf16"))


def _inputs(M, K, N, dtype, seed=0, residual=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(N, K, generator=g) / K**0.5  # outputs ~ N(0, 1): GELU's curve and both tails
    b = torch.randn(N, generator=g)
    r = torch.randn(M, N, generator=g) if residual else None
    to = lambda t: None if t is None else t.to(runtime.DEVICE, dtype)  # noqa: E731
    return to(x), to(w), to(b), to(r)


@pytest.mark.parametrize("activation", list(ACTIVATIONS))
@pytest.mark.parametrize("dtype,norm_tol,elem_tol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_bias_and_activation_in_one_launch(shape, dtype, norm_tol, elem_tol, activation):
    x, w, b, _ = _inputs(*shape, dtype)
    with Sandbox() as box:
        y = linear(x, w, b, activation)
    assert box.writes_past_the_end() is None
    assert_close_rel(y, linear_reference(x, w, b, activation), norm_tol, elem_tol)
    assert box.names == ["_matmul_kernel"], "one kernel: matmul and epilogue together"
    assert box.torch_ops == [] and box.passes == []


@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("dtype,norm_tol,elem_tol", DTYPES[:2])
def test_no_bias_and_residual(dtype, norm_tol, elem_tol, activation):
    x, w, _, r = _inputs(37, 80, 50, dtype, seed=1, residual=True)
    for bias, residual in [(None, None), (None, r)]:
        with Sandbox() as box:
            y = linear(x, w, bias, activation, residual)
        assert box.names == ["_matmul_kernel"] and box.torch_ops == []
        assert_close_rel(y, linear_reference(x, w, bias, activation, residual), norm_tol, elem_tol)


def test_residual_with_bias_and_every_activation():
    x, w, b, r = _inputs(33, 65, 40, torch.float32, seed=2, residual=True)
    tol = (2e-3, 1e-2) if GPU else (1e-6, 1e-5)
    for activation in ACTIVATIONS:
        assert_close_rel(linear(x, w, b, activation, r), linear_reference(x, w, b, activation, r), *tol)


def test_bias_is_per_output_feature():
    # a bias that is 0 except for feature 3: only column 3 of y may move, in every row
    x, w, _, _ = _inputs(24, 32, 40, torch.float32, seed=3)
    b = torch.zeros(40, device=runtime.DEVICE)
    b[3] = 100.0
    delta = linear(x, w, b) - linear(x, w)
    expected = torch.zeros_like(delta)
    expected[:, 3] = 100.0
    torch.testing.assert_close(delta, expected, atol=1e-3, rtol=0)


@pytest.mark.parametrize(
    "x_shape",
    [(33,), (1, 33), (2, 3, 33), (4, 1, 1, 33)],
    ids=["1-D (GEMV)", "one row", "3-D", "4-D"],
)
def test_leading_dimensions(x_shape):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(x_shape, generator=g).to(runtime.DEVICE)
    w = torch.randn(17, 33, generator=g).to(runtime.DEVICE)
    b = torch.randn(17, generator=g).to(runtime.DEVICE)
    r = torch.randn(*x_shape[:-1], 17, generator=g).to(runtime.DEVICE)
    y = linear(x, w, b, "gelu", r)
    assert y.shape == (*x_shape[:-1], 17)
    assert_close_rel(y, linear_reference(x, w, b, "gelu", r), *((2e-3, 1e-2) if GPU else (1e-6, 1e-5)))


def test_strided_x_and_residual():
    g = torch.Generator().manual_seed(5)
    big = torch.randn(40, 100, generator=g).to(runtime.DEVICE)
    x = big[::2, 10:74]  # (20, 64), row stride 200
    w = torch.randn(30, 64, generator=g).to(runtime.DEVICE)
    r = torch.randn(20, 50, generator=g).to(runtime.DEVICE)[:, 5:35]  # (20, 30), row stride 50
    with Sandbox() as box:
        y = linear(x, w, None, "silu", r)
    assert box.passes == []
    assert_close_rel(y, linear_reference(x, w, None, "silu", r), *((2e-3, 1e-2) if GPU else (1e-6, 1e-5)))


def test_k_zero_is_the_epilogue_of_zero():
    x = torch.randn(4, 0, device=runtime.DEVICE)
    w = torch.randn(6, 0, device=runtime.DEVICE)
    b = torch.randn(6, device=runtime.DEVICE)
    torch.testing.assert_close(linear(x, w, b, "gelu"), F.gelu(b).expand(4, 6))
    assert linear(torch.randn(0, 5, device=runtime.DEVICE), torch.randn(6, 5, device=runtime.DEVICE)).shape == (0, 6)


def test_eager_is_flinear_then_activation():
    x, w, b, r = _inputs(8, 16, 12, torch.float32, residual=True)
    torch.testing.assert_close(linear_eager(x, w, b, "gelu", r), F.gelu(F.linear(x, w, b)) + r)
    torch.testing.assert_close(linear_eager(x, w, None, "silu"), F.silu(F.linear(x, w)))


def test_ledger_unfused_and_fused():
    M, K, N = 8192, 4096, 16384
    led = linear_ledger(M, K, N, torch.bfloat16)
    # unfused: matmul (x, w, h), add (h, b, t), gelu (t, y); fused: x, w, b, y
    assert led.unfused_bytes == 2 * (M * K + N * K + M * N + M * N + N + M * N + M * N + M * N)
    assert led.fused_bytes == 2 * (M * K + N * K + N + M * N)
    assert [op.name for op in led.ops] == ["matmul", "add", "gelu"]
    bare = linear_ledger(M, K, N, torch.bfloat16, bias=False, activation=None)
    assert bare.unfused_bytes == bare.fused_bytes == 2 * (M * K + N * K + M * N)
    res = linear_ledger(M, K, N, torch.bfloat16, residual=True)
    assert res.fused_bytes == 2 * (M * K + N * K + N + 2 * M * N)
    tiled = linear_ledger(1000, 64, 300, torch.float16, block_m=128, block_n=128)
    assert tiled.fused_bytes == 2 * (1000 * 64 * 3 + 300 * 64 * 8 + 300 + 1000 * 300)


def test_flops_and_config():
    assert linear_flops(2, 3, 4) == 2 * 2 * 3 * 4 + 2 * 4 * 9
    assert linear_flops(2, 3, 4, bias=False, activation=None) == 48
    assert linear_config(16, 64, 64, torch.float16)["variant"] == "plain"


def _bad_inputs():
    dev = runtime.DEVICE
    X = lambda: torch.randn(8, 16, device=dev)  # noqa: E731
    W = lambda: torch.randn(4, 16, device=dev)  # noqa: E731
    return [
        ("weight K mismatch", lambda: (X(), torch.randn(4, 15, device=dev), None, None), {}, "features"),
        ("weight 1-D", lambda: (X(), torch.randn(16, device=dev), None, None), {}, "dimension"),
        ("bias on the wrong axis", lambda: (X(), W(), torch.randn(8, device=dev), None), {}, "bias"),
        ("bias 2-D", lambda: (X(), W(), torch.randn(1, 4, device=dev), None), {}, "dimension"),
        ("residual shape", lambda: (X(), W(), None, torch.randn(4, 8, device=dev)), {}, "residual"),
        ("residual dtype", lambda: (X(), W(), None, torch.randn(8, 4, device=dev).half()), {}, "dtype"),
        ("mixed dtypes", lambda: (X(), W().half(), None, None), {}, "dtype"),
        ("scalar x", lambda: (torch.tensor(1.0, device=dev), W(), None, None), {}, "dimension"),
        ("not a tensor", lambda: ([[1.0] * 16], W(), None, None), {}, "torch.Tensor"),
        (
            "x not viewable as rows",
            lambda: (torch.randn(2, 16, 4, device=dev).transpose(1, 2), W(), None, None),
            {},
            "contiguous",
        ),
        ("bad activation", lambda: (X(), W(), None, None), {"activation": "relu"}, "activation"),
        ("requires grad", lambda: (X(), W().requires_grad_(), None, None), {}, "grad"),
    ]


@pytest.mark.parametrize("make,kw,match", [c[1:] for c in _bad_inputs()], ids=[c[0] for c in _bad_inputs()])
def test_bad_inputs_raise(make, kw, match):
    x, w, b, r = make()
    with pytest.raises(KernelInputError, match=match):
        linear(x, w, b, residual=r, **kw)


# -- plans by call signature ------------------------------------------------------------------------
# A call whose signature (each tensor's type, device, dtype, shape, strides, negation flag,
# requires_grad and 16-byte alignment; the grad mode; the options) equals that of a call that passed
# every check skips the checks and runs the plan kept for it. Any other call must be checked in full:
# a bad call after good ones of the same shape raises what it raises on a fresh start.


FP32_TOL = (2e-3, 1e-2) if GPU else (1e-6, 1e-5)  # TF32 on a GPU


def _error(fn) -> str:
    with pytest.raises(KernelInputError) as err:
        fn()
    return str(err.value)


def test_a_repeated_call_runs_its_plan_without_the_checks(monkeypatch):
    import fusionlab.kernels.linear as L

    x, w, _, r = _inputs(3, 40, 24, torch.float32, residual=True)
    L._PLANS.clear()
    first = linear(x, w, residual=r)
    assert len(L._PLANS) == 1
    calls, check = [], L.check_linear_args
    monkeypatch.setattr(L, "check_linear_args", lambda *a: calls.append(a) or check(*a))
    x2, w2, _, r2 = _inputs(3, 40, 24, torch.float32, seed=1, residual=True)  # other tensors, same signature
    y = linear(x2, w2, residual=r2)
    assert not calls
    assert_close_rel(y, linear_reference(x2, w2, residual=r2), *FP32_TOL)
    assert_close_rel(linear(x, w, residual=r), first, 0, 0)
    # the same shapes through another signature (a row-strided x): not the kept plan, checked in full
    xs = torch.empty(3, 48, device=x.device)[:, :40].copy_(x)
    assert_close_rel(linear(xs, w, residual=r), first, 0, 0)
    assert len(calls) == 1 and len(L._PLANS) == 2


def _bad_after_good():
    """(name, a bad call's x, w, bias, residual, kwargs made from a good call's tensors) whose signature
    differs from the good call's in one field only."""
    return [
        ("negated x", lambda x, w, r: (torch._neg_view(x), w, None, r, {})),
        ("negated weight", lambda x, w, r: (x, torch._neg_view(w), None, r, {})),
        ("negated residual", lambda x, w, r: (x, w, None, torch._neg_view(r), {})),
        ("x of another dtype", lambda x, w, r: (x.double(), w, None, r, {})),
        ("weight of another dtype", lambda x, w, r: (x, w.half(), None, r, {})),
        ("x on another device", lambda x, w, r: (x.to("meta"), w, None, r, {})),
        ("x requires grad", lambda x, w, r: (x.detach().requires_grad_(), w, None, r, {})),
        ("weight requires grad", lambda x, w, r: (x, w.detach().requires_grad_(), None, r, {})),
        ("x neither rows nor columns contiguous", lambda x, w, r: (torch.randn(3, 80, device=x.device)[:, ::2], w,
                                                                   None, r, {})),
        ("a complex x, conjugated", lambda x, w, r: (torch.randn(3, 40, dtype=torch.complex64, device=x.device).conj(),
                                                     w, None, r, {})),
        ("bias not a tensor", lambda x, w, r: (x, w, 1.0, r, {})),
        ("residual not a tensor", lambda x, w, r: (x, w, None, [0.0], {})),
        ("another activation", lambda x, w, r: (x, w, None, r, {"activation": "relu"})),
        ("an activation that is not a str", lambda x, w, r: (x, w, None, r, {"activation": 3})),
        ("another variant", lambda x, w, r: (x, w, None, r, {"variant": "tma"})),
        ("another precision", lambda x, w, r: (x, w, None, r, {"input_precision": "fp8"})),
    ]  # fmt: skip


@pytest.mark.parametrize("bad", [c[1] for c in _bad_after_good()], ids=[c[0] for c in _bad_after_good()])
def test_a_bad_call_after_good_ones_of_the_same_shape_still_raises(bad):
    import fusionlab.kernels.linear as L

    x, w, _, r = _inputs(3, 40, 24, torch.float32, residual=True)
    bx, bw, bb, br, kw = bad(x, w, r)
    L._PLANS.clear()
    fresh = _error(lambda: linear(bx, bw, bb, residual=br, **kw))
    for _ in range(2):  # the second good call runs the kept plan
        linear(x, w, residual=r)
    assert len(L._PLANS) == 1
    assert _error(lambda: linear(bx, bw, bb, residual=br, **kw)) == fresh


def test_a_weight_that_requires_grad_is_refused_once_grad_mode_is_on():
    # linear has no backward: under no_grad a weight that requires grad is fine, with grad on it is not,
    # whatever plans the no_grad calls kept
    import fusionlab.kernels.linear as L

    x, w, _, _ = _inputs(2, 32, 16, torch.float32)
    w.requires_grad_(True)
    L._PLANS.clear()
    with torch.no_grad():
        linear(x, w)
        linear(x, w)
    with pytest.raises(KernelInputError, match="requires grad"):
        linear(x, w)


def test_a_tensor_changed_in_place_takes_its_new_layout():
    # the plan is looked up by the tensor's metadata on each call, never by the tensor object
    import fusionlab.kernels.linear as L

    x, w, _, _ = _inputs(4, 32, 24, torch.float32)
    L._PLANS.clear()
    linear(x, w)
    linear(x, w)
    buf = torch.randn(4 * 64, device=x.device)
    y = buf[:128].view(4, 32)
    linear(y, w)
    y.as_strided_((4, 32), (64, 1), 1)  # the same tensor object: rows 64 apart, one element in (unaligned)
    assert_close_rel(linear(y, w), linear_reference(y, w), *FP32_TOL)
    w_t = w.t().contiguous().t()  # the weight column-major: the same shape, other strides
    assert_close_rel(linear(x, w_t), linear_reference(x, w_t), *FP32_TOL)
    assert len(L._PLANS) == 3


def test_misaligned_inputs_of_a_kept_shape_compute_the_right_values():
    import fusionlab.kernels.linear as L

    x, w, b, r = _inputs(2, 24, 40, torch.float16, residual=True)
    L._PLANS.clear()
    linear(x, w, b, residual=r)
    buf = torch.randn(2 * 24 + 1, device=x.device).half()
    xm = buf[1:].view(2, 24).copy_(x)  # 2 bytes past a 16-byte boundary
    assert xm.data_ptr() % 16
    assert_close_rel(linear(xm, w, b, residual=r), linear_reference(x, w, b, residual=r), 1e-3, 4e-3)
    assert len(L._PLANS) == 2


# -- GPU ------------------------------------------------------------------------------------------
@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_4095_cubed_bias_gelu_against_float64(dtype):
    x, w, b, _ = _inputs(4095, 4095, 4095, dtype, seed=6)
    y = linear(x, w, b, "gelu")
    tol = (1e-3, 4e-3) if dtype == torch.float16 else (8e-3, 3e-2)
    assert_close_rel(y, linear_reference(x, w, b, "gelu"), *tol)


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("M", [1, 7])
def test_gemv_k_8193(M):
    x, w, b, _ = _inputs(M, 8193, 1000, torch.bfloat16, seed=7)
    assert_close_rel(linear(x, w, b, "gelu"), linear_reference(x, w, b, "gelu"), 8e-3, 3e-2)
    assert_close_rel(linear(x, w), linear_reference(x, w), 8e-3, 3e-2)


@pytest.mark.gpu
@gpu_only
@pytest.mark.skipif(not HOPPER, reason="the TMA path needs a Hopper GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_tma_path_epilogues(dtype):
    # aligned rows, ragged M, N and K (multiples of 16 like the benchmark shapes): the Hopper kernel
    # with each epilogue flag under one config (each flag combination compiles once), then the
    # autotuned default for bias + GELU, then the plain kernel for comparison
    M, K, N = 1008, 1040, 1040
    x, w, b, r = _inputs(M, K, N, dtype, seed=8, residual=True)
    tol = (1e-3, 4e-3) if dtype == torch.float16 else (8e-3, 3e-2)
    cfg = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "num_stages": 3, "num_warps": 8}
    cases = [(a, b, None) for a in ACTIVATIONS] + [("gelu", b, r), (None, None, r)]
    for activation, bias, residual in cases:
        with Sandbox() as box:
            y = linear(x, w, bias, activation, residual, config=cfg)
        assert box.names == ["_matmul_tma_kernel"] and box.writes_past_the_end() is None
        assert_close_rel(y, linear_reference(x, w, bias, activation, residual), *tol)
    y = linear(x, w, b, "gelu")
    assert_close_rel(y, linear_reference(x, w, b, "gelu"), *tol)
    assert_close_rel(linear(x, w, b, "gelu", variant="plain"), y, *tol)


@pytest.mark.gpu
@gpu_only
def test_a_kept_plan_launches_through_the_launchers_hit_path():
    # the plan's launcher key (interned once) finds the compiled kernel on the Launcher's direct path, on
    # the current device the signature asked for, and the repeated call's bits are the first call's
    import fusionlab.kernels.linear as L
    import fusionlab.kernels.matmul as MM

    x, w, _, r = _inputs(2, 64, 48, torch.float16, residual=True)
    L._PLANS.clear()
    first = linear(x.view(1, 2, 64), w, residual=r.view(1, 2, 48))
    again = linear(x.view(1, 2, 64), w, residual=r.view(1, 2, 48))
    (plan,) = L._PLANS._plans.values()
    assert plan.keys and all((k, torch.cuda.current_device()) in MM._launch_plain._compiled for k in plan.keys.values())
    assert torch.equal(first, again) and first.shape == (1, 2, 48)
    assert_close_rel(again.view(2, 48), linear_reference(x, w, residual=r), 1e-3, 4e-3)


@pytest.mark.gpu
@gpu_only
@pytest.mark.skipif(not HOPPER, reason="the TMA path needs a Hopper GPU")
def test_a_tma_call_keeps_no_plan_and_takes_leading_dimensions():
    # the TMA path builds descriptors from the (M, K) and (K, N) tensors themselves: not kept; its output
    # is allocated as (..., N) and described as its (M, N) rows
    import fusionlab.kernels.linear as L

    x, w, b, r = _inputs(256, 128, 256, torch.float16, residual=True)
    L._PLANS.clear()
    for _ in range(2):
        y = linear(x.view(2, 128, 128), w, b, residual=r.view(2, 128, 256))
        assert y.shape == (2, 128, 256)
        assert_close_rel(y.view(256, 256), linear_reference(x, w, b, residual=r), 1e-3, 4e-3)
    assert len(L._PLANS) == 0
