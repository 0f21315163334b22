"""Probe: how much host time each op of the decode step spends in the package's own Python, at batch 1,
one token, Llama-3-8B's sizes (benchmarks/notes_lesson9.md, "2026-11-27: the decode ops' own Python on a
CPU"). CPU only. The ops are called as :meth:`fusionlab.model.LlamaLayer.decode` calls them: rmsnorm,
linear without and with the residual, RoPE with the cache write, attention_decode, SwiGLU, and the whole
step at a small FFN.

What is timed is everything but Triton's launch: each launcher is put on its GPU hit path (the
:class:`~fusionlab.kernels._launch.Launcher`'s own code, the key and the table lookup, run with its
module's GPU switches turned on) and the compiled kernel's ``run`` is a no-op. So a row is the shared
input checks, the configuration lookups, the allocations, ``autograd.Function.apply`` where it is taken,
the Launcher's key, and no kernel; beside each op, the ``torch.empty`` of its output (the one torch call
it cannot avoid). The configurations are the interpreter's (this machine's mode): a GPU's differ in
values, not in how they are looked up. Each row is the fastest of ``--rounds`` rounds (this machine's
other work only ever adds time), per call, in microseconds; then a cProfile of each op.

Two grad modes: ``no_grad`` (what ``LlamaLayer.decode`` runs: it is decorated ``torch.no_grad()``), and
``grad on`` with no input requiring grad (a caller that forgot no_grad; the weights are plain tensors).

    PYTHONPATH=. .venv/bin/python benchmarks/probes/host_decode_ops_python.py [--rounds 7] [--no-profile]
"""

from __future__ import annotations

import contextlib

import _host  # beside this script
import torch

import fusionlab  # noqa: F401
from fusionlab import model
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

for mod, name in ((RN, "_launch_fwd"), (MM, "_launch_plain"), (RP, "_launch"), (SG, "_launch_fwd"),
                  (AD, "_launch_split"), (AD, "_launch_combine")):  # fmt: skip
    setattr(mod, name, _host.HitPath(getattr(mod, name)))


def per_call_us(fn, calls=300, rounds=7, warmup=100):
    """:func:`_host.per_call_us` at this probe's counts."""
    return _host.per_call_us(fn, calls=calls, rounds=rounds, warmup=warmup)


# Llama-3-8B's decode step at batch 1, one token (fp16: the interpreter's 16-bit type, so the checks pass)
DT = torch.float16
HID, H, HKV, D, FFN, NMAX = 4096, 32, 8, 128, 14336, 4096
x = torch.randn(1, 1, HID, dtype=DT)
gamma = torch.ones(HID, dtype=torch.float32)  # the layer's norm weights are fp32 parameters
wqkv = torch.empty((H + 2 * HKV) * D, HID, dtype=DT)
wo = torch.empty(HID, H * D, dtype=DT)
qkv = torch.randn(1, 1, (H + 2 * HKV) * D, dtype=DT)
q = qkv[..., : H * D].view(1, 1, H, D)
k = qkv[..., H * D : (H + HKV) * D].view(1, 1, HKV, D)
v = qkv[..., (H + HKV) * D :].view(1, 1, HKV, D)
cos, sin = rope_tables(NMAX, D, 500000.0, device="cpu")
k_cache = torch.zeros(1, HKV, NMAX, D, dtype=DT)
v_cache = torch.zeros(1, HKV, NMAX, D, dtype=DT)
cache_len = torch.full((1,), NMAX // 2)
lens = cache_len + 1
qa = torch.randn(1, 1, H, D, dtype=DT).transpose(1, 2)  # RoPE's (B, N, H, D) output seen as (B, H, N, D)
o = torch.randn(1, H, 1, D, dtype=DT)
o_rows = o.transpose(1, 2).reshape(1, 1, H * D)
gu = torch.randn(1, 1, 2 * FFN, dtype=DT)


def _empty(shape):
    return lambda: torch.empty(shape, dtype=DT, device="cpu")


#: (name, the op as the decode step calls it, the torch.empty of its output)
OPS = [
    ("rmsnorm", lambda: rmsnorm(x, gamma, 1e-5), _empty(x.shape)),
    ("linear (QKV)", lambda: linear(x, wqkv), _empty(qkv.shape)),
    ("linear + residual (o_proj)", lambda: linear(o_rows, wo, residual=x), _empty(x.shape)),
    ("rope_cache_write", lambda: rope_cache_write(q, k, v, cos, sin, k_cache, v_cache, cache_len, layout="bnhd"),
     _empty(q.shape)),
    ("attention_decode", lambda: attention_decode(qa, k_cache, v_cache, lens), _empty(qa.shape)),
    ("swiglu", lambda: swiglu(gu[..., :FFN], gu[..., FFN:]), _empty((1, 1, FFN))),
]  # fmt: skip


def _layer():
    """The whole decode step (its wrappers in fusionlab.model included) at the 8B layer's widths but an FFN
    of 1024 (host time does not depend on the weights' size; the 8B FFN's weights would take 0.5 GB)."""
    layer = model.LlamaLayer(HID, H, HKV, 1024, max_positions=NMAX).to(DT)
    kc, vc = torch.zeros(1, HKV, NMAX, D, dtype=DT), torch.zeros(1, HKV, NMAX, D, dtype=DT)
    return lambda: layer.decode(x, kc, vc, cache_len)


def main():
    args = _host.arguments(__doc__)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; us per call, best of {args.rounds} rounds")
    modes = {"no_grad": torch.no_grad, "grad on": contextlib.nullcontext}
    print(f"{'op':30s} {'no_grad':>8s} {'grad on':>8s} {'empty':>6s}")
    for name, fn, empty in OPS:
        cols = []
        for mode in modes.values():
            with mode():
                cols.append(per_call_us(fn, rounds=args.rounds))
        print(f"{name:30s} {cols[0]:8.2f} {cols[1]:8.2f} {per_call_us(empty, rounds=args.rounds):6.2f}")
    step = _layer()
    print(f"{'decode step (FFN 1024)':30s} {per_call_us(step, calls=50, rounds=args.rounds, warmup=20):8.2f}")
    if args.no_profile:
        return
    for name, fn, _ in OPS:
        print(f"\n== {name}, no_grad: cProfile of 2000 calls, by own time")
        with torch.no_grad():
            _host.print_profile(fn, 2000)


if __name__ == "__main__":
    main()
