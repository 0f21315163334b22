"""Probe: where a decode op's host time goes on a GPU machine, at batch 1, one token, Llama-3-8B's sizes
(benchmarks/notes_lesson9.md, "2026-11-27: the decode ops' host time on the GPU, split"). GPU only.

``host_decode_ops_python.py`` times the package's own Python on a CPU with Triton's launch stubbed out;
the GPU bar (each op's host time at most 1.5x its eager counterpart's) is measured on the GPU's host. This
probe splits the GPU host's time per op into:

- ``op``: the op as ``LlamaLayer.decode`` calls it, real launches, the stream held by a sleep kernel so the
  GPU never sets the pace;
- ``no launch``: the same call with each compiled kernel's ``run`` (Triton's C launcher) made a no-op on
  the Launcher's hit path: the package's Python, its checks and allocations, on this host;
- ``launch``: their difference, Triton's launcher (argument packing, ``cuLaunchKernelEx``);
- ``eager``: the op's eager counterpart (F.rms_norm, F.linear, ...);
- and, once: ``torch.empty`` of a small CUDA tensor, the current stream as Triton asks for it, and the
  launch of an empty kernel with 2 and with 16 arguments (Triton's launcher per argument).

Then a cProfile of each op's real calls (the stream held), by own time. Each number is the fastest of
``--rounds`` rounds.

    PYTHONPATH=. python3 benchmarks/probes/host_decode_ops_gpu.py [--rounds 7] [--no-profile]
"""

from __future__ import annotations

import argparse

import _host  # beside this script
import torch
import torch.nn.functional as F
import triton

from benchmarks.bench_decode import host_us
from fusionlab import _triton
from fusionlab.kernels import _launch
from fusionlab.kernels import attention_decode as AD
from fusionlab.kernels import matmul as MM
from fusionlab.kernels import rmsnorm as RN
from fusionlab.kernels import rope as RP
from fusionlab.kernels import swiglu as SG
from fusionlab.kernels.attention_decode import attention_decode
from fusionlab.kernels.linear import linear
from fusionlab.kernels.rmsnorm import rmsnorm
from fusionlab.kernels.rope import rope_cache_write, rope_tables
from fusionlab.kernels.swiglu import swiglu

LAUNCHERS = [(RN, "_launch_fwd"), (MM, "_launch_plain"), (RP, "_launch"), (SG, "_launch_fwd"),
             (AD, "_launch_split"), (AD, "_launch_combine")]  # fmt: skip

DT, DEV = torch.bfloat16, "cuda"
HID, H, HKV, D, FFN, NMAX = 4096, 32, 8, 128, 14336, 4096


def held_us(fn, rounds=7):
    """Host us a call, the stream held by a sleep kernel (:func:`benchmarks.bench_decode.host_us`, the bar's
    own measure): the fastest of ``rounds``."""
    return min(host_us(fn) for _ in range(rounds))


def _no_run(*args, **kwargs):
    return None


def stub_runs(on: bool, saved: dict):
    """Make every hit-path entry's compiled ``run`` a no-op (on) or put the real one back (off)."""
    for mod, name in LAUNCHERS:
        la = getattr(mod, name)
        for key, entry in list(la._compiled.items()):
            if on:
                saved[(id(la), key)] = entry[1]
                la._compiled[key] = (entry[0], _no_run, *entry[2:])
            else:
                la._compiled[key] = (entry[0], saved[(id(la), key)], *entry[2:])


@triton.jit
def _empty2(a, n):
    pass


@triton.jit
def _empty16(a, b, c, d, e, f, g, h, n0, n1, n2, n3, n4, n5, n6, n7):
    pass


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-profile", action="store_true")
    a = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    x = torch.randn(1, 1, HID, dtype=DT, device=DEV)
    gamma = torch.ones(HID, dtype=torch.float32, device=DEV)
    gamma_b = gamma.to(DT)
    wqkv = torch.randn((H + 2 * HKV) * D, HID, dtype=DT, device=DEV) * 0.02
    wo = torch.randn(HID, H * D, dtype=DT, device=DEV) * 0.02
    qkv = torch.randn(1, 1, (H + 2 * HKV) * D, dtype=DT, device=DEV)
    q = qkv[..., : H * D].view(1, 1, H, D)
    k = qkv[..., H * D : (H + HKV) * D].view(1, 1, HKV, D)
    v = qkv[..., (H + HKV) * D :].view(1, 1, HKV, D)
    cos, sin = rope_tables(NMAX, D, 500000.0, device=DEV)
    kc = torch.zeros(1, HKV, NMAX, D, dtype=DT, device=DEV)
    vc = torch.zeros(1, HKV, NMAX, D, dtype=DT, device=DEV)
    cache_len = torch.full((1,), NMAX // 2, device=DEV)
    lens = cache_len + 1
    qa = torch.randn(1, 1, H, D, dtype=DT, device=DEV).transpose(1, 2)
    o_rows = torch.randn(1, 1, H * D, dtype=DT, device=DEV)
    gu = torch.randn(1, 1, 2 * FFN, dtype=DT, device=DEV)
    ops = [
        ("rmsnorm", lambda: rmsnorm(x, gamma, 1e-5), lambda: F.rms_norm(x, (HID,), gamma_b, 1e-5)),
        ("linear (QKV)", lambda: linear(x, wqkv), lambda: F.linear(x, wqkv)),
        ("linear + residual (o_proj)", lambda: linear(o_rows, wo, residual=x), lambda: x + F.linear(o_rows, wo)),
        ("rope_cache_write", lambda: rope_cache_write(q, k, v, cos, sin, kc, vc, cache_len, layout="bnhd"), None),
        ("attention_decode", lambda: attention_decode(qa, kc, vc, lens),
         lambda: F.scaled_dot_product_attention(qa, kc, vc, enable_gqa=True)),
        ("swiglu", lambda: swiglu(gu[..., :FFN], gu[..., FFN:]), lambda: F.silu(gu[..., :FFN]) * gu[..., FFN:]),
    ]  # fmt: skip
    print(f"launch hooks set: {_triton.launch_hooks_set()}")
    print(f"{'op':28s} {'op':>7s} {'no launch':>9s} {'launch':>7s} {'eager':>7s} {'op/eager':>8s}   us per call")
    saved: dict = {}
    with torch.no_grad():
        for name, fn, eager in ops:
            real = held_us(fn, rounds=a.rounds)
            stub_runs(True, saved)
            py = held_us(fn, rounds=a.rounds)
            stub_runs(False, saved)
            e = held_us(eager, rounds=a.rounds) if eager else float("nan")
            print(f"{name:28s} {real:7.2f} {py:9.2f} {real - py:7.2f} {e:7.2f} {real / e:8.2f}", flush=True)
        t = torch.empty(8, device=DEV)
        print(f"torch.empty(8) on the GPU: {held_us(lambda: torch.empty(8, device=DEV), rounds=a.rounds):.2f}")
        print(f"Triton's current stream: {_host.per_call_us(lambda: _triton.current_stream(0)):.2f}")
        for kern, args in ((_empty2, (t, 16)), (_empty16, (t,) * 8 + (16,) * 8)):
            la = _launch.Launcher(kern)
            la((1,), *args)
            via_launcher = held_us(lambda: la((1,), *args), rounds=a.rounds)
            via_triton = held_us(lambda: kern[(1,)](*args), rounds=a.rounds)
            print(f"empty kernel, {len(args)} arguments: Launcher {via_launcher:.2f}, kernel[grid] {via_triton:.2f}")
        if not a.no_profile:
            for name, fn, _ in ops:
                print(f"\n== {name}: cProfile of 10 x 150 real calls, the stream held, by own time")

                def chunks(fn=fn):
                    torch.cuda.synchronize()
                    torch.cuda._sleep(int(2e9 * 0.05))
                    for _ in range(150):
                        fn()

                _host.print_profile(chunks, 10, top=14)
                torch.cuda.synchronize()


if __name__ == "__main__":
    main()
