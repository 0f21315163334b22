"""Registers, spills and PTX of the norms' forward kernels as an H100 would build them, from a CPU.

Pretends an H100 (capability 9.0, 132 SMs, its DRAM bandwidth) as ``probe_launch_choices.py`` does, records
the launches ``rmsnorm`` and ``layernorm`` make at the lessons' shapes (bf16 and fp16; residual or not, bias
or not, statistics stored or not), compiles each distinct one for sm_90 and prints one line each: kernel,
registers a thread, spilled bytes, a hash of its PTX (debug lines left out) and the specialisation. Run it
on two trees and diff: equal lines mean the GPU runs the same code, equal registers the same occupancy.

    PYTHONPATH=. python benchmarks/probes/probe_norm_regs.py > new.txt
    (cd /tmp/old && PYTHONPATH=. python /path/to/probe_norm_regs.py) > old.txt
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tempfile

import torch

torch.cuda.is_available = lambda: True  # before fusionlab decides its mode: the kernels are GPU kernels
torch.cuda.get_device_capability = lambda *a: (9, 0)
torch.cuda.get_device_name = lambda *a: "NVIDIA H100 (pretended)"

from probe_ptx_identity import OPTIONS, scalar  # noqa: E402  (this folder: a launch's signature, one way)

import fusionlab.kernels.layernorm as LN  # noqa: E402
import fusionlab.kernels.rmsnorm as RMS  # noqa: E402
from fusionlab import runtime  # noqa: E402
from fusionlab.kernels import _launch  # noqa: E402

SHAPES = [(32768, 4096), (4096, 5120), (32768, 8192), (4096, 11008), (64, 16384), (8, 20000), (33, 1000)]
DT = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16"}


class Recorder:
    def __init__(self, fn):
        self.fn, self.log = fn, []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.log.append((args, kwargs))


def fake_h100():
    runtime.is_gpu = lambda: True
    runtime.CAPABILITY = (9, 0)
    torch.cuda.current_device = lambda: 0
    _launch._sm_count = lambda i: 132
    _launch.DEFAULT_DRAM_GBPS = 3350.0
    _launch._IS_CUDA = False  # the tensors stay on the CPU: nothing is launched


def spec(fn, args, kwargs):
    sig, consts, pos = {}, {}, list(args)
    for p in fn.params:
        v = kwargs[p.name] if p.name in kwargs else (pos.pop(0) if pos else p.default)
        if p.is_constexpr:
            sig[p.name], consts[p.name] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = DT[v.dtype]
        else:
            sig[p.name] = scalar(v)
    return sig, consts, {k: kwargs[k] for k in OPTIONS if k in kwargs}


def regs(cubin: bytes) -> tuple[int, int]:
    import os

    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (-1, -1)


def main():
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fake_h100()
    recorders = []
    for mod in (RMS, LN):
        rec = Recorder(mod._launch_fwd.kernel)
        mod._launch_fwd.kernel = rec
        recorders.append(rec)
    for rows, n in SHAPES:
        for dt in (torch.bfloat16, torch.float16):
            x = torch.empty(rows, n, dtype=dt)
            w, b = torch.empty(n, dtype=dt), torch.empty(n, dtype=dt)
            for grad in (False, True):
                xi = x.requires_grad_(grad)
                for call in (
                    lambda: RMS.rmsnorm(xi, w, 1e-6),  # noqa: B023
                    lambda: RMS.rmsnorm(xi, w, 1e-6, residual=torch.empty_like(x)),  # noqa: B023
                    lambda: LN.layernorm(xi, w, b, 1e-5),  # noqa: B023
                    lambda: LN.layernorm(xi, w, None, 1e-5),  # noqa: B023
                ):
                    try:
                        call()
                    except Exception as e:  # noqa: BLE001  (nothing ran: a later step may fail on the outputs)
                        print("#", type(e).__name__, str(e)[:200], file=sys.stderr)
                x = x.detach()
    seen = {}
    for rec in recorders:
        for args, kwargs in rec.log:
            sig, consts, opts = spec(rec.fn, args, kwargs)
            seen.setdefault(
                json.dumps([rec.fn.__name__, sig, consts, opts], sort_keys=True), (rec.fn, sig, consts, opts)
            )
    for key in sorted(seen):
        fn, sig, consts, opts = seen[key]
        asm = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                             options=opts).asm  # fmt: skip
        code = asm["ptx"].split(".section\t.debug")[0].split(".section .debug")[0]
        skip = (".file", ".loc", "//", "$L__tmp")
        body = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(skip))
        r, stack = regs(asm["cubin"])
        digest = hashlib.sha256(body.encode()).hexdigest()[:12]
        print(
            f"{fn.__name__} regs={r} stack={stack} ptx={digest} {json.dumps([consts, opts], sort_keys=True)}",
            flush=True,
        )


if __name__ == "__main__":
    sys.exit(main())
