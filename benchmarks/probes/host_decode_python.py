"""Probe: how much of a batch-1 decode attention call's host time is the package's own Python
(benchmarks/notes_lesson9.md, "decode host time"). CPU only: the launchers are replaced by no-ops, so
what is timed is the wrapper (the shared input check, the cache-length check, the plan, the output and
workspace allocations, the specialisation key), beside the part of it the check takes.

    PYTHONPATH=. .venv/bin/python benchmarks/probes/host_decode_python.py
"""

import torch
from _host import per_call_us, print_profile  # beside this script

import fusionlab  # noqa: F401
from fusionlab.kernels import _attention
from fusionlab.kernels import attention_decode as AD


def _nop(grid, *args, key=None, **kwargs):  # stands in for a Launcher: launches nothing
    return None


AD._launch_split = AD._launch_combine = _nop
H, H_kv, N_k, D = 32, 8, 4096, 128
q = torch.randn(1, H, 1, D)
k = torch.randn(1, H_kv, N_k, D)
lens = torch.full((1,), N_k - 1)


with torch.no_grad():
    rows = {
        "attention_decode, no launches": lambda: AD.attention_decode(q, k, k, lens),
        "attention_decode, no lengths": lambda: AD.attention_decode(q, k, k),
        "check_inputs": lambda: _attention.check_inputs(q, k, k, True, None, op=AD.OP),
        "torch.empty (o)": lambda: torch.empty(q.shape, dtype=q.dtype, device=q.device),
        "sdpa on this CPU (with its compute)": lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, k, enable_gqa=True
        ),
    }
    for name, fn in rows.items():
        print(f"{name}: {per_call_us(fn):.2f} us")
    print_profile(lambda: AD.attention_decode(q, k, k, lens), 2000, top=12)
