"""Lesson 9's floor of a decode step: what one token per row must move and compute, before anything runs.

At decode time a layer's matmuls are matrix-vector products (B rows against each weight), so every
weight is read once per step whatever the batch, and attention reads each row's whole KV cache once.
Those two reads are the floor; the activations (a few vectors of ``hidden`` or ``ffn`` per row) are
a rounding error beside them at a real model's shapes. :func:`decode_floor` counts them;
:func:`~fusionlab.model.llama_layer_ledger` (``n_cache=...``) counts every trip of the fused step: it lies
above the floor by the activations' trips, which grow with the batch (a few percent at B 64 with 1k keys,
under a percent at B 1; tests/test_checkers_lesson9.py holds the two together).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..._exercise import answer_key
from ...ledger import Ledger
from ...ledger import dtype_bytes as _dtype_bytes
from ...model import llama_layer_ledger

#: the layers the lesson and its checker count: (name, hidden, query heads, KV heads, FFN)
MODELS = {
    "Llama-3-8B": (4096, 32, 8, 14336),
    "Llama-2-7B": (4096, 32, 32, 11008),
    "Llama-3-70B": (8192, 64, 8, 28672),
}


@dataclass(frozen=True)
class DecodeFloor:
    """The floor of one decode step of one layer, its parts in bytes: the weights, the KV cache read, and
    the rest (the new tokens' k and v written, the layer's input read and output written)."""

    flops: int
    weight_bytes: int
    cache_bytes: int
    other_bytes: int

    @property
    def nbytes(self) -> int:
        return self.weight_bytes + self.cache_bytes + self.other_bytes

    def predict_ms(self, copy_GBps: float, matmul_TFLOPs: float) -> float:
        """The roofline's floor: the longer of the bytes at the copy bandwidth and the FLOPs at the matmul rate."""
        return max(self.nbytes / (copy_GBps * 1e6), self.flops / (matmul_TFLOPs * 1e9))


@answer_key  # exercise 1 asks for it: an answer that calls it is refused
def decode_floor(B: int, n_cache: int, hidden: int, n_heads: int, n_kv_heads: int, ffn: int,
                 dtype_bytes: int = 2) -> DecodeFloor:  # fmt: skip
    """One token per row, ``n_cache`` keys in each row's cache (the new one included):

    - weights: q, k, v (``hidden x (H + 2 H_kv) D``), o (``H D x hidden``), gate, up and down
      (``3 hidden x ffn``), read once whatever B; the two norms' weights (``2 hidden``);
    - the cache: K and V, ``B x H_kv x n_cache x D`` each, read once (the G query heads of a group share
      their KV head: grouped-query attention's saving);
    - the rest: the new k and v written (``2 B H_kv D``), x read and the output written (``2 B hidden``);
    - FLOPs: two per weight per row (``2 B`` x the matmuls' weights), and attention's ``4 B H n_cache D``
      (every query head scores every key and sums every value).
    """
    D = hidden // n_heads
    matmul_weights = hidden * (n_heads + 2 * n_kv_heads) * D + n_heads * D * hidden + 3 * hidden * ffn
    return DecodeFloor(
        flops=2 * B * matmul_weights + 4 * B * n_heads * n_cache * D,
        weight_bytes=(matmul_weights + 2 * hidden) * dtype_bytes,
        cache_bytes=2 * B * n_kv_heads * n_cache * D * dtype_bytes,
        other_bytes=(2 * B * n_kv_heads * D + 2 * B * hidden) * dtype_bytes,
    )


def layer_trip_ledger(B: int, N: int, hidden: int, n_heads: int, n_kv_heads: int, ffn: int,
                      dtype=torch.bfloat16, *, fused_rms_norm: bool | None = None) -> Ledger:  # fmt: skip
    """For the trip animation: the prefill layer's HBM traffic as one :class:`~fusionlab.ledger.Ledger`, eager
    against fused, built from :func:`~fusionlab.model.llama_layer_ledger`'s parts. Eager: one op per part
    (its name says how many kernels eager runs for it), reading the part's inputs and writing its outputs,
    and what its kernels pass each other through HBM as "temporaries" (written, then read back), so each
    op moves exactly the part's eager bytes. Eager's RMSNorm is ``F.rms_norm`` as the layer's ledger counts
    it (``fused_rms_norm``: as there): one kernel writing rstd beside y where torch fuses it. Fused: one step
    per kernel of the package's layer. The weights are read once in both (the ideal tile)."""
    es = _dtype_bytes(dtype)
    T, D = B * N, hidden // n_heads
    nq, nkv, nh, nf = T * n_heads * D, T * n_kv_heads * D, T * hidden, T * ffn
    w_qkv, w_o, w_ffn = hidden * (n_heads + 2 * n_kv_heads) * D, n_heads * D * hidden, 2 * hidden * ffn
    table = N * D // 2  # cos or sin: the kernel's (positions, D / 2) rows
    # part -> (eager reads, fused reads, writes): eager reads x three times for three matmuls, and so on
    io = {
        "attn_norm": ({"x": nh, "attn_norm": hidden}, None, {"n1": nh}),
        "q, k, v projections": ({"n1": 3 * nh, "w_qkv": w_qkv}, {"n1": nh, "w_qkv": w_qkv},
                                {"q": nq, "k": nkv, "v": nkv}),
        "rope": ({"q": nq, "k": nkv, "cos": table, "sin": table}, None, {"q_rot": nq, "k_rot": nkv}),
        "attention": ({"q_rot": nq, "k_rot": nkv, "v": nkv}, None, {"o": nq}),
        "o to rows (copy)": ({"o": nq}, None, {"o_rows": nq}),
        "o_proj + residual": ({"o_rows": nq, "w_o": w_o, "x": nh}, None, {"h": nh}),
        "ffn_norm": ({"h": nh, "ffn_norm": hidden}, None, {"n2": nh}),
        "gate, up projections": ({"n2": 2 * nh, "w_gate_up": w_ffn}, {"n2": nh, "w_gate_up": w_ffn},
                                 {"g": nf, "u": nf}),
        "swiglu": ({"g": nf, "u": nf}, None, {"a": nf}),
        "down_proj + residual": ({"a": nf, "w_down": w_ffn // 2, "h": nh}, None, {"out": nh}),
    }  # fmt: skip
    # torch's fused RMSNorm writes each row's rstd (fp32) beside y, in inference too; the package's does not
    norms = ("attn_norm", "ffn_norm")
    led = Ledger(dtype_bytes=es, outputs=("out",), sizes={f"{n}: rstd": torch.float32 for n in norms})
    for part in llama_layer_ledger(B, N, hidden, n_heads, n_kv_heads, ffn, dtype=dtype, fused_rms_norm=fused_rms_norm):
        reads, fused_reads, writes = io[part.name]
        eager_writes = {**writes, f"{part.name}: rstd": T} if part.name in norms and part.eager_kernels == 1 else writes
        moved = sum(led.size(t) * n for t, n in (*reads.items(), *eager_writes.items()))
        tmp = (part.eager_bytes - moved) // es
        kernels = f"{part.eager_kernels} kernel{'s' if part.eager_kernels > 1 else ''}"
        if tmp > 1:  # what one eager kernel writes and the next reads back
            led.op(f"{part.name} ({kernels})", {**reads, f"{part.name}: temporaries": tmp // 2},
                   {**eager_writes, f"{part.name}: temporaries": tmp - tmp // 2})  # fmt: skip
        else:
            led.op(f"{part.name} ({kernels})", reads, eager_writes)
        led.fused(part.name, fused_reads or reads, writes)
    return led
