"""Lesson 6 on a GPU: the tiled matmul, its fused epilogue and the RMSNorm prologue, in bf16, the
weight in ``F.linear``'s (N, K) layout.

Three parts:

- **The layer** ``y = GELU(x W^T + b)`` at two shapes, 4096³ and 8192 × 4096 → 16384 (M × K → N), each
  timed as: cuBLAS's matmul alone (``x @ w.t()``), our Triton ``matmul`` alone, the three eager ops
  (matmul, + bias, GELU), the matmul followed by lesson 2's fused bias + GELU kernel, ``F.linear``
  (bias in cuBLAS's epilogue) then GELU, cuBLASLt's own GELU epilogue
  (``torch._addmm_activation(b, x, w.t(), use_gelu=True)``), ``torch.compile`` (default mode) of the
  eager layer, and our fused ``linear(x, w, b, "gelu")``.
- **The epilogue's cost** at the same shapes: our kernel with the epilogue grown step by step, ``x W^T``
  alone (``linear(x, w)``) and ``+ b`` (``linear(x, w, b)``); ``+ b, GELU`` is the layer's ``ours fused``.
  Same FLOPs and nearly the same bytes, so what separates them is the epilogue's arithmetic.
- **The RMSNorm prologue** ``RMSNorm(x) W^T`` (no bias) at the same shapes: our
  ``rmsnorm_linear`` (rstd pre-pass, gamma folded into W, row scale in the epilogue) against
  ``torch.compile``'d RMSNorm then cuBLAS, and lesson 4's RMSNorm kernel then cuBLAS.
- **An M sweep** at K = 4096, N = 16384, M = 16 … 4096 (decode to prefill sizes): cuBLAS's matmul
  alone, our fused layer, ``F.linear`` + GELU and cuBLASLt's GELU epilogue. M = 8192 is the second
  layer shape above.

Every case carries ``flops`` = 2 M N K (the matmul's, the work every schedule shares) and ``nbytes`` =
the layer's minimum traffic (each input read once, y written once), so % of copy and TFLOP/s compare
schedules of the same work. ``predicted_ms`` (with the measured ceilings) is the roofline time of
:func:`predict_ms`: the matmul at max(FLOPs / matmul rate, its bytes / copy bandwidth), plus each
memory pass that runs after it at the copy bandwidth.

``torch.compile(mode="max-autotune")`` is left out by default: its compile took 12.5-15 s per shape on
our H100 (``benchmarks/notes_lesson6.md``), more than the rest of the suite's GPU time. ``cases(...,
max_autotune=True)`` adds it. 46 cases; about 3 GB of GPU memory. GPU time, estimated (not yet measured
as a whole): 60-90 s for ``python -m fusionlab.record --suites lesson6`` (three rounds), most of it compiling
(Inductor twice per shape, the TMA kernel's autotuner for three epilogues).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...bench import Case, compiled
from ...kernels.bias_gelu import bias_gelu
from ...kernels.linear import linear, linear_ledger
from ...kernels.matmul import matmul
from ...kernels.rmsnorm import rmsnorm
from ...kernels.rmsnorm_linear import fold_rmsnorm_weight, rmsnorm_linear, rmsnorm_linear_ledger
from ...ledger import Ledger

DTYPE = torch.bfloat16
EPS = 1e-6
#: tag -> (M, K, N): tokens, input width, output width
SHAPES = {"4096³": (4096, 4096, 4096), "8k×4k→16k": (8192, 4096, 16384)}
#: the M sweep at K = SWEEP_K, N = SWEEP_N; M = 8192 is SHAPES["8k×4k→16k"]
SWEEP_MS = (16, 64, 256, 1024, 4096)
SWEEP_K, SWEEP_N = 4096, 16384
SWEEP_BIG = "8k×4k→16k"

#: case labels (after the shape tag) of the layer, in the order they are timed
LAYER = {
    "cublas": "cuBLAS matmul",
    "matmul": "our matmul",
    "eager": "eager 3 ops",
    "bias_gelu": "matmul + bias_gelu",
    "linear": "F.linear + gelu",
    "cublaslt": "cuBLASLt epilogue",
    "compiled": "compiled",
    "max_autotune": "max-autotune",
    "fused": "ours fused",
}
#: case labels of the epilogue steps (group "epilogue <tag>"); the full epilogue is LAYER["fused"]
EPILOGUE = {"none": "ours x Wᵀ", "bias": "ours + bias"}
#: case labels of the RMSNorm prologue
RMSNORM = {"prologue": "rmsnorm: ours", "compiled": "rmsnorm: compiled+cuBLAS", "lesson4": "rmsnorm: L4 + cuBLAS"}
#: case labels of the M sweep (after "M=<m> ")
SWEEP = {"cublas": "cuBLAS matmul", "fused": "ours fused", "linear": "F.linear + gelu", "cublaslt": "cuBLASLt"}
#: the schedule of :func:`predict_ms` each layer case runs
SCHEDULE = {
    "cublas": "matmul",
    "matmul": "matmul",
    "eager": "eager",
    "bias_gelu": "matmul + 1 pass",
    "linear": "linear + gelu",
    "cublaslt": "fused",
    "compiled": "matmul + 1 pass",  # Inductor: cuBLAS mm, then one fused add + GELU kernel (lesson 3)
    "max_autotune": "fused",
    "fused": "fused",
}


def layer_name(tag: str, key: str) -> str:
    return f"{tag} {LAYER[key]}"


def epilogue_name(tag: str, key: str) -> str:
    """The case of one epilogue step; ``"gelu"`` (bias and GELU) is the layer's fused case."""
    return layer_name(tag, "fused") if key == "gelu" else f"{tag} {EPILOGUE[key]}"


def rmsnorm_name(tag: str, key: str) -> str:
    return f"{tag} {RMSNORM[key]}"


def sweep_name(m: int, key: str) -> str:
    """The sweep's case name at M = m; M = 8192 is the big layer shape's case of the same schedule."""
    if m == SHAPES[SWEEP_BIG][0]:
        return layer_name(SWEEP_BIG, key)
    return f"M={m} {SWEEP[key]}"


def sweep_ms(results, key: str) -> tuple[list[int], list[float]]:
    """``(Ms, ms)`` of one sweep schedule from a run's results, M = 8192 included."""
    by_name = {r.name: r.ms for r in results}
    ms = [*SWEEP_MS, SHAPES[SWEEP_BIG][0]]
    return ms, [by_name[sweep_name(m, key)] for m in ms]


def _matmul_roofline_ms(flops: float, nbytes: float, copy_GBps: float, matmul_TFLOPs: float) -> float:
    return max(flops / (matmul_TFLOPs * 1e12), nbytes / (copy_GBps * 1e9)) * 1e3


def predict_ms(schedule: str, M: int, K: int, N: int, copy_GBps: float, matmul_TFLOPs: float, dtype=DTYPE) -> float:
    """The roofline time of one schedule of ``y = GELU(x W^T + b)`` (or of the RMSNorm prologue).

    The matmul's kernel takes max(2MNK / ``matmul_TFLOPs``, its bytes / ``copy_GBps``); every kernel
    after it is a memory pass at ``copy_GBps``. Bytes come from the ledgers
    (:func:`fusionlab.kernels.linear.linear_ledger`, :func:`~fusionlab.kernels.rmsnorm_linear.rmsnorm_linear_ledger`):

    - ``"matmul"``: the matmul alone (read x, w; write h);
    - ``"eager"``: the matmul, then the bias add and the GELU, one pass each;
    - ``"matmul + 1 pass"``: the matmul, then one fused bias + GELU pass (lesson 2's kernel, Inductor);
    - ``"linear + gelu"``: the bias inside the matmul's epilogue (``F.linear``), then a GELU pass;
    - ``"fused"``: one kernel (read x, w, b; write y);
    - ``"rmsnorm prologue"``: the rstd pre-pass, then the matmul on x, W' and rstd;
    - ``"rmsnorm + matmul"``: a norm pass that writes xn, then the matmul on xn.
    """
    flops = 2 * M * N * K
    if schedule.startswith("rmsnorm"):
        led = rmsnorm_linear_ledger(M, K, N, dtype)
        led_steps = ("rstd pre-pass", "matmul + epilogue")
        if schedule == "rmsnorm prologue":
            pre, mm = (sum(t.nbytes for t in led.trips(fused=True) if t.op == s) for s in led_steps)
        elif schedule == "rmsnorm + matmul":
            pre, mm = (sum(t.nbytes for t in led.trips(fused=False) if t.op == op) for op in ("rmsnorm", "matmul"))
        else:
            raise ValueError(f"unknown schedule {schedule!r}")
        return pre / (copy_GBps * 1e9) * 1e3 + _matmul_roofline_ms(flops, mm, copy_GBps, matmul_TFLOPs)
    led = linear_ledger(M, K, N, dtype, bias=True, activation="gelu")
    by_op = {op: sum(t.nbytes for t in led.trips(fused=False) if t.op == op) for op in ("matmul", "add", "gelu")}
    one_pass = bias_pass_ledger(M, N, dtype).fused_bytes  # read h and b, write y
    bias_bytes = N * led.dtype_bytes
    after = {
        "matmul": (by_op["matmul"], 0),
        "eager": (by_op["matmul"], by_op["add"] + by_op["gelu"]),
        "matmul + 1 pass": (by_op["matmul"], one_pass),
        "linear + gelu": (by_op["matmul"] + bias_bytes, by_op["gelu"]),
        "fused": (led.fused_bytes, 0),
    }
    if schedule not in after:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(after)} or an rmsnorm one")
    mm, rest = after[schedule]
    return _matmul_roofline_ms(flops, mm, copy_GBps, matmul_TFLOPs) + rest / (copy_GBps * 1e9) * 1e3


def bias_pass_ledger(M: int, N: int, dtype=DTYPE) -> Ledger:
    """One fused bias + GELU pass over the matmul's output h (M x N): read h and b, write y."""
    return Ledger(dtype_bytes=dtype).op("bias_gelu", reads={"h": M * N, "b": N}, writes={"y": M * N})


def _inputs(M: int, K: int, N: int, device, seed: int):
    g = torch.Generator(device=device).manual_seed(seed)
    # scaled so that x @ w.t() is O(1), as in a real layer: GELU sees both of its regimes
    x = torch.randn(M, K, device=device, dtype=DTYPE, generator=g)
    w = torch.randn(N, K, device=device, dtype=DTYPE, generator=g) / K**0.5
    b = torch.randn(N, device=device, dtype=DTYPE, generator=g)
    return x, w, b


def _layer_eager(x, w, b):
    return F.gelu(x @ w.t() + b)


def _rmsnorm_eager(x, gamma):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * gamma.float()).to(x.dtype)


def _warm(fns) -> None:
    for fn in fns:
        fn()  # compile (Triton, Inductor) and autotune before anything is timed


def _layer_cases(tag, M, K, N, device, copy_GBps, matmul_TFLOPs, max_autotune) -> list[Case]:
    x, w, b = _inputs(M, K, N, device, seed=0)
    wt = w.t()
    comp = compiled(_layer_eager, x, w, b)
    thunks = {
        "cublas": lambda: x @ wt,
        "matmul": lambda: matmul(x, wt),
        "eager": lambda: _layer_eager(x, w, b),
        "bias_gelu": lambda: bias_gelu(x @ wt, b, "erf_fast"),
        "linear": lambda: F.gelu(F.linear(x, w, b)),
        "cublaslt": lambda: torch._addmm_activation(b, x, wt, use_gelu=True),
        "compiled": lambda: comp(x, w, b),
        "fused": lambda: linear(x, w, b, "gelu"),
    }
    if max_autotune:
        comp_max = torch.compile(_layer_eager, dynamic=False, mode="max-autotune")
        comp_max(x, w, b)
        thunks["max_autotune"] = lambda: comp_max(x, w, b)
    _warm(thunks.values())
    flops = 2 * M * N * K
    nbytes = linear_ledger(M, K, N, DTYPE).fused_bytes
    out = []
    for key in LAYER:
        if key not in thunks:
            continue
        pred = predict_ms(SCHEDULE[key], M, K, N, copy_GBps, matmul_TFLOPs) if copy_GBps and matmul_TFLOPs else None
        out.append(Case(layer_name(tag, key), thunks[key], nbytes, flops, group=tag, predicted_ms=pred))
    return out


def _epilogue_cases(tag, M, K, N, device, copy_GBps, matmul_TFLOPs) -> list[Case]:
    x, w, b = _inputs(M, K, N, device, seed=0)  # the layer's inputs
    thunks = {"none": lambda: linear(x, w), "bias": lambda: linear(x, w, b)}
    _warm(thunks.values())
    flops = 2 * M * N * K
    nbytes = linear_ledger(M, K, N, DTYPE).fused_bytes
    pred = predict_ms("fused", M, K, N, copy_GBps, matmul_TFLOPs) if copy_GBps and matmul_TFLOPs else None
    return [Case(epilogue_name(tag, k), fn, nbytes, flops, group=f"epilogue {tag}", predicted_ms=pred)
            for k, fn in thunks.items()]  # fmt: skip


def _rmsnorm_cases(tag, M, K, N, device, copy_GBps, matmul_TFLOPs) -> list[Case]:
    x, w, _ = _inputs(M, K, N, device, seed=1)
    g = torch.Generator(device=device).manual_seed(2)
    gamma = (torch.rand(K, device=device, generator=g) + 0.5).to(DTYPE)
    wf = fold_rmsnorm_weight(w, gamma)  # done once, when a model loads its weights
    wt = w.t()
    norm = compiled(_rmsnorm_eager, x, gamma)
    thunks = {
        "prologue": lambda: rmsnorm_linear(x, gamma, w, EPS, folded_weight=wf),
        "compiled": lambda: norm(x, gamma) @ wt,
        "lesson4": lambda: rmsnorm(x, gamma, EPS) @ wt,
    }
    _warm(thunks.values())
    schedules = {"prologue": "rmsnorm prologue", "compiled": "rmsnorm + matmul", "lesson4": "rmsnorm + matmul"}
    flops = 2 * M * N * K
    nbytes = rmsnorm_linear_ledger(M, K, N, DTYPE).fused_bytes
    out = []
    for key, fn in thunks.items():
        pred = predict_ms(schedules[key], M, K, N, copy_GBps, matmul_TFLOPs) if copy_GBps and matmul_TFLOPs else None
        out.append(Case(rmsnorm_name(tag, key), fn, nbytes, flops, group=f"rmsnorm {tag}", predicted_ms=pred))
    return out


def _sweep_cases(device, copy_GBps, matmul_TFLOPs) -> list[Case]:
    K, N = SWEEP_K, SWEEP_N
    _, w, b = _inputs(max(SWEEP_MS), K, N, device, seed=3)
    wt = w.t()
    schedules = {"cublas": "matmul", "fused": "fused", "linear": "linear + gelu", "cublaslt": "fused"}
    out = []
    for M in SWEEP_MS:
        g = torch.Generator(device=device).manual_seed(4 + M)
        x = torch.randn(M, K, device=device, dtype=DTYPE, generator=g)
        thunks = {
            "cublas": lambda x=x: x @ wt,
            "fused": lambda x=x: linear(x, w, b, "gelu"),
            "linear": lambda x=x: F.gelu(F.linear(x, w, b)),
            "cublaslt": lambda x=x: torch._addmm_activation(b, x, wt, use_gelu=True),
        }
        _warm(thunks.values())
        flops = 2 * M * N * K
        nbytes = linear_ledger(M, K, N, DTYPE).fused_bytes
        for key, fn in thunks.items():
            pred = (
                predict_ms(schedules[key], M, K, N, copy_GBps, matmul_TFLOPs) if copy_GBps and matmul_TFLOPs else None
            )
            out.append(Case(sweep_name(M, key), fn, nbytes, flops, group="M sweep", predicted_ms=pred))
    return out


def cases(
    copy_GBps: float | None = None, matmul_TFLOPs: float | None = None, device="cuda", max_autotune: bool = False
) -> list[Case]:
    """All lesson 6 cases. With the measured ceilings (``fusionlab.bench.ceilings()``) each case also
    carries ``predicted_ms`` (:func:`predict_ms`). ``max_autotune``: also time
    ``torch.compile(mode="max-autotune")`` of the layer (compiles for 10-15 s per shape)."""
    out = []
    for tag, (M, K, N) in SHAPES.items():
        out += _layer_cases(tag, M, K, N, device, copy_GBps, matmul_TFLOPs, max_autotune)
    for tag, (M, K, N) in SHAPES.items():
        out += _epilogue_cases(tag, M, K, N, device, copy_GBps, matmul_TFLOPs)
    for tag, (M, K, N) in SHAPES.items():
        out += _rmsnorm_cases(tag, M, K, N, device, copy_GBps, matmul_TFLOPs)
    out += _sweep_cases(device, copy_GBps, matmul_TFLOPs)
    return out


def bars(results) -> list[tuple[str, bool, str]]:
    """The issue's speed bars for this suite, read off a run: ``(bar, met, detail)``."""
    r = {x.name: x.ms for x in results}
    out = []
    for tag in SHAPES:
        cub, fused = r[layer_name(tag, "cublas")], r[layer_name(tag, "fused")]
        ours = r[layer_name(tag, "matmul")]
        out.append((f"{tag}: our matmul >= 0.95x cuBLAS", cub / ours >= 0.95, f"{cub / ours:.3f}x"))
        out.append((f"{tag}: fused layer <= 1.05x cuBLAS matmul alone", fused / cub <= 1.05, f"{fused / cub:.3f}x"))
        for key in ("linear", "cublaslt", "compiled", "max_autotune"):
            name = layer_name(tag, key)
            if name in r:
                out.append((f"{tag}: fused faster than {LAYER[key]}", fused < r[name], f"{r[name] / fused:.3f}x"))
        pro = r[rmsnorm_name(tag, "prologue")]
        for key in ("lesson4", "compiled"):  # the issue's bar is lesson 4's kernel; compiled is the stronger
            other = r[rmsnorm_name(tag, key)]
            out.append((f"{tag}: RMSNorm prologue faster than {RMSNORM[key][9:]}", pro < other, f"{other / pro:.3f}x"))
    return out
