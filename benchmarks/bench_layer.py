"""Lesson 9 on a GPU: the Llama layer on the package's kernels against eager and ``torch.compile``.

    PYTHONPATH=. python3 benchmarks/bench_layer.py [--out $OUT] [--parts prefill decode host]
        [--max-autotune] [--batch 4] [--seq 4096] [--budget 170]

Llama-3-8B's layer (hidden 4096, 32 query heads, 8 KV heads of 128, FFN 14336), bf16, random weights
loaded into both :class:`fusionlab.model.LlamaLayerReference` (eager, plain torch) and
:class:`fusionlab.model.LlamaLayer` (the package's kernels). Each output is checked against eager's
first (norm-relative error < 2e-2).

- ``prefill``: batch x sequence = 4 x 4096: forward (no grad) and forward + backward (every weight's
  gradient and dx), each timed with ``fusionlab.bench.time_ms`` (fwd+bwd: ``queued_ms``, the host out
  of the way), and the peak memory of fwd+bwd (``bench.peak_bytes``), for eager, ``torch.compile``
  (default; ``--max-autotune`` adds mode="max-autotune", minutes of compiling) and the package's layer;
  first, the weight gradients ``dy^T x`` of the four matmuls both ways :func:`fusionlab.model.weight_grad`
  offers and by cuBLAS.
- ``decode``: one token per row, a KV cache of 4096 keys (each row at a different length near 4k),
  batch 1 and 64: eager, the package's layer as launched, the package's layer captured in a CUDA
  graph, and ``torch.compile(mode="reduce-overhead")`` of the reference's decode step.
- ``host``: host microseconds per call of each op of the decode step at batch 1, against its eager
  counterpart (the stream held by a sleep kernel: what a call costs the CPU).

Stops starting new parts after ``--budget`` seconds. JSON goes to ``$OUT/layer.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import torch
import torch.nn.functional as F

import fusionlab
from benchmarks.bench_decode import host_us, rel_err
from fusionlab import bench
from fusionlab.kernels.attention_decode import attention_decode
from fusionlab.kernels.linear import linear
from fusionlab.kernels.rmsnorm import rmsnorm
from fusionlab.kernels.rope import rope, rope_cache_write, rope_eager
from fusionlab.kernels.swiglu import swiglu
from fusionlab.lessons.l9.suite import DecodeStep, graphed  # the capture lesson 9's suite times, one copy
from fusionlab.model import LLAMA3_8B, LlamaLayer, LlamaLayerReference, weight_grad

DT = torch.bfloat16
N_CACHE = 4096


def make_layers(max_positions: int):
    torch.manual_seed(0)
    kw = dict(LLAMA3_8B, max_positions=max_positions)
    ref = LlamaLayerReference(**kw)
    with torch.no_grad():
        for p in ref.parameters():
            if p.dim() == 2:
                torch.nn.init.normal_(p, std=p.shape[1] ** -0.5)
            else:
                torch.nn.init.uniform_(p, 0.8, 1.2)
    lay = LlamaLayer(**kw).load_reference_state_dict(ref.state_dict())
    return ref.to("cuda", DT), lay.to("cuda", DT)


def _clear_grads(*mods):
    for m in mods:
        for p in m.parameters():
            p.grad = None


def weight_grads(run, T):
    """dW = dy^T x of the layer's four matmuls at T tokens: weight_grad's two ways and cuBLAS."""
    hid, ffn = LLAMA3_8B["hidden"], LLAMA3_8B["ffn"]
    qkv = (LLAMA3_8B["n_heads"] + 2 * LLAMA3_8B["n_kv_heads"]) * (hid // LLAMA3_8B["n_heads"])
    for name, n, k in (("qkv", qkv, hid), ("o", hid, hid), ("gate_up", 2 * ffn, hid), ("down", hid, ffn)):
        dy = torch.randn(T, n, device="cuda", dtype=DT)
        x = torch.randn(T, k, device="cuda", dtype=DT)
        row = {"N": n, "K": k, "M": T}
        for how in ("copy", "strided"):
            try:
                row[f"{how} ms"] = bench.time_ms(lambda how=how: weight_grad(dy, x, how))
            except Exception as e:
                row[f"{how} error"] = f"{type(e).__name__}: {str(e)[:200]}"
        row["cublas ms"] = bench.time_ms(lambda: dy.t() @ x)
        run.data["weight_grad"][name] = row
        print("weight_grad", name, json.dumps(row), flush=True)
    run.save()


def prefill(run, ref, lay, B, N, max_autotune):
    weight_grads(run, B * N)
    x = torch.randn(B, N, LLAMA3_8B["hidden"], device="cuda", dtype=DT)
    dy = torch.randn_like(x)
    with torch.no_grad():
        want = ref(x)
    impls = {"eager": ref, "fused": lay}
    modes = ["default"] + (["max-autotune"] if max_autotune else [])
    for mode in modes:
        name = f"compile {mode}"
        t0 = time.time()
        try:
            impls[name] = torch.compile(ref, mode=None if mode == "default" else mode, dynamic=False)
            with torch.no_grad():
                impls[name](x)
            xg = x.clone().requires_grad_()
            impls[name](xg).backward(dy)
            _clear_grads(ref)
        except Exception as e:
            run.data["prefill"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            impls.pop(name, None)
        run.data["prefill"].setdefault(name, {})["compile_s"] = time.time() - t0
    for name, mod in impls.items():
        if run.left() < 0:
            break
        row = run.data["prefill"].setdefault(name, {})
        try:
            with torch.no_grad():
                row["err"] = rel_err(mod(x), want)
                row["fwd_ms"] = bench.time_ms(lambda mod=mod: mod(x))
            xg = x.clone().requires_grad_()

            def step(mod=mod, xg=xg):
                _clear_grads(mod)
                xg.grad = None
                mod(xg).backward(dy)

            step()
            row["fwd_bwd_ms"] = bench.queued_ms(step, calls=5)
            _clear_grads(mod)
            xg.grad = None
            torch.cuda.synchronize()
            row["peak_gib"] = bench.peak_bytes(step) / 2**30
            _clear_grads(mod)
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            traceback.print_exc()
        run.save()
        print("prefill", name, json.dumps(row), flush=True)


def decode(run, ref, lay):
    H_kv, D = LLAMA3_8B["n_kv_heads"], LLAMA3_8B["hidden"] // LLAMA3_8B["n_heads"]
    for B in (1, 64):
        if run.left() < 0:
            break
        row = run.data["decode"].setdefault(f"B={B}", {})
        g = torch.Generator(device="cuda").manual_seed(1)
        lens = torch.randint(N_CACHE - 64, N_CACHE - 1, (B,), device="cuda", generator=g)
        kc = torch.randn(B, H_kv, N_CACHE, D, device="cuda", dtype=DT, generator=g)
        vc = torch.randn(B, H_kv, N_CACHE, D, device="cuda", dtype=DT, generator=g)
        x = torch.randn(B, 1, LLAMA3_8B["hidden"], device="cuda", dtype=DT, generator=g)
        with torch.no_grad():
            want = ref.decode(x, kc.clone(), vc.clone(), lens)
            kf, vf = kc.clone(), vc.clone()
            row["err"] = rel_err(lay.decode(x, kf, vf, lens), want)
            cases = {
                "eager": lambda: ref.decode(x, kc, vc, lens),
                "fused": lambda: lay.decode(x, kf, vf, lens),
            }
            try:
                cases["fused graph"] = graphed(lay.decode, x, kf, vf, lens)
            except Exception as e:
                row["fused graph error"] = f"{type(e).__name__}: {str(e)[:300]}"
            t0 = time.time()
            try:
                step = DecodeStep(ref, kc.clone(), vc.clone())
                compiled = torch.compile(step, mode="reduce-overhead", dynamic=False)
                for _ in range(3):
                    compiled(x, lens)
                cases["compile reduce-overhead"] = lambda: compiled(x, lens)
            except Exception as e:
                row["compile error"] = f"{type(e).__name__}: {str(e)[:300]}"
            row["compile_s"] = time.time() - t0
            for name, fn in cases.items():
                try:
                    row[f"{name} us"] = 1e3 * bench.time_ms(fn)
                    row[f"{name} wall us"] = 1e6 * bench.wall_s(fn, 50) / 50
                except Exception as e:
                    row[f"{name} error"] = f"{type(e).__name__}: {str(e)[:300]}"
        run.save()
        print("decode", B, json.dumps(row), flush=True)


def host(run, ref, lay):
    """Host us per call of each op of a batch-1 decode step, beside its eager counterpart."""
    hid, H, Hkv = LLAMA3_8B["hidden"], LLAMA3_8B["n_heads"], LLAMA3_8B["n_kv_heads"]
    D = hid // H
    x = torch.randn(1, 1, hid, device="cuda", dtype=DT)
    w = lay.attn_norm
    q = torch.randn(1, 1, H, D, device="cuda", dtype=DT)
    k = torch.randn(1, 1, Hkv, D, device="cuda", dtype=DT)
    lens = torch.full((1,), N_CACHE - 1, device="cuda")
    kc = torch.randn(1, Hkv, N_CACHE, D, device="cuda", dtype=DT)
    g = torch.randn(1, 1, LLAMA3_8B["ffn"], device="cuda", dtype=DT)
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)
    cos, sin = lay.cos, lay.sin
    kc2, vc2 = torch.zeros_like(kc), torch.zeros_like(kc)
    rows, steps = torch.arange(1, device="cuda")[:, None], torch.arange(1, device="cuda")[None, :]

    def eager_rope_write():  # what the reference's decode step runs: RoPE, then two indexed copies
        qr, kr = rope_eager(qt, kt, cos, sin, lens)
        pos = lens[:, None] + steps
        kc2.transpose(1, 2)[rows, pos] = kr.transpose(1, 2)
        vc2.transpose(1, 2)[rows, pos] = kt.transpose(1, 2)
        return qr

    pairs = {
        "rope + cache write": (
            lambda: rope_cache_write(q, k, k, cos, sin, kc2, vc2, lens, "bnhd"),
            eager_rope_write,
        ),
        "rmsnorm": (lambda: rmsnorm(x, w, 1e-5), lambda: F.rms_norm(x, (hid,), w, 1e-5)),
        "linear (qkv)": (lambda: linear(x, lay.wqkv), lambda: F.linear(x, lay.wqkv)),
        "linear + residual (o_proj)": (
            lambda: linear(x, lay.wo, residual=x),
            lambda: x + F.linear(x, lay.wo),
        ),
        "rope": (
            lambda: rope(q, k, cos, sin, lens, layout="bnhd"),
            lambda: rope_eager(qt, kt, cos, sin, lens),
        ),
        "attention_decode": (
            lambda: attention_decode(qt, kc, kc, lens),
            lambda: F.scaled_dot_product_attention(qt, kc, kc, enable_gqa=True),
        ),
        "swiglu": (lambda: swiglu(g, g), lambda: F.silu(g) * g),
    }
    with torch.no_grad():
        for name, (fused, eager) in pairs.items():
            f, e = min(host_us(fused) for _ in range(3)), min(host_us(eager) for _ in range(3))
            run.data["host"][name] = {"fused_us": f, "eager_us": e, "ratio": f / e}
    run.save()
    print("host", json.dumps({k: round(v["ratio"], 2) for k, v in run.data["host"].items()}), flush=True)


class Run:
    def __init__(self, out, budget):
        self.out, self.t0, self.budget = out, time.time(), budget
        self.data = {
            "meta": {
                **bench.metadata(),
                "command": " ".join(sys.argv),
                "fusionlab": fusionlab.__file__,
                "shapes": LLAMA3_8B,
            },
            "prefill": {},
            "weight_grad": {},
            "decode": {},
            "host": {},
        }

    def left(self):
        return self.budget - (time.time() - self.t0)

    def save(self):
        os.makedirs(self.out, exist_ok=True)
        with open(os.path.join(self.out, "layer.json"), "w") as f:
            json.dump(self.data, f, indent=1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--parts", nargs="+", default=["host", "decode", "prefill"])
    p.add_argument("--max-autotune", action="store_true")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--budget", type=float, default=170.0)
    args = p.parse_args()
    run = Run(args.out, args.budget)
    run.data["meta"]["batch"], run.data["meta"]["seq"] = args.batch, args.seq
    print(run.data["meta"], flush=True)
    ref, lay = make_layers(max(args.seq, N_CACHE))
    for part in args.parts:
        if run.left() < 0:
            print("budget spent before", part, flush=True)
            break
        try:
            if part == "prefill":
                prefill(run, ref, lay, args.batch, args.seq, args.max_autotune)
            elif part == "decode":
                decode(run, ref, lay)
            elif part == "host":
                host(run, ref, lay)
        except Exception:
            traceback.print_exc()
        run.save()
    print(f"done in {time.time() - run.t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
