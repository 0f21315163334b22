"""Lesson 5's linear + cross-entropy chunked over tokens: F.cross_entropy(h @ W.T) without the logits."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from conftest import cross_entropy_by_hand, gpu_only

from fusionlab import runtime
from fusionlab.instrument import LaunchCounter
from fusionlab.kernels import KernelInputError
from fusionlab.kernels import _cross_entropy_kernels as cek
from fusionlab.kernels import linear_cross_entropy as lce_module
from fusionlab.kernels.linear_cross_entropy import (
    linear_cross_entropy,
    linear_cross_entropy_chunk,
    linear_cross_entropy_eager,
    linear_cross_entropy_memory,
    linear_cross_entropy_reference,
)

pytestmark = [
    pytest.mark.lesson5,
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]


def _inputs(tokens, hidden, vocab, dtype=torch.float32, *, seed=0, ignored=0.3):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=gen)
    w = torch.randn(vocab, hidden, generator=gen) / hidden**0.5 * 2
    t = torch.randint(0, vocab, (tokens,), generator=gen)
    drop = torch.rand(tokens, generator=gen) < ignored
    drop[0] = tokens > 1
    t[drop] = -100
    dev = runtime.DEVICE
    return h.to(dev, dtype), w.to(dev, dtype), t.to(dev)


def _check(h, w, t, reduction="mean", weights=None, atol=1e-5, rtol=1e-5, **kw):
    hl, wl = h.clone().requires_grad_(), w.clone().requires_grad_()
    loss = linear_cross_entropy(hl, wl, t, reduction=reduction, **kw)
    extra = {k: v for k, v in kw.items() if k in ("ignore_index", "label_smoothing")}
    hd, wd = h.double().requires_grad_(), w.double().requires_grad_()
    want = linear_cross_entropy_reference(hd, wd, t, reduction=reduction, **extra)
    weights = torch.ones_like(want) if weights is None else weights
    (loss * weights.to(loss.dtype)).sum().backward()
    (want * weights.double()).sum().backward()
    torch.testing.assert_close(loss.double(), want.detach(), atol=atol * 10, rtol=rtol)
    torch.testing.assert_close(hl.grad.double(), hd.grad, atol=atol, rtol=rtol)
    torch.testing.assert_close(wl.grad.double(), wd.grad, atol=atol, rtol=rtol)
    return loss


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize(
    "tokens, hidden, vocab, chunk",
    [
        (37, 16, 97, None),  # one chunk in the interpreter
        (37, 16, 97, 10),  # four chunks, the last one ragged
        (5, 8, 3, 1),  # a chunk per row, a tiny vocabulary
        (64, 24, 5003, 20),  # an odd vocabulary wider than the interpreter's head tile: streamed tiles
    ],
)
def test_matches_float64(tokens, hidden, vocab, chunk, reduction):
    h, w, t = _inputs(tokens, hidden, vocab)
    # "none": per-row weights, so the backward must use each row's grad_output
    weights = torch.randn(tokens, device=h.device) if reduction == "none" else None
    _check(h, w, t, reduction, weights, chunk=chunk)


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_label_smoothing_and_ignore_index(reduction):
    h, w, t = _inputs(29, 12, 301, seed=1)
    t[t == -100] = 7  # class 7 is the ignored one
    _check(h, w, t, reduction, chunk=8, ignore_index=7, label_smoothing=0.1)


def test_grad_output_scales_both_gradients():
    h, w, t = _inputs(20, 8, 50, seed=2)
    _check(h, w, t, "sum", torch.tensor(3.0, device=h.device), chunk=6)


@pytest.mark.parametrize("which", ["h", "weight"])
def test_only_the_gradients_asked_for(which):
    h, w, t = _inputs(16, 8, 40, seed=3)
    hl = h.clone().requires_grad_(which == "h")
    wl = w.clone().requires_grad_(which == "weight")
    linear_cross_entropy(hl, wl, t, chunk=5).backward()
    assert (hl.grad is None) == (which != "h") and (wl.grad is None) == (which != "weight")
    hd, wd = h.double().requires_grad_(), w.double().requires_grad_()
    linear_cross_entropy_reference(hd, wd, t).backward()
    got, want = (hl.grad, hd.grad) if which == "h" else (wl.grad, wd.grad)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_accumulating_in_the_weight_dtype():
    h, w, t = _inputs(40, 16, 200, seed=4)
    _check(h, w, t, "mean", chunk=7, accum_dtype=None)


def test_fp16_against_float64():
    h, w, t = _inputs(24, 32, 700, torch.float16, seed=5)
    _check(h, w, t, "mean", atol=2e-3, rtol=1e-2, chunk=10)


def test_no_grad_forward_and_all_ignored():
    h, w, t = _inputs(12, 8, 30, seed=6)
    with torch.no_grad():
        loss = linear_cross_entropy(h, w, t, chunk=5)
    want = linear_cross_entropy_reference(h.double(), w.double(), t)
    torch.testing.assert_close(loss.double(), want, atol=1e-5, rtol=1e-5)
    t[:] = -100
    assert torch.isnan(linear_cross_entropy(h, w, t)), "mean over no rows is NaN, as torch"


def test_logits_never_exist_whole():
    # every (T, V)-sized allocation would be a logits tensor: there must be none, only chunk-sized ones
    tokens, hidden, vocab, chunk = 40, 8, 64, 10
    h, w, t = _inputs(tokens, hidden, vocab, seed=7)
    h.requires_grad_()
    seen = []

    class Sizes(LaunchCounter):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            outside_kernels = self._state is None or self._state.depth == 0  # not the interpreter's copies
            if isinstance(out, torch.Tensor) and outside_kernels:
                seen.append(out.numel())
            return out

    with Sizes():
        linear_cross_entropy(h, w, t, chunk=chunk).backward()
    assert max(seen) <= chunk * vocab, f"a tensor of {max(seen)} elements: the logits are {tokens * vocab}"


def test_eager_and_reference():
    # eager: the whole logits, then log_softmax and nll_loss; against the loss by hand in float64
    h, w, t = _inputs(6, 4, 9)
    with LaunchCounter() as counter:
        got = linear_cross_entropy_eager(h, w, t)
    assert counter.torch_ops == ["mm", "_log_softmax", "nll_loss_forward"], counter.torch_ops
    want = cross_entropy_by_hand(h.double() @ w.double().T, t)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_memory_model_and_default_chunk(monkeypatch):
    mem = linear_cross_entropy_memory(8192, 4096, 128256, torch.bfloat16, accum_dtype=None)
    assert mem["chunked"] * 4 <= mem["eager"]
    monkeypatch.setattr(runtime, "is_gpu", lambda: True)
    assert linear_cross_entropy_chunk(8192, 128256, 4096) == 1024
    assert linear_cross_entropy_chunk(100, 128256, 4096) == 256


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda h, w, t: (h, w.T.contiguous(), t), "F.linear"),
        (lambda h, w, t: (h, w.half(), t), "share dtype"),
        (lambda h, w, t: (h, w, t[:-1]), "one class index per row"),
        (lambda h, w, t: (h, w, t.int()), "dtype"),
        (lambda h, w, t: (h[None], w, t), "dimension"),
    ],
    ids=["transposed-weight", "mixed-dtype", "short-target", "int32-target", "3d"],
)
def test_bad_inputs(make, match):
    h, w, t = _inputs(6, 4, 9)
    with pytest.raises(KernelInputError, match=match):
        linear_cross_entropy(*make(h, w, t))


def test_bad_arguments():
    h, w, t = _inputs(6, 4, 9)
    with pytest.raises(KernelInputError, match="chunk"):
        linear_cross_entropy(h, w, t, chunk=0)
    with pytest.raises(KernelInputError, match="accum_dtype"):
        linear_cross_entropy(h, w, t, accum_dtype=torch.float64)
    with pytest.raises(KernelInputError, match="reduction"):
        linear_cross_entropy(h, w, t, reduction="avg")


@gpu_only
@pytest.mark.gpu
def test_bf16_on_gpu_close_to_eager():
    # bf16 end to end: our error against float64 is no worse than eager bf16's (with fp32 accumulation)
    h, w, t = _inputs(1024, 256, 32000, torch.bfloat16, seed=8)
    hd, wd = h.double().requires_grad_(), w.double().requires_grad_()
    linear_cross_entropy_reference(hd, wd, t).backward()
    errs = {}
    for name, fn in [("eager", linear_cross_entropy_eager), ("fused", linear_cross_entropy)]:
        hl, wl = h.clone().requires_grad_(), w.clone().requires_grad_()
        fn(hl, wl, t).backward()
        errs[name] = max(
            ((hl.grad.double() - hd.grad).norm() / hd.grad.norm()).item(),
            ((wl.grad.double() - wd.grad).norm() / wd.grad.norm()).item(),
        )
    assert errs["fused"] <= 1.5 * errs["eager"] + 1e-3, errs


def test_composes_cross_entropy_through_its_public_names():
    # linear_cross_entropy builds on cross_entropy's public parts and on the private module both import,
    # never on cross_entropy's own private code; that module imports neither op (no cycle, no sideways path)
    def imported(module, source):
        tree = ast.parse(Path(module.__file__).read_text())
        return [a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == source for a in n.names]

    from_ce = imported(lce_module, "cross_entropy")
    assert from_ce and not [name for name in from_ce if name.startswith("_")], from_ce
    assert not imported(cek, "cross_entropy") + imported(cek, "linear_cross_entropy")
