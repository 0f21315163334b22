"""The PTX that the softmax and cross-entropy kernels compile to for sm_90, from a CPU: a hash a launch.

With the launches that ``probe_launch_choices.py`` recorded (each kernel's argument dtypes, constexprs
and launch options), compile every distinct one for an sm_90 target and print one line each: kernel,
specialisation, sha256 of its PTX. Run it on two trees and diff the outputs: equal hashes mean the GPU
runs the same code (a refactoring that moved a kernel or its helpers between modules, or folded a
helper, changed nothing the compiler sees). The process pretends CUDA (capability 9.0) so that the
kernels are defined as GPU kernels, not the interpreter's; nothing is launched.

    PYTHONPATH=. python benchmarks/probes/probe_launch_choices.py launches.json
    PYTHONPATH=. python benchmarks/probes/probe_ptx_identity.py launches.json [name-filter [per-kernel]] > ptx.txt
"""

from __future__ import annotations

import hashlib
import json
import sys

import torch

torch.cuda.is_available = lambda: True  # before fusionlab decides its mode
torch.cuda.get_device_capability = lambda *a: (9, 0)
torch.cuda.get_device_name = lambda *a: "NVIDIA H100 (pretended)"

import importlib  # noqa: E402
import pkgutil  # noqa: E402

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import fusionlab.kernels as K  # noqa: E402

DT = {"torch.float32": "*fp32", "torch.bfloat16": "*bf16", "torch.float16": "*fp16", "torch.int64": "*i64",
      "torch.int32": "*i32"}  # fmt: skip
OPTIONS = ("num_warps", "num_stages", "maxnreg", "launch_pdl")


def kernels():
    found = {}
    for m in pkgutil.iter_modules(K.__path__):
        mod = importlib.import_module(f"fusionlab.kernels.{m.name}")
        for name, obj in vars(mod).items():
            if isinstance(obj, triton.runtime.jit.JITFunction) and name.endswith("_kernel"):
                found.setdefault(name, obj)
    return found


def scalar(v):
    if isinstance(v, bool):
        return "i1"
    if isinstance(v, int):
        return "i32" if -(2**31) <= v < 2**31 else "i64"
    return "fp32"


def main(path, pattern="", per_kernel="1000000"):
    fns = kernels()
    runs = json.load(open(path))
    specs = {}
    for dev in sorted(runs):
        for key in sorted(runs[dev]):
            rec = runs[dev][key]
            if not isinstance(rec, list):
                continue
            for launch in rec:
                if launch[0] not in fns or pattern not in launch[0]:
                    continue
                name, _grid, args, kwargs = launch
                fn = fns[name]
                sig, consts, opts = {}, {}, {}
                pos = list(args)
                for p in fn.params:
                    if p.name in kwargs:
                        v = kwargs[p.name]
                    elif pos:
                        v = pos.pop(0)
                    else:
                        v = p.default
                    if p.is_constexpr:
                        sig[p.name] = "constexpr"
                        consts[p.name] = v
                    elif isinstance(v, list) and v and v[0] == "T":
                        sig[p.name] = DT[v[1]]
                    else:
                        sig[p.name] = scalar(v)
                opts = {k: kwargs[k] for k in OPTIONS if k in kwargs}
                specs[json.dumps([name, sig, consts, opts], sort_keys=True)] = (fn, sig, consts, opts)
    by_kernel: dict = {}
    for spec in sorted(specs):
        by_kernel.setdefault(json.loads(spec)[0], []).append(spec)
    for _name, group in sorted(by_kernel.items()):
        step = max(1, -(-len(group) // int(per_kernel)))  # at most per_kernel of them, evenly spaced
        for spec in group[::step]:
            fn, sig, consts, opts = specs[spec]
            src = ASTSource(fn=fn, signature=sig, constexprs=consts)
            ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts).asm["ptx"]
            # the PTX names its source file and lines (.file, .loc, the DWARF sections at its end, and the
            # $L__tmp labels only they refer to, which an inlined helper adds): hash what the GPU executes
            code = ptx.split(".section\t.debug")[0].split(".section .debug")[0]
            skip = (".file", ".loc", "//", "$L__tmp")
            body = "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(skip))
            print(hashlib.sha256(body.encode()).hexdigest()[:16], spec, flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
