"""Lesson 2 on a GPU: bias + GELU (eager, compiled, the fused Triton kernel), the k-op chain, and a
sweep of k fused multiply-adds per element (where arithmetic stops being free).

Every input is 1 GiB, far past any L2. ``nbytes`` is the *minimal* traffic of the op (read x and the
bias once, write y once: the fused ledger), so "% of copy" reads as effective bandwidth: eager, which
moves about twice that, shows about half. With ``copy_GBps`` (the measured copy ceiling) each case
also carries ``predicted_ms``: the bytes that *its* schedule moves (eager: the unfused ledger; fused
or compiled: the fused one) divided by the ceiling — the number to compare the measurement with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...bench import Case, compiled
from ...kernels.bias_gelu import bias_gelu, bias_gelu_config, bias_gelu_eager, bias_gelu_ledger
from ...kernels.chain import MAX_K, chain, chain_ledger, chain_reference
from ...kernels.fma_chain import fma_chain, fma_chain_flops, fma_chain_ledger
from ...ledger import Ledger

#: 1 GiB of input per dtype: 16384 x 16384 fp32, 32768 x 16384 bf16
SHAPES = {torch.float32: (16384, 16384), torch.bfloat16: (32768, 16384)}
CHAIN_N = 2**28  # 1 GiB of fp32
APPROXIMATIONS = ("none", "tanh", "erf_fast")
#: how the case names spell each approximation of the Triton kernel
APPROX_LABEL = {"none": "erf", "tanh": "tanh", "erf_fast": "erf_fast"}
#: FMAs per element of the sweep: around the budgets (tens of instructions an element) and past them
FMA_KS = (4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
#: 1 GiB of input per dtype, as the other cases
FMA_N = {torch.float32: 2**28, torch.bfloat16: 2**29}


def _dname(dtype: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def _predict(led: Ledger, copy_GBps: float | None, fused: bool) -> float | None:
    return led.predict_ms(copy_GBps, fused=fused) if copy_GBps else None


def part_name(d: str, part: str) -> str:
    """The case name of one of eager's kernels timed alone: ``part_name("fp32", "x + bias")``."""
    return f"bias_gelu {d} eager part: {part}"


def bias_gelu_cases(dtype: torch.dtype, copy_GBps: float | None = None, device="cuda") -> list[Case]:
    m, n = SHAPES[dtype]
    d = _dname(dtype)
    group = f"bias_gelu {d}"
    x = torch.randn(m, n, device=device, dtype=dtype)
    bias = torch.randn(n, device=device, dtype=dtype)
    y = torch.empty_like(x)
    led = bias_gelu_ledger(m, n, dtype)
    nbytes = led.fused_bytes
    copy_led = Ledger.chain(["copy"], m * n, dtype)
    pass_led = Ledger.chain(["one pass"], m * n, dtype)  # read m x n, write m x n (the bias's n: negligible)
    exact = compiled(bias_gelu_eager, x, bias)
    tanh = compiled(bias_gelu_eager, x, bias, "tanh")
    fused = _predict(led, copy_GBps, fused=True)
    out = [
        Case(
            f"copy {d}",
            lambda: y.copy_(x),
            copy_led.fused_bytes,
            group="ceiling",
            predicted_ms=_predict(copy_led, copy_GBps, fused=True),
        ),
        Case(
            f"bias_gelu {d} eager",
            lambda: bias_gelu_eager(x, bias),
            nbytes,
            group=group,
            predicted_ms=_predict(led, copy_GBps, fused=False),
        ),
        Case(
            f"bias_gelu {d} eager tanh",
            lambda: bias_gelu_eager(x, bias, "tanh"),
            nbytes,
            group=group,
            predicted_ms=_predict(led, copy_GBps, fused=False),
        ),
        # eager's two kernels one at a time (and a scalar add beside the broadcast one): which of them
        # runs below the copy ceiling, the evidence for a measured speedup above the ledger's 2x
        *(
            Case(
                part_name(d, part),
                fn,
                pass_led.fused_bytes,
                group=f"{group} eager parts",
                predicted_ms=_predict(pass_led, copy_GBps, fused=True),
            )
            for part, fn in (
                ("x + bias", lambda: x + bias),
                ("x + 0.5", lambda: x + 0.5),
                ("gelu(x)", lambda: F.gelu(x)),
            )
        ),
        Case(f"bias_gelu {d} compiled", lambda: exact(x, bias), nbytes, group=group, predicted_ms=fused),
        Case(f"bias_gelu {d} compiled tanh", lambda: tanh(x, bias, "tanh"), nbytes, group=group, predicted_ms=fused),
    ]
    for approximate in APPROXIMATIONS:
        bias_gelu(x, bias, approximate)  # compile the Triton kernel before timing
        out.append(
            Case(
                f"bias_gelu {d} triton {APPROX_LABEL[approximate]}",
                lambda a=approximate: bias_gelu(x, bias, a),
                nbytes,
                group=group,
                predicted_ms=fused,
            )
        )
    return out


def chain_cases(copy_GBps: float | None = None, n: int = CHAIN_N, device="cuda") -> list[Case]:
    """For k = 1..8: the eager chain (k kernels, 2kN elements) and the fused kernel (one, 2N)."""
    x = torch.randn(n, device=device)
    out = []
    for k in range(1, MAX_K + 1):
        led = chain_ledger(k, n, torch.float32)
        chain(x, k)  # compile this K's kernel before timing
        out += [
            Case(
                f"chain k={k} eager",
                lambda k=k: chain_reference(x, k),
                led.fused_bytes,
                group="chain eager",
                predicted_ms=_predict(led, copy_GBps, fused=False),
            ),
            Case(
                f"chain k={k} fused",
                lambda k=k: chain(x, k),
                led.fused_bytes,
                group="chain fused",
                predicted_ms=_predict(led, copy_GBps, fused=True),
            ),
        ]
    return out


def fma_name(dtype: torch.dtype, k: int) -> str:
    return f"fma {_dname(dtype)} k={k}"


def fma_predict_ms(n: int, k: int, dtype, copy_GBps: float, vector_TFLOPs: float) -> float:
    """The roofline's time for k FMAs on each of n elements: the bytes at the copy bandwidth or the FMAs
    at the vector units' rate (one FMA an instruction, 2 FLOPs), whichever is longer."""
    memory = fma_chain_ledger(n, dtype).predict_ms(copy_GBps, fused=True)
    return max(memory, fma_chain_flops(n, k) / (vector_TFLOPs * 1e12) * 1e3)


def fma_cases(copy_GBps: float | None = None, vector_TFLOPs: float | None = None, device="cuda") -> list[Case]:
    """k FMAs per element for k in :data:`FMA_KS`, fp32 and bf16, 1 GiB each: one read and one write
    whatever k is, so the time stays at the copy's until the arithmetic takes longer than the bytes."""
    out = []
    for dtype, n in FMA_N.items():
        x = torch.randn(n, device=device, dtype=dtype)
        nbytes = fma_chain_ledger(n, dtype).fused_bytes
        for k in FMA_KS:
            pred = fma_predict_ms(n, k, dtype, copy_GBps, vector_TFLOPs) if copy_GBps and vector_TFLOPs else None
            out.append(
                Case(
                    fma_name(dtype, k),
                    lambda x=x, k=k: fma_chain(x, k),
                    nbytes,
                    flops=fma_chain_flops(n, k),
                    group=f"fma {_dname(dtype)}",
                    predicted_ms=pred,
                )
            )
    return out


def cases(copy_GBps: float | None = None, vector_TFLOPs: float | None = None, device="cuda") -> list[Case]:
    """All lesson 2 cases. ``copy_GBps`` and ``vector_TFLOPs``: the measured ceilings
    (``fusionlab.bench.ceilings()``); when given, every case carries ``predicted_ms``."""
    out = []
    for dtype in (torch.float32, torch.bfloat16):
        out += bias_gelu_cases(dtype, copy_GBps, device)
    out += chain_cases(copy_GBps, device=device)
    out += fma_cases(copy_GBps, vector_TFLOPs, device)
    return out


def tuning_cases(
    dtype: torch.dtype = torch.bfloat16,
    approximate: str = "erf_fast",
    tiles=(
        (1, 1024),
        (2, 1024),
        (4, 1024),
        (8, 1024),
        (16, 1024),
        (8, 512),
        (16, 512),
        (32, 256),
        (4, 2048),
        (2, 4096),
    ),
    warps=(4, 8, 16),
    device="cuda",
) -> list[Case]:
    """A sweep of the bias + GELU kernel's tile (BLOCK_M, BLOCK_N) and num_warps at 1 GiB, to check
    the launcher's default (``bias_gelu_config``) against its neighbours. Not in ``cases()``:
    it is for whoever tunes the defaults, not for the lesson."""
    m, n = SHAPES[dtype]
    x = torch.randn(m, n, device=device, dtype=dtype)
    bias = torch.randn(n, device=device, dtype=dtype)
    nbytes = bias_gelu_ledger(m, n, dtype).fused_bytes
    cfg = bias_gelu_config(m, n, dtype)
    d = _dname(dtype)
    out = []
    for bm, bn in tiles:
        for w in warps:
            kw = {"block_m": bm, "block_n": bn, "num_warps": w}
            bias_gelu(x, bias, approximate, **kw)  # compile before timing
            default = " (default)" if (bm, bn, w) == (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"]) else ""
            out.append(
                Case(
                    f"tune {d} {APPROX_LABEL[approximate]} {bm}x{bn} w{w}{default}",
                    lambda kw=kw: bias_gelu(x, bias, approximate, **kw),
                    nbytes,
                    group=f"tune {d}",
                )
            )
    return out


def bars(results) -> list[tuple[str, bool, str]]:
    """The issue's speed bars for this suite, read off a run: ``(bar, met, detail)``. A ratio within 1%
    of the compiled kernel's is a tie (the run-to-run spread)."""
    r = {x.name: x for x in results}
    out = []
    for d, form, baseline in (
        ("fp32", "erf", "compiled"),
        ("fp32", "tanh", "compiled tanh"),
        ("bf16", "erf_fast", "compiled"),
        ("bf16", "tanh", "compiled tanh"),
    ):
        ours, theirs = r[f"bias_gelu {d} triton {form}"], r[f"bias_gelu {d} {baseline}"]
        out.append((f"bias_gelu {d} {form} >= 90% of copy", ours.frac_copy >= 0.90, f"{ours.frac_copy:.1%}"))
        out.append(
            (f"bias_gelu {d} {form} >= 0.99x {baseline}", theirs.ms / ours.ms >= 0.99, f"{theirs.ms / ours.ms:.3f}x")
        )
    for k in range(1, MAX_K + 1):
        measured = r[f"chain k={k} eager"].ms / r[f"chain k={k} fused"].ms
        out.append((f"chain k={k}: eager/fused within 20% of k", abs(measured / k - 1) <= 0.20, f"{measured:.2f}"))
    return out
