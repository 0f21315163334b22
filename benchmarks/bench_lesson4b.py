"""Lesson 4b on a GPU, in one run: residual + dropout + norm (forward, backward) against eager and
torch.compile, and one AdamW step over GPT-2 small's and a Llama-style 1B's parameter lists four ways
(a per-tensor loop, ``foreach``, ``fused=True``, fusionlab's one launch), as ratios and as fractions of
the copy bandwidth measured in the same run. Prints a table; writes JSON to $OUT.

    PYTHONPATH=. python3 benchmarks/bench_lesson4b.py [--sections norm,adamw,graph] [--budget 300]

Timings: ``fusionlab.bench.time_ms`` (do_bench median, L2 flushed); backward alone: one
``torch.autograd.grad`` on a kept graph, queued (``bench.queued_ms``: the host out of the way).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

import fusionlab  # noqa: F401  (decides the mode before any kernel is defined)
from fusionlab import bench
from fusionlab.kernels.adamw import adamw_ledger
from fusionlab.kernels.dropout_norm import dropout_norm, dropout_norm_eager, dropout_norm_ledger
from fusionlab.lessons.l4b.suite import gpt2_small_shapes, llama_1b_shapes
from fusionlab.optim import AdamW

OUT = os.environ.get("OUT", "/tmp/bench_lesson4b")
T0 = time.time()
RESULTS: list[dict] = []


def left(budget):
    return budget - (time.time() - T0)


def record(section, **kw):
    kw = {"section": section, **kw}
    RESULTS.append(kw)
    print(json.dumps(kw), flush=True)


# -- residual + dropout + norm --------------------------------------------------------------------------
NORM_SHAPES = [(4096, 4096), (32768, 4096), (4096, 8192), (32768, 8192)]


def _bwd_timer(fn, ins, gy, gh):
    y, h = fn(*ins)
    return lambda: torch.autograd.grad((y, h), ins, (gy, gh), retain_graph=True)


def sec_norm(copy, budget, shapes, compile_shapes):
    dt = torch.bfloat16
    for norm in ("layernorm", "rmsnorm"):
        for rows, n in shapes:
            if left(budget) < 40:
                print(f"norm {norm} {rows}x{n}: skipped, time budget", flush=True)
                continue
            x, r, gy, gh = (torch.randn(rows, n, device="cuda", dtype=dt) for _ in range(4))
            w = torch.randn(n, device="cuda", dtype=dt)
            b = torch.randn(n, device="cuda", dtype=dt) if norm == "layernorm" else None
            ins = [t.requires_grad_() for t in (x, r, w)] + ([b.requires_grad_()] if b is not None else [])

            def ours(x, r, w, b=None, norm=norm):
                return dropout_norm(x, r, w, b, 0.1, norm=norm)

            def eager(x, r, w, b=None, norm=norm):
                return dropout_norm_eager(x, r, w, b, 0.1, norm=norm)

            # a fresh Dynamo cache a shape: each loop makes new functions of one code object, and past
            # Dynamo's recompile limit a compiled call silently runs eager
            torch._dynamo.reset()
            fns = {"fused": ours, "eager": eager}
            if (rows, n) in compile_shapes:
                fns["compiled"] = torch.compile(eager, dynamic=False)
            fwd_bytes = dropout_norm_ledger(rows, n, dt, norm=norm).fused_bytes
            bwd_bytes = dropout_norm_ledger(rows, n, dt, norm=norm, backward=True).fused_bytes
            row = {"norm": norm, "rows": rows, "n": n, "dtype": "bfloat16"}
            for name, fn in fns.items():
                with torch.no_grad():
                    fn(*[t.detach() for t in ins])
                    row[f"{name}_fwd_ms"] = bench.time_ms(lambda fn=fn: fn(*[t.detach() for t in ins]))
                fn(*ins)  # compile the training graph outside the timing
                row[f"{name}_bwd_ms"] = bench.queued_ms(_bwd_timer(fn, ins, gy, gh), calls=10)
            for d, nb in (("fwd", fwd_bytes), ("bwd", bwd_bytes)):
                row[f"fused_{d}_pct_copy"] = 100 * bench.gbps(nb, row[f"fused_{d}_ms"]) / copy
                for other in ("eager", "compiled"):
                    if f"{other}_{d}_ms" in row:
                        row[f"{d}_vs_{other}"] = row[f"{other}_{d}_ms"] / row[f"fused_{d}_ms"]
            record("norm", **row)
            x = r = gy = gh = w = b = ins = fns = None  # free before the next shape
            torch.cuda.empty_cache()


# -- AdamW -------------------------------------------------------------------------------------------------
def _opt_params(shapes):
    ps = [torch.nn.Parameter(torch.randn(s, device="cuda") * 0.02) for s in shapes]
    for p in ps:
        p.grad = torch.randn_like(p) * 1e-3
    return ps


def sec_adamw(copy, budget, loop_for):
    hp = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for model, shapes in (("gpt2-small", gpt2_small_shapes()), ("llama-1b", llama_1b_shapes())):
        if left(budget) < 40:
            print(f"adamw {model}: skipped, time budget", flush=True)
            continue
        ps = _opt_params(shapes)
        n = sum(p.numel() for p in ps)
        nbytes = adamw_ledger([p.numel() for p in ps]).fused_bytes
        ways = {
            "fusionlab": lambda: AdamW(ps, **hp),
            "fused": lambda: torch.optim.AdamW(ps, fused=True, **hp),
            "foreach": lambda: torch.optim.AdamW(ps, foreach=True, **hp),
        }
        if model in loop_for:
            ways["loop"] = lambda: torch.optim.AdamW(ps, foreach=False, **hp)
        row = {"model": model, "tensors": len(ps), "params": n, "fused_bytes": nbytes}
        for name, make in ways.items():
            opt = make()
            opt.step()
            row[f"{name}_ms"] = bench.time_ms(opt.step, warmup_ms=50, rep_ms=200)
            del opt
            torch.cuda.empty_cache()
        row["pct_copy"] = 100 * bench.gbps(nbytes, row["fusionlab_ms"]) / copy
        for other in ("fused", "foreach", "loop"):
            if f"{other}_ms" in row:
                row[f"vs_{other}"] = row[f"{other}_ms"] / row["fusionlab_ms"]
        record("adamw", **row)
        ps = ways = None  # free before the next list
        torch.cuda.empty_cache()


def sec_graph(copy, budget):
    """The capturable step recorded in a CUDA graph and replayed (GPT-2 small's list)."""
    ps = _opt_params(gpt2_small_shapes())
    opt = AdamW(ps, lr=1e-4, capturable=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            opt.step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        opt.step()
    before = float(opt.state[ps[0]]["step"])
    g.replay()
    torch.cuda.synchronize()
    after = float(opt.state[ps[0]]["step"])
    nbytes = adamw_ledger([p.numel() for p in ps]).fused_bytes
    eager_ms = bench.time_ms(opt.step)
    graph_ms = bench.time_ms(g.replay)
    record("graph", step_before=before, step_after=after, capturable_ms=eager_ms, graph_ms=graph_ms,
           graph_pct_copy=100 * bench.gbps(nbytes, graph_ms) / copy)  # fmt: skip


def sec_sweep(copy, budget):
    """The backward's row pipelining and programs an SM, LayerNorm bf16: what the defaults rest on."""
    for rows, n in ((32768, 4096), (32768, 8192)):
        x, r, gy, gh = (torch.randn(rows, n, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        w, b = (torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        ins = [t.requires_grad_() for t in (x, r, w, b)]
        nbytes = dropout_norm_ledger(rows, n, torch.bfloat16, backward=True).fused_bytes
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        for stages in (1, 2, 3):
            for per_sm in (1, 2, 4):
                if left(budget) < 15:
                    return
                cfg = {"row_stages": stages, "programs": sms * per_sm}
                try:
                    fn = lambda *a, cfg=cfg: dropout_norm(*a, 0.1, bwd_config=cfg)  # noqa: E731
                    ms = bench.queued_ms(_bwd_timer(fn, ins, gy, gh), calls=10)
                    pct = 100 * bench.gbps(nbytes, ms) / copy
                    record("sweep", rows=rows, n=n, row_stages=stages, programs_per_sm=per_sm, bwd_ms=ms, pct_copy=pct)
                except Exception as e:  # a configuration that does not fit: say so, go on
                    record("sweep", rows=rows, n=n, row_stages=stages, programs_per_sm=per_sm, error=str(e)[:200])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sections", default="norm,adamw,graph,sweep")
    ap.add_argument("--budget", type=float, default=300)
    ap.add_argument("--shapes", default="all", help="all, or small: 4096x4096 and 32768x8192 only")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    meta = bench.metadata()
    meta["command"] = "benchmarks/bench_lesson4b.py"
    copy = bench.measure_copy_bandwidth()
    record("meta", copy_GBps=copy, **meta)
    sections = args.sections.split(",")
    shapes = NORM_SHAPES if args.shapes == "all" else [(4096, 4096), (32768, 8192)]
    try:
        if "adamw" in sections:
            sec_adamw(copy, args.budget, loop_for={"gpt2-small"})
        if "graph" in sections and left(args.budget) > 20:
            sec_graph(copy, args.budget)
        if "sweep" in sections:
            sec_sweep(copy, args.budget)
        if "norm" in sections:
            sec_norm(copy, args.budget, shapes, compile_shapes=set(NORM_SHAPES))  # the bar: >= 1.0x compiled at each
    finally:
        with open(os.path.join(OUT, "bench_lesson4b.json"), "w") as f:
            json.dump(RESULTS, f, indent=1)
    for r in RESULTS:
        if r["section"] == "norm":
            print(f"{r['norm']:9s} {r['rows']}x{r['n']}: fwd {r['fused_fwd_pct_copy']:.0f}% copy, "
                  f"x{r.get('fwd_vs_compiled', float('nan')):.2f} compiled, x{r['fwd_vs_eager']:.2f} eager | "
                  f"bwd {r['fused_bwd_pct_copy']:.0f}% copy, x{r.get('bwd_vs_compiled', float('nan')):.2f} compiled, "
                  f"x{r['bwd_vs_eager']:.2f} eager")  # fmt: skip
        elif r["section"] == "adamw":
            print(f"adamw {r['model']} ({r['tensors']} tensors): {r['fusionlab_ms']:.3f} ms, "
                  f"{r['pct_copy']:.0f}% copy, x{r['vs_fused']:.2f} fused, x{r['vs_foreach']:.2f} foreach, "
                  f"x{r.get('vs_loop', float('nan')):.2f} loop")  # fmt: skip


if __name__ == "__main__":
    main()
