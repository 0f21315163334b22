"""Probe: the small kernels around the fused cross-entropy (benchmarks/notes_lesson5.md, 2026-11-24 "the small kernels
around the fused call").

    PYTHONPATH=. python3 benchmarks/probes/probe_ce_reduce.py

Before, torch ran five small kernels around the fused one: ``target != ignore_index`` and its sum
(the mean's count), then the rows' sum, the divide and the cast. The package now runs a one-program
prologue (the count) and a one-program finish kernel (sum, divide, cast). This times both ways, fwd+bwd
bf16 out of place ("mean"), on the GPU clock (queued) and as a call, plus the forward alone (no
gradient). The first version reduced in the loss kernel's last program instead (each program counting
its row with release semantics): slower, see the notes.
"""

from __future__ import annotations

import torch
import triton

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels.cross_entropy import (
    CrossEntropyFunction,
    _launch_split,
    _loss,
    _prologue,
    cross_entropy_config,
    cross_entropy_rows,
)


class TorchAround(CrossEntropyFunction):
    """The previous schedule: torch's count and reduction around the same loss kernel."""

    @staticmethod
    def forward(ctx, logits, target, ignore_index, reduction, label_smoothing, inplace_grad, cfg):
        grad = torch.empty_like(logits)
        rows = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        n_valid = (target != ignore_index).sum()
        if cfg.get("SPLIT"):  # the split kernel needs its zeroed tickets, which only the prologue gives
            sync = _prologue(target, ignore_index, count=True, n_rows_split=logits.shape[0])
            _launch_split(logits, target, grad, rows, sync, ignore_index, 0.0, cfg, True)
        else:
            cross_entropy_rows(logits, target, grad, rows, n_valid, ignore_index, 0.0, cfg, mean=True)
        ctx.save_for_backward(grad, target)
        ctx.ignore_index = ignore_index
        ctx.used = False
        return (rows.sum() / n_valid).to(logits.dtype)


def main():
    copy = bench.measure_copy_bandwidth()
    dev = torch.cuda.get_device_name()
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s")
    for tokens, vocab in ((8192, 32000), (8192, 128256), (4096, 262144)):
        g = torch.Generator(device="cuda").manual_seed(0)
        x = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16, generator=g) * 2
        t = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
        xg = x.clone().requires_grad_()
        nb = 2 * x.numel() * 2
        cfg = cross_entropy_config(vocab, x.dtype)
        ref = torch.nn.functional.cross_entropy(x.float(), t)
        for label, fn in (("torch around", TorchAround), ("shipped", CrossEntropyFunction)):

            def fwd_bwd(fn=fn):
                return torch.autograd.grad(fn.apply(xg, t, -100, "mean", 0.0, False, cfg), xg)

            err = (fn.apply(xg, t, -100, "mean", 0.0, False, cfg).float() - ref).abs().item()
            ms = bench.time_ms(fwd_bwd)
            msq = bench.queued_ms(fwd_bwd)
            line = (
                f"  {tokens:>5} x {vocab:<7} {label:13s} fwd+bwd call {ms:7.4f} ms {nb / ms / 1e6 / copy:6.1%}  "
                f"GPU clock {msq:7.4f} ms {nb / msq / 1e6 / copy:6.1%}  |err| {err:.1e}"
            )
            if label == "shipped":
                msl = bench.time_ms(lambda: _loss(x, t, None, -100, "mean", 0.0, cfg))
                line += f"  forward alone {msl:7.4f} ms {nb / 2 / msl / 1e6 / copy:6.1%}"
            print(line, flush=True)
        x = xg = None


if __name__ == "__main__":
    main()
