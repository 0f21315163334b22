"""Lesson 6's RMSNorm prologue: rstd pre-pass + matmul on x with gamma folded into W and the row scale
in the epilogue. Against float64; where the fold is exact; rstd over the whole row; two launches."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_rel, gpu_only

from fusionlab import runtime
from fusionlab.grading import Sandbox
from fusionlab.kernels import KernelInputError
from fusionlab.kernels.rmsnorm_linear import (
    fold_rmsnorm_weight,
    rmsnorm_linear,
    rmsnorm_linear_bytes,
    rmsnorm_linear_config,
    rmsnorm_linear_eager,
    rmsnorm_linear_flops,
    rmsnorm_linear_ledger,
    rmsnorm_linear_reference,
    rmsnorm_rstd,
)

GPU = runtime.is_gpu()
HOPPER = GPU and torch.cuda.get_device_capability() >= (9, 0)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

SHAPES = [
    (1, 33, 17),  # one row: the pre-pass has one row to reduce, the matmul is a GEMV
    (65, 129, 127),  # ragged everywhere
    (20, 257, 48),  # K = 257: the matmul's last K step is 1 wide
]
# general gamma: one rounding of W * gamma to the storage dtype (or of xn, unfused) is the error
DTYPES = [
    pytest.param(torch.float32, *((2e-3, 1e-2) if GPU else (1e-6, 1e-5)), id="fp32"),
    pytest.param(torch.float16, 1.5e-3, 6e-3, id="fp16"),
]
if torch.bfloat16 in runtime.DTYPES:
    DTYPES.append(pytest.param(torch.bfloat16, 1e-2, 4e-2, id="bf16"))


def _inputs(M, K, N, dtype, seed=0, gamma="random"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g) * 3 + 0.5  # rows with an offset: rstd is not ~1
    w = torch.randn(N, K, generator=g) / K**0.5
    b = torch.randn(N, generator=g)
    if gamma == "pow2":  # 2**e, e in [0, 2]: W * gamma only shifts exponents up (scaling down could
        # push a small weight into fp16's subnormals and round it), so the fold is exact
        gm = 2.0 ** torch.randint(0, 3, (K,), generator=g).float()
    else:
        gm = torch.rand(K, generator=g) + 0.5
    to = lambda t: t.to(runtime.DEVICE, dtype)  # noqa: E731
    return to(x), to(gm), to(w), to(b)


@pytest.mark.parametrize("activation", [None, "gelu"])
@pytest.mark.parametrize("dtype,norm_tol,elem_tol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64_in_two_launches(shape, dtype, norm_tol, elem_tol, activation):
    x, gamma, w, b = _inputs(*shape, dtype)
    fw = fold_rmsnorm_weight(w, gamma)
    with Sandbox() as box:
        y = rmsnorm_linear(x, gamma, w, 1e-6, b, activation, folded_weight=fw)
    assert box.writes_past_the_end() is None
    assert box.names == ["_rmsnorm_rstd_kernel", "_matmul_kernel"], "pre-pass, then the matmul"
    assert box.torch_ops == [] and box.passes == [], "xn is never written; nothing runs in torch"
    assert_close_rel(y, rmsnorm_linear_reference(x, gamma, w, 1e-6, b, activation), norm_tol, elem_tol)


def _ulp16(t: torch.Tensor) -> torch.Tensor:
    """fp16's spacing at |t| (normal range)."""
    return torch.exp2(torch.floor(torch.log2(t.abs().clamp_min(2.0**-14))) - 10)


def test_fold_is_exact_with_power_of_two_gamma():
    # W * 2**e is exact in fp16, so the fused result differs from the float64 reference only by fp32
    # accumulation and rstd's few fp32 ulps: within one fp16 ulp of the reference, element by element
    x, gamma, w, _ = _inputs(48, 200, 40, torch.float16, seed=1, gamma="pow2")
    fw = fold_rmsnorm_weight(w, gamma)
    assert torch.equal(fw.double(), w.double() * gamma.double()), "the fold itself is exact"
    y = rmsnorm_linear(x, gamma, w, folded_weight=fw)
    exact = (
        x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * gamma.double()
    ) @ w.double().t()
    assert ((y.double() - exact).abs() <= _ulp16(exact)).all()


def test_fp32_is_exact_to_fp32_accumulation():
    x, gamma, w, b = _inputs(30, 96, 20, torch.float32, seed=2)
    y = rmsnorm_linear(x, gamma, w, 1e-5, b, input_precision="ieee")
    ref = rmsnorm_linear_reference(x, gamma, w, 1e-5, b)
    assert_close_rel(y, ref, *((1e-6, 1e-5)))


def test_general_gamma_rounds_once_like_the_unfused_path():
    # fp16: fused rounds W * gamma, unfused rounds xn; both land within the same tolerance of float64
    x, gamma, w, _ = _inputs(64, 256, 64, torch.float16, seed=3)
    ref = rmsnorm_linear_reference(x, gamma, w)
    fused = rmsnorm_linear(x, gamma, w)
    xn = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * gamma.float()).half()
    unfused = (xn.double() @ w.double().t()).half()
    err = lambda y: ((y.double() - ref.double()).norm() / ref.double().norm()).item()  # noqa: E731
    assert err(fused) < 1.5e-3 and err(unfused) < 1.5e-3
    assert not torch.equal(fused, unfused), "different roundings: not bit-identical"


@pytest.mark.parametrize("K", [1, 4097, 9000], ids=["one feature", "one past a row tile", "three row tiles"])
def test_rstd_walks_the_whole_row(K):
    # the pre-pass walks rows wider than its tile in pieces (interpreter tile: 4096 columns; GPU:
    # 2048): a statistic from one piece would be wrong on every row
    g = torch.Generator().manual_seed(4)
    x = torch.randn(3, K, generator=g).to(runtime.DEVICE)
    x[:, -1] = 50.0  # the last column dominates the mean of squares
    rstd = rmsnorm_rstd(x, 1e-6)
    ref = torch.rsqrt(x.double().pow(2).mean(-1) + 1e-6)
    torch.testing.assert_close(rstd.double(), ref, rtol=1e-6, atol=0)
    assert rstd.dtype == torch.float32


def test_rmsnorm_over_many_leading_dims_and_gemv():
    x, gamma, w, b = _inputs(6, 40, 24, torch.float32, seed=5)
    x3 = x.view(2, 3, 40)
    y = rmsnorm_linear(x3, gamma, w, 1e-6, b, "silu")
    assert y.shape == (2, 3, 24)
    tol = (2e-3, 1e-2) if GPU else (1e-6, 1e-5)
    assert_close_rel(y, rmsnorm_linear_reference(x3, gamma, w, 1e-6, b, "silu"), *tol)
    y1 = rmsnorm_linear(x[0], gamma, w)  # 1-D x: M = 1
    assert_close_rel(y1, rmsnorm_linear_reference(x[0], gamma, w), *tol)


def test_without_folded_weight_folds_in_torch():
    x, gamma, w, _ = _inputs(8, 32, 16, torch.float32, seed=6)
    with Sandbox() as box:
        y = rmsnorm_linear(x, gamma, w)
    assert box.names == ["_rmsnorm_rstd_kernel", "_matmul_kernel"]
    assert "mul" in box.torch_ops, "the fold ran in torch: pass folded_weight= to skip it"
    torch.testing.assert_close(y, rmsnorm_linear(x, gamma, w, folded_weight=fold_rmsnorm_weight(w, gamma)))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # inf * 0 = nan, as asked
def test_non_finite_row_gives_nan_like_the_reference():
    x, gamma, w, _ = _inputs(4, 32, 8, torch.float32, seed=7)
    x[1, 3] = float("inf")
    x[2, 0] = float("nan")
    y = rmsnorm_linear(x, gamma, w)
    ref = rmsnorm_linear_reference(x, gamma, w)
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    fin = torch.isfinite(ref)
    torch.testing.assert_close(y[fin], ref[fin], rtol=1e-2 if GPU else 1e-5, atol=1e-2 if GPU else 1e-5)


def test_eager_reference_agree():
    x, gamma, w, b = _inputs(8, 32, 16, torch.float32, seed=8)
    torch.testing.assert_close(
        rmsnorm_linear_eager(x, gamma, w, 1e-6, b, "gelu").double(),
        rmsnorm_linear_reference(x, gamma, w, 1e-6, b, "gelu").double(),
        rtol=1e-4,
        atol=1e-4,
    )


def test_ledger_and_bytes():
    M, K, N = 8192, 4096, 16384
    led = rmsnorm_linear_ledger(M, K, N, torch.bfloat16)
    # unfused: norm reads x, gamma, writes xn; matmul reads xn, w, writes y
    assert led.unfused_bytes == 2 * (M * K + K + M * K + M * K + N * K + M * N)
    # fused: what the two launches move: x twice, W', y, and M fp32 rstd written and read back
    assert led.fused_bytes == 2 * (2 * M * K + N * K + M * N) + 8 * M
    assert rmsnorm_linear_bytes(M, K, N, torch.bfloat16) == 2 * (2 * M * K + N * K + M * N) + 8 * M
    assert rmsnorm_linear_bytes(M, K, N, torch.bfloat16) < led.unfused_bytes
    gl = rmsnorm_linear_ledger(M, K, N, torch.bfloat16, bias=True, activation="gelu")
    assert [op.name for op in gl.ops] == ["rmsnorm", "matmul", "add", "gelu"]
    assert rmsnorm_linear_flops(2, 3, 4) == 2 * 2 * 3 * 4 + 2 * 2 * 3 + 2 * 4
    cfg = rmsnorm_linear_config(M, K, N, torch.bfloat16)
    assert cfg["rstd"]["BLOCK_N"] >= 16 and "variant" in cfg["matmul"]


def _bad_inputs():
    dev = runtime.DEVICE
    X = lambda: torch.randn(8, 16, device=dev)  # noqa: E731
    G = lambda: torch.rand(16, device=dev)  # noqa: E731
    W = lambda: torch.randn(4, 16, device=dev)  # noqa: E731
    return [
        ("gamma length", lambda: (X(), torch.rand(15, device=dev), W()), {}, "disagree"),
        ("weight K", lambda: (X(), G(), torch.randn(4, 15, device=dev)), {}, "disagree"),
        (
            "K = 0",
            lambda: (torch.randn(8, 0, device=dev), torch.rand(0, device=dev), torch.randn(4, 0, device=dev)),
            {},
            "zero",
        ),
        ("negative eps", lambda: (X(), G(), W()), {"eps": -1.0}, "eps"),
        ("folded weight shape", lambda: (X(), G(), W()), {"folded_weight": torch.randn(4, 8, device=dev)}, "shape"),
        ("bias length", lambda: (X(), G(), W()), {"bias": torch.randn(8, device=dev)}, "bias"),
        ("gamma dtype", lambda: (X(), G().half(), W()), {}, "dtype"),
        ("bad activation", lambda: (X(), G(), W()), {"activation": "tanh"}, "activation"),
    ]


@pytest.mark.parametrize("make,kw,match", [c[1:] for c in _bad_inputs()], ids=[c[0] for c in _bad_inputs()])
def test_bad_inputs_raise(make, kw, match):
    x, gamma, w = make()
    with pytest.raises(KernelInputError, match=match):
        rmsnorm_linear(x, gamma, w, **kw)


# -- GPU ------------------------------------------------------------------------------------------
@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_4095_against_float64(dtype):
    x, gamma, w, b = _inputs(4095, 4095, 4095, dtype, seed=9)
    fw = fold_rmsnorm_weight(w, gamma)
    y = rmsnorm_linear(x, gamma, w, 1e-6, b, "gelu", folded_weight=fw)
    tol = (1.5e-3, 6e-3) if dtype == torch.float16 else (1e-2, 4e-2)
    assert_close_rel(y, rmsnorm_linear_reference(x, gamma, w, 1e-6, b, "gelu"), *tol)


@pytest.mark.gpu
@gpu_only
@pytest.mark.skipif(not HOPPER, reason="the TMA path needs a Hopper GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_tma_path_row_scale(dtype):
    x, gamma, w, _ = _inputs(1008, 1040, 1040, dtype, seed=10)
    fw = fold_rmsnorm_weight(w, gamma)
    with Sandbox() as box:
        y = rmsnorm_linear(x, gamma, w, folded_weight=fw)
    assert box.names == ["_rmsnorm_rstd_kernel", "_matmul_tma_kernel"]
    tol = (1.5e-3, 6e-3) if dtype == torch.float16 else (1e-2, 4e-2)
    assert_close_rel(y, rmsnorm_linear_reference(x, gamma, w), *tol)
