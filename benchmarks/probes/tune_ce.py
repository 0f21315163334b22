"""Cross-entropy's reference and launch shape, swept on a GPU (benchmarks/notes_lesson5.md, 2026-11-24 "why cross-
entropy stopped near 80%, and the fixed reference").

    PYTHONPATH=. python3 benchmarks/probes/tune_ce.py --out $OUT [--budget 400]
    PYTHONPATH=. python3 benchmarks/probes/tune_ce.py --one 8192 128256 0|1   (a few calls, for ncu to profile)

Fused fwd+bwd, bf16, out of place (read the logits, write the gradient), as a fraction of the copy
bandwidth measured in the same run, beside the loss alone (one read). T0: sums against the head's
maximum with a running maximum per lane (about ten ALU operations an element beside the exp2); T1
(REF_TARGET): sums against the target's logit, no maximum (four). LOOP_STAGES: sweep 1's tail loop
pipelined by Triton through shared memory; PREFETCH2: sweep 2's next tile loaded into registers
ahead. Every configuration is checked against float64 on a slice of rows before it is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as F

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels.cross_entropy import CrossEntropyFunction, cross_entropy_config, cross_entropy_rows

SHAPES = [(8192, 32000), (8192, 128256), (4096, 262144), (4096, 32000), (4096, 50257), (8192, 151936)]
#: --quick: the suite's two shapes and the widest
QUICK = [(8192, 32000), (8192, 128256), (4096, 262144)]
#: (HEAD, BLOCK_N, num_warps, PREFETCH, EVICT, extra, rows): extra: the kernel's other options
#: (LOOP_STAGES, PREFETCH2); rows: "narrow" (V <= 65536) or "wide", where it is tried.
#: None: the shipped configuration for each vocabulary.
CONFIGS = [
    None,
    (8192, 4096, 8, False, True, {"LOOP_STAGES": 4, "PREFETCH2": True}, "narrow"),
    (16384, 4096, 8, False, True, {"LOOP_STAGES": 3, "PREFETCH2": True}, "narrow"),
    (8192, 8192, 16, False, True, {"LOOP_STAGES": 3, "PREFETCH2": True}, "narrow"),
    (8192, 8192, 32, False, True, {"LOOP_STAGES": 3, "PREFETCH2": True}, "wide"),
    (8192, 4096, 16, False, True, {"LOOP_STAGES": 3, "PREFETCH2": True}, "wide"),
    (16384, 8192, 32, False, True, {"LOOP_STAGES": 3, "PREFETCH2": True}, "wide"),
    (32768, 8192, 32, False, True, {"PREFETCH2": True}, "wide"),
]
REFS = (False, True)  # REF_TARGET


def inputs(tokens, vocab, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16, generator=gen) * 2
    t = torch.randint(0, vocab, (tokens,), device="cuda", generator=gen)
    return x, t


def cfg_for(vocab, conf, ref):
    cfg = dict(cross_entropy_config(vocab, torch.bfloat16))
    if conf is not None:
        head, block_n, warps, prefetch, evict, extra, _ = conf
        cfg.update(HEAD=head, BLOCK_N=min(block_n, head), num_warps=warps, PREFETCH=prefetch, EVICT=evict, **extra)
    cfg["REF_TARGET"] = ref
    return cfg


def fwd_bwd(xg, t, cfg):
    return lambda: torch.autograd.grad(CrossEntropyFunction.apply(xg, t, -100, "mean", 0.0, False, cfg), xg)


def loss_only(x, t, cfg):
    rows = torch.empty(x.shape[0], device="cuda")

    def run():
        cross_entropy_rows(x, t, None, rows, None, -100, 0.0, cfg, mean=False)

    return run


def check(x, t, cfg):
    """float64 loss and gradient on the first 64 rows (and the last one)."""
    idx = torch.cat([torch.arange(64, device="cuda"), torch.tensor([x.shape[0] - 1], device="cuda")])
    xs, ts = x[idx].clone().requires_grad_(), t[idx]
    loss = CrossEntropyFunction.apply(xs, ts, -100, "mean", 0.0, False, cfg)
    (g,) = torch.autograd.grad(loss, xs)
    xr = x[idx].double().requires_grad_()
    lr = F.cross_entropy(xr, ts)
    (gr,) = torch.autograd.grad(lr, xr)
    el = abs(loss.double().item() - lr.item()) / abs(lr.item())
    eg = ((g.double() - gr).norm() / gr.norm()).item()
    return el, eg


def one(tokens, vocab, ref):
    x, t = inputs(tokens, vocab)
    xg = x.clone().requires_grad_()
    f = fwd_bwd(xg, t, cfg_for(vocab, None, bool(ref)))
    for _ in range(5):
        f()
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/tune_ce"))
    ap.add_argument("--budget", type=float, default=400)
    ap.add_argument("--one", nargs=3, type=int)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    if a.one:
        one(*a.one)
        return
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    copy = bench.measure_copy_bandwidth()
    name = torch.cuda.get_device_name()
    print(f"{name}, torch {torch.__version__}, copy {copy:.0f} GB/s", flush=True)
    results = []
    for tokens, vocab in QUICK if a.quick else SHAPES:
        x, t = inputs(tokens, vocab)
        xg = x.clone().requires_grad_()
        two = 2 * x.numel() * 2
        print(
            f"--- {tokens} x {vocab}: fwd+bwd call (2 trips) | its GPU time (queued) | loss only (1 trip), % of copy",
            flush=True,
        )
        for conf in CONFIGS:
            if conf is not None and (conf[6] == "wide") != (vocab > 65536):
                continue  # each schedule only on the rows it is meant for
            for ref in REFS if conf is None else (True,):
                if time.time() - t0 > a.budget:
                    print("(budget spent)", flush=True)
                    break
                cfg = cfg_for(vocab, conf, ref)
                label = "default" if conf is None else "H{} B{} w{} pf{} ev{} ".format(*map(int, conf[:5]))
                label += "" if conf is None else " ".join(f"{k[:5]}{v}" for k, v in conf[5].items())
                try:
                    el, eg = check(x, t, cfg)
                    ms = bench.time_ms(fwd_bwd(xg, t, cfg))
                    msq = bench.queued_ms(fwd_bwd(xg, t, cfg))
                    with torch.no_grad():
                        ms1 = bench.time_ms(loss_only(x, t, cfg))
                except Exception as e:  # registers, shared memory: say so, go on
                    print(f"  {label:44s} T{int(ref)}: failed {type(e).__name__}: {str(e)[:160]}", flush=True)
                    continue
                frac, frac1 = bench.gbps(two, ms) / copy, bench.gbps(two / 2, ms1) / copy
                fracq = bench.gbps(two, msq) / copy
                ok = "" if (el < 2e-2 and eg < 2e-2) else f"  WRONG loss {el:.1e} grad {eg:.1e}"
                print(
                    f"  {label:44s} T{int(ref)}: {ms:7.3f} ms {frac:6.1%} | GPU {msq:7.3f} ms {fracq:6.1%}"
                    f" | {ms1:7.3f} ms {frac1:6.1%}"
                    f"  err {el:.0e}/{eg:.0e}{ok}",
                    flush=True,
                )
                results.append(
                    dict(
                        tokens=tokens,
                        vocab=vocab,
                        conf=conf and list(conf),
                        ref=ref,
                        ms=ms,
                        frac=frac,
                        ms_loss=ms1,
                        frac_loss=frac1,
                    )
                )
        del x, xg
        torch.cuda.empty_cache()
    meta = {"device": name, "torch": torch.__version__, "copy_GBps": copy, "date": time.strftime("%Y-%m-%d")}
    with open(os.path.join(a.out, "tune_ce.json"), "w") as f:
        json.dump({"meta": meta, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
