"""Probe: cross-entropy's split rows, part size and where the split starts (benchmarks/notes_lesson5.md,
2026-11-24 "the copy engine, the loss alone's tiles, larger split parts", then
2026-11-25 "the split with the target's reference, shipped").

    PYTHONPATH=. python3 benchmarks/probes/probe_ce_split_tune.py [--quick | --caps | --package | --frag | --below]

The split kernel holds a row in parts of ``SPLIT_BLOCK`` logits, one program each, which swap their
statistics: each row read once, written once. 2026-11-25 "cross-entropy's split with the target's reference, shipped":
the kernel sums against the target's
logit and (bf16) keeps only the bf16 part across its wait (102 registers a thread at parts of 16384, 48
at 8192, against 160), so the part size that wins may have moved, and the split may now beat the
one-tile kernel below 65536 columns. Here, by width: the package's configuration, the split at parts of
8192 and 16384 logits (4 warps), the 2026-11-24 "cross-entropy's loss alone and its split, read faster" section's
split kernel (the probe's copy of it, each part's
own maximum, fp32 part across the wait) beside them, and at 16-bit widths of 65536 and under the
one-tile or head-and-tail kernel the package runs there; fp16 and fp32 at 128256 (no bit widening:
fp32 parts across the wait). fwd+bwd "mean" out of place, GPU clock, share of copy by two trips; each
configuration checked against float64 on 64 rows (every fifth ignored) first.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
import triton

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels import cross_entropy as ce
from fusionlab.kernels.cross_entropy import CrossEntropyFunction, cross_entropy_config

sys.path.insert(0, os.path.dirname(__file__))
from probe_ce_split_persistent import ref_loss, split_loss  # noqa: E402  (the 2026-11-24 and 2026-11-25 kernels)

BF16 = (
    (8192, 128256),
    (4096, 128256),
    (16384, 128256),
    (8192, 151936),
    (4096, 262144),
    (8192, 200064),
    (8192, 98304),
    (8192, 65552),
    (8192, 65536),
    (8192, 49152),
    (8192, 32768),
)
OTHER = ((torch.float16, 8192, 128256), (torch.float32, 4096, 128256), (torch.float16, 8192, 65552))
#: --package: lesson 5's bar covers 4k-16k tokens x 32k-256k columns
WIDTHS = tuple((m, n) for n in (32000, 50257, 65552, 151936, 200064, 262144) for m in (4096, 8192, 16384))
PARTS = ((8192, 4), (16384, 4), (4096, 4), (32768, 8))
#: --caps: register caps (maxnreg) a thread, by part size (4 warps)
CAPS = {8192: (64,), 16384: (96, 104, 128)}


def _regs(cfg, x, t):
    """Registers a thread of the package's split kernel compiled for ``cfg`` (a launch on 64 rows)."""
    xs, ts = x[:64].contiguous(), t[:64].contiguous()
    sync = ce._prologue(ts, -100, count=True, n_rows_split=64)
    loss = torch.empty(64, dtype=torch.float32, device=x.device)
    k = ce._launch_split(xs, ts, torch.empty_like(xs), loss, sync, -100, 0.0, cfg, True)
    return f"regs {k.n_regs} spills {k.n_spills}"


def _check(cfg, x, t, want_g):
    xc = x.clone().requires_grad_()
    (got,) = torch.autograd.grad(CrossEntropyFunction.apply(xc, t, -100, "mean", 0.0, False, cfg), xc)
    return ((got.double() - want_g).norm() / want_g.norm()).item()


def _show(dtype, tokens, vocab, label, ms, share, extra):
    print(f"  {str(dtype)[6:]:8s} {tokens:>5} x {vocab:<6} {label:36s} {ms:7.4f} ms {share:6.1%}  {extra}", flush=True)


def main():
    quick = "--quick" in sys.argv
    caps = "--caps" in sys.argv
    copy = bench.measure_copy_bandwidth()
    dev = torch.cuda.get_device_name()
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s", flush=True)
    shapes = [(torch.bfloat16, m, n) for m, n in BF16] + list(OTHER)
    if quick:
        shapes = shapes[:1] + shapes[7:9]
    package_only = "--package" in sys.argv  # the shipped configuration alone, over the range
    if package_only:
        shapes = [(torch.bfloat16, m, n) for m, n in WIDTHS]
    frag = "--frag" in sys.argv or "--below" in sys.argv  # the split's fragment, and narrower rows
    if frag:
        shapes = [(torch.bfloat16, m, n) for n in (50257, 65552, 32000, 40000) for m in (4096, 8192, 16384)]
    if "--below" in sys.argv:  # under SPLIT_MIN_16: two parts against the head of 8192 (and the H200's rows)
        shapes = [(torch.bfloat16, m, n) for n in (16400, 20000, 24576, 28000, 30000, 32000) for m in (4096, 8192)]
    if caps:  # the ship's choice: the part sizes that won, capped, beside the probe that had no second round
        shapes = [(torch.bfloat16, m, n) for m, n in BF16 if n in (128256, 262144, 65552, 65536, 49152, 32768)]
        shapes += list(OTHER)
    for dtype, tokens, vocab in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(tokens, vocab, device="cuda", generator=g) * 2).to(dtype)
        t = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
        xg = x.clone().requires_grad_()
        ts = t[:64].clone()
        ts[::5] = -100
        xs = x[:64].double().requires_grad_()
        (want_g,) = torch.autograd.grad(F.cross_entropy(xs, ts), xs)
        shipped = cross_entropy_config(vocab, dtype)
        base = {k: v for k, v in shipped.items() if not k.startswith("SPLIT")}
        configs = {"package": shipped}
        if not shipped.get("SPLIT"):
            configs = {f"package ({'one tile' if base.get('EARLY_HEAD') else 'head and tail'})": shipped}
        if frag:
            configs[
                f"{'rows' if base.get('ROWS') else 'one tile' if base.get('EARLY_HEAD') else 'head'} (no split)"
            ] = {k: v for k, v in base.items() if not k.startswith("ROWS") or vocab % 16 == 0}
            block = 16384
            for parts in (triton.cdiv(vocab, block), vocab // block):
                split = {"SPLIT": parts, "SPLIT_BLOCK": block, "SPLIT_WARPS": 4, "SPLIT_EARLY": True}
                if parts and parts * block != vocab and vocab - parts * block <= 2048:
                    label = (
                        f"split {parts} x {block} + fragment {vocab - parts * block}"
                        if parts * block < vocab
                        else f"split {parts} x {block}"
                    )
                    configs[label] = {**base, **split, "SPLIT_MAXNREG": 104}
        for block, warps in () if package_only or frag else PARTS[:2] if caps else PARTS:
            parts = triton.cdiv(vocab, block)
            if parts > 64 or parts < 2:
                continue
            split = {"SPLIT": parts, "SPLIT_BLOCK": block, "SPLIT_WARPS": warps, "SPLIT_EARLY": True}
            configs[f"split {block} w{warps}"] = {**base, **split}
            for cap in CAPS.get(block, ()) if caps else ():
                configs[f"split {block} w{warps} maxnreg {cap}"] = {**base, **split, "SPLIT_MAXNREG": cap}
        nb = 2 * x.numel() * x.element_size()
        for label, cfg in configs.items():
            try:
                err = _check(cfg, x[:64], ts, want_g)

                def fn(cfg=cfg):
                    return torch.autograd.grad(CrossEntropyFunction.apply(xg, t, -100, "mean", 0.0, False, cfg), xg)

                ms = bench.queued_ms(fn)
                regs = _regs(cfg, x, t) if cfg.get("SPLIT") else ""
                _show(dtype, tokens, vocab, label, ms, nb / ms / 1e6 / copy, f"err {err:.1e} {regs}")
            except Exception as e:  # a configuration that does not compile: say so, go on
                what = f"{type(e).__name__} {str(e)[:150]}"
                print(f"  {str(dtype)[6:]:8s} {tokens:>5} x {vocab:<6} {label:36s} failed: {what}")
        # the 2026-11-24 "cross-entropy's loss alone and its split, read faster" section's kernel, for the record
        if vocab > 32768 and not (package_only or frag):
            old = {"block": 32768 // x.element_size(), "warps": 4, "e_bf16": False}
            grad = torch.empty_like(x)
            ms = bench.queued_ms(lambda: split_loss(x, t, grad, old))
            regs = getattr(old.get("compiled"), "n_regs", "?")
            _show(dtype, tokens, vocab, f"old split {old['block']} w4", ms, nb / ms / 1e6 / copy, f"regs {regs}")
            for block in (
                (8192, 16384) if caps and dtype == torch.bfloat16 else ()
            ):  # the 2026-11-25 "the H200's two open misses, measured further" section's probe (no second round)
                probe = {"block": block, "warps": 4, "bitcast": True}
                ms = bench.queued_ms(lambda probe=probe: ref_loss(x, t, grad, probe))
                regs = getattr(probe.get("compiled"), "n_regs", "?")
                _show(dtype, tokens, vocab, f"probe ref {block} w4", ms, nb / ms / 1e6 / copy, f"regs {regs}")
            grad = None
        x = xg = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
