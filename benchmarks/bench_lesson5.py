"""Lesson 5 on a GPU, in one run: SwiGLU, cross-entropy and linear + cross-entropy against eager and
torch.compile, as fractions of the measured copy bandwidth, with peak memory; a tuning sweep of the
cross-entropy kernel; then the GPU tests. Prints a compact table last; writes JSON and a log to $OUT.

    PYTHONPATH=. python3 benchmarks/bench_lesson5.py [--sections swiglu,ce,tune,lce,tests] [--budget 280]

Every section checks the time left (``--budget`` seconds from the start) and is skipped, saying so,
when too little is left. Timings: ``fusionlab.bench.time_ms`` (do_bench median, L2 flushed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import fusionlab  # noqa: F401  (decides the mode before any kernel is defined)
from fusionlab import bench, runtime
from fusionlab.kernels.cross_entropy import (
    CrossEntropyFunction,
    cross_entropy,
    cross_entropy_config,
    cross_entropy_ledger,
    cross_entropy_rows,
)
from fusionlab.kernels.linear_cross_entropy import linear_cross_entropy, linear_cross_entropy_eager
from fusionlab.kernels.swiglu import _swiglu_backward, swiglu, swiglu_eager, swiglu_ledger

OUT = os.environ.get("OUT", "/tmp/bench_lesson5")
T0 = time.time()
RESULTS: list[dict] = []
TABLE: list[str] = []


def left(budget):
    return budget - (time.time() - T0)


def record(section, **kw):
    kw = {"section": section, **kw}
    RESULTS.append(kw)
    print(json.dumps(kw), flush=True)


def line(s):
    TABLE.append(s)
    print(s, flush=True)


# -- SwiGLU ---------------------------------------------------------------------------------------------
def sec_swiglu(copy, budget):
    line("SwiGLU (8192 x 14336)            fwd ms  %copy  vs eager  vs compiled | bwd ms  %copy  vs eager  vs compiled")
    for dtype in (torch.bfloat16, torch.float32):
        if left(budget) < 60:
            line("  (skipped: time)")
            return
        _swiglu_one(dtype, copy)
        torch.cuda.empty_cache()


def _swiglu_one(dtype, copy):
    rows, cols = 8192, 14336
    g = torch.randn(rows, cols, device="cuda", dtype=dtype)
    u = torch.randn(rows, cols, device="cuda", dtype=dtype)
    dh = torch.randn(rows, cols, device="cuda", dtype=dtype)
    n = g.numel()
    fb, bb = swiglu_ledger(n, dtype).fused_bytes, swiglu_ledger(n, dtype, backward=True).fused_bytes
    t = {"fused": bench.time_ms(lambda: swiglu(g, u)), "eager": bench.time_ms(lambda: swiglu_eager(g, u))}
    gr, ur = g.clone().requires_grad_(), u.clone().requires_grad_()
    hf, he = swiglu(gr, ur), swiglu_eager(gr, ur)
    tb = {
        "fused_kernel": bench.time_ms(lambda: _swiglu_backward(dh, g, u)),
        "fused": bench.time_ms(lambda: torch.autograd.grad(hf, (gr, ur), dh, retain_graph=True)),
        "eager": bench.time_ms(lambda: torch.autograd.grad(he, (gr, ur), dh, retain_graph=True)),
    }
    # compiled: the inference graph for the forward, the training graph for the backward
    comp = bench.compiled(swiglu_eager, g, u)
    t["compiled"] = bench.time_ms(lambda: comp(g, u))
    comp_t = torch.compile(swiglu_eager, dynamic=False)
    hc = comp_t(gr, ur)
    torch.autograd.grad(hc, (gr, ur), dh, retain_graph=True)
    tb["compiled"] = bench.time_ms(lambda: torch.autograd.grad(hc, (gr, ur), dh, retain_graph=True))
    ff = bench.gbps(fb, t["fused"]) / copy
    fbk = bench.gbps(bb, tb["fused_kernel"]) / copy
    record("swiglu", dtype=str(dtype), fwd=t, bwd=tb, fwd_frac_copy=ff, bwd_frac_copy=fbk)
    line(
        f"  {str(dtype)[6:]:<9} fused            {t['fused']:7.3f}  {ff:5.1%}  {t['eager'] / t['fused']:7.2f}x  "
        f"{t.get('compiled', float('nan')) / t['fused']:9.3f}x | {tb['fused_kernel']:6.3f}  {fbk:5.1%}  "
        f"{tb['eager'] / tb['fused']:7.2f}x  {tb.get('compiled', float('nan')) / tb['fused']:9.3f}x"
        f"  (bwd via autograd {tb['fused']:.3f} ms)"
    )


# -- cross-entropy ------------------------------------------------------------------------------------------
def _ce_inputs(tokens, vocab, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16, generator=gen) * 2
    t = torch.randint(0, vocab, (tokens,), device="cuda", generator=gen)
    return x, t


def _ce_fused(xg, t, cfg=None, inplace=False):
    if cfg is None:
        return lambda: torch.autograd.grad(cross_entropy(xg, t, inplace_grad=inplace), xg)
    return lambda: torch.autograd.grad(CrossEntropyFunction.apply(xg, t, -100, "mean", 0.0, inplace, cfg), xg)


CE_SHAPES = [
    (4096, 32000),
    (8192, 32000),
    (4096, 50257),
    (8192, 128256),
    (16384, 128256),
    (8192, 151936),
    (4096, 262144),
    (16384, 262144),
]
CE_COMPILED = set(CE_SHAPES)


def sec_ce(copy, budget, compiled_shapes=CE_COMPILED):
    line(
        "cross-entropy bf16 fwd+bwd   fused ms  %copy(2 trips)  in-place ms  %copy  vs eager  vs compiled | "
        "extra mem: fused  in-place  eager  compiled (x logits) | fwd-only vs eager"
    )
    for tokens, vocab in CE_SHAPES:
        if left(budget) < 45:
            line("  (skipped the rest: time)")
            return
        _ce_one(tokens, vocab, copy, budget, compiled_shapes)
        torch.cuda.empty_cache()


def _ce_one(tokens, vocab, copy, budget, compiled_shapes):
    x, t = _ce_inputs(tokens, vocab)
    logits_bytes = x.numel() * 2
    two = 2 * logits_bytes
    xg = x.clone().requires_grad_()
    xi = x.clone().requires_grad_()
    ms = {"fused": bench.time_ms(_ce_fused(xg, t)), "inplace": bench.time_ms(_ce_fused(xi, t, inplace=True))}
    tuned = _tuned_cfg(vocab)
    if tuned is not None:
        ms["tuned_fused"] = bench.time_ms(_ce_fused(xg, t, tuned))
        ms["tuned_inplace"] = bench.time_ms(_ce_fused(xi, t, tuned, inplace=True))
    ms["eager"] = bench.time_ms(lambda: torch.autograd.grad(F.cross_entropy(xg, t), xg))
    with torch.no_grad():
        ms["fwd_fused"] = bench.time_ms(lambda: cross_entropy(x, t))
        ms["fwd_eager"] = bench.time_ms(lambda: F.cross_entropy(x, t))
    mem = {
        # beyond the logits and the gradient they return (in place: beyond the logits)
        "fused": bench.peak_bytes(_ce_fused(xg, t)) - logits_bytes,
        "inplace": bench.peak_bytes(_ce_fused(xi, t, inplace=True)),
        "eager": bench.peak_bytes(lambda: torch.autograd.grad(F.cross_entropy(xg, t), xg)) - logits_bytes,
    }
    if (tokens, vocab) in compiled_shapes and left(budget) > 120:
        comp = torch.compile(lambda a, b: F.cross_entropy(a, b), dynamic=False)
        torch.autograd.grad(comp(xg, t), xg)
        ms["compiled"] = bench.time_ms(lambda: torch.autograd.grad(comp(xg, t), xg))
        mem["compiled"] = bench.peak_bytes(lambda: torch.autograd.grad(comp(xg, t), xg)) - logits_bytes
    frac = bench.gbps(two, ms["fused"]) / copy
    frac_in = bench.gbps(two, ms["inplace"]) / copy
    cfg = cross_entropy_config(vocab, torch.bfloat16)
    floor = cross_entropy_ledger(tokens, vocab, torch.bfloat16, head=vocab).fused_bytes
    reread = cross_entropy_ledger(tokens, vocab, torch.bfloat16, gpu=True).fused_bytes - floor
    honest = bench.gbps(two + reread, ms["inplace"]) / copy
    best = min(ms["fused"], ms["inplace"])
    tuned_best = min(ms.get("tuned_fused", 1e9), ms.get("tuned_inplace", 1e9))
    record(
        "ce",
        tokens=tokens,
        vocab=vocab,
        ms=ms,
        mem=mem,
        frac_copy=frac,
        frac_copy_inplace=frac_in,
        frac_copy_inplace_with_reread=honest,
        cfg=cfg,
    )
    comp_ratio = ms.get("compiled", float("nan")) / best
    line(
        f"  {tokens:>5} x {vocab:<6}          {ms['fused']:7.3f}  {frac:6.1%}         {ms['inplace']:7.3f}  "
        f"{frac_in:5.1%}  {ms['eager'] / best:7.2f}x  {comp_ratio:9.2f}x | "
        f"{mem['fused'] / logits_bytes:15.2f}  {mem['inplace'] / logits_bytes:8.3f}  "
        f"{mem['eager'] / logits_bytes:5.2f}  {mem.get('compiled', float('nan')) / logits_bytes:8.2f} | "
        f"{ms['fwd_eager'] / ms['fwd_fused']:5.2f}x   (with re-read {honest:.1%})"
    )
    if tuned is not None:
        line(
            f"      tuned H{tuned['HEAD']} B{tuned['BLOCK_N']} w{tuned['num_warps']} pf{int(tuned['PREFETCH'])}"
            f" ev{int(tuned['EVICT'])}: "
            f"fused {ms['tuned_fused']:.3f} ms {bench.gbps(two, ms['tuned_fused']) / copy:.1%}, in-place "
            f"{ms['tuned_inplace']:.3f} ms {bench.gbps(two, ms['tuned_inplace']) / copy:.1%}; vs eager "
            f"{ms['eager'] / tuned_best:.2f}x, vs compiled {ms.get('compiled', float('nan')) / tuned_best:.2f}x"
        )


TUNE = [  # (HEAD, BLOCK_N, num_warps, PREFETCH, EVICT); the first two are the defaults (narrow, wide)
    (8192, 4096, 8, True, False),
    (32768, 8192, 32, False, False),
    (8192, 4096, 8, True, True),
    (32768, 8192, 32, False, True),
    (32768, 8192, 32, True, True),
    (16384, 8192, 32, False, True),
    (32768, 4096, 16, False, False),
    (4096, 4096, 8, True, False),
    (16384, 4096, 8, True, False),
    (8192, 2048, 8, True, False),
    (8192, 4096, 16, True, False),
]
TUNE_SHAPES = [(8192, 32000), (4096, 50257), (8192, 128256), (4096, 262144)]
BEST: dict[int, dict] = {}  # tuned vocabulary -> the fastest configuration measured for it


def _tuned_cfg(vocab):
    if not BEST:
        return None
    near = min(BEST, key=lambda v: abs(v - vocab))
    cfg = dict(cross_entropy_config(vocab, torch.bfloat16))
    cfg.update({k: BEST[near][k] for k in ("HEAD", "BLOCK_N", "num_warps", "PREFETCH", "EVICT")})
    return cfg


def sec_tune(copy, budget):
    line(
        "tune: in-place fwd+bwd, %copy by 2 trips      "
        + "  ".join(f"{t}x{v}" for t, v in TUNE_SHAPES)
        + "  regs/spills"
    )
    inputs = {}
    for tokens, vocab in TUNE_SHAPES:
        x, t = _ce_inputs(tokens, vocab, seed=1)
        inputs[(tokens, vocab)] = (x.requires_grad_(), t)
    best = {}
    for head, block_n, warps, prefetch, evict in TUNE:
        if left(budget) < 30:
            line("  (skipped the rest: time)")
            break
        cells, regs = [], "?"
        for tokens, vocab in TUNE_SHAPES:
            xi, t = inputs[(tokens, vocab)]
            cfg = dict(cross_entropy_config(vocab, torch.bfloat16))
            cfg.update(HEAD=head, BLOCK_N=min(block_n, head), num_warps=warps, PREFETCH=prefetch, EVICT=evict)
            try:
                ms = bench.time_ms(_ce_fused(xi, t, cfg, inplace=True))
                frac = bench.gbps(2 * xi.numel() * 2, ms) / copy
                if vocab == 128256:
                    with torch.no_grad():
                        loss_rows = torch.empty(tokens, device="cuda")
                        k = cross_entropy_rows(xi.detach(), t, xi.detach(), loss_rows, None, -100, 0.0, cfg, mean=False)
                    regs = f"{getattr(k, 'n_regs', '?')}/{getattr(k, 'n_spills', '?')}"
            except Exception as e:  # a config that does not compile (registers): say so, go on
                ms, frac = float("nan"), float("nan")
                print("tune failed", head, block_n, warps, prefetch, evict, type(e).__name__, str(e)[:200], flush=True)
            record(
                "tune",
                tokens=tokens,
                vocab=vocab,
                head=head,
                block_n=block_n,
                num_warps=warps,
                prefetch=prefetch,
                evict=evict,
                ms=ms,
                frac_copy=frac,
                regs=regs,
            )
            if frac == frac and frac > best.get(vocab, {}).get("frac", 0):
                best[vocab] = {
                    "HEAD": head,
                    "BLOCK_N": min(block_n, head),
                    "num_warps": warps,
                    "PREFETCH": prefetch,
                    "EVICT": evict,
                    "frac": frac,
                }
            cells.append(f"{ms:7.3f} {frac:5.1%}")
        line(
            f"  H{head:<6} B{block_n:<6} w{warps:<3} pf{int(prefetch)} ev{int(evict)}             "
            + "  ".join(cells)
            + f"  {regs}"
        )
    BEST.update(best)
    line(
        "  best: "
        + "; ".join(
            f"V={v}: H{c['HEAD']} B{c['BLOCK_N']} w{c['num_warps']} pf{int(c['PREFETCH'])} ev{int(c['EVICT'])} "
            f"{c['frac']:.1%}"
            for v, c in sorted(best.items())
        )
    )
    record("tune_best", best={str(k): v for k, v in best.items()})
    del inputs
    torch.cuda.empty_cache()


# -- linear + cross-entropy ------------------------------------------------------------------------------------
def sec_lce(copy, budget):
    tokens, hidden, vocab = 8192, 4096, 128256
    line(f"linear + cross-entropy {tokens} x {hidden} -> {vocab} bf16, fwd+bwd: ms, extra peak GiB, rel. error")
    gen = torch.Generator(device="cuda").manual_seed(3)
    h = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = (torch.randn(vocab, hidden, device="cuda", generator=gen) * hidden**-0.5).to(torch.bfloat16)
    t = torch.randint(0, vocab, (tokens,), device="cuda", generator=gen)
    t[::10] = -100
    hl, wl = h.clone().requires_grad_(), w.clone().requires_grad_()
    # fp32 reference gradients (true fp32 matmuls)
    torch.backends.cuda.matmul.allow_tf32 = False
    h32, w32 = h.float().requires_grad_(), w.float().requires_grad_()
    ref = torch.autograd.grad(F.cross_entropy(h32 @ w32.T, t), (h32, w32))
    del h32, w32
    torch.cuda.empty_cache()
    comp = torch.compile(linear_cross_entropy_eager, dynamic=False)
    variants = {
        "eager": lambda: torch.autograd.grad(linear_cross_entropy_eager(hl, wl, t), (hl, wl)),
        "compiled": lambda: torch.autograd.grad(comp(hl, wl, t), (hl, wl)),
        "fused (default: bf16 acc)": lambda: torch.autograd.grad(linear_cross_entropy(hl, wl, t), (hl, wl)),
        "fused fp32 acc": lambda: torch.autograd.grad(
            linear_cross_entropy(hl, wl, t, accum_dtype=torch.float32), (hl, wl)
        ),
        "fused chunk 2048": lambda: torch.autograd.grad(linear_cross_entropy(hl, wl, t, chunk=2048), (hl, wl)),
        "fused chunk 512": lambda: torch.autograd.grad(linear_cross_entropy(hl, wl, t, chunk=512), (hl, wl)),
    }
    base = {}
    for name, fn in variants.items():
        if left(budget) < 25:
            line("  (skipped the rest: time)")
            break
        grads = fn()
        err = [((g.float() - r).norm() / r.norm()).item() for g, r in zip(grads, ref, strict=True)]
        del grads
        mem = bench.peak_bytes(fn)
        ms = bench.time_ms(fn, warmup_ms=50, rep_ms=300)
        base.setdefault("ms", ms)
        base.setdefault("mem", mem)
        record("lce", variant=name, ms=ms, peak_extra=mem, rel_err_grad_h=err[0], rel_err_grad_w=err[1])
        line(
            f"  {name:<26} {ms:8.2f} ms ({ms / base['ms']:.2f}x eager)  {mem / 2**30:6.2f} GiB "
            f"({mem / base['mem']:.2f}x eager)  err dh {err[0]:.2e} dW {err[1]:.2e}"
        )
    # where the time goes: the three matmuls alone at full size, and the chunked pieces
    if left(budget) > 20:
        g = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16) * 1e-4
        mm = {
            "h @ W.T": bench.time_ms(lambda: h @ w.T),
            "G @ W": bench.time_ms(lambda: g @ w),
            "G.T @ h": bench.time_ms(lambda: g.T @ h),
        }
        acc = torch.zeros(vocab, hidden, device="cuda", dtype=torch.float32)
        chunk = 1024
        gc, hc = g[:chunk], h[:chunk]
        try:
            mm["G_c.T @ h_c -> fp32 acc (x8)"] = 8 * bench.time_ms(
                lambda: torch.addmm(acc, gc.T, hc, out_dtype=torch.float32, out=acc)
            )
        except Exception as e:
            mm["fp32 acc addmm"] = float("nan")
            print("addmm out_dtype failed:", e, flush=True)
        accb = torch.zeros(vocab, hidden, device="cuda", dtype=torch.bfloat16)
        mm["G_c.T @ h_c -> bf16 acc (x8)"] = 8 * bench.time_ms(lambda: accb.addmm_(gc.T, hc))
        x, tt = g[:chunk].clone(), t[:chunk]
        xi = x.requires_grad_()
        mm["CE kernel on a chunk (x8)"] = 8 * bench.time_ms(_ce_fused(xi, tt, inplace=True))
        record("lce_parts", ms=mm)
        line("  parts: " + ", ".join(f"{k} {v:.2f} ms" for k, v in mm.items()))


# -- tests ------------------------------------------------------------------------------------------------------
def sec_tests(budget):
    secs = int(left(budget)) - 5
    if secs < 30:
        line("tests: skipped (time)")
        return
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "tests/test_swiglu.py",
        "tests/test_cross_entropy.py",
        "tests/test_linear_cross_entropy.py",
    ]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=secs)
        tail = (res.stdout + res.stderr).strip().splitlines()
        with open(os.path.join(OUT, "tests.log"), "w") as f:
            f.write(res.stdout + res.stderr)
        line("tests: " + (tail[-1] if tail else "no output") + f" (rc {res.returncode})")
        if res.returncode:
            print("\n".join(tail[-40:]))
    except subprocess.TimeoutExpired as e:
        with open(os.path.join(OUT, "tests.log"), "w") as f:
            f.write(str(e.stdout or ""))
        line(f"tests: timed out after {secs} s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sections", default="tune,ce,swiglu,lce,tests")
    ap.add_argument("--budget", type=float, default=280)
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    assert runtime.is_gpu(), "bench_lesson5 needs a GPU"
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": runtime.version("triton"),
        "date": datetime.date.today().isoformat(),
    }
    copy = bench.measure_copy_bandwidth()
    meta["copy_GBps"] = copy
    line(f"{meta['device']} · torch {meta['torch']} · triton {meta['triton']} · {meta['date']} · copy {copy:.0f} GB/s")
    sections = args.sections.split(",")
    for name in sections:
        t = time.time()
        try:
            if name == "tests":
                sec_tests(args.budget)
            else:
                {"swiglu": sec_swiglu, "ce": sec_ce, "tune": sec_tune, "lce": sec_lce}[name](copy, args.budget)
        except Exception as e:  # one broken section must not lose the others' numbers
            line(f"{name}: FAILED {type(e).__name__}: {str(e)[:300]}")
        record("timing", name=name, seconds=time.time() - t)
        with open(os.path.join(OUT, "bench_lesson5.json"), "w") as f:
            json.dump({"meta": meta, "results": RESULTS}, f, indent=1)
    print("\n==== summary ====")
    print("\n".join(TABLE))
    with open(os.path.join(OUT, "table.txt"), "w") as f:
        f.write("\n".join(TABLE) + "\n")


if __name__ == "__main__":
    main()
