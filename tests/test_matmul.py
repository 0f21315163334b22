"""Lesson 6's tiled matmul: right against float64 on awkward shapes, every element written, one launch,
fp32 accumulation, clear errors. GPU-only cases (marked ``gpu``) run the big shapes and the Hopper path."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close_rel, gpu_only

from fusionlab import runtime
from fusionlab.grading import Sandbox
from fusionlab.instrument import LaunchCounter
from fusionlab.kernels import KernelInputError
from fusionlab.kernels.matmul import (
    TMA_CONFIGS,
    matmul,
    matmul_config,
    matmul_eager,
    matmul_flops,
    matmul_ledger,
    matmul_reference,
)

GPU = runtime.is_gpu()
HOPPER = GPU and torch.cuda.get_device_capability() >= (9, 0)

# (M, K, N), each with the code path it hits
SHAPES = [
    (1, 33, 17),  # one row (a GEMV): 15 of 16 tile rows masked; K and N not multiples of anything
    (65, 127, 129),  # one past a tile in M and N, K one short of two tiles: every edge masked
    (5, 257, 9),  # K = 257: one element past a whole number of K steps (the last step is 1 wide)
    (64, 64, 64),  # the tiles divide the problem in the interpreter: the EVEN_K path, no K mask
    (3, 1, 5),  # K = 1: one K step, almost all masked
    (40, 300, 24),  # several K steps, and rows that are not a multiple of 16
]
# (dtype, norm-relative tolerance, element tolerance relative to max |ref|). fp32 in the interpreter
# is full fp32; on a GPU tl.dot rounds fp32 operands to TF32 (10-bit mantissa) by default.
DTYPES = [
    pytest.param(torch.float32, *((2e-3, 1e-2) if GPU else (1e-6, 1e-5)), id="fp32"),
    pytest.param(torch.float16, 1e-3, 4e-3, id="fp16"),
]
if torch.bfloat16 in runtime.DTYPES:
    DTYPES.append(pytest.param(torch.bfloat16, 8e-3, 3e-2, id="bf16"))


def _inputs(M, K, N, dtype, seed=0, device=None):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=g)
    b = torch.randn(K, N, generator=g)
    device = device or runtime.DEVICE
    return a.to(device, dtype), b.to(device, dtype)


def _run(fn, *args, **kw):
    with Sandbox() as box:
        y = fn(*args, **kw)
    assert box.writes_past_the_end() is None, "a store landed past the end of the output"
    return y, box


@pytest.mark.parametrize("dtype,norm_tol,elem_tol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64_in_one_launch(shape, dtype, norm_tol, elem_tol):
    a, b = _inputs(*shape, dtype)
    y, box = _run(matmul, a, b)
    assert_close_rel(y, matmul_reference(a, b), norm_tol, elem_tol)
    assert box.names == ["_matmul_kernel"]
    assert box.torch_ops == [] and box.passes == [], "the work must happen in the Triton kernel"


@pytest.mark.parametrize("group_m", [1, 2, 8])
def test_small_tiles_many_programs_grouped_order(group_m):
    # 16 x 16 tiles: 5 x 9 = 45 programs; with GROUP_M = 2 the last group of tile rows is short
    # (5 rows of tiles = 2 + 2 + 1), so a wrong group arithmetic leaves tiles unwritten or twice written
    a, b = _inputs(70, 50, 140, torch.float32, seed=1)
    cfg = {"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": group_m}
    y, _ = _run(matmul, a, b, variant="plain", config=cfg)
    assert_close_rel(y, matmul_reference(a, b), *((2e-3, 1e-2) if GPU else (1e-6, 1e-5)))


def test_transposed_and_row_strided_operands():
    # b as w.t() (column-major: F.linear's weight seen as K x N), a as every other row of a wider
    # tensor (row stride 2K): the plain kernel reads any such layout, nothing is copied
    g = torch.Generator().manual_seed(2)
    w = torch.randn(33, 48, generator=g).to(runtime.DEVICE, torch.float16)  # (N, K)
    big = torch.randn(2 * 20, 2 * 48, generator=g).to(runtime.DEVICE, torch.float16)
    a = big[::2, :48]  # (20, 48), strides (192, 1)
    y, box = _run(matmul, a, w.t())
    assert_close_rel(y, matmul_reference(a, w.t()), 1e-3, 4e-3)
    assert box.passes == [], "no copy of a strided operand"


def test_accumulates_in_fp32_past_the_fp16_range():
    # partial sums reach 64 x 300 x 300 = 5.8e6 (fp16 tops out at 65504) before cancelling to a
    # small result: an fp16 accumulator would overflow to inf
    K = 128
    a = torch.full((16, K), 300.0)
    a[:, K // 2 :] = -300.0
    a[:, -1] = -299.0  # the sum is 300 * 300 * 1 ... not zero, and representable
    b = torch.full((K, 16), 300.0)
    a, b = a.to(runtime.DEVICE, torch.float16), b.to(runtime.DEVICE, torch.float16)
    y = matmul(a, b)
    ref = matmul_reference(a, b)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, ref, atol=0, rtol=1e-3)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # numpy's inf - inf, as asked
def test_non_finite_inputs_follow_the_reference():
    a, b = _inputs(20, 40, 24, torch.float32, seed=3)
    a[2, 5] = float("inf")
    a[7, 0] = float("nan")
    b[10, 3] = float("-inf")
    y = matmul(a, b)
    ref = matmul_reference(a, b)
    assert torch.equal(torch.isnan(y), torch.isnan(ref))
    assert torch.equal(torch.isinf(y), torch.isinf(ref))
    fin = torch.isfinite(ref)
    torch.testing.assert_close(y[fin], ref[fin], atol=1e-2 if GPU else 1e-4, rtol=1e-2 if GPU else 1e-5)


@pytest.mark.parametrize("shape", [(0, 5, 7), (5, 7, 0), (4, 0, 6)], ids=["M=0", "N=0", "K=0"])
def test_zero_size(shape):
    M, K, N = shape
    a, b = _inputs(M, K, N, torch.float32)
    y, _ = _run(matmul, a, b)
    assert y.shape == (M, N)
    assert torch.equal(y, torch.zeros(M, N, device=runtime.DEVICE)), "K = 0: an empty sum is zero"


def test_eager_is_one_matmul_of_the_right_product():
    # the baseline every benchmark compares with: one cuBLAS (or CPU) matmul, against the product
    # summed by hand in float64 (not torch.matmul again)
    a, b = _inputs(8, 16, 4, torch.float32)
    with LaunchCounter() as counter:
        y = matmul_eager(a, b)
    assert counter.torch_ops == ["mm"], counter.torch_ops
    assert_close_rel(y, (a.double()[:, :, None] * b.double()[None]).sum(1).float(), 1e-5, 1e-5)


def test_ledger_counts_tile_rereads():
    led = matmul_ledger(1000, 512, 300, BLOCK_M=128, BLOCK_N=128, dtype=torch.float16)
    # A (1000 x 300) read ceil(512/128) = 4 times; B (300 x 512) read ceil(1000/128) = 8 times
    assert led.fused_bytes == 2 * (1000 * 300 * 4 + 300 * 512 * 8 + 1000 * 512)
    ideal = matmul_ledger(1000, 512, 300, dtype=torch.float16)
    assert ideal.fused_bytes == 2 * (1000 * 300 + 300 * 512 + 1000 * 512)
    assert matmul_flops(2, 3, 4) == 48


def test_config_is_cached_and_sane():
    cfg = matmul_config(4096, 4096, 4096, torch.float16)
    if cfg["variant"] == "plain":
        assert cfg["BLOCK_K"] >= 16 and cfg["BLOCK_M"] >= 16 and cfg["BLOCK_N"] >= 16
    else:
        assert cfg["configs"] == [dict(c.all_kwargs()) for c in TMA_CONFIGS]
    small = matmul_config(1, 4096, 4096, torch.float16)
    assert small["variant"] == "plain" and small["BLOCK_M"] == 16


def _bad_inputs():
    dev = runtime.DEVICE
    A = lambda: torch.randn(8, 16, device=dev)  # noqa: E731  (fresh tensors: one case must not leak into another)
    B = lambda: torch.randn(16, 4, device=dev)  # noqa: E731
    cases = [
        ("int", lambda: (A().int(), B().int()), {}, "dtype"),
        ("mixed dtypes", lambda: (A(), B().half()), {}, "share"),
        ("K mismatch", lambda: (A(), torch.randn(15, 4, device=dev)), {}, "K"),
        ("3-D", lambda: (A()[None], B()), {}, "dimension"),
        ("1-D", lambda: (A()[0], B()), {}, "dimension"),
        ("no unit stride", lambda: (torch.randn(16, 32, device=dev)[::2, ::2], B()), {}, "contiguous"),
        ("negated view", lambda: (A(), torch._neg_view(B())), {}, "negated"),
        ("requires grad", lambda: (A().requires_grad_(), B()), {}, "grad"),
        ("bad variant", lambda: (A(), B()), {"variant": "fast"}, "variant"),
        ("bad config key", lambda: (A(), B()), {"config": {"BLOCK_X": 16}}, "config"),
        ("tiny block", lambda: (A(), B()), {"config": {"BLOCK_K": 8}}, "16"),
        ("bad precision", lambda: (A(), B()), {"input_precision": "fp8"}, "input_precision"),
    ]
    if not HOPPER:
        cases.append(("tma unavailable", lambda: (A(), B()), {"variant": "tma"}, "tma"))
    return cases


@pytest.mark.parametrize("make,kw,match", [c[1:] for c in _bad_inputs()], ids=[c[0] for c in _bad_inputs()])
def test_bad_inputs_raise(make, kw, match):
    a, b = make()
    with pytest.raises(KernelInputError, match=match):
        matmul(a, b, **kw)


@pytest.mark.skipif(torch.bfloat16 in runtime.DTYPES, reason="only the interpreter lacks bf16")
def test_bf16_refused_in_interpreter():
    a, b = torch.randn(4, 4).bfloat16(), torch.randn(4, 4).bfloat16()
    with pytest.raises(KernelInputError, match="bfloat16"):
        matmul(a, b)


# -- GPU: big shapes and the Hopper path ----------------------------------------------------------
@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_4095_cubed_against_float64(dtype):
    # 4095: no block divides it, and rows of 4095 fp16 are not 16-byte aligned: the plain kernel
    # with every edge masked: 32 x 32 tiles of 128, the last row and column of them hanging over
    a, b = _inputs(4095, 4095, 4095, dtype, seed=4)
    y = matmul(a, b)
    tol = (1e-3, 4e-3) if dtype == torch.float16 else (8e-3, 3e-2)
    assert_close_rel(y, matmul_reference(a, b), *tol)


@pytest.mark.gpu
@gpu_only
@pytest.mark.skipif(not HOPPER, reason="the TMA path needs a Hopper GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("b_layout", ["KN", "NK"])
@pytest.mark.parametrize(
    "config",
    [None, {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "EPILOGUE_SUBTILE": False, "num_stages": 3, "num_warps": 4}],
    ids=["autotuned", "128x128-no-subtile"],
)
def test_tma_path_edges(dtype, b_layout, config):
    # M = 1008 (not a tile multiple: TMA clips the store), K = 1040 (not a multiple of 64: TMA
    # zero-fills the last K step), N = 1040 (not a multiple of 256): rows stay 16-byte aligned, so the
    # TMA path applies. (Multiples of 16, as the benchmark shapes are: the same compiled kernels.)
    M, K, N = 1008, 1040, 1040
    a, b = _inputs(M, K, N, dtype, seed=5)
    if b_layout == "NK":
        b = b.t().contiguous().t()  # F.linear's (N, K) weight, seen as K x N
    with Sandbox() as box:
        y = matmul(a, b, config=config)
    assert box.names == ["_matmul_tma_kernel"]
    assert box.writes_past_the_end() is None
    tol = (1e-3, 4e-3) if dtype == torch.float16 else (8e-3, 3e-2)
    assert_close_rel(y, matmul_reference(a, b), *tol)


@pytest.mark.gpu
@gpu_only
def test_fp32_is_tf32_by_default_and_ieee_on_request():
    a, b = _inputs(512, 1024, 256, torch.float32, seed=6)
    ref = matmul_reference(a, b)
    assert_close_rel(matmul(a, b), ref, 2e-3, 1e-2)  # TF32
    assert_close_rel(matmul(a, b, input_precision="ieee"), ref, 1e-6, 1e-5)


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("M", [1, 16, 200])
def test_gemv_and_large_k(M):
    # K = 8193: one past a power of two, unaligned rows: the plain kernel's K mask on its last step
    a, b = _inputs(M, 8193, 512, torch.bfloat16, seed=7)
    assert_close_rel(matmul(a, b), matmul_reference(a, b), 8e-3, 3e-2)


@pytest.mark.skipif(GPU, reason="the GPU runs this kernel through the launcher (test_tma_path_edges)")
@pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
@pytest.mark.parametrize("b_kn", [True, False], ids=["B (K, N)", "B (N, K)"])
@pytest.mark.parametrize("subtile", [True, False], ids=["subtile", "whole tile"])
def test_tma_kernel_logic_in_the_interpreter(b_kn, subtile):
    # The Hopper kernel's persistent loop, grouped order, half-tile stores and every epilogue flag,
    # run by the interpreter (which emulates TMA descriptors): 3 programs take 4 x 3 tiles of 64 x 64
    # with ragged edges in M, N and K. The launcher never picks this kernel off a Hopper GPU.
    from fusionlab.kernels.matmul import TensorDescriptor, _matmul_tma_kernel

    if TensorDescriptor is None:
        pytest.skip("this triton has no host-side TensorDescriptor")
    g = torch.Generator().manual_seed(9)
    M, K, N = 200, 80, 144
    a = torch.randn(M, K, generator=g).half()
    w = torch.randn(N, K, generator=g).half()
    bias, r, scale = (
        torch.randn(N, generator=g).half(),
        torch.randn(M, N, generator=g).half(),
        torch.rand(M, generator=g),
    )
    c = torch.full((M, N), float("nan")).half()
    bm, bn, bk = 64, 64, 32
    bt = w.t().contiguous() if b_kn else w
    descs = (
        TensorDescriptor.from_tensor(a, [bm, bk]),
        TensorDescriptor.from_tensor(bt, [bk, bn] if b_kn else [bn, bk]),
        TensorDescriptor.from_tensor(c, [bm, bn // 2] if subtile else [bm, bn]),
    )
    _matmul_tma_kernel[(3,)](
        *descs, bias, r, scale, M, N, K, r.stride(0), r.stride(1),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=2, B_KN=b_kn, EPILOGUE_SUBTILE=subtile,
        WARP_SPECIALIZE=False, HAS_BIAS=True, ACTIVATION=1, HAS_RESIDUAL=True, HAS_ROW_SCALE=True,
    )  # fmt: skip
    ref = torch.nn.functional.gelu(scale[:, None].double() * (a.double() @ w.double().t()) + bias.double()) + r.double()
    assert_close_rel(c, ref.half(), 1e-3, 4e-3)
