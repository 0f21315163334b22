"""Lesson 3 on a GPU: linear -> bias -> GELU in bf16, 8192 x 4096 -> 16384 (COURSE.md's layer).

Two views of the same work. The *layer*: the matmul alone, the three eager ops, ``F.linear`` (bias
folded into the matmul) then GELU, and the whole layer compiled. The *small ops alone*: bias + GELU on
the matmul's output, eager against compiled. For the small ops the ledger predicts 2x from fusion
(four passes over the 8192 x 16384 output become two); but the matmul takes most of the layer's
time, so the layer as a whole gains far less. Matmul cases carry
``flops`` = 2 M N K, all cases the minimal bytes (every input read once, the output written once).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...bench import Case, compiled
from ...kernels.bias_gelu import bias_gelu_eager, bias_gelu_ledger
from ...ledger import Ledger

M, K, N = 8192, 4096, 16384  # tokens, input width, output width
DTYPE = torch.bfloat16


def layer_eager(x, w, b):
    """Three eager ops, three kernels: matmul, bias add, GELU."""
    return F.gelu(x @ w.t() + b)


def layer_linear(x, w, b):
    """``F.linear`` adds the bias inside the matmul (cuBLAS epilogue), then GELU: two kernels."""
    return F.gelu(F.linear(x, w, b))


def layer_ledger(m: int = M, k: int = K, n: int = N, dtype=DTYPE) -> Ledger:
    """The whole layer, op by op; fused_bytes is the layer's minimum (x, w, b read, y written once)."""
    led = Ledger(dtype_bytes=dtype)
    led.op("matmul", reads={"x": m * k, "w": n * k}, writes={"h": m * n})
    led.op("add", reads={"h": m * n, "b": n}, writes={"t": m * n})
    led.op("gelu", reads={"t": m * n}, writes={"y": m * n})
    return led


def cases(copy_GBps: float | None = None, matmul_TFLOPs: float | None = None, device="cuda") -> list[Case]:
    """All lesson 3 cases. With the measured ceilings (``fusionlab.bench.ceilings()``) each case also
    carries ``predicted_ms``: bytes / ``copy_GBps`` for the small ops; for the layer, the matmul's
    roofline time max(flops / ``matmul_TFLOPs``, bytes / ``copy_GBps``) plus what follows it."""
    g = torch.Generator(device=device).manual_seed(0)
    # scaled so that x @ w.t() is O(1), as in a real layer: GELU then sees both of its regimes
    x = torch.randn(M, K, device=device, dtype=DTYPE, generator=g)
    w = torch.randn(N, K, device=device, dtype=DTYPE, generator=g) / K**0.5
    b = torch.randn(N, device=device, dtype=DTYPE, generator=g)
    h = x @ w.t()
    flops = 2 * M * N * K
    layer = layer_ledger()
    small = bias_gelu_ledger(M, N, DTYPE, x="h", bias="b")
    mm_bytes = (M * K + N * K + M * N) * layer.dtype_bytes  # read x and w, write h
    gelu_pass = Ledger.chain(["gelu"], M * N, DTYPE)  # what F.linear leaves after the matmul

    def after_ms(schedule: str) -> float:
        """Predicted time of what runs after the matmul, at the copy ceiling."""
        if schedule == "eager":  # add then gelu, one kernel each
            return small.predict_ms(copy_GBps, fused=False)
        if schedule == "fused":  # compiled: one kernel reads h and b, writes y
            return small.predict_ms(copy_GBps, fused=True)
        if schedule == "linear":  # bias inside the matmul; GELU reads h, writes y
            return gelu_pass.predict_ms(copy_GBps, fused=True)
        return 0.0

    def predict(schedule: str) -> float | None:
        if not (copy_GBps and matmul_TFLOPs):
            return None
        mm_ms = max(flops / (matmul_TFLOPs * 1e12), mm_bytes / (copy_GBps * 1e9)) * 1e3  # the roofline
        return mm_ms + after_ms(schedule)

    compiled_layer = compiled(layer_eager, x, w, b)
    compiled_small = compiled(bias_gelu_eager, h, b)
    small_bytes = small.fused_bytes
    one_pass = gelu_pass.fused_bytes  # read one M x N tensor, write one
    return [
        Case("layer matmul alone", lambda: x @ w.t(), mm_bytes, flops, group="layer", predicted_ms=predict("matmul")),
        Case(
            "layer eager (3 ops)",
            lambda: layer_eager(x, w, b),
            layer.fused_bytes,
            flops,
            group="layer",
            predicted_ms=predict("eager"),
        ),
        Case(
            "layer F.linear + gelu",
            lambda: layer_linear(x, w, b),
            layer.fused_bytes,
            flops,
            group="layer",
            predicted_ms=predict("linear"),
        ),
        Case(
            "layer compiled",
            lambda: compiled_layer(x, w, b),
            layer.fused_bytes,
            flops,
            group="layer",
            predicted_ms=predict("fused"),
        ),
        Case(
            "small ops eager",
            lambda: bias_gelu_eager(h, b),
            small_bytes,
            group="small ops",
            predicted_ms=small.predict_ms(copy_GBps, fused=False) if copy_GBps else None,
        ),
        Case(
            "small ops compiled",
            lambda: compiled_small(h, b),
            small_bytes,
            group="small ops",
            predicted_ms=small.predict_ms(copy_GBps, fused=True) if copy_GBps else None,
        ),
        # the two eager kernels one at a time, to see which one runs below the copy ceiling
        Case(
            "small ops: eager add alone",
            lambda: h + b,
            one_pass,
            group="small ops",
            predicted_ms=gelu_pass.predict_ms(copy_GBps, fused=True) if copy_GBps else None,
        ),
        Case(
            "small ops: eager gelu alone",
            lambda: F.gelu(h),
            one_pass,
            group="small ops",
            predicted_ms=gelu_pass.predict_ms(copy_GBps, fused=True) if copy_GBps else None,
        ),
    ]
