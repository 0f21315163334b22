"""Lesson 8 on a GPU: the FlashAttention backward against PyTorch's, its two schedules, its memory.
All in bf16, heads of 16, 16k x 16 token-heads per timing shape (N = 1k: B = 16; 4k: B = 4; 16k: B = 1).

- **Backward timing** at head dims 64 and 128, N = 1k, 4k, 16k, causal and full. Every schedule is
  timed the same way: one forward outside the timing, then ``torch.autograd.grad(O, (q, k, v), dO)``
  (autograd's host work included for all). ``ours`` is the package's backward with dQ in a pass of its
  own (deterministic, the default), ``atomic`` the same kernels with dQ added by fp32 atomics
  (``deterministic=False``); ``flash`` and ``cudnn`` are ``F.scaled_dot_product_attention`` pinned to
  its FlashAttention-2 backend and its cuDNN backend; ``eager`` is autograd through naive attention
  (:func:`~fusionlab.kernels.attention.attention_eager`), at N = 1k and 4k only. ``flops`` = 2.5x the
  forward's (:func:`~fusionlab.kernels.attention_backward.attention_backward_flops`), the same for every
  schedule, so TFLOP/s compare them; ``nbytes`` = the fewest bytes any backward moves
  (:func:`~fusionlab.kernels.attention_backward.attention_backward_bytes`). ``predicted_ms`` (with the
  measured ceilings): max(FLOPs / matmul rate, bytes / copy bandwidth) for the fused schedules; eager's
  adds its ledger's trips (:func:`~fusionlab.kernels.attention_backward.attention_backward_ledger`) at
  the copy bandwidth to the FLOPs at the matmul rate.
- **Forward + backward** (group ``"fwd+bwd ..."``): ours and flash, one forward and the gradients,
  counted as 3.5x the forward's FLOPs.
- **Determinism** (group :data:`BITS_GROUP`): at :data:`BITS_SHAPE` each schedule's backward is run
  :data:`BITS_RUNS` times on the same inputs. For those cases ``nbytes`` is not traffic but a count:
  ``"bits <impl> <grad>"`` the elements of that gradient whose bits differed from the first run in any
  run, ``"runs <impl>"`` the number of distinct results (dQ, dK, dV together) among the runs.
- **Peak memory** (group :data:`PEAK_GROUP`): B = 1, H = 16, D = 128, causal, forward + backward at
  N = 1k ... 128k, ours and eager. ``nbytes`` is the peak allocated beyond the inputs (O, lse and the three
  gradients included: any forward + backward returns them; :attr:`Peak.workspace_bytes` takes them
  out), measured by ``torch.cuda.max_memory_allocated`` when the case is built; where eager runs out of
  memory the sweep records a case of :data:`OOM_GROUP` and tries no longer N. :func:`peaks_from` reads
  them back.
- **The Hopper road** (group ``"hopper ..."``, sm_90 only): the backward with its Q/dO and K/V loads
  through pointers (``backward_config={"TMA": False}``) and through tensor descriptors (``{"TMA": True}``,
  the default at these shapes since 2026-11-27), and the atomic schedule with dQ added by the copy
  engine's bulk reduce-add (``{"TMA_REDUCE": True}``), head dim 128, N = 4k and 16k.
- **The FP8 ceiling** (group :data:`FP8_GROUP`): 8192-square matmuls in bf16 and in e4m3
  (``torch._scaled_mm``), the most an FP8 attention could gain where the products set the time.
- **The FP8 forward** (group :data:`FP8_ATTN_GROUP`, sm_89 and newer): the package's e4m3 forward on
  quantised inputs against its bf16 forward, head dim 128, N = 4k and 16k, causal and not.

A backend this GPU or build lacks (cuDNN attention before sm_80, TMA before Hopper) is left out
rather than failing the suite.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...bench import Case, peak_bytes
from ...kernels.attention import attention, attention_eager, attention_flops
from ...kernels.attention_backward import attention_backward_bytes, attention_backward_flops, attention_backward_ledger
from ...kernels.attention_fp8 import attention_fp8_config, attention_fp8_quantized, quantize_fp8

# lesson 7's shapes (the backward is timed where the forward was), its SDPA pinned to one backend, its thunk
# that survives running out of memory
from ..l7.suite import DTYPE, HEAD_DIMS, HEADS, NS, TOKEN_HEADS, _guarded, _sdpa, shape_tag

#: eager autograd is timed at these N only (at 16k its backward holds several 8 GiB matrices and takes
#: tens of ms)
EAGER_NS = (1024, 4096)
#: schedule -> case label (after the shape tag)
IMPLS = {
    "ours": "ours",
    "atomic": "ours atomic dQ",
    "flash": "sdpa flash",
    "cudnn": "sdpa cudnn",
    "eager": "eager",
}
#: forward + backward: the schedules timed end to end
FWD_BWD = ("ours", "flash")
#: the determinism probe: (D, N, causal) at 16k x 16 token-heads, and how many runs
BITS_SHAPE, BITS_RUNS = (128, 4096, False), 10
BITS_IMPLS = ("ours", "atomic")
BITS_GROUP = "determinism"
#: the peak-memory sweep: forward + backward, B = 1, H = 16, D = 128, causal
PEAK_D = 128
PEAK_NS = (1024, 4096, 16384, 32768, 131072)
PEAK_VARIANTS = ("eager", "ours")
PEAK_GROUP = "peak memory"
OOM_GROUP = "eager out of memory"
#: the notebook's live run (``cases(live=True)``): the backward timings at these head dims and N only (its
#: tables read N = 16384, and eager at 4096): compiling every schedule at both head dims takes most of a
#: notebook cell's time limit by itself
LIVE_DIMS, LIVE_NS = (128,), (4096, 16384)
#: the Hopper steps: name -> (deterministic, backward_config)
HOPPER = {
    "ours pointer loads": (True, {"TMA": False}),  # the default took TMA loads at these shapes on 2026-11-27
    "ours tma loads": (True, {"TMA": True}),
    "atomic tma reduce": (False, {"TMA_REDUCE": True}),
}
HOPPER_NS = (4096, 16384)


def case_name(d: int, n: int, causal: bool, impl: str) -> str:
    """The case name of one backward timing: ``impl`` is a key of :data:`IMPLS`."""
    return f"{shape_tag(d, n, causal)} bwd {IMPLS[impl]}"


def fwd_bwd_name(d: int, n: int, causal: bool, impl: str) -> str:
    return f"{shape_tag(d, n, causal)} fwd+bwd {IMPLS[impl]}"


def hopper_name(n: int, causal: bool, step: str) -> str:
    return f"{shape_tag(128, n, causal)} hopper {step}"


def bits_name(impl: str, grad: str) -> str:
    return f"bits {IMPLS[impl]} {grad}"


def runs_name(impl: str) -> str:
    return f"runs {IMPLS[impl]}"


def peak_name(variant: str, n: int) -> str:
    return f"peak fwd+bwd {variant} N={n}"


def oom_name(n: int) -> str:
    return f"eager fwd+bwd OOM at N={n}"


@dataclass(frozen=True)
class Peak:
    """One peak-memory measurement of forward + backward (B = 1, H = 16, D = 128, causal): bytes allocated
    at the peak beyond the inputs (q, k, v, dO), the gradients included. ``peak_bytes`` is None where it ran
    out of memory. :attr:`workspace_bytes`: the peak beyond what the op hands back as well."""

    variant: str
    n: int
    peak_bytes: int | None

    @property
    def returned_bytes(self) -> int:
        """What any attention forward + backward hands back, whatever its schedule: O and dQ, dK, dV
        (bf16) and the forward's fp32 log-sum-exp, all alive at the backward's end."""
        return returned_bytes(self.n)

    @property
    def workspace_bytes(self) -> int | None:
        """The extra memory of the schedule itself: the peak beyond the inputs and :attr:`returned_bytes`
        (eager: its N x N matrices; ours: D and the copy of lse the passes read)."""
        return None if self.peak_bytes is None else self.peak_bytes - self.returned_bytes


def returned_bytes(n: int, heads: int = HEADS, d: int = PEAK_D) -> int:
    """O, dQ, dK, dV in bf16 and lse in fp32 for one sequence of ``n`` at ``heads`` heads of ``d``."""
    return 4 * heads * n * d * 2 + heads * n * 4


@dataclass(frozen=True)
class Bits:
    """The determinism probe of one schedule: elements of dQ, dK, dV whose bits changed in any of
    ``runs`` runs, and how many distinct results the runs gave."""

    impl: str
    changed: dict
    distinct: int
    runs: int


def qkv_do(B: int, H: int, n: int, d: int, device="cuda", seed: int = 0):
    gen = torch.Generator(device=device).manual_seed(seed)
    return tuple(torch.randn(B, H, n, d, device=device, dtype=DTYPE, generator=gen) for _ in range(4))


def _forwards() -> dict[str, Callable]:
    """Each schedule's forward, returning O (differentiable through that schedule's backward)."""
    from torch.nn.attention import SDPBackend

    return {
        "ours": lambda q, k, v, c: attention(q, k, v, causal=c)[0],
        "atomic": lambda q, k, v, c: attention(q, k, v, causal=c, deterministic=False)[0],
        "flash": _sdpa(SDPBackend.FLASH_ATTENTION),
        "cudnn": _sdpa(SDPBackend.CUDNN_ATTENTION),
        "eager": attention_eager,
    }


def backward_thunk(forward: Callable, q, k, v, do, causal: bool) -> Callable:
    """One forward now; the thunk runs the backward alone (the graph is kept for the next call)."""
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    o = forward(*leaves, causal)
    return lambda: torch.autograd.grad(o, leaves, do, retain_graph=True)


def fwd_bwd_thunk(forward: Callable, q, k, v, do, causal: bool) -> Callable:
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    return lambda: torch.autograd.grad(forward(*leaves, causal), leaves, do)


def _works(make: Callable) -> Callable | None:
    """Build and run a thunk once (compile, warm up); None where this GPU or build cannot run it."""
    try:
        thunk = make()
        thunk()
        torch.cuda.synchronize()
        return thunk
    except Exception:  # noqa: BLE001  (a missing backend, a tile Triton cannot build here, out of memory)
        torch.cuda.empty_cache()
        return None


def _predicted(impl, B, n, d, causal, copy_GBps, matmul_TFLOPs) -> float | None:
    if not (copy_GBps and matmul_TFLOPs):
        return None
    mm = attention_backward_flops(B, HEADS, n, n, d, causal) / (matmul_TFLOPs * 1e12) * 1e3
    if impl == "eager":
        return mm + attention_backward_ledger(B, HEADS, n, n, d, DTYPE, causal).predict_ms(copy_GBps, fused=False)
    return max(mm, attention_backward_bytes(B, HEADS, n, n, d, DTYPE) / (copy_GBps * 1e9) * 1e3)


def timing_cases(
    copy_GBps=None, matmul_TFLOPs=None, device="cuda", dims=HEAD_DIMS, ns=NS, impls=tuple(IMPLS), fwd_bwd=True
) -> list[Case]:
    """The backward timings (``impls``: keys of :data:`IMPLS`) and, with ``fwd_bwd``, forward + backward of
    :data:`FWD_BWD`, at head dims ``dims`` and sequence lengths ``ns``."""
    out = []
    forwards = {impl: f for impl, f in _forwards().items() if impl in impls or (fwd_bwd and impl in FWD_BWD)}
    for d in dims:
        for n in ns:
            B = TOKEN_HEADS // (n * HEADS)
            q, k, v, do = qkv_do(B, HEADS, n, d, device)
            for causal in (False, True):
                flops = attention_backward_flops(B, HEADS, n, n, d, causal)
                nbytes = attention_backward_bytes(B, HEADS, n, n, d, DTYPE)
                group = shape_tag(d, n, causal)
                for impl, fwd in forwards.items():
                    if impl not in impls or (impl == "eager" and n not in EAGER_NS):
                        continue
                    thunk = _works(functools.partial(backward_thunk, fwd, q, k, v, do, causal))
                    if thunk is None:
                        continue
                    pred = _predicted(impl, B, n, d, causal, copy_GBps, matmul_TFLOPs)
                    out.append(Case(case_name(d, n, causal, impl), thunk, nbytes, flops, group, pred))
                fwd_flops = attention_flops(B, HEADS, n, n, d, causal) * 7 // 2
                for impl in FWD_BWD if fwd_bwd else ():
                    thunk = _works(functools.partial(fwd_bwd_thunk, forwards[impl], q, k, v, do, causal))
                    if thunk is not None:
                        out.append(Case(fwd_bwd_name(d, n, causal, impl), thunk, nbytes, fwd_flops, "fwd+bwd " + group))
    return out


def hopper_cases(device="cuda") -> list[Case]:
    if torch.cuda.get_device_capability() < (9, 0):
        return []
    out = []
    for n in HOPPER_NS:
        B = TOKEN_HEADS // (n * HEADS)
        q, k, v, do = qkv_do(B, HEADS, n, 128, device)
        for causal in (False, True):
            for step, (det, cfg) in HOPPER.items():
                fwd = functools.partial(_configured, det=det, cfg=cfg)
                thunk = _works(functools.partial(backward_thunk, fwd, q, k, v, do, causal))
                if thunk is not None:
                    flops = attention_backward_flops(B, HEADS, n, n, 128, causal)
                    nbytes = attention_backward_bytes(B, HEADS, n, n, 128, DTYPE)
                    out.append(
                        Case(hopper_name(n, causal, step), thunk, nbytes, flops, "hopper " + shape_tag(128, n, causal))
                    )
    return out


#: the FP8 ceiling: square matmuls of this size, bf16 against e4m3 (``torch._scaled_mm``, fp32 and fast accumulation)
FP8_N = 8192
FP8_GROUP = "fp8 ceiling"
FP8_CASES = {"bf16": "matmul bf16", "e4m3": "matmul fp8 e4m3", "e4m3 fast": "matmul fp8 e4m3 fast accum"}


def fp8_cases(device="cuda") -> list[Case]:
    """What FP8 can offer an attention kernel at most: the tensor cores' e4m3 rate against bf16's, measured
    with cuBLAS square matmuls (the package's FP8 forward itself: :func:`fp8_attention_cases`). Left out
    where FP8 matmuls are not supported (before sm_89)."""
    a, b = (torch.randn(FP8_N, FP8_N, device=device, dtype=DTYPE) for _ in range(2))
    one = torch.ones((), device=device, dtype=torch.float32)
    a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()  # cuBLAS wants the second column-major
    makers = {
        "bf16": lambda: lambda: a @ b,
        "e4m3": lambda: lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=DTYPE),
        "e4m3 fast": lambda: lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=DTYPE, use_fast_accum=True),
    }
    out = []
    for key, make in makers.items():
        thunk = _works(make)
        if thunk is not None:
            # bytes: a and b read, the bf16 product written
            out.append(Case(FP8_CASES[key], thunk, FP8_N**2 * (6 if key == "bf16" else 4), 2 * FP8_N**3, FP8_GROUP))
    return out


#: the FP8 forward against the bf16 forward (``fusionlab.kernels.attention_fp8``), head dim 128
FP8_ATTN_NS = (4096, 16384)
FP8_ATTN_GROUP = "fp8 attention"


def fp8_attention_name(n: int, causal: bool, impl: str) -> str:
    """``impl``: "bf16" (the package's forward) or "fp8" (the e4m3 kernel on inputs already quantised)."""
    return f"{shape_tag(128, n, causal)} fwd {impl}"


def fp8_attention_cases(device="cuda") -> list[Case]:
    """The package's FP8 forward on e4m3 inputs already quantised (a model writes them in the epilogue of
    the layer before) against its bf16 forward, head dim 128, at :data:`FP8_ATTN_NS` (16k x 16 token-heads),
    causal and not; both counted with the forward's FLOPs. Left out before sm_89."""
    if torch.cuda.get_device_capability() < (8, 9):
        return []
    out = []
    for n in FP8_ATTN_NS:
        B = TOKEN_HEADS // (n * HEADS)
        q, k, v, _ = qkv_do(B, HEADS, n, 128, device)
        for causal in (False, True):
            cfg = attention_fp8_config(128, causal, n)
            x = quantize_fp8(q, k, v, cfg["BLOCK_M"], cfg["BLOCK_N"])
            flops = attention_flops(B, HEADS, n, n, 128, causal)
            nbytes = 4 * B * HEADS * n * 128 * 2  # bf16: q, k, v read and o written once
            thunks = {
                "bf16": lambda q=q, k=k, v=v, c=causal: attention(q, k, v, causal=c),
                "fp8": lambda x=x, c=causal: attention_fp8_quantized(x, c),
            }
            for impl, fn in thunks.items():
                thunk = _works(lambda fn=fn: fn)
                if thunk is not None:
                    b = nbytes if impl == "bf16" else nbytes * 5 // 8  # e4m3 inputs: one byte an element
                    out.append(Case(fp8_attention_name(n, causal, impl), thunk, b, flops, FP8_ATTN_GROUP))
    return out


def _configured(q, k, v, causal, *, det, cfg):
    return attention(q, k, v, causal=causal, deterministic=det, backward_config=cfg)[0]


def _bits(a: torch.Tensor) -> torch.Tensor:
    return a.view(torch.int16) if a.element_size() == 2 else a.view(torch.int32)


def determinism(device="cuda") -> list[tuple[Bits, Callable]]:
    """Each schedule's backward :data:`BITS_RUNS` times on the same inputs: which bits moved."""
    d, n, causal = BITS_SHAPE
    B = TOKEN_HEADS // (n * HEADS)
    q, k, v, do = qkv_do(B, HEADS, n, d, device, seed=2)
    forwards = _forwards()
    out = []
    for impl in BITS_IMPLS:
        thunk = backward_thunk(forwards[impl], q, k, v, do, causal)
        first = [_bits(g).clone() for g in thunk()]
        changed = [torch.zeros_like(f, dtype=torch.bool) for f in first]
        seen = [first]
        for _ in range(BITS_RUNS - 1):
            now = [_bits(g) for g in thunk()]
            for c, f, g in zip(changed, first, now, strict=True):
                c |= f != g
            if not any(all(torch.equal(a, b) for a, b in zip(s, now, strict=True)) for s in seen):
                seen.append([g.clone() for g in now])
        counts = {g: int(c.sum()) for g, c in zip(("dQ", "dK", "dV"), changed, strict=True)}
        out.append((Bits(impl, counts, len(seen), BITS_RUNS), thunk))
    return out


def bits_cases(device="cuda") -> list[Case]:
    out = []
    for b, thunk in determinism(device):
        for grad, count in b.changed.items():
            out.append(Case(bits_name(b.impl, grad), thunk, count, 0, BITS_GROUP))
        out.append(Case(runs_name(b.impl), thunk, b.distinct, 0, BITS_GROUP))
    return out


def bits_from(results) -> list[Bits]:
    """The determinism probes of a run (``SuiteRun.results`` or a recorded suite); empty without them."""
    by_name = {r.name: r for r in results}
    out = []
    for impl in BITS_IMPLS:
        if runs_name(impl) not in by_name:
            continue
        changed = {g: int(by_name[bits_name(impl, g)].nbytes) for g in ("dQ", "dK", "dV")}
        out.append(Bits(impl, changed, int(by_name[runs_name(impl)].nbytes), BITS_RUNS))
    return out


def _peak_fwd_bwd(forward: Callable, q, k, v, do) -> Callable:
    return lambda: torch.autograd.grad(forward(q, k, v, True), (q, k, v), do)


def _peaks(device="cuda") -> list[tuple[Peak, Callable]]:
    forwards = _forwards()
    out = []
    eager_ok = True
    for n in PEAK_NS:
        q, k, v, do = qkv_do(1, HEADS, n, PEAK_D, device, seed=1)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        ours = _peak_fwd_bwd(forwards["ours"], q, k, v, do)
        ours()  # compile before measuring
        if eager_ok:
            eager = _peak_fwd_bwd(forwards["eager"], q, k, v, do)
            try:
                torch.cuda.empty_cache()
                out.append((Peak("eager", n, peak_bytes(eager)), _guarded(eager)))
            except torch.cuda.OutOfMemoryError:
                eager_ok = False
                torch.cuda.empty_cache()
                out.append((Peak("eager", n, None), ours))
        out.append((Peak("ours", n, peak_bytes(ours)), ours))
        del q, k, v, do
    return out


def peak_cases(device="cuda") -> list[Case]:
    out = []
    for p, fn in _peaks(device):
        flops = attention_flops(1, HEADS, p.n, p.n, PEAK_D, True) * 7 // 2
        if p.peak_bytes is None:
            out.append(Case(oom_name(p.n), fn, 0, flops, OOM_GROUP))
        else:
            out.append(Case(peak_name(p.variant, p.n), fn, p.peak_bytes, 0, PEAK_GROUP))
    return out


def peaks_from(results) -> list[Peak]:
    """The peak-memory measurements of a run, in sweep order, ``peak_bytes=None`` where eager ran out of
    memory; empty when the run has none."""
    by_name = {r.name: r for r in results}
    out = []
    for n in PEAK_NS:
        for variant in PEAK_VARIANTS:
            r = by_name.get(peak_name(variant, n))
            if r is not None:
                out.append(Peak(variant, n, int(r.nbytes)))
            elif variant == "eager" and oom_name(n) in by_name:
                out.append(Peak("eager", n, None))
    return out


#: issue 39's bars, in one run: ours' backward against SDPA's flash and cuDNN backends, and forward +
#: backward against flash
BAR_FLASH, BAR_CUDNN, BAR_FWD_BWD, BAR_FP8 = 1.1, 0.8, 1.2, 1.4
#: and the memory bar: forward + backward at N = 131072 (B 1, H 16, D 128) in under 2 GiB of extra memory,
#: extra read as beyond the inputs and what the op returns (:attr:`Peak.workspace_bytes`): O and the three
#: gradients alone take 2 GiB at that size, so no schedule could meet a reading that counted them
MEMORY_BAR_N, MEMORY_BAR_GIB = 131072, 2


def bars(results) -> list[tuple[str, bool, str]]:
    """The speed bars read off a run: ``(bar, met, detail)``, the worst ratio over the timed shapes."""
    r = {x.name: x for x in results}
    out = []
    checks = (
        (f"backward >= {BAR_FLASH}x SDPA flash", case_name, "flash", BAR_FLASH),
        (f"backward >= {BAR_CUDNN}x SDPA cudnn", case_name, "cudnn", BAR_CUDNN),
        (f"fwd+bwd >= {BAR_FWD_BWD}x SDPA flash", fwd_bwd_name, "flash", BAR_FWD_BWD),
    )
    for bar, name, impl, need in checks:
        ratios = {}
        for d in HEAD_DIMS:
            for n in NS:
                for causal in (False, True):
                    ours, base = r.get(name(d, n, causal, "ours")), r.get(name(d, n, causal, impl))
                    if ours is not None and base is not None:
                        ratios[shape_tag(d, n, causal)] = base.ms / ours.ms
        if ratios:
            worst = min(ratios, key=ratios.get)
            met = sum(v >= need for v in ratios.values())
            out.append(
                (bar, met == len(ratios), f"{met} of {len(ratios)} shapes; worst {ratios[worst]:.2f}x at {worst}")
            )
    fp8 = {}
    for n in FP8_ATTN_NS:
        for causal in (False, True):
            bf, f8 = r.get(fp8_attention_name(n, causal, "bf16")), r.get(fp8_attention_name(n, causal, "fp8"))
            if bf is not None and f8 is not None:
                fp8[shape_tag(128, n, causal)] = bf.ms / f8.ms
    if fp8:
        worst = min(fp8, key=fp8.get)
        met = sum(v >= BAR_FP8 for v in fp8.values())
        out.append((f"FP8 forward >= {BAR_FP8}x the bf16 forward (D 128)", met == len(fp8),
                    f"{met} of {len(fp8)} shapes; worst {fp8[worst]:.2f}x at {worst}"))  # fmt: skip
    for p in peaks_from(results):
        if p.variant == "ours" and p.n == MEMORY_BAR_N:
            out.append((
                f"N = {p.n} forward + backward: extra memory < {MEMORY_BAR_GIB} GiB",
                p.workspace_bytes < MEMORY_BAR_GIB * 2**30,
                f"{p.workspace_bytes / 2**20:.1f} MiB beyond the inputs, O, lse and the gradients "
                f"({p.peak_bytes / 2**30:.3f} GiB beyond the inputs alone)",
            ))  # fmt: skip
    for b in bits_from(results):
        if b.impl == "ours":
            out.append(
                ("deterministic schedule bit-identical", b.distinct == 1, f"{b.distinct} distinct of {b.runs} runs")
            )
    return out


def cases(
    copy_GBps: float | None = None, matmul_TFLOPs: float | None = None, device="cuda", live: bool = False
) -> list[Case]:
    """All lesson 8 cases. With the measured ceilings each backward timing also carries ``predicted_ms``.
    ``live``: only what the notebook's live bars and tables read (the backward timings at :data:`LIVE_DIMS`
    and :data:`LIVE_NS`):
    the probes and the peaks have cells of their own, and the whole suite runs for minutes, past a
    notebook cell's time limit."""
    if live:
        return timing_cases(copy_GBps, matmul_TFLOPs, device, dims=LIVE_DIMS, ns=LIVE_NS, fwd_bwd=False)
    return [
        *timing_cases(copy_GBps, matmul_TFLOPs, device),
        *hopper_cases(device),
        *fp8_cases(device),
        *fp8_attention_cases(device),
        *bits_cases(device),
        *peak_cases(device),
    ]


def peak_memory(device="cuda") -> list[Peak]:
    """The peak-memory sweep measured on this GPU without timing anything (GPU only)."""
    out = [p for p, _ in _peaks(device)]
    torch.cuda.empty_cache()
    return out


def bits_probe(device="cuda") -> list[Bits]:
    """The determinism probe measured on this GPU, without timing anything (GPU only)."""
    return [b for b, _ in determinism(device)]


def backward_of(impl: str, d: int, n: int, causal: bool, device="cuda") -> Callable:
    """One timing case's thunk as :func:`timing_cases` builds it (16k x 16 token-heads at N = ``n``): the
    backward alone of schedule ``impl`` (a key of :data:`IMPLS`), one forward already run."""
    q, k, v, do = qkv_do(TOKEN_HEADS // (n * HEADS), HEADS, n, d, device)
    return backward_thunk(_forwards()[impl], q, k, v, do, causal)
