"""Does Triton's automatic warp specialisation speed up the attention forward on Hopper, and is it right?

    PYTHONPATH=. python3 benchmarks/probes/probe_ws_attention.py [--out $OUT] [--deadline 170]

FlashAttention-3's first step is warp specialisation: producer warps issue the copy engine's loads while
consumer warps do the matmuls and the softmax. Triton 3.6 does it automatically for a loop written
``tl.range(..., warp_specialize=True)`` — on Hopper only for loads through device-side tensor descriptors
(``tl.make_tensor_descriptor``), as its fused-attention tutorial (06) writes its forward. This probe
carries that tutorial-style forward (its own variant of a kernel: non-causal, device-side descriptors per
head, ``num_warps=4``, ``BLOCK_M=128``, one online-softmax loop) and times it with and without
``warp_specialize`` at stages 2, 3, 4, BLOCK_N 64 and 128, at the shapes of ``CASES`` (head dims 64 and 128, fp16 and
bf16, N = 4k and 16k, 16k x 16 token-heads), against the package's forward (``attention``, its Hopper defaults).

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
import time
import traceback

import torch
import triton
import triton.language as tl

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
#: (head dim, dtype, N), in the order run until the deadline
CASES = [(128, "bf16", 4096), (128, "bf16", 16384), (64, "fp16", 16384), (64, "fp16", 4096), (128, "fp16", 16384),
         (64, "bf16", 16384)]  # fmt: skip


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--deadline", type=float, default=170.0, help="seconds after which no new case starts")
    a = ap.parse_args()
    t0 = time.time()
    from fusionlab.kernels.attention import attention, attention_flops, attention_reference

    # device-side descriptors need a global scratch allocation per launch
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, device="cuda", dtype=torch.int8))
    rows = [{"kind": "device", "name": torch.cuda.get_device_name(), "torch": torch.__version__,
             "triton": triton.__version__, "date": time.strftime("%Y-%m-%d")}]  # fmt: skip
    path = os.path.join(a.out, "ws_attention.json")

    def save():
        os.makedirs(a.out, exist_ok=True)
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)

    def rel(o, ref):
        return float((o[0, 0].double() - ref).norm() / ref.norm())

    # most wanted first (each (head dim, dtype) compiles 12 kernels): the bar's head dim, then the shape
    # that returned non-finite values
    for d, dname, n in CASES:
        if time.time() - t0 > a.deadline:
            break
        B, H = max(1, 16384 // n), 16
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, H, n, d, device="cuda", dtype=DTYPES[dname], generator=g) for _ in range(3))
        ref = attention_reference(q[:1, :1], k[:1, :1], v[:1, :1])[0][0, 0].double()
        flops = attention_flops(B, H, n, n, d, False)
        shape = {"d": d, "n": n, "dtype": dname, "B": B, "H": H}
        o, _ = attention(q, k, v)
        ms = triton.testing.do_bench(lambda q=q, k=k, v=v: attention(q, k, v), warmup=10, rep=50, return_mode="median")
        rows.append({"kind": "package", **shape, "ms": ms, "tflops": flops / ms * 1e-9, "err": rel(o, ref),
                     "nonfinite": int((~torch.isfinite(o)).sum())})  # fmt: skip
        print(f"D={d} N={n} {dname} package {flops / ms * 1e-9:6.1f} TF/s err {rows[-1]['err']:.1e}", flush=True)
        for bn in (64, 128):
            for stages in (2, 3, 4):
                for ws in (False, True):
                    if time.time() - t0 > a.deadline:
                        break
                    row = {"kind": "tutorial", **shape, "block_n": bn, "stages": stages, "ws": ws}
                    try:
                        o, _ = ws_forward(q, k, v, bn, stages, ws)
                        torch.cuda.synchronize()
                        row["nonfinite"] = int((~torch.isfinite(o)).sum())
                        row["err"] = rel(o, ref)
                        fn = lambda bn=bn, s=stages, w=ws, q=q, k=k, v=v: ws_forward(q, k, v, bn, s, w)  # noqa: E731
                        ms = triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")
                        row.update(ms=ms, tflops=flops / ms * 1e-9)
                        print(f"D={d} N={n} {dname} BN={bn} s={stages} ws={int(ws)} {row['tflops']:6.1f} TF/s "
                              f"err {row['err']:.1e} nonfinite {row['nonfinite']}", flush=True)  # fmt: skip
                    except Exception as e:  # noqa: BLE001  (a configuration that does not build is a result)
                        row["error"] = f"{type(e).__name__}: {e}"[:400]
                        row["trace"] = traceback.format_exc()[-600:]
                        print(f"D={d} N={n} {dname} BN={bn} s={stages} ws={int(ws)} error {row['error'][:120]}")
                    rows.append(row)
                    save()
    save()
    print("wrote", path)


if __name__ == "__main__":
    main()
