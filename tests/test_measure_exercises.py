"""The measured-trips checkers (fusionlab.measure.exercises) fail a ledger that is not the kernel's trips,
and say which tensor, which way and what it usually means. The right answers run in
solutions/measured_trips.ipynb (strict nbval); here, the wrong ones, which fail fast."""

from __future__ import annotations

import math

import pytest
import torch

from fusionlab import runtime
from fusionlab.grading import CheckFailed
from fusionlab.ledger import READ, WRITE, Ledger
from fusionlab.measure import exercises as ex

pytestmark = pytest.mark.skipif(runtime.is_gpu(), reason="counts loads in Triton's interpreter (CPU)")


def _mm(M, N, K, bm, bn, dtype, a_times=None):
    a = M * K * (math.ceil(N / bn) if a_times is None else a_times)
    return Ledger(dtype_bytes=dtype).op("matmul", reads={"A": a, "B": K * N * math.ceil(M / bm)}, writes={"C": M * N})


def test_a_matmul_ledger_that_reads_each_input_once_is_told_the_kernel_rereads_a():
    ex.check_matmul_trips(_mm)
    with pytest.raises(CheckFailed, match=r"your ledger says read A .*the kernel, counted load by load"):
        ex.check_matmul_trips(lambda M, N, K, bm, bn, dtype: _mm(M, N, K, bm, bn, dtype, a_times=1))


def test_an_attention_ledger_split_into_ops_is_told_why_o_vanished():
    def two_ops(B, H, N_q, N_k, D, dtype, bm):
        t = math.ceil(N_q / bm)
        led = Ledger(dtype_bytes=dtype)
        led.op("attn", reads={"Q": B * H * N_q * D, "K": B * H * N_k * D * t, "V": B * H * N_k * D * t},
               writes={"O": B * H * N_q * D})  # fmt: skip
        led.op("lse", reads={"O": B * H * N_q * D}, writes={"lse": B * H * N_q})
        return led

    with pytest.raises(CheckFailed, match="inside a chain of ops"):
        ex.check_attention_trips(two_ops)
    with pytest.raises(CheckFailed, match="return a fusionlab.ledger.Ledger"):
        ex.check_attention_trips(lambda *a: 42)


def test_totals_name_a_reread_a_double_count_and_a_unit_slip():
    led = Ledger(dtype_bytes=4).op("k", reads={"x": 100}, writes={"y": 100})
    with pytest.raises(CheckFailed, match="a re-read your ledger does not count"):
        ex.compare_with_count(led, {("x_ptr", READ): 800, ("y_ptr", WRITE): 400}, "here", by_tensor=False)
    with pytest.raises(CheckFailed, match="Your ledger counts it twice"):
        ex.compare_with_count(led, {("x_ptr", READ): 200, ("y_ptr", WRITE): 400}, "here", by_tensor=False)
    with pytest.raises(CheckFailed, match="bytes against elements"):
        ex.compare_with_count(led, {("x_ptr", READ): 100, ("y_ptr", WRITE): 400}, "here", by_tensor=False)
    ex.compare_with_count(led, {("x_ptr", READ): 400, ("y_ptr", WRITE): 400}, "here", by_tensor=False)


def test_the_interpreter_count_is_what_the_kernel_loads():
    a, b = torch.randn(33, 20), torch.randn(20, 17)
    counted = ex._counted(lambda: ex.run_matmul(a, b, 16, 16), ex.MATMUL_NAMES)
    assert counted == {("A", READ): 33 * 20 * 4 * 2, ("B", READ): 20 * 17 * 4 * 3, ("C", WRITE): 33 * 17 * 4}


def _attn(B, H, N_q, N_k, D, dtype, bm, lse_bytes=4):
    t = math.ceil(N_q / bm)
    reads = {"Q": B * H * N_q * D, "K": B * H * N_k * D * t, "V": B * H * N_k * D * t}
    sizes = {"lse": lse_bytes} if lse_bytes else {}
    return Ledger(dtype_bytes=dtype, sizes=sizes).op(
        "a", reads=reads, writes={"O": B * H * N_q * D, "lse": B * H * N_q}
    )


def test_an_attention_ledger_is_held_in_16_bits_where_lse_stays_fp32():
    assert "attention ledger" in ex.check_attention_trips(_attn).message
    with pytest.raises(CheckFailed, match=r"(?s)16, (float16|bfloat16).*write lse.*lse is fp32 \(4 bytes a row\)"):
        ex.check_attention_trips(lambda *a: _attn(*a, lse_bytes=None))  # lse at the inputs' 2 bytes
