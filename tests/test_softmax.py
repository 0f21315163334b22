"""Lesson 4's row softmax: right against float64 on awkward shapes and values, both schedules (one tile,
online two-pass), backward against torch autograd, strided rows read in place, clear errors."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import DTYPES, gpu_only

from fusionlab import runtime
from fusionlab.grading import TOLERANCES, Sandbox, poisoned
from fusionlab.kernels import KernelInputError
from fusionlab.kernels.softmax import (
    GPU_TUNING,
    INTERPRETER_TUNING,
    online_softmax_reference_blocks,
    online_softmax_stats,
    softmax,
    softmax_config,
    softmax_eager,
    softmax_flops,
    softmax_ledger,
    softmax_reference,
)

pytestmark = [
    pytest.mark.lesson4,
    # an all -inf row computes -inf - (-inf) = NaN and 1 / 0 on purpose (torch gives NaN too); the
    # interpreter's numpy warns about both
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning"),
]

KERNEL, BWD_KERNEL, SPLIT_KERNEL = "_softmax_kernel", "_softmax_bwd_kernel", "_softmax_split_kernel"
#: the widest row held in one tile in this mode: wider rows take the online path
MAX_SINGLE = (GPU_TUNING["forward"] if runtime.is_gpu() else INTERPRETER_TUNING)["max_single"]

SHAPES = [
    (1, 1),  # one row of one element: one program, 15 of 16 lanes masked
    (1, 3),  # width 3
    (4, 1),  # width 1: softmax is 1 everywhere
    (37, 129),  # ragged: not a multiple of any block in either direction, several rows a program
    (65537, 3),  # many rows of width 3: many programs of many rows, the last one mostly padding
    (3, 4097),  # one past 4096: the online path in the interpreter, one tile on a GPU
    (2, 128256),  # a vocabulary-sized row: the online path in every mode, 32+ tiles a row
    (2, 3, 100),  # leading dims are rows
    (64, 256),  # the tiles divide the tensor in every mode: the unmasked loads and stores
    (2, 8192),  # the online path with whole tiles in the interpreter (unmasked), one tile on a GPU
]


def _x(shape, dtype=torch.float32, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g, dtype=torch.float64) * scale).to(runtime.DEVICE, dtype)


def _sandboxed(fn, *args, **kw):
    """Run with poisoned allocations (an element never written keeps the poison bits, even where the
    right answer is NaN) and counted launches."""
    with Sandbox() as box:
        out = fn(*args, **kw)
    assert box.writes_past_the_end() is None, "a store landed past the end of the output"
    return out, box


def _expect_close(y, expected, atol, rtol):
    assert y.shape == expected.shape and y.device == expected.device
    assert not poisoned(y).any(), f"{int(poisoned(y).sum())} elements never written"
    torch.testing.assert_close(y.double(), expected.double(), atol=atol, rtol=rtol, equal_nan=True)


def _softmax64(x):
    return torch.softmax(x.double(), -1)


# -- forward -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,atol,rtol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_forward_matches_float64_in_one_launch(shape, dtype, atol, rtol):
    x = _x(shape, dtype)
    x_before = x.clone()
    y, box = _sandboxed(softmax, x)
    assert y.dtype == dtype and y.is_contiguous()
    _expect_close(y, _softmax64(x), atol, rtol)
    _expect_one_launch(box, x)
    assert torch.equal(x, x_before), "the input was modified"


def _expect_one_launch(box, x):
    """One kernel and no torch pass over the data. The split schedule (GPU, wide rows) also zeroes its
    tickets and counts, rows + 1 int32: a memset of a few bytes a row, not a pass over x or y."""
    rows = x.numel() // max(1, x.shape[-1]) if x.dim() else 1
    if softmax_config(rows, x.shape[-1] if x.dim() else 1, x.dtype).get("SPLIT"):
        assert box.names == [SPLIT_KERNEL] and box.torch_ops == [] and box.passes == ["zeros"]
    else:
        assert box.names == [KERNEL] and box.torch_ops == [] and box.passes == []


@pytest.mark.parametrize(
    "shape, block_n",
    [
        ((5, 300), 16),  # 19 tiles a row, the last one 12 wide
        ((3, 1000), 64),
        ((1, 33), 32),  # two tiles, the second holds one element
        ((70, 50), 16),  # many short rows per program on the online path
    ],
)
def test_online_path_matches_float64(shape, block_n):
    x = _x(shape, seed=1)
    y, box = _sandboxed(softmax, x, block_n=block_n)
    _expect_close(y, _softmax64(x), 1e-6, 1e-5)
    assert box.names == [KERNEL]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("n", [1, 1000, 16384, 16385, 20000, 32768, 32769, 262144])
def test_gpu_config_row_pipeline_fits_shared_memory(n, dtype):
    """The GPU's persistent schedule stages whole rows in shared memory: it must fit an SM (227 KiB on
    an H100/H200), or the launch fails with OutOfResources (an fp32 row of 32768 took 384 KiB once)."""
    cfg = softmax_config(4096, n, dtype, gpu=True)
    staged = cfg["BLOCK_M"] * cfg["BLOCK_N"] * torch.empty((), dtype=dtype).element_size() * cfg.get("row_stages", 0)
    assert staged <= 227 * 1024
    if "programs" in cfg:
        assert cfg["SINGLE_TILE"] and cfg["row_stages"] > 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_gpu_config_persistent_rows_short_of_their_tile_take_half_the_warps(dtype):
    """A persistent row narrower than its 32768 tile runs with 16 warps (measured 2-5 points faster on
    an H200, a tie or better on an H100's call clock); a full tile keeps 32."""
    full = softmax_config(4096, 32768, dtype, gpu=True)
    assert full.get("programs") and full["num_warps"] == 32
    for n in (28000, 30001, 32000, 32767):
        cfg = softmax_config(4096, n, dtype, gpu=True)
        assert cfg.get("programs") and cfg["BLOCK_N"] == 32768 and cfg["num_warps"] == 16, (n, cfg)


@pytest.mark.parametrize("programs, row_stages", [(1, 1), (3, 2), (7, 2)])
@pytest.mark.parametrize("shape", [(37, 50), (2, 3, 129), (1, 7)], ids=lambda s: "x".join(map(str, s)))
def test_persistent_programs_cover_every_row(shape, programs, row_stages, monkeypatch):
    """The one-tile path launched with fewer programs than row blocks (the GPU tuning's persistent
    schedule): each program walks blocks pid, pid + P, ...; every row is written, none twice wrong."""
    from fusionlab.kernels.softmax import _check_input, _forward

    x = _x(shape, seed=2)
    layout = _check_input(x, -1, "softmax", grad=False)
    cfg = {**softmax_config(layout.n_rows, layout.n_cols, x.dtype), "programs": programs, "row_stages": row_stages}
    cfg["BLOCK_M"] = 2  # several blocks even for few rows, and a last block half past the end
    assert cfg["SINGLE_TILE"]
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")))  # poisoned y
    y = _forward(x, layout, cfg)
    _expect_close(y, _softmax64(x), 1e-6, 1e-5)
    # the online path is not persistent: a tuned program count must not cut its rows short
    online = {**cfg, "BLOCK_N": 16, "SINGLE_TILE": False}
    _expect_close(_forward(x, layout, online), _softmax64(x), 1e-6, 1e-5)


@pytest.mark.parametrize("block_n", [None, 16], ids=["config", "online"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_large_logits_do_not_overflow(dtype, block_n):
    # logits of +-1e4: exp(1e4) overflows every float type; after the max subtraction it is exp(0)
    x = _x((6, 77), torch.float64, seed=2, scale=1e4)
    x[0, 5] = x[0, 40] = 6e4  # a tie for the max (randn * 1e4 stays below 6e4; fp16 holds it)
    x = x.to(dtype)
    y, _ = _sandboxed(softmax, x, block_n=block_n)
    assert torch.isfinite(y).all()
    _expect_close(y, _softmax64(x), *TOLERANCES[dtype])
    assert y[0, 5].item() == pytest.approx(0.5, abs=1e-3) and y[0, 40].item() == pytest.approx(0.5, abs=1e-3)


def _nonfinite_rows(width):
    inf, nan = math.inf, math.nan
    x = _x((7, width), seed=3)
    x[0] = -inf  # all -inf: torch gives NaN
    x[1] = -inf
    x[1, width - 1] = 2.0  # one finite value in the last tile: y = one-hot
    x[2, 1] = inf  # +inf: NaN throughout
    x[3, width // 2] = nan  # NaN: NaN throughout
    x[4, : width // 2] = -inf  # a -inf prefix spanning whole tiles, then finite values
    x[5, 0] = -inf  # one masked-like lane
    return x  # row 6 stays plain


@pytest.mark.parametrize("block_n", [None, 16], ids=["config", "online"])
@pytest.mark.parametrize("width", [3, 100, 4097])
def test_nonfinite_rows_give_what_torch_gives(width, block_n):
    x = _nonfinite_rows(width)
    y, _ = _sandboxed(softmax, x, block_n=block_n)
    expected = torch.softmax(x, -1)  # torch on the same device: the promise is "what torch gives"
    assert torch.isnan(expected[0]).all() and torch.isnan(y[0]).all(), "an all -inf row is NaN, as in torch"
    assert torch.equal(torch.isnan(y), torch.isnan(expected))
    torch.testing.assert_close(y, expected, atol=1e-6, rtol=1e-5, equal_nan=True)
    assert y[1, width - 1].item() == 1.0 and (y[1, : width - 1] == 0).all()


def test_reference_and_eager():
    x = _x((5, 33), torch.float16)
    assert softmax_reference(x).dtype == torch.float16
    torch.testing.assert_close(softmax_reference(x), torch.softmax(x.float(), -1).half(), atol=0, rtol=0)
    x64 = _x((5, 33), torch.float64)
    assert softmax_reference(x64).dtype == torch.float64  # float64 is not rounded through fp32
    torch.testing.assert_close(softmax_eager(x), torch.softmax(x, -1), atol=0, rtol=0)


# -- strided rows ------------------------------------------------------------------------------------
def _strided_cases():
    base = _x((6, 10, 2 * 97), seed=4)
    return {
        "row-stride-2N": base[0, :, :97],  # rows of a wider buffer: one level, stride 194
        "every-other-row": base[:, ::2, :97],  # two levels: (5, 194*2), (6, 1940)
        "transposed-leading": base[:, :, :97].transpose(0, 1),  # two levels, outer stride < inner
        "expanded-rows": base[0, 0, :97].expand(4, 97),  # stride 0: four reads of one row
        "size-1-dims": base[:1, 3:5, :97].unsqueeze(1),  # (1, 1, 2, 97): size-1 dims are dropped
    }


@pytest.mark.parametrize("case", list(_strided_cases()))
def test_strided_rows_are_read_in_place(case):
    x = _strided_cases()[case]
    assert not x.is_contiguous()
    y, box = _sandboxed(softmax, x)
    _expect_close(y, _softmax64(x), 1e-6, 1e-5)
    assert y.shape == x.shape and y.is_contiguous()
    assert box.names == [KERNEL] and box.passes == [], "strided rows are read in place, not copied"


def test_strided_rows_on_the_online_path():
    x = _x((4, 2, 300), seed=5)[:, 1, :]  # row stride 600
    y, _ = _sandboxed(softmax, x, block_n=32)
    _expect_close(y, _softmax64(x), 1e-6, 1e-5)


def test_unmergeable_leading_dims_are_refused():
    x = _x((4, 4, 4, 8), seed=6)[::2, ::2, ::2]  # three levels of row strides
    with pytest.raises(KernelInputError, match="two row strides.*contiguous"):
        softmax(x)
    torch.testing.assert_close(softmax(x.contiguous()), softmax_reference(x), atol=1e-6, rtol=1e-5)


def test_last_dim_must_have_stride_1():
    x = _x((8, 6), seed=7).t()
    with pytest.raises(KernelInputError, match="stride 1"):
        softmax(x)


# -- backward ----------------------------------------------------------------------------------------
BWD_SHAPES = [
    (1, 1),
    (1, 3),
    (37, 129),  # several rows a program
    (3, 4097),  # online backward in the interpreter (two passes over y and dy)
    (2, 128256),  # online backward everywhere
    (2, 3, 100),
    (64, 256),  # unmasked
    (2, 8192),  # online and unmasked in the interpreter
    (5, 2500),  # a forward head and tail in the interpreter, one backward tile (it holds no tail)
    (3, 10000),  # the same on a GPU
]


@pytest.mark.parametrize("dtype,atol,rtol", DTYPES)
@pytest.mark.parametrize("shape", BWD_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_backward_matches_autograd_float64(shape, dtype, atol, rtol):
    x = _x(shape, dtype, seed=8)
    dy = _x(shape, dtype, seed=9, scale=1.0)
    x64 = x.double().requires_grad_()
    torch.softmax(x64, -1).backward(dy.double())

    xg = x.clone().requires_grad_()
    y = softmax(xg)
    assert y.grad_fn is not None
    dy_before = dy.clone()
    with Sandbox() as box:  # autograd.grad: no accumulation into .grad (a copy the engine may make)
        (dx,) = torch.autograd.grad(y, xg, dy)
    assert box.names == [BWD_KERNEL] and box.torch_ops == [] and box.passes == []
    assert dx.dtype == dtype and not poisoned(dx).any()
    # y is saved in x's dtype, so the gradient carries y's rounding: compare relative to the largest
    scale = x64.grad.abs().max().item()
    torch.testing.assert_close(dx.double(), x64.grad, atol=atol * max(scale, 1.0), rtol=rtol)
    assert torch.equal(dy, dy_before), "the incoming gradient was modified"


def _dy_layouts(shape):
    n = shape[-1]
    return {
        "row-stride-2N": _x((*shape[:-1], 2 * n), seed=10)[..., :n],
        "two-levels": _x((shape[0], 2 * shape[1], n), seed=11)[:, ::2],
    }


@pytest.mark.parametrize("layout", ["row-stride-2N", "two-levels"])
@pytest.mark.parametrize("width", [50, 4097])
def test_backward_reads_strided_gradients_in_place(layout, width):
    shape = (3, 4, width)
    dy = _dy_layouts(shape)[layout]
    assert dy.stride(-1) == 1 and not dy.is_contiguous()
    x = _x(shape, seed=12)
    x64 = x.double().requires_grad_()
    torch.softmax(x64, -1).backward(dy.double())
    xg = x.clone().requires_grad_()
    y = softmax(xg)
    with Sandbox() as box:
        (dx,) = torch.autograd.grad(y, xg, dy)
    assert box.names == [BWD_KERNEL] and box.passes == [], "a strided gradient is read in place"
    torch.testing.assert_close(dx.double(), x64.grad, atol=1e-6, rtol=1e-5)


def test_backward_of_sum_takes_an_expanded_gradient():
    # y.sum() hands back a gradient of stride 0 everywhere: copied to a dense one, then the kernel
    x = _x((5, 40), seed=13).requires_grad_()
    softmax(x).sum().backward()
    assert x.grad.abs().max().item() < 1e-6  # sum(softmax) = 1 whatever x: zero gradient
    x2 = _x((5, 40), seed=13).requires_grad_()
    w = _x((40,), seed=14)
    (softmax(x2) * w).sum().backward()  # gradient w broadcast over the rows: stride (0, 1)
    x64 = x2.detach().double().requires_grad_()
    (torch.softmax(x64, -1) * w.double()).sum().backward()
    torch.testing.assert_close(x2.grad.double(), x64.grad, atol=1e-6, rtol=1e-5)


def test_backward_through_a_strided_input():
    x64 = _x((6, 10, 40), torch.float64, seed=15)
    x = x64.float()[:, ::2].requires_grad_()  # the graph starts at a strided view
    w = _x((6, 5, 40), seed=16)
    (softmax(x) * w).sum().backward()
    xr = x64[:, ::2].clone().requires_grad_()
    (torch.softmax(xr, -1) * w.double()).sum().backward()
    torch.testing.assert_close(x.grad.double(), xr.grad, atol=1e-6, rtol=1e-5)


def test_no_graph_without_grad():
    x = _x((3, 8)).requires_grad_()
    with torch.no_grad():
        assert softmax(x).grad_fn is None
    assert softmax(x.detach()).grad_fn is None


def test_gradcheck_float32_against_finite_differences():
    # fp32 kernels, so only a loose finite-difference check: the exact one is against float64 autograd
    x = _x((2, 7), seed=17)
    x64 = x.double().requires_grad_()
    dy = _x((2, 7), seed=18)
    xg = x.clone().requires_grad_()
    softmax(xg).backward(dy)
    eps = 1e-3
    for i, j in [(0, 0), (1, 6), (0, 3)]:
        e = torch.zeros_like(x64)
        e[i, j] = eps
        fd = ((torch.softmax(x64 + e, -1) - torch.softmax(x64 - e, -1)) * dy.double()).sum() / (2 * eps)
        assert xg.grad[i, j].item() == pytest.approx(fd.item(), abs=1e-5)


# -- online softmax statistics ------------------------------------------------------------------------
STATS_CASES = [
    ((5, 300), 1),  # a tile per element: 300 rescalings a row
    ((5, 300), 16),
    ((1, 1), 16),
    ((40, 7), 64),  # many rows a program, one tile a row
    ((3, 4097), 64),
    ((3, 4097), None),  # the kernel's own tile
    ((40, 7), None),
]


@pytest.mark.parametrize(
    "shape, block", STATS_CASES, ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v)
)
def test_online_stats_match_the_float64_recurrence(shape, block):
    x = _x(shape, seed=19)
    x[0, : shape[1] // 2] = -math.inf  # a row whose first tiles hold only -inf
    (m, l), box = _sandboxed(online_softmax_stats, x, block)
    assert box.names == [KERNEL] and m.dtype == l.dtype == torch.float32 and m.shape == l.shape == shape[:-1]
    m64, l64 = online_softmax_reference_blocks(x, block or 64)
    torch.testing.assert_close(m.double(), m64, atol=0, rtol=0)  # a max is exact
    torch.testing.assert_close(l.double(), l64, atol=0, rtol=2e-6)
    # and they are the softmax's normaliser: exp(x - m) / l is the softmax, m + log l the logsumexp
    y = torch.exp(x.double() - m64[:, None]) / l64[:, None]
    torch.testing.assert_close(y, _softmax64(x), atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(m64 + torch.log(l64), torch.logsumexp(x.double(), -1), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("block", [1, 3, 16, 1000])
def test_reference_recurrence_is_the_softmax_for_any_block(block):
    x = _x((4, 257), torch.float64, seed=20, scale=30.0)  # large logits: many rescalings
    m, l = online_softmax_reference_blocks(x, block)
    torch.testing.assert_close(torch.exp(x - m[:, None]) / l[:, None], _softmax64(x), atol=1e-14, rtol=1e-12)
    torch.testing.assert_close(m, x.amax(-1), atol=0, rtol=0)


def test_reference_recurrence_all_neg_inf_row():
    x = torch.full((1, 10), -math.inf, dtype=torch.float64)
    m, l = online_softmax_reference_blocks(x, 4)
    assert m.item() == -math.inf and l.item() == 0.0
    assert torch.isnan(torch.exp(x - m[:, None]) / l[:, None]).all()  # NaN, as torch.softmax


def test_online_stats_leading_dims_and_errors():
    x = _x((2, 3, 50), seed=21)
    m, l = online_softmax_stats(x, 16)
    assert m.shape == (2, 3)
    torch.testing.assert_close(
        m.double() + torch.log(l.double()), torch.logsumexp(x.double(), -1), atol=1e-6, rtol=1e-6
    )
    with pytest.raises(KernelInputError, match="block=3 must be a power of two"):
        online_softmax_stats(x, 3)
    with pytest.raises(KernelInputError, match="requires grad"):
        online_softmax_stats(x.clone().requires_grad_())
    with pytest.raises(ValueError, match="block must be"):
        online_softmax_reference_blocks(x, 0)


# -- edge shapes and bad input -----------------------------------------------------------------------
def test_empty_inputs_launch_nothing():
    for shape in [(0, 8), (3, 0), (2, 0, 5)]:
        x = torch.empty(shape, device=runtime.DEVICE)
        y, box = _sandboxed(softmax, x)
        assert y.shape == shape and box.names == []
    m, l = online_softmax_stats(torch.empty(0, 8, device=runtime.DEVICE))
    assert m.shape == (0,) and l.shape == (0,)


def test_scalar_is_one_row_of_one():
    x = torch.tensor(3.0, device=runtime.DEVICE)
    y = softmax(x)
    assert y.shape == () and y.item() == 1.0


def test_dim_must_be_the_last():
    x = _x((4, 5, 6))
    torch.testing.assert_close(softmax(x, dim=2), softmax(x, dim=-1), atol=0, rtol=0)
    with pytest.raises(KernelInputError, match=r"last dimension only.*transpose\(0, -1\)"):
        softmax(x, dim=0)
    with pytest.raises(KernelInputError, match="not a dimension"):
        softmax(x, dim=3)
    with pytest.raises(KernelInputError, match="not a dimension"):
        softmax(x, dim=True)


def test_bad_inputs_are_refused():
    x = _x((4, 8))
    with pytest.raises(KernelInputError, match="x is on meta"):
        softmax(torch.empty(4, 8, device="meta"))
    if runtime.is_gpu():
        with pytest.raises(KernelInputError, match="x is on cpu"):
            softmax(torch.randn(4, 8))
    with pytest.raises(KernelInputError, match="x has dtype int32"):
        softmax(x.to(torch.int32))
    with pytest.raises(KernelInputError, match="x has dtype float64"):
        softmax(x.double())
    with pytest.raises(KernelInputError, match="negated"):
        softmax(torch._neg_view(x))
    with pytest.raises(KernelInputError, match="must be a torch.Tensor"):
        softmax([1.0, 2.0])
    with pytest.raises(KernelInputError, match="block_n=24 must be a power of two"):
        softmax(x, block_n=24)
    with pytest.raises(KernelInputError, match="num_warps=64 is over the limit"):
        softmax(x, num_warps=64)


# -- configuration and ledger ------------------------------------------------------------------------
@pytest.mark.parametrize("gpu", [True, False], ids=["gpu", "interpreter"])
@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "bwd"])
@pytest.mark.parametrize("rows, n", [(1, 1), (65537, 3), (4096, 1000), (8, 32768), (4, 32769), (2, 262144)])
def test_configs_are_legal(rows, n, backward, gpu):
    cfg = softmax_config(rows, n, torch.float16, backward=backward, gpu=gpu)
    for b in (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"]):
        assert b >= 1 and b & (b - 1) == 0
    assert cfg["BLOCK_M"] * cfg["BLOCK_N"] <= 2**20 and cfg["num_warps"] <= 32
    assert cfg["BLOCK_M"] <= max(1, 2 * rows)
    tuning = (GPU_TUNING["backward" if backward else "forward"]) if gpu else INTERPRETER_TUNING
    assert cfg["SINGLE_TILE"] == (n <= tuning["max_single"])
    if cfg["SINGLE_TILE"]:
        assert n <= cfg["BLOCK_N"] + cfg.get("TAIL_N", 0)  # the whole row in one tile (or a head and a tail)
    # (the online path may also use one tile: the backward's second pass then re-reads it from L2)


def test_gpu_online_path_keeps_the_row_in_l2_for_its_second_pass():
    # (forward rows of 65536 to 64 split parts are split across programs; wider ones are online)
    for backward, n in [(False, 2**20), (True, 32768)]:
        cfg = softmax_config(1024, n, torch.bfloat16, backward=backward, gpu=True)
        assert not cfg["SINGLE_TILE"] and (cfg["EVICT_1"], cfg["EVICT_2"]) == ("evict_last", "evict_first")
    assert "EVICT_1" not in softmax_config(1024, 4096, torch.bfloat16, gpu=True)  # read once: no hint


def test_kernels_take_the_eviction_hints():
    # the interpreter ignores the hints, but it checks that the kernels accept them on every path
    from fusionlab.kernels.softmax import _backward, _forward
    from fusionlab.kernels.softmax import _rows_of as _rows

    x = _x((3, 300), seed=23)
    cfg = {**softmax_config(3, 300, torch.float32), "BLOCK_N": 64, "SINGLE_TILE": False}
    cfg.update(EVICT_1="evict_last", EVICT_2="evict_first")
    y = _forward(x, _rows(x), cfg)
    _expect_close(y, _softmax64(x), 1e-6, 1e-5)
    dy = _x((3, 300), seed=24)
    expected = torch._softmax_backward_data(dy.double(), y.double(), -1, torch.float64)
    _expect_close(_backward(y, dy, cfg), expected, 1e-6, 1e-5)


def test_gpu_holds_rows_up_to_32k_in_one_tile():
    # the bar: rows up to 32k read once; wider rows are the online path (and its re-read)
    for dtype in (torch.float32, torch.bfloat16):
        assert softmax_config(4096, 32768, dtype, gpu=True)["SINGLE_TILE"]
        assert not softmax_config(4096, 65536, dtype, gpu=True)["SINGLE_TILE"]


def test_gpu_splits_wide_rows_across_programs():
    t = GPU_TUNING["forward"]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        chunk = t["split_bytes"] // torch.empty((), dtype=dtype).element_size()
        for n in (32769, 65536, 100_003, chunk * t["max_split"]):
            cfg = softmax_config(4096, n, dtype, gpu=True)
            assert cfg["SPLIT"] == -(-n // chunk) and cfg["BLOCK_N"] == chunk and cfg["BLOCK_M"] == 1
            assert (
                cfg["SPLIT"] <= t["max_split"] and cfg["num_warps"] == t["split_bytes"] // t["split_thread_bytes"] // 32
            )
            # the row is on chip, across its programs: the ledger has no re-read
            assert softmax_ledger(4096, n, dtype, block=n).fused_bytes == 2 * 4096 * n * dtype.itemsize
        wider = chunk * t["max_split"] + 1  # more parts than the limit: the online path
        assert "SPLIT" not in softmax_config(4096, wider, dtype, gpu=True)
        assert "SPLIT" not in softmax_config(4096, 32768, dtype, gpu=True)  # one tile
        assert "SPLIT" not in softmax_config(4096, 65536, dtype, gpu=True, backward=True)  # forward only
        assert "SPLIT" not in softmax_config(4096, 65536, dtype, gpu=False)  # the interpreter would wait for ever


def test_gpu_padded_rows_are_split_where_parts_fit_better():
    # a persistent one-tile row pads to 32768: rows that parts of 4096 or 8192 fill much better go split
    for n, part in ((16392, 4096), (20000, 4096), (24576, 8192)):
        cfg = softmax_config(4096, n, torch.bfloat16, gpu=True)
        assert (cfg.get("SPLIT"), cfg["BLOCK_N"]) == (-(-n // part), part), (n, cfg)
    for n in (28000, 32000, 32768):  # the tile nearly full: one program a row, persistent
        assert softmax_config(4096, n, torch.bfloat16, gpu=True).get("programs")
    for n in (20000, 24576):
        assert "SPLIT" not in softmax_config(4096, n, torch.float32, gpu=True)  # fp32: not persistent, not measured
        assert "SPLIT" not in softmax_config(4096, n, torch.bfloat16, gpu=True, split=False)
        assert "SPLIT" not in softmax_config(4096, n, torch.bfloat16, gpu=True, backward=True)


def test_sixteen_byte_unit():
    from fusionlab.kernels._rows import unit_of as _unit

    assert _unit(torch.bfloat16, 17000, 17000) == 8 and _unit(torch.float32, 1000, 1000, 0) == 4
    assert _unit(torch.float16, 1000, 1008) == 8  # a stride of 16 with a row of 8: still 8
    assert _unit(torch.bfloat16, 4096, 4096) == 1  # Triton already knows multiples of 16
    assert _unit(torch.bfloat16, 17001, 17001) == 1 and _unit(torch.bfloat16, 1000, 1004) == 1  # not 16-byte rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("layout", ["contiguous", "strided", "two-level"])
def test_sixteen_byte_rows_forward_and_backward(layout, dtype):
    """Rows of 1000 elements (a multiple of 8 and 4, not 16): the launchers pass lengths and strides
    divided by the 16-byte unit and the kernels multiply them back; right against float64 both ways."""
    from fusionlab.kernels._rows import unit_of as _unit
    from fusionlab.kernels.softmax import _rows_of as _rows

    base = _x((6, 4, 1008), dtype, seed=51)
    x = {"contiguous": base[..., :1000].contiguous(), "strided": base[:, 1, :1000], "two-level": base[:, :3, :1000]}[
        layout
    ]
    r = _rows(x)
    assert _unit(dtype, r.n_cols, r.stride_b, r.stride_m) > 1
    xg = x.detach().clone().requires_grad_()
    y = softmax(xg)
    _expect_close(y, _softmax64(x), *TOLERANCES[dtype])
    dy = _x(x.shape, dtype, seed=52)
    y.backward(dy)
    xd = x.detach().double().requires_grad_()
    torch.softmax(xd, -1).backward(dy.double())
    _expect_close(xg.grad, xd.grad, *TOLERANCES[dtype])


@pytest.mark.parametrize("dtype,atol,rtol", DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "strided"])
@pytest.mark.parametrize("rows, n", [(1, 2500), (37, 3000), (5, 2064)])
def test_head_and_tail_rows(rows, n, layout, dtype, atol, rtol):
    """Rows that fit three quarters of their one tile: a head of half the tile and a tail (TAIL_N).
    Every element against float64, poisoned output, one kernel, the input unchanged; the maximum in
    the tail, -inf rows and a tail of only -inf."""
    base = _x((rows, n + 40), dtype, seed=64, scale=5.0)
    x = base[:, :n] if layout == "strided" else base[:, :n].contiguous()
    cfg = softmax_config(rows, n, dtype)
    assert cfg["SINGLE_TILE"] and cfg["TAIL_N"] and cfg["BLOCK_N"] < n <= cfg["BLOCK_N"] + cfg["TAIL_N"]
    x[0, -1] = 1e4  # row 0's maximum in its tail
    if rows > 2:
        x[1] = float("-inf")
        x[2, cfg["BLOCK_N"] :] = float("-inf")  # a tail of only -inf
    before = x.clone()
    y, box = _sandboxed(softmax, x)
    _expect_close(y, _softmax64(x), atol, rtol)
    _expect_one_launch(box, x)
    assert torch.equal(x, before), "the input was modified"


@pytest.mark.parametrize("block_n", [4096, 2048, 1024], ids=["one-tile", "head-wide", "online"])
def test_a_tile_asked_for_replaces_the_head_and_tail(block_n):
    # rows of 2500 take a head of 2048 and a tail by default; block_n asked for is the whole tile
    x = _x((3, 2500), seed=66)
    assert softmax_config(3, 2500, x.dtype).get("TAIL_N")
    y, box = _sandboxed(softmax, x, block_n=block_n)
    _expect_close(y, _softmax64(x), *TOLERANCES[torch.float32])
    assert box.names == [KERNEL]


def test_head_and_tail_config():
    for n, head, tail in ((3000, 2048, 1024), (5000, 4096, 1024), (10000, 8192, 2048), (12288, 8192, 4096)):
        cfg = softmax_config(4096, n, torch.bfloat16, gpu=True)
        assert (cfg["BLOCK_N"], cfg.get("TAIL_N"), cfg["SINGLE_TILE"]) == (head, tail, True), (n, cfg)
    for n in (12289, 16384, 4096, 2048, 20000):  # past three quarters, a full tile, or a persistent/split row
        assert "TAIL_N" not in softmax_config(4096, n, torch.bfloat16, gpu=True), n
    for gpu in (True, False):  # the backward kernel holds one tile: never a head and a tail
        for n in (2500, 10000):
            assert "TAIL_N" not in softmax_config(4, n, torch.float32, gpu=gpu, backward=True)
    # the ledger counts one read for a head and a tail (the lesson's suite passes the whole row)
    assert sm_ledger_reads(10000) == 1


def sm_ledger_reads(n: int) -> int:
    from fusionlab.lessons.l4.suite import sm_ledger

    led = sm_ledger(4096, n)
    return round(led.fused_bytes / (4096 * n * 2)) - 1  # reads of x, less y's write


def test_split_false_is_the_online_path_with_its_tuning():
    split = softmax_config(8, 65536, torch.bfloat16, gpu=True)
    online = softmax_config(8, 65536, torch.bfloat16, gpu=True, split=False)
    assert split["SPLIT"] and "SPLIT" not in online and online["EVICT_1"] == "evict_last"
    assert online["BLOCK_N"] == GPU_TUNING["forward"]["wide_block"]


def test_a_tile_asked_for_is_never_split(monkeypatch):
    # what softmax() launches with block_n given: one program a row, whatever the mode's tuning
    from fusionlab.kernels import softmax as sm

    seen = []
    monkeypatch.setattr(sm, "_forward", lambda x, layout, cfg: seen.append(cfg) or torch.empty_like(x))
    monkeypatch.setattr(sm.runtime, "is_gpu", lambda: True)
    x = _x((2, 65536))
    sm.softmax(x)
    sm.softmax(x, block_n=4096)
    sm.softmax(x, split=False)
    assert seen[0].get("SPLIT") and "SPLIT" not in seen[1] and seen[1]["BLOCK_N"] == 4096
    assert "SPLIT" not in seen[2] and not seen[2]["SINGLE_TILE"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_ledger_counts_the_trips(dtype):
    es = torch.empty((), dtype=dtype).element_size()
    rows, n = 64, 1000
    led = softmax_ledger(rows, n, dtype, block=1024)
    assert led.unfused_bytes == (8 * rows * n + 4 * rows) * es  # Triton tutorial 02's count
    assert led.fused_bytes == 2 * rows * n * es  # read x, write y
    wide = softmax_ledger(rows, n, dtype, block=256)
    assert wide.unfused_bytes == led.unfused_bytes
    assert wide.fused_bytes == 3 * rows * n * es  # the re-read
    assert "reread" in wide.table() and "reread" not in led.table()
    bwd = softmax_ledger(rows, n, dtype, block=1024, backward=True)
    assert bwd.fused_bytes == 3 * rows * n * es  # read y, dy; write dx
    assert softmax_ledger(rows, n, dtype, block=256, backward=True).fused_bytes == 5 * rows * n * es
    assert softmax_flops(rows, n) == 5 * rows * n and softmax_flops(rows, n, backward=True) == 4 * rows * n


@pytest.mark.parametrize(
    "shape, even",
    [((64, 256), (True, True)), ((2, 8192), (True, True)), ((37, 129), (False, False)), ((65537, 3), (False, False))],
)
def test_unmasked_paths_only_when_tiles_divide(shape, even):
    from fusionlab.kernels.softmax import _launch_flags
    from fusionlab.kernels.softmax import _rows_of as _rows

    x = _x(shape)
    flags = _launch_flags(_rows(x), softmax_config(*shape, torch.float32))
    assert (flags["EVEN_M"], flags["EVEN_N"]) == even


def test_ledger_default_block_is_what_the_launcher_does():
    for n in (100, MAX_SINGLE, MAX_SINGLE + 1, 2**20):
        cfg = softmax_config(8, n, torch.float32)
        once = cfg["SINGLE_TILE"] or cfg.get("SPLIT")
        assert softmax_ledger(8, n, torch.float32).fused_bytes == (2 if once else 3) * 8 * n * 4


# -- GPU only: sizes the interpreter cannot take ------------------------------------------------------
@pytest.mark.gpu
@gpu_only
def test_gpu_rows_times_width_past_2_31():
    rows, n = 65537, 32768  # 2**31 + 32768 elements: int32 offsets would wrap on the last row
    x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
    y = softmax(x)
    for r in (0, rows // 2, rows - 1):
        atol, rtol = TOLERANCES[torch.bfloat16]
        torch.testing.assert_close(y[r].double(), _softmax64(x[r]), atol=atol, rtol=rtol)
    del y
    x.requires_grad_()
    y = softmax(x)
    y.backward(y.detach())  # dy = y: dx = y * (y - sum y^2)
    yy = y.detach()[-1].double()
    torch.testing.assert_close(x.grad[-1].double(), yy * (yy - (yy * yy).sum()), atol=1e-4, rtol=2e-2)


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("rows, n", [(1000, 28000), (997, 30001), (600, 32768)])
def test_gpu_persistent_rows_every_row_right(rows, n, dtype):
    """Rows wider than 16384 in one tile: fewer programs than rows, each walking several (the GPU's
    persistent schedule, softmax_config's ``programs``); every row checked, the output poisoned first."""
    assert softmax_config(rows, n, dtype).get("programs", rows) < rows
    x = _x((rows, n), dtype, seed=23, scale=10.0)
    y, box = _sandboxed(softmax, x)
    _expect_close(y, _softmax64(x), *TOLERANCES[dtype])
    assert box.names == [KERNEL]


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("n", [32768, 65536, 262144, 100_003])
def test_gpu_wide_rows(n, dtype):
    x = _x((5, n), dtype, seed=22, scale=10.0)
    _expect_close(softmax(x), _softmax64(x), *TOLERANCES[dtype])


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize(
    "rows, n",
    [
        (1, 32769),  # one row, its last part one element wide
        (1000, 16392),  # a row that would pad its one tile to 32768: five parts of 4096, the last of 8
        (997, 20000),  # the same, 16-byte rows that are not a multiple of 16 elements (UNIT)
        (300, 24576),  # three parts of 8192
        (3, 65536),  # parts that divide the row: the unmasked loads
        (1000, 40000),  # many programs, far more than the GPU holds at once
        (7, 100_003),  # odd: rows off 16-byte boundaries, a 16-byte body and fragments at both ends
        (64, 50257),  # GPT-2's vocabulary
        (2, 524288),  # bf16: 64 parts, the limit; fp32: past it, the online path
    ],
)
def test_gpu_split_rows_every_part_right(rows, n, dtype):
    """Rows split across programs that swap their statistics: every element checked against float64,
    the output poisoned first, the input unchanged, one kernel; parts of only -inf, a row of only -inf
    (NaN, as torch), a logit of 1e4 in one part and -1e4 in another."""
    x = _x((rows, n), dtype, seed=31, scale=10.0)
    x[0, : n // 2] = float("-inf")  # whole parts of -inf, the max in a later part
    x[-1, n // 3] = 1e4
    x[-1, -1] = -1e4
    if rows > 2:
        x[1] = float("-inf")
    before = x.clone()
    y, box = _sandboxed(softmax, x)
    _expect_close(y, _softmax64(x), *TOLERANCES[dtype])
    _expect_one_launch(box, x)
    assert torch.equal(x, before), "the input was modified"


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("width", [70_000, 70_001], ids=["aligned", "odd"])
def test_gpu_split_rows_strided_and_two_level(width):
    # an odd width: contiguous rows take the fragments path (16-byte body), these strided ones do not
    base = _x((4, 3, width), torch.bfloat16, seed=32)
    for x in (base[:, 1], base.transpose(0, 1), base[::2], base[1:3].reshape(-1, width)[1:]):
        assert softmax_config(x.numel() // x.shape[-1], x.shape[-1], x.dtype).get("SPLIT")
        _expect_close(softmax(x), _softmax64(x), *TOLERANCES[torch.bfloat16])


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("rows, n", [(300, 8193), (997, 2055), (524289, 4097)], ids=["8193", "2055", "2**31"])
def test_gpu_odd_rows(rows, n):
    """Rows off 16-byte boundaries on the GPU (a head and a tail where the row fits three quarters of
    its tile), and rows x width past 2**31 (row starts in int64); rows against float64."""
    x = _x((rows, n), torch.bfloat16, seed=63, scale=10.0) if rows < 10**5 else None
    if x is None:
        x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
    y = softmax(x)
    for r in sorted({0, 1, rows // 2, rows - 2, rows - 1}):
        _expect_close(y[r], _softmax64(x[r]), *TOLERANCES[torch.bfloat16])


@pytest.mark.gpu
@gpu_only
@pytest.mark.parametrize("rows, n", [(300, 10000), (997, 5000), (64, 12288), (5, 11008)])
def test_gpu_head_and_tail_rows(rows, n):
    x = _x((rows, n), torch.bfloat16, seed=65, scale=10.0)
    x[0, -1] = 1e4
    x[1, 8192 if n > 8192 else 4096 :] = float("-inf")
    assert softmax_config(rows, n, x.dtype).get("TAIL_N")
    y, box = _sandboxed(softmax, x)
    _expect_close(y, _softmax64(x), *TOLERANCES[torch.bfloat16])
    assert box.names == [KERNEL]


@pytest.mark.gpu
@gpu_only
def test_gpu_split_rows_times_width_past_2_31():
    rows, n = 16385, 131072  # 2**31 + 131072 elements, 16 parts a row
    x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
    assert softmax_config(rows, n, x.dtype)["SPLIT"] == 16
    y = softmax(x)
    for r in (0, rows // 2, rows - 1):
        torch.testing.assert_close(
            y[r].double(), _softmax64(x[r]), atol=TOLERANCES[torch.bfloat16][0], rtol=TOLERANCES[torch.bfloat16][1]
        )
