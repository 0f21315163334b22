"""Lesson 9: one Llama-style decoder layer, written plainly in torch and assembled from the course's kernels.

The layer (Llama 2/3, Mistral, Qwen 2: pre-norm, grouped-query attention, rotary embeddings, SwiGLU)::

    h   = x + o_proj(attention(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1)))   n1 = rmsnorm(x)
    out = h + down_proj(silu(gate_proj(n2)) * up_proj(n2))                         n2 = rmsnorm(h)

:class:`LlamaLayerReference` is the spec in plain torch (``F.rms_norm``, ``nn.Linear``, Hugging Face's
rotate-half RoPE, SDPA with ``enable_gqa``), with Hugging Face's parameter names, so a
``LlamaDecoderLayer``'s ``state_dict`` loads into it. :class:`LlamaLayer` runs the same layer on the
package's kernels only, forward and backward:

- RMSNorm: :func:`~fusionlab.kernels.rmsnorm.rmsnorm` (lesson 4);
- the Q, K and V projections as one matmul over the concatenated weight
  (:func:`~fusionlab.kernels.linear.linear`, lesson 6), q and k rotated by
  :func:`~fusionlab.kernels.rope.rope` where they lie in its output (no copy), v read in place (under
  autograd copied out by :class:`SplitHeadsFunction`, whose backward hands back qkv's gradient whole);
- causal attention with GQA: :func:`~fusionlab.kernels.attention.attention` (lessons 7 and 8);
- the output projection (its input, attention's (B, H, N, D) output copied to (B, N, H D) rows) with the
  residual added in its epilogue (lesson 6);
- gate and up as one matmul, :func:`~fusionlab.kernels.swiglu.swiglu` on its two halves (lesson 5);
- the down projection with the residual in its epilogue.

The package's ``linear`` has no backward of its own; :class:`LinearFunction` gives it one from the
package's :func:`~fusionlab.kernels.matmul.matmul` (``dx = dy W``, ``dW = dy^T x``, the residual's
gradient is dy). Three more keep the backward's memory down (:func:`llama_layer_saved` lists what the
forward keeps): :class:`NormLinearFunction` keeps x, not rmsnorm(x), for the QKV and gate/up projections,
and recomputes the norm (what ``torch.compile``'s partitioner does); :class:`SwiGLULinearFunction` keeps
g and u (and silu(g) u: :data:`KEEP_SWIGLU_OUTPUT`) for the down projection, and writes their gradient over
them;
:class:`HeadsLinearFunction` keeps attention's output o, which attention keeps anyway, not the output
projection's (B, N, H D) copy of it.

Decoding (:meth:`LlamaLayer.decode`) writes the new token's k and v into a KV cache at each row's
length inside RoPE's kernel (:func:`~fusionlab.kernels.rope.rope_cache_write`) and runs
:func:`~fusionlab.kernels.attention_decode.attention_decode`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from .kernels._norms import eager_steps
from .kernels._tensors import upstream_grad  # the shared normaliser every backward's gradient goes through
from .kernels.attention import attention, attention_flops, attention_ledger
from .kernels.attention_decode import attention_decode, attention_decode_config, attention_decode_ledger
from .kernels.linear import linear, linear_ledger
from .kernels.linear_cross_entropy import linear_cross_entropy
from .kernels.matmul import matmul
from .kernels.rmsnorm import rmsnorm, rmsnorm_flops, rmsnorm_ledger
from .kernels.rmsnorm_linear import fold_rmsnorm_weight, rmsnorm_linear
from .kernels.rope import rope, rope_cache_write, rope_eager, rope_flops, rope_ledger, rope_tables
from .kernels.swiglu import _swiglu_backward, _swiglu_forward, swiglu, swiglu_flops, swiglu_ledger
from .ledger import Ledger, dtype_bytes

#: Llama-3-8B's layer: hidden 4096, 32 query heads, 8 KV heads (head dim 128), FFN 14336
LLAMA3_8B = dict(hidden=4096, n_heads=32, n_kv_heads=8, ffn=14336, eps=1e-5, rope_base=500000.0)


class _Holder(nn.Module):
    """A named group of submodules (``self_attn``, ``mlp``), as Hugging Face nests them."""


def _rms_weight(n: int) -> nn.Parameter:
    return nn.Parameter(torch.ones(n))


class LlamaLayerReference(nn.Module):
    """The spec in plain torch, Hugging Face's ``LlamaDecoderLayer`` parameter names, no bias anywhere.

    ``forward(x, offset=0)``: ``x`` (B, N, hidden); token n of every row sits at position offset + n;
    causal attention over the N tokens. Rotary tables from :func:`~fusionlab.kernels.rope.rope_tables`
    (``max_positions`` rows), applied as Hugging Face does (:func:`~fusionlab.kernels.rope.rope_eager`).
    """

    def __init__(self, hidden, n_heads, n_kv_heads, ffn, eps=1e-5, rope_base=10000.0, max_positions=4096):
        super().__init__()
        self.hidden, self.n_heads, self.n_kv_heads, self.eps = hidden, n_heads, n_kv_heads, eps
        self.head_dim = hidden // n_heads
        hd = self.head_dim
        self.input_layernorm = _Holder()
        self.input_layernorm.weight = _rms_weight(hidden)
        self.post_attention_layernorm = _Holder()
        self.post_attention_layernorm.weight = _rms_weight(hidden)
        self.self_attn = _Holder()
        self.self_attn.q_proj = nn.Linear(hidden, n_heads * hd, bias=False)
        self.self_attn.k_proj = nn.Linear(hidden, n_kv_heads * hd, bias=False)
        self.self_attn.v_proj = nn.Linear(hidden, n_kv_heads * hd, bias=False)
        self.self_attn.o_proj = nn.Linear(n_heads * hd, hidden, bias=False)
        self.mlp = _Holder()
        self.mlp.gate_proj = nn.Linear(hidden, ffn, bias=False)
        self.mlp.up_proj = nn.Linear(hidden, ffn, bias=False)
        self.mlp.down_proj = nn.Linear(ffn, hidden, bias=False)
        cos, sin = rope_tables(max_positions, hd, rope_base, device="cpu", dtype=torch.float64)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        B, N, _ = x.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        a = self.self_attn
        n1 = F.rms_norm(x, (self.hidden,), self.input_layernorm.weight, self.eps)
        q = a.q_proj(n1).view(B, N, H, D).transpose(1, 2)  # (B, H, N, D)
        k = a.k_proj(n1).view(B, N, Hkv, D).transpose(1, 2)
        v = a.v_proj(n1).view(B, N, Hkv, D).transpose(1, 2)
        q, k = rope_eager(q, k, self.cos.to(x.dtype), self.sin.to(x.dtype), offset)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        h = x + a.o_proj(o.transpose(1, 2).reshape(B, N, H * D))
        n2 = F.rms_norm(h, (self.hidden,), self.post_attention_layernorm.weight, self.eps)
        m = self.mlp
        return h + m.down_proj(F.silu(m.gate_proj(n2)) * m.up_proj(n2))

    def decode(self, x, k_cache, v_cache, cache_len):
        """One decoding step in plain torch, as :meth:`LlamaLayer.decode` (same arguments): the new k and
        v written into the caches at each row's length, then SDPA over the cache with a boolean mask of
        each query's visible keys."""
        B, N, _ = x.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        a = self.self_attn
        n1 = F.rms_norm(x, (self.hidden,), self.input_layernorm.weight, self.eps)
        q = a.q_proj(n1).view(B, N, H, D).transpose(1, 2)
        k = a.k_proj(n1).view(B, N, Hkv, D).transpose(1, 2)
        v = a.v_proj(n1).view(B, N, Hkv, D).transpose(1, 2)
        q, k = rope_eager(q, k, self.cos.to(x.dtype), self.sin.to(x.dtype), cache_len)
        pos = cache_len[:, None] + torch.arange(N, device=x.device)[None, :]  # (B, N)
        rows = torch.arange(B, device=x.device)[:, None]
        k_cache.transpose(1, 2)[rows, pos] = k.transpose(1, 2)
        v_cache.transpose(1, 2)[rows, pos] = v.transpose(1, 2)
        keys = torch.arange(k_cache.shape[2], device=x.device)
        mask = (keys[None, None, :] <= pos[:, :, None])[:, None]  # (B, 1, N, N_max): up to itself
        o = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask, enable_gqa=True)
        h = x + a.o_proj(o.transpose(1, 2).reshape(B, N, H * D))
        n2 = F.rms_norm(h, (self.hidden,), self.post_attention_layernorm.weight, self.eps)
        m = self.mlp
        return h + m.down_proj(F.silu(m.gate_proj(n2)) * m.up_proj(n2))


#: how :func:`weight_grad` reads the transposed operand: "strided" (read in place by the plain kernel) or
#: "copy" (one operand transposed to a row-major copy, so the matmul can take its Hopper TMA path, which
#: needs A's rows contiguous). ``benchmarks/bench_layer.py`` times both: on an H200 (2026-11-27) at the
#: 8B layer's four shapes, 16k tokens, strided took 0.84-5.90 ms and the copies 1.13-6.37 (cuBLAS 0.84-5.83).
WEIGHT_GRAD = "strided"


def weight_grad(dy2: torch.Tensor, x2: torch.Tensor, how: str | None = None) -> torch.Tensor:
    """``dW = dy^T x`` for dy (M, N) and x (M, K): the sum over the M rows of both, so one of them is
    read down its columns. ``"copy"`` makes the narrower of the two a row-major transposed copy (dy^T
    when N <= K, else x^T, then dW^T transposed back); ``"strided"`` hands the matmul dy's transposed
    view."""
    how = WEIGHT_GRAD if how is None else how
    if how == "strided":
        return matmul(dy2.t(), x2)
    if dy2.shape[1] <= x2.shape[1]:
        return matmul(dy2.t().contiguous(), x2)
    return matmul(x2.t().contiguous(), dy2).t().contiguous()


def _grad_rows(dy: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Autograd's gradient as the (M, N) rows a matmul reads: through the shared normaliser (a negated
    view resolved, a strided last dimension copied), then viewed as rows."""
    dy = upstream_grad(dy, dtype)
    return dy.reshape(-1, dy.shape[-1])


def _needs_grad(*ts) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts)


class LinearFunction(torch.autograd.Function):
    """``linear(x, W, residual=r)`` (the residual added in the matmul's epilogue) with a backward of two
    package matmuls: ``dx = dy W`` (M x N by N x K) and ``dW = dy^T x`` (:func:`weight_grad`); the
    residual's gradient is dy itself, no kernel."""

    @staticmethod
    def forward(ctx, x, weight, residual):
        ctx.save_for_backward(x, weight)
        ctx.has_residual = residual is not None
        return linear(x, weight, residual=residual)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dy2 = _grad_rows(dy, x.dtype)
        dx = dw = None
        if ctx.needs_input_grad[0]:
            dx = matmul(dy2, weight).view(x.shape)
        if ctx.needs_input_grad[1]:
            dw = weight_grad(dy2, x.reshape(-1, x.shape[-1]))
        return dx, dw, (dy if ctx.has_residual and ctx.needs_input_grad[2] else None)


def _recomputed_backward(op, a, b, weight, dy, needs):
    """The backward of ``linear(op(a, b), W)`` when ``op``'s output was not kept: recomputed under autograd
    (op's own kernels and backward) for ``dW = dy^T op(a, b)``, then ``op``'s backward takes ``dy W`` to
    ``(da, db)``. ``needs``: autograd's ``needs_input_grad`` for a, b, W. Returns ``(da, db, dW)``."""
    need_a, need_b, need_w = needs[:3]
    with torch.enable_grad():
        ar, br = a.detach().requires_grad_(need_a), b.detach().requires_grad_(need_b)
        t = op(ar, br)
    dy2 = _grad_rows(dy, a.dtype)
    dw = weight_grad(dy2, t.detach().reshape(-1, t.shape[-1])) if need_w else None
    grads = [None, None]
    if need_a or need_b:
        wanted = [i for i, need in enumerate((need_a, need_b)) if need]
        found = torch.autograd.grad(t, [(ar, br)[i] for i in wanted], matmul(dy2, weight).view(t.shape))
        for i, grad in zip(wanted, found, strict=True):
            grads[i] = grad
    return grads[0], grads[1], dw


class NormLinearFunction(torch.autograd.Function):
    """``linear(rmsnorm(x, gamma), W)`` that saves x, not the normalised rows: the backward recomputes
    them (one RMSNorm pass, as ``torch.compile``'s partitioner would) for dW, then runs RMSNorm's own
    backward on the way to dx and dgamma. Saves a (tokens x hidden) activation per norm."""

    @staticmethod
    def forward(ctx, x, gamma, weight, eps):
        ctx.save_for_backward(x, gamma, weight)
        ctx.eps = eps
        return linear(rmsnorm(x, gamma, eps), weight)

    @staticmethod
    def backward(ctx, dy):
        x, gamma, weight = ctx.saved_tensors
        eps = ctx.eps
        dx, dg, dw = _recomputed_backward(lambda a, b: rmsnorm(a, b, eps), x, gamma, weight, dy, ctx.needs_input_grad)
        return dx, dg, dw, None


class SwiGLULinearFunction(torch.autograd.Function):
    """``linear(swiglu(g, u), W, residual=r)`` with g and u the two halves of the gate/up projection's
    output ``gu``, that saves gu, not h = silu(g) u (the (tokens x ffn) activation, the layer's largest).

    The backward, in the order that keeps the fewest (tokens x ffn) tensors alive at once: h recomputed
    (one SwiGLU pass) for ``dW = dy^T h`` and dropped, then ``dh = dy W``, then SwiGLU's backward kernel
    writing dg and du into one (tokens x 2 ffn) gradient, handed back whole (where autograd's two slices
    would write two zero-filled gu-sized tensors and add them). ``overwrite=True`` (the layer's own call,
    whose gu nothing else holds): that gradient is gu itself, each element read before it is written, so
    the backward allocates h and dh only; gu's version is bumped, so a second backward through the same
    graph (``retain_graph``) is refused by autograd's check instead of reading gradients as activations.
    ``keep_h=True``: h is saved in the forward instead of recomputed (memory for a SwiGLU pass)."""

    @staticmethod
    def forward(ctx, gu, weight, residual, overwrite=False, keep_h=False):
        ffn = gu.shape[-1] // 2
        h = _swiglu_forward(gu[..., :ffn], gu[..., ffn:])
        ctx.save_for_backward(gu, weight, h if keep_h else None)
        ctx.has_residual, ctx.overwrite = residual is not None, overwrite
        return linear(h, weight, residual=residual)

    @staticmethod
    def backward(ctx, dy):
        gu, weight, h = ctx.saved_tensors
        ffn = gu.shape[-1] // 2
        g, u = gu[..., :ffn], gu[..., ffn:]
        need_gu, need_w, need_r = ctx.needs_input_grad[:3]
        dy2 = _grad_rows(dy, gu.dtype)
        dw = dgu = None
        if need_w:
            h = _swiglu_forward(g, u) if h is None else h
            dw = weight_grad(dy2, h.view(-1, ffn))
            del h  # a recomputed h lives only for this matmul
        if need_gu:
            dh = matmul(dy2, weight).view(g.shape)
            dgu = gu if ctx.overwrite else torch.empty_like(gu)
            _swiglu_backward(dh, g, u, out=(dgu[..., :ffn], dgu[..., ffn:]))
            if ctx.overwrite:
                torch.autograd.graph.increment_version(gu)
        return dgu, dw, (dy if ctx.has_residual and need_r else None), None, None


class HeadsLinearFunction(torch.autograd.Function):
    """``linear(rows(o), W, residual=r)`` for attention's output o (B, H, N, D), where ``rows(o)`` is its
    (B, N, H D) copy: saves o itself, which attention's backward saves anyway, not a second copy of it
    (SDPA's output is laid out (B, N, H, D), so eager's rows are a view; the package's attention writes
    (B, H, N, D)). The backward copies the rows again for ``dW`` and hands o's gradient back as a
    (B, H, N, D) view of ``dy W``'s rows, which attention's backward reads in place."""

    @staticmethod
    def forward(ctx, o, weight, residual, head_major=False):
        ctx.save_for_backward(o, weight)
        ctx.has_residual, ctx.head_major = residual is not None, head_major
        return linear(_heads_to_rows(o), weight, residual=residual)

    @staticmethod
    def backward(ctx, dy):
        o, weight = ctx.saved_tensors
        B, H, N, D = o.shape
        need_o, need_w, need_r = ctx.needs_input_grad[:3]
        dy2 = _grad_rows(dy, o.dtype)
        do = dw = None
        if need_w:
            dw = weight_grad(dy2, _heads_to_rows(o).view(B * N, H * D))
        if need_o:
            do = matmul(dy2, weight).view(B, N, H, D).transpose(1, 2)
            if ctx.head_major:  # attention's backward takes its TMA path with every input contiguous
                do = do.contiguous()
        return do, dw, (dy if ctx.has_residual and need_r else None), None


def _heads_to_rows(o: torch.Tensor) -> torch.Tensor:
    """Attention's (B, H, N, D) output as the (B, N, H D) rows the output projection reads."""
    B, H, N, D = o.shape
    return o.transpose(1, 2).reshape(B, N, H * D)


class SplitHeadsFunction(torch.autograd.Function):
    """The QKV projection's output (B, N, (H + 2 H_kv) D) as q and k (views, (B, N, heads, D): RoPE reads
    them in place) and v (a copy: attention saves it, and a view would keep all of qkv alive until the
    backward). The backward hands qkv's gradient back whole, one concatenation of dq, dk, dv, where
    autograd's slices would write three zero-filled qkv-sized tensors and add them."""

    @staticmethod
    def forward(ctx, qkv, n_heads, n_kv_heads, head_dim, head_major=False):
        B, N, _ = qkv.shape
        a, b = n_heads * head_dim, (n_heads + n_kv_heads) * head_dim
        ctx.shape = (B, N)
        q = qkv[..., :a].view(B, N, n_heads, head_dim)
        k = qkv[..., a:b].view(B, N, n_kv_heads, head_dim)
        v = qkv[..., b:].view(B, N, n_kv_heads, head_dim)
        # head_major: v's copy laid out (B, H_kv, N, D) (its (B, N, H_kv, D) view returned), as attention's
        # contiguous inputs are
        v = v.transpose(1, 2).contiguous().transpose(1, 2) if head_major else v.contiguous()
        return q, k, v

    @staticmethod
    def backward(ctx, dq, dk, dv):
        B, N = ctx.shape
        grads = (dq, dk, dv)
        if all(g.is_contiguous() for g in grads):  # (B, N, heads, D) rows: one concatenation
            return torch.cat([g.view(B, N, -1) for g in grads], dim=-1), None, None, None, None
        # head-major gradients ((B, H, N, D) memory seen as (B, N, H, D)): each copied once, straight into its
        # columns, where reshape would copy it to rows first and the concatenation copy it again
        widths = [g.shape[2] * g.shape[3] for g in grads]
        dqkv = torch.empty(B, N, sum(widths), dtype=dq.dtype, device=dq.device)
        start = 0
        for g, w in zip(grads, widths, strict=True):
            dqkv[..., start : start + w].view(g.shape).copy_(g)
            start += w
        return dqkv, None, None, None, None


def _as(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Mixed precision: fp32 master weights meet bf16 activations as a bf16 copy (autograd casts the
    gradient back). The weight itself when the dtypes already match, as ``.to`` returns it, without
    ``.to``'s argument parsing (1.1 us a call on a 2-core CPU, four a decode step; 2026-11-27)."""
    return weight if weight.dtype == dtype else weight.to(dtype)


def _linear(x, weight, residual=None):
    weight = _as(weight, x.dtype)
    if _needs_grad(x, weight, residual):
        return LinearFunction.apply(x, weight, residual)
    return linear(x, weight, residual=residual)


#: without autograd, whether :class:`LlamaLayer` runs RMSNorm + projection as lesson 6's
#: :func:`~fusionlab.kernels.rmsnorm_linear.rmsnorm_linear` (gamma folded into a copy of the weight, made
#: once and kept while neither changes; the norm's output never written) instead of rmsnorm then linear.
#: ``benchmarks/probes/probe_layer_parts.py`` times both.
FOLD_NORMS = False


def _norm_linear(x, gamma, weight, eps, folded=None):
    """``linear(rmsnorm(x, gamma), weight)``. ``folded``: a dict the caller keeps, where the weight with gamma
    folded in is cached for :data:`FOLD_NORMS`."""
    w = _as(weight, x.dtype)
    if _needs_grad(x, gamma, w):
        return NormLinearFunction.apply(x, gamma, w, eps)
    if FOLD_NORMS and folded is not None:
        g = gamma.to(x.dtype)
        # the parameters' identity, version (an optimizer's step, a load: in-place writes) and the dtype
        key = (weight.data_ptr(), weight._version, gamma.data_ptr(), gamma._version, x.dtype)
        hit = folded.get(id(weight))
        if hit is None or hit[0] != key:
            hit = folded[id(weight)] = (key, fold_rmsnorm_weight(w, g))
        return rmsnorm_linear(x, g, w, eps, folded_weight=hit[1])
    return linear(rmsnorm(x, gamma, eps), w)


#: how attention's inputs are laid out in :meth:`LlamaLayer.forward`: False, (B, N, H, D) (RoPE's outputs
#: in the projection's order, read by attention as (B, H, N, D) views); True, (B, H, N, D) contiguous (RoPE
#: writes them so, v's copy is made so, and the output projection's backward copies attention's output
#: gradient so), the layout attention's Hopper TMA loads take; None: head-major under autograd only.
#: ``benchmarks/probes/probe_layer_parts.py --ab`` chose None (an H200, 8B layer, 4 x 4096 tokens, three
#: interleaved rounds: fwd+bwd 37.5-38.1 ms head-major against 38.7-38.9 with views; the forward alone
#: 12.31-12.47 against 12.18-12.30)
ATTENTION_HEAD_MAJOR: bool | None = None

#: whether the down projection keeps h = silu(g) u for its weight gradient (a (tokens x ffn) tensor
#: more in memory) instead of recomputing it in the backward (one SwiGLU pass more);
#: ``benchmarks/probes/probe_layer_parts.py`` times both and measures both peaks: kept, 0.4 ms less of
#: fwd+bwd (38.3-38.4 against 38.7-38.9 ms) and 0.28 GiB more at the peak (2.42 against 2.15 GiB,
#: torch.compile's 2.68), on the H200 above
KEEP_SWIGLU_OUTPUT = True


def _swiglu_linear(gu, weight, residual, overwrite=False):
    weight = _as(weight, gu.dtype)
    if _needs_grad(gu, weight, residual):
        return SwiGLULinearFunction.apply(gu, weight, residual, overwrite, KEEP_SWIGLU_OUTPUT)
    ffn = gu.shape[-1] // 2
    return linear(swiglu(gu[..., :ffn], gu[..., ffn:]), weight, residual=residual)


def _heads_linear(o, weight, residual, head_major=False):
    weight = _as(weight, o.dtype)
    if _needs_grad(o, weight, residual):
        return HeadsLinearFunction.apply(o, weight, residual, head_major)
    return linear(_heads_to_rows(o), weight, residual=residual)


class LlamaLayer(nn.Module):
    """:class:`LlamaLayerReference`'s layer on the package's kernels (module docstring), differentiable.

    Parameters: ``attn_norm`` and ``ffn_norm`` (hidden,), ``wqkv`` ((H + 2 H_kv) D, hidden), ``wo``
    (hidden, H D), ``w_gate_up`` (2 ffn, hidden: gate's rows, then up's), ``w_down`` (hidden, ffn).
    :meth:`load_reference_state_dict` takes a :class:`LlamaLayerReference` (or Hugging Face
    ``LlamaDecoderLayer``) ``state_dict`` and concatenates the projections.
    """

    def __init__(self, hidden, n_heads, n_kv_heads, ffn, eps=1e-5, rope_base=10000.0, max_positions=4096):
        super().__init__()
        self.hidden, self.n_heads, self.n_kv_heads, self.ffn, self.eps = hidden, n_heads, n_kv_heads, ffn, eps
        self.head_dim = D = hidden // n_heads
        self.attn_norm = _rms_weight(hidden)
        self.ffn_norm = _rms_weight(hidden)
        self.wqkv = nn.Parameter(torch.empty((n_heads + 2 * n_kv_heads) * D, hidden))
        self.wo = nn.Parameter(torch.empty(hidden, n_heads * D))
        self.w_gate_up = nn.Parameter(torch.empty(2 * ffn, hidden))
        self.w_down = nn.Parameter(torch.empty(hidden, ffn))
        for w in (self.wqkv, self.wo, self.w_gate_up, self.w_down):
            nn.init.normal_(w, std=hidden**-0.5)
        cos, sin = rope_tables(max_positions, D, rope_base, device="cpu")
        self._folded: dict = {}  # FOLD_NORMS's folded weights, by parameter
        self.register_buffer("cos", cos, persistent=False)  # fp32 tables whatever the weights' dtype
        self.register_buffer("sin", sin, persistent=False)

    def _apply(self, fn, recurse=True):
        # .to(dtype) casts every floating buffer: the rotary tables stay fp32 (the kernel computes in fp32
        # and would otherwise read angles rounded to 8 bits), only their device follows the module
        cos, sin = self.cos, self.sin
        super()._apply(fn, recurse)
        self.cos, self.sin = cos.to(self.cos.device), sin.to(self.sin.device)
        return self

    @torch.no_grad()
    def load_reference_state_dict(self, sd: dict) -> LlamaLayer:
        """Copy a reference (Hugging Face-named) ``state_dict`` in: q, k, v stacked into ``wqkv``, gate and
        up into ``w_gate_up``. Returns self."""
        p = "self_attn."
        self.attn_norm.copy_(sd["input_layernorm.weight"])
        self.ffn_norm.copy_(sd["post_attention_layernorm.weight"])
        self.wqkv.copy_(torch.cat([sd[p + "q_proj.weight"], sd[p + "k_proj.weight"], sd[p + "v_proj.weight"]]))
        self.wo.copy_(sd[p + "o_proj.weight"])
        self.w_gate_up.copy_(torch.cat([sd["mlp.gate_proj.weight"], sd["mlp.up_proj.weight"]]))
        self.w_down.copy_(sd["mlp.down_proj.weight"])
        return self

    def _attention_input(self, x, head_major=False):
        """n1 = rmsnorm(x), its QKV projection, and q, k, v as (B, N, heads, D) views of it (under autograd v
        a copy; ``head_major``: a copy laid out (B, H_kv, N, D), without autograd too)."""
        B, N, _ = x.shape
        H, Hkv, D = self.n_heads, self.n_kv_heads, self.head_dim
        qkv = _norm_linear(x, self.attn_norm, self.wqkv, self.eps, self._folded)  # (B, N, (H + 2 Hkv) D)
        if _needs_grad(qkv):
            return SplitHeadsFunction.apply(qkv, H, Hkv, D, head_major)
        q = qkv[..., : H * D].view(B, N, H, D)  # strided views: rope and attention read them in place
        k = qkv[..., H * D : (H + Hkv) * D].view(B, N, Hkv, D)
        v = qkv[..., (H + Hkv) * D :].view(B, N, Hkv, D)
        if head_major:
            v = v.transpose(1, 2).contiguous().transpose(1, 2)
        return q, k, v

    def _mlp(self, h):
        gu = _norm_linear(h, self.ffn_norm, self.w_gate_up, self.eps, self._folded)  # (B, N, 2 ffn)
        # gu is this call's own: its backward may write gu's gradient over it
        return _swiglu_linear(gu, self.w_down, h, overwrite=True)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """``x`` (B, N, hidden) -> (B, N, hidden), causal over the N tokens at positions offset + n."""
        B, N, _ = x.shape
        x = x.contiguous()  # the residual of o_proj's epilogue is read as (B N, hidden) rows
        head_major = ATTENTION_HEAD_MAJOR
        if head_major is None:  # the measured choice: head-major where attention's backward will run
            head_major = _needs_grad(x, self.wqkv, self.attn_norm)
        q, k, v = self._attention_input(x, head_major)
        if head_major:  # RoPE reads the projection's (B, H, N, D) views and writes q and k contiguous so
            q, k = rope(q.transpose(1, 2), k.transpose(1, 2), self.cos, self.sin, offset, layout="bhnd")
        else:  # (B, N, H, D), contiguous: attention reads their (B, H, N, D) views
            q, k = (t.transpose(1, 2) for t in rope(q, k, self.cos, self.sin, offset, layout="bnhd"))
        o, _ = attention(q, k, v.transpose(1, 2), causal=True)  # (B, H, N, D)
        h = _heads_linear(o, self.wo, x, head_major)
        return self._mlp(h)

    @torch.no_grad()
    def decode(self, x, k_cache, v_cache, cache_len):
        """One decoding step: ``x`` (B, N_new, hidden) are each row's next tokens (N_new small), at
        positions ``cache_len[b] + n``; their k and v are written into ``k_cache``, ``v_cache``
        ((B, H_kv, N_max, D), in place) there, and they attend to everything up to themselves. Returns the
        layer's output; the caller advances ``cache_len`` by N_new."""
        B, N, _ = x.shape
        x = x.contiguous()
        q, k, v = self._attention_input(x)
        # RoPE with the cache write fused in: k rotated and v copied to row b's positions cache_len[b] + n
        q = rope_cache_write(q, k, v, self.cos, self.sin, k_cache, v_cache, cache_len, layout="bnhd")
        o = attention_decode(q.transpose(1, 2), k_cache, v_cache, cache_len + N)  # (B, H, N, D)
        h = _linear(o.transpose(1, 2).reshape(B, N, -1), self.wo, residual=x)
        return self._mlp(h)


class TinyLlama(nn.Module):
    """A small language model of these layers, for the proof that every backward is right: trained
    side by side, the fused model's loss curve must follow eager's.

    ``fused=False``: :class:`LlamaLayerReference` layers, ``F.rms_norm`` and ``F.cross_entropy`` of the
    whole logits (eager). ``fused=True``: :class:`LlamaLayer` layers, :func:`~fusionlab.kernels.rmsnorm.rmsnorm`
    and :func:`~fusionlab.kernels.linear_cross_entropy.linear_cross_entropy` (the logits never whole).
    Both embed with ``nn.Embedding``. ``compute_dtype``: the activations' dtype (bf16 for mixed
    precision over fp32 parameters; None: the parameters'). ``forward(tokens, targets)`` returns the
    mean loss. :meth:`load_reference_state_dict` loads an eager model's weights into a fused one."""

    def __init__(self, vocab, n_layers, hidden, n_heads, n_kv_heads, ffn, *, fused=True, eps=1e-5,
                 rope_base=10000.0, max_positions=1024, compute_dtype=None):  # fmt: skip
        super().__init__()
        self.fused, self.eps, self.hidden, self.compute_dtype = fused, eps, hidden, compute_dtype
        layer = LlamaLayer if fused else LlamaLayerReference
        kw = dict(eps=eps, rope_base=rope_base, max_positions=max_positions)
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(layer(hidden, n_heads, n_kv_heads, ffn, **kw) for _ in range(n_layers))
        self.norm = _rms_weight(hidden)
        self.lm_head = nn.Parameter(torch.randn(vocab, hidden) * hidden**-0.5)

    @torch.no_grad()
    def load_reference_state_dict(self, sd: dict) -> TinyLlama:
        self.embed.weight.copy_(sd["embed.weight"])
        self.norm.copy_(sd["norm"])
        self.lm_head.copy_(sd["lm_head"])
        for i, layer in enumerate(self.layers):
            prefix = f"layers.{i}."
            layer.load_reference_state_dict({k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)})
        return self

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.compute_dtype is not None:
            x = x.to(self.compute_dtype)
        for layer in self.layers:
            x = layer(x)
        if self.fused:
            h = rmsnorm(x, self.norm, self.eps)
            return linear_cross_entropy(h.view(-1, self.hidden), self.lm_head.to(h.dtype), targets.reshape(-1))
        h = F.rms_norm(x, (self.hidden,), self.norm.to(x.dtype), self.eps)
        logits = F.linear(h, self.lm_head.to(h.dtype))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.reshape(-1))


@dataclass(frozen=True)
class LayerPart:
    """One step of the layer's forward: its FLOPs, and the bytes and kernels of eager's schedule
    (:class:`LlamaLayerReference`) and of :class:`LlamaLayer`'s."""

    name: str
    flops: int
    eager_bytes: int
    fused_bytes: int
    eager_kernels: int
    fused_kernels: int

    def predict_ms(self, tflops: float, gbps: float, fused: bool = True) -> float:
        """The roofline's floor: the longer of the FLOPs at ``tflops`` and the bytes at ``gbps``."""
        nbytes = self.fused_bytes if fused else self.eager_bytes
        return max(self.flops / (tflops * 1e9), nbytes / (gbps * 1e6))


def _decode_ledger(B, H, H_kv, N, n_cache, D, dtype):
    cfg = attention_decode_config(B, H, H_kv, N, n_cache, D)
    return attention_decode_ledger(B, H, H_kv, N, n_cache, D, dtype, splits=cfg["SPLITS"],
                                   last_combines=cfg["LAST_COMBINES"])  # fmt: skip


def torch_fuses_rms_norm() -> bool:
    """Whether ``F.rms_norm`` (the reference layer's norm) runs as one kernel on a CUDA GPU with this torch.

    torch's ``rms_norm`` (aten/src/ATen/native/layer_norm.cpp, ``rms_norm_symint``) calls
    ``at::_fused_rms_norm`` unless the input is channels-last or complex or the weight's dtype differs from
    the input's; that op has a CUDA kernel (``_fused_rms_norm_cuda``, aten/src/ATen/native/cuda/
    layer_norm_kernel.cu, pytorch/pytorch#153666) and elsewhere only a composite one: on a CPU it runs
    ``rms_norm_composite``, eight aten ops in bf16. The rule: a torch built with CUDA is asked whether the op
    has a CUDA kernel; a CPU-only build registers no CUDA kernels and cannot tell, so there the op's
    existence stands for it. tests/test_layer.py holds the rule to what ``F.rms_norm`` dispatches on a GPU."""
    if not hasattr(torch.ops.aten, "_fused_rms_norm"):
        return False
    if torch.backends.cuda.is_built():
        return torch._C._dispatch_has_kernel_for_dispatch_key("aten::_fused_rms_norm", "CUDA")
    return True


#: ``rms_norm_composite``'s fp32 tensors (x upcast, its square, the row statistics, the products)
_RMS_F32 = ("hf", "sq", "var", "rs", "hn", "y32")


def _eager_rms_norm(rows: int, n: int, dtype, fused: bool) -> tuple[int, int]:
    """``F.rms_norm`` of ``rows`` rows of ``n`` (weight in x's dtype, no residual) as torch runs it on a CUDA
    GPU: ``(bytes, kernels)``.

    Fused (``_fused_rms_norm_cuda``): one kernel, ``vectorized_layer_norm_kernel`` with ``rms_norm`` set
    (rows of a multiple of 4 elements, 16-byte aligned, at most 2**24: a Llama layer's), which reads x and w
    and writes y and rstd (``rows`` fp32): the op always allocates rstd and the kernel writes it, in
    inference too. The same trips as lesson 4's kernel with ``stats=True``, so that ledger counts them, x read
    once (the kernel reads its row again to write y: assumed served from cache, not measured). Op by op
    (``rms_norm_composite``, what a CPU runs): x to fp32, pow, mean, add eps, rsqrt, times rstd, times w (in
    fp32: w promotes), back to x's dtype; lesson 4's :func:`~fusionlab.kernels.rmsnorm.rmsnorm_eager` is
    Hugging Face's order instead (back to x's dtype, then times w), as many kernels and fewer bytes."""
    if fused:
        return rmsnorm_ledger(rows, n, dtype, residual=False, stats=True, block=n).fused_bytes, 1
    low = dtype_bytes(dtype) != 4  # fp16/bf16: the upcast and the cast back are kernels; fp32: no-ops
    hf, y = ("hf", "y32") if low else ("x", "y")
    led = Ledger(dtype_bytes=dtype, sizes={"w": dtype, **dict.fromkeys(_RMS_F32, torch.float32)})
    steps = [low and "to fp32: x -> hf", f"pow: {hf} -> sq", "mean: sq -> var", "add eps: var -> var",
             "rsqrt: var -> rs", f"mul rstd: {hf} rs -> hn", f"mul w: hn w -> {y}",
             low and "to dtype: y32 -> y"]  # fmt: skip
    eager_steps(led, steps, rows, n, per_row=("var", "rs"))
    return led.unfused_bytes, len(led.ops)


def llama_layer_ledger(B: int, N: int, hidden: int, n_heads: int, n_kv_heads: int, ffn: int, dtype=torch.bfloat16,
                       *, n_cache: int | None = None, fused_rms_norm: bool | None = None,
                       **_) -> list[LayerPart]:  # fmt: skip
    """The forward, part by part, for ``B x N`` tokens (``**LLAMA3_8B`` fits the keywords): each op's own
    ledger (its module's ``*_ledger``), so the layer's count is the sum of the lessons' counts.

    ``n_cache``: a decoding step instead, the N new tokens of each row attending to a KV cache of
    ``n_cache`` keys: eager writes k and v into the cache with two indexed copies after RoPE, the fused
    step inside RoPE's kernel (:func:`~fusionlab.kernels.rope.rope_cache_write`); attention reads the
    cache once in both (SDPA's flash path; with a mask it may take a slower one), split over programs
    in the fused step (:func:`~fusionlab.kernels.attention_decode.attention_decode_ledger`).

    Eager runs the projections as separate matmuls (q, k, v: three; gate, up: two), each reading its
    input, and adds the residuals in kernels of their own; the package's layer runs one matmul for QKV
    and one for gate/up, and adds the residuals in the epilogues. Both run flash attention (SDPA's, the
    package's: the same trips) and copy attention's output to (B, N, H D) rows. Eager's RMSNorm is
    ``F.rms_norm`` as torch runs it on a CUDA GPU: one kernel where this torch has the fused op
    (``fused_rms_norm``, default :func:`torch_fuses_rms_norm`), op by op otherwise (:func:`_eager_rms_norm`).
    Eager's RoPE is counted op by op as :func:`~fusionlab.kernels.rope.rope_eager` runs it. The matmuls'
    weights are read once (the ideal tile: :func:`~fusionlab.kernels.matmul.matmul_ledger` counts the
    re-reads)."""
    T, D = B * N, hidden // n_heads
    if fused_rms_norm is None:
        fused_rms_norm = torch_fuses_rms_norm()
    es = dtype_bytes(dtype)
    parts = []

    def add(name, flops, eager, fused, ek, fk):
        parts.append(LayerPart(name, int(flops), int(eager), int(fused), ek, fk))

    def norm(name):  # eager: F.rms_norm; fused: the package's kernel, in inference (no rstd written)
        eager, kernels = _eager_rms_norm(T, hidden, dtype, fused_rms_norm)
        fused = rmsnorm_ledger(T, hidden, dtype, residual=False).fused_bytes
        add(name, rmsnorm_flops(T, hidden, residual=False), eager, fused, kernels, 1)

    def matmuls(name, k, widths, residual=False):
        # eager: one matmul per width, each reading x; fused: one matmul over the stacked weights
        eager = sum(linear_ledger(T, k, n, dtype, bias=False, activation=None).unfused_bytes for n in widths)
        fused = linear_ledger(T, k, sum(widths), dtype, bias=False, activation=None, residual=residual)
        if residual:  # eager's add: reads the matmul's output and the residual, writes the sum
            eager += 3 * T * sum(widths) * es
        add(name, 2 * T * k * sum(widths), eager, fused.fused_bytes, len(widths) + residual, 1)

    norm("attn_norm")
    matmuls("q, k, v projections", hidden, [n_heads * D, n_kv_heads * D, n_kv_heads * D])
    led = rope_ledger(T * n_heads * D, T * n_kv_heads * D, T * D, dtype)
    rope_flop = rope_flops(T * n_heads * D, T * n_kv_heads * D)
    if n_cache is None:
        add("rope", rope_flop, led.unfused_bytes, led.fused_bytes, led.kernels_unfused, 1)
        flash = attention_ledger(B, n_heads, N, N, D, dtype, causal=True, h_kv=n_kv_heads).fused_bytes
        add("attention", attention_flops(B, n_heads, N, N, D, causal=True), flash, flash, 1, 1)
    else:
        kv_new = T * n_kv_heads * D  # the new tokens' k (or v)
        # eager: RoPE's ops, then each indexed copy reads the new k (v) and writes it into the cache; fused:
        # RoPE's kernel reads v too and writes k and v into the cache instead of a fresh k
        add("rope + cache write", rope_flop, led.unfused_bytes + 4 * kv_new * es, led.fused_bytes + 2 * kv_new * es,
            led.kernels_unfused + 2, 1)  # fmt: skip
        n_kv = B * n_kv_heads * n_cache * D * es * 2
        split = _decode_ledger(B, n_heads, n_kv_heads, N, n_cache, D, dtype)
        add("attention (KV cache)", 4 * B * n_heads * N * n_cache * D, n_kv + 2 * T * n_heads * D * es,
            split.fused_bytes, 1, 2 if split.schedule[-1][0] == "combine" else 1)  # fmt: skip
    if N > 1:  # one token a row: attention's (B, H, 1, D) output is already (B, 1, H D) rows, no copy
        add("o to rows (copy)", 0, 2 * T * n_heads * D * es, 2 * T * n_heads * D * es, 1, 1)
    matmuls("o_proj + residual", n_heads * D, [hidden], residual=True)
    norm("ffn_norm")
    matmuls("gate, up projections", hidden, [ffn, ffn])
    led = swiglu_ledger(T * ffn, dtype)
    add("swiglu", swiglu_flops(T * ffn), led.unfused_bytes, led.fused_bytes, led.kernels_unfused, 1)
    matmuls("down_proj + residual", ffn, [hidden], residual=True)
    return parts


def llama_layer_saved(B: int, N: int, hidden: int, n_heads: int, n_kv_heads: int, ffn: int, dtype=torch.bfloat16,
                      *, keep_h: bool | None = None, **_) -> dict[str, int]:  # fmt: skip
    """Bytes :class:`LlamaLayer`'s forward keeps for its backward at ``B x N`` tokens, tensor by tensor (its
    parameters and rotary tables aside): the layer's input x (the QKV projection recomputes rmsnorm(x)
    from it), RoPE's q and k (attention's inputs), v, attention's output o (which the output projection
    saves too: one tensor) and its fp32 log-sum-exp, h (the gate/up projection recomputes rmsnorm(h)),
    and the gate/up output gu, and h = silu(g) u where ``keep_h`` (None: :data:`KEEP_SWIGLU_OUTPUT`; else the
    down projection recomputes it). Eager's layer keeps, besides, both norms' outputs, the QKV outputs
    before RoPE, and silu(g)."""
    T, D, es = B * N, hidden // n_heads, dtype_bytes(dtype)
    keep_h = KEEP_SWIGLU_OUTPUT if keep_h is None else keep_h
    return {
        "x": T * hidden * es,
        "q (roped)": T * n_heads * D * es,
        "k (roped)": T * n_kv_heads * D * es,
        "v": T * n_kv_heads * D * es,
        "o": T * n_heads * D * es,
        "lse": B * n_heads * N * 4,
        "h": T * hidden * es,
        "gate, up": T * 2 * ffn * es,
        **({"silu(g) u": T * ffn * es} if keep_h else {}),
    }


__all__ = ["LLAMA3_8B", "WEIGHT_GRAD", "HeadsLinearFunction", "LayerPart", "LinearFunction", "LlamaLayer",
           "LlamaLayerReference", "NormLinearFunction", "SplitHeadsFunction", "SwiGLULinearFunction", "TinyLlama",
           "llama_layer_ledger", "llama_layer_saved", "torch_fuses_rms_norm", "weight_grad"]  # fmt: skip
