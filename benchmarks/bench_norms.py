"""Lesson 4's norms on a GPU: residual + RMSNorm (forward, backward) and LayerNorm (forward, backward).

    PYTHONPATH=. python3 benchmarks/bench_norms.py sweep [--budget-s 120] [--out DIR]
    PYTHONPATH=. python3 benchmarks/bench_norms.py final [--budget-s 200] [--out DIR]

``sweep``: the package kernels only, over launch configurations (rows per program, warps, backward
programs per SM, one tile against two passes), at rows 4096 and 32768 x hidden 1024 ... 16384, bf16.
``final``: the package's default configuration beside eager PyTorch and ``torch.compile`` of the
eager function (``dynamic=False``, compiled and warmed outside the timed lambda) in the same run:
forward (no grad), backward (dx, d residual and dw through autograd, with a gradient for both y
and h), LayerNorm forward and backward, and few rows of 16k. Percentages are of the copy bandwidth
measured in the same run (``fusionlab.bench.measure_copy_bandwidth``: 1 GiB fp32, read + write) by
the op's *fused* ledger (:func:`rmsnorm_ledger`, :func:`layernorm_ledger`): the bytes the fused
kernel must move, so a compiled or eager time is converted with the same byte count. Timings:
``fusionlab.bench.time_ms`` (do_bench median, L2 flushed); the ``gpu%`` and ``/compg`` columns (and
``LNg%``, ``LNbg%``) time the GPU alone (``fusionlab.bench.queued_ms``), for calls the host bounds.
Results go to ``DIR/norms_<mode>.json``; a compact table is printed last. ``--budget-s``: stop
starting new shapes after this many seconds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch

from fusionlab import bench, runtime
from fusionlab.kernels import layernorm as ln
from fusionlab.kernels import rmsnorm as rn
from fusionlab.kernels._launch import next_pow2, sm_count
from fusionlab.kernels._norms import apply_overrides

DT = torch.bfloat16
EPS = 1e-6
ROWS = (4096, 32768)
HIDDEN = (1024, 2048, 4096, 5120, 8192, 11008, 16384)
T0 = time.time()


def meta() -> dict:
    import triton

    p = torch.cuda.get_device_properties(0)
    return {
        "device": torch.cuda.get_device_name(0),
        "sms": p.multi_processor_count,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.date.today().isoformat(),
    }


def elapsed() -> float:
    return time.time() - T0


def rand(shape, dtype=DT, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def fwd_bytes(rows, n, wdtype=DT):
    return rn.rmsnorm_ledger(rows, n, DT, residual=True, weight_dtype=wdtype, stats=False).fused_bytes


def bwd_bytes(rows, n, programs):
    return rn.rmsnorm_ledger(rows, n, DT, backward=True, grad_h=True, programs=programs).fused_bytes


def pct(nbytes, ms, copy):
    return 100 * bench.gbps(nbytes, ms) / copy


# -- sweep -------------------------------------------------------------------------------------------
def fwd_variants(n, rows):
    """Sweep 2: one tile against two passes for the widest rows; warps at 5120 (sweep 1's outliers)."""
    bn = next_pow2(n)
    if n > 8192:
        return [
            {"BLOCK_M": 1, "BLOCK_N": bn, "num_warps": 32},
            {"BLOCK_M": 1, "BLOCK_N": bn, "num_warps": 16},
            {"BLOCK_M": 1, "BLOCK_N": 4096, "num_warps": 8},
            {"BLOCK_M": 1, "BLOCK_N": 8192, "num_warps": 16},
        ]
    if n == 5120 or (n == 1024 and rows == 4096):
        d = rn.rmsnorm_config(rows, n, DT)
        return [{"BLOCK_M": d["BLOCK_M"], "BLOCK_N": bn, "num_warps": nw} for nw in (4, 8, 16, 32)]
    d = rn.rmsnorm_config(rows, n, DT)
    return [{k: d[k] for k in ("BLOCK_M", "BLOCK_N", "num_warps")}]  # the default only


def bwd_variants(n, rows, sms):
    """Sweep 2: warps x programs per SM x row prefetch (NUM_STAGES) around the default."""
    base = rn.rmsnorm_config(rows, n, DT, backward=True)
    tile = base["BLOCK_M"] * base["BLOCK_N"]
    out = []
    warps = [w for w in (base["num_warps"] // 2, base["num_warps"], base["num_warps"] * 2) if 1 <= w <= 32]
    per_sm = (1, 2, 4) if rows > 4096 else (1, 2)
    for nw in warps if rows > 4096 else [base["num_warps"]]:
        for k in per_sm:
            for stages in (1, 2) if tile <= 8192 else (1,):
                out.append(
                    {
                        "BLOCK_M": base["BLOCK_M"],
                        "BLOCK_N": base["BLOCK_N"],
                        "num_warps": nw,
                        "programs": sms * k,
                        "row_stages": stages,
                    }
                )
    return out


def _sweep_shape(rows, n, res, copy, sms):
    x, r, w = rand((rows, n), seed=1), rand((rows, n), seed=2), rand(n, seed=3)
    nb = fwd_bytes(rows, n)
    default = rn.rmsnorm_config(rows, n, DT)
    torch.cuda.synchronize()
    eager_ms = bench.time_ms(lambda: rn.rmsnorm_eager(x, w, EPS, r))
    rows_fwd = []
    for cfg in fwd_variants(n, rows):
        try:
            with torch.no_grad():
                ms = bench.time_ms(lambda cfg=cfg: rn.rmsnorm(x, w, EPS, r, fwd_config=cfg))
        except Exception as e:  # a configuration that does not compile is a result too
            print(f"fwd {rows}x{n} {cfg}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        rows_fwd.append({"rows": rows, "n": n, "cfg": cfg, "ms": ms, "pct": pct(nb, ms, copy)})
    res["fwd"] += rows_fwd
    best = min(rows_fwd, key=lambda v: v["ms"])
    keys = ("BLOCK_M", "BLOCK_N", "num_warps")
    dft = next((v for v in rows_fwd if all(v["cfg"][k] == default[k] for k in keys)), None)
    dft_txt = f"{dft['pct']:.0f}%" if dft else "-"
    out = [
        f"fwd {rows:>6}x{n:<6} eager {eager_ms:7.3f} ms ({pct(nb, eager_ms, copy):3.0f}%)  "
        f"best {best['ms']:7.3f} ms {best['pct']:3.0f}% {best['cfg']}  default {dft_txt}"
    ]
    # backward: the kernels alone (no autograd), a gradient for y and for h
    y, h, rstd = rn._forward(x, w, r, EPS, rn.row_layouts(x, r), default, store_rstd=True)
    lh = rn.row_layouts(h)[0]
    dy, dh = rand((rows, n), seed=4), rand((rows, n), seed=5)
    rows_bwd = []
    for cfg in bwd_variants(n, rows, sms):
        full = apply_overrides(rn.rmsnorm_config(rows, n, DT, backward=True), cfg, n, "sweep")
        try:
            ms = bench.time_ms(lambda full=full: rn._backward(dy, dh, h, lh, w, rstd, full, True, True))
        except Exception as e:
            print(f"bwd {rows}x{n} {cfg}: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        p = min(full["programs"], rows)
        rows_bwd.append({"rows": rows, "n": n, "cfg": cfg, "ms": ms, "pct": pct(bwd_bytes(rows, n, p), ms, copy)})
    res["bwd"] += rows_bwd
    best = min(rows_bwd, key=lambda v: v["ms"])
    out.append(f"bwd {rows:>6}x{n:<6} best {best['ms']:7.3f} ms {best['pct']:3.0f}% {best['cfg']}")
    return out


def extra(args, res, copy):
    """Sweep 3 (before the final, same call): prefetch with a 16384 tile; the forward at 4096 x 4096;
    LayerNorm's backward with and without prefetch."""
    sms = sm_count()
    lines = []
    res["extra"] = []
    for rows, n in ((32768, 11008), (4096, 11008), (32768, 16384), (4096, 16384)):
        x, r, w = rand((rows, n), seed=1), rand((rows, n), seed=2), rand(n, seed=3)
        cfg0 = rn.rmsnorm_config(rows, n, DT)
        y, h, rstd = rn._forward(x, w, r, EPS, rn.row_layouts(x, r), cfg0, store_rstd=True)
        lh = rn.row_layouts(h)[0]
        dy, dh = rand((rows, n), seed=4), rand((rows, n), seed=5)
        for nw, stages in ((32, 1), (32, 2), (16, 2)):
            over = {"num_warps": nw, "programs": sms, "row_stages": stages}
            full = apply_overrides(rn.rmsnorm_config(rows, n, DT, backward=True), over, n, "extra")
            args_ = (dy, dh, h, lh, w, rstd, full, True, True)
            try:
                ms = bench.time_ms(lambda args_=args_: rn._backward(*args_))
            except Exception as e:
                lines.append(f"bwd {rows}x{n} {over}: {type(e).__name__}: {str(e)[:160]}")
                continue
            p = pct(bwd_bytes(rows, n, sms), ms, copy)
            res["extra"].append({"what": "bwd", "rows": rows, "n": n, "cfg": over, "ms": ms, "pct": p})
            lines.append(f"bwd {rows:>6}x{n:<6} {over} {ms:.4f} ms {p:.1f}%")
        del x, r, w, y, h, rstd, dy, dh, args_
    rows, n = 4096, 4096
    x, r, w = rand((rows, n), seed=1), rand((rows, n), seed=2), rand(n, seed=3)
    for bm, nw in ((1, 4), (1, 8), (1, 16), (2, 8), (2, 16), (4, 16)):
        over = {"BLOCK_M": bm, "num_warps": nw}
        with torch.no_grad():
            ms = bench.time_ms(lambda over=over: rn.rmsnorm(x, w, EPS, r, fwd_config=over))
        p = pct(fwd_bytes(rows, n), ms, copy)
        res["extra"].append({"what": "fwd", "rows": rows, "n": n, "cfg": over, "ms": ms, "pct": p})
        lines.append(f"fwd {rows:>6}x{n:<6} {over} {ms:.4f} ms {p:.1f}%")
    rows, n = 32768, 4096
    x = rand((rows, n), seed=1)
    lw, lb, dy = rand(n, seed=6), rand(n, seed=7), rand((rows, n), seed=8)
    xl, wl, bl = (t.clone().requires_grad_() for t in (x, lw, lb))
    for stages in (1, 2):
        yl = ln.layernorm(xl, wl, bl, bwd_config={"row_stages": stages})
        ms = bench.time_ms(lambda yl=yl: torch.autograd.grad(yl, (xl, wl, bl), dy, retain_graph=True))
        nb = ln.layernorm_ledger(rows, n, DT, backward=True).fused_bytes
        res["extra"].append({"what": "ln bwd", "rows": rows, "n": n, "row_stages": stages, "ms": ms})
        lines.append(f"ln bwd {rows}x{n} row_stages={stages} {ms:.4f} ms {pct(nb, ms, copy):.1f}%")
    return lines


def sweep(args, res, copy):
    sms = sm_count()
    res["fwd"], res["bwd"] = [], []
    lines = []
    for n in HIDDEN:
        for rows in ROWS:
            if elapsed() > args.budget_s:
                lines.append(f"(budget reached at {rows}x{n})")
                return lines
            out = _sweep_shape(rows, n, res, copy, sms)
            print("\n".join(out), flush=True)
            lines += out
            torch.cuda.empty_cache()
    return lines


# -- final -------------------------------------------------------------------------------------------
def compiled(fn):
    # one code object compiled for every shape, with and without grad: past dynamo's default limit of
    # 8 recompiles it would silently run eager
    import torch._dynamo
    import torch._functorch.config

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 256)
    # the timed backward runs with retain_graph=True (the same graph, many times), which donated
    # buffers forbid; the setting changes no kernel of the backward
    torch._functorch.config.donated_buffer = False
    return torch.compile(fn, dynamic=False)


def _final_shape(rows, n, c_rms, c_ln, copy):
    x, r, w = rand((rows, n), seed=1), rand((rows, n), seed=2), rand(n, seed=3)
    nb = fwd_bytes(rows, n)
    row = {"rows": rows, "n": n}
    with torch.no_grad():
        row["fwd_ms"] = bench.time_ms(lambda: rn.rmsnorm(x, w, EPS, r))
        row["eager_ms"] = bench.time_ms(lambda: rn.rmsnorm_eager(x, w, EPS, r))
        c_rms(x, w, EPS, r)
        row["compiled_ms"] = bench.time_ms(lambda: c_rms(x, w, EPS, r))
        y_ours, _ = rn.rmsnorm(x, w, EPS, r)
        y_c, _ = c_rms(x, w, EPS, r)
        row["max_diff_vs_compiled"] = (y_ours.float() - y_c.float()).abs().max().item()
        # the GPU's time alone: at 4096 rows a call can be the host's (notes_norms.md, 2026-11-24 "`bench_norms.py
        # final` on both GPUs after the three row stages")
        row["fwd_gpu_ms"] = bench.queued_ms(lambda: rn.rmsnorm(x, w, EPS, r))
        row["compiled_gpu_ms"] = bench.queued_ms(lambda: c_rms(x, w, EPS, r))
    # backward: autograd for both, gradients for y and h
    dy, dh = rand((rows, n), seed=4), rand((rows, n), seed=5)
    xg, rg, wg = (t.clone().requires_grad_() for t in (x, r, w))
    y, h = rn.rmsnorm(xg, wg, EPS, rg)
    row["bwd_ms"] = bench.time_ms(lambda: torch.autograd.grad((y, h), (xg, wg, rg), (dy, dh), retain_graph=True))
    yc, hc = c_rms(xg, wg, EPS, rg)
    torch.autograd.grad((yc, hc), (xg, wg, rg), (dy, dh), retain_graph=True)
    row["compiled_bwd_ms"] = bench.time_ms(
        lambda: torch.autograd.grad((yc, hc), (xg, wg, rg), (dy, dh), retain_graph=True)
    )
    # the same two backwards, the GPU's time alone (calls queued ahead of it: bench.queued_ms)
    row["bwd_gpu_ms"] = bench.queued_ms(lambda: torch.autograd.grad((y, h), (xg, wg, rg), (dy, dh), retain_graph=True))
    row["compiled_bwd_gpu_ms"] = bench.queued_ms(
        lambda: torch.autograd.grad((yc, hc), (xg, wg, rg), (dy, dh), retain_graph=True)
    )
    programs = rn.rmsnorm_config(rows, n, DT, backward=True)["programs"]
    nbb = bwd_bytes(rows, n, programs)
    row.update(fwd_bytes=nb, bwd_bytes=nbb)
    # LayerNorm forward (no grad) and backward
    lw, lb = rand(n, seed=6), rand(n, seed=7)
    lnb = ln.layernorm_ledger(rows, n, DT).fused_bytes
    lrow = {"rows": rows, "n": n, "fwd_bytes": lnb}
    with torch.no_grad():
        lrow["fwd_ms"] = bench.time_ms(lambda: ln.layernorm(x, lw, lb))
        lrow["eager_ms"] = bench.time_ms(lambda: ln.layernorm_eager(x, lw, lb))
        c_ln(x, lw, lb)
        lrow["compiled_ms"] = bench.time_ms(lambda: c_ln(x, lw, lb))
        lrow["fwd_gpu_ms"] = bench.queued_ms(lambda: ln.layernorm(x, lw, lb))
        lrow["compiled_gpu_ms"] = bench.queued_ms(lambda: c_ln(x, lw, lb))
    xl, wl, bl = (t.clone().requires_grad_() for t in (x, lw, lb))
    yl = ln.layernorm(xl, wl, bl)
    lrow["bwd_ms"] = bench.time_ms(lambda: torch.autograd.grad(yl, (xl, wl, bl), dy, retain_graph=True))
    lrow["bwd_gpu_ms"] = bench.queued_ms(lambda: torch.autograd.grad(yl, (xl, wl, bl), dy, retain_graph=True))
    ye = ln.layernorm_eager(xl, wl, bl)
    lrow["eager_bwd_ms"] = bench.time_ms(lambda: torch.autograd.grad(ye, (xl, wl, bl), dy, retain_graph=True))
    lprog = ln.layernorm_config(rows, n, DT, backward=True)["programs"]
    lrow["bwd_bytes"] = ln.layernorm_ledger(rows, n, DT, backward=True, programs=lprog).fused_bytes
    line = (
        f"{rows:>6}x{n:<6} | {row['fwd_ms']:7.3f} {pct(nb, row['fwd_ms'], copy):5.1f} "
        f"{row['eager_ms'] / row['fwd_ms']:6.2f} {row['compiled_ms'] / row['fwd_ms']:6.3f} "
        f"{pct(nb, row['compiled_ms'], copy):5.1f} {pct(nb, row['fwd_gpu_ms'], copy):5.1f} "
        f"{row['compiled_gpu_ms'] / row['fwd_gpu_ms']:6.3f} | "
        f"{row['bwd_ms']:7.3f} {pct(nbb, row['bwd_ms'], copy):5.1f} "
        f"{row['compiled_bwd_ms'] / row['bwd_ms']:6.3f} {pct(nbb, row['compiled_bwd_ms'], copy):5.1f} "
        f"{pct(nbb, row['bwd_gpu_ms'], copy):5.1f} {row['compiled_bwd_gpu_ms'] / row['bwd_gpu_ms']:6.3f} | "
        f"{lrow['fwd_ms']:7.3f} {pct(lnb, lrow['fwd_ms'], copy):5.1f} {lrow['compiled_ms'] / lrow['fwd_ms']:6.3f} "
        f"{pct(lnb, lrow['fwd_gpu_ms'], copy):5.1f} {lrow['compiled_gpu_ms'] / lrow['fwd_gpu_ms']:6.3f} "
        f"{pct(lrow['bwd_bytes'], lrow['bwd_ms'], copy):5.1f} {pct(lrow['bwd_bytes'], lrow['bwd_gpu_ms'], copy):5.1f} "
        f"{lrow['eager_bwd_ms'] / lrow['bwd_ms']:6.2f}"
    )
    return row, lrow, line


def _few_rows(rows, n, c_rms, copy):
    x, r, w = rand((rows, n), seed=1), rand((rows, n), seed=2), rand(n, seed=3)
    with torch.no_grad():
        f = {
            "ours": bench.time_ms(lambda: rn.rmsnorm(x, w, EPS, r)),
            "eager": bench.time_ms(lambda: rn.rmsnorm_eager(x, w, EPS, r)),
        }
        c_rms(x, w, EPS, r)
        f["compiled"] = bench.time_ms(lambda: c_rms(x, w, EPS, r))
    f.update(rows=rows, n=n, bytes=fwd_bytes(rows, n))
    line = (
        f"few rows {rows:>4}x{n}: ours {1e3 * f['ours']:6.1f} us, eager {1e3 * f['eager']:6.1f} us, "
        f"compiled {1e3 * f['compiled']:6.1f} us ({pct(f['bytes'], f['ours'], copy):4.1f}% of copy)"
    )
    return f, line


def final(args, res, copy):
    lines = []
    res["rmsnorm"], res["layernorm"], res["few_rows"] = [], [], []
    c_rms = compiled(rn.rmsnorm_eager)
    c_ln = compiled(ln.layernorm_eager)
    lines.append(
        f"{'shape':>13} | {'fwd ms':>7} {'%copy':>5} {'/eager':>6} {'/comp':>6} {'comp%':>5} "
        f"{'gpu%':>5} {'/compg':>6} | "
        f"{'bwd ms':>7} {'%copy':>5} {'/comp':>6} {'comp%':>5} {'gpu%':>5} {'/compg':>6} | {'LN ms':>7} {'%copy':>5} "
        f"{'/comp':>6} {'LNg%':>5} {'/compg':>6} {'LNb%':>5} {'LNbg%':>5} {'/eagb':>6}"
    )
    shapes = [(rows, n) for rows in ROWS for n in HIDDEN]
    if args.quick:
        shapes = [(32768, 4096), (4096, 1024)]
    for rows, n in shapes:
        if elapsed() > args.budget_s:
            lines.append(f"(budget reached before {rows}x{n})")
            break
        row, lrow, line = _final_shape(rows, n, c_rms, c_ln, copy)
        res["rmsnorm"].append(row)
        res["layernorm"].append(lrow)
        lines.append(line)
        print(line, flush=True)
        torch.cuda.empty_cache()
    # few rows of 16k: launch-bound; one program per row
    if elapsed() < args.budget_s + 30:
        for rows in (1, 8, 64, 256):
            f, line = _few_rows(rows, 16384, c_rms, copy)
            res["few_rows"].append(f)
            lines.append(line)
    return lines


def warm(args):
    """Compile (and run once) torch.compile's versions for a share of the final's shapes, so the
    timing process finds Inductor's on-disk caches warm. Several run side by side before ``final``."""
    i, k = (int(v) for v in args.part.split("/"))
    shapes = [(rows, n) for rows in ROWS for n in HIDDEN][i::k]
    c_rms, c_ln = compiled(rn.rmsnorm_eager), compiled(ln.layernorm_eager)
    for rows, n in shapes:
        x, r, w = rand((rows, n), seed=1), rand((rows, n), seed=2), rand(n, seed=3)
        with torch.no_grad():
            c_rms(x, w, EPS, r)
            c_ln(x, w, w)
        xg, rg, wg = (t.clone().requires_grad_() for t in (x, r, w))
        yc, hc = c_rms(xg, wg, EPS, rg)
        torch.autograd.grad((yc, hc), (xg, wg, rg), (x, r))
        del x, r, w, xg, rg, wg, yc, hc
        torch.cuda.empty_cache()
        print(f"warm {args.part}: {rows}x{n} compiled at {elapsed():.0f} s", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["sweep", "final", "warm", "extra"])
    ap.add_argument("--part", default="0/1")
    ap.add_argument("--budget-s", type=float, default=200)
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if not runtime.is_gpu():
        sys.exit("bench_norms needs a GPU Triton supports")
    os.makedirs(args.out, exist_ok=True)
    if args.mode == "warm":
        return warm(args)
    res = {"meta": meta()}
    copy = bench.measure_copy_bandwidth()
    res["copy_GBps"] = copy
    lines = {"sweep": sweep, "final": final, "extra": extra}[args.mode](args, res, copy)
    with open(os.path.join(args.out, f"norms_{args.mode}.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"\n== {args.mode}: {res['meta']} copy {copy:.0f} GB/s, {elapsed():.0f} s ==")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
