"""Lesson 7b on a GPU: what the block-sparse loop costs, and which tiles and loop win at head dims 64 and 128.

    PYTHONPATH=. python3 benchmarks/probes/probe_7b_sparse.py --out $OUT [--seconds 170] [--n 32768]
        [--ds 128,64] [--workers 14]

Hypotheses, each a variant of :data:`BY_D` (:func:`variant` reads its name) against the default, in one run:

- ``lists``, ``ranges``, ``one`` (``attention_mods.SPARSE_LOOP``): the kernel finds each block through a list
  entry loaded just before the block's K and V (a dependent load in front of the pipelined TMA copies); or,
  the masks' full blocks being consecutive, runs them as a range from the first, then the partial blocks
  through their list (a second loop: its pipeline fills again); or, all visited blocks being consecutive,
  runs one loop over them from the first full block, the element mask on the partial ones only;
- the mask's and the kernel's tiles (``mMxN`` the block mask's, ``kMxN`` the kernel's inside it), warps and
  stages: a window's tile visits about ten mask blocks, so a 128-key mask block that is half above the
  diagonal, or a pipeline that fills twice (full blocks, then partial), weighs more than in a causal row;
  flex_attention's own H100 choice at head dim 128 is 128 x 64, 8 warps, 3 stages;
- ``online``: the online loop instead of the reference max.

Masks: the sliding window 1024 and the 8 documents of :mod:`fusionlab.lessons.l7b.suite`, and causal as a
block mask (nearly all full blocks: the loop's own cost against lesson 7's ``causal=True`` kernel, which is
timed too, as the window's per-visible-FLOP bar). Compiled ``flex_attention`` with the window and the
documents is the other bar. Every variant's O is checked against the default's (norm-relative error) and
flex's against ours. Kernels and flex compile first in ``--workers`` processes (Triton's and Inductor's
on-disk caches are shared). Rows go to ``$OUT/probe_7b_sparse.json`` as they come; the run stops cleanly
at ``--seconds``. Timings: do_bench median, L2 flushed; TFLOP/s count 4 D per visible (query, key) pair.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
import warnings

import torch

#: (mask tiles, kernel tiles, num_warps, num_stages) by name: head dim 128's default (64 x 64 inside 64 x 128)
#: at two stages, the mask at the kernel's tile, head dim 64's default, flex_attention's 128 x 64 w8 s3
TILES = {
    "m64x64 k64x64 w4 s3": ((64, 64), (64, 64), 4, 3), "m64x64 k64x64 w4 s4": ((64, 64), (64, 64), 4, 4),
    "m64x128 k64x64 w4 s2": ((64, 128), (64, 64), 4, 2), "m128x128 k128x64 w8 s3": ((128, 128), (128, 64), 8, 3),
    "m128x64 k128x64 w8 s3": ((128, 64), (128, 64), 8, 3), "m128x128 k128x128 w4 s3": ((128, 128), (128, 128), 4, 3),
    "m64x128 k64x128 w4 s3": ((64, 128), (64, 128), 4, 3), "m128x128 k128x64 w4 s3": ((128, 128), (128, 64), 4, 3),
}  # fmt: skip


def variant(name: str):
    """``"<loop> <tiles>[ online]"`` -> (the mask's tiles or None: the default, config overrides, SPARSE_LOOP)."""
    loop, rest = name.split(" ", 1)
    config = {"REF_MAX": 0} if rest.endswith(" online") else {}
    rest = rest.removesuffix(" online")
    if rest == "default":
        return None, config, loop
    m, k, w, st = TILES[rest]
    return m, {**config, "BLOCK_M": k[0], "BLOCK_N": k[1], "num_warps": w, "num_stages": st}, loop


#: the variants each head dim runs: the three loops at the default tiles (and online), then tiles
BY_D = {
    128: ["lists default", "ranges default", "one default", "ranges default online", "one default online",
          "ranges m64x64 k64x64 w4 s3", "one m64x64 k64x64 w4 s3", "ranges m64x64 k64x64 w4 s4",
          "ranges m64x128 k64x64 w4 s2", "ranges m128x128 k128x64 w8 s3", "one m128x128 k128x64 w8 s3",
          "ranges m128x64 k128x64 w8 s3"],
    64: ["lists default", "ranges default", "one default", "ranges default online", "ranges m64x64 k64x64 w4 s3",
         "one m64x64 k64x64 w4 s3", "ranges m64x128 k64x128 w4 s3", "ranges m128x128 k128x128 w4 s3",
         "ranges m128x128 k128x64 w4 s3"],
}  # fmt: skip
MASKS = ("sliding_window", "document", "causal_mask")
FLEX_MASKS = ("sliding_window", "document")


def _mask(mod: str, n: int, device):
    from fusionlab.kernels import attention_mods as M
    from fusionlab.lessons.l7b import suite

    return M.causal_mask() if mod == "causal_mask" else suite.ours_mods(mod, n, device)[1]


def ours(mod: str, name: str, q, k, v):
    """A thunk: our forward with ``mod``'s block mask at variant ``name``; lesson 7's causal kernel for
    ``dense_causal``."""
    from fusionlab.kernels import attention_mods as M
    from fusionlab.kernels.attention import attention

    n = q.shape[2]
    if mod == "dense_causal":
        return lambda: attention(q, k, v, True)
    tiles, config, loop = variant(name)
    kw = {} if tiles is None else {"block_m": tiles[0], "block_n": tiles[1]}
    bm = M.block_mask(_mask(mod, n, q.device), None, None, n, n, q.device, **kw)

    def run():
        M.SPARSE_LOOP = loop  # read when the call's kernel arguments are built
        return attention(q, k, v, block_mask=bm, config=config or None)

    return run


def flex(mod: str, q, k, v):
    from fusionlab.lessons.l7b import suite

    n = q.shape[2]
    f = suite._flex()
    f_bm = suite._flex_block_mask(suite.flex_mods(mod, n)[1], n, "cuda")
    return lambda: f(q, k, v, block_mask=f_bm)


def _compile_worker(tasks):
    import fusionlab  # noqa: F401  (decides the mode before the kernels are defined)
    from fusionlab.lessons.l7b import suite

    out = []
    for d, n, mod, variant in tasks:
        t0 = time.time()
        try:
            q, k, v = suite.qkv(1, n, d)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                (flex(mod, q, k, v) if variant == "flex" else ours(mod, variant, q, k, v))()
            torch.cuda.synchronize()
            out.append((d, mod, variant, time.time() - t0, None))
        except Exception as e:  # noqa: BLE001  (a variant that does not compile is a result)
            out.append((d, mod, variant, time.time() - t0, f"{type(e).__name__}: {str(e)[:300]}"))
    return out


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--seconds", type=float, default=170)
    p.add_argument("--n", type=int, default=32768)
    p.add_argument("--ds", default="128,64")
    p.add_argument("--workers", type=int, default=14)
    a = p.parse_args(argv)
    t_end = time.time() + a.seconds
    ds = [int(x) for x in a.ds.split(",")]
    n = a.n
    os.makedirs(a.out, exist_ok=True)

    import fusionlab  # noqa: F401
    from fusionlab import bench, runtime
    from fusionlab.lessons.l7b import suite

    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": runtime.version("triton"),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "argv": sys.argv[1:], "n": n,
            "heads": suite.HEADS, "window": suite.WINDOW}  # fmt: skip
    rows = []

    def add(**row):
        rows.append(row)
        print(json.dumps(row), flush=True)
        with open(os.path.join(a.out, "probe_7b_sparse.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)

    tasks = [(d, n, m, v) for d in ds for m in MASKS for v in BY_D[d]]
    tasks += [(d, n, m, "flex") for d in ds for m in FLEX_MASKS] + [(d, n, "dense_causal", "lesson 7") for d in ds]
    t0 = time.time()
    with mp.get_context("spawn").Pool(a.workers) as pool:
        for part in pool.map(_compile_worker, [tasks[i :: a.workers] for i in range(a.workers)]):
            for d, mod, variant, s, err in part:
                if err:
                    add(kind="compile", d=d, mod=mod, variant=variant, s=round(s, 1), error=err)
    add(kind="compiled", tasks=len(tasks), s=round(time.time() - t0, 1))

    def rel(y, ref):
        y, ref = y.float(), ref.float()
        return float((y - ref).norm() / ref.norm().clamp_min(1e-30)) if torch.isfinite(y).all() else float("inf")

    for d in ds:
        q, k, v = suite.qkv(1, n, d)
        for mod in ("dense_causal", *MASKS):
            visible = suite.visible_pairs("causal" if mod in ("dense_causal", "causal_mask") else mod, n)
            flops = 4 * suite.HEADS * visible * d
            base = None
            for variant in ["lesson 7"] if mod == "dense_causal" else [*BY_D[d], *(["flex"] * (mod in FLEX_MASKS))]:
                if time.time() > t_end:
                    break
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        fn = flex(mod, q, k, v) if variant == "flex" else ours(mod, variant, q, k, v)
                        y = fn()
                        y = y[0] if isinstance(y, tuple) else y
                        base = y if base is None else base
                        err = rel(y, base)
                        ms = bench.time_ms(fn)
                    add(kind="time", d=d, n=n, mod=mod, variant=variant, ms=ms, TFLOPs=flops / ms / 1e9, err=err)
                except Exception as e:  # noqa: BLE001
                    add(kind="time", d=d, n=n, mod=mod, variant=variant, error=f"{type(e).__name__}: {str(e)[:300]}")
        del q, k, v
        torch.cuda.empty_cache()
    # the table: each variant's TFLOP/s per visible FLOP, its ratio to flex's time and (the window) to dense causal
    t = {(r["d"], r["mod"], r["variant"]): r for r in rows if r.get("kind") == "time" and "ms" in r}
    print(f"\n{'D':>4} {'mask':<15} {'variant':<32} {'ms':>8} {'TFLOP/s':>8} {'flex/ours':>9} {'/causal':>8} err")
    for (d, mod, variant), r in t.items():
        fx = t.get((d, mod, "flex"))
        dense = t.get((d, "dense_causal", "lesson 7"))
        ratio = f"{fx['ms'] / r['ms']:9.2f}" if fx else f"{'':>9}"
        per = f"{r['TFLOPs'] / dense['TFLOPs']:8.2f}" if dense else f"{'':>8}"
        print(f"{d:>4} {mod:<15} {variant:<32} {r['ms']:8.3f} {r['TFLOPs']:8.1f} {ratio} {per} {r['err']:.1e}")
    for r in rows:
        if "error" in r:
            print("ERR", r.get("kind"), r.get("d"), r.get("mod"), r.get("variant"), r["error"][:200])


if __name__ == "__main__":
    main()
