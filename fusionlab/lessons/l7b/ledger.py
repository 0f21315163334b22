"""Lesson 7b's ledger of skipped blocks: what a block mask saves, predicted from its lists before anything
runs. The kernel visits ``full + partial`` of the ``T_m x T_n`` (Q tile, key block) pairs; each visit is
two ``BLOCK_M x BLOCK_N x D`` matmuls (``4 BLOCK_M BLOCK_N D`` FLOPs) and one K and one V tile
(``2 BLOCK_N D`` elements). An empty block costs nothing, so FLOPs and K/V bytes scale with the density;
Q, O and lse move once whatever the mask. SDPA given the mask as a boolean tensor reads all ``N_q x N_k``
of it (and something wrote it): :attr:`MaskLedger.sdpa_mask_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...kernels._launch import element_size


@dataclass(frozen=True)
class MaskLedger:
    """FLOPs and HBM bytes of one forward (B x H heads), dense against block-sparse."""

    dense_flops: int  # every (query, key) pair: 4 N_q N_k D per head
    kernel_flops: int  # the visited blocks' matmuls (a partial block's hidden pairs included)
    visible_flops: int  # 4 D per visible pair: the work the mask asks for
    dense_kv_bytes: int  # K and V read once per Q tile, every block
    kernel_kv_bytes: int  # K and V of the visited blocks only
    qo_bytes: int  # Q read, O and lse written: the same either way
    sdpa_mask_bytes: int  # the N_q x N_k boolean mask SDPA must read
    density: float  # visited blocks / all blocks

    @property
    def skipped_flops(self) -> int:
        return self.dense_flops - self.kernel_flops

    @property
    def skipped_bytes(self) -> int:
        return self.dense_kv_bytes - self.kernel_kv_bytes

    def rows(self) -> list[tuple[str, float, float]]:
        """``(what, dense, block-sparse)`` for a table: GFLOPs and MB."""
        return [("matmul GFLOPs", self.dense_flops / 1e9, self.kernel_flops / 1e9),
                ("K, V MB read", self.dense_kv_bytes / 1e6, self.kernel_kv_bytes / 1e6),
                ("Q, O, lse MB", self.qo_bytes / 1e6, self.qo_bytes / 1e6)]  # fmt: skip


def mask_ledger(B: int, H: int, N_q: int, N_k: int, D: int, dtype=torch.bfloat16, *, block_mask=None,
                causal: bool = False, block_m: int = 128, block_n: int = 64) -> MaskLedger:  # fmt: skip
    """The ledger of a block mask (a :class:`~fusionlab.kernels.attention.BlockMask`, whose lists and tiles
    it reads; B' or H' of 1 counts for every batch row or head), or of lesson 7's dense / causal loop
    bounds at ``block_m x block_n`` tiles when there is none."""
    es = element_size(dtype)
    if block_mask is not None:
        bm, bn = block_mask.block_m, block_mask.block_n
        full, part, total = block_mask.blocks()
        reps = B * H // (block_mask.num.shape[0] * block_mask.num.shape[1])
        visited, total, visible = (full + part) * reps, total * reps, block_mask.visible * reps
    else:
        bm, bn = block_m, block_n
        T_m, T_n = -(-N_q // bm), -(-N_k // bn)
        per_head = sum(min(T_n, -(-min((t + 1) * bm, N_k) // bn)) for t in range(T_m)) if causal else T_m * T_n
        visited, total = per_head * B * H, T_m * T_n * B * H
        n = min(N_q, N_k)
        visible = B * H * ((n * (n + 1) // 2 + max(0, N_q - N_k) * N_k) if causal else N_q * N_k)
    T_m = -(-N_q // bm)
    return MaskLedger(
        dense_flops=4 * B * H * N_q * N_k * D,
        kernel_flops=4 * visited * bm * bn * D,
        visible_flops=4 * visible * D,
        dense_kv_bytes=2 * B * H * T_m * N_k * D * es,
        kernel_kv_bytes=2 * visited * bn * D * es,
        qo_bytes=2 * B * H * N_q * D * es + 4 * B * H * N_q,
        sdpa_mask_bytes=N_q * N_k,
        density=visited / total,
    )


def trip_ledger(block_mask, D: int, dtype=torch.bfloat16):
    """For the trip animation: one head of ``block_mask``'s shape, attention with an explicit boolean
    mask op by op (SDPA's math path: the mask written, the scores, the mask read, the softmax, P V) against the
    block-sparse kernel, one fused step per Q tile that reads only the K and V blocks in its lists.
    Returns ``(ledger, notes)``: ``notes`` says, frame by frame, which blocks each Q tile visits and skips.
    """
    from ...ledger import Ledger

    _, _, n_q, n_k = block_mask.shape
    bm, bn = block_mask.block_m, block_mask.block_n
    led = Ledger(dtype_bytes=dtype, outputs=("O",), sizes={"mask": 1})
    s_n = n_q * n_k
    led.op("build the mask", reads={}, writes={"mask": s_n})  # SDPA takes it as a tensor: someone wrote it
    led.op("Q K^T * scale", reads={"Q": n_q * D, "K": n_k * D}, writes={"S": s_n})
    led.op("mask (a boolean N x N)", reads={"S": s_n, "mask": s_n}, writes={"S_masked": s_n})
    led.op("softmax", reads={"S_masked": s_n}, writes={"P": s_n})
    led.op("P V", reads={"P": s_n, "V": n_k * D}, writes={"O": n_q * D})
    notes = ["the block lists are built once per shape: (Q tile, key block) -> full, partial or empty"]
    T_n = block_mask.idx.shape[-1]
    for t in range(block_mask.num.shape[2]):
        nf, np_ = (int(x) for x in block_mask.num[0, 0, t].tolist())
        visits = sorted(block_mask.idx[0, 0, t, 0, :nf].tolist() + block_mask.idx[0, 0, t, 1, :np_].tolist())
        rows = min(bm, n_q - t * bm)
        kv = f"K, V: {len(visits)} of {T_n} blocks"
        led.fused(f"Q tile {t}", reads={f"Q tile {t}": rows * D, kv: 2 * len(visits) * bn * D},
                  writes={f"O tile {t}": rows * D})  # fmt: skip
        notes += [f"Q tile {t}: loads key blocks {visits} ({nf} full, {np_} partial); skips {T_n - len(visits)}"] * 3
    n_frames = len(led.trips(fused=False)) + 1
    notes = (notes + [notes[-1]] * n_frames)[:n_frames]
    return led, notes
