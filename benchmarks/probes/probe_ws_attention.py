"""Does Triton's automatic warp specialisation speed up the attention forward on Hopper, and is it right?

    PYTHONPATH=. python3 benchmarks/probes/probe_ws_attention.py [--out $OUT] [--deadline 170] [--only fp8]

FlashAttention-3's first step is warp specialisation: producer warps issue the copy engine's loads while
consumer warps do the matmuls and the softmax. Triton 3.6 does it automatically for a loop written
``tl.range(..., warp_specialize=True)`` — on Hopper only for loads through device-side tensor descriptors
(``tl.make_tensor_descriptor``), as its fused-attention tutorial (06) writes its forward. This probe
carries that tutorial-style forward (its own variant of a kernel: non-causal, device-side descriptors per
head, ``num_warps=4``, ``BLOCK_M=128``, one online-softmax loop) and times it with and without
``warp_specialize`` at stages 2, 3, 4, BLOCK_N 64 and 128, at the shapes of ``CASES`` (head dims 64 and 128, fp16 and
bf16, N = 4k and 16k, 16k x 16 token-heads), against the package's forward (``attention``, its Hopper defaults).

The same probe runs the package's FP8 forward (``fusionlab.kernels.attention_fp8``, config ``"WS"``) with
its unmasked loop warp-specialised and not, at a few tiles. Each shape runs in a child process: a
compiler that aborts on an assertion (Triton 3.9's warp-specialisation pass does, for the FP8 kernel at
4 warps, compiled for sm_90 on a CPU) takes the child, the configuration is recorded as a crash, and a
new child goes on after it.

Every result is checked before it is timed: the count of non-finite values in the whole output, and
the norm-relative error of head 0 against float64 (``attention_reference``) — an H100 once gave 16.5M
non-finite values of 16.8M from the tutorial's own warp-specialised forward at D 64, N 16384, fp16 with 3
and 4 stages. A configuration that fails to compile is recorded with its error. JSON rows to
``$OUT/ws_attention.json``; one line per row on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback

import torch
import triton
import triton.language as tl

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
#: (kernel, head dim, dtype, N), in the order run until the deadline: the bar's head dim, the shape that
#: returned non-finite values, the FP8 forward's loop warp-specialised, then the rest
CASES = [("tutorial", 128, "bf16", 16384), ("tutorial", 64, "fp16", 16384), ("fp8", 128, "bf16", 16384),
         ("tutorial", 128, "bf16", 4096), ("tutorial", 64, "fp16", 4096), ("tutorial", 128, "fp16", 16384)]  # fmt: skip
#: the FP8 forward's tiles tried with its loop warp-specialised and not: (BLOCK_M, BLOCK_N, warps, stages)
FP8_TILES = [(128, 128, 8, 3), (128, 64, 4, 3), (128, 128, 4, 2)]


@triton.jit
def _ws_fwd(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, sm_scale, H, N_CTX,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WS: tl.constexpr,
    STAGES: tl.constexpr,
):  # fmt: skip
    # the tutorial's shape: one program per (query tile, batch x head), descriptors made on the device
    # over the whole (B H N, D) rows, the K/V loop pipelined (and warp-specialised when WS)
    start_m = tl.program_id(0)
    off_hz = tl.program_id(1)
    y_dim = tl.num_programs(1) * N_CTX
    desc_q = tl.make_tensor_descriptor(q_ptr, shape=[y_dim, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM])  # fmt: skip
    desc_k = tl.make_tensor_descriptor(k_ptr, shape=[y_dim, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])  # fmt: skip
    desc_v = tl.make_tensor_descriptor(v_ptr, shape=[y_dim, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_N, HEAD_DIM])  # fmt: skip
    desc_o = tl.make_tensor_descriptor(o_ptr, shape=[y_dim, HEAD_DIM], strides=[HEAD_DIM, 1],
                                       block_shape=[BLOCK_M, HEAD_DIM])  # fmt: skip
    offset_y = off_hz * N_CTX
    qo_y = offset_y + start_m * BLOCK_M
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32) + 1.0
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    qk_scale = sm_scale * 1.44269504
    q = desc_q.load([qo_y, 0])
    for start_n in tl.range(0, N_CTX, BLOCK_N, num_stages=STAGES, warp_specialize=WS):
        k = desc_k.load([offset_y + start_n, 0]).T
        qk = tl.dot(q, k)
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = desc_v.load([offset_y + start_n, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    m_i += tl.math.log2(l_i)
    acc = acc / l_i[:, None]
    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    tl.store(lse_ptr + off_hz * N_CTX + offs_m, m_i * 0.6931471805599453)
    desc_o.store([qo_y, 0], acc.to(q.dtype))


def ws_forward(q, k, v, block_n, stages, ws):
    B, H, N, D = q.shape
    o = torch.empty_like(q)
    lse = torch.empty((B, H, N), device=q.device, dtype=torch.float32)
    _ws_fwd[(N // 128, B * H)](q, k, v, o, lse, D**-0.5, H, N, HEAD_DIM=D, BLOCK_M=128, BLOCK_N=block_n, WS=ws,
                               STAGES=stages, num_warps=4, num_stages=stages)  # fmt: skip
    return o, lse


def _configs(kind: str) -> list[dict]:
    if kind == "fp8":  # the package's FP8 forward, its loop warp-specialised or not
        return [{"tile": t, "ws": ws} for t in FP8_TILES for ws in (False, True)]
    return [{"block_n": bn, "stages": st, "ws": ws} for bn in (64, 128) for st in (2, 3, 4) for ws in (False, True)]


def child(case: str, start: int, jsonl: str, until: float) -> None:
    """One shape's configurations from ``start`` on, each row appended to ``jsonl`` as it is measured; a
    ``starting`` line before each, so that the parent can name a configuration that killed the process."""
    from fusionlab.kernels.attention import attention, attention_flops, attention_reference
    from fusionlab.kernels.attention_fp8 import attention_fp8_quantized, quantize_fp8

    # device-side descriptors need a global scratch allocation per launch
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device="cuda", dtype=torch.int8))
    kind, d, dname, n = case.split(",")
    d, n = int(d), int(n)
    B, H = max(1, 16384 // n), 16
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, H, n, d, device="cuda", dtype=DTYPES[dname], generator=g) for _ in range(3))
    ref = attention_reference(q[:1, :1], k[:1, :1], v[:1, :1])[0][0, 0].double()
    flops = attention_flops(B, H, n, n, d, False)
    shape = {"d": d, "n": n, "dtype": dname, "B": B, "H": H}

    def emit(row):
        with open(jsonl, "a") as f:
            f.write(json.dumps(row) + "\n")

    def rel(o):
        return float((o[0, 0].double() - ref).norm() / ref.norm())

    def timed(row, fn):
        o = fn()[0]
        torch.cuda.synchronize()
        row.update(nonfinite=int((~torch.isfinite(o)).sum()), err=rel(o))
        ms = triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")
        row.update(ms=ms, tflops=flops / ms * 1e-9)
        return row

    if start == 0 and kind == "tutorial":
        emit(timed({"kind": "package", **shape}, lambda: attention(q, k, v)))
    for i, cfg in enumerate(_configs(kind)):
        if i < start:
            continue
        if time.time() > until:
            break
        emit({"kind": "starting", "i": i})
        row = {"kind": kind, **shape, **cfg}
        try:
            if kind == "fp8":
                bm, bn, nw, ns = cfg["tile"]
                x = quantize_fp8(q, k, v, bm, bn)
                c = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": nw, "num_stages": ns, "WS": cfg["ws"]}
                timed(row, lambda x=x, c=c: attention_fp8_quantized(x, config=c))
            else:
                timed(row, lambda c=cfg: ws_forward(q, k, v, c["block_n"], c["stages"], c["ws"]))
        except Exception as e:  # noqa: BLE001  (a configuration that does not build is a result)
            row["error"] = f"{type(e).__name__}: {e}"[:400]
            row["trace"] = traceback.format_exc()[-600:]
        emit(row)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--deadline", type=float, default=170.0, help="seconds after which no new case starts")
    ap.add_argument("--only", default=None, help="run only the CASES of this kernel: tutorial or fp8")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--jsonl", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--until", type=float, default=0.0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.start, a.jsonl, a.until)
    t0 = time.time()
    until = t0 + a.deadline
    rows = [{"kind": "device", "name": torch.cuda.get_device_name(), "torch": torch.__version__,
             "triton": triton.__version__, "date": time.strftime("%Y-%m-%d")}]  # fmt: skip
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "ws_attention.json")
    # each shape in a child process: a compiler that aborts (an assertion in a pass) takes the child, not
    # the probe; the configuration it was on is recorded as a crash and the next child goes on after it
    for kind, d, dname, n in CASES:
        if a.only and kind != a.only:
            continue
        start, total = 0, len(_configs(kind))
        while start < total and time.time() < until:
            jsonl = os.path.join(a.out, f"ws_{kind}_{d}_{dname}_{n}_{start}.jsonl")
            cmd = [sys.executable, os.path.abspath(__file__), "--child", f"{kind},{d},{dname},{n}", "--start",
                   str(start), "--jsonl", jsonl, "--until", str(until)]  # fmt: skip
            rc = subprocess.run(cmd, check=False).returncode
            got = [json.loads(line) for line in open(jsonl)] if os.path.exists(jsonl) else []
            rows += [r for r in got if r["kind"] != "starting"]
            last = max((r["i"] for r in got if r["kind"] == "starting"), default=start - 1)
            if rc == 0:
                start = total
            elif got and got[-1]["kind"] == "starting":  # it died on this configuration
                cfg = _configs(kind)[last]
                died = f"the process died (exit status {rc}) compiling or running this configuration"
                rows.append({"kind": kind, "d": d, "n": n, "dtype": dname, **cfg, "error": died})
                print(f"{kind} D={d} N={n} {dname} {cfg}: the process died ({rc})", flush=True)
                start = last + 1
            else:  # it died between configurations, or before the first: go on after what it finished
                rows.append({"kind": "note", "case": [kind, d, dname, n], "error": f"a child exited with {rc}"})
                start = last + 1 if last >= start else total
            with open(path, "w") as f:
                json.dump(rows, f, indent=1)
    for r in rows[1:]:
        if r["kind"] == "note":
            print(r, flush=True)
            continue
        cfg = {k: r[k] for k in ("block_n", "stages", "tile", "ws") if k in r}
        what = r.get("error", "")[:100] or f"{r['tflops']:6.1f} TF/s err {r['err']:.1e} nonfinite {r['nonfinite']}"
        print(f"{r['kind']:<8} D={r['d']} N={r['n']} {r['dtype']} {cfg}: {what}", flush=True)
    with open(path, "w") as f:
        json.dump(rows, f, indent=1)
    print("wrote", path, f"in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
