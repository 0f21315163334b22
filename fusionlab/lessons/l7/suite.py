"""Lesson 7 on a GPU: the FlashAttention forward against PyTorch's own, and naive attention's memory wall.
All in bf16, heads of 16, 16k x 16 token-heads per timing shape (N = 1k: B = 16; 4k: B = 4; 16k: B = 1).

- **Timing** at head dims 64 and 128, N = 1k, 4k, 16k, causal and full: our ``attention`` (the package
  kernel), ``F.scaled_dot_product_attention`` pinned to its flash backend and to its cuDNN backend, and
  naive eager attention (:func:`~fusionlab.kernels.attention.attention_eager`) and the FA1 schedule
  (:func:`~fusionlab.kernels.attention_fa1.attention_fa1`: K/V in the outer loop, the running O, m, l
  through HBM, one program per head) where they take a moment (N = 1k and 4k). ``flops`` = ``4 N^2 D``
  per head, half that causal
  (:func:`~fusionlab.kernels.attention.attention_flops`), the same for every schedule, so TFLOP/s
  compare them; ``nbytes`` = the fewest bytes any forward moves (Q, K, V read, O and lse written).
  ``predicted_ms`` (with the measured ceilings): the roofline time, max(FLOPs / matmul rate,
  bytes / copy bandwidth), for the fused schedules (FA1's bytes from its own ledger,
  :func:`~fusionlab.kernels.attention_fa1.attention_fa1_ledger`); naive's adds its ledger's trips of S and P
  at the copy bandwidth to the FLOPs at the matmul rate.
- **Peak memory** through the cases of group :data:`PEAK_GROUP` (as lesson 5): B = 1, H = 16, D = 128,
  full attention at N = 1k ... 128k, naive and ours. For those, ``nbytes`` is not traffic but the peak
  bytes allocated by one forward beyond what was allocated before it (its output included),
  measured with ``torch.cuda.max_memory_allocated`` when the case is built; their ``ms`` is that
  forward's time. Where naive runs out of memory while the case is built, the sweep records a case of
  group :data:`OOM_GROUP` instead, named :func:`oom_name`: it times *ours* at that N (the N that naive
  cannot do), and naive is not tried at any longer N. :func:`peaks_from` reads both back.

A backend that this GPU or torch build lacks (cuDNN attention before sm_80, say) is left out of the
cases rather than failing the suite. Memory: naive at N = 32k holds two 32 GiB matrices (64 GiB);
on an 80 GB card that fits, on a smaller one it is recorded as out of memory.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ...bench import Case, peak_bytes
from ...kernels.attention import attention, attention_bytes, attention_eager, attention_flops, attention_ledger
from ...kernels.attention_fa1 import attention_fa1, attention_fa1_ledger

DTYPE = torch.bfloat16
HEADS = 16
TOKEN_HEADS = 16384 * 16  # B * N per head: every timing shape does the same number of query rows
HEAD_DIMS = (64, 128)
NS = (1024, 4096, 16384)
#: naive eager and the FA1 schedule are timed at these N only (at 16k naive takes tens of ms and 16 GiB,
#: and FA1's one program per head leaves most SMs idle)
NAIVE_NS = (1024, 4096)
#: schedule -> case label (after the shape tag). "flash" is SDPA's FlashAttention-2 backend (written for
#: Ampere), "cudnn" its cuDNN backend (tuned for Hopper): a ratio names which one it is against.
IMPLS = {
    "ours": "ours",
    "flash": "sdpa flash",
    "cudnn": "sdpa cudnn",
    "naive": "naive eager",
    "fa1": "fa1 schedule",
}
#: the schedules timed only at NAIVE_NS
SHORT_ONLY = ("naive", "fa1")
#: the peak-memory sweep: B = 1, H = 16, D = 128, full attention
PEAK_D = 128
PEAK_NS = (1024, 4096, 16384, 32768, 65536, 131072)
PEAK_VARIANTS = ("naive", "ours")
PEAK_GROUP = "peak memory"
OOM_GROUP = "naive out of memory"


def shape_tag(d: int, n: int, causal: bool) -> str:
    """The group of one timing shape, e.g. ``"D=128 N=4096 causal"``."""
    return f"D={d} N={n} {'causal' if causal else 'full'}"


def case_name(d: int, n: int, causal: bool, impl: str) -> str:
    """The case name of one timing: ``impl`` is a key of :data:`IMPLS`."""
    return f"{shape_tag(d, n, causal)} {IMPLS[impl]}"


def peak_name(variant: str, n: int) -> str:
    return f"peak {variant} N={n}"


def oom_name(n: int) -> str:
    return f"naive OOM at N={n}"


@dataclass(frozen=True)
class Peak:
    """One peak-memory measurement: bytes allocated at the peak of one forward (B = 1, H = 16, D = 128),
    beyond what was allocated before it. ``peak_bytes`` is None where the variant ran out of memory."""

    variant: str
    n: int
    peak_bytes: int | None


def qkv(B: int, H: int, n: int, d: int, device="cuda", seed: int = 0):
    gen = torch.Generator(device=device).manual_seed(seed)
    return tuple(torch.randn(B, H, n, d, device=device, dtype=DTYPE, generator=gen) for _ in range(3))


def _sdpa(backend) -> Callable:
    from torch.nn.attention import sdpa_kernel

    def fn(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return fn


def _schedules() -> dict[str, Callable]:
    from torch.nn.attention import SDPBackend

    return {
        "ours": lambda q, k, v, c: attention(q, k, v, causal=c),
        "flash": _sdpa(SDPBackend.FLASH_ATTENTION),
        "cudnn": _sdpa(SDPBackend.CUDNN_ATTENTION),
        "naive": attention_eager,
        "fa1": lambda q, k, v, c: attention_fa1(q, k, v, causal=c),
    }


def _works(fn, *args) -> bool:
    """Run ``fn`` once (compile, warm up); False where this GPU or build cannot run it."""
    try:
        fn(*args)
        return True
    except RuntimeError:  # a missing backend ("No available kernel"), out of memory
        torch.cuda.empty_cache()
        return False


def timing_cases(copy_GBps=None, matmul_TFLOPs=None, device="cuda", dims=HEAD_DIMS, ns=NS) -> list[Case]:
    out = []
    schedules = _schedules()
    for d in dims:
        for n in ns:
            B = TOKEN_HEADS // (n * HEADS)
            q, k, v = qkv(B, HEADS, n, d, device)
            for causal in (False, True):
                flops = attention_flops(B, HEADS, n, n, d, causal)
                nbytes = attention_bytes(B, HEADS, n, n, d, DTYPE)
                led = attention_ledger(B, HEADS, n, n, d, DTYPE, causal)
                for impl, fn in schedules.items():
                    if impl in SHORT_ONLY and n not in NAIVE_NS:
                        continue
                    thunk = functools.partial(fn, q, k, v, causal)
                    if not _works(thunk):
                        continue
                    predicted = None
                    if copy_GBps and matmul_TFLOPs:
                        mm = flops / (matmul_TFLOPs * 1e12) * 1e3
                        if impl == "naive":
                            predicted = mm + led.predict_ms(copy_GBps, fused=False)
                        elif impl == "fa1":
                            fa1 = attention_fa1_ledger(B, HEADS, n, n, d, DTYPE, causal)
                            predicted = max(mm, fa1.predict_ms(copy_GBps, fused=True))
                        else:
                            predicted = max(mm, nbytes / (copy_GBps * 1e9) * 1e3)
                    group = shape_tag(d, n, causal)
                    out.append(Case(case_name(d, n, causal, impl), thunk, nbytes, flops, group, predicted))
    return out


def _guarded(fn) -> Callable:
    """The naive thunk as timed: an out-of-memory error while timing (the caching allocator fragmented
    by what ran before) empties the cache instead of ending the recording."""

    def thunk():
        try:
            return fn()
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            return None

    return thunk


def _peaks(device="cuda") -> list[tuple[Peak, Callable | None]]:
    out = []
    naive_ok = True
    for n in PEAK_NS:
        q, k, v = qkv(1, HEADS, n, PEAK_D, device, seed=1)
        ours = functools.partial(attention, q, k, v)
        ours()  # compile before measuring
        if naive_ok:
            naive = functools.partial(attention_eager, q, k, v)
            try:
                torch.cuda.empty_cache()
                out.append((Peak("naive", n, peak_bytes(naive)), _guarded(naive)))
            except torch.cuda.OutOfMemoryError:
                naive_ok = False
                torch.cuda.empty_cache()
                out.append((Peak("naive", n, None), ours))
        out.append((Peak("ours", n, peak_bytes(ours)), ours))
        del q, k, v
    return out


def peak_memory(device="cuda") -> list[Peak]:
    """The peak-memory sweep measured on this GPU without timing anything (GPU only; naive at N = 32k
    needs 64 GiB, and is recorded as out of memory where the card has less)."""
    out = [p for p, _ in _peaks(device)]
    torch.cuda.empty_cache()
    return out


def peak_cases(device="cuda") -> list[Case]:
    """The peak-memory sweep as cases (``nbytes`` = the peak; see the module docstring), and the N where
    naive ran out of memory as a case of :data:`OOM_GROUP`, so that a recording keeps both."""
    out = []
    for p, fn in _peaks(device):
        flops = attention_flops(1, HEADS, p.n, p.n, PEAK_D)
        if p.peak_bytes is None:
            out.append(Case(oom_name(p.n), fn, 0, flops, OOM_GROUP))
        else:
            out.append(Case(peak_name(p.variant, p.n), fn, p.peak_bytes, 0, PEAK_GROUP))
    return out


def peaks_from(results) -> list[Peak]:
    """The peak-memory measurements of a run (``SuiteRun.results`` or a recorded suite), in sweep order,
    with ``peak_bytes=None`` for naive where it ran out of memory; empty when the run has none."""
    by_name = {r.name: r for r in results}
    out = []
    for n in PEAK_NS:
        for variant in PEAK_VARIANTS:
            r = by_name.get(peak_name(variant, n))
            if r is not None:
                out.append(Peak(variant, n, int(r.nbytes)))
            elif variant == "naive" and oom_name(n) in by_name:
                out.append(Peak("naive", n, None))
    return out


#: the issue's bars: ours against SDPA's flash backend and its cuDNN backend, TFLOP/s in one run
BAR_FLASH, BAR_CUDNN = 1.25, 0.85


def bars(results) -> list[tuple[str, bool, str]]:
    """The issue's speed bars for this suite, read off a run: ``(bar, met, detail)``, one per backend over
    every timed shape (the worst ratio, and where)."""
    r = {x.name: x for x in results}
    out = []
    for impl, need in (("flash", BAR_FLASH), ("cudnn", BAR_CUDNN)):
        ratios = {}
        for d in HEAD_DIMS:
            for n in NS:
                for causal in (False, True):
                    ours, base = r.get(case_name(d, n, causal, "ours")), r.get(case_name(d, n, causal, impl))
                    if ours is not None and base is not None:
                        ratios[shape_tag(d, n, causal)] = base.ms / ours.ms
        if ratios:
            worst = min(ratios, key=ratios.get)
            met = sum(v >= need for v in ratios.values())
            detail = f"{met} of {len(ratios)} shapes; worst {ratios[worst]:.2f}x at {worst}"
            out.append((f"ours >= {need}x SDPA {impl}", met == len(ratios), detail))
    return out


def cases(copy_GBps: float | None = None, matmul_TFLOPs: float | None = None, device="cuda") -> list[Case]:
    """All lesson 7 cases. With the measured ceilings (``fusionlab.bench.ceilings()``) each timing case
    also carries ``predicted_ms``."""
    return [*timing_cases(copy_GBps, matmul_TFLOPs, device), *peak_cases(device)]
