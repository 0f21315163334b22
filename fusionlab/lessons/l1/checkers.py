"""Checkers for lesson 1's exercises (solutions/01_the_warehouse.ipynb)."""

from __future__ import annotations

import torch

from ... import grading
from ...grading import CheckFailed, answer_key, call_learner, compare_ledgers, number
from ...ledger import Ledger


@answer_key
def silu_two_ops_ledger(n: int, dtype=torch.float32) -> Ledger:
    """``y = torch.sigmoid(x) * x`` run as two kernels: x is read by both."""
    led = Ledger(dtype_bytes=dtype)
    led.op("sigmoid", reads={"x": n}, writes={"s": n})
    led.op("mul", reads={"s": n, "x": n}, writes={"y": n})
    return led


def check_silu_ledger(make_ledger) -> grading.Passed:
    """Exercise 1: ``make_ledger(n, dtype)`` must describe SiLU-as-two-ops trip by trip."""
    for n, dtype in ((1000, torch.float32), (4097, torch.bfloat16), (2**28, torch.float16), (12_345, torch.float64)):
        got = call_learner(make_ledger, n, dtype, name="make_ledger", where=f"make_ledger({n}, {dtype})")
        compare_ledgers(got, silu_two_ops_ledger(n, dtype), f"make_ledger({n}, {str(dtype).replace('torch.', '')})")
    want = silu_two_ops_ledger(1000, torch.float32)
    msg = f"✓ SiLU ledger: trip by trip right; {want.saving:.1f}x fewer bytes fused — the two reads of x become one"
    return grading.passed(msg)


@answer_key
def exp_cos_reference(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(torch.cos(x.float())).to(x.dtype)


def check_exp_cos(exp_cos) -> grading.Passed:
    """Exercise 2: ``exp_cos(x)`` must compute exp(cos(x)) in one Triton kernel."""
    return grading.check_function(
        exp_cos,
        exp_cos_reference,
        lambda n, dtype, gen: (grading.with_room_after(grading.randn(n, dtype, gen=gen)),),
        name="exp_cos",
        launches=1,
        hint="Compute in fp32 (x.to(tl.float32)) and store in the output's dtype.",
    )


def check_predict_eager_ms(predict) -> grading.Passed:
    """Exercise 3: ``predict(n, dtype_bytes, copy_GBps)`` predicts eager ``x.cos().cos()`` in ms."""
    for n, b, bw in ((2**28, 4, 4000.0), (10**6, 2, 900.0), (12345, 4, 3350.0)):
        want = Ledger.chain(["cos", "cos"], n, b).predict_ms(bw, fused=False)
        call = f"predict({n}, {b}, {bw})"
        got = number(call_learner(predict, n, b, bw, name="predict", where=call), call, "milliseconds")
        if abs(got - want) > 0.01 * want:
            ratio = got / want
            tip = ""
            if abs(ratio - 0.5) < 0.01:
                tip = " That is one pass: eager runs two kernels, each reading and writing the whole tensor."
            elif abs(ratio - 1000) < 10 or abs(ratio - 0.001) < 1e-5:
                tip = " Check the units: GB/s is 1e9 bytes per second, and the answer is in milliseconds."
            elif abs(ratio - 1e9 / 2**30) < 1e-3:
                tip = " GB/s is 1e9 bytes per second, not 2**30."
            elif abs(ratio * b - 1) < 0.01 or abs(ratio * b / 4 - 1) < 0.01:
                tip = " Use dtype_bytes: each element is that many bytes."
            elif abs(ratio - 8) < 0.01:
                tip = " Count bytes, not bits."
            raise CheckFailed(f"predict({n}, {b}, {bw}) = {got:.6g} ms, expected {want:.6g} ms.{tip}")
    msg = "✓ prediction: 4 passes of n elements (two kernels, each one read and one write) over the copy bandwidth"
    return grading.passed(msg)


def check_add_intensity(intensity: float) -> grading.Passed:
    """Exercise 4: the arithmetic intensity of ``z = x + y`` on same-shape fp32 tensors."""
    want = 1 / 12
    got = number(intensity, "add_intensity", "FLOP per byte")  # a numpy scalar is a number too
    if abs(got - want) > 0.01 * want:
        tip = ""
        if abs(got - 1 / 8) < 1e-3:
            tip = " Did you forget the write of z?"
        elif abs(got - 1 / 3) < 1e-3:
            tip = " Count bytes, not elements: fp32 has 4 bytes per element."
        elif abs(got - 12) < 0.1:
            tip = " Upside down: intensity is FLOPs divided by bytes."
        raise CheckFailed(f"intensity {intensity!r} FLOP/byte is not right.{tip}")
    msg = "✓ intensity: 1 FLOP per 12 bytes — far below any GPU's balance point, so memory-bound"
    return grading.passed(msg)
