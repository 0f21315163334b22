"""Probe: residual + dropout + norm's backward as shipped until 2026-11-27 (``before``), as shipped now
(``ship``) and ``probe_dropout_norm_h200.py``'s ``tile2d`` copy of the same tile, A/B, with evidence that is
not the timing itself; and the backward's candidates for the hidden-4096 bar on an H200.

    PYTHONPATH=. python3 benchmarks/probes/probe_dropout_norm_ab.py [--budget 170] [--sections ncu,cands2]
    PYTHONPATH=. python3 benchmarks/probes/probe_dropout_norm_ab.py --check      # CPU: same op, same mask

Why: on an H200 (2026-11-27) the shipped backward at 32768 x 8192 was up to 19 points of copy below
``tile2d`` in one run (RMSNorm 72.9% against 92.0%), though both held the row as the same 2-D tile, and the
shipped backward at 32768 x 4096 reached 79.8% of copy (bar 90%). Compiled for sm_90 on a CPU (Triton 3.9),
``before`` addressed dy and grad_h through their own row strides, h, dr and dx through N: three offset
tensors where tile2d has one, and at 16 warps (128 registers a thread) it spilled (RMSNorm 8192: 40 bytes of
stack, 10 LDL and 10 STL in its SASS; LayerNorm 8192: 16 bytes). ``ship`` makes dy and grad_h
row-contiguous and addresses all five with one offset (its SASS then had tile2d's opcode counts at five
launches), and takes the three trims below (its SASS within a few instructions of tile2d's with them).

One GPU (an H100 or an H200), bf16, p = 0.1, a 64-bit seed (as the suite's fresh seeds); JSON to
``$OUT/probe_dropout_norm_ab.json``, the compiled code to ``$OUT/dropout_norm_asm/``. Sections, in this
order, each left out once ``--budget`` seconds are spent (the JSON says which):

1. ``build``: each case's kernels (forward: ship and tile2d; backward: before, ship and tile2d) as they
   were launched: grid, every scalar argument with what Triton specialises on (1, a multiple of 16, int32
   or int64: the seed and offset included), constexprs, num_warps, num_stages, shared memory, registers and
   spills (Triton's count and cuobjdump's REG/STACK); the TTGIR and PTX written out, and what differs from
   tile2d's: layouts, TTGIR ops in order, PTX and SASS instructions (``LDL``/``STL``: spills).
2. ``order``: forward and backward on the GPU's clock in both orders in one process (before, ship,
   tile2d, tile2d, ship, before).
3. ``ncu``: the backward kernels at the two cases of the gap (and the forward at LayerNorm 32768 x 8192)
   under Nsight Compute, caches flushed: DRAM bytes against the fused ledger (re-reads show there), L2
   bytes, local-memory sectors (spills), registers, achieved occupancy, issue activity, instructions, the
   SM clock.
4. ``cands``: the backward at 32768 rows as candidates to ship: tile2d's launches (warps, programs an SM,
   row stages) and its trims (``U32``: the keep test as one unsigned compare; ``EVEN``: the column test
   folded when N fills the tile; ``DB=False``: no db sums without a bias), the shipped kernel at 4 warps.
5. ``alone``: each variant timed in a process of its own, at the two cases of the gap.

``--sections`` picks some (default: those five); ``cands2`` is the second round at 32768 x 4096 (two rows a
step, four row stages, the package's kernel beside tile2d with and without the trims), whose best launch
ships on an H200. Results: ``notes_lesson4b.md`` § 2026-11-27: the backward's gap to ``tile2d``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import difflib
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe_dropout_norm_h200 as P  # noqa: E402  (this folder: the tile2d variant, inputs, training)

from fusionlab import bench, runtime  # noqa: E402
from fusionlab.kernels import dropout_norm as dn  # noqa: E402
from fusionlab.kernels._launch import dram_gbps  # noqa: E402
from fusionlab.measure import ncu as NCU  # noqa: E402

SEED = 2**40 + 1234  # 64-bit, as the fresh seeds (new_seed) the suite runs with
#: the gap's case first (RMSNorm 8192: 72.9% against 92.0%), then the bar's (LayerNorm 4096, the suite's)
CASES = (("rmsnorm", 32768, 8192), ("layernorm", 32768, 4096), ("layernorm", 32768, 8192), ("rmsnorm", 32768, 4096))
#: ``before``: the backward as shipped until this probe (fcd5ef9); ``ship``: the package as it is now
VARIANTS = ("before", "ship", "tile2d")
ALONE = [(c, v) for c in CASES[:2] for v in VARIANTS]
NCU_PLAN = [(c, v, "bwd") for c in CASES[:2] for v in VARIANTS] + [(CASES[2], v, "fwd") for v in ("ship", "tile2d")]
NCU_METRICS = (
    "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum",
    "l1tex__t_sectors_pipe_lsu_mem_local_op_ld.sum", "l1tex__t_sectors_pipe_lsu_mem_local_op_st.sum",
    "launch__registers_per_thread", "launch__grid_size", "launch__block_size", "launch__occupancy_limit_registers",
    "sm__warps_active.avg.pct_of_peak_sustained_active", "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "smsp__inst_executed.sum", "sm__cycles_elapsed.avg.per_second",
)  # fmt: skip
KERNELS = r"_dropout_norm_(fwd|bwd)_kernel|_fwd_2d|_bwd_2d|_bwd_before"
SHIP_KEYS = ("num_warps", "programs", "row_stages", "BLOCK_M")  # what the package's configuration holds
SECTIONS = ("build", "order", "ncu", "cands", "alone", "cands2")
OUT = os.environ.get("OUT", ".")
DEVICE = "cuda" if runtime.is_gpu() else "cpu"


# -- "before": the shipped backward as it was (dropout_norm.py at fcd5ef9), its single-tile path verbatim ---------
@triton.jit(do_not_specialize=["seed", "offset"])
def _bwd_before(
    dy_ptr, gh_ptr, h_ptr, w_ptr, mean_ptr, rstd_ptr, dr_ptr, dx_ptr, part_ptr,
    n_rows, n_cols, rows_per_program, stride_dy, stride_gh, seed, offset, threshold, scale,
    BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, RMS: tl.constexpr,
    HAS_GH: tl.constexpr, DROPOUT: tl.constexpr, INT64: tl.constexpr, NUM_STAGES: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    n_q = (n_cols + 3) // 4
    tile = tl.arange(0, 4 * BLOCK_Q)
    cols = tile[None, :]
    col_ok = cols < n_cols
    w = tl.load(w_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_M, 4 * BLOCK_Q], dtype=tl.float32)
    db = tl.zeros([BLOCK_M, 4 * BLOCK_Q], dtype=tl.float32)
    for m0 in tl.range(row_start, row_end, BLOCK_M, num_stages=NUM_STAGES):
        rows = m0 + tl.arange(0, BLOCK_M)
        row_ok = rows < row_end
        rows2 = rows[:, None]
        if INT64:
            rows2 = rows2.to(tl.int64)
        mask = row_ok[:, None] & col_ok
        dy = tl.load(dy_ptr + rows2 * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
        h = tl.load(h_ptr + rows2 * n_cols + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(mean_ptr + rows, mask=row_ok, other=0.0)[:, None]
        rstd = tl.load(rstd_ptr + rows, mask=row_ok, other=0.0)[:, None]
        nh = tl.where(mask, (h - mean) * rstd, 0.0)
        g = dy * w
        c1 = (tl.sum(g * nh, axis=1) / n_cols)[:, None]
        if RMS:
            dh = rstd * (g - nh * c1)
        else:
            c2 = (tl.sum(g, axis=1) / n_cols)[:, None]
            dh = rstd * (g - c2 - nh * c1)
        if HAS_GH:
            dh += tl.load(gh_ptr + rows2 * stride_gh + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(dr_ptr + rows2 * n_cols + cols, dh.to(dr_ptr.dtype.element_ty), mask=mask)
        if DROPOUT:
            keep = P._keep_rows(seed, rows, n_q, offset, threshold, BLOCK_M, BLOCK_Q)  # fcd5ef9's _keep, INT64 off
            dh = tl.where(keep, dh * scale, 0.0)
        tl.store(dx_ptr + rows2 * n_cols + cols, dh.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * nh
        db += dy
    tl.store(part_ptr + pid * n_cols + tile, tl.sum(dw, axis=0), mask=tile < n_cols)
    tl.store(part_ptr + (n_programs + pid) * n_cols + tile, tl.sum(db, axis=0), mask=tile < n_cols)


class Before(torch.autograd.Function):
    """The package's forward; the backward as shipped before the fix, at the package's own launch."""

    @staticmethod
    def forward(ctx, x, r, w, b, norm):
        plan = dn._plan(x, r, w, b, P.P, norm, True, None, None, dn.OP)  # the default configuration's
        y, h, mean, rstd = dn._forward(plan, x, r, w, b, P.EPS, SEED, 0)
        ctx.save_for_backward(h, w, mean, rstd)
        ctx.args = (norm, b is not None)
        return y, h

    @staticmethod
    def backward(ctx, dy, gh):
        h, w, mean, rstd = ctx.saved_tensors
        norm, has_bias = ctx.args
        rows, n = h.shape
        cfg = dn.dropout_norm_config(rows, n, h.dtype, backward=True)
        bm = cfg["BLOCK_M"] if runtime.is_gpu() else 1
        per = triton.cdiv(triton.cdiv(rows, cfg["programs"]), bm) * bm
        programs = triton.cdiv(rows, per)
        dr, dx = torch.empty_like(h), torch.empty_like(h)
        part = torch.empty((2, programs, n), device=h.device, dtype=torch.float32)
        _bwd_before[(programs,)](
            dy, gh, h, w, mean, rstd, dr, dx, part, rows, n, per, dy.stride(0), gh.stride(0), SEED, 0,
            dn._threshold(P.P), 1.0 / (1.0 - P.P), BLOCK_M=bm, BLOCK_Q=cfg["BLOCK_N"] // 4, RMS=norm == "rmsnorm",
            HAS_GH=True, DROPOUT=True, INT64=False, NUM_STAGES=cfg["row_stages"] if runtime.is_gpu() else 1,
            **P._kw(cfg["num_warps"]),
        )  # fmt: skip
        sums = dn.sum_partials(part if has_bias else part[:1], w.dtype, checked=True)
        return dx, dr, sums[0], (sums[1] if has_bias else None), None


# -- the variants ----------------------------------------------------------------------------------------------
def shipped_launch(rows, n):
    """tile2d's forward and backward launch dicts equal to the shipped op's own configuration."""
    f = dn.dropout_norm_config(rows, n, P.DT)
    b = dn.dropout_norm_config(rows, n, P.DT, backward=True)
    vb = {k: b[k] for k in SHIP_KEYS}
    return {"BLOCK_M": 1, "num_warps": f["num_warps"]}, vb


def variant(name, norm, rows, n, bwd=None):
    """``fn(x, r, w, b) -> (y, h)``: ``"ship"`` (the package) or ``"tile2d"`` at the shipped launch, its
    backward's launch updated with ``bwd``."""
    if name == "ship":
        return lambda x, r, w, b: dn.dropout_norm(x, r, w, b, P.P, norm=norm, seed=SEED)
    if name == "before":
        return lambda x, r, w, b: Before.apply(x, r, w, b, norm)
    vf, vb = shipped_launch(rows, n)
    vb = dict(vb, **(bwd or {}))
    return lambda x, r, w, b: P.tile2d(x, r, w, b, norm, SEED, vf, vb)


def ledger_bytes(norm, rows, n):
    return (dn.dropout_norm_ledger(rows, n, P.DT, norm=norm).fused_bytes,
            dn.dropout_norm_ledger(rows, n, P.DT, norm=norm, backward=True).fused_bytes)  # fmt: skip


def gpu_state() -> str:
    """nvidia-smi's clocks, power, temperature and throttle reasons now (one line), or why not."""
    q = "clocks.sm,clocks.mem,clocks.max.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"
    try:
        r = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader", "-i",
                            str(torch.cuda.current_device())], capture_output=True, text=True, timeout=10)  # fmt: skip
        return r.stdout.strip() or r.stderr.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvidia-smi: {e}"


# -- 1. what was launched, and what it compiled to ------------------------------------------------------------
class Watch:
    """Stands in for a :class:`~fusionlab.kernels._launch.Launcher` (``launcher(grid, *args, **kw)``) or a
    jitted kernel (``kernel[grid](*args, **kw)``) and keeps each launch with the compiled kernel it ran."""

    def __init__(self, real):
        self.real, self.log = real, []
        fn = getattr(real, "kernel", real)
        self.names = list(getattr(fn, "arg_names", []))

    def __call__(self, grid, *args, **kwargs):
        compiled = self.real(grid, *args, **kwargs)
        self.log.append((grid, args, kwargs, compiled))
        return compiled

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            compiled = self.real[grid](*args, **kwargs)
            self.log.append((grid, args, kwargs, compiled))
            return compiled

        return run


@contextlib.contextmanager
def watching():
    here = sys.modules[__name__]  # this script (__main__), whose Before.backward launches _bwd_before
    names = {"ship fwd": (dn, "_launch_fwd"), "ship bwd": (dn, "_launch_bwd"), "tile2d fwd": (P, "_fwd_2d"),
             "tile2d bwd": (P, "_bwd_2d"), "before bwd": (here, "_bwd_before")}  # fmt: skip
    saved = {k: getattr(m, a) for k, (m, a) in names.items()}
    watches = {k: Watch(v) for k, v in saved.items()}
    for k, (m, a) in names.items():
        setattr(m, a, watches[k])
    try:
        yield watches
    finally:
        for k, (m, a) in names.items():
            setattr(m, a, saved[k])


def _scalar(v):
    if isinstance(v, torch.Tensor):
        return {"tensor": str(v.dtype), "shape": list(v.shape), "stride": list(v.stride()),
                "align16": v.data_ptr() % 16 == 0}  # fmt: skip
    if isinstance(v, bool) or not isinstance(v, int):
        return {"value": v if isinstance(v, (float, bool)) else str(v), "type": type(v).__name__}
    return {"value": v, "is_1": v == 1, "div16": v % 16 == 0, "type": "i32" if -(2**31) <= v < 2**31 else "i64"}


def describe(watch: Watch, launch) -> dict:
    grid, args, kwargs, compiled = launch
    out = {"grid": list(grid), "args": {n: _scalar(a) for n, a in zip(watch.names, args, strict=False)},
           "kwargs": {k: v for k, v in kwargs.items() if k != "key"}}  # fmt: skip
    with contextlib.suppress(Exception):
        compiled._init_handles()
    for attr in ("n_regs", "n_spills", "n_max_threads"):
        out[attr] = getattr(compiled, attr, None)
    meta = getattr(compiled, "metadata", None)
    meta = meta._asdict() if hasattr(meta, "_asdict") else dict(vars(meta)) if meta is not None else {}
    keep = ("num_warps", "num_stages", "num_ctas", "shared", "maxnreg", "launch_pdl", "cluster_dims", "name")
    out["metadata"] = {
        k: meta[k] if isinstance(meta[k], (int, float, bool)) else str(meta[k]) for k in keep if k in meta
    }
    src = getattr(compiled, "src", None)
    for attr in ("signature", "attrs", "constants"):
        with contextlib.suppress(Exception):
            out[attr] = str(getattr(src, attr))
    return out


def _tool(name):
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def sass(cubin: bytes) -> dict:
    """cuobjdump on the cubin: REG/STACK (spill stack bytes a thread) and the SASS opcode counts."""
    out = {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        try:
            res = subprocess.run([_tool("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True).stdout
            code = subprocess.run([_tool("cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
        except OSError as e:
            return {"error": str(e)}
    m = re.search(r"REG:(\d+).*?STACK:(\d+).*?SHARED:(\d+)", res)
    if m:
        out.update(REG=int(m.group(1)), STACK=int(m.group(2)), SHARED=int(m.group(3)))
    ops = collections.Counter()
    for line in code.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            ops[m.group(1)] += 1
    out["ops"] = dict(ops)
    out["total"] = sum(ops.values())
    return out


def ttgir_ops(text: str) -> collections.Counter:
    return collections.Counter(re.findall(r"(?:=\s+|^\s+)([a-z_]+\.[a-z_.]+)\b", text, re.M))


def ttgir_sequence(text: str) -> list[str]:
    """The TTGIR's ops in order with their types, the SSA names and locations left out: two kernels that
    differ only in names compare equal line by line."""
    body = text.split("tt.func", 1)[-1]
    seq = []
    for line in body.splitlines():
        line = re.sub(r"loc\([^)]*\)|#loc\d*", "", line)
        m = re.search(r"(?:=\s+|^\s+)([a-z_]+\.[a-z_.]+)\b(.*)$", line)
        if m:
            seq.append(m.group(1) + " : " + " ".join(re.findall(r"tensor<[^>]*>", m.group(2))))
    return seq


def layouts(text: str) -> list[str]:
    return sorted(set(re.findall(r"^#\w+ = (#ttg\.\w+<.*>)$", text, re.M)))


def ptx_ops(text: str) -> collections.Counter:
    ops = collections.Counter()
    for line in text.split(".section\t.debug")[0].splitlines():
        s = line.strip()
        if not s or s[0] in "/.${}" or s.endswith(":"):
            continue
        s = re.sub(r"^@!?%p\d+\s+", "", s)
        ops[s.split()[0].rstrip(";")] += 1
    return ops


def code_of(compiled, stem: str) -> dict:
    """Write the TTGIR and PTX of ``compiled`` to ``stem``.{ttgir,ptx}; its op and instruction counts."""
    asm = getattr(compiled, "asm", {}) or {}
    for ext in ("ttgir", "ptx"):
        if ext in asm:
            with open(f"{stem}.{ext}", "w") as f:
                f.write(asm[ext])
    return {
        "layouts": layouts(asm.get("ttgir", "")),
        "ttgir_ops": dict(ttgir_ops(asm.get("ttgir", ""))),
        "ptx_ops": dict(ptx_ops(asm.get("ptx", ""))),
        "sass": sass(asm["cubin"]) if "cubin" in asm else {},
    }


def differences(a: dict, b: dict) -> dict:
    """What differs between two kernels' :func:`code_of` summaries (ship's count first)."""

    def diff(x, y):
        return {k: [x.get(k, 0), y.get(k, 0)] for k in sorted(set(x) | set(y)) if x.get(k, 0) != y.get(k, 0)}

    return {
        "same_layouts": a["layouts"] == b["layouts"],
        "layouts_only_ship": [s for s in a["layouts"] if s not in b["layouts"]],
        "layouts_only_tile2d": [s for s in b["layouts"] if s not in a["layouts"]],
        "ttgir_ops": diff(a["ttgir_ops"], b["ttgir_ops"]),
        "ptx_ops": diff(a["ptx_ops"], b["ptx_ops"]),
        "sass_ops": diff(a["sass"].get("ops", {}), b["sass"].get("ops", {})),
        "sass_total": [a["sass"].get("total"), b["sass"].get("total")],
        "REG/STACK": [[a["sass"].get("REG"), a["sass"].get("STACK")], [b["sass"].get("REG"), b["sass"].get("STACK")]],
    }


def _brief(v, d, code) -> str:
    m, sa = d["metadata"], code["sass"]
    return (f"{v} {m.get('num_warps')} warps {m.get('num_stages')} stages grid {d['grid']} regs {d['n_regs']} "
            f"spills {d['n_spills']} REG/STACK {sa.get('REG')}/{sa.get('STACK')} SASS {sa.get('total')} "
            f"LDL/STL {sa.get('ops', {}).get('LDL', 0)}/{sa.get('ops', {}).get('STL', 0)}")  # fmt: skip


def build_section(out, case):
    """Section 1 for one case: launch each variant once under :func:`watching`; describe every kernel, and
    compare each with tile2d's (``before`` runs the package's forward, so its forward is ship's)."""
    norm, rows, n = case
    t = P.inputs(rows, n, norm, DEVICE)
    folder = os.path.join(OUT, "dropout_norm_asm", f"{norm}_{rows}x{n}")
    os.makedirs(folder, exist_ok=True)
    got, code, ttgir = {}, {}, {}
    with watching() as w:
        for v in VARIANTS:  # "ship" after "before": the last forward the package launched is ship's
            P.training(variant(v, norm, rows, n), *t)  # one forward, one backward
    for key, watch in w.items():
        if not watch.log:
            continue
        launch = watch.log[-1]
        got[key] = describe(watch, launch)
        code[key] = code_of(launch[3], os.path.join(folder, key.replace(" ", "_")))
        got[key]["sass"] = {x: y for x, y in code[key]["sass"].items() if x != "ops"}
        ttgir[key] = ttgir_sequence(getattr(launch[3], "asm", {}).get("ttgir", ""))
    for key in [k for k in got if not k.startswith("tile2d")]:
        ref = "tile2d " + key.split()[1]
        udiff = list(difflib.unified_diff(ttgir[key], ttgir[ref], key, ref, lineterm="", n=1))
        with open(os.path.join(folder, f"ttgir_ops_{key.replace(' ', '_')}_vs_tile2d.diff"), "w") as f:
            f.write("\n".join(udiff))
        changed = sum(1 for u in udiff if u[:1] in "+-" and u[:3] not in ("+++", "---"))
        got[f"diff {key} vs tile2d"] = dict(differences(code[key], code[ref]), ttgir_sequence_lines_changed=changed)
    for key in got:
        if not key.startswith("diff"):
            print(f"  {norm:9s} {rows}x{n} {_brief(key, got[key], code[key])}", flush=True)
    for key in got:
        if key.startswith("diff"):
            dd = got[key]
            print(
                f"  {norm:9s} {rows}x{n} {key}: same layouts {dd['same_layouts']}, TTGIR ops changed "
                f"{dd['ttgir_sequence_lines_changed']}, SASS {dd['sass_total']}, REG/STACK {dd['REG/STACK']}, "
                f"LDL/STL {dd['sass_ops'].get('LDL', [0, 0])}/{dd['sass_ops'].get('STL', [0, 0])}",
                flush=True,
            )
    out["build"][f"{norm} {rows}x{n}"] = got


# -- 2. timing in both orders, one process ----------------------------------------------------------------------
def order_section(out, case, copy):
    norm, rows, n = case
    t = P.inputs(rows, n, norm, DEVICE)
    x, r, w, b = t[:4]
    fb, bb = ledger_bytes(norm, rows, n)
    fns = {v: variant(v, norm, rows, n) for v in VARIANTS}
    calls = {v: P.training(fns[v], *t)[0] for v in fns}
    for pos, v in enumerate(VARIANTS + VARIANTS[::-1]):
        with torch.no_grad():
            f_ms = bench.queued_ms(lambda v=v: fns[v](x, r, w, b))
        b_ms = bench.queued_ms(calls[v])
        row = dict(norm=norm, rows=rows, n=n, variant=v, position=pos, fwd_ms=f_ms, bwd_ms=b_ms,
                   fwd_frac=fb / (f_ms * 1e6) / copy, bwd_frac=bb / (b_ms * 1e6) / copy)  # fmt: skip
        out["order"].append(row)
        print(f"  {norm:9s} {rows}x{n} #{pos} {v:6s} fwd {f_ms * 1e3:7.1f} us {row['fwd_frac']:6.1%}  "
              f"bwd {b_ms * 1e3:7.1f} us {row['bwd_frac']:6.1%}", flush=True)  # fmt: skip
    del calls


# -- 3. Nsight Compute -------------------------------------------------------------------------------------------
def ncu_stages(*_args):
    """The ``fusionlab.measure.ncu`` target: a stage a line of :data:`NCU_PLAN` (one kernel each)."""
    stages = []
    for (norm, rows, n), v, d in NCU_PLAN:

        def build(norm=norm, rows=rows, n=n, v=v, d=d):
            t = P.inputs(rows, n, norm, DEVICE)
            fn = variant(v, norm, rows, n)
            if d == "bwd":
                return P.training(fn, *t)[0]

            def fwd():
                with torch.no_grad():
                    return fn(*t[:4])

            return fwd

        stages.append((f"{v} {d} {norm} {rows}x{n}", build))
    return stages


def _ncu_rows(text: str) -> list[dict]:
    rows = NCU._csv_rows(text)
    header, data = rows[0], rows[1:]
    col = {h: i for i, h in enumerate(header)}
    name = next(col[c] for c in NCU._NAME_COLUMNS if c in col)
    found: dict = {}
    for r in data:
        if len(r) < len(header) or not r[col["ID"]]:
            continue
        v = NCU._number(r[col["Metric Value"]])
        k = found.setdefault(r[col["ID"]], {"kernel": r[name]})
        if v is not None:
            try:  # bytes and nanoseconds to base units; counts (sectors, registers...) as they are
                v *= NCU._scale(r[col["Metric Unit"]] if "Metric Unit" in col else "")
            except ValueError:
                pass
            k[r[col["Metric Name"]]] = v
    return [found[i] for i in sorted(found, key=lambda i: int(i) if i.isdigit() else i)]


def ncu_section(out, left):
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, here, os.environ.get("PYTHONPATH"))))}
    for metrics in (NCU_METRICS, NCU.METRICS):  # the full set, else the four every profile reads
        try:
            cmd = NCU.command("probe_dropout_norm_ab:ncu_stages", (), metrics=metrics, kernels=KERNELS)
            text = NCU.run_ncu(cmd, timeout=max(30.0, left), env=env)
            break
        except (NCU.NcuFailed, NCU.NcuUnavailable, subprocess.TimeoutExpired) as e:
            out["ncu_error"] = f"{type(e).__name__}: {str(e)[-1500:]}"
            print(f"  ncu ({len(metrics)} metrics): {out['ncu_error'][:300]}", flush=True)
            if isinstance(e, NCU.NcuUnavailable):
                return
    else:
        return
    rows = _ncu_rows(text)
    if len(rows) != len(NCU_PLAN):
        out["ncu_note"] = f"{len(rows)} kernels profiled for {len(NCU_PLAN)} stages: matched by order and name"
    for ((norm, nrows, n), v, d), k in zip(NCU_PLAN, rows, strict=False):
        fb, bb = ledger_bytes(norm, nrows, n)
        led = bb if d == "bwd" else fb
        dram = k.get("dram__bytes_read.sum", 0) + k.get("dram__bytes_write.sum", 0)
        k.update(norm=norm, rows=nrows, n=n, variant=v, dir=d, ledger_bytes=led, dram_over_ledger=dram / led)
        out["ncu"].append(k)
        g = k.get
        print(f"  {v:6s} {d} {norm:9s} {nrows}x{n} [{k['kernel'][:24]}] {g(NCU_METRICS[0], 0) / 1e3:7.1f} us DRAM "
              f"{dram / led:.3f}x ledger (read {g(NCU_METRICS[1], 0) / 2**20:.0f} MiB, written "
              f"{g(NCU_METRICS[2], 0) / 2**20:.0f} MiB), L2 {g(NCU_METRICS[3], 0) / led:.2f}x, local sectors "
              f"{g(NCU_METRICS[4], '-')}/{g(NCU_METRICS[5], '-')}, regs {g(NCU_METRICS[6], '-')}, occupancy "
              f"{g(NCU_METRICS[10], '-')}%, issue {g(NCU_METRICS[11], '-')}%, SM clock "
              f"{g(NCU_METRICS[13], 0) / 1e9:.2f} GHz",
              flush=True)  # fmt: skip


# -- 4. candidates ---------------------------------------------------------------------------------------------
def candidates(norm, n, sms):
    """``(label, variant, bwd launch)`` for the backward at 32768 rows x ``n``."""
    trims = {"U32": True, "EVEN": True, "DB": norm == "layernorm"}

    def at(warps, per_sm, stages=3, **kw):
        return {"num_warps": warps, "programs": per_sm * sms, "row_stages": stages, **kw}

    # the launches near the 2026-11-26 H200 probe's best (4 warps, 4 programs an SM) and the H100 sweep's
    # (8 warps, 1 an SM), two rows a step, one more stage; then the trims at the three likeliest launches

    if n >= 8192:
        return [("tile2d 16w 1/SM", "tile2d", at(16, 1)), ("tile2d 16w 1/SM trims", "tile2d", at(16, 1, **trims))]
    return [
        ("tile2d 8w 2/SM (shipped launch)", "tile2d", at(8, 2)),
        ("tile2d 8w 1/SM", "tile2d", at(8, 1)),
        ("tile2d 4w 4/SM", "tile2d", at(4, 4)),
        ("tile2d 4w 2/SM", "tile2d", at(4, 2)),
        ("tile2d 8w 2/SM 4 stages", "tile2d", at(8, 2, 4)),
        ("tile2d 8w 2/SM 2 rows a step", "tile2d", at(8, 2, BLOCK_M=2)),
        ("tile2d 8w 2/SM trims", "tile2d", at(8, 2, **trims)),
        ("tile2d 8w 1/SM trims", "tile2d", at(8, 1, **trims)),
        ("tile2d 4w 4/SM trims", "tile2d", at(4, 4, **trims)),
        ("ship 4w 4/SM", "ship", {"num_warps": 4, "programs": 4 * sms}),
    ]


def candidates_2(norm, n, sms):
    """The second round (2026-11-27, after the first on an H200: at 32768 x 4096 two rows a step reached 89.6%
    LayerNorm, 88.5% RMSNorm; four row stages 85.9% and 89.8%; the trims -1.7 points LayerNorm, +4 RMSNorm at
    8 warps, 2 an SM): those two together, their programs an SM, the package's kernel (with the trims) beside
    tile2d without them and with them."""
    trims = {"U32": True, "EVEN": True, "DB": norm == "layernorm"}

    def at(warps, per_sm, stages=3, rows=1, **kw):
        return {"num_warps": warps, "programs": per_sm * sms, "row_stages": stages, "BLOCK_M": rows, **kw}

    out = []
    for label, cfg in (
        ("8w 2/SM", at(8, 2)),
        ("8w 2/SM 2 rows", at(8, 2, rows=2)),
        ("8w 1/SM 2 rows", at(8, 1, rows=2)),
        ("8w 2/SM 4 stages", at(8, 2, 4)),
        ("8w 2/SM 2 rows 4 stages", at(8, 2, 4, rows=2)),
        ("16w 1/SM 2 rows", at(16, 1, rows=2)),
        ("4w 2/SM", at(4, 2)),
    ):
        out.append((f"ship {label}", "ship", cfg))
        if "2 rows" in label and "16w" not in label or label == "8w 2/SM 4 stages":
            out += [(f"tile2d {label}", "tile2d", cfg), (f"tile2d {label} trims", "tile2d", dict(cfg, **trims))]
    return out


def cands_section(out, case, copy, sms, deadline, which=candidates):
    norm, rows, n = case
    t = P.inputs(rows, n, norm, DEVICE)
    bb = ledger_bytes(norm, rows, n)[1]
    for label, v, cfg in which(norm, n, sms):
        if time.monotonic() > deadline:
            out["skipped"].append(f"cands {norm} {rows}x{n} {label}")
            continue
        if v == "ship":
            with P.shipped_config(bwd={k: x for k, x in cfg.items() if k in SHIP_KEYS}):
                call = P.training(variant("ship", norm, rows, n), *t)[0]
                ms = bench.queued_ms(call)
        else:
            call = P.training(variant(v, norm, rows, n, cfg), *t)[0]
            ms = bench.queued_ms(call)
        del call
        frac = bb / (ms * 1e6) / copy
        out["cands"].append(dict(norm=norm, rows=rows, n=n, label=label, config=cfg, bwd_ms=ms, bwd_frac=frac))
        print(f"  {norm:9s} {rows}x{n} bwd {label:34s} {ms * 1e3:7.1f} us {frac:6.1%}", flush=True)


# -- 5. each alone ----------------------------------------------------------------------------------------------
def alone_child(v, norm, rows, n):
    """``--alone``: one variant at one case in this fresh process; one JSON line on stdout."""
    copy = bench.measure_copy_bandwidth()
    t = P.inputs(rows, n, norm, DEVICE)
    fb, bb = ledger_bytes(norm, rows, n)
    fn = variant(v, norm, rows, n)
    with torch.no_grad():
        f_ms = bench.queued_ms(lambda: fn(*t[:4]))
    b_ms = bench.queued_ms(P.training(fn, *t)[0])
    row = dict(norm=norm, rows=rows, n=n, variant=v, copy_GBps=copy, fwd_ms=f_ms, bwd_ms=b_ms,
               fwd_frac=fb / (f_ms * 1e6) / copy, bwd_frac=bb / (b_ms * 1e6) / copy)  # fmt: skip
    print("ALONE " + json.dumps(row))


def alone_section(out, deadline):
    for (norm, rows, n), v in ALONE:
        left = deadline - time.monotonic()
        if left < 12:
            out["skipped"].append(f"alone {v} {norm} {rows}x{n}")
            continue
        cmd = [sys.executable, os.path.abspath(__file__), "--alone", v, norm, str(rows), str(n)]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired:
            out["skipped"].append(f"alone {v} {norm} {rows}x{n} (timed out)")
            continue
        line = next((s for s in r.stdout.splitlines() if s.startswith("ALONE ")), None)
        if line is None:
            out["skipped"].append(f"alone {v} {norm} {rows}x{n}: {r.stderr[-400:]}")
            continue
        row = json.loads(line[6:])
        out["alone"].append(row)
        print(f"  alone {v:6s} {norm:9s} {rows}x{n} fwd {row['fwd_ms'] * 1e3:7.1f} us {row['fwd_frac']:6.1%}  "
              f"bwd {row['bwd_ms'] * 1e3:7.1f} us {row['bwd_frac']:6.1%}  (copy {row['copy_GBps']:.0f} GB/s)",
              flush=True)  # fmt: skip


# -- CPU: the trims compute the shipped op ----------------------------------------------------------------------------
def check():
    """``--check`` (Triton's interpreter, fp32): tile2d with each trim gives the shipped op's h bit for bit
    and its dx zero exactly where the shipped dx is (the same mask), the rest within rounding."""
    ok = True
    for norm in P.NORMS:
        for rows, n in ((8, 64), (5, 100)):
            x, r, w, b, gy, gh = P.inputs(rows, n, norm, "cpu")

            def ship(x, r, w, b, norm=norm):
                return dn.dropout_norm(x, r, w, b, P.P, norm=norm, seed=SEED)

            _, ref_out, ref_grads = P.training(ship, x, r, w, b, gy, gh)
            _, out, grads = P.training(variant("before", norm, rows, n), x, r, w, b, gy, gh)
            res = P.same_op(ref_out, ref_grads, out, grads)
            print(norm, rows, n, "before", res)
            ok &= res["ok"]
            for trims in ({"U32": True}, {"DB": norm == "layernorm"}, {"EVEN": True}):
                if trims.get("EVEN") and n != triton.next_power_of_2(n):
                    continue
                v = {"BLOCK_M": 1, "num_warps": 4, "programs": 2, "row_stages": 1, **trims}
                fn = lambda x, r, w, b, norm=norm, v=v: P.tile2d(x, r, w, b, norm, SEED, v, v)  # noqa: E731
                _, out, grads = P.training(fn, x, r, w, b, gy, gh)
                res = P.same_op(ref_out, ref_grads, out, grads)
                print(norm, rows, n, trims, res)
                ok &= res["ok"]
    print("check:", "before and every trim compute the shipped op" if ok else "DIFFERENT")
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", type=float, default=170.0, help="seconds; sections past it are left out")
    ap.add_argument("--check", action="store_true", help="CPU: the trims against the shipped op")
    ap.add_argument("--alone", nargs=4, metavar=("VARIANT", "NORM", "ROWS", "N"), help=argparse.SUPPRESS)
    ap.add_argument("--sections", default=",".join(SECTIONS[:5]), help=f"some of {','.join(SECTIONS)}")
    a = ap.parse_args()
    want = set(a.sections.split(","))
    if a.check:
        raise SystemExit(0 if check() else 1)
    if a.alone:
        v, norm, rows, n = a.alone
        return alone_child(v, norm, int(rows), int(n))
    t0 = time.monotonic()
    deadline = t0 + a.budget
    copy = bench.measure_copy_bandwidth()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    name = torch.cuda.get_device_name()
    print(f"{name}, {sms} SMs, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s; "
          f"nvidia-smi: {gpu_state()}", flush=True)  # fmt: skip
    out = {"device": name, "sms": sms, "torch": torch.__version__, "triton": triton.__version__, "copy_GBps": copy,
           "dram_gbps_driver": dram_gbps(),
           "gpu_state": [gpu_state()], "build": {}, "order": [], "ncu": [], "cands": [], "alone": [], "skipped": [],
           "sections_s": {}}  # fmt: skip

    def section(label, fn, *args, reserve=0.0):
        if time.monotonic() > deadline - reserve:
            out["skipped"].append(label)
            print(f"[{label}] left out: budget spent", flush=True)
            return
        print(f"[{label}]", flush=True)
        s0 = time.monotonic()
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001 - a section's failure is reported, the others still run
            out.setdefault("errors", []).append(f"{label}: {type(e).__name__}: {e}"[:1500])
            print(f"  FAILED: {type(e).__name__}: {str(e)[:400]}", flush=True)
        out["sections_s"][label] = round(time.monotonic() - s0, 1)
        torch.cuda.empty_cache()

    for case in CASES if "build" in want else ():
        section(f"build {case}", build_section, out, case)
    for case in CASES if "order" in want else ():
        section(f"order {case}", order_section, out, case, copy)
    out["gpu_state"].append(gpu_state())
    if "ncu" in want:
        section("ncu", lambda: ncu_section(out, max(60.0, deadline - time.monotonic() - 40)))
    for case in (CASES[1], CASES[3]) if "cands2" in want else ():
        section(f"cands2 {case}", cands_section, out, case, copy, sms, deadline - 5, candidates_2)
    for case in (CASES[1], CASES[3], CASES[0], CASES[2]) if "cands" in want else ():
        section(f"cands {case}", cands_section, out, case, copy, sms, deadline - 25)
    if "alone" in want:
        section("alone", alone_section, out, deadline + 10)
    out["gpu_state"].append(gpu_state())
    out["seconds"] = time.monotonic() - t0
    dest = os.path.join(
        OUT, f"probe_dropout_norm_ab{'' if want == set(SECTIONS[:5]) else '_' + '_'.join(sorted(want))}.json"
    )
    with open(dest, "w") as f:
        json.dump(out, f, indent=1, default=str)
    print(f"left out: {out['skipped'] or 'nothing'}; errors: {len(out.get('errors', []))}; {out['seconds']:.0f} s; "
          f"wrote {dest}")  # fmt: skip


if __name__ == "__main__":
    if runtime.is_gpu() or "--check" in sys.argv:
        main()
    else:
        raise SystemExit("probe_dropout_norm_ab: needs a CUDA GPU (or --check, on the CPU)")
