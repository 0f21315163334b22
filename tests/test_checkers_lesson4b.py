"""Lesson 4b's checkers reject each mistake they name, and pass the solutions' answers."""

from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from fusionlab import runtime
from fusionlab.grading import CheckFailed
from fusionlab.lessons.l4b import checkers as ex

BLOCK = 1024


@triton.jit
def _dropout_add_kernel(x_ptr, r_ptr, h_ptr, n, p, scale, seed, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    r = tl.load(r_ptr + offs, mask=mask).to(tl.float32)
    keep = tl.rand(seed, offs) >= p
    tl.store(h_ptr + offs, r + tl.where(keep, x * scale, 0.0), mask=mask)


@triton.jit
def _dropout_bwd_kernel(dh_ptr, dx_ptr, n, p, scale, seed, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dh = tl.load(dh_ptr + offs, mask=mask).to(tl.float32)
    keep = tl.rand(seed, offs) >= p
    tl.store(dx_ptr + offs, tl.where(keep, dh * scale, 0.0), mask=mask)


def dropout_add(x, r, p, seed, scale=None):
    h = torch.empty_like(x)
    n = x.numel()
    s = 1 / (1 - p) if scale is None else scale
    _dropout_add_kernel[(triton.cdiv(n, BLOCK),)](x, r, h, n, p, s, seed, BLOCK=BLOCK)
    return h


def dropout_backward(dh, p, seed, seed_shift=0):
    dx = torch.empty_like(dh)
    n = dh.numel()
    _dropout_bwd_kernel[(triton.cdiv(n, BLOCK),)](dh, dx, n, p, 1 / (1 - p), seed + seed_shift, BLOCK=BLOCK)
    return dx


def test_dropout_checkers_pass_the_solution():
    ex.check_dropout_add(dropout_add)
    ex.check_dropout_backward(dropout_add, dropout_backward)


def test_a_missing_scale_is_named():
    with pytest.raises(CheckFailed, match=r"1/\(1 - p\)"):
        ex.check_dropout_add(lambda x, r, p, s: dropout_add(x, r, p, s, scale=1.0))


def test_a_stored_mask_is_named():
    def with_mask(x, r, p, seed):
        keep = torch.empty_like(x)  # a mask kept beside h (as torch's CPU dropout keeps one, in x's dtype)
        keep.fill_(1.0)
        return dropout_add(x, r, p, seed)

    with pytest.raises(CheckFailed, match="mask stored"):
        ex.check_dropout_add(with_mask)


@pytest.mark.parametrize("kind", ["bool", "packed bits"])
def test_a_byte_or_bit_mask_is_named(kind):
    # torch's GPU dropout keeps a bool mask, a byte an element; a mask packed 32 to an int32 word is still one
    def with_mask(x, r, p, seed):
        n = x.numel()
        keep = torch.empty(x.shape, dtype=torch.bool) if kind == "bool" else torch.empty(-(-n // 32), dtype=torch.int32)
        keep.fill_(1)
        return dropout_add(x, r, p, seed)

    with pytest.raises(CheckFailed, match="mask stored"):
        ex.check_dropout_add(with_mask)


def test_a_backward_with_another_mask_is_named():
    with pytest.raises(CheckFailed, match="mask differs"):
        ex.check_dropout_backward(dropout_add, lambda dh, p, s: dropout_backward(dh, p, s, seed_shift=1))


def test_a_stashed_mask_cannot_pass():
    stash = {}

    def fwd(x, r, p, seed):
        h = dropout_add(x, r, p, seed)
        stash[seed] = h != r
        return h

    def bwd(dh, p, seed):  # reads what the forward left behind: nothing yet for an unseen seed
        keep = stash.get(seed, torch.ones_like(dh, dtype=torch.bool))
        return dropout_backward(dh, p, seed, seed_shift=1) * 0 + torch.where(keep, dh / (1 - p), 0.0)

    with pytest.raises(CheckFailed):
        ex.check_dropout_backward(fwd, bwd)


def test_streams_overlapping_are_named():
    ex.check_streams(lambda step, layer: (7 + step, layer * 100), 100)
    with pytest.raises(CheckFailed, match="two layers"):
        ex.check_streams(lambda step, layer: (7 + step, 0), 100)
    with pytest.raises(CheckFailed, match="two steps"):
        ex.check_streams(lambda step, layer: (7, layer * 100), 100)


@triton.jit
def _adamw_kernel(table_ptr, chunk_ptr, lr, beta1, beta2, eps, wd, step_size, inv_sqrt_bc2,
                  L2: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    t = tl.load(chunk_ptr + 2 * tl.program_id(0))
    start = tl.load(chunk_ptr + 2 * tl.program_id(0) + 1)
    row = table_ptr + 5 * t
    p_ptr = tl.load(row + 0).to(tl.pointer_type(tl.float32))
    g_ptr = tl.load(row + 1).to(tl.pointer_type(tl.float32))
    m_ptr = tl.load(row + 2).to(tl.pointer_type(tl.float32))
    v_ptr = tl.load(row + 3).to(tl.pointer_type(tl.float32))
    offs = start + tl.arange(0, BLOCK)
    mask = offs < tl.load(row + 4)
    p, g = tl.load(p_ptr + offs, mask=mask), tl.load(g_ptr + offs, mask=mask)
    m, v = tl.load(m_ptr + offs, mask=mask), tl.load(v_ptr + offs, mask=mask)
    if L2:
        g = g + wd * p
    else:
        p = p * (1.0 - lr * wd)
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    p = p - step_size * m / (tl.sqrt(v) * inv_sqrt_bc2 + eps)
    tl.store(p_ptr + offs, p, mask=mask)
    tl.store(m_ptr + offs, m, mask=mask)
    tl.store(v_ptr + offs, v, mask=mask)


def adamw_step(ps, gs, ms, vs, step, lr, beta1, beta2, eps, wd, l2=False, bias_correction=True):
    rows = [x for p, g, m, v in zip(ps, gs, ms, vs, strict=True)
            for x in (p.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), p.numel())]  # fmt: skip
    chunks = [x for i, p in enumerate(ps) for s in range(0, p.numel(), BLOCK) for x in (i, s)]
    table = torch.tensor(rows, dtype=torch.int64).to(runtime.DEVICE)
    chunk_table = torch.tensor(chunks, dtype=torch.int64).to(runtime.DEVICE)
    bc1, bc2 = (1 - beta1**step, 1 - beta2**step) if bias_correction else (1.0, 1.0)
    _adamw_kernel[(len(chunks) // 2,)](table, chunk_table, lr, beta1, beta2, eps, wd, lr / bc1, 1 / math.sqrt(bc2),
                                       L2=l2, BLOCK=BLOCK)  # fmt: skip


def test_adamw_checker_passes_the_solution_and_names_each_mistake():
    ex.check_adamw(adamw_step)
    with pytest.raises(CheckFailed, match="Adam's L2"):
        ex.check_adamw(lambda *a: adamw_step(*a, l2=True))
    with pytest.raises(CheckFailed, match="bias correction"):
        ex.check_adamw(lambda *a: adamw_step(*a, bias_correction=False))

    def per_tensor(ps, gs, ms, vs, *rest):
        for p, g, m, v in zip(ps, gs, ms, vs, strict=True):
            adamw_step([p], [g], [m], [v], *rest)

    with pytest.raises(CheckFailed, match="one a tensor"):
        ex.check_adamw(per_tensor)


def test_the_grading_command_finds_lesson_4b_s_exercises():
    # its import pattern took lesson numbers alone (l4), so a notebook of lesson 4b had no exercise to grade
    from pathlib import Path

    from fusionlab.grade import read_notebook

    nb = Path(__file__).resolve().parent.parent / "solutions" / "04b_randomness_and_many_tensors.ipynb"
    _, exercises = read_notebook(str(nb))
    assert [(e.lesson, e.checker) for e in exercises] == [
        ("l4b", "check_dropout_add"),
        ("l4b", "check_dropout_backward"),
        ("l4b", "check_streams"),
        ("l4b", "check_adamw"),
    ]
