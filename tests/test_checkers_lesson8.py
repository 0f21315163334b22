"""Lesson 8's checkers accept the reference solutions and reject each kind of wrong answer.

The right answers below are the ones in solutions/08_flash_attention_backward.ipynb; the wrong ones are
the mistakes the checkers are there to catch: D from dO and V, P without the log-sum-exp (and a softmax
recomputed instead of the given lse), P in base 2, the scale missing from dQ or dK, dS without D, the
causal mask forgotten in the backward, GQA's dK/dV not summed, a kernel that stores P, torch doing the
work; wrong counts of eager's backward traffic.
"""

from __future__ import annotations  # noqa: I001  (fusionlab before triton: see test_checkers_lesson2.py)

import math

import pytest
import torch

from fusionlab import runtime
import triton
import triton.language as tl

from fusionlab.grading import CheckFailed
from fusionlab.lessons.l8 import checkers as ex

pytestmark = [
    pytest.mark.lesson8,
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
    pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning"),
]


# -- exercise 1: the gradients in float64 ------------------------------------------------------------------
def solution_grads(q, k, v, o, lse, do, causal=False, *, mistake=None):
    scale = 1 / math.sqrt(q.shape[-1])
    group = q.shape[1] // k.shape[1]
    kr, vr = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    s = q @ kr.transpose(-2, -1) * scale
    if causal and mistake != "mask":
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    if mistake == "softmax":
        p = torch.softmax(s, dim=-1)
    elif mistake == "exp(s)":
        p = torch.exp(s)
    elif mistake == "base2":
        p = torch.exp2(s - lse[..., None])
    else:
        p = torch.exp(s - lse[..., None])
    dp = do @ vr.transpose(-2, -1)
    delta = (do * vr).sum(-1) if mistake == "D from V" else (do * o).sum(-1)
    ds = p * dp if mistake == "no D" else p * (dp - delta[..., None])
    dq = ds @ kr * (1 if mistake == "dq scale" else scale)
    dk = ds.transpose(-2, -1) @ q * (1 if mistake == "dk scale" else scale)
    dv = p.transpose(-2, -1) @ do
    B, H_kv, n_k, d = k.shape
    if mistake == "not summed":
        return dq, dk.view(B, H_kv, group, n_k, d)[:, :, 0], dv.view(B, H_kv, group, n_k, d)[:, :, 0]
    return dq, dk.view(B, H_kv, group, n_k, d).sum(2), dv.view(B, H_kv, group, n_k, d).sum(2)


def autograd_grads(q, k, v, o, lse, do, causal=False):
    """Autograd through a softmax it recomputes: right on a true lse, caught by the shifted-lse probe."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    with torch.enable_grad():
        out = torch.nn.functional.scaled_dot_product_attention(
            *leaves[:1], *(t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in leaves[1:]), is_causal=causal
        )
        return torch.autograd.grad(out, leaves, do)


def test_grads_accept_the_solution(capsys):
    assert "✓ attention_grads" in str(ex.check_attention_grads(solution_grads))


@pytest.mark.parametrize(
    ("mistake", "said"),
    [
        ("D from V", "D from dO and V"),
        ("exp(s)", "P = exp\\(s\\)"),
        ("base2", "P in base 2"),
        ("dq scale", "dQ without the scale"),
        ("dk scale", "dK without the scale"),
        ("no D", "dS without D"),
        ("mask", "no causal mask in the backward"),
        ("not summed", "GQA: one head of the group"),
        ("softmax", "lse shifted"),
    ],
)
def test_grads_reject_each_mistake(mistake, said):
    with pytest.raises(CheckFailed, match=said):
        ex.check_attention_grads(lambda *a: solution_grads(*a, mistake=mistake))


def test_grads_reject_autograd_through_a_softmax():
    with pytest.raises(CheckFailed, match="lse shifted"):
        ex.check_attention_grads(autograd_grads)


def test_grads_name_gqa_not_summed_by_shape():
    def per_query_head(q, k, v, o, lse, do, causal=False):
        group = q.shape[1] // k.shape[1]
        return solution_grads(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), o, lse, do, causal)

    with pytest.raises(CheckFailed, match="sum over the query heads of its group"):
        ex.check_attention_grads(per_query_head)


# -- exercise 2: the kernel ------------------------------------------------------------------------------------
@triton.jit
def delta_kernel(
    o_ptr, do_ptr, delta_ptr, n_rows, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(o_ptr + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + offs_m[:, None] * HEAD_DIM + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(delta_ptr + offs_m, tl.sum(o * do, 1), mask=offs_m < n_rows)


@triton.jit
def dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, n_q, n_k, group, scale,
                HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr, MISTAKE: tl.constexpr):  # fmt: skip
    pid_n, bhk = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d[None, :] < HEAD_DIM
    kv_mask = (offs_n[:, None] < n_k) & d_mask
    kv_off = bhk * n_k * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    k = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0)
    v = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    lo = (pid_n * BLOCK_N) // BLOCK_M * BLOCK_M if CAUSAL and MISTAKE != 2 else 0
    for g in range(0, group):
        bh = bhk * group + g
        for start_m in range(lo, n_q, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            q_mask = (offs_m[:, None] < n_q) & d_mask
            q_off = bh * n_q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
            q = tl.load(q_ptr + q_off, mask=q_mask, other=0.0)
            do = tl.load(do_ptr + q_off, mask=q_mask, other=0.0)
            lse = tl.load(lse_ptr + bh * n_q + offs_m, mask=offs_m < n_q, other=float("inf"))
            di = tl.load(delta_ptr + bh * n_q + offs_m, mask=offs_m < n_q, other=0.0)
            s_t = tl.dot(k, tl.trans(q)) * scale
            if MISTAKE == 1:
                p_t = tl.exp(s_t)
            else:
                p_t = tl.exp(s_t - lse[None, :])
            keep = offs_n[:, None] < n_k
            if CAUSAL and MISTAKE != 2:
                keep = keep & (offs_m[None, :] >= offs_n[:, None])
            p_t = tl.where(keep & (offs_m[None, :] < n_q), p_t, 0.0)
            dv += tl.dot(p_t.to(do.dtype), do)
            dp_t = tl.dot(v, tl.trans(do))
            ds_t = p_t * dp_t if MISTAKE == 3 else p_t * (dp_t - di[None, :])
            dk += tl.dot(ds_t.to(q.dtype), q)
    if MISTAKE != 4:
        dk = dk * scale
    out_mask = (offs_n[:, None] < n_k) & d_mask
    tl.store(dk_ptr + kv_off, dk.to(dk_ptr.dtype.element_ty), mask=out_mask)
    tl.store(dv_ptr + kv_off, dv.to(dv_ptr.dtype.element_ty), mask=out_mask)


BLOCK_M, BLOCK_N = runtime.pick(gpu=(64, 64), interpreter=(16, 32))


def solution_dkdv(q, k, v, o, lse, do, causal=False, mistake=0):
    B, H, n_q, d = q.shape
    H_kv, n_k = k.shape[1], k.shape[2]
    delta = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    block_d = max(16, triton.next_power_of_2(d))
    delta_kernel[(triton.cdiv(B * H * n_q, 64),)](o, do, delta, B * H * n_q, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_M=64)
    dkdv_kernel[(triton.cdiv(n_k, BLOCK_N), B * H_kv)](
        q, k, v, do, lse, delta, dk, dv, n_q, n_k, H // H_kv, 1 / math.sqrt(d),
        HEAD_DIM=d, BLOCK_D=block_d, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, CAUSAL=causal, MISTAKE=mistake,
    )  # fmt: skip
    return dk, dv


def test_dkdv_accepts_the_solution():
    assert "✓ flash_dkdv" in str(ex.check_flash_dkdv(solution_dkdv))


@pytest.mark.parametrize(
    ("mistake", "said"),
    [(1, "P = exp\\(s\\)"), (2, "no causal mask in the backward"), (3, "dS without D"), (4, "dK without the scale")],
)
def test_dkdv_rejects_each_mistake(mistake, said):
    with pytest.raises(CheckFailed, match=said):
        ex.check_flash_dkdv(lambda *a: solution_dkdv(*a, mistake=mistake))


def test_dkdv_rejects_d_from_v():
    def d_from_v(q, k, v, o, lse, do, causal=False):  # D = rowsum(dO * V), where V has O's shape
        return solution_dkdv(q, k, v, v if v.shape == o.shape else o, lse, do, causal)

    # the values are compared before the launches' inputs: the mistake is named, not only O's absence
    with pytest.raises(CheckFailed, match="D from dO and V"):
        ex.check_flash_dkdv(d_from_v)


def test_dkdv_rejects_a_kernel_that_stores_p():
    def stores_p(q, k, v, o, lse, do, causal=False):
        p = torch.empty(q.shape[0], q.shape[1], q.shape[2], k.shape[2], device=q.device, dtype=torch.float32)
        del p
        return solution_dkdv(q, k, v, o, lse, do, causal)

    with pytest.raises(CheckFailed, match="entries of P"):
        ex.check_flash_dkdv(stores_p)


def test_dkdv_rejects_gqa_not_summed():
    def first_head_only(q, k, v, o, lse, do, causal=False):
        group = q.shape[1] // k.shape[1]
        return solution_dkdv(q[:, ::group].contiguous(), k, v, o[:, ::group], lse[:, ::group], do[:, ::group], causal)

    with pytest.raises(CheckFailed):
        ex.check_flash_dkdv(first_head_only)


def test_dkdv_rejects_torch_doing_the_work():
    def torch_answer(q, k, v, o, lse, do, causal=False):
        _, dk, dv = solution_grads(q.double(), k.double(), v.double(), o.double(), lse.double(), do.double(), causal)
        return dk.to(k.dtype), dv.to(v.dtype)

    with pytest.raises(CheckFailed, match="torch"):
        ex.check_flash_dkdv(torch_answer)


# -- exercise 3: eager's backward bytes ------------------------------------------------------------------------
def test_eager_backward_gib():
    B, H, N, D = ex.EAGER_SHAPE
    one = B * H * N * N * 2 / 2**30
    small = 7 * B * H * N * D * 2 / 2**30  # dO, V, dV, Q, K, dQ, dK
    assert "✓ eager backward" in str(ex.check_eager_backward_gib(8 * one + small))
    with pytest.raises(CheckFailed, match="scale's backward"):
        ex.check_eager_backward_gib(6 * one)
    with pytest.raises(CheckFailed, match="bytes"):
        ex.check_eager_backward_gib((8 * one + small) * 2**30)
