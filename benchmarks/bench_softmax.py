"""Lesson 4's softmax on a GPU: tile sweep, then the package kernel beside eager, compiled and copy.

    PYTHONPATH=. python3 benchmarks/bench_softmax.py [--sweep] [--budget SECONDS] [--out DIR]

Forward: rows x width with the tensor >= 256 MiB, widths 128 ... 32768 (one tile, read once) and
65536 ... 262144 (online softmax, read twice); bf16 and fp32. Backward: read y, dy; write dx.
Rates are GB/s of the *fused ledger's* bytes (``softmax_ledger``: 2 trips a row that fits, 3 a wide
one; backward 3 and 5), as a fraction of the copy bandwidth measured in the same run. Baselines:
eager ``torch.softmax`` and ``torch.compile(dynamic=False)``, compiled and warmed before timing.
``--sweep`` first times tile variants per shape (``--sweep`` output goes to the log, the table of the
package defaults is printed last). The run stops starting new sections after ``--budget`` seconds.
Without a GPU it runs a dry pass on tiny shapes (correctness of the script, no timings).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch

import fusionlab
from fusionlab import runtime
from fusionlab.kernels import softmax as S

GPU = runtime.is_gpu()
T0 = time.time()
LOG: list[str] = []


def say(*a):
    line = " ".join(str(v) for v in a)
    LOG.append(line)
    print(line, flush=True)


def elapsed() -> float:
    return time.time() - T0


def time_ms(fn) -> float:
    if GPU:
        return fusionlab.bench.time_ms(fn)
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def rows_for(n: int, dtype, mib: int) -> int:
    es = torch.empty((), dtype=dtype).element_size()
    return max(1, (mib << 20) // (n * es)) if GPU else 4


def compiled(fn):
    if not GPU:
        return fn
    return torch.compile(fn, dynamic=False)


NO_HINTS = {"EVICT_1": "", "EVICT_2": ""}
HINTS_1 = {"EVICT_1": "evict_first"}  # one tile: x is read once, stream it through L2
HINTS_2 = {"EVICT_1": "evict_last", "EVICT_2": "evict_first"}  # online: keep x in L2 for the re-read


def _unique(named: list[tuple[str, dict]]) -> dict[str, dict]:
    out, seen = {}, set()
    for name, cfg in named:
        key = tuple(sorted(cfg.items()))
        if key not in seen:
            seen.add(key)
            out[name] = cfg
    return out


def _cfg(rows, n, dtype, max_single, wide_block, tile, thread_bytes, hints=True):
    return S._config(rows, n, max_single, wide_block, tile, thread_bytes, True, dtype, hints)


def fwd_variants(rows: int, n: int, dtype) -> dict[str, dict]:
    """The package default, then the alternatives measured beside it (the earlier sweeps, with tiles
    of 4096-32768 elements, 8-32 elements a thread, masks and hints, are in notes_softmax.md)."""
    base = S.softmax_config(rows, n, dtype)
    named = [("default", base)]
    if n <= 32768:
        if n in (1024, 4096):
            named.append(("t4096/16B", _cfg(rows, n, dtype, 32768, 32768, 4096, 16)))
            named.append(("t4096/64B", _cfg(rows, n, dtype, 32768, 32768, 4096, 64)))
            for tile in (2048, 8192, 16384):  # more (or fewer) rows a program: bytes in flight per SM
                for tb in (16, 32, 64):
                    named.append((f"t{tile}/{tb}B", _cfg(rows, n, dtype, 32768, 32768, tile, tb)))
        if n == 32768:
            named.append(("online16384/L2", _cfg(rows, n, dtype, 16384, 16384, 4096, 32)))
            named.append(("online8192/L2", _cfg(rows, n, dtype, 8192, 8192, 4096, 32)))
        if n >= 4096:  # persistent programs, the next row's loads in flight (tl.range num_stages)
            sms = torch.cuda.get_device_properties(0).multi_processor_count if GPU else 4
            for tb in (32, 64, 128) if n == 32768 else (32, 64):
                c = _cfg(rows, n, dtype, 32768, 32768, 4096, tb)
                named.append((f"t/{tb}B", c))
                for per_sm in (1, 2, 4):
                    for stages in (2, 3):
                        persistent = {**c, "programs": sms * per_sm, "row_stages": stages}
                        named.append((f"p{per_sm}/s{stages}/{tb}B", persistent))
    else:
        named.append(("no-hints", {**base, **NO_HINTS}))
        named.append(("online8192/L2", _cfg(rows, n, dtype, 1, 8192, 4096, 32)))
        named.append(("online16384/L2", _cfg(rows, n, dtype, 1, 16384, 4096, 32)))
        for wb in (8192, 16384, 32768):  # the tile loop's software pipeline: loads this many tiles deep
            for ns in (2, 4):
                if wb * ns * torch.empty((), dtype=dtype).element_size() <= 160 * 1024:
                    named.append((f"online{wb}/L2/s{ns}", {**_cfg(rows, n, dtype, 1, wb, 4096, 32), "num_stages": ns}))
        named.append(("online16384", _cfg(rows, n, dtype, 1, 16384, 4096, 32, hints=False)))
    return _unique(named)


def bwd_variants(rows: int, n: int, dtype) -> dict[str, dict]:
    base = S.softmax_config(rows, n, dtype, backward=True)
    named = [("default", base), ("no-hints", {**base, **NO_HINTS})]
    if n <= 32768:
        named.append(("single32k", _cfg(rows, n, dtype, 32768, 16384, 4096, 32)))
    named.append(("online8192/L2", _cfg(rows, n, dtype, 1, 8192, 4096, 32)))
    named.append(("online32768/L2", _cfg(rows, n, dtype, 1, 32768, 4096, 32)))
    return _unique(named)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--budget", type=float, default=270.0)
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--widths", default="128,512,1024,2048,4096,8192,16384,32768")
    ap.add_argument("--wide", default="65536,131072,262144")
    ap.add_argument("--bwd", default="1024,4096,16384,32768,65536")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if GPU:
        for attr in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, attr):
                setattr(torch._dynamo.config, attr, 4096)
    info = runtime.info()
    say(info.label(), "·", datetime.date.today().isoformat(), "·", "GPU" if GPU else "DRY RUN (no GPU)")
    copy = fusionlab.bench.measure_copy_bandwidth() if GPU else 1.0
    say(f"copy bandwidth: {copy:.0f} GB/s")
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
    dts = [dtypes[d] for d in args.dtypes.split(",") if dtypes[d] in runtime.DTYPES]
    results: list[dict] = []

    def rec(section, dtype, rows, n, name, ms, nbytes, **extra):
        gbs = nbytes / (ms * 1e-3) / 1e9
        r = dict(
            section=section,
            dtype=str(dtype).replace("torch.", ""),
            rows=rows,
            n=n,
            name=name,
            ms=ms,
            GBps=gbs,
            frac_copy=gbs / copy,
            **extra,
        )
        results.append(r)
        say(
            f"  {section:<4} {r['dtype']:<8} {rows:>7}x{n:<7} {name:<16} {ms:8.4f} ms {gbs:7.0f} GB/s "
            f"{100 * gbs / copy:5.1f}%"
        )
        return r

    eager_sm = compiled(lambda t: torch.softmax(t, -1))
    bwd_eager = lambda y, dy: torch._softmax_backward_data(dy, y, -1, y.dtype)  # noqa: E731
    bwd_comp = compiled(bwd_eager)

    def trio(section, dtype, rows, n, ours, eager, comp, ours_bytes, base_bytes, cfg):
        """The package default, eager and compiled, timed round-robin; each keeps its fastest median."""
        cases = {"ours": ours, "eager": eager, "compiled": comp}
        times = {k: [] for k in cases}
        for _ in range(args.rounds):
            for k, fn in cases.items():
                if fn is not None:
                    times[k].append(time_ms(fn))
        for k, ts in times.items():
            if ts:
                rec(
                    section,
                    dtype,
                    rows,
                    n,
                    k,
                    min(ts),
                    ours_bytes if k == "ours" else base_bytes,
                    rounds=ts,
                    cfg=dict(cfg) if k == "ours" else None,
                )

    def sweep(section, dtype, rows, n, variants, run, ledger, check_fn):
        for name, cfg in variants.items():
            try:
                check_fn(run(cfg), f"{section} {dtype} {n} {name}")
                ms = time_ms(lambda cfg=cfg: run(cfg))
                rec(section, dtype, rows, n, name, ms, ledger(cfg).fused_bytes, cfg=dict(cfg))
            except Exception as e:  # a variant that fails to compile must not sink the run
                say(f"!! {section} {dtype} {n} {name}: {type(e).__name__}: {str(e)[:300]}")

    # -- forward: one tile and online, all widths --------------------------------------------------
    for dtype in dts:
        es = torch.empty((), dtype=dtype).element_size()
        for n in [int(v) for v in args.widths.split(",") if v] + [int(v) for v in args.wide.split(",") if v]:
            if elapsed() > args.budget:
                say(f"(budget: skipping forward {dtype} {n})")
                continue
            rows = rows_for(n, dtype, args.mib)
            x = torch.randn(rows, n, device=runtime.DEVICE, dtype=dtype)
            layout = S._rows_of(x)
            ref = torch.softmax(x[:64].double(), -1)

            def check_fn(y, what, ref=ref):
                err = (y[:64].double() - ref).abs().max().item()
                if not err < 2e-2:
                    say(f"!! {what}: max error {err:.3g}")

            def run(cfg, x=x, layout=layout):
                return S._forward(x, layout, cfg)

            def ledger(cfg, rows=rows, n=n, dtype=dtype):
                return S.softmax_ledger(rows, n, dtype, block=cfg["BLOCK_N"] if cfg["SINGLE_TILE"] else 0)

            if args.sweep:
                sweep("fwd", dtype, rows, n, fwd_variants(rows, n, dtype), run, ledger, check_fn)
            cfg = S.softmax_config(rows, n, dtype)
            y = S.softmax(x)
            check_fn(y, f"fwd {dtype} {n} package")
            y = None
            try:
                eager_sm(x)  # compile and warm outside the timed lambda
                comp = lambda x=x: eager_sm(x)  # noqa: E731
            except Exception as e:
                say(f"!! compiled {dtype} {n}: {type(e).__name__}: {str(e)[:200]}")
                comp = None
            trio(
                "fwd",
                dtype,
                rows,
                n,
                lambda x=x: S.softmax(x),
                lambda x=x: torch.softmax(x, -1),
                comp,
                ledger(cfg).fused_bytes,
                2 * rows * n * es,
                cfg,
            )
            x = None  # free it before the next shape
            if GPU:
                torch.cuda.empty_cache()

    # -- backward ----------------------------------------------------------------------------------
    for dtype in dts:
        es = torch.empty((), dtype=dtype).element_size()
        for n in [int(v) for v in args.bwd.split(",") if v]:
            if elapsed() > args.budget:
                say(f"(budget: skipping backward {dtype} {n})")
                continue
            rows = rows_for(n, dtype, args.mib)
            y = torch.softmax(torch.randn(rows, n, device=runtime.DEVICE, dtype=torch.float32), -1).to(dtype)
            dy = torch.randn(rows, n, device=runtime.DEVICE, dtype=dtype)
            ref = bwd_eager(y[:64].double(), dy[:64].double())

            def check_fn(dx, what, ref=ref):
                err = (dx[:64].double() - ref).abs().max().item()
                if not err < 1e-2:
                    say(f"!! {what}: max error {err:.3g}")

            def run(cfg, y=y, dy=dy):
                return S._backward(y, dy, cfg)

            def ledger(cfg, rows=rows, n=n, dtype=dtype):
                return S.softmax_ledger(
                    rows, n, dtype, block=cfg["BLOCK_N"] if cfg["SINGLE_TILE"] else 0, backward=True
                )

            if args.sweep:
                sweep("bwd", dtype, rows, n, bwd_variants(rows, n, dtype), run, ledger, check_fn)
            cfg = S.softmax_config(rows, n, dtype, backward=True)
            check_fn(S._backward(y, dy), f"bwd {dtype} {n} package")
            try:
                bwd_comp(y, dy)
                comp = lambda y=y, dy=dy: bwd_comp(y, dy)  # noqa: E731
            except Exception as e:
                say(f"!! compiled bwd {dtype} {n}: {type(e).__name__}: {str(e)[:200]}")
                comp = None
            trio(
                "bwd",
                dtype,
                rows,
                n,
                lambda y=y, dy=dy: S._backward(y, dy),
                lambda y=y, dy=dy: bwd_eager(y, dy),
                comp,
                ledger(cfg).fused_bytes,
                3 * rows * n * es,
                cfg,
            )
            y = dy = None
            if GPU:
                torch.cuda.empty_cache()

    # -- the summary: package defaults against eager, compiled and copy ------------------------------
    summary = []
    for sec in ("fwd", "bwd"):
        for dtype in dts:
            dn = str(dtype).replace("torch.", "")
            for n in sorted({r["n"] for r in results if r["section"] == sec and r["dtype"] == dn}):
                rs = {r["name"]: r for r in results if r["section"] == sec and r["dtype"] == dn and r["n"] == n}
                d = rs.get("ours")
                if not d:
                    continue
                best = min((r for k, r in rs.items() if k not in ("eager", "compiled")), key=lambda r: r["ms"])
                spread = max(d["rounds"]) / min(d["rounds"]) - 1
                row = dict(
                    sec=sec,
                    dtype=dn,
                    n=n,
                    rows=d["rows"],
                    ms=d["ms"],
                    pct=100 * d["frac_copy"],
                    single=d["cfg"]["SINGLE_TILE"],
                    best=best["name"],
                    best_pct=100 * best["frac_copy"],
                    spread_pct=100 * spread,
                )
                for k in ("eager", "compiled"):
                    row[k] = rs[k]["ms"] / d["ms"] if k in rs else float("nan")
                summary.append(row)
    narrow = {}
    for s in summary:
        if s["sec"] == "fwd" and s["n"] <= 32768:
            narrow.setdefault(s["dtype"], []).append(s["pct"])
    lines = [
        f"softmax on {info.label()}, {datetime.date.today().isoformat()}; copy {copy:.0f} GB/s; "
        "% copy by the fused ledger (fwd: 2 trips, 3 when wide; bwd: 3, 5 when wide)",
        f"{'':4} {'dtype':<9} {'width':>7} {'rows':>7} {'path':<6} {'ms':>8} {'% copy':>7} "
        f"{'x eager':>8} {'x compiled':>10} {'spread':>6}  best variant",
    ]
    for s in summary:
        lines.append(
            f"{s['sec']:<4} {s['dtype']:<9} {s['n']:>7} {s['rows']:>7} {'tile' if s['single'] else 'online':<6} "
            f"{s['ms']:8.4f} {s['pct']:6.1f}% {s['eager']:7.2f}x {s['compiled']:9.2f}x {s['spread_pct']:5.1f}%  "
            f"{s['best']} ({s['best_pct']:.1f}%)"
        )
    for dn, pcts in narrow.items():
        med = sorted(pcts)[len(pcts) // 2]
        wides = [s["pct"] for s in summary if s["sec"] == "fwd" and s["dtype"] == dn and s["n"] > 32768]
        if wides:
            lines.append(
                f"{dn}: narrow median {med:.1f}% of copy, min {min(pcts):.1f}%; wide/narrow-median "
                f"per byte: {', '.join(f'{w / med:.2f}' for w in wides)}"
            )
    table = "\n".join(lines)
    meta = dict(
        info=str(info.label()),
        date=datetime.date.today().isoformat(),
        copy_GBps=copy,
        argv=sys.argv,
        elapsed_s=elapsed(),
    )
    with open(os.path.join(args.out, "softmax_bench.json"), "w") as f:
        json.dump(dict(meta=meta, results=results, summary=summary), f, indent=1)
    with open(os.path.join(args.out, "softmax_bench.log"), "w") as f:
        f.write("\n".join(LOG) + "\n\n" + table + "\n")
    print("\n" + table)
    print(f"[{elapsed():.0f} s]")


if __name__ == "__main__":
    main()
