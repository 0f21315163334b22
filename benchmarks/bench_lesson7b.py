"""Lesson 7b on a GPU: the modification path against compiled flex_attention, and a sweep of its tiles.

    PYTHONPATH=. python3 benchmarks/bench_lesson7b.py --out $OUT [--seconds 170] [--ds 64,128]
        [--ns 8192,32768] [--sweep-n 16384] [--workers 8] [--no-sweep | --no-bars]
        [--mods alibi,causal] [--configs "default online"]     # some modifications, some sweep rows

For each head dim, N and modification of the suite (:mod:`fusionlab.lessons.l7b.suite`: softcap, ALiBi,
sliding window 1k, 8 documents, causal): ours at the default configuration and ``torch.compile``d
``flex_attention``, each checked against the other (norm-relative error of O < 2e-2, no NaN), and the
ratio. Then, at ``--sweep-n``, ours at every configuration of :data:`SWEEP` (a block mask rebuilt at
each tile). Our kernels are compiled first in ``--workers`` processes (Triton's on-disk cache is shared),
so compiling does not eat the timed part. Rows go to ``$OUT/lesson7b.json`` as they come (the run stops
cleanly at ``--seconds``); a compact table is printed last. Timings: do_bench median, L2 flushed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
import traceback
import warnings

import torch

#: (BLOCK_M, BLOCK_N, num_warps, num_stages, REF_MAX) with None for the default's value, or None: the default
SWEEP = {
    "default": None,
    "default online": (None, None, None, None, 0),
    "128x64 w4 s2": (128, 64, 4, 2, None),
    "64x64 w4 s2": (64, 64, 4, 2, None),
    "64x64 w4 s3": (64, 64, 4, 3, None),
    "64x128 w4 s2": (64, 128, 4, 2, None),
    "64x128 w4 s3": (64, 128, 4, 3, None),
    "default ref1": (None, None, None, None, 1),
    "64x128 w4 s2 ref1": (64, 128, 4, 2, 1),
    "64x128 w8 s2": (64, 128, 8, 2, None),
    "128x64 w8 s2": (128, 64, 8, 2, None),
    "128x128 w8 s2": (128, 128, 8, 2, None),
}
#: modifications the bench adds to the suite's: the softcap written with exp2 (the interpreter's form), to
#: set the GPU's tanh.approx beside it
EXTRA_MODS = ("softcap_exp2",)


def _call(mod: str, n: int, cfg_name: str, q, k, v):
    """Ours for ``mod`` at configuration ``cfg_name``: a thunk."""
    from fusionlab.kernels import attention_mods as M
    from fusionlab.kernels.attention import attention
    from fusionlab.lessons.l7b import suite

    if mod == "softcap_exp2":
        sm, mask, causal = M.ScoreMod(M._softcap, a0=suite.CAP, name="softcap exp2"), None, False
    else:
        sm, mask, causal = suite.ours_mods(mod, n, q.device)
    cfg = SWEEP[cfg_name]
    config = {}
    if cfg is not None:
        bm_, bn_, w, st, ref = cfg
        config = {k: x for k, x in (("num_warps", w), ("num_stages", st), ("REF_MAX", ref)) if x is not None}
        if mod == "causal" and bm_ is not None:  # the tile sweep runs causal through the block lists
            mask, causal = M.causal_mask(), False
        if bm_ is not None:
            config.update(BLOCK_M=bm_, BLOCK_N=bn_)
    bm = None
    if mask is not None:  # the mask at its default tiles (64 x 128) or larger: the kernel's lie inside them
        tiles = {} if cfg is None or cfg[0] is None else {"block_m": max(64, cfg[0]), "block_n": max(128, cfg[1])}
        bm = M.block_mask(mask, None, None, n, n, q.device, **tiles)
    return lambda: attention(q, k, v, causal, score_mod=sm, block_mask=bm, config=config or None)


def _compile_worker(tasks):
    import fusionlab  # noqa: F401  (decides the mode before the kernels are defined)
    from fusionlab.lessons.l7b import suite

    out = []
    for d, n, mod, cfg_name in tasks:
        t0 = time.time()
        try:
            q, k, v = suite.qkv(1, n, d)
            _call(mod, n, cfg_name, q, k, v)()
            torch.cuda.synchronize()
            out.append((d, mod, cfg_name, time.time() - t0, None))
        except Exception as e:  # noqa: BLE001  (a configuration that does not compile is a result)
            out.append((d, mod, cfg_name, time.time() - t0, f"{type(e).__name__}: {str(e)[:300]}"))
    return out


def rel_err(y, ref) -> float:
    y, ref = y.float(), ref.float()
    return float((y - ref).norm() / ref.norm().clamp_min(1e-30)) if torch.isfinite(y).all() else float("inf")


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--seconds", type=float, default=170)
    p.add_argument("--ds", default="64,128")
    p.add_argument("--ns", default="8192,32768")
    p.add_argument("--sweep-n", type=int, default=16384)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--no-bars", action="store_true")
    p.add_argument("--mods", default=None, help="comma-separated modifications (default: all)")
    p.add_argument("--configs", default=None, help="comma-separated SWEEP names besides the default (default: all)")
    a = p.parse_args(argv)
    t_end = time.time() + a.seconds
    ds = [int(x) for x in a.ds.split(",")]
    ns = [int(x) for x in a.ns.split(",")]
    os.makedirs(a.out, exist_ok=True)
    rows = []

    def add(**row):
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(os.path.join(a.out, "lesson7b.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)

    import fusionlab  # noqa: F401
    from fusionlab import bench, runtime
    from fusionlab.lessons.l7b import suite

    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": runtime.version("triton"),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "argv": sys.argv[1:]}  # fmt: skip
    sweep = [] if a.no_sweep else [c for c in SWEEP if c != "default"]
    if a.configs is not None:
        sweep = [c for c in a.configs.split(",") if c != "default" and c in SWEEP]
    mods = (*suite.MODS, suite.PLAIN, *EXTRA_MODS)
    if a.mods is not None:
        mods = tuple(m for m in mods if m in a.mods.split(","))
    tasks = [(d, 4096, mod, c) for d in ds for mod in mods for c in ["default", *sweep]]
    t0 = time.time()
    ctx = mp.get_context("spawn")
    with ctx.Pool(a.workers) as pool:
        chunks = [tasks[i :: a.workers] for i in range(a.workers)]
        for part in pool.map(_compile_worker, chunks):
            for d, mod, c, s, err in part:
                if err:
                    add(kind="compile", d=d, mod=mod, config=c, s=round(s, 1), error=err)
    add(kind="compiled", tasks=len(tasks), s=round(time.time() - t0, 1))

    flex = suite._flex()
    for n in [] if a.no_bars else ns:
        B = max(1, suite.TOKENS // n)
        for d in ds:
            q, k, v = suite.qkv(B, n, d)
            for mod in mods:
                if time.time() > t_end:
                    break
                base_mod = mod.replace("_exp2", "")
                flops = 4 * B * suite.HEADS * suite.visible_pairs(base_mod, n) * d
                try:
                    if mod in EXTRA_MODS:  # ours only: its flex is the suite modification's
                        ours = _call(mod, n, "default", q, k, v)
                        ms = bench.time_ms(ours)
                        add(kind="bar", d=d, n=n, mod=mod, ours_ms=ms, flex_ms=float("nan"), ratio=float("nan"),
                            err=float("nan"), ours_TFLOPs=flops / ms / 1e9)  # fmt: skip
                        continue
                    # flex with the same modification (with none at all for the plain kernel)
                    f_sm, f_mask = (None, None) if mod == suite.PLAIN else suite.flex_mods(base_mod, n)
                    f_bm = suite._flex_block_mask(f_mask, n, "cuda")
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        t1 = time.time()
                        ref = flex(q, k, v, score_mod=f_sm, block_mask=f_bm)
                        torch.cuda.synchronize()
                        flex_compile = time.time() - t1
                        flex_ms = bench.time_ms(lambda: flex(q, k, v, score_mod=f_sm, block_mask=f_bm))  # noqa: B023
                    ours = _call(mod, n, "default", q, k, v)
                    err = rel_err(ours()[0], ref)
                    ms = bench.time_ms(ours)
                    add(kind="bar", d=d, n=n, mod=mod, ours_ms=ms, flex_ms=flex_ms, ratio=flex_ms / ms, err=err,
                        ours_TFLOPs=flops / ms / 1e9, flex_TFLOPs=flops / flex_ms / 1e9,
                        flex_compile_s=flex_compile)  # fmt: skip
                except Exception as e:  # noqa: BLE001
                    add(kind="bar", d=d, n=n, mod=mod, error=f"{type(e).__name__}: {str(e)[:400]}",
                        tb=traceback.format_exc()[-1500:])  # fmt: skip
            del q, k, v
            torch.cuda.empty_cache()
    if sweep:
        n = a.sweep_n
        B = max(1, suite.TOKENS // n)
        for d in ds:
            q, k, v = suite.qkv(B, n, d)
            for mod in mods:
                flops = 4 * B * suite.HEADS * suite.visible_pairs(mod.replace("_exp2", ""), n) * d
                base = None
                for c in ["default", *sweep]:
                    if time.time() > t_end:
                        break
                    try:
                        fn = _call(mod, n, c, q, k, v)
                        if base is None:
                            base = fn()[0]
                        err = rel_err(fn()[0], base)
                        ms = bench.time_ms(fn)
                        add(kind="sweep", d=d, n=n, mod=mod, config=c, ms=ms, TFLOPs=flops / ms / 1e9, err=err)
                    except Exception as e:  # noqa: BLE001
                        add(kind="sweep", d=d, n=n, mod=mod, config=c, error=f"{type(e).__name__}: {str(e)[:300]}")
            del q, k, v
            torch.cuda.empty_cache()
    print("\nkind   D     N  mod             config          ours ms  flex ms  ratio  TFLOP/s  err")
    for r in rows:
        if r.get("kind") == "bar" and "ours_ms" in r:
            print(f"bar  {r['d']:>4} {r['n']:>6} {r['mod']:<15} {'default':<14} {r['ours_ms']:8.3f} "
                  f"{r['flex_ms']:8.3f} {r['ratio']:6.2f} {r['ours_TFLOPs']:8.1f} {r['err']:.1e}")  # fmt: skip
        elif r.get("kind") == "sweep" and "ms" in r:
            print(f"swp  {r['d']:>4} {r['n']:>6} {r['mod']:<15} {r['config']:<14} {r['ms']:8.3f} {'':>8} {'':>6} "
                  f"{r['TFLOPs']:8.1f} {r['err']:.1e}")  # fmt: skip
        elif "error" in r:
            print("ERR ", r.get("kind"), r.get("d"), r.get("mod"), r.get("config"), r["error"][:200])


if __name__ == "__main__":
    main()
