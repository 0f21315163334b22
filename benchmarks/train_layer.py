"""Lesson 9 on a GPU: a small model of the package's Llama layers trained beside eager's, loss for loss.

    PYTHONPATH=. python3 benchmarks/train_layer.py [--out $OUT] [--steps 300] [--budget 150]

The proof that every backward is right: :class:`fusionlab.model.TinyLlama` built twice from the same
weights, eager (``LlamaLayerReference`` layers under ``torch.autocast`` bf16, whole logits,
``F.cross_entropy``) and fused (the package's ``LlamaLayer``: RMSNorm, QKV, RoPE, FlashAttention forward
and backward, SwiGLU, the epilogue residuals, ``linear_cross_entropy``), fp32 master weights and bf16
activations in both, trained with AdamW on the same batches of bytes from the repository's own text
(README.md, INSTRUCTORS.md, benchmarks/NOTES.md). Logged every 10 steps: both losses and their
relative difference (the issue's bar: within 2% at every logged step), and the time per step. Stops
after ``--budget`` seconds. JSON goes to ``$OUT/train.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

import fusionlab
from fusionlab import bench
from fusionlab.model import TinyLlama

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ("README.md", "INSTRUCTORS.md", "benchmarks/NOTES.md")
CONFIG = dict(vocab=256, n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, ffn=704, max_positions=512)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--budget", type=float, default=150.0)
    args = p.parse_args()
    t0 = time.time()
    data = torch.tensor(list(b"\n".join((ROOT / t).read_bytes() for t in TEXTS)), dtype=torch.int64)
    meta = {
        **bench.metadata(),
        "command": " ".join(sys.argv),
        "fusionlab": fusionlab.__file__,
        "config": CONFIG,
        "bytes_of_text": len(data),
        **vars(args),
    }
    print(meta, flush=True)
    torch.manual_seed(0)
    eager = TinyLlama(**CONFIG, fused=False, compute_dtype=torch.bfloat16).cuda()
    fused = TinyLlama(**CONFIG, fused=True, compute_dtype=torch.bfloat16).cuda()
    fused.load_reference_state_dict(eager.state_dict())
    models = {"eager": eager, "fused": fused}
    opts = {
        k: torch.optim.AdamW(m.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1) for k, m in models.items()
    }
    gen = torch.Generator().manual_seed(1)
    log, step_s, timed = [], {"eager": 0.0, "fused": 0.0}, 0
    for step in range(args.steps):
        if time.time() - t0 > args.budget:
            print(f"budget spent at step {step}", flush=True)
            break
        starts = torch.randint(0, len(data) - args.seq - 1, (args.batch,), generator=gen)
        batch = torch.stack([data[s : s + args.seq + 1] for s in starts.tolist()]).cuda()
        losses = {}
        for name, model in models.items():
            torch.cuda.synchronize()
            t = time.perf_counter()
            opts[name].zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=name == "eager"):
                loss = model(batch[:, :-1], batch[:, 1:])
            loss.backward()
            opts[name].step()
            losses[name] = loss.item()  # syncs
            if step >= 5:  # past the compiles
                step_s[name] += time.perf_counter() - t
        timed += step >= 5
        if step % 10 == 0 or step == args.steps - 1:
            rel = abs(losses["fused"] - losses["eager"]) / abs(losses["eager"])
            log.append({"step": step, **losses, "rel_diff": rel})
            print(json.dumps(log[-1]), flush=True)
    n = max(1, timed)
    worst = max((r["rel_diff"] for r in log), default=float("nan"))
    result = {
        "meta": meta,
        "log": log,
        "worst_rel_diff": worst,
        "within_2_percent": worst <= 0.02,
        "ms_per_step": {k: 1e3 * v / n for k, v in step_s.items()},
        "seconds": time.time() - t0,
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "train.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"worst relative difference {worst:.4f} (bar 0.02); ms/step {result['ms_per_step']}", flush=True)


if __name__ == "__main__":
    main()
