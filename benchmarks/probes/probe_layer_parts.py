"""Where the Llama-3-8B layer on the package's kernels loses to ``torch.compile``: each part of its
forward and backward timed alone, beside the candidates that could replace it.

    PYTHONPATH=. python3 benchmarks/probes/probe_layer_parts.py [--out $OUT] [--seconds 150] [--ab ROUNDS]

Batch x sequence 4 x 4096, bf16, the layer's shapes (``fusionlab.model.LLAMA3_8B``). Forward parts:
the QKV projection (rmsnorm + linear, the folded ``rmsnorm_linear``, cuBLAS), RoPE (the kernel on the
projection's views, eager's), attention (the package's on the layer's (B, N, H, D) views and on
contiguous copies, SDPA), the rows copy and the output projection with the residual (package, cuBLAS),
the gate/up projection (as QKV's), SwiGLU (kernel, eager), the down projection with the residual.
Backward parts: attention's forward + backward (package, SDPA), each ``dx = dy W`` (package matmul,
cuBLAS), SwiGLU's backward (the kernel, eager's three), and the whole layer's forward and fwd+bwd with h
recomputed or kept (``fusionlab.model.KEEP_SWIGLU_OUTPUT``) and attention's inputs as views or head-major
(``fusionlab.model.ATTENTION_HEAD_MAJOR``), the forward with the norms folded into the projections
(``fusionlab.model.FOLD_NORMS``), with each fwd+bwd's peak memory. ``time_ms`` (median, L2
flushed) for parts, ``queued_ms`` for the layer's fwd+bwd. JSON: ``$OUT/probe_layer_parts.json``, saved
after each row; stops starting rows after ``--seconds``. ``--ab ROUNDS``: only the layer under each option
and eager, interleaved round by round (the first run's layer-level numbers moved by as much as the options
could), in ``"ab"``.
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

from fusionlab import bench, model
from fusionlab.kernels.attention import attention
from fusionlab.kernels.linear import linear
from fusionlab.kernels.matmul import matmul
from fusionlab.kernels.rmsnorm import rmsnorm
from fusionlab.kernels.rmsnorm_linear import fold_rmsnorm_weight, rmsnorm_linear
from fusionlab.kernels.rope import rope, rope_eager
from fusionlab.kernels.swiglu import _swiglu_backward, swiglu
from fusionlab.model import LLAMA3_8B, LlamaLayer, LlamaLayerReference

DT = torch.bfloat16


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "out"))
    p.add_argument("--seconds", type=float, default=150.0)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--ab", type=int, default=0, help="only the layer's options, interleaved, this many rounds")
    args = p.parse_args()
    t0 = time.time()
    res = {"meta": {**bench.metadata(), "command": " ".join(sys.argv)}, "ms": {}, "errors": {}}

    def save():
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "probe_layer_parts.json"), "w") as f:
            json.dump(res, f, indent=1)

    def row(name, fn, queued=False):
        if time.time() - t0 > args.seconds:
            res["errors"][name] = "skipped: out of time"
            return
        try:
            fn()
            res["ms"][name] = bench.queued_ms(fn, calls=5) if queued else bench.time_ms(fn)
            print(f"{name}: {res['ms'][name]:.3f} ms", flush=True)
        except Exception as e:
            res["errors"][name] = f"{type(e).__name__}: {str(e)[:300]}"
            traceback.print_exc()
        save()

    B, N = args.batch, args.seq
    hid, H, Hkv, ffn, eps = (LLAMA3_8B[k] for k in ("hidden", "n_heads", "n_kv_heads", "ffn", "eps"))
    D = hid // H
    T = B * N
    torch.manual_seed(0)
    ref = LlamaLayerReference(**LLAMA3_8B, max_positions=N)
    with torch.no_grad():
        for prm in ref.parameters():
            torch.nn.init.normal_(prm, std=prm.shape[1] ** -0.5) if prm.dim() == 2 else torch.nn.init.uniform_(
                prm, 0.8, 1.2
            )
    lay = LlamaLayer(**LLAMA3_8B, max_positions=N).load_reference_state_dict(ref.state_dict())
    ref, lay = ref.to("cuda", DT), lay.to("cuda", DT)
    x = torch.randn(B, N, hid, device="cuda", dtype=DT)
    g1, g2 = lay.attn_norm.detach(), lay.ffn_norm.detach()
    wqkv, wo, wgu, wd = (w.detach() for w in (lay.wqkv, lay.wo, lay.w_gate_up, lay.w_down))
    fqkv, fgu = fold_rmsnorm_weight(wqkv, g1), fold_rmsnorm_weight(wgu, g2)

    if args.ab:
        ab(args, res, save, ref, lay, x)
        return
    with torch.no_grad():
        # the forward, part by part, on the tensors the layer makes
        n1 = rmsnorm(x, g1, eps)
        row("qkv: rmsnorm + linear", lambda: linear(rmsnorm(x, g1, eps), wqkv))
        row("qkv: rmsnorm alone", lambda: rmsnorm(x, g1, eps))
        row("qkv: linear alone", lambda: linear(n1, wqkv))
        row("qkv: rmsnorm_linear (folded)", lambda: rmsnorm_linear(x, g1, wqkv, eps, folded_weight=fqkv))
        row("qkv: cublas (F.rms_norm + F.linear)", lambda: F.linear(F.rms_norm(x, (hid,), g1, eps), wqkv))
        row("qkv: cublas linear alone", lambda: F.linear(n1, wqkv))
        qkv = linear(n1, wqkv)
        q = qkv[..., : H * D].view(B, N, H, D)
        k = qkv[..., H * D : (H + Hkv) * D].view(B, N, Hkv, D)
        v = qkv[..., (H + Hkv) * D :].reshape(B, N, Hkv, D).contiguous()
        row("rope: kernel (bnhd views)", lambda: rope(q, k, lay.cos, lay.sin, 0, layout="bnhd"))
        cos, sin = lay.cos.to(DT), lay.sin.to(DT)
        row("rope: eager", lambda: rope_eager(q.transpose(1, 2), k.transpose(1, 2), cos, sin, 0))
        qr, kr = rope(q, k, lay.cos, lay.sin, 0, layout="bnhd")
        qt, kt, vt = qr.transpose(1, 2), kr.transpose(1, 2), v.transpose(1, 2)
        qc, kc, vc = qt.contiguous(), kt.contiguous(), vt.contiguous()
        row("attention: package, (B, N, H, D) views", lambda: attention(qt, kt, vt, causal=True))
        row("attention: package, contiguous (B, H, N, D)", lambda: attention(qc, kc, vc, causal=True))
        row(
            "attention: sdpa, views",
            lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True),
        )
        row("attention: sdpa, contiguous", lambda: F.scaled_dot_product_attention(qc, kc, vc, is_causal=True,
                                                                                   enable_gqa=True))  # fmt: skip
        o, _ = attention(qt, kt, vt, causal=True)
        rows_ = model._heads_to_rows(o)
        row("o: rows copy", lambda: model._heads_to_rows(o))
        row("o_proj + residual: package", lambda: linear(rows_, wo, residual=x))
        row("o_proj + residual: cublas", lambda: torch.addmm(x.view(T, hid), rows_.view(T, -1), wo.t()))
        h = linear(rows_, wo, residual=x)
        n2 = rmsnorm(h, g2, eps)
        row("gate_up: rmsnorm + linear", lambda: linear(rmsnorm(h, g2, eps), wgu))
        row("gate_up: linear alone", lambda: linear(n2, wgu))
        row("gate_up: rmsnorm_linear (folded)", lambda: rmsnorm_linear(h, g2, wgu, eps, folded_weight=fgu))
        row("gate_up: cublas linear alone", lambda: F.linear(n2, wgu))
        gu = linear(n2, wgu)
        gg, uu = gu[..., :ffn], gu[..., ffn:]
        row("swiglu: kernel", lambda: swiglu(gg, uu))
        row("swiglu: eager", lambda: F.silu(gg) * uu)
        hh = swiglu(gg, uu)
        row("down + residual: package", lambda: linear(hh, wd, residual=h))
        row("down + residual: cublas", lambda: torch.addmm(h.view(T, hid), hh.view(T, ffn), wd.t()))
        row("layer forward: package", lambda: lay(x))
        row("layer forward: eager", lambda: ref(x))
        model.ATTENTION_HEAD_MAJOR = True
        row("layer forward: package, head-major attention inputs", lambda: lay(x))
        model.ATTENTION_HEAD_MAJOR = False
        model.FOLD_NORMS = True
        row("layer forward: package, folded norms", lambda: lay(x))
        model.ATTENTION_HEAD_MAJOR = True
        row("layer forward: package, folded norms, head-major", lambda: lay(x))
        model.ATTENTION_HEAD_MAJOR = model.FOLD_NORMS = False

        # the backward's parts
        for name, w in (("qkv", wqkv), ("o", wo), ("gate_up", wgu), ("down", wd)):
            dyw = torch.randn(T, w.shape[0], device="cuda", dtype=DT)
            row(f"dx {name}: package matmul", lambda dyw=dyw, w=w: matmul(dyw, w))
            row(f"dx {name}: cublas", lambda dyw=dyw, w=w: dyw @ w)
        dh = torch.randn(B, N, ffn, device="cuda", dtype=DT)
        row("swiglu backward: kernel", lambda: _swiglu_backward(dh, gg, uu))
        row("swiglu backward: kernel into gu", lambda: _swiglu_backward(dh, gg, uu, out=(gg, uu)))

        def swiglu_eager_bwd():
            s = F.silu(gg)
            return dh * s, torch.ops.aten.silu_backward(dh * uu, gg)

        row("swiglu backward: eager", swiglu_eager_bwd)
        row("swiglu recompute (forward kernel)", lambda: swiglu(gg, uu))
        row("rmsnorm recompute", lambda: rmsnorm(h, g2, eps))
    do = torch.randn_like(qc)

    def att_bwd(fn, *ins):
        leaves = [t.detach().requires_grad_() for t in ins]
        out = fn(*leaves)
        (out[0] if isinstance(out, tuple) else out).backward(do)

    row(
        "attention fwd+bwd: package, views",
        lambda: att_bwd(lambda a, b, c: attention(a, b, c, causal=True), qt, kt, vt),
    )
    row("attention fwd+bwd: package, contiguous", lambda: att_bwd(lambda a, b, c: attention(a, b, c, causal=True),
                                                                  qc, kc, vc))  # fmt: skip
    row("attention fwd+bwd: sdpa", lambda: att_bwd(lambda a, b, c: F.scaled_dot_product_attention(
        a, b, c, is_causal=True, enable_gqa=True), qc, kc, vc))  # fmt: skip

    # the whole layer, fwd+bwd: h recomputed (default) or kept, and eager's
    step, clear = fwd_bwd(x)
    for keep, head_major in ((False, False), (True, False), (False, True)):
        model.KEEP_SWIGLU_OUTPUT, model.ATTENTION_HEAD_MAJOR = keep, head_major
        name = f"layer fwd+bwd: package, h {'kept' if keep else 'recomputed'}" + (", head-major" if head_major else "")
        row(name, lambda: step(lay), queued=True)
        try:
            step(lay)
            clear(lay)
            torch.cuda.synchronize()
            res["ms"][name.replace("fwd+bwd", "peak GiB")] = bench.peak_bytes(lambda: step(lay)) / 2**30
        except Exception as e:
            res["errors"][name + " peak"] = f"{type(e).__name__}: {str(e)[:300]}"
    model.KEEP_SWIGLU_OUTPUT, model.ATTENTION_HEAD_MAJOR = False, False
    row("layer fwd+bwd: eager", lambda: step(ref), queued=True)
    save()
    print(f"done in {time.time() - t0:.0f} s", flush=True)


def fwd_bwd(x):
    """``step(mod)``: one forward and backward of a layer on a copy of ``x`` that takes a gradient (a fixed
    random dy), its gradients cleared first; ``clear(mod)``: the clearing alone (before a peak is read)."""
    dy = torch.randn_like(x)
    xg = x.clone().requires_grad_()

    def clear(mod):
        for prm in mod.parameters():
            prm.grad = None
        xg.grad = None

    def step(mod):
        clear(mod)
        mod(xg).backward(dy)

    return step, clear


OPTIONS = {
    "default": {},
    "head-major": {"ATTENTION_HEAD_MAJOR": True},
    "folded norms": {"FOLD_NORMS": True},
    "h kept": {"KEEP_SWIGLU_OUTPUT": True},
}


def ab(args, res, save, ref, lay, x):
    """The layer's forward and fwd+bwd under each option in turn, ``args.ab`` rounds (A B C D A B C D ...: a
    drift of the GPU's clock reaches every option alike), eager's beside; each time is the median of its
    round's calls, the JSON keeps every round."""
    step, _ = fwd_bwd(x)

    def use(opts):
        for name in ("ATTENTION_HEAD_MAJOR", "FOLD_NORMS", "KEEP_SWIGLU_OUTPUT"):
            setattr(model, name, opts.get(name, False))

    res["ab"] = {}
    for _ in range(args.ab):
        for name, opts in {**OPTIONS, "eager": None}.items():
            use(opts or {})
            mod = ref if opts is None else lay
            r = res["ab"].setdefault(name, {"fwd_ms": [], "fwd_bwd_ms": []})
            if opts is None or "KEEP_SWIGLU_OUTPUT" not in opts:
                with torch.no_grad():
                    mod(x)
                    r["fwd_ms"].append(bench.time_ms(lambda mod=mod: mod(x)))
            if opts is None or "FOLD_NORMS" not in opts:  # the fold is the forward's without autograd only
                step(mod)
                r["fwd_bwd_ms"].append(bench.queued_ms(lambda mod=mod: step(mod), calls=5))
            save()
    use({})
    for name, r in res["ab"].items():
        print(name, {k: [round(t, 3) for t in v] for k, v in r.items()}, flush=True)


if __name__ == "__main__":
    main()
