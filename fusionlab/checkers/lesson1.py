"""Checkers for lesson 1's exercises (solutions/01_the_warehouse.ipynb)."""

from __future__ import annotations

import math

import torch

from .. import check
from ..check import CheckFailed
from ..trips import Ledger, human_bytes


def silu_two_ops_ledger(n: int, dtype=torch.float32) -> Ledger:
    """``y = torch.sigmoid(x) * x`` run as two kernels: x is read by both."""
    led = Ledger(dtype_bytes=dtype)
    led.op("sigmoid", reads={"x": n}, writes={"s": n})
    led.op("mul", reads={"s": n, "x": n}, writes={"y": n})
    return led


def check_silu_ledger(make_ledger) -> check.Passed:
    """Exercise 1: ``make_ledger(n, dtype)`` must describe SiLU-as-two-ops trip by trip."""
    for n, dtype in ((1000, torch.float32), (4097, torch.bfloat16), (2**28, torch.float16)):
        got = make_ledger(n, dtype)
        if not isinstance(got, Ledger):
            raise CheckFailed(f"make_ledger must return a fusionlab.trips.Ledger, got {type(got).__name__}.")
        want = silu_two_ops_ledger(n, dtype)
        if got.dtype_bytes != want.dtype_bytes:
            raise CheckFailed(f"n={n}, {dtype}: the ledger counts {got.dtype_bytes} bytes per element, "
                              f"expected {want.dtype_bytes}. Pass dtype_bytes=dtype.")
        for fused in (False, True):
            if got.bytes(fused) != want.bytes(fused):
                kind = "fused" if fused else "unfused"
                raise CheckFailed(
                    f"n={n}, {dtype}: {kind} total is {human_bytes(got.bytes(fused))}, expected "
                    f"{human_bytes(want.bytes(fused))}. "
                    + ("Unfused, each kernel reads *all* of its inputs — which tensors does mul read?"
                       if not fused else "Fused, x is read once even though two ops use it.")
                )
    msg = f"✓ SiLU ledger: {want.saving:.1f}x fewer bytes fused — the two reads of x become one"
    return check.passed(msg)


def exp_cos_reference(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(torch.cos(x.float())).to(x.dtype)


def check_exp_cos(exp_cos) -> check.Passed:
    """Exercise 2: ``exp_cos(x)`` must compute exp(cos(x)) in one Triton kernel."""
    return check.check_function(
        exp_cos,
        exp_cos_reference,
        lambda n, dtype, gen: (check.randn(n, dtype, gen=gen),),
        name="exp_cos",
        launches=1,
        hint="Compute in fp32 (x.to(tl.float32)) and store in the output's dtype.",
    )


def check_predict_eager_ms(predict) -> check.Passed:
    """Exercise 3: ``predict(n, dtype_bytes, copy_GBps)`` predicts eager ``x.cos().cos()`` in ms."""
    for n, b, bw in ((2**28, 4, 4000.0), (10**6, 2, 900.0), (12345, 4, 3350.0)):
        want = Ledger.chain(["cos", "cos"], n, b).predict_ms(bw, fused=False)
        got = predict(n, b, bw)
        if not isinstance(got, (int, float)) or not math.isfinite(got):
            raise CheckFailed(f"predict({n}, {b}, {bw}) returned {got!r}; expected a number of milliseconds.")
        if abs(got - want) > 0.01 * want:
            ratio = got / want
            tip = ""
            if abs(ratio - 0.5) < 0.01:
                tip = " That is one pass: eager runs two kernels, each reading and writing the whole tensor."
            elif abs(ratio - 1000) < 10 or abs(ratio - 0.001) < 1e-5:
                tip = " Check the units: GB/s is 1e9 bytes per second, and the answer is in milliseconds."
            raise CheckFailed(f"predict({n}, {b}, {bw}) = {got:.6g} ms, expected {want:.6g} ms.{tip}")
    msg = "✓ prediction: 4 passes of n elements (two kernels, each one read and one write) over the copy bandwidth"
    return check.passed(msg)


def check_add_intensity(intensity: float) -> check.Passed:
    """Exercise 4: the arithmetic intensity of ``z = x + y`` on same-shape fp32 tensors."""
    want = 1 / 12
    if not isinstance(intensity, (int, float)) or abs(intensity - want) > 0.01 * want:
        tip = ""
        if isinstance(intensity, (int, float)) and abs(intensity - 1 / 8) < 1e-3:
            tip = " Did you forget the write of z?"
        elif isinstance(intensity, (int, float)) and abs(intensity - 1 / 3) < 1e-3:
            tip = " Count bytes, not elements: fp32 has 4 bytes per element."
        raise CheckFailed(f"intensity {intensity!r} FLOP/byte is not right.{tip}")
    msg = "✓ intensity: 1 FLOP per 12 bytes — far below any GPU's balance point, so memory-bound"
    return check.passed(msg)
