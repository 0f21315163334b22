"""Lesson 7b on a GPU: lesson 7's kernel with a modification against compiled ``flex_attention``.

All in bf16, 16 heads, 32k tokens per head-row (B = 32768 / N), head dims 64 and 128, N = 4k ... 32k.
Five modifications (:data:`MODS`): Gemma 2's softcap, ALiBi, a 1k sliding window, a document mask of 8
packed documents (causal inside each), and plain causal; and none (:data:`PLAIN`, ours only: what a
modification costs is read against it). For each shape:

- ``ours``: :func:`~fusionlab.kernels.attention.attention` with the modification (a score modification
  on the dense kernel; a mask as a block mask built once per shape; causal as lesson 7's ``causal=True``);
- ``ours block mask`` (causal only): the same mask through the block lists, to set the list's cost beside
  lesson 7's loop bounds;
- ``flex``: ``torch.compile(flex_attention)`` with the same ``score_mod`` / ``create_block_mask`` (its
  block mask built once per shape too);
- ``sdpa bool mask`` (the masks, N <= :data:`SDPA_MASK_MAX_N`): SDPA given the mask as an N x N boolean
  tensor, which it must read (and the tensor must exist: N^2 bytes).

``flops`` = 4 D per visible (query, key) pair (dense: ``4 N^2 D``), the same for every implementation, so
TFLOP/s compare them and, for the masks, rate per *visible* FLOP. ``predicted_ms`` for ``ours``: the
roofline of what the kernel does, max(FLOPs of the visited blocks / matmul rate, the fewest bytes / copy
bandwidth) (:func:`fusionlab.lessons.l7b.ledger.mask_ledger`).
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F

from ...bench import Case
from ...kernels.attention import (
    alibi,
    attention,
    attention_bytes,
    block_mask,
    causal_mask,
    document_mask,
    sliding_window,
    softcap,
)

DTYPE = torch.bfloat16
HEADS = 16
TOKENS = 32768  # B * N: every shape does the same number of query rows
HEAD_DIMS = (64, 128)
NS = (4096, 8192, 16384, 32768)
MODS = ("softcap", "alibi", "sliding_window", "document", "causal")
#: timed for ours only: lesson 7's kernel with no modification, the baseline of a modification's cost
PLAIN = "none"
CAP = 50.0  # Gemma 2's attention softcap
WINDOW = 1024
DOCS = 8
#: SDPA with an explicit boolean mask is timed up to this N (the mask alone is N^2 bytes)
SDPA_MASK_MAX_N = 8192
IMPLS = {"ours": "ours", "ours_mask": "ours block mask", "flex": "flex compiled", "sdpa_mask": "sdpa bool mask"}
#: the issue's bars: ours against compiled flex_attention (every shape), and the sliding window's rate per
#: visible FLOP against dense causal's at the longest N
BAR_FLEX, BAR_WINDOW = 1.1, 0.8


def shape_tag(d: int, n: int, mod: str) -> str:
    return f"D={d} N={n} {mod}"


def case_name(d: int, n: int, mod: str, impl: str) -> str:
    return f"{shape_tag(d, n, mod)} {IMPLS[impl]}"


def doc_ids(n: int, docs: int = DOCS, device="cuda") -> torch.Tensor:
    """One document id per token: ``docs`` documents of uneven lengths (cut points drawn with seed 0)."""
    g = torch.Generator().manual_seed(0)
    cuts = torch.sort(torch.randperm(n - 1, generator=g)[: docs - 1] + 1).values
    ids = torch.zeros(n, dtype=torch.int32)
    ids[cuts] = 1
    return ids.cumsum(0).to(torch.int32).to(device)


def ours_mods(mod: str, n: int, device="cuda"):
    """``(score_mod, mask, causal)`` of our call for modification ``mod``."""
    return {
        "softcap": (softcap(CAP), None, False),
        "alibi": (alibi(HEADS), None, False),
        "sliding_window": (None, sliding_window(WINDOW), False),
        "document": (None, document_mask(doc_ids(n, device=device)), False),
        "causal": (None, None, True),
        PLAIN: (None, None, False),
    }[mod]


def flex_mods(mod: str, n: int, device="cuda"):
    """``(score_mod, mask_mod)`` of flex_attention for modification ``mod``: the same functions in torch."""
    ids = doc_ids(n, device=device)

    def capped(s, b, h, q, kv):
        return CAP * torch.tanh(s / CAP)

    def biased(s, b, h, q, kv):
        return s + torch.exp2(-8.0 * (h + 1) / HEADS) * (kv - q)

    def window(b, h, q, kv):
        return (q >= kv) & (q - kv < WINDOW)

    def document(b, h, q, kv):
        return (ids[q] == ids[kv]) & (q >= kv)

    def causal(b, h, q, kv):
        return q >= kv

    return {"softcap": (capped, None), "alibi": (biased, None), "sliding_window": (None, window),
            "document": (None, document), "causal": (None, causal)}[mod]  # fmt: skip


def visible_pairs(mod: str, n: int) -> int:
    """(query, key) pairs the modification keeps, per (batch, head)."""
    if mod in ("softcap", "alibi", PLAIN):
        return n * n
    if mod == "causal":
        return n * (n + 1) // 2
    if mod == "sliding_window":
        w = min(WINDOW, n)
        return w * (w + 1) // 2 + (n - w) * w
    sizes = torch.bincount(doc_ids(n, device="cpu").long())
    return int((sizes * (sizes + 1) // 2).sum())


def qkv(B: int, n: int, d: int, device="cuda", seed: int = 0):
    gen = torch.Generator(device=device).manual_seed(seed)
    return tuple(torch.randn(B, HEADS, n, d, device=device, dtype=DTYPE, generator=gen) for _ in range(3))


#: recompiles torch.compile may make of flex_attention: one per modification, head dim and length here, and
#: past dynamo's default (8) a call would fall back to eager flex_attention, timing the wrong thing
RECOMPILES = 512


@functools.lru_cache(maxsize=1)
def _flex():
    import torch._dynamo.config as dynamo
    from torch.nn.attention.flex_attention import flex_attention

    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(dynamo, name):
            setattr(dynamo, name, max(getattr(dynamo, name), RECOMPILES))
    return torch.compile(flex_attention)


def _flex_block_mask(mask_mod, n, device):
    from torch.nn.attention.flex_attention import create_block_mask

    return None if mask_mod is None else create_block_mask(mask_mod, None, None, n, n, device=device)


def _dense_mask(mask, n, device):
    """The mask as the N x N boolean tensor SDPA takes (True: attend)."""
    q = torch.arange(n, device=device).view(-1, 1)
    kv = torch.arange(n, device=device).view(1, -1)
    zero = torch.tensor(0, device=device)
    return mask.ref(zero, zero, q, kv, mask.aux, mask.a0, mask.a1)


def _works(fn) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
        return True
    except (RuntimeError, torch.cuda.OutOfMemoryError):  # a backend this build lacks, out of memory
        torch.cuda.empty_cache()
        return False


def timing_cases(copy_GBps=None, matmul_TFLOPs=None, device="cuda", dims=HEAD_DIMS, ns=NS, mods=(*MODS, PLAIN),
                 impls=tuple(IMPLS), config=None) -> list[Case]:  # fmt: skip
    """The cases of :data:`MODS` at each head dim and N; ``config``: tile overrides for ours (a sweep)."""
    from .ledger import mask_ledger

    out = []
    for n in ns:
        B = max(1, TOKENS // n)
        for d in dims:
            q, k, v = qkv(B, n, d, device)
            nbytes = attention_bytes(B, HEADS, n, n, d, DTYPE)
            for mod in mods:
                flops = 4 * B * HEADS * visible_pairs(mod, n) * d
                sm, mask, causal = ours_mods(mod, n, device)
                bm = None if mask is None else block_mask(mask, None, None, n, n, device=device)
                thunks = {
                    "ours": functools.partial(attention, q, k, v, causal, score_mod=sm, block_mask=bm, config=config),
                }
                if mod != PLAIN:
                    f_sm, f_mask = flex_mods(mod, n, device)
                    thunks["flex"] = functools.partial(_flex(), q, k, v, score_mod=f_sm,
                                                       block_mask=_flex_block_mask(f_mask, n, device))  # fmt: skip
                if mod == "causal":
                    cbm = block_mask(causal_mask(), None, None, n, n, device=device)
                    thunks["ours_mask"] = functools.partial(attention, q, k, v, block_mask=cbm, config=config)
                if mask is not None and n <= SDPA_MASK_MAX_N:
                    dense = _dense_mask(mask, n, device)
                    thunks["sdpa_mask"] = functools.partial(F.scaled_dot_product_attention, q, k, v, attn_mask=dense)
                led = mask_ledger(B, HEADS, n, n, d, DTYPE, block_mask=bm, causal=causal)
                for impl, thunk in thunks.items():
                    if impl not in impls or not _works(thunk):
                        continue
                    predicted = None
                    if impl == "ours" and copy_GBps and matmul_TFLOPs:
                        predicted = max(led.kernel_flops / (matmul_TFLOPs * 1e12), nbytes / (copy_GBps * 1e9)) * 1e3
                    out.append(Case(case_name(d, n, mod, impl), thunk, nbytes, flops, shape_tag(d, n, mod), predicted))
            del q, k, v
    return out


def bars(results) -> list[tuple[str, bool, str]]:
    """The issue's bars read off a run: ``(bar, met, detail)``."""
    r = {x.name: x for x in results}
    out = []
    ratios = {}
    for d in HEAD_DIMS:
        for n in NS:
            for mod in MODS:
                ours, flex = r.get(case_name(d, n, mod, "ours")), r.get(case_name(d, n, mod, "flex"))
                if ours is not None and flex is not None:
                    ratios[shape_tag(d, n, mod)] = flex.ms / ours.ms
    if ratios:
        worst = min(ratios, key=ratios.get)
        met = sum(v >= BAR_FLEX for v in ratios.values())
        out.append((f"ours >= {BAR_FLEX}x compiled flex_attention", met == len(ratios),
                    f"{met} of {len(ratios)} shapes; worst {ratios[worst]:.2f}x at {worst}"))  # fmt: skip
    n = max(NS)
    for d in HEAD_DIMS:
        sw, ca = r.get(case_name(d, n, "sliding_window", "ours")), r.get(case_name(d, n, "causal", "ours"))
        if sw is not None and ca is not None:
            rel = (sw.flops / sw.ms) / (ca.flops / ca.ms)
            bar = f"sliding window {WINDOW} at N={n}, D={d}: >= {BAR_WINDOW}x dense causal's rate per visible FLOP"
            out.append((bar, rel >= BAR_WINDOW, f"{rel:.2f}x"))
    return out


def cases(copy_GBps: float | None = None, matmul_TFLOPs: float | None = None, device="cuda", ns=NS) -> list[Case]:
    """All lesson 7b cases (``ns``: fewer lengths, for a notebook's live run); with the measured ceilings each
    ``ours`` case carries ``predicted_ms``."""
    return timing_cases(copy_GBps, matmul_TFLOPs, device, ns=ns)
