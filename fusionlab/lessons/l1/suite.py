"""Lesson 1 on a GPU: one cos, eager cos().cos(), compiled, and the fused Triton kernel.

``nbytes`` is the *minimum* traffic of the op (read x once, write y once), so "% of copy" reads
as effective bandwidth: eager ``cos().cos()`` moves twice that and shows about half.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...bench import Case
from ...kernels.cos import cos, cos_cos, cos_cos_eager, cos_cos_ledger

N_FULL = 2**28  # 1 GiB of fp32: far past any L2


def cases(n: int = N_FULL, device="cuda", copy_GBps: float | None = None) -> list[Case]:
    x = torch.randn(n, device=device)
    y = torch.empty_like(x)
    led = cos_cos_ledger(n, torch.float32)
    one_pass = led.fused_bytes  # 2N * 4 bytes

    def predict(fused: bool) -> float | None:  # the ledger's time at the measured copy bandwidth
        return led.predict_ms(copy_GBps, fused=fused) if copy_GBps else None

    cc_compiled = torch.compile(cos_cos_eager, dynamic=False)
    out = [
        Case("copy", lambda: y.copy_(x), one_pass, group="ceiling"),
        Case("eager cos", lambda: torch.cos(x, out=y), one_pass, group="cos", predicted_ms=predict(True)),
        Case("eager cos().cos()", lambda: cos_cos_eager(x), one_pass, group="cos", predicted_ms=predict(False)),
        Case("compiled cos(cos(x))", lambda: cc_compiled(x), one_pass, group="cos", predicted_ms=predict(True)),
        Case("triton cos", lambda: cos(x), one_pass, group="cos", predicted_ms=predict(True)),
        Case(
            "triton cos_cos, two tl.cos",
            lambda: cos_cos(x, second="precise"),
            one_pass,
            group="cos",
            predicted_ms=predict(True),
        ),
        Case("triton cos_cos (fused)", lambda: cos_cos(x), one_pass, group="cos", predicted_ms=predict(True)),
        Case("eager relu fp32", lambda: torch.relu(x), one_pass, group="activation"),
        Case("eager gelu fp32", lambda: F.gelu(x), one_pass, group="activation"),
    ]
    xh = torch.randn(n, device=device, dtype=torch.bfloat16)
    half = one_pass // 2
    out += [
        Case("eager relu bf16", lambda: torch.relu(xh), half, group="activation"),
        Case("eager gelu bf16 (erf)", lambda: F.gelu(xh), half, group="activation"),
        Case("eager gelu bf16 (tanh)", lambda: F.gelu(xh, approximate="tanh"), half, group="activation"),
    ]
    return out


def bars(results) -> list[tuple[str, bool, str]]:
    """The issue's speed bars for this suite, read off a run: ``(bar, met, detail)``."""
    r = {x.name: x for x in results}
    fused, one = r["triton cos_cos (fused)"], r["eager cos"]
    eager = r["eager cos().cos()"].ms / one.ms
    return [
        ("fused cos_cos >= 90% of copy", fused.frac_copy >= 0.90, f"{fused.frac_copy:.1%}"),
        ("fused cos_cos <= 1.1x one eager cos", fused.ms <= 1.1 * one.ms, f"{fused.ms / one.ms:.3f}x"),
        ("eager cos().cos() costs two passes", 1.8 <= eager <= 2.2, f"{eager:.2f}x"),
    ]
