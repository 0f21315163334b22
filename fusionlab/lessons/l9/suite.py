"""Lesson 9 on a GPU: one Llama-3-8B decoder layer, part by part and whole, eager against ``torch.compile``
and the package's layer (:mod:`fusionlab.model`), prefill and decoding. All in bf16, the layer's shapes
:data:`~fusionlab.model.LLAMA3_8B` (hidden 4096, 32 query heads, 8 KV heads of 128, FFN 14336), random
weights loaded into both :class:`~fusionlab.model.LlamaLayerReference` (eager) and
:class:`~fusionlab.model.LlamaLayer` (fused).

- **The parts** (group :data:`PARTS_GROUP`), prefill B x N = :data:`PREFILL` tokens: each step of
  :func:`~fusionlab.model.llama_layer_ledger` timed alone, as eager runs it (``F.rms_norm``, three
  ``F.linear``, Hugging Face's RoPE, SDPA, ``x + F.linear``, ``F.silu(g) * u``) and as the package's
  layer does (``rmsnorm``, one ``linear`` over the stacked weights, ``rope``, ``attention``, ``linear``
  with the residual in its epilogue, ``swiglu``). ``flops`` and ``nbytes`` are the part's, from the
  ledger; ``predicted_ms``: :meth:`~fusionlab.model.LayerPart.predict_ms` at the run's measured matmul
  rate and copy bandwidth (eager's bytes for eager, the fused layer's for fused).
- **The whole layer** (groups ``"layer fwd"``, ``"layer fwd+bwd"``): eager, ``torch.compile`` (default
  mode, static shapes) and the package's layer; forward under ``no_grad`` (predicted: the sum of the
  parts' predictions), forward + backward (every weight's gradient and dx, timed with
  :func:`~fusionlab.bench.queued_ms`: the GPU's time with the host out of the way).
- **Peak memory** (group :data:`PEAK_GROUP`): of forward + backward, bytes allocated beyond what was
  allocated before (``nbytes`` here is that count, not traffic).
- **The decode step** (groups ``"decode B=..."``): one token per row against a KV cache of
  :data:`N_CACHE` keys, each row at its own length near the end, batch :data:`DECODE_BATCHES`: eager,
  the package's layer as launched, the package's layer captured in a CUDA graph, and
  ``torch.compile(mode="reduce-overhead")`` of the reference's step. Predicted: the sum of the decode
  ledger's fused parts (every weight and the whole cache read once).
- **Flash-decoding** (group :data:`SPLIT_GROUP`): decode attention alone, one query per row, GQA 32/8,
  D 128, at :data:`SPLIT_SHAPES`: the package's kernel with its keys split (the default), with one split
  (one program per KV head: FlashAttention's schedule at decode time), and SDPA. Each call captured in a
  CUDA graph and the replay timed (the GPU's time: a call at batch 1 costs the host more than the GPU).
  Predicted: the cache's bytes at the copy bandwidth.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F

from ... import bench
from ...bench import Case
from ...kernels.attention import attention
from ...kernels.attention_decode import attention_decode, attention_decode_config
from ...kernels.linear import linear
from ...kernels.rmsnorm import rmsnorm
from ...kernels.rope import rope, rope_eager
from ...kernels.swiglu import swiglu
from ...model import LLAMA3_8B, LlamaLayer, LlamaLayerReference, llama_layer_ledger

DTYPE = torch.bfloat16
#: prefill: batch x sequence
PREFILL = (4, 4096)
#: decoding: the KV cache's length and the batch sizes
N_CACHE = 4096
DECODE_BATCHES = (1, 64)
#: flash-decoding: (B, N_k) of the decode attention timings
SPLIT_SHAPES = ((1, 4096), (1, 32768), (64, 4096))
IMPLS = ("eager", "compile", "fused")
DECODE_IMPLS = ("eager", "fused", "fused graph", "compile reduce-overhead")
SPLIT_IMPLS = ("split", "one split", "sdpa")
PARTS_GROUP = "parts"
PEAK_GROUP = "peak memory"
SPLIT_GROUP = "flash-decoding"
#: the parts that are matmuls (their FLOPs set their floor): the rest are the layer's "tiny ops"
MATMUL_PARTS = ("q, k, v projections", "attention", "o_proj + residual", "gate, up projections",
                "down_proj + residual")  # fmt: skip


def part_name(part: str, impl: str) -> str:
    """A part of the prefill layer (a name of :func:`~fusionlab.model.llama_layer_ledger`), ``impl`` eager or fused."""
    return f"part {part} {impl}"


def layer_name(what: str, impl: str) -> str:
    """``what``: "fwd" or "fwd+bwd"; ``impl``: a key of :data:`IMPLS`."""
    return f"layer {what} {impl}"


def peak_name(impl: str) -> str:
    return f"peak fwd+bwd {impl}"


def decode_name(B: int, impl: str) -> str:
    """The decode step at batch ``B``; ``impl``: one of :data:`DECODE_IMPLS`."""
    return f"decode B={B} {impl}"


def split_name(B: int, n_k: int, impl: str) -> str:
    """Decode attention at batch ``B`` over ``n_k`` keys; ``impl``: one of :data:`SPLIT_IMPLS`."""
    return f"decode attention B={B} N_k={n_k} {impl}"


def is_tiny(part: str) -> bool:
    """Whether a part of the layer is a "tiny op" (memory-bound, between the matmuls)."""
    return part not in MATMUL_PARTS


# -- the layers -------------------------------------------------------------------------------------
def make_layers(max_positions: int, device="cuda", shapes=LLAMA3_8B, dtype=DTYPE):
    """The reference and the package's layer with the same random weights (seed 0): projections of
    standard deviation 1/sqrt(fan-in), norm weights in [0.8, 1.2]."""
    gen = torch.Generator().manual_seed(0)
    ref = LlamaLayerReference(**shapes, max_positions=max_positions)
    with torch.no_grad():
        for p in ref.parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[1] ** -0.5)
            else:
                p.copy_(0.8 + 0.4 * torch.rand(p.shape, generator=gen))
    lay = LlamaLayer(**shapes, max_positions=max_positions).load_reference_state_dict(ref.state_dict())
    return ref.to(device, dtype), lay.to(device, dtype)


def _clear_grads(mod) -> None:
    for p in mod.parameters():
        p.grad = None


def _works(make):
    """Build a thunk and run it once (compile, warm up); None where this GPU or build cannot run it. A CUDA
    error (an illegal address: the context is lost) is raised, never taken for a case this build lacks."""
    try:
        thunk = make()
        thunk()
        torch.cuda.synchronize()
        return thunk
    except Exception as e:  # noqa: BLE001  (a compile this build cannot do, out of memory)
        if "CUDA error" in str(e) and not isinstance(e, torch.cuda.OutOfMemoryError):
            raise
        torch.cuda.empty_cache()
        return None


def graphed(fn, *args):
    """``fn(*args)`` captured in a CUDA graph (after a warm-up on a side stream); returns the replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):  # on the warmed stream: what the warm-up set up there is the graph's too
        fn(*args)
    return g.replay


# -- the parts --------------------------------------------------------------------------------------
def part_thunks(ref, lay, B: int, N: int, device="cuda", dtype=DTYPE) -> dict[str, dict]:
    """Each part of the prefill layer as eager runs it and as the package's layer does, on inputs of the
    layer's own shapes: ``{part: {"eager": thunk, "fused": thunk}}``."""
    hid, H, Hkv = lay.hidden, lay.n_heads, lay.n_kv_heads
    D, ffn, eps = lay.head_dim, lay.ffn, lay.eps
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(B, N, hid, device=device, dtype=dtype, generator=gen)
    a, m = ref.self_attn, ref.mlp
    with torch.no_grad():
        n1 = rmsnorm(x, lay.attn_norm, eps)
        qkv = linear(n1, lay.wqkv)  # (B, N, (H + 2 Hkv) D)
        q = qkv[..., : H * D].view(B, N, H, D)
        k = qkv[..., H * D : (H + Hkv) * D].view(B, N, Hkv, D)
        v = qkv[..., (H + Hkv) * D :].view(B, N, Hkv, D)
        qr, kr = rope(q, k, lay.cos, lay.sin, 0, layout="bnhd")
        qt, kt, vt = qr.transpose(1, 2), kr.transpose(1, 2), v.transpose(1, 2)  # (B, heads, N, D)
        o = attention(qt, kt, vt, causal=True)[0]  # (B, H, N, D)
        o_rows = o.transpose(1, 2).reshape(B, N, H * D)
        gu = linear(n1, lay.w_gate_up)
        g, u = gu[..., :ffn], gu[..., ffn:]
        act = swiglu(g, u)
    cos, sin = ref.cos.to(dtype), ref.sin.to(dtype)
    qe, ke = q.transpose(1, 2), k.transpose(1, 2)
    return {
        "attn_norm": {
            "eager": lambda: F.rms_norm(x, (hid,), ref.input_layernorm.weight, eps),
            "fused": lambda: rmsnorm(x, lay.attn_norm, eps),
        },
        "q, k, v projections": {
            "eager": lambda: (a.q_proj(n1), a.k_proj(n1), a.v_proj(n1)),
            "fused": lambda: linear(n1, lay.wqkv),
        },
        "rope": {
            "eager": lambda: rope_eager(qe, ke, cos, sin, 0),
            "fused": lambda: rope(q, k, lay.cos, lay.sin, 0, layout="bnhd"),
        },
        "attention": {
            "eager": lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True),
            "fused": lambda: attention(qt, kt, vt, causal=True),
        },
        "o to rows (copy)": {
            "eager": lambda: o.transpose(1, 2).reshape(B, N, H * D),
            "fused": lambda: o.transpose(1, 2).reshape(B, N, H * D),
        },
        "o_proj + residual": {
            "eager": lambda: x + a.o_proj(o_rows),
            "fused": lambda: linear(o_rows, lay.wo, residual=x),
        },
        "ffn_norm": {
            "eager": lambda: F.rms_norm(x, (hid,), ref.post_attention_layernorm.weight, eps),
            "fused": lambda: rmsnorm(x, lay.ffn_norm, eps),
        },
        "gate, up projections": {
            "eager": lambda: (m.gate_proj(n1), m.up_proj(n1)),
            "fused": lambda: linear(n1, lay.w_gate_up),
        },
        "swiglu": {
            "eager": lambda: F.silu(g) * u,
            "fused": lambda: swiglu(g, u),
        },
        "down_proj + residual": {
            "eager": lambda: x + m.down_proj(act),
            "fused": lambda: linear(act, lay.w_down, residual=x),
        },
    }


def ledger_counts(copy_GBps=None, matmul_TFLOPs=None, prefill=PREFILL,
                  batches=DECODE_BATCHES) -> dict[str, tuple[int, int, float | None]]:  # fmt: skip
    """What :func:`~fusionlab.model.llama_layer_ledger` counts for each case it describes (the parts, the
    prefill forward, the decode steps), by the case's name: ``(nbytes, flops, predicted_ms)``, the parts'
    summed (predicted: :meth:`~fusionlab.model.LayerPart.predict_ms` at the ceilings given, None without
    them). The package's layer gets the fused layer's bytes; eager and ``torch.compile`` eager's."""

    def count(parts, fused):
        pred = None
        if copy_GBps and matmul_TFLOPs:
            pred = sum(p.predict_ms(matmul_TFLOPs, copy_GBps, fused) for p in parts)
        return sum(p.fused_bytes if fused else p.eager_bytes for p in parts), sum(p.flops for p in parts), pred

    out = {}
    parts = llama_layer_ledger(*prefill, **LLAMA3_8B, dtype=DTYPE)
    for p in parts:
        for impl in ("eager", "fused"):
            out[part_name(p.name, impl)] = count([p], impl == "fused")
    for impl in IMPLS:
        out[layer_name("fwd", impl)] = count(parts, impl == "fused")
    for B in batches:
        step = llama_layer_ledger(B, 1, **LLAMA3_8B, dtype=DTYPE, n_cache=N_CACHE)
        for impl in DECODE_IMPLS:
            out[decode_name(B, impl)] = count(step, impl.startswith("fused"))
    return out


def recounted(results, ceil: bench.Ceilings) -> list[bench.Result]:
    """``results`` with :func:`ledger_counts` at ``ceil`` in place of the counts they carry: bytes, FLOPs,
    predictions, and the bandwidths they give; the times untouched. A recording keeps the counts of the
    ledger that recorded it: read through this, its times are set against the ledger as it counts now."""
    counts = ledger_counts(ceil.copy_GBps, ceil.matmul_TFLOPs)
    out = []
    for r in results:
        if r.name in counts:
            nbytes, flops, pred = counts[r.name]
            GBps, TFLOPs = bench.gbps(nbytes, r.ms), bench.tflops(flops, r.ms) if flops else None
            r = dataclasses.replace(r, nbytes=nbytes, flops=flops, predicted_ms=pred, GBps=GBps, TFLOPs=TFLOPs,
                                    frac_copy=GBps / ceil.copy_GBps)  # fmt: skip
        out.append(r)
    return out


def part_cases(ref, lay, copy_GBps=None, matmul_TFLOPs=None, device="cuda", prefill=PREFILL) -> list[Case]:
    B, N = prefill
    counts = ledger_counts(copy_GBps, matmul_TFLOPs, prefill=prefill)
    out = []
    with torch.no_grad():
        thunks = part_thunks(ref, lay, B, N, device)
    for part, impls in thunks.items():
        for impl, fn in impls.items():
            nbytes, flops, pred = counts[part_name(part, impl)]
            out.append(Case(part_name(part, impl), torch.no_grad()(fn), nbytes, flops, PARTS_GROUP, pred))
    return out


# -- the whole layer --------------------------------------------------------------------------------
def layer_cases(ref, lay, copy_GBps=None, matmul_TFLOPs=None, device="cuda", prefill=PREFILL,
                impls=IMPLS) -> list[Case]:  # fmt: skip
    B, N = prefill
    counts = ledger_counts(copy_GBps, matmul_TFLOPs, prefill=prefill, batches=())
    gen = torch.Generator(device=device).manual_seed(2)
    x = torch.randn(B, N, lay.hidden, device=device, dtype=DTYPE, generator=gen)
    dy = torch.randn(B, N, lay.hidden, device=device, dtype=DTYPE, generator=gen)
    mods = {"eager": ref, "fused": lay}
    if "compile" in impls:
        mods["compile"] = torch.compile(ref, dynamic=False)
    out, peaks = [], []
    for impl in impls:
        mod = mods[impl]
        nbytes, flops, pred = counts[layer_name("fwd", impl)]

        def fwd(mod=mod):
            with torch.no_grad():
                return mod(x)

        xg = x.clone().requires_grad_()

        def step(mod=mod, xg=xg):
            _clear_grads(mod)
            xg.grad = None
            mod(xg).backward(dy)

        f = _works(lambda fwd=fwd: fwd)
        if f is not None:
            out.append(Case(layer_name("fwd", impl), f, nbytes, flops, "layer fwd", pred))
        s = _works(lambda step=step: step)
        if s is not None:
            # forward + backward: three times the forward's matmul FLOPs (dx and dW for each product)
            timer = functools.partial(bench.queued_ms, calls=5)
            out.append(Case(layer_name("fwd+bwd", impl), s, 0, 3 * flops, "layer fwd+bwd", timer=timer))
            _clear_grads(mod)
            xg.grad = None
            torch.cuda.empty_cache()
            peaks.append(Case(peak_name(impl), s, bench.peak_bytes(s), 0, PEAK_GROUP, timer=timer))
            _clear_grads(mod)
            xg.grad = None
    return out + peaks


# -- decoding ---------------------------------------------------------------------------------------
class DecodeStep(torch.nn.Module):
    """The reference's decode step with its caches as buffers (static to ``cudagraphs``)."""

    def __init__(self, ref, kc, vc):
        super().__init__()
        self.ref = ref
        self.register_buffer("kc", kc)
        self.register_buffer("vc", vc)

    def forward(self, x, lens):
        return self.ref.decode(x, self.kc, self.vc, lens)


def decode_inputs(B: int, lay, device="cuda", n_cache: int = N_CACHE, seed: int = 3, dtype=DTYPE):
    """``(x, k_cache, v_cache, lens)``: one new token per row, each row's cache length drawn in the last 64."""
    gen = torch.Generator(device=device).manual_seed(seed)
    lens = torch.randint(max(0, n_cache - 64), n_cache - 1, (B,), device=device, generator=gen)
    shape = (B, lay.n_kv_heads, n_cache, lay.head_dim)
    kc = torch.randn(shape, device=device, dtype=dtype, generator=gen)
    vc = torch.randn(shape, device=device, dtype=dtype, generator=gen)
    x = torch.randn(B, 1, lay.hidden, device=device, dtype=dtype, generator=gen)
    return x, kc, vc, lens


def decode_cases(ref, lay, copy_GBps=None, matmul_TFLOPs=None, device="cuda", batches=DECODE_BATCHES,
                 impls=DECODE_IMPLS) -> list[Case]:  # fmt: skip
    out = []
    counts = ledger_counts(copy_GBps, matmul_TFLOPs, batches=batches)
    for B in batches:
        x, kc, vc, lens = decode_inputs(B, lay, device)
        kf, vf = kc.clone(), vc.clone()
        makers = {
            "eager": lambda x=x, kc=kc, vc=vc, lens=lens: lambda: ref.decode(x, kc, vc, lens),
            "fused": lambda x=x, kf=kf, vf=vf, lens=lens: lambda: lay.decode(x, kf, vf, lens),
            "fused graph": lambda x=x, kf=kf, vf=vf, lens=lens: graphed(lambda: lay.decode(x, kf, vf, lens)),
            "compile reduce-overhead": lambda x=x, kc=kc, vc=vc, lens=lens: _reduce_overhead(ref, x, kc, vc, lens),
        }
        for impl in impls:
            nbytes, flops, pred = counts[decode_name(B, impl)]
            with torch.no_grad():
                thunk = _works(makers[impl])
            if thunk is not None:
                out.append(Case(decode_name(B, impl), torch.no_grad()(thunk), nbytes, flops, f"decode B={B}", pred))
    return out


def _reduce_overhead(ref, x, kc, vc, lens):
    step = torch.compile(DecodeStep(ref, kc.clone(), vc.clone()), mode="reduce-overhead", dynamic=False)
    for _ in range(3):  # cudagraphs records on the second or third call
        step(x, lens)
    return lambda: step(x, lens)


def split_cases(copy_GBps=None, device="cuda", shapes=SPLIT_SHAPES, graphs: bool = True) -> list[Case]:
    H, Hkv, D = LLAMA3_8B["n_heads"], LLAMA3_8B["n_kv_heads"], LLAMA3_8B["hidden"] // LLAMA3_8B["n_heads"]
    out = []
    wrap = graphed if graphs else (lambda fn: fn)  # graphed: the kernels' time, not the host's
    for B, n_k in shapes:
        gen = torch.Generator(device=device).manual_seed(4)
        q = torch.randn(B, H, 1, D, device=device, dtype=DTYPE, generator=gen)
        k, v = (torch.randn(B, Hkv, n_k, D, device=device, dtype=DTYPE, generator=gen) for _ in range(2))
        nbytes = 2 * k.numel() * k.element_size() + 2 * q.numel() * q.element_size()
        flops = 4 * B * H * n_k * D
        one = dict(attention_decode_config(B, H, Hkv, 1, n_k, D), SPLITS=1)
        one = {key: one[key] for key in ("BLOCK_N", "num_warps", "num_stages", "SPLITS")}
        makers = {
            "split": lambda q=q, k=k, v=v: wrap(lambda: attention_decode(q, k, v)),
            "one split": lambda q=q, k=k, v=v, one=one: wrap(lambda: attention_decode(q, k, v, config=one)),
            "sdpa": lambda q=q, k=k, v=v: wrap(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)),
        }
        pred = nbytes / (copy_GBps * 1e6) if copy_GBps else None
        for impl, make in makers.items():
            thunk = _works(make)
            if thunk is not None:
                out.append(Case(split_name(B, n_k, impl), thunk, nbytes, flops, SPLIT_GROUP, pred))
    return out


# -- reading a run back -----------------------------------------------------------------------------
def parts_from(results) -> dict[str, dict[str, object]]:
    """``{part: {"eager": Result, "fused": Result}}`` of a run's part timings, in the layer's order."""
    by_name = {r.name: r for r in results}
    out = {}
    for p in llama_layer_ledger(*PREFILL, **LLAMA3_8B, dtype=DTYPE):
        row = {impl: by_name.get(part_name(p.name, impl)) for impl in ("eager", "fused")}
        if all(row.values()):
            out[p.name] = row
    return out


def tiny_share(results, key: str = "ms") -> dict[str, float]:
    """The share of the layer's summed part times (``key``: "ms", measured, or "predicted_ms") that the tiny
    ops take, eager and fused: ``{"eager": share, "fused": share}`` (empty without the parts)."""
    parts = parts_from(results)
    out = {}
    for impl in ("eager", "fused"):
        times = {name: getattr(row[impl], key) for name, row in parts.items()}
        if times and all(t is not None for t in times.values()):
            total = sum(times.values())
            out[impl] = sum(t for name, t in times.items() if is_tiny(name)) / total
    return out


#: issue 42's bars read off one run: prefill forward against eager and compile, fwd+bwd against compile,
#: peak memory against compile, decode attention against SDPA, the decode step in a graph against
#: reduce-overhead
BAR_FWD_EAGER, BAR_FWD_COMPILE, BAR_FWD_BWD, BAR_DECODE, BAR_SPLIT = 1.2, 1.05, 1.0, 1.0, 1.0


def bars(results) -> list[tuple[str, bool, str]]:
    r = {x.name: x for x in results}
    out = []

    def ratio(bar, base, ours, need, faster=True):
        b, o = r.get(base), r.get(ours)
        if b is not None and o is not None:
            x = b.ms / o.ms if faster else o.ms / b.ms
            out.append((bar, x >= need if faster else x <= need, f"{x:.2f}x ({o.ms:.3f} against {b.ms:.3f} ms)"))

    ratio(f"forward >= {BAR_FWD_EAGER}x eager", layer_name("fwd", "eager"), layer_name("fwd", "fused"), BAR_FWD_EAGER)
    ratio(f"forward >= {BAR_FWD_COMPILE}x torch.compile", layer_name("fwd", "compile"), layer_name("fwd", "fused"),
          BAR_FWD_COMPILE)  # fmt: skip
    ratio(f"fwd+bwd >= {BAR_FWD_BWD}x torch.compile", layer_name("fwd+bwd", "compile"),
          layer_name("fwd+bwd", "fused"), BAR_FWD_BWD)  # fmt: skip
    pc, pf = r.get(peak_name("compile")), r.get(peak_name("fused"))
    if pc is not None and pf is not None:
        out.append(("peak memory <= torch.compile's", pf.nbytes <= pc.nbytes,
                    f"{pf.nbytes / 2**30:.2f} against {pc.nbytes / 2**30:.2f} GiB"))  # fmt: skip
    ratios = {}
    for B, n_k in SPLIT_SHAPES:
        ours, sdpa = r.get(split_name(B, n_k, "split")), r.get(split_name(B, n_k, "sdpa"))
        if ours is not None and sdpa is not None:
            ratios[f"B={B} N_k={n_k}"] = ours.ms / sdpa.ms
    if ratios:
        worst = max(ratios, key=ratios.get)
        out.append((f"decode attention <= {BAR_SPLIT}x SDPA's time", ratios[worst] <= BAR_SPLIT,
                    f"worst {ratios[worst]:.2f}x at {worst}"))  # fmt: skip
    for B in DECODE_BATCHES:
        bar = f"decode step B={B} in a graph <= {BAR_DECODE}x reduce-overhead's time"
        ratio(bar, decode_name(B, "compile reduce-overhead"), decode_name(B, "fused graph"), BAR_DECODE, False)
    return out


#: the decode step's cases that replay a captured CUDA graph
GRAPH_IMPLS = ("fused graph", "compile reduce-overhead")


def cases(copy_GBps: float | None = None, matmul_TFLOPs: float | None = None, device="cuda",
          live: bool = False, graphs: bool = True) -> list[Case]:  # fmt: skip
    """All lesson 9 cases. ``live``: what a notebook's cell may time within its limit (no
    ``torch.compile``: its compiles of the layer take a minute and more). ``graphs=False``: no case
    replays a captured CUDA graph (the hardware counters' runs, ``benchcli.suite_cases``): a graph
    launches the same kernels as its ungraphed case, so it adds no bytes to count, and under Nsight
    Compute this suite ended in an illegal memory access on both GPUs (benchmarks/notes_lesson9.md,
    "2026-11-27: lesson 9's trips under Nsight Compute"; profiler injection and graphs: pytorch#75504)."""
    ref, lay = make_layers(max(PREFILL[1], N_CACHE), device)
    impls = tuple(i for i in IMPLS if not (live and i == "compile"))
    d_impls = tuple(
        i for i in DECODE_IMPLS if not (live and i.startswith("compile")) and (graphs or i not in GRAPH_IMPLS)
    )
    out = part_cases(ref, lay, copy_GBps, matmul_TFLOPs, device)
    torch.cuda.empty_cache()
    out += layer_cases(ref, lay, copy_GBps, matmul_TFLOPs, device, impls=impls)
    torch.cuda.empty_cache()
    out += decode_cases(ref, lay, copy_GBps, matmul_TFLOPs, device, impls=d_impls)
    out += split_cases(copy_GBps, device, graphs=graphs)
    return out
