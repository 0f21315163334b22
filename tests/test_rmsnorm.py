"""Lesson 4's residual + RMSNorm: right against float64 on awkward shapes, both schedules (one tile,
two passes), h written back, the model's cast order, gradients against torch autograd in float64,
strided rows read in place, deterministic dw, clear errors."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DTYPES, gpu_only

from fusionlab import runtime
from fusionlab.grading import TOLERANCES, Sandbox, poisoned
from fusionlab.kernels import KernelInputError
from fusionlab.kernels._launch import next_pow2
from fusionlab.kernels._norms import INTERPRETER_TUNING, apply_overrides
from fusionlab.kernels.layernorm import layernorm_config
from fusionlab.kernels.rmsnorm import (
    GPU_TUNING,
    rmsnorm,
    rmsnorm_config,
    rmsnorm_eager,
    rmsnorm_flops,
    rmsnorm_ledger,
    rmsnorm_reference,
)

pytestmark = [
    pytest.mark.lesson4,
    # inf/nan rows compute inf * 0 on purpose (torch gives NaN too); the interpreter's numpy warns
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]

KERNEL, BWD_KERNEL, SUM_KERNEL = "_rmsnorm_kernel", "_rmsnorm_bwd_kernel", "_sum_partials_kernel"
EPS = 1e-6

SHAPES = [
    (1, 1),  # one row of one element: one program, 15 of 16 lanes masked
    (1, 3),  # width 3
    (4, 1),  # width 1: y = sign(h) * w (up to eps)
    (37, 129),  # ragged both ways: several rows a program, masks on rows and columns
    (65537, 3),  # many rows of width 3: many programs of many rows, the last one mostly padding
    (3, 4097),  # one past 4096: the two-pass path in the interpreter, one tile on a GPU
    (2, 128256),  # a vocabulary-sized row: the two-pass path in every mode, 32+ tiles a row
    (2, 3, 100),  # leading dims are rows
    (1, 2500),  # a head of 2048 and a tail of 512 in the interpreter (a GPU's 11008: 8192 and 4096)
    (3, 11008),  # a head and a tail on a GPU (few rows: one a program), two-pass in the interpreter
    (19, 3000),  # the interpreter's head and tail over blocks of 16 rows, the last block 3 rows
]


def _t(shape, dtype=torch.float32, seed=0, scale=1.0, offset=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale + offset).to(runtime.DEVICE, dtype)


def _sandboxed(fn, *args, **kw):
    """Run with poisoned allocations (an element never written keeps the poison bits) and counted launches."""
    with Sandbox() as box:
        out = fn(*args, **kw)
    assert box.writes_past_the_end() is None, "a store landed past the end of an output"
    return out, box


def _expect_close(y, expected, atol, rtol):
    assert y.shape == expected.shape and y.device == expected.device
    assert not poisoned(y).any(), f"{int(poisoned(y).sum())} elements never written"
    torch.testing.assert_close(y.double(), expected.double(), atol=atol, rtol=rtol, equal_nan=True)


def _grad_close(actual, expected, tol, name):
    """Gradients: an error relative to the gradient's largest element (sums of many rounded terms)."""
    assert actual is not None, f"no gradient for {name}"
    assert not poisoned(actual).any(), f"{name}: {int(poisoned(actual).sum())} elements never written"
    scale = max(expected.abs().max().item(), 1.0)
    torch.testing.assert_close(actual.double(), expected.double(), atol=tol * scale, rtol=tol, msg=name)


# -- forward -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("residual", [True, False], ids=["residual", "plain"])
@pytest.mark.parametrize("dtype,atol,rtol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_matches_float64_in_one_launch(shape, dtype, atol, rtol, residual):
    x, w = _t(shape, dtype), _t(shape[-1], dtype, seed=1)
    r = _t(shape, dtype, seed=2) if residual else None
    before = [t.clone() for t in (x, w, r) if t is not None]
    out, box = _sandboxed(rmsnorm, x, w, EPS, r)
    y, h = out if residual else (out, None)
    ref = rmsnorm_reference(x, w, EPS, r)
    y_ref = ref[0] if residual else ref
    assert y.dtype == dtype and y.is_contiguous()
    _expect_close(y, y_ref, atol, rtol)
    if residual:  # the residual sum is written back, bit for bit what eager's add gives
        assert not poisoned(h).any(), "h never written"
        assert torch.equal(h, x + r)
    assert box.names == [KERNEL] and box.torch_ops == [] and box.passes == []
    for t, b in zip((x, w, r), before, strict=False):
        assert torch.equal(t, b), "an input was modified"


@pytest.mark.parametrize(
    "shape, block_n, block_m",
    [
        ((5, 300), 16, 1),  # 19 tiles a row, the last one 12 wide
        ((3, 1000), 64, 2),  # two rows a program, the second program half empty
        ((1, 33), 32, 1),  # two tiles, the second holds one element
        ((70, 50), 16, 8),  # many short rows per program on the two-pass path
    ],
)
@pytest.mark.parametrize("residual", [True, False], ids=["residual", "plain"])
def test_two_pass_path_matches_float64(shape, block_n, block_m, residual):
    x, w = _t(shape, seed=3), _t(shape[-1], seed=4)
    r = _t(shape, seed=5) if residual else None
    out, box = _sandboxed(rmsnorm, x, w, EPS, r, fwd_config={"BLOCK_N": block_n, "BLOCK_M": block_m})
    ref = rmsnorm_reference(x, w, EPS, r)
    if residual:
        _expect_close(out[0], ref[0], 1e-5, 1e-5)
        assert torch.equal(out[1], x + r)
    else:
        _expect_close(out, ref, 1e-5, 1e-5)
    assert box.names == [KERNEL]


@pytest.mark.parametrize("wdtype", [torch.float32, torch.float16], ids=["w-fp32", "w-fp16"])
@pytest.mark.parametrize("block_n", [None, 16], ids=["config", "two-pass"])
def test_cast_order_is_llamas(wdtype, block_n):
    # fp16 activations: the kernel must give what Hugging Face's LlamaRMSNorm gives — normalise in fp32,
    # round to fp16, then multiply by the weight — to within one fp16 rounding of the fp32 statistics
    x, r = _t((33, 70), torch.float16, seed=6, scale=3), _t((33, 70), torch.float16, seed=7)
    w = _t(70, wdtype, seed=8)
    cfg = {"BLOCK_N": block_n} if block_n else None
    y, h = rmsnorm(x, w, EPS, r, fwd_config=cfg)
    y_hf, h_hf = rmsnorm_eager(x, w, EPS, r)
    assert y.dtype == torch.float16 and y_hf.dtype == torch.float16 and torch.equal(h, h_hf)
    torch.testing.assert_close(y, y_hf, atol=2e-3, rtol=2e-3)
    y_ref, _ = rmsnorm_reference(x, w, EPS, r)
    torch.testing.assert_close(y, y_ref, atol=2e-3, rtol=2e-3)
    # the other order (multiply in fp32, round once) is a different function: the reference tells them apart
    hf = h.double()
    once = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + EPS) * w.double()).half()
    assert not torch.equal(y_ref, once)
    assert (y == y_ref).float().mean() > (y == once).float().mean()


def test_eps_sits_inside_the_root():
    # rows of zeros: rstd = 1/sqrt(eps), y = 0; a row of tiny values: eps dominates the mean square
    x = torch.zeros(3, 40, device=runtime.DEVICE)
    x[1] = 1e-4
    w = torch.ones(40, device=runtime.DEVICE)
    y = rmsnorm(x, w, 1e-2)
    assert torch.equal(y[0], torch.zeros(40, device=runtime.DEVICE))
    expected = 1e-4 / math.sqrt(1e-8 + 1e-2)
    torch.testing.assert_close(y[1], torch.full_like(y[1], expected), atol=1e-9, rtol=1e-5)


@pytest.mark.parametrize("block_n", [None, 16], ids=["config", "two-pass"])
def test_nonfinite_rows_give_what_the_reference_gives(block_n):
    x = _t((5, 37), seed=9)
    x[0, 3] = math.inf  # mean square inf, rstd 0: inf * 0 = NaN in that row
    x[1, 30] = math.nan
    x[2] = 0.0  # zeros: y = 0
    w = _t(37, seed=10)
    cfg = {"BLOCK_N": block_n} if block_n else None
    y = rmsnorm(x, w, EPS, fwd_config=cfg)
    expected = rmsnorm_reference(x, w, EPS)
    assert torch.equal(torch.isnan(y), torch.isnan(expected))
    torch.testing.assert_close(y, expected, atol=1e-6, rtol=1e-5, equal_nan=True)


def test_large_mean_offset_in_fp32():
    # RMSNorm has no E[x²] - E[x]² to cancel; the sum of squares of 1e4 + randn in fp32 stays accurate
    x = _t((6, 3000), seed=11, offset=1e4)
    w = _t(3000, seed=12)
    for cfg in (None, {"BLOCK_N": 256}):
        _expect_close(rmsnorm(x, w, EPS, fwd_config=cfg), rmsnorm_reference(x, w, EPS), 1e-5, 1e-5)


def test_zero_size_inputs():
    w = _t(8, seed=13)
    y, h = rmsnorm(torch.empty(0, 8, device=runtime.DEVICE), w, EPS, torch.empty(0, 8, device=runtime.DEVICE))
    assert y.shape == h.shape == (0, 8)
    x = torch.empty(0, 8, device=runtime.DEVICE, requires_grad=True)
    wg = w.clone().requires_grad_()
    rmsnorm(x, wg, EPS).sum().backward()
    assert x.grad.shape == (0, 8) and torch.equal(wg.grad, torch.zeros(8, device=runtime.DEVICE))
    y = rmsnorm(torch.empty(3, 0, device=runtime.DEVICE), torch.empty(0, device=runtime.DEVICE))
    assert y.shape == (3, 0)


# -- backward ----------------------------------------------------------------------------------------
BWD_SHAPES = [
    (1, 1),  # one row of one element
    (1, 3),  # width 3
    (37, 129),  # ragged; several programs, several rows each
    (3, 4097),  # two-pass backward in the interpreter
    (1, 2500),  # the interpreter's head of 2048 and tail of 512 (a GPU's 11008: 8192 and 4096)
    (3, 11008),  # a head and a tail on a GPU, two-pass in the interpreter
    (19, 3000),  # the interpreter's head and tail over blocks of rows
    (5, 3500),  # the interpreter's two halves read twice (a GPU's 12289-16384), the second half ragged
    (17, 4096),  # halves read twice over blocks of 16 rows, the last block 1 row
    (2, 128256),  # two-pass in every mode: phase 1 row terms, phase 2 tiles outside
    (513, 40),  # more rows than programs: each program walks a block of rows into one dw partial
    (2, 3, 100),
]
BWD_DTYPES = [
    pytest.param(torch.float32, 2e-5, id="fp32"),
    pytest.param(torch.float16, 4e-3, id="fp16"),
]
if torch.bfloat16 in runtime.DTYPES:
    BWD_DTYPES.append(pytest.param(torch.bfloat16, 3e-2, id="bf16"))


def _autograd64(x, w, r, dy, dh):
    """Gradients of the exact RMSNorm by torch autograd in float64: (dx, dw, dr)."""
    leaves = [t.detach().double().requires_grad_() for t in (x, w) + ((r,) if r is not None else ())]
    out = rmsnorm_reference(leaves[0], leaves[1], EPS, leaves[2] if r is not None else None)
    outs, grads = ((out[0], out[1]), (dy, dh)) if r is not None else ((out,), (dy,))
    pairs = [(o, g.double()) for o, g in zip(outs, grads, strict=True) if g is not None]
    torch.autograd.backward([p[0] for p in pairs], [p[1] for p in pairs])
    return leaves[0].grad, leaves[1].grad, (leaves[2].grad if r is not None else None)


@pytest.mark.parametrize("residual", ["use-h", "ignore-h", "plain"])
@pytest.mark.parametrize("dtype,tol", BWD_DTYPES)
@pytest.mark.parametrize("shape", BWD_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_backward_matches_float64_autograd(shape, dtype, tol, residual):
    has_r = residual != "plain"
    x = _t(shape, dtype, seed=20).requires_grad_()
    r = _t(shape, dtype, seed=21).requires_grad_() if has_r else None
    w = _t(shape[-1], torch.float32, seed=22).requires_grad_()  # an fp32 weight beside fp16 activations
    dy = _t(shape, dtype, seed=23)
    dh = _t(shape, dtype, seed=24) if residual == "use-h" else None

    def run():
        out = rmsnorm(x, w, EPS, r)
        if not has_r:
            out.backward(dy)
        elif dh is None:
            out[0].backward(dy)  # h unused downstream: its gradient arrives as None
        else:
            torch.autograd.backward(list(out), [dy, dh])

    _, box = _sandboxed(run)
    assert box.names == [KERNEL, BWD_KERNEL, SUM_KERNEL]
    dx64, dw64, dr64 = _autograd64(x, w, r, dy, dh)
    assert x.grad.dtype == dtype and w.grad.dtype == torch.float32
    _grad_close(x.grad, dx64, tol, "dx")
    _grad_close(w.grad, dw64, tol, "dw")
    if has_r:
        _grad_close(r.grad, dr64, tol, "d residual")
        assert r.grad.data_ptr() != x.grad.data_ptr(), "x.grad and residual.grad must not share memory"


@pytest.mark.parametrize(
    "shape, cfg",
    [
        ((37, 129), {"BLOCK_N": 16, "BLOCK_M": 1, "programs": 3}),  # two-pass: 9 tiles, 13 rows a program
        ((37, 129), {"BLOCK_N": 32, "BLOCK_M": 4, "programs": 5}),  # row blocks of 4, last program partial
        ((10, 50), {"BLOCK_M": 2, "programs": 64}),  # more programs asked than row blocks
        ((100, 24), {"BLOCK_M": 1, "programs": 1}),  # one program walks every row
    ],
)
def test_backward_configurations(shape, cfg):
    x, r = _t(shape, seed=30).requires_grad_(), _t(shape, seed=31).requires_grad_()
    w = _t(shape[-1], seed=32).requires_grad_()
    dy, dh = _t(shape, seed=33), _t(shape, seed=34)
    fwd = {"BLOCK_N": cfg["BLOCK_N"]} if "BLOCK_N" in cfg else None
    y, h = rmsnorm(x, w, EPS, r, fwd_config=fwd, bwd_config=cfg)
    torch.autograd.backward([y, h], [dy, dh])
    dx64, dw64, dr64 = _autograd64(x, w, r, dy, dh)
    _grad_close(x.grad, dx64, 2e-5, "dx")
    _grad_close(w.grad, dw64, 2e-5, "dw")
    _grad_close(r.grad, dr64, 2e-5, "d residual")


def test_dw_is_deterministic():
    # a fixed order of partial sums: two identical backward passes give the same bits
    x, w = _t((300, 77), seed=40).requires_grad_(), _t(77, seed=41).requires_grad_()
    dy = _t((300, 77), seed=42)
    grads = []
    for _ in range(2):
        w.grad = None
        rmsnorm(x, w, EPS, bwd_config={"programs": 7, "BLOCK_M": 2}).backward(dy)
        grads.append(w.grad.clone())
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("which", ["x", "w", "r"])
def test_backward_computes_only_what_is_needed(which):
    x = _t((20, 30), seed=43).requires_grad_(which == "x")
    r = _t((20, 30), seed=44).requires_grad_(which == "r")
    w = _t(30, seed=45).requires_grad_(which == "w")
    dy = _t((20, 30), seed=46)
    with Sandbox() as box:
        rmsnorm(x, w, EPS, r)[0].backward(dy)
    dx64, dw64, dr64 = _autograd64(x, w, r, dy, None)
    expected = {"x": dx64, "w": dw64, "r": dr64}[which]
    _grad_close({"x": x, "w": w, "r": r}[which].grad, expected, 2e-5, which)
    # dw needs the partial sums and their reduction; dx alone is one kernel
    assert box.names == ([KERNEL, BWD_KERNEL, SUM_KERNEL] if which == "w" else [KERNEL, BWD_KERNEL])
    assert all(t.grad is None for n, t in {"x": x, "w": w, "r": r}.items() if n != which)


def _dy_layouts(y):
    """Losses whose gradient reaches the kernel in awkward layouts."""
    n = y.shape[-1]
    c = _t(n, seed=50)
    m = _t((n, y.shape[0]), seed=51)
    return {
        "sum (stride 0 everywhere)": lambda: y.sum(),
        "broadcast row (row stride 0)": lambda: (y * c).sum(),
        "transposed (column stride != 1)": lambda: (y.t() * m).sum(),
        "slice of a wider gradient": lambda: (torch.cat([y, y], -1) * _t((y.shape[0], 2 * n), seed=52)).sum(),
    }


@pytest.mark.parametrize("case", list(_dy_layouts(torch.zeros(2, 2))))
def test_backward_takes_any_gradient_layout(case):
    x, w = _t((9, 45), seed=53).requires_grad_(), _t(45, seed=54).requires_grad_()
    loss = _dy_layouts(rmsnorm(x, w, EPS))[case]()
    loss.backward()
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    _dy_layouts(rmsnorm_reference(x64, w64, EPS))[case]().backward()
    _grad_close(x.grad, x64.grad, 2e-5, "dx")
    _grad_close(w.grad, w64.grad, 2e-5, "dw")


# -- strided rows ------------------------------------------------------------------------------------
def _strided_cases():
    base = _t((6, 10, 2 * 97), seed=60)
    return {
        "row-stride-2N": base[0, :, :97],  # rows of a wider buffer: one level, stride 194
        "every-other-row": base[:, ::2, :97],  # two levels
        "drop-last-token": base[:, :-1, :97],  # (6, 9, 97) of a (6, 10, .) buffer: two levels
        "transposed-leading": base[:, :, :97].transpose(0, 1),  # two levels, outer stride < inner
        "expanded-rows": base[0, 0, :97].expand(4, 97),  # stride 0: four reads of one row
    }


@pytest.mark.parametrize("case", list(_strided_cases()))
def test_strided_rows_are_read_in_place(case):
    x = _strided_cases()[case]
    assert not x.is_contiguous()
    # the residual in another layout than x: contiguous, sharing x's row split
    r = _t(x.shape, seed=61)
    w = _t(97, seed=62)
    (y, h), box = _sandboxed(rmsnorm, x, w, EPS, r)
    y_ref, _ = rmsnorm_reference(x, w, EPS, r)
    _expect_close(y, y_ref, 1e-5, 1e-5)
    assert torch.equal(h, x + r) and y.is_contiguous() and h.is_contiguous()
    assert box.names == [KERNEL] and box.passes == [], "strided rows are read in place, not copied"
    # without a residual the backward reads the saved, strided x
    xg = x.detach().requires_grad_()
    wg = w.clone().requires_grad_()
    dy = _t(x.shape, seed=63)
    rmsnorm(xg, wg, EPS, fwd_config={"BLOCK_N": 32}, bwd_config={"BLOCK_N": 32}).backward(dy)
    dx64, dw64, _ = _autograd64(x, w, None, dy, None)
    _grad_close(xg.grad, dx64, 2e-5, "dx")
    _grad_close(wg.grad, dw64, 2e-5, "dw")


def test_unmergeable_leading_dims_are_refused():
    x = _t((4, 4, 4, 8), seed=64)[::2, ::2, ::2]  # three levels of row strides
    w = _t(8, seed=65)
    with pytest.raises(KernelInputError, match="row strides.*contiguous"):
        rmsnorm(x, w)
    torch.testing.assert_close(rmsnorm(x.contiguous(), w), rmsnorm_reference(x, w), atol=1e-5, rtol=1e-5)
    # two levels each, but split differently: (2*3, 4) rows for x, (2, 3*4) for the residual
    x = _t((2, 3, 5, 8), seed=66)[:, :, :4]
    r = _t((2, 4, 4, 8), seed=67)[:, :3]
    with pytest.raises(KernelInputError, match="row strides"):
        rmsnorm(x, w, EPS, r)
    # the same split in different strides is walked together
    r = _t((2, 3, 6, 8), seed=68)[:, :, 1:5]
    y, h = rmsnorm(x, w, EPS, r)
    assert torch.equal(h, x + r)
    _expect_close(y, rmsnorm_reference(x, w, EPS, r)[0], 1e-5, 1e-5)


def test_last_dim_must_have_stride_1():
    x = _t((8, 6), seed=69).t()
    with pytest.raises(KernelInputError, match="stride 1"):
        rmsnorm(x, _t(8, seed=70))


# -- bad inputs --------------------------------------------------------------------------------------
def test_bad_inputs_are_refused_clearly():
    x, w = _t((4, 8), seed=71), _t(8, seed=72)
    with pytest.raises(KernelInputError, match="dtype int64"):
        rmsnorm(x.long(), w)
    with pytest.raises(KernelInputError, match="weight has 7 elements"):
        rmsnorm(x, w[:7])
    with pytest.raises(KernelInputError, match="weight must have 1 dimension"):
        rmsnorm(x, w.view(2, 4))
    with pytest.raises(KernelInputError, match="weight is not contiguous"):
        rmsnorm(x, _t(16, seed=73)[::2])
    with pytest.raises(KernelInputError, match="residual must have x's shape and dtype"):
        rmsnorm(x, w, EPS, x[:2])
    with pytest.raises(KernelInputError, match="residual must have x's shape and dtype"):
        rmsnorm(x, w, EPS, x.half())
    with pytest.raises(KernelInputError, match="at least one dimension"):
        rmsnorm(x[0, 0], w[:1])
    with pytest.raises(KernelInputError, match="negated"):
        rmsnorm(torch._neg_view(x), w)
    for eps in (-1.0, math.nan, math.inf, "1e-6", True):
        with pytest.raises(KernelInputError, match="eps"):
            rmsnorm(x, w, eps)
    with pytest.raises(KernelInputError, match="BLOCK_N=12"):
        rmsnorm(x, w, fwd_config={"BLOCK_N": 12})
    with pytest.raises(KernelInputError, match="unknown configuration key"):
        rmsnorm(x, w, fwd_config={"BLOCK_K": 16})
    with pytest.raises(KernelInputError, match="programs"):
        rmsnorm(x, w, bwd_config={"programs": 0})
    with pytest.raises(KernelInputError, match="is on"):
        rmsnorm(x.to("meta"), w)


# -- ledger, flops, configuration ---------------------------------------------------------------------
def test_forward_ledger():
    rows, n = 32768, 4096
    led = rmsnorm_ledger(rows, n, torch.bfloat16)
    # fused: read x, r, w; write h, y
    assert led.fused_bytes == 4 * rows * n * 2 + n * 2
    assert [(t.tensor, t.direction) for t in led.trips(fused=True)] == [
        ("x", "read"),
        ("r", "read"),
        ("w", "read"),
        ("h", "write"),
        ("y", "write"),
    ]
    # eager, bf16 (Hugging Face's order): 42 bytes an element in ~9 kernels, plus per-row and weight terms
    assert led.unfused_bytes == 42 * rows * n + 6 * 4 * rows + 2 * n  # var, t, rs: written and read
    assert led.kernels_unfused == 9
    assert led.saving == pytest.approx(42 / 8, rel=1e-3)
    plain = rmsnorm_ledger(rows, n, torch.bfloat16, residual=False, weight_dtype=torch.float32)
    assert plain.fused_bytes == 2 * rows * n * 2 + n * 4
    stats = rmsnorm_ledger(rows, n, torch.bfloat16, stats=True)
    assert stats.fused_bytes == led.fused_bytes + 4 * rows
    # a row wider than the tile: pass 2 re-reads h
    wide = rmsnorm_ledger(8, 128256, torch.bfloat16)
    assert wide.fused_bytes == 5 * 8 * 128256 * 2 + 128256 * 2
    assert rmsnorm_ledger(8, 1024, torch.bfloat16, block=512).fused_bytes == 5 * 8 * 1024 * 2 + 1024 * 2
    # fp32: no casts in eager (.float() and .to(fp32) are no-ops)
    assert rmsnorm_ledger(4, 64, torch.float32).kernels_unfused == 7
    assert "fused" in led.table() and "stays" not in led.table()


def test_backward_ledger():
    rows, n, p = 4096, 4096, 528
    led = rmsnorm_ledger(rows, n, torch.bfloat16, backward=True, programs=p)
    rn = rows * n
    # read dy, h, grad_h, w, rstd; write dx; partials written and read; dw written
    assert led.fused_bytes == 3 * rn * 2 + n * 2 + 4 * rows + rn * 2 + 2 * p * n * 4 + n * 2
    no_h = rmsnorm_ledger(rows, n, torch.bfloat16, backward=True, programs=p, grad_h=False)
    assert led.fused_bytes - no_h.fused_bytes == rn * 2
    wide = rmsnorm_ledger(2, 128256, torch.float32, backward=True, programs=1, grad_h=False)
    assert wide.fused_bytes == (2 + 2 + 1) * 2 * 128256 * 4 + 128256 * 4 * 4 + 2 * 4 + 2 * 2 * 4
    assert led.unfused_bytes > 3 * led.fused_bytes


def test_flops():
    assert rmsnorm_flops(10, 100) == 5 * 1000 and rmsnorm_flops(10, 100, residual=False) == 4000
    assert rmsnorm_flops(10, 100, backward=True) == 11000


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
@pytest.mark.parametrize("gpu", [True, False], ids=["gpu", "interpreter"])
@pytest.mark.parametrize(
    "rows,n",
    [(1, 1), (3, 3), (4096, 1024), (32768, 4096), (8, 16384), (4, 128256), (65537, 3), (4096, 11008), (1, 2500)]
    + [(19, 3000), (32768, 5120)],
)
def test_configs_are_legal(rows, n, backward, gpu):
    cfg = rmsnorm_config(rows, n, torch.float16, backward=backward, gpu=gpu)
    for key in ("BLOCK_M", "BLOCK_N", "num_warps") + (("TAIL_N",) if "TAIL_N" in cfg else ()):
        assert cfg[key] >= 1 and cfg[key] & (cfg[key] - 1) == 0, key
    assert cfg["BLOCK_M"] * cfg["BLOCK_N"] <= 2**20 and cfg["num_warps"] <= 32
    assert cfg["SINGLE_TILE"] == (n <= cfg["BLOCK_N"] + cfg.get("TAIL_N", 0))
    assert "TAIL_N" not in cfg or (cfg["BLOCK_N"] < n and (cfg["BLOCK_M"] == 1 or not gpu))
    if backward:
        assert 1 <= cfg["programs"] <= math.ceil(rows / cfg["BLOCK_M"])


def test_gpu_backward_row_stages_fit_shared_memory():
    # three row stages (two row blocks of dy, h, grad_h in flight) where they fit stage_bytes; fp32 rows
    # of 8192 keep two; tiles past prefetch_tile, none, but for a head and a tail
    t = GPU_TUNING["backward"]
    cases = [(5120, torch.bfloat16, 3), (8192, torch.bfloat16, 3), (8192, torch.float32, 2)]
    cases += [(4096, torch.float32, 3), (1024, torch.float16, 3), (8192, torch.float32, 2)]
    cases += [(11008, torch.bfloat16, 3)]  # a head and a tail: two rows in flight (tail_stages)
    cases += [(16384, torch.bfloat16, 2), (12289, torch.float16, 2)]  # halves read twice (reread_stages)
    for n, dtype, want in cases:
        cfg = rmsnorm_config(32768, n, dtype, backward=True, gpu=True)
        assert cfg.get("row_stages") == want, (n, dtype, cfg)
        if want == 3:
            staged = cfg["BLOCK_M"] * cfg["BLOCK_N"] * dtype.itemsize * 3 * (want - 1)
            assert staged <= t["stage_bytes"]


def test_head_and_tail():
    # a one-tile row that fits three quarters of its tile: a head of half and a tail of a quarter
    cfg = rmsnorm_config(32768, 11008, torch.bfloat16, backward=True, gpu=True)
    assert (cfg["BLOCK_N"], cfg["TAIL_N"], cfg["SINGLE_TILE"]) == (8192, 4096, True)
    t = GPU_TUNING["backward"]
    assert cfg["num_warps"] == t["tail_warps"] and cfg["row_stages"] == t["tail_stages"]
    assert (8192 + 4096) * 2 * 3 * (cfg["row_stages"] - 1) <= t["stage_bytes"]  # the stage fits
    for n in (8192, 5120):  # a tile with row stages: one tile
        assert "TAIL_N" not in rmsnorm_config(32768, n, torch.bfloat16, backward=True, gpu=True), n
    for n in (12289, 16384):  # past three quarters of 16384: the forward keeps its one tile
        assert "TAIL_N" not in rmsnorm_config(32768, n, torch.bfloat16, gpu=True), n
    fwd = rmsnorm_config(32768, 11008, torch.bfloat16, gpu=True)  # the forward too
    assert (fwd["BLOCK_N"], fwd["TAIL_N"], fwd["SINGLE_TILE"]) == (8192, 4096, True)
    # a tile asked for replaces both; the head's width with the tail's is still one tile
    x, w = _t((1, 2500), seed=90).requires_grad_(), _t(2500, seed=91).requires_grad_()
    assert rmsnorm_config(1, 2500, torch.float32, backward=True).get("TAIL_N") == 512 or runtime.is_gpu()
    for bwd in (None, {"BLOCK_N": 4096}, {"programs": 1}):
        x.grad = w.grad = None
        dy = _t((1, 2500), seed=92)
        y = rmsnorm(x, w, EPS, bwd_config=bwd, fwd_config=bwd and {"BLOCK_N": 4096})
        _expect_close(y, rmsnorm_reference(x, w, EPS), *TOLERANCES[torch.float32])
        y.backward(dy)
        dx64, dw64, _ = _autograd64(x, w, None, dy, None)
        _grad_close(x.grad, dx64, 2e-5, "dx")
        _grad_close(w.grad, dw64, 2e-5, "dw")


def test_backward_reads_wide_rows_twice():
    # a backward row past three quarters of the reread tile: two halves, each loaded twice (REREAD);
    # the forward, LayerNorm and narrower rows never
    for gpu, rows, tile in ((True, 32768, 16384), (False, 19, 4096)):
        for n in (tile * 3 // 4 + 1, tile - 1000, tile):
            cfg = rmsnorm_config(rows, n, torch.bfloat16, backward=True, gpu=gpu)
            half = tile // 2
            assert (cfg["BLOCK_N"], cfg["TAIL_N"], cfg.get("REREAD")) == (half, next_pow2(n - half), True), cfg
            assert cfg["SINGLE_TILE"] and cfg["BLOCK_N"] + cfg["TAIL_N"] >= n
            assert "REREAD" not in rmsnorm_config(rows, n, torch.bfloat16, gpu=gpu)
            assert "REREAD" not in layernorm_config(rows, n, torch.bfloat16, backward=True, gpu=gpu)
        for n in (tile * 3 // 4, tile // 2, tile + 1):  # a head and a tail, a smaller tile, two passes
            assert "REREAD" not in rmsnorm_config(rows, n, torch.bfloat16, backward=True, gpu=gpu), n
    big = GPU_TUNING["backward"]
    assert rmsnorm_config(64, 16384, torch.bfloat16, backward=True, gpu=True)["num_warps"] == big["reread_warps"]
    # a tile asked for replaces the halves
    cfg = apply_overrides(
        rmsnorm_config(32768, 16384, torch.bfloat16, backward=True, gpu=True), {"BLOCK_N": 16384}, 16384, "rmsnorm"
    )
    assert "REREAD" not in cfg and "TAIL_N" not in cfg and cfg["SINGLE_TILE"]


@pytest.mark.parametrize("which", ["x", "w", "r", "all"])
def test_reread_rows_compute_only_what_is_needed(which):
    # the halves read twice with dx alone, dw alone, or both (the mode's own reread width: a GPU's are
    # 16-bit rows)
    gpu = runtime.is_gpu()
    shape, dtype, tol = ((21, 14336), torch.float16, 4e-3) if gpu else ((21, 3500), torch.float32, 2e-5)
    x = _t(shape, dtype, seed=143).requires_grad_(which in ("x", "all"))
    r = _t(shape, dtype, seed=144).requires_grad_(which in ("r", "all"))
    w = _t(shape[-1], seed=145).requires_grad_(which in ("w", "all"))
    dy, dh = _t(shape, dtype, seed=146), _t(shape, dtype, seed=147)
    assert rmsnorm_config(*shape, dtype, backward=True).get("REREAD")
    y, h = rmsnorm(x, w, EPS, r)
    torch.autograd.backward([y, h], [dy, dh])
    dx64, dw64, dr64 = _autograd64(x, w, r, dy, dh)
    for name, t, want in (("x", x, dx64), ("w", w, dw64), ("r", r, dr64)):
        if which in (name, "all"):
            _grad_close(t.grad, want, tol, name)
        else:
            assert t.grad is None


def test_gpu_tile_limits():
    t = GPU_TUNING["forward"]["max_single_bytes"]
    for dtype, size in ((torch.bfloat16, 2), (torch.float32, 4)):
        assert rmsnorm_config(4096, t // size, dtype, gpu=True)["SINGLE_TILE"]
        assert not rmsnorm_config(4096, t // size + 1, dtype, gpu=True)["SINGLE_TILE"]
    assert rmsnorm_config(8, 16384, torch.bfloat16, gpu=True)["BLOCK_M"] == 1  # few rows: one a program
    assert not rmsnorm_config(2, INTERPRETER_TUNING["max_single"] + 1, torch.float32, gpu=False)["SINGLE_TILE"]


# -- the GPU: large shapes, bf16, int64 offsets ----------------------------------------------------------
@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("rows,n", [(32768, 4096), (4096, 11008), (4096, 16384), (1000, 12289), (64, 65536)])
def test_gpu_large_shapes_bf16(rows, n):
    x, r = _t((rows, n), torch.bfloat16, seed=80), _t((rows, n), torch.bfloat16, seed=81)
    w = _t(n, torch.float32, seed=82)
    y, h = rmsnorm(x, w, EPS, r)
    y_ref, h_ref = rmsnorm_reference(x, w, EPS, r)
    assert torch.equal(h, h_ref)
    _expect_close(y, y_ref, *TOLERANCES[torch.bfloat16])
    xg, rg, wg = (t.clone().requires_grad_() for t in (x, r, w))
    dy, dh = _t((rows, n), torch.bfloat16, seed=83), _t((rows, n), torch.bfloat16, seed=84)
    torch.autograd.backward(list(rmsnorm(xg, wg, EPS, rg)), [dy, dh])
    x32, r32, w32 = (t.float().requires_grad_() for t in (x, r, w))  # fp32 autograd: float64 would need 4x
    torch.autograd.backward(list(rmsnorm_reference(x32, w32, EPS, r32)), [dy.float(), dh.float()])
    _grad_close(xg.grad, x32.grad, 3e-2, "dx")
    _grad_close(wg.grad, w32.grad, 3e-2, "dw")


@gpu_only
@pytest.mark.gpu
def test_gpu_rows_times_width_past_2_to_the_31():
    # 2**31 + 4096 elements (4 GiB in bf16): int32 element offsets would wrap in the last rows
    n = 4096
    rows = 2**31 // n + 1
    x = torch.empty((rows, n), dtype=torch.bfloat16, device="cuda").normal_()
    w = torch.randn(n, device="cuda")
    xg, wg = x.requires_grad_(), w.clone().requires_grad_()
    y = rmsnorm(xg, wg, EPS)
    tail = slice(rows - 3, rows)
    _expect_close(y[tail], rmsnorm_reference(x[tail].detach(), w, EPS), *TOLERANCES[torch.bfloat16])
    dy = torch.empty_like(y).normal_()
    y.backward(dy)
    del y
    x64, w64 = x[tail].detach().double().requires_grad_(), w.double().requires_grad_()
    rmsnorm_reference(x64, w64, EPS).backward(dy[tail].double())
    _grad_close(xg.grad[tail], x64.grad, 3e-2, "dx of the last rows")
    # dw over all rows, by chunks in fp32
    dw = torch.zeros(n, device="cuda", dtype=torch.float64)
    for i in range(0, rows, 65536):
        xs = x[i : i + 65536].detach().float()
        nrm = (xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + EPS)).bfloat16().double()
        dw += (dy[i : i + 65536].double() * nrm).sum(0)
    _grad_close(wg.grad, dw, 1e-3, "dw")


@pytest.mark.parametrize("residual", [False, True])
def test_no_grad_path_matches_the_autograd_path_and_gradients_still_flow(residual):
    """Without autograd the forward launches straight from a cached plan (the default configuration's,
    worked out once per layout): the same kernel and configuration as the autograd path's, and as the
    default configuration asked for explicitly, so the same bits. With an input that requires grad the
    autograd path is taken and its gradient is right."""
    dev = runtime.DEVICE
    x = torch.randn(3, 5, 48, device=dev)
    r = torch.randn(3, 5, 48, device=dev) if residual else None
    w = torch.randn(48, device=dev)
    with torch.no_grad():
        fast = rmsnorm(x, w, EPS, r)
    explicit = rmsnorm(x, w, EPS, r, fwd_config={"BLOCK_N": rmsnorm_config(15, 48, x.dtype)["BLOCK_N"]})
    xg = x.clone().requires_grad_(True)
    slow = rmsnorm(xg, w, EPS, r)
    for a, b, c in zip(*(t if residual else (t,) for t in (fast, explicit, slow)), strict=True):
        assert torch.equal(a, b) and torch.equal(a, c.detach())
    y = slow[0] if residual else slow
    assert y.requires_grad and not (fast[0] if residual else fast).requires_grad
    dy = torch.randn_like(y)
    y.backward(dy)
    x64 = x.double().requires_grad_(True)
    want = rmsnorm_reference(x64, w.double(), EPS, None if r is None else r.double())
    (want[0] if residual else want).backward(dy.double())
    torch.testing.assert_close(xg.grad.double(), x64.grad, atol=1e-4, rtol=1e-4)


# -- plans by call signature -------------------------------------------------------------------------
# A call whose signature (each tensor's type, device, dtype, shape, strides, negation flag,
# requires_grad and 16-byte alignment; the grad mode; eps) equals that of a call that passed
# every check skips the checks and launches from the kept layouts and plan. Any other call is checked in
# full: a bad call after good ones of the same shape raises what it raises on a fresh start.
def _error(fn) -> str:
    with pytest.raises(KernelInputError) as err:
        fn()
    return str(err.value)


@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_a_repeated_call_launches_its_kept_plan_without_the_checks(residual, monkeypatch):
    import fusionlab.kernels.rmsnorm as RN

    x, w = _t((2, 3, 40), seed=80), _t(40, seed=81)
    r = _t((2, 3, 40), seed=82) if residual else None
    RN._PLANS.clear()
    with torch.no_grad():
        first = rmsnorm(x, w, EPS, r)
    assert len(RN._PLANS) == 1
    calls, check = [], RN.check_norm
    monkeypatch.setattr(RN, "check_norm", lambda *a: calls.append(a) or check(*a))
    x2, w2 = _t((2, 3, 40), seed=83), _t(40, seed=84)
    r2 = _t((2, 3, 40), seed=85) if residual else None
    with torch.no_grad():
        y = rmsnorm(x2, w2, EPS, r2)
        again = rmsnorm(x, w, EPS, r)
    assert not calls
    want = rmsnorm_reference(x2.double(), w2.double(), EPS, None if r2 is None else r2.double())
    for a, b in zip(y if residual else (y,), want if residual else (want,), strict=True):
        _expect_close(a, b, 1e-5, 1e-5)
    for a, b in zip(again if residual else (again,), first if residual else (first,), strict=True):
        assert torch.equal(a, b)
    # another eps is another signature: checked in full, and its own eps is used
    with torch.no_grad():
        y = rmsnorm(x, w, 0.5, r)
    assert len(calls) == 1
    want = rmsnorm_reference(x.double(), w.double(), 0.5, None if r is None else r.double())
    _expect_close(y[0] if residual else y, want[0] if residual else want, 1e-5, 1e-5)


def _rms_bad_after_good():
    """(name, a bad call's arguments made from a good call's x, w, residual) differing from it in one
    field of the signature only."""
    return [
        ("negated x", lambda x, w, r: (torch._neg_view(x), w, EPS, r)),
        ("negated weight", lambda x, w, r: (x, torch._neg_view(w), EPS, r)),
        ("negated residual", lambda x, w, r: (x, w, EPS, torch._neg_view(r))),
        ("x of another dtype", lambda x, w, r: (x.long(), w, EPS, r)),
        ("residual of another dtype", lambda x, w, r: (x, w, EPS, r.half())),
        ("weight on another device", lambda x, w, r: (x, w.to("meta"), EPS, r)),
        ("x on another device", lambda x, w, r: (x.to("meta"), w, EPS, r)),
        ("a complex x, conjugated", lambda x, w, r: (torch.randn(x.shape, dtype=torch.complex64).to(x.device).conj(),
                                                     w, EPS, r)),
        ("weight not contiguous", lambda x, w, r: (x, torch.randn(80, device=x.device)[::2], EPS, r)),
        ("x's last dimension strided", lambda x, w, r: (torch.randn(2, 3, 80, device=x.device)[..., ::2], w, EPS, r)),
        ("eps True after eps 1", lambda x, w, r: (x, w, True, r)),
        ("eps nan", lambda x, w, r: (x, w, math.nan, r)),
        ("eps negative", lambda x, w, r: (x, w, -1e-6, r)),
        ("eps a list", lambda x, w, r: (x, w, [EPS], r)),
        ("residual not a tensor", lambda x, w, r: (x, w, EPS, [0.0])),
    ]  # fmt: skip


@pytest.mark.parametrize("bad", [c[1] for c in _rms_bad_after_good()], ids=[c[0] for c in _rms_bad_after_good()])
def test_a_bad_call_after_good_ones_of_the_same_shape_still_raises(bad):
    import fusionlab.kernels.rmsnorm as RN

    x, w, r = _t((2, 3, 40), seed=86), _t(40, seed=87), _t((2, 3, 40), seed=88)
    bx, bw, beps, br = bad(x, w, r)
    RN._PLANS.clear()
    fresh = _error(lambda: rmsnorm(bx, bw, beps, br))
    with torch.no_grad():
        for _ in range(2):  # the second good call launches the kept plan
            rmsnorm(x, w, EPS, r)
            rmsnorm(x, w, 1, r)  # (eps True must not find this one: True == 1)
    assert len(RN._PLANS) == 2
    with torch.no_grad():
        assert _error(lambda: rmsnorm(bx, bw, beps, br)) == fresh


def test_grad_mode_and_requires_grad_pick_the_path_after_a_kept_plan():
    # the same tensors' signature under no_grad, then with grad on and an input that requires grad: the
    # autograd path (a gradient), then no_grad again: no graph
    import fusionlab.kernels.rmsnorm as RN

    x, w = _t((3, 40), seed=89), _t(40, seed=90)
    RN._PLANS.clear()
    with torch.no_grad():
        rmsnorm(x, w, EPS)
        rmsnorm(x, w, EPS)
    xg = x.clone().requires_grad_(True)
    y = rmsnorm(xg, w, EPS)
    assert y.requires_grad
    y.sum().backward()
    assert xg.grad is not None and xg.grad.abs().sum() > 0
    assert not rmsnorm(x, w, EPS).requires_grad  # grad on, nothing requires it: a kept plan, no graph
    with torch.no_grad():
        assert not rmsnorm(xg, w, EPS).requires_grad
    assert len(RN._PLANS) == 4


def test_a_tensor_changed_in_place_is_read_through_its_new_strides():
    import fusionlab.kernels.rmsnorm as RN

    w = _t(40, seed=91)
    buf = _t(400, seed=92)
    x = buf[:120].view(3, 40)
    RN._PLANS.clear()
    with torch.no_grad():
        rmsnorm(x, w, EPS)
        rmsnorm(x, w, EPS)
        x.as_strided_((3, 40), (100, 1), 1)  # rows 100 apart, one element in: the same tensor object
        y = rmsnorm(x, w, EPS)
    _expect_close(y, rmsnorm_reference(x.double(), w.double(), EPS), 1e-5, 1e-5)
    assert len(RN._PLANS) == 2
