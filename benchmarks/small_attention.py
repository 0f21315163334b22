"""Lesson 7 in the launch-bound regime: small attention calls, per call, against SDPA.

    PYTHONPATH=. python3 benchmarks/small_attention.py

The brief asks for speed with small tensors too, where a call's host work counts. For a few small
shapes (decode: one query against a KV cache; short prefills) this times, per call back to back (the
best of seven rounds taken in turns, ``regimes.per_call_round_robin``), and on the GPU alone (a CUDA
graph of 100 calls): our ``attention`` (its default path, and the pointer path without descriptors),
SDPA with PyTorch's own choice of backend, SDPA pinned to flash and to cuDNN, and naive eager attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fusionlab  # noqa: F401
from fusionlab.kernels.attention import attention, attention_eager
from fusionlab.lessons.l1.regimes import graph_us, per_call_round_robin

#: (B, H, N_q, N_k, D, causal)
SHAPES = [
    (8, 32, 1, 2048, 128, False),  # decode: one new token per sequence against its cache
    (1, 16, 128, 128, 64, True),  # a short prompt
    (4, 16, 512, 512, 128, True),
    (2, 16, 1024, 1024, 128, False),
]


def sdpa(backend=None):
    def fn(q, k, v, causal):
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return fn


IMPLS = {
    "ours": lambda q, k, v, c: attention(q, k, v, c),
    "ours, pointer path": lambda q, k, v, c: attention(q, k, v, c, variant="plain"),
    "sdpa (auto)": sdpa(),
    "sdpa flash": sdpa(SDPBackend.FLASH_ATTENTION),
    "sdpa cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
    "naive eager": lambda q, k, v, c: attention_eager(q, k, v, c),
}


def main():
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for B, H, nq, nk, d, causal in SHAPES:
        q = torch.randn(B, H, nq, d, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, H, nk, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        fns = {}
        for name, impl in IMPLS.items():
            fn = lambda impl=impl: impl(q, k, v, causal)  # noqa: E731
            try:
                fn()
                torch.cuda.synchronize()
                fns[name] = fn
            except Exception as e:  # a backend that does not take this shape
                print(f"  {name}: not run ({type(e).__name__}: {str(e)[:80]})")
        per_call = per_call_round_robin(fns, calls=300)
        print(f"B={B} H={H} N_q={nq} N_k={nk} D={d} {'causal' if causal else 'full'}: per call us (GPU alone us)")
        for name, fn in fns.items():
            print(
                f"  {name:<20} {per_call[name]:8.1f} ({graph_us(fn):7.1f})  "
                f"x sdpa auto {per_call[name] / per_call['sdpa (auto)']:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
