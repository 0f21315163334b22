"""Lesson 5's fused cross-entropy: F.cross_entropy's contract, against float64, loss and gradient."""

from __future__ import annotations

import itertools
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import cross_entropy_by_hand, gpu_only

from fusionlab import runtime
from fusionlab.grading import Sandbox
from fusionlab.instrument import LaunchCounter
from fusionlab.kernels import KernelInputError, _launch
from fusionlab.kernels import _cross_entropy_kernels as cek
from fusionlab.kernels import cross_entropy as ce
from fusionlab.kernels._launch import dram_gbps, next_pow2
from fusionlab.kernels.cross_entropy import (
    FORWARD_TILE,
    MAX_SPLIT,
    ROWS_MAX,
    ROWS_MIN,
    ROWS_MIN_DRAM_GBPS,
    SPLIT_BYTES,
    SPLIT_EXTRA,
    SPLIT_MAXNREG,
    SPLIT_MIN,
    SPLIT_MIN_16,
    SPLIT_TAIL,
    CrossEntropyFunction,
    cross_entropy,
    cross_entropy_config,
    cross_entropy_eager,
    cross_entropy_ledger,
    cross_entropy_reference,
)

pytestmark = [
    pytest.mark.lesson5,
    # the interpreter computes -inf - -inf and exp(-inf) in numpy (masked lanes): right, but it warns
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning"),  # 1/d of an ignored row
]

FWD = "_cross_entropy_fwd_kernel"
BWD = "_cross_entropy_bwd_kernel"
PRO = "_cross_entropy_prologue_kernel"  # the mean's count (and the split's zeroed tickets)
FIN = "_cross_entropy_finish_kernel"  # the rows' losses summed (and divided, and cast)
ROWS = "_cross_entropy_rows_kernel"  # persistent programs, whole rows (the H200's, 28673-32767 logits)
SPLIT = "_cross_entropy_split_kernel"  # rows split across programs (GPU)


def _launches(reduction, kernel=FWD):
    """What a forward launches, and no torch op: the prologue for "mean" (its count) and for split rows
    (their tickets start from zero), the loss kernel, and the finish kernel for "mean" and "sum"."""
    split = kernel not in (FWD, ROWS)
    return [PRO] * (reduction == "mean" or split) + [kernel] + [FIN] * (reduction != "none")


DTYPES = [
    pytest.param(torch.float32, 2e-5, 2e-5, id="fp32"),
    pytest.param(torch.float16, 2e-3, 1e-2, id="fp16"),
]
if runtime.is_gpu():
    DTYPES.append(pytest.param(torch.bfloat16, 1e-2, 2e-2, id="bf16"))  # the interpreter has no bf16

# (tokens, vocab), each with the path it hits; the interpreter keeps 4096 columns on chip (HEAD), a GPU
# 64 KiB of row
SHAPES = [
    (1, 2),  # one row, the smallest vocabulary: 14 of 16 lanes masked
    (5, 3),  # odd, tiny: the aligned window starts before the row (VEC lanes of lead)
    (37, 1000),  # many rows, one tile
    (6, 4097),  # one column past the interpreter's head tile: a streamed tail of one element
    (3, 50257),  # GPT-2's odd vocabulary: unaligned rows, several streamed tiles
]
WIDE = [(2, 128256), (2, 151936)]  # Llama 3 and Qwen 2 vocabularies: many streamed tiles (no 65536 limit)
REDUCTIONS = ["mean", "sum", "none"]


def _inputs(tokens, vocab, dtype, *, seed=0, ignored=0.3, scale=3.0, ignore_index=-100):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(tokens, vocab, generator=g) * scale).to(runtime.DEVICE, dtype)
    t = torch.randint(0, vocab, (tokens,), generator=g)
    if ignored:
        drop = torch.rand(tokens, generator=g) < ignored
        if tokens > 1:  # at least one ignored row and one kept row
            drop[0], drop[-1] = True, False
        t[drop] = ignore_index
    return x, t.to(runtime.DEVICE)


def _expected(x, t, reduction, w=None, **kw):
    """float64 loss and gradient of sum(loss * w) (w: per-row weights for "none", a scalar otherwise)."""
    xd = x.detach().double().requires_grad_()
    loss = F.cross_entropy(xd, t, reduction=reduction, **kw)
    w = torch.ones_like(loss) if w is None else w.double()
    (loss * w).sum().backward()
    return loss.detach(), xd.grad


def _run(x, t, reduction, w=None, **kw):
    """Our loss and gradient of sum(loss * w), with every allocation poisoned and launches counted."""
    x = x.detach().clone().requires_grad_()
    with Sandbox() as counter:
        loss = cross_entropy(x, t, reduction=reduction, **kw)
    w = torch.ones_like(loss) if w is None else w.to(loss.dtype)
    (loss * w).sum().backward()
    return loss.detach(), x.grad, counter


def _run_cfg(x, t, reduction, cfg, w=None, *, smoothing=0.0, inplace=False):
    """As :func:`_run`, through ``CrossEntropyFunction`` with the configuration ``cfg`` (a kernel chosen
    by the test). Returns the loss, the logits' copy (``.grad`` the gradient; in place, the same memory)
    and the launches counted during the forward."""
    xl = x.detach().clone().requires_grad_()
    with Sandbox() as counter:
        loss = CrossEntropyFunction.apply(xl, t, -100, reduction, smoothing, inplace, cfg)
    (loss * (torch.ones_like(loss) if w is None else w.to(loss.dtype))).sum().backward()
    return loss.detach(), xl, counter


def _without(cfg, *kernels):
    """``cfg`` without the keys of the kernels named ("SPLIT", "ROW"): what the launcher runs instead."""
    return {k: v for k, v in cfg.items() if not k.startswith(kernels)}


def _close(got, want, atol, rtol, what):
    assert not torch.isnan(got).any() or torch.isnan(want).any(), f"{what}: NaN where float64 has none"
    torch.testing.assert_close(got.double(), want, atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype,atol,rtol", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_float64_with_ignored_rows(shape, dtype, atol, rtol, reduction):
    x, t = _inputs(*shape, dtype)
    # "none" with random per-row weights: the backward must scale each row by its own grad_output
    w = torch.randn(shape[0], device=x.device) if reduction == "none" else None
    want_loss, want_grad = _expected(x, t, reduction, w)
    loss, grad, counter = _run(x, t, reduction, w)
    assert loss.dtype == x.dtype and loss.shape == want_loss.shape
    _close(loss, want_loss, atol * 10, rtol, "loss")  # a sum of rounded rows: looser than one element
    _close(grad, want_grad, atol, rtol, "gradient")
    # one launch (after the count): the split kernel where the configuration splits the row (a GPU, 16-bit
    # rows from 32768 columns), else the fwd kernel
    kernel = SPLIT if cross_entropy_config(shape[1], dtype).get("SPLIT") else FWD
    assert counter.names == _launches(reduction, kernel), "loss and gradient in one launch (after the count)"
    assert counter.passes == [] and counter.torch_ops == [], "no copies, casts or torch reductions"
    ignored = t == -100
    assert (grad[ignored] == 0).all(), "ignored rows get exactly zero gradient"
    if reduction == "none":
        assert (loss[ignored] == 0).all()


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", WIDE, ids=lambda s: "x".join(map(str, s)))
def test_wide_vocabularies(shape, reduction):
    x, t = _inputs(*shape, torch.float32, ignored=0.0)
    if reduction == "none":
        t[0] = shape[1] - 1  # the last column: the end of the last streamed tile
    want_loss, want_grad = _expected(x, t, reduction)
    loss, grad, _ = _run(x, t, reduction)
    _close(loss, want_loss, 1e-4, 1e-5, "loss")
    _close(grad, want_grad, 1e-6, 1e-4, "gradient")


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(37, 1000), (9, 4500)], ids=["one-tile", "streamed"])
def test_label_smoothing_with_ignored_rows(shape, reduction):
    # the peer bug: smoothing applied to ignored rows (their loss and gradient must stay 0)
    x, t = _inputs(*shape, torch.float32, seed=3)
    w = torch.randn(shape[0], device=x.device) if reduction == "none" else None
    want_loss, want_grad = _expected(x, t, reduction, w, label_smoothing=0.1)
    loss, grad, _ = _run(x, t, reduction, w, label_smoothing=0.1)
    _close(loss, want_loss, 1e-4, 1e-5, "loss")
    _close(grad, want_grad, 1e-6, 1e-4, "gradient")
    assert (grad[t == -100] == 0).all()


@pytest.mark.parametrize("smoothing", [0.0, 1.0])
def test_smoothing_extremes(smoothing):
    x, t = _inputs(11, 300, torch.float32, seed=4)
    want_loss, want_grad = _expected(x, t, "mean", label_smoothing=smoothing)
    loss, grad, _ = _run(x, t, "mean", label_smoothing=smoothing)
    _close(loss, want_loss, 1e-5, 1e-5, "loss")
    _close(grad, want_grad, 1e-6, 1e-4, "gradient")


def test_many_streamed_tiles_and_custom_ignore_index():
    # small explicit tiles: a head of 64 and 14 streamed tiles of 32 a row; class 0 is the ignored one
    x, t = _inputs(13, 500, torch.float32, seed=5, ignore_index=0)
    want_loss, want_grad = _expected(x, t, "mean", ignore_index=0, label_smoothing=0.05)
    loss, grad, _ = _run(x, t, "mean", ignore_index=0, label_smoothing=0.05, head_n=64, block_n=32, num_warps=2)
    _close(loss, want_loss, 1e-5, 1e-5, "loss")
    _close(grad, want_grad, 1e-6, 1e-4, "gradient")


@pytest.mark.parametrize("prefetch", [False, True], ids=["plain", "prefetch"])
@pytest.mark.parametrize("vocab", [509, 512], ids=["split-row", "aligned-row"])
def test_streamed_tiles_with_and_without_prefetch(vocab, prefetch):
    # head 64, tiles of 32: each row streams 14-15 tiles both ways; 509 columns (fp16, VEC 8) split every
    # row into a fragment, a 16-byte aligned body and a tail fragment
    x, t = _inputs(11, vocab, torch.float16, seed=13)
    cfg = dict(cross_entropy_config(vocab, torch.float16))
    assert (cfg["VEC"] > 1) == (vocab % 16 != 0)
    cfg.update(HEAD=64, BLOCK_N=32, num_warps=2, PREFETCH=prefetch, PREFETCH2=prefetch, EVICT=prefetch)  # + L2 hints
    for reduction, smoothing in [("mean", 0.0), ("none", 0.1)]:
        want_loss, want_grad = _expected(x, t, reduction, label_smoothing=smoothing)
        xl = x.clone().requires_grad_()
        loss = CrossEntropyFunction.apply(xl, t, -100, reduction, smoothing, False, cfg)
        loss.sum().backward()
        _close(loss, want_loss, 2e-2, 1e-2, "loss")
        _close(xl.grad, want_grad, 2e-3, 1e-2, "gradient")


def _far_from_target(case, tokens, vocab, dtype):
    """Rows whose sums against the target's logit leave fp32's safe range, so the kernel must sum again
    against the true maximum, beside ordinary rows."""
    x, t = _inputs(tokens, vocab, torch.float32, seed=21, ignored=0.0)
    rows = torch.arange(tokens, device=x.device)
    far = rows % 2 == 0  # every other row: the fallback; the rest: the fast path in the same launch
    if case == "target far below":  # the target 200 below every other logit: d ~ e**200 overflows
        x[rows[far], t[far]] = x[far].min(dim=1).values - 200.0
    elif case == "one logit far above, streamed":  # the maximum in sweep 1's streamed tail
        x[far, vocab - 3] = x[rows[far], t[far]] + 100.0
    elif case == "one logit far above, head":  # the maximum in the head tile
        x[far, 1] = x[rows[far], t[far]] + 100.0
    elif case == "target -inf":  # no reference at all (0 is used): every other logit near -300
        x[far] = x[far] - 300.0
        x[rows[far], t[far]] = float("-inf")
    t[(t == vocab - 3) | (t == 1)] = 0  # the planted logit is never the target itself
    return x.to(dtype), t


@pytest.mark.parametrize("ref_target", [True, False], ids=["target-ref", "running-max"])
@pytest.mark.parametrize(
    "case", ["target far below", "one logit far above, streamed", "one logit far above, head", "target -inf"]
)
@pytest.mark.parametrize("vocab", [509, 512, 40], ids=["split-row", "aligned-row", "one-tile"])
def test_rows_far_from_the_reference(vocab, case, ref_target):
    # The default kernel sums exp(x - x_target) and checks the sum afterwards (e**100 overflows fp32; the
    # check catches it at e**60); these rows fail that check
    # and must be summed again against their maximum (REF_TARGET=False: the online max never needs to).
    dtype = torch.float16 if vocab == 509 else torch.float32
    x, t = _far_from_target(case, 8, vocab, dtype)
    cfg = dict(cross_entropy_config(vocab, dtype))
    cfg.update(HEAD=64, BLOCK_N=32, num_warps=2, REF_TARGET=ref_target)
    for reduction, smoothing in [("mean", 0.0), ("none", 0.1)]:
        want_loss, want_grad = _expected(x, t, reduction, label_smoothing=smoothing)
        xl = x.clone().requires_grad_()
        loss = CrossEntropyFunction.apply(xl, t, -100, reduction, smoothing, False, cfg)
        loss.sum().backward()
        assert not torch.isnan(loss).any() and torch.isfinite(xl.grad).all(), (case, loss)
        tol = 2e-3 if dtype == torch.float16 else 1e-5
        _close(loss, want_loss, tol, tol, f"{case}: loss")
        _close(xl.grad, want_grad, tol, 1e-2 if dtype == torch.float16 else 1e-4, f"{case}: gradient")


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("dtype,atol,rtol", DTYPES)
@pytest.mark.parametrize("case", ["ordinary", "target far below", "one logit far above, streamed", "target -inf"])
@pytest.mark.parametrize("vocab", [300, 512], ids=["partial-part", "whole-parts"])
def test_split_kernel_matches_float64(vocab, case, dtype, atol, rtol, inplace):
    """The split kernel on any device through its configuration: one part a row (the interpreter runs
    its programs one after another, so a row of several parts would wait for ever), whole or with the
    rest of the row in its fragment, and, on a GPU, parts of 128 logits (2-4 a row, which swap their
    sums; the last with the remainder or not), and parts of more columns than their tile of 128, the
    rest in their extra tile (SPLIT_PART: the remainder shared by the parts; in the interpreter the
    whole row as one part of 256 and an extra tile). Every other row of the far cases fails the sum
    against the target's logit, so all its parts take the second round (their maxima) together;
    ignored rows beside them; the gradient over the logits when asked. 300 columns: rows that start off
    a 16-byte boundary (every other row in fp16), cut there into fragments."""
    x, t = _far_from_target(case, 8, vocab, dtype) if case != "ordinary" else _inputs(8, vocab, dtype, seed=5)
    if case != "ordinary":
        t[5] = -100
    # (tile, parts, columns a part): the whole row; 256 and a fragment; 256 and an extra tile
    splits = [(next_pow2(vocab), 1, None), (256, 1, None), (256, 1, -(-vocab // 16) * 16)]
    if runtime.is_gpu():
        whole = vocab // 128
        splits += [(128, -(-vocab // 128), None), (128, whole, None)]
        splits += [(128, whole, 128 + -(-(vocab - whole * 128) // (16 * whole)) * 16), (128, whole, 144)]
    for (block, parts, part_n), (reduction, smoothing) in itertools.product(
        splits, [("mean", 0.0), ("sum", 0.1), ("none", 0.0)]
    ):
        cfg = dict(cross_entropy_config(vocab, dtype))
        cfg.update(SPLIT=parts, SPLIT_BLOCK=block, SPLIT_WARPS=4)
        if part_n:
            cfg["SPLIT_PART"] = part_n
        w = torch.randn(8, device=x.device) if reduction == "none" else None
        want_loss, want_grad = _expected(x, t, reduction, w, label_smoothing=smoothing)
        loss, xl, counter = _run_cfg(x, t, reduction, cfg, w, smoothing=smoothing, inplace=inplace)
        assert counter.names == _launches(reduction, SPLIT), counter.names
        what = f"{case}, {parts} parts of {block} ({part_n} columns), {reduction}, smoothing {smoothing}"
        tol = max(atol, 2e-3) if case != "ordinary" else atol  # logits 100-300 apart: the fp16 rounding of x
        _close(loss, want_loss, tol * 10, rtol, f"{what}: loss")
        _close(xl.grad, want_grad, tol, rtol, f"{what}: gradient")
        assert (xl.grad[t == -100] == 0).all()
        if inplace:
            assert xl.grad.data_ptr() == xl.data_ptr()


def _rows_config(vocab, dtype, programs=None):
    """The rows kernel's configuration (the H200's) for any width and device; ``programs``: fewer
    programs than rows, so that each walks several through its pipelined loop."""
    # (as on the H200, no split beside the rows: elsewhere these widths may be split)
    cfg = _without(cross_entropy_config(vocab, dtype), "SPLIT")
    cfg.update(ROWS=True, ROWS_WARPS=4 if vocab <= 4096 else 16, ROW_STAGES=3)
    if programs:
        cfg["ROWS_PROGRAMS"] = programs
    return cfg


def _rows_case(tokens, vocab, dtype, seed):
    """30% ignored rows, targets at both ends of the row, a logit of 1e4 (no max subtraction
    overflows), a row of only -inf but its target (and -inf targets elsewhere would be NaN, as torch)."""
    x, t = _inputs(tokens, vocab, dtype, seed=seed)
    t[1], t[2], t[3] = 0, vocab - 1, vocab // 2
    x[3, vocab - 1] = 1e4
    if vocab > 1:
        x[4] = float("-inf")
        x[4, t[4].clamp(min=0)] = 0.0
    return x, t


@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("dtype,atol,rtol", DTYPES)
@pytest.mark.parametrize("shape", [(97, 300), (7, 3), (9, 1), (41, 4097)], ids=lambda s: "x".join(map(str, s)))
def test_rows_kernel_matches_float64(shape, dtype, atol, rtol, reduction, inplace):
    """The persistent rows kernel (whole rows, the next ones loaded while one is written), on any device
    through its configuration: 5-14 rows a program, widths off the tile, one column; against float64,
    one kernel between the prologue and the finish, no torch op, the logits untouched out of place."""
    tokens, vocab = shape
    x, t = _rows_case(tokens, vocab, dtype, seed=47)
    w = torch.randn(tokens, device=x.device) if reduction == "none" else None
    want_loss, want_grad = _expected(x, t, reduction, w)
    loss, xl, counter = _run_cfg(x, t, reduction, _rows_config(vocab, dtype, 7), w, inplace=inplace)
    assert counter.names == _launches(reduction, ROWS) and counter.torch_ops == []
    _close(loss, want_loss, atol * 10, rtol, "loss")
    _close(xl.grad, want_grad, atol, rtol, "gradient")
    assert (xl.grad[t == -100] == 0).all()
    if not inplace:
        assert torch.equal(xl.detach(), x), "the logits changed"


def test_ledger_follows_the_named_gpu():
    # 32000 bf16 logits: the H100 splits each row, the H200 takes whole rows: both read it once; with
    # label smoothing the H200 takes the head of 8192 (the rows kernel has no smoothing) and re-reads the
    # rest of each row; at 24576 both GPUs take the head
    floor = cross_entropy_ledger(64, 32000, torch.bfloat16, head=32000).fused_bytes
    h100 = cross_entropy_ledger(64, 32000, torch.bfloat16, gpu=True, device="NVIDIA H100 80GB HBM3")
    h200 = cross_entropy_ledger(64, 32000, torch.bfloat16, gpu=True, device="NVIDIA H200")
    smooth = cross_entropy_ledger(64, 32000, torch.bfloat16, gpu=True, device="NVIDIA H200", label_smoothing=0.1)
    assert h200.fused_bytes == floor and h100.fused_bytes == floor
    assert smooth.fused_bytes == floor + 64 * (32000 - 8192) * 2
    for device in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
        narrow = cross_entropy_ledger(64, 24576, torch.bfloat16, gpu=True, device=device)
        assert narrow.rereads == {"logits": 64 * (24576 - 8192)}, (device, narrow.rereads)


def test_rows_kernel_bad_targets_and_smoothing():
    # an out-of-range target: NaN loss and NaN gradient row, the other rows unharmed; label smoothing is
    # the fwd kernel's (the rows kernel has none)
    x, t = _inputs(20, 300, torch.float32, seed=48)
    t[5] = 300
    cfg = _rows_config(300, torch.float32, 3)
    xl = x.clone().requires_grad_()
    loss = CrossEntropyFunction.apply(xl, t, -100, "none", 0.0, False, cfg)
    loss.sum().backward()
    assert torch.isnan(loss[5]) and torch.isnan(xl.grad[5]).all()
    ok = torch.arange(20, device=x.device) != 5
    want_loss, want_grad = _expected(x[ok], t[ok], "none")
    _close(loss.detach()[ok], want_loss, 1e-5, 1e-5, "loss")
    _close(xl.grad[ok], want_grad, 1e-6, 1e-4, "gradient")
    with Sandbox() as counter:
        loss = CrossEntropyFunction.apply(x.clone().requires_grad_(), t.clamp(max=299), -100, "mean", 0.1, False, cfg)
    assert counter.names == _launches("mean", FWD)
    _close(loss.detach(), _expected(x, t.clamp(max=299), "mean", label_smoothing=0.1)[0], 1e-5, 1e-5, "loss")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_large_logits_need_the_max_subtraction(dtype):
    # logits ~ 1e4: exp overflows fp32 (and fp16) unless the row maximum is subtracted first
    x, t = _inputs(7, 3000, dtype, scale=1e4, seed=6)
    want_loss, want_grad = _expected(x, t, "mean")
    loss, grad, _ = _run(x, t, "mean")
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
    _close(loss, want_loss, 0.0, 2e-3 if dtype == torch.float16 else 1e-5, "loss")
    _close(grad, want_grad, 1e-3 if dtype == torch.float16 else 1e-6, 1e-3, "gradient")


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_all_rows_ignored(reduction):
    x, t = _inputs(4, 100, torch.float32)
    t[:] = -100
    want_loss, want_grad = _expected(x, t, reduction, label_smoothing=0.1)
    loss, grad, _ = _run(x, t, reduction, label_smoothing=0.1)
    if reduction == "mean":
        assert torch.isnan(want_loss) and torch.isnan(loss), "mean over no rows is NaN, as torch"
    else:
        assert (loss == 0).all()
    assert (want_grad == 0).all() and (grad == 0).all(), "zero gradient (torch too), never NaN"


@gpu_only
@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize(
    "dtype,atol,rtol",
    [pytest.param(torch.bfloat16, 1e-2, 2e-2, id="bf16"), pytest.param(torch.float16, 2e-3, 1e-2, id="fp16")],
)
@pytest.mark.parametrize("vocab", [32769, 50257, 65536])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_gpu_head_and_tail_under_the_split_match_float64(vocab, dtype, atol, rtol, inplace, reduction):
    """16-bit rows of 32769-65536 logits through the head-and-tail kernel (the configuration under the
    split's, which a tuning call runs): a head of 8192 and streamed tiles read again, the first and
    last columns of the row, GPT-2's vocabulary (50257), 30% ignored rows (zeros), label smoothing."""
    cfg = _without(cross_entropy_config(vocab, dtype), "SPLIT", "ROW")
    assert cfg["HEAD"] == 8192 < vocab
    x, t = _inputs(41, vocab, dtype, seed=43)
    t[1], t[2] = 0, vocab - 1
    x[3, vocab - 1] = 1e4
    w = torch.randn(41, device=x.device) if reduction == "none" else None
    want_loss, want_grad = _expected(x, t, reduction, w, label_smoothing=0.1)
    loss, xg, counter = _run_cfg(x, t, reduction, cfg, w, smoothing=0.1, inplace=inplace)
    grad = xg.grad
    assert counter.names == _launches(reduction)
    _close(loss, want_loss, atol * 10, rtol, "loss")
    _close(grad, want_grad, atol, rtol, "gradient")
    assert (grad[t == -100] == 0).all()


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_reduction_in_the_kernel_many_rows(reduction):
    """The count and the loss's reduction run in one-program kernels: rows past one block of the count
    (16384 targets) and of the sum (4096 losses) on a GPU, bitwise the same in every call (a fixed
    order, no atomics), against float64. The interpreter runs one program at a time (3 ms each): 300
    rows there."""
    rows = 65537 if runtime.is_gpu() else 300
    x, t = _inputs(rows, 40, torch.float32, seed=12)
    want_loss, want_grad = _expected(x, t, reduction)
    loss, grad, counter = _run(x, t, reduction)
    assert counter.names == _launches(reduction) and counter.torch_ops == []
    _close(loss, want_loss, 1e-5, 1e-5, "loss")
    _close(grad, want_grad, 1e-6, 1e-4, "gradient")
    with torch.no_grad():
        again = [cross_entropy(x, t, reduction=reduction) for _ in range(3)]
    assert all(torch.equal(a, again[0]) for a in again), "the same loss every call"


def test_padded_lanes_are_not_probability_mass():
    # vocabulary 3 in a 16-lane tile: 13 masked lanes. If they counted as exp(0) the loss would grow by
    # log(1 + 13 e^-max) and every probability would shrink.
    x = torch.tensor([[0.0, 0.0, 0.0], [-5.0, -6.0, -7.0]], device=runtime.DEVICE)
    t = torch.tensor([0, 2], device=runtime.DEVICE)
    loss = cross_entropy(x, t, reduction="none")
    want = F.cross_entropy(x.double(), t, reduction="none")
    torch.testing.assert_close(loss.double(), want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(loss[0].item(), float(torch.log(torch.tensor(3.0))), atol=1e-6, rtol=0)


def test_inplace_grad_overwrites_logits_and_adds_no_memory():
    x, t = _inputs(9, 700, torch.float32, seed=7)
    want_loss, want_grad = _expected(x, t, "mean")
    leaf = x.detach().clone().requires_grad_()
    loss = cross_entropy(leaf, t, inplace_grad=True)
    _close(loss, want_loss, 1e-5, 1e-5, "loss")
    _close(leaf.detach(), want_grad, 1e-6, 1e-4, "logits now hold the gradient")
    loss.backward()
    assert leaf.grad.data_ptr() == leaf.data_ptr(), "the gradient is the logits' own memory"
    _close(leaf.grad, want_grad, 1e-6, 1e-4, "gradient")


def test_inplace_grad_makes_other_savers_raise():
    # tanh saves its *output* for the backward: destroying it must raise, not give wrong gradients
    x = torch.randn(4, 50, device=runtime.DEVICE, requires_grad=True)
    t = torch.randint(0, 50, (4,), device=runtime.DEVICE)
    logits = torch.tanh(x)
    loss = cross_entropy(logits, t, inplace_grad=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_grad_output_scales_and_backward_is_one_launch():
    x, t = _inputs(8, 600, torch.float32, seed=8)
    xl = x.clone().requires_grad_()
    loss = cross_entropy(xl, t, reduction="sum")
    with Sandbox() as counter:
        (loss * 2.5).backward()
    assert BWD in counter.names
    _, want_grad = _expected(x, t, "sum", torch.tensor(2.5, device=x.device))
    _close(xl.grad, want_grad, 1e-6, 1e-4, "gradient")


@pytest.mark.parametrize("reduction,scale", [("mean", 0.25), ("sum", -3.0), ("none", 0.5), ("mean", 1.0)])
def test_shared_grad_output_walks_every_row(monkeypatch, reduction, scale):
    # one grad_output for all rows is checked by a few programs, each walking rows pid, pid + P, ...:
    # with 4 programs for 23 rows every program walks several, ignored rows among them
    monkeypatch.setattr(cek, "sm_count", lambda: 1)
    x, t = _inputs(23, 70, torch.float32, seed=10)
    xl = x.clone().requires_grad_()
    loss = cross_entropy(xl, t, reduction=reduction)
    with Sandbox() as counter:
        (loss.sum() * scale).backward()
    assert counter.names.count(BWD) == 1
    _, want_grad = _expected(x, t, reduction, torch.tensor(scale, dtype=torch.float64))
    _close(xl.grad, want_grad, 1e-6, 1e-4, "gradient")


def test_none_with_expanded_grad_output():
    # loss.sum().backward() hands the backward an expanded (stride 0) tensor of ones
    x, t = _inputs(6, 300, torch.float32, seed=9)
    xl = x.clone().requires_grad_()
    cross_entropy(xl, t, reduction="none").sum().backward()
    _, want_grad = _expected(x, t, "none")
    _close(xl.grad, want_grad, 1e-6, 1e-4, "gradient")


def test_second_backward_raises():
    x, t = _inputs(3, 40, torch.float32)
    x.requires_grad_()
    loss = cross_entropy(x, t)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


def test_forward_only_reads_once_and_leaves_logits():
    x, t = _inputs(10, 5000, torch.float32, seed=10)
    before = x.clone()
    with torch.no_grad(), Sandbox() as counter:
        loss = cross_entropy(x, t, label_smoothing=0.2, inplace_grad=True)
    assert counter.names == _launches("mean")
    assert torch.equal(x, before), "no gradient asked: the logits are untouched"
    _close(loss, _expected(x, t, "mean", label_smoothing=0.2)[0], 1e-5, 1e-5, "loss")


@gpu_only
@pytest.mark.parametrize(
    "dtype,atol,rtol",
    [pytest.param(torch.bfloat16, 1e-2, 2e-2, id="bf16"), pytest.param(torch.float32, 1e-4, 1e-5, id="fp32")],
)
@pytest.mark.parametrize("vocab", [4097, 32000, 50257, 128256, 262144])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gpu_forward_only_matches_float64(vocab, dtype, atol, rtol, reduction):
    """The loss alone walks rows past FORWARD_TILE in small pipelined tiles (its own configuration):
    one column past a tile (4097), unaligned (50257), the split's widths (no split without a gradient),
    30% ignored rows, smoothing, the target in the first and last column, a strided view."""
    big, t = _inputs(23, vocab + 8, dtype, seed=47)
    x = big[:, 3 : 3 + vocab]  # rows that start off a 16-byte boundary
    t[1], t[2] = 0, vocab - 1
    t[t >= vocab] = vocab - 2
    before = x.clone()
    want_loss, _ = _expected(x, t, reduction, label_smoothing=0.1)
    with torch.no_grad(), Sandbox() as counter:
        loss = cross_entropy(x, t, reduction=reduction, label_smoothing=0.1)
    assert counter.names == _launches(reduction) and counter.torch_ops == []
    _close(loss, want_loss, atol * 10, rtol, "loss")
    assert torch.equal(x, before)


def test_strided_rows_odd_stride():
    # rows of a wider buffer, row stride 1003 (not a multiple of 16): the unaligned-window path
    big, t = _inputs(7, 1003, torch.float32, seed=11)
    x = big[:, :1000]
    want_loss, want_grad = _expected(x, t, "mean")
    for inplace in (False, True):
        loss, grad, _ = _run(x, t, "mean", inplace_grad=inplace)
        _close(loss, want_loss, 1e-5, 1e-5, "loss")
        _close(grad, want_grad, 1e-6, 1e-4, "gradient")


def test_non_finite_logits_match_torch():
    torch.manual_seed(0)
    x = torch.randn(4, 20, device=runtime.DEVICE)
    x[0, 3] = float("inf")  # +inf: torch gives NaN (inf - inf)
    x[1, :10] = float("-inf")  # some -inf: a finite loss
    x[2, 5] = float("nan")
    t = torch.tensor([1, 12, 0, 4], device=runtime.DEVICE)
    want = F.cross_entropy(x.double(), t, reduction="none")
    got = cross_entropy(x, t, reduction="none")
    torch.testing.assert_close(got.double(), want, equal_nan=True, atol=1e-5, rtol=1e-5)
    # the first 16-lane tile entirely -inf, the rest finite (online max starting at -inf)
    y = torch.full((1, 40), float("-inf"), device=runtime.DEVICE)
    y[0, 30:] = torch.randn(10, device=runtime.DEVICE)
    ty = torch.tensor([35], device=runtime.DEVICE)
    got = cross_entropy(y, ty, reduction="none", head_n=16, block_n=16)
    torch.testing.assert_close(got.double(), F.cross_entropy(y.double(), ty, reduction="none"), atol=1e-5, rtol=1e-5)


def test_out_of_range_target_is_nan_not_a_stray_read():
    x = torch.randn(3, 10, device=runtime.DEVICE, requires_grad=True)
    t = torch.tensor([1, 10, -5], device=runtime.DEVICE)
    loss = cross_entropy(x, t, reduction="none", check_target=False)  # the kernel alone (the default raises)
    assert torch.isfinite(loss[0]) and torch.isnan(loss[1:]).all()
    loss.sum().backward()
    assert torch.isnan(x.grad[1:]).all() and torch.isfinite(x.grad[0]).all()


def test_empty_batch():
    x = torch.empty(0, 10, device=runtime.DEVICE, requires_grad=True)
    t = torch.empty(0, dtype=torch.long, device=runtime.DEVICE)
    with Sandbox() as counter:
        loss = cross_entropy(x, t)
    assert torch.isnan(loss) and counter.names == []
    assert cross_entropy(x, t, reduction="sum").item() == 0
    assert cross_entropy(x, t, reduction="none").shape == (0,)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_eager_and_reference_follow_the_formula(reduction, smoothing):
    # both against the loss written out by hand in float64 (not F.cross_entropy again): ignored rows,
    # label smoothing, each reduction; eager is log_softmax then nll_loss, as the ledger counts
    x, t = _inputs(5, 30, torch.float32)
    t[1] = -100
    want = cross_entropy_by_hand(x, t, reduction=reduction, label_smoothing=smoothing)
    kw = {"reduction": reduction, "label_smoothing": smoothing}
    with LaunchCounter() as counter:
        got = cross_entropy_eager(x, t, **kw)
    torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-6)
    assert counter.torch_ops[:2] == ["_log_softmax", "nll_loss_forward"], counter.torch_ops
    torch.testing.assert_close(cross_entropy_reference(x.double(), t, **kw), want, atol=1e-12, rtol=1e-12)


# -- the ledger and the configuration -------------------------------------------------------------------
def test_ledger_six_passes_against_two():
    tokens, vocab = 1024, 32000
    n = tokens * vocab
    led = cross_entropy_ledger(tokens, vocab, torch.bfloat16, head=vocab)
    big = [t for t in led.trips(fused=False) if t.elements == n]
    assert len(big) == 6, [(t.op, t.tensor, t.direction) for t in big]
    fused = [t for t in led.trips(fused=True) if t.elements == n]
    assert [(t.tensor, t.direction) for t in fused] == [("logits", "read"), ("grad_logits", "write")]
    # bf16 logits and gradient, int64 targets, one fp32 loss (mean)
    assert led.fused_bytes == 2 * n * 2 + tokens * 8 + 4
    assert led.unfused_bytes == 6 * n * 2 + tokens * 2 + 2 * tokens * 8 + 4
    # a row wider than the head is read again past it
    led = cross_entropy_ledger(tokens, vocab, torch.bfloat16, head=8192)
    assert led.fused_bytes - cross_entropy_ledger(tokens, vocab, torch.bfloat16, head=vocab).fused_bytes == (
        tokens * (vocab - 8192) * 2
    )
    # forward only: read once; label smoothing adds eager passes, not fused ones
    assert cross_entropy_ledger(tokens, vocab, torch.bfloat16, backward=False).kernels_unfused == 2
    smooth = cross_entropy_ledger(tokens, vocab, torch.bfloat16, label_smoothing=0.1, head=vocab)
    assert (
        smooth.unfused_bytes > led.unfused_bytes
        and smooth.fused_bytes == cross_entropy_ledger(tokens, vocab, torch.bfloat16, head=vocab).fused_bytes
    )


VOCABS = [2, 3, 1000, 24576, 27999, 28000, 28672, 28688, 30000, 32000, 32768, 32769, 49408, 50257, 50304]
VOCABS += [65536, 65537, 66000, 98304 + 1000]
VOCABS += [128256, 151936, 200000, 262144]


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gpu", [True, False])
def test_config_is_legal(vocab, dtype, gpu, monkeypatch):
    monkeypatch.setattr(runtime, "is_gpu", lambda: gpu)
    cfg = cross_entropy_config(vocab, dtype)
    for k in ("HEAD", "BLOCK_N", "num_warps", "VEC"):
        assert cfg[k] >= 1 and cfg[k] & (cfg[k] - 1) == 0, (k, cfg)
    assert cfg["BLOCK_N"] <= cfg["HEAD"] <= 2**20 and cfg["num_warps"] <= 32
    # on chip: at most 64 KiB of row
    assert cfg["HEAD"] * torch.empty((), dtype=dtype).element_size() <= 65536
    assert (cfg["VEC"] > 1) == (vocab % 16 != 0)
    # split rows: a GPU, a row from SPLIT_MIN_16 (16-bit) or past SPLIT_MIN (fp32) in at most MAX_SPLIT
    # parts of SPLIT_BYTES, aligned or not; a remainder of up to SPLIT_TAIL columns past the whole parts
    # left to the last part's fragment; a larger one past whole 16-bit parts shared by them in extra
    # tiles of up to SPLIT_EXTRA columns; the 16-bit parts' registers capped
    sixteen = dtype != torch.float32
    split = gpu and vocab >= (SPLIT_MIN_16 if sixteen else SPLIT_MIN) and not cfg.get("ROWS")
    assert bool(cfg.get("SPLIT")) == split, cfg
    if split:
        block = cfg["SPLIT_BLOCK"]
        part_n = cfg.get("SPLIT_PART", block)
        covered = cfg["SPLIT"] * part_n
        assert covered >= vocab - SPLIT_TAIL and vocab > covered - part_n, cfg
        assert block * dtype.itemsize == SPLIT_BYTES and cfg["SPLIT_WARPS"] == 4
        whole, rest = divmod(vocab, block)
        shared = sixteen and rest > SPLIT_TAIL and -(-rest // whole) <= SPLIT_EXTRA
        assert ("SPLIT_PART" in cfg) == shared, cfg
        if shared:
            assert cfg["SPLIT"] == whole and part_n % 16 == 0 and block < part_n <= block + SPLIT_EXTRA, cfg
        assert cfg.get("SPLIT_MAXNREG") == (SPLIT_MAXNREG if sixteen else None)
        assert (
            cfg["SPLIT"] <= MAX_SPLIT
            and cross_entropy_ledger(64, vocab, dtype).fused_bytes == 64 * (2 * vocab * dtype.itemsize + 8) + 4
        )  # read once, write once (and the targets, one loss): no re-read
    # whole rows in persistent programs: an H200's (its DRAM bandwidth), aligned 16-bit rows of ROWS_MIN-ROWS_MAX
    rows = gpu and dtype != torch.float32 and ROWS_MIN <= vocab <= ROWS_MAX and vocab % 16 == 0
    h200 = cross_entropy_config(vocab, dtype, device="NVIDIA H200")
    assert bool(h200.get("ROWS")) == rows, h200
    assert not cfg.get("ROWS") or dram_gbps() >= ROWS_MIN_DRAM_GBPS, cfg
    assert not cross_entropy_config(vocab, dtype, device="NVIDIA H100 80GB HBM3").get("ROWS")
    # the H200's rows kernel keeps its rows; on the H100 the split takes them from the threshold
    assert not (h200.get("ROWS") and h200.get("SPLIT")), h200
    h100 = cross_entropy_config(vocab, dtype, device="NVIDIA H100 80GB HBM3")
    assert bool(h100.get("SPLIT")) == (gpu and vocab >= (SPLIT_MIN_16 if sixteen else SPLIT_MIN)), h100
    assert not cross_entropy_config(vocab, dtype, device="NVIDIA H200", grad=False).get("ROWS")
    # the loss alone: small pipelined tiles past FORWARD_TILE on a GPU, never split, legal on every path
    fwd = cross_entropy_config(vocab, dtype, grad=False)
    assert not fwd.get("SPLIT") and fwd["BLOCK_N"] <= fwd["HEAD"] and fwd["VEC"] == cfg["VEC"]
    if gpu and vocab > FORWARD_TILE:
        assert (fwd["HEAD"], fwd["BLOCK_N"], fwd["num_warps"]) == (FORWARD_TILE, FORWARD_TILE, 8)
    else:
        assert fwd == {k: v for k, v in cfg.items() if not k.startswith("SPLIT")}


# -- bad input: a clear error before the launch ------------------------------------------------------------
@pytest.mark.parametrize(
    "make, match",
    [
        (lambda x, t: (x.long(), t), "dtype"),
        (lambda x, t: (x[None], t), "dimension"),
        (lambda x, t: (x, t.int()), "dtype"),
        (lambda x, t: (x, t[:-1]), "entries"),
        (lambda x, t: (x.t(), t[:1].expand(10).contiguous()), "stride"),
        (lambda x, t: (x[:, :0], t), "no classes"),
        (lambda x, t: (x.detach().clone()._neg_view(), t), "negated"),
    ],
    ids=["int-logits", "3d", "int32-target", "short-target", "column-major", "no-classes", "neg-view"],
)
def test_bad_inputs(make, match):
    x, t = _inputs(4, 10, torch.float32)
    bx, bt = make(x, t)
    with pytest.raises(KernelInputError, match=match):
        cross_entropy(bx, bt)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"reduction": "avg"}, "reduction"),
        ({"label_smoothing": 1.5}, "label_smoothing"),
        ({"label_smoothing": -0.1}, "label_smoothing"),
        ({"ignore_index": 1.0}, "ignore_index"),
        ({"block_n": 100}, "power of two"),
    ],
)
def test_bad_arguments(kw, match):
    x, t = _inputs(4, 10, torch.float32)
    with pytest.raises(KernelInputError, match=match):
        cross_entropy(x, t, **kw)


# -- GPU only: memory, and rows x vocabulary past 2**31 ------------------------------------------------------
@gpu_only
@pytest.mark.gpu
def test_peak_memory_on_gpu():
    from fusionlab.bench import peak_bytes

    tokens, vocab = 2048, 32000
    x, t = _inputs(tokens, vocab, torch.bfloat16, ignored=0.1)
    logits_bytes = x.numel() * 2

    def fused(inplace):
        xl = x.detach().clone().requires_grad_() if not inplace else x.detach().requires_grad_()
        return torch.autograd.grad(cross_entropy(xl, t, inplace_grad=inplace), xl)[0]

    fused(False)
    extra = peak_bytes(fused, False) - 2 * logits_bytes  # the clone and the gradient
    assert extra <= 0.1 * logits_bytes, f"extra {extra / logits_bytes:.1%} of the logits"
    inplace_extra = peak_bytes(fused, True)
    assert inplace_extra <= 0.1 * logits_bytes, f"in place: {inplace_extra / logits_bytes:.1%} of the logits"


@gpu_only
@pytest.mark.gpu
def test_past_2_31_logits_on_gpu():
    # 16400 x 131071 bf16 = 2.15e9 elements (4.3 GB): the last rows start past 2**31; unaligned rows, split
    # at their 16-byte boundaries by the split kernel (the package's) and by the head-and-tail kernel
    tokens, vocab = 16400, 131071
    cfg = cross_entropy_config(vocab, torch.bfloat16)
    assert tokens * vocab > 2**31 and cfg["SPLIT"] and cfg["VEC"] == 8
    rows = [0, 1, tokens // 2, tokens - 3, tokens - 2, tokens - 1]
    loss = _past_2_31(tokens, vocab, seed=12, ignore_every=5, rows=rows, kernel=SPLIT)
    assert torch.isfinite(loss).all()
    head_and_tail = _without(cfg, "SPLIT")
    loss = _past_2_31(tokens, vocab, seed=12, ignore_every=5, rows=rows, cfg=head_and_tail, kernel=FWD)
    assert torch.isfinite(loss).all()


@gpu_only
@pytest.mark.gpu
def test_gpu_rows_kernel_past_2_31_logits():
    # the H200's rows kernel (forced here on any GPU): 67200 x 32000 bf16 = 2.15e9 logits
    tokens, vocab = 67200, 32000
    assert tokens * vocab > 2**31
    loss = _past_2_31(
        tokens,
        vocab,
        seed=14,
        ignore_every=6,
        rows=[0, 1, tokens // 2, tokens - 2, tokens - 1],
        cfg=_rows_config(vocab, torch.bfloat16),
        kernel=ROWS,
    )
    assert torch.isfinite(loss).all()


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize(
    "dtype,atol,rtol",
    [pytest.param(torch.bfloat16, 1e-2, 2e-2, id="bf16"), pytest.param(torch.float16, 2e-3, 1e-2, id="fp16")],
)
@pytest.mark.parametrize("tokens,vocab", [(300, 32000), (300, 28688), (20000, 30000)])
def test_gpu_rows_kernel_matches_float64(tokens, vocab, dtype, atol, rtol, reduction, inplace):
    """The H200's rows kernel at its widths, forced on any GPU: one program a SM with 2-3 rows each, or
    (20000 rows) more programs than SMs, 128 rows each; the GPU's own configuration of 16 warps."""
    x, t = _rows_case(tokens, vocab, dtype, seed=49)
    w = torch.randn(tokens, device=x.device) if reduction == "none" else None
    want_loss, want_grad = _expected(x, t, reduction, w)
    cfg = dict(cross_entropy_config(vocab, dtype, device="NVIDIA H200"))
    assert cfg["ROWS"] and cfg["ROWS_WARPS"] == 16
    loss, xl, counter = _run_cfg(x, t, reduction, cfg, w, inplace=inplace)
    assert counter.names == _launches(reduction, ROWS) and counter.torch_ops == []
    # in the logits' dtype first: 20000 rows' fp16 "sum" passes 65504 and is inf, as torch's would be
    _close(loss, want_loss.to(dtype).double(), atol * 10, rtol, "loss")
    _close(xl.grad, want_grad, atol, rtol, "gradient")
    assert (xl.grad[t == -100] == 0).all()


def _past_2_31(tokens, vocab, *, seed, ignore_every, rows, cfg=None, kernel=None):
    """bf16 logits of tokens x vocab (past 2**31 elements), every ``ignore_every``-th row ignored; the
    loss ("none", weighted by 2) and the gradient in place, checked against float64 on ``rows``,
    including the last ones, whose offsets pass 2**31. Returns the loss."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16, generator=g)
    t = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
    t[::ignore_every] = -100
    rows = torch.tensor(rows, device="cuda")
    sample = x[rows].clone()
    x.requires_grad_()
    with Sandbox() as counter:
        if cfg is None:
            loss = cross_entropy(x, t, reduction="none", inplace_grad=True)
        else:
            loss = CrossEntropyFunction.apply(x, t, -100, "none", 0.0, True, cfg)
    if kernel is not None:
        assert counter.names == _launches("none", kernel)
    (loss * 2.0).sum().backward()
    want_loss, want_grad = _expected(sample, t[rows], "none", torch.full((len(rows),), 2.0, device="cuda"))
    _close(loss[rows], want_loss, 2e-2, 2e-2, "loss")
    _close(x.grad[rows], want_grad, 1e-2, 2e-2, "gradient")
    del x
    torch.cuda.empty_cache()  # hand the 4+ GB back: other test processes (pytest-xdist) share the GPU
    return loss


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("inplace", [False, True], ids=["out-of-place", "in-place"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize(
    "vocab,dtype,atol,rtol",
    [
        pytest.param(vocab, dtype, atol, rtol, id=f"{vocab}-{name}")
        for name, dtype, atol, rtol in [
            ("fp32", torch.float32, 2e-5, 2e-5),
            ("bf16", torch.bfloat16, 1e-2, 2e-2),
            ("fp16", torch.float16, 2e-3, 1e-2),
        ]
        for vocab in [32768, 49168, 49408, 50257, 65552, 128256, 200000, 262144]
        if vocab >= (SPLIT_MIN if dtype == torch.float32 else SPLIT_MIN_16)
    ],
)
def test_gpu_split_rows_match_float64(vocab, dtype, atol, rtol, reduction, smoothing, inplace):
    """Rows past the split's threshold, split across programs (two parts; a last part of 16 columns;
    CLIP's rows, 256 columns past three whole parts, shared by them in extra tiles; GPT-2's rows, off
    16-byte boundaries, shared likewise; four whole parts and 16 columns in the last one's fragment; 8
    parts of a Llama 3 row; a partial last part; whole parts): loss and gradient against float64 with
    30% ignored rows, label smoothing, a part of only -inf, a logit of 1e4 (the second round) and fp16
    subnormals (widened by their bits); one kernel; the gradient over the logits when asked."""
    cfg = cross_entropy_config(vocab, dtype)
    assert cfg.get("SPLIT") and cfg["SPLIT_BLOCK"] * dtype.itemsize == SPLIT_BYTES
    x, t = _inputs(33, vocab, dtype, seed=41)
    x[1, : vocab // 2] = float("-inf")  # whole parts of -inf
    x[2, vocab // 3] = 1e4  # one part far above the rest
    x[3, :64] = torch.linspace(-6e-5, 6e-5, 64, device=x.device).to(dtype)  # fp16's subnormals (and bf16's zeros)
    t[1], t[2] = vocab - 1, 5
    w = torch.randn(33, device=x.device) if reduction == "none" else None
    want_loss, want_grad = _expected(x, t, reduction, w, label_smoothing=smoothing)
    xg = x.detach().clone().requires_grad_()
    with Sandbox() as counter:
        loss = cross_entropy(xg, t, reduction=reduction, label_smoothing=smoothing, inplace_grad=inplace)
    (loss * (torch.ones_like(loss) if w is None else w.to(loss.dtype))).sum().backward()
    assert counter.names == _launches(reduction, SPLIT)
    assert counter.passes == [] and counter.torch_ops == [], "no copies, memsets or torch reductions"
    _close(loss.detach(), want_loss, atol * 10, rtol, "loss")
    _close(xg.grad, want_grad, atol, rtol, "gradient")
    if inplace:
        assert xg.grad.data_ptr() == xg.data_ptr()
    assert (xg.grad[t == -100] == 0).all()


@gpu_only
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("vocab", [50257, 65552, 128256])
def test_gpu_split_strided_rows(vocab, dtype):
    """Rows of a wider buffer (a row stride of vocab + 5 elements: every row starts at a different offset
    from a 16-byte boundary), split, out of place and in place (the gradient then has the same stride)."""
    big = torch.randn(19, vocab + 5, device="cuda").to(dtype) * 3
    x = big[:, 2 : vocab + 2]
    t = torch.randint(0, vocab, (19,), device="cuda")
    t[3], t[4], t[5] = -100, 0, vocab - 1
    assert cross_entropy_config(vocab, dtype, stride=x.stride(0))["SPLIT"]
    want_loss, want_grad = _expected(x, t, "mean", label_smoothing=0.05)
    for inplace in (False, True):
        xg = big.clone()[:, 2 : vocab + 2].requires_grad_()  # (clone() of the view alone would be contiguous)
        assert xg.stride(0) == vocab + 5
        loss = cross_entropy(xg, t, label_smoothing=0.05, inplace_grad=inplace)
        loss.backward()
        _close(loss.detach(), want_loss, 1e-2, 2e-2, "loss")
        _close(xg.grad, want_grad, 1e-2, 2e-2, "gradient")


@gpu_only
@pytest.mark.gpu
def test_gpu_split_rows_past_2_31_logits():
    tokens, vocab = 8200, 262144  # 2.15e9 logits, 16 parts a row: the last rows start past 2**31
    assert tokens * vocab > 2**31 and cross_entropy_config(vocab, torch.bfloat16)["SPLIT"] == vocab * 2 // SPLIT_BYTES
    _past_2_31(tokens, vocab, seed=13, ignore_every=7, rows=[0, 1, tokens // 2, tokens - 2, tokens - 1])


PDL_KERNELS = {
    "head-and-tail": lambda: _without(cross_entropy_config(4000, torch.bfloat16), "SPLIT", "ROWS"),
    "rows": lambda: _rows_config(4000, torch.bfloat16, programs=7),
    "split": lambda: {**cross_entropy_config(50257, torch.bfloat16), "SPLIT": 3, "SPLIT_PART": 16768},
}


@pytest.mark.skipif(not _launch.pdl_supported(), reason="programmatic dependent launch: a Hopper GPU or later")
@pytest.mark.parametrize("ignored", [0.0, 0.3, 1.0])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("kernel", PDL_KERNELS)
def test_dependent_launch_changes_no_bits(monkeypatch, kernel, reduction, ignored):
    # the loss kernel is placed while the prologue still runs, the finish while the loss kernel does;
    # each waits for the kernel before it where it reads what that one wrote (sync, the rows' losses).
    # Reading the mean's count early would change the loss and every gradient; all rows ignored is the
    # case where no program of the loss kernel reads it at all (the finish still must: NaN)
    cfg = PDL_KERNELS[kernel]()
    vocab = 50257 if kernel == "split" else 4000
    x, t = _inputs(53, vocab, torch.bfloat16, seed=71, ignored=ignored)
    if ignored == 1.0:
        t.fill_(-100)
    got, hopper = {}, runtime.CAPABILITY
    for flag in (False, True):
        # without it the GPU launches as one before Hopper does (pdl_supported reads the capability)
        monkeypatch.setattr(runtime, "CAPABILITY", hopper if flag else (8, 0))
        xl = x.clone().requires_grad_()
        loss = CrossEntropyFunction.apply(xl, t, -100, reduction, 0.0, False, cfg)
        loss.sum().backward()
        got[flag] = (loss, xl.grad)
    if reduction == "mean" and ignored == 1.0:
        assert got[True][0].isnan() and got[False][0].isnan()
    else:
        assert torch.equal(got[True][0], got[False][0])
    assert torch.equal(got[True][1], got[False][1])
    # and the launch did use it: the kernel after the prologue was launched dependent and waits, with
    # no store, atomic or pipelined copy before its wait (the split kernel: no memory access at all)
    sync = cek._prologue(t, -100, count=True, n_rows_split=53 if kernel == "split" else None)
    grad, rows = torch.empty_like(x), torch.empty(53, device=x.device)
    k = ce.cross_entropy_rows(x, t, grad, rows, sync, -100, 0.0, cfg, mean=True, after_prologue=True)
    assert k.metadata.launch_pdl
    before = _memory_before_wait(k.asm["ptx"])
    assert not [i for i in before if "ld.global" not in i], before
    assert not before or kernel != "split", before


_MEMORY = re.compile(r"^\s*(@!?%p\d+\s+)?(ld\.global|atom\.|red\.|st\.global|cp\.async)")


def _memory_before_wait(ptx):
    """The memory instructions (predicated ones too) before a kernel's first griddepcontrol.wait."""
    lines = ptx.splitlines()
    at = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
    return [line.strip() for line in lines[:at] if _MEMORY.match(line)]


@pytest.mark.skipif(not _launch.pdl_supported(), reason="programmatic dependent launch: a Hopper GPU or later")
def test_prologue_finish_and_backward_wait_before_any_access():
    # all three wait at their top: the prologue and the backward for kernels not ours (the targets',
    # grad_output's writers), the finish for the loss kernel's losses
    x, t = _inputs(40, 300, torch.bfloat16, seed=72)
    x.requires_grad_()
    ce.cross_entropy(x, t).backward()
    for fn in (cek._cross_entropy_prologue_kernel, cek._cross_entropy_finish_kernel, cek._cross_entropy_bwd_kernel):
        kernels = [k for cache in fn.device_caches.values() for k in cache[0].values() if k.metadata.launch_pdl]
        assert kernels, fn
        for k in kernels:
            assert _memory_before_wait(k.asm["ptx"]) == []


@pytest.mark.parametrize("rows", [1, 16, 17, 97])
@pytest.mark.parametrize("split", [False, True])
def test_prologue_counts_and_zeroes_in_steps(monkeypatch, rows, split):
    # the prologue's step follows the targets' count (up to _COUNT_BLOCK): with steps of 16 here, 97
    # targets take seven, and sync's room for the split (2 + rows ints) is zeroed past the first step
    monkeypatch.setattr(cek, "_COUNT_BLOCK", 16)
    monkeypatch.setattr(cek, "COUNT_BLOCK_MIN", 16)
    _, t = _inputs(rows, 10, torch.float32, seed=rows)
    sync = cek._prologue(t, -100, count=True, n_rows_split=rows if split else None)
    assert sync[0].item() == int((t != -100).sum())
    assert sync.numel() == (2 + rows if split else 1) and (sync[1:] == 0).all()
