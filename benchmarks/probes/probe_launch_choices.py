"""What the softmax and cross-entropy launchers pick on a GPU, dumped to JSON from a CPU.

A refactoring of those modules must not move their GPU speed: run this before and after and diff the
two files (they must be identical). It fakes a GPU's properties (is_gpu, capability 9.0, 132 SMs,
the DRAM bandwidth of an H100 or an H200) and replaces every ``@triton.jit`` kernel of the modules
with a recorder, then calls the public entries (forward and backward) on CPU tensors: each record is
a kernel's name, its grid, its scalar arguments, its constexprs and launch options, and its tensors'
shapes and strides. The config functions' dicts are dumped beside them.

    PYTHONPATH=. python benchmarks/probes/probe_launch_choices.py out.json
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys

import torch

import fusionlab.kernels as K
from fusionlab import runtime
from fusionlab.kernels import _launch

DEVICES = {"H100": 3350.0, "H200": 4800.0}
CE_COLS = [1, 7, 100, 1000, 2048, 4095, 4096, 4097, 8192, 8193, 10000, 16384, 20000, 27999, 28000, 28672,
           28673, 30000, 32000, 32767, 32768, 32769, 50257, 65536, 65537, 65552, 100000, 128256, 131072,
           151936, 200000, 262144, 262160, 524288]  # fmt: skip
SM_SHAPES = [(1, 1), (3, 7), (64, 100), (4096, 512), (4096, 1000), (4096, 1024), (100, 2047), (100, 2049),
             (512, 3000), (512, 4096), (512, 4097), (512, 6000), (256, 8192), (256, 10000), (256, 12289),
             (256, 16384), (256, 16385), (256, 17000), (256, 20000), (256, 24576), (256, 24577),
             (256, 32000), (256, 32768), (128, 32769), (64, 50257), (64, 65536), (64, 100000),
             (16, 131072), (8, 262144), (4, 1048576), (4, 2097153)]  # fmt: skip
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def desc(v):
    if isinstance(v, torch.Tensor):
        return ["T", str(v.dtype), list(v.shape), list(v.stride())]
    if isinstance(v, torch.dtype):
        return str(v)
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [desc(x) for x in v]
    if isinstance(v, dict):
        return {str(k): desc(x) for k, x in sorted(v.items())}
    return repr(type(v))


LOG: list = []


class Recorder:
    def __init__(self, name):
        self.name = name

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            LOG.append([self.name, desc(grid), desc(list(args)), desc(kwargs)])

        return launch


def patch_kernels():
    for m in pkgutil.iter_modules(K.__path__):
        mod = importlib.import_module(f"fusionlab.kernels.{m.name}")
        for name in list(vars(mod)):
            if name.endswith("_kernel") and ("softmax" in name or "cross_entropy" in name):
                setattr(mod, name, Recorder(name))


def fake_gpu(gbps):
    runtime.is_gpu = lambda: True
    runtime.CAPABILITY = (9, 0)
    runtime.DTYPES = tuple(DTYPES)
    torch.cuda.current_device = lambda: 0  # (sm_count asks; tensors stay on the CPU)
    _launch._sm_count = lambda i: 132
    _launch.DEFAULT_DRAM_GBPS = gbps  # what dram_gbps() answers without CUDA


def run(fn):
    LOG.clear()
    try:
        fn()
        return list(LOG)
    except Exception as e:  # noqa: BLE001  (the error is part of what is compared)
        return list(LOG) + [["error", type(e).__name__, str(e)[:200]]]


def configs(out, dev):
    from fusionlab.kernels.cross_entropy import cross_entropy_config
    from fusionlab.kernels.softmax import softmax_config

    for dt in DTYPES:
        for n in CE_COLS:
            for stride in (n, n + 8, n + 1):
                for grad in (True, False):
                    for gpu, device in ((True, dev), (True, None), (False, None)):
                        key = f"ce_config {dt} {n} {stride} {grad} {gpu} {device}"
                        out[key] = desc(cross_entropy_config(n, dt, stride=stride, grad=grad, gpu=gpu, device=device))
        for rows, n in SM_SHAPES:
            for bwd in (False, True):
                for gpu in (True, False):
                    for split in (True, False):
                        key = f"sm_config {dt} {rows} {n} {bwd} {gpu} {split}"
                        out[key] = desc(softmax_config(rows, n, dt, backward=bwd, gpu=gpu, split=split))


def launches(out):
    from fusionlab.kernels.cross_entropy import cross_entropy
    from fusionlab.kernels.linear_cross_entropy import linear_cross_entropy
    from fusionlab.kernels.softmax import online_softmax_stats, softmax

    for dt in DTYPES:
        for n in CE_COLS:
            if n > 300000:
                continue
            rows = 3
            for stride in (n, n + 8, n + 1):
                for red in ("mean", "sum", "none"):
                    for ls in (0.0, 0.1):
                        for grad in (True, False):
                            buf = torch.zeros(rows, stride, dtype=dt)
                            x = buf[:, :n]
                            if grad:
                                x.requires_grad_(True)
                            y = torch.tensor([0, -100, n - 1][:rows])

                            def go(x=x, y=y, red=red, ls=ls, grad=grad):
                                loss = cross_entropy(x, y, reduction=red, label_smoothing=ls)
                                if grad:
                                    loss.sum().backward()

                            out[f"ce {dt} {n} {stride} {red} {ls} {grad}"] = run(go)
                    if stride == n:
                        for inplace in (True,):

                            def go2(dt=dt, n=n):
                                x = torch.zeros(5, n, dtype=dt, requires_grad=True)
                                cross_entropy(x.clone(), torch.tensor([0, 1, 2, -100, 0]), inplace_grad=inplace)
                                loss = cross_entropy(x, torch.tensor([0, 1, 2, -100, 0]), reduction="none")
                                (loss * 2).sum().backward()

                            out[f"ce_misc {dt} {n}"] = run(go2)
            if n in (7, 1000, 4097, 32000, 50257, 65552, 128256):
                for red in ("mean", "sum", "none"):
                    for grad in (True, False):

                        def go3(dt=dt, n=n, red=red, grad=grad):
                            h = torch.zeros(300, 16, dtype=dt, requires_grad=grad)
                            w = torch.zeros(n, 16, dtype=dt, requires_grad=grad)
                            y = torch.zeros(300, dtype=torch.int64)
                            loss = linear_cross_entropy(h, w, y, reduction=red, chunk=128)
                            if grad:
                                (loss.sum() * 3).backward()

                        out[f"lce {dt} {n} {red} {grad}"] = run(go3)
        for rows, n in SM_SHAPES:
            if rows * n > 2**22:
                continue
            for layout in ("contig", "strided", "offset"):

                def go4(dt=dt, rows=rows, n=n, layout=layout):
                    if layout == "contig":
                        x = torch.zeros(rows, n, dtype=dt)
                    elif layout == "strided":
                        x = torch.zeros(rows, n + 16, dtype=dt)[:, :n]
                    else:
                        x = torch.zeros(rows * n + 1, dtype=dt)[1:].view(rows, n)
                    x.requires_grad_(True)
                    y = softmax(x)
                    y.backward(torch.ones_like(y))
                    softmax(x.detach(), split=False)
                    online_softmax_stats(x.detach())
                    online_softmax_stats(x.detach(), block=1024)

                out[f"sm {dt} {rows} {n} {layout}"] = run(go4)


def main(path):
    patch_kernels()
    out = {}
    for dev, gbps in DEVICES.items():
        fake_gpu(gbps)
        res = {}
        configs(res, dev)
        launches(res)
        out[dev] = res
    with open(path, "w") as f:
        json.dump(out, f, indent=0, sort_keys=True)
    n = sum(len(v) for v in out.values())
    errs = sum(1 for d in out.values() for v in d.values() if isinstance(v, list) and v and v[-1][0] == "error")
    print(f"{n} entries, {errs} ending in an error -> {path}")


if __name__ == "__main__":
    main(sys.argv[1])
