"""Lesson 4b's proof that a change to ``dropout_norm.py`` left what the GPU runs alone: every launch of the
residual + dropout + norm kernels, compiled for sm_90 from a CPU, one sha256 of its PTX a launch.

The process pretends a CUDA GPU of capability 9.0 with 132 SMs (an H100's and an H200's count) before
fusionlab decides its mode, so the kernels are GPU kernels and the launchers take their GPU paths on CPU
tensors; DRAM bandwidth is pretended too, once as an H100's (3350 GB/s) and once as an H200's (4800 GB/s:
the >= 4000 GB/s backward launch). ``Launcher.launch`` is replaced by a recorder, so nothing launches and
no tensor is touched (the large ones are never-written ``torch.empty``). Each recorded launch is
specialised as Triton's own launch path does it on a GPU (its binder with the CUDA backend: dtypes, 16-byte
alignment, ints equal to 1 or multiples of 16, the ``do_not_specialize`` seed and offset) and compiled
with ``triton.compile`` for ``GPUTarget("cuda", 90, 32)``; equal specialisations compile once.

It calls the public ``dropout_norm`` (forward and backward through autograd) at lesson 4b's suite and bench
shapes (4096 and 32768 rows x hidden 4096 and 8192), an odd width (1000) and a row wider than one GPU tile
(20000), LayerNorm (with its bias) and RMSNorm, fp32/fp16/bf16, training (p = 0.1, a 64-bit seed) and eval,
and at the test file's own calls (widths 37, 64, 100 on the wide path, 250 with counters past 32 bits, 4096
at 257 rows, the tiling overrides, p = 0, gradients missing or strided). One line a launch:
``hash  device case kernel grid scalars constexprs``.
Run it on the tree before a change and after, and diff: equal lines mean the same kernels, launched the
same way.

    PYTHONPATH=/path/to/old/tree python benchmarks/probes/probe_dropout_norm_ptx.py > old.txt
    PYTHONPATH=. python benchmarks/probes/probe_dropout_norm_ptx.py > new.txt && diff old.txt new.txt

Triton's binder and ``_pack_args`` are its internals (written against Triton 3.9, the CPU machine's).
"""

from __future__ import annotations

import hashlib
import sys
import warnings

import torch

torch.cuda.is_available = lambda: True  # before fusionlab decides its mode: the kernels are GPU kernels
torch.cuda.get_device_capability = lambda *a: (9, 0)
torch.cuda.get_device_name = lambda *a: "NVIDIA H100 (pretended)"
torch.cuda.current_device = lambda: 0

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from fusionlab.kernels import _launch  # noqa: E402
from fusionlab.kernels import dropout_norm as D  # noqa: E402

_launch._IS_CUDA = False  # the tensors stay on the CPU: the checks take them, dram_gbps() reads the default
_launch._sm_count = lambda index: 132
DEVICES = {"H100": 3350.0, "H200": 4800.0}
TARGET = GPUTarget("cuda", 90, 32)
BACKEND = make_backend(TARGET)
LOG: list = []


def _record(self, grid, args, kwargs, key=None, device=None):
    LOG.append((self.kernel, tuple(grid), tuple(args), dict(kwargs)))


_launch.Launcher.launch = _record  # (``__call__`` passes its arguments to it; a kept plan calls it directly)
# Triton 3.9 warns that FP fusion stops being its default in 3.10; the GPUs' Triton 3.6 compiles with it on
warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")


def _ptx_hash(kernel, args, kwargs, cache={}):  # noqa: B006  (one compile a specialisation, for the run)
    binder = create_function_from_signature(kernel.signature, kernel.params, BACKEND)
    kw = dict(kwargs, debug=False)
    bound, spec, options = binder(*args, **kw)
    options, signature, constexprs, attrs = kernel._pack_args(BACKEND, kw, bound, spec, options)
    key = (kernel.__name__, repr(spec), str(options))
    if key not in cache:
        src = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
        ptx = triton.compile(src, target=TARGET, options=options.__dict__).asm["ptx"]
        # what the GPU executes: the PTX less its source locations and debug sections (a helper moved
        # between lines or modules changes those, not the code)
        code = ptx.split(".section\t.debug")[0].split(".section .debug")[0]
        skip = (".file", ".loc", "//", "$L__tmp")
        body = "\n".join(ln for ln in code.splitlines() if not ln.lstrip().startswith(skip))
        cache[key] = hashlib.sha256(body.encode()).hexdigest()[:16]
    return cache[key]


def _desc(v):
    if isinstance(v, torch.Tensor):
        return f"T{str(v.dtype)[6:]}{list(v.shape)}"
    return repr(v)


def _inputs(shape, dtype, norm):
    x, r = torch.empty(shape, dtype=dtype), torch.empty(shape, dtype=dtype)
    w = torch.empty(shape[-1], dtype=dtype)
    b = torch.empty(shape[-1], dtype=dtype) if norm == "layernorm" else None
    return [t.requires_grad_() if t is not None else None for t in (x, r, w, b)]


def _fwd_bwd(shape, dtype, norm, p, *, grads=("y", "h"), strided=False, **kw):
    x, r, w, b = _inputs(shape, dtype, norm)
    y, h = D.dropout_norm(x, r, w, b, p, norm=norm, **kw)
    outs = [t for name, t in (("y", y), ("h", h)) if name in grads]
    ins = [t for t in (x, r, w, b) if t is not None]
    dys = [torch.empty(shape, dtype=dtype) for _ in outs]
    if strided:  # a row-strided and a stride-0 column gradient (the backward copies them row-contiguous)
        wide = torch.empty(shape[0], 2 * shape[1], dtype=dtype)
        dys = [wide[:, ::2], wide[:, 1:2].expand(shape)]
    torch.autograd.grad(outs, ins, dys, allow_unused=True)


def cases():
    """(name, shape, dtype, norm, p, keywords of ``_fwd_bwd``): the suite's and bench's shapes, the odd
    width, and the tests' own calls."""
    seed = dict(seed=2**40 + 3)  # 64 bits, as a fresh seed mostly is
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        dt = str(dtype)[6:]
        for rows in (4096, 32768):
            for n in (1000, 4096, 8192, 20000):  # 20000: past one tile, the GPU's own wide path
                for norm in D.NORMS:
                    yield f"{norm} {rows}x{n} {dt} train", (rows, n), dtype, norm, 0.1, seed
                    yield f"{norm} {rows}x{n} {dt} eval", (rows, n), dtype, norm, 0.1, dict(seed, training=False)
        for norm in D.NORMS:  # tests/test_dropout_norm.py's forward-and-backward cases
            for shape, cfg in (((3, 37), None), ((2, 3, 64), None), ((3, 100), {"BLOCK_N": 16}), ((257, 4096), None)):
                kw = dict(seed=1234, offset=5, fwd_config=cfg, bwd_config=cfg)
                yield f"test {norm} {shape} {cfg} {dt}", shape, dtype, norm, 0.25, kw
    f32, h_only = torch.float32, ("h",)
    for seed, offset in ((0, 0), (2**40 + 3, 2**33)):  # the numpy-Philox test: counters past 32 bits
        kw = dict(grads=h_only, seed=seed, offset=offset)
        yield f"test philox {seed} {offset}", (16, 250), f32, "rmsnorm", 0.3, kw
    for cfg in ({"BLOCK_N": 32}, {"BLOCK_M": 1}, {"BLOCK_M": 4, "BLOCK_N": 256}):  # the tiling test
        kw = dict(grads=h_only, seed=42, fwd_config=cfg, bwd_config={**cfg, "programs": 3})
        yield f"test tiling {cfg}", (6, 100), f32, "rmsnorm", 0.5, kw
    for out in ("y", "h"):
        yield f"test one output {out}", (6, 48), f32, "layernorm", 0.3, dict(grads=(out,), seed=5, offset=3)
    yield "test p=0", (4, 96), f32, "layernorm", 0.0, dict(seed=1)
    yield "test keep rate", (64, 512), f32, "rmsnorm", 0.5, dict(grads=h_only, seed=7)
    yield "test streams", (16, 128), f32, "rmsnorm", 0.5, dict(grads=h_only, seed=1)
    yield "test strided grads", (6, 48), f32, "layernorm", 0.3, dict(strided=True, seed=5, offset=3)


def main(argv):
    launches, hashes = 0, set()
    for dev, gbps in DEVICES.items():
        _launch.DEFAULT_DRAM_GBPS = gbps  # what dram_gbps() answers without CUDA
        for name, shape, dtype, norm, p, kw in cases():
            LOG.clear()
            _fwd_bwd(shape, dtype, norm, p, **kw)
            for kernel, grid, args, kwargs in LOG:
                if "dropout_norm" not in kernel.__name__:
                    continue  # the partial sums' kernel is the norms' own (_norms.py)
                h = _ptx_hash(kernel, args, kwargs)
                scalars = [_desc(a) for a in args]
                consts = sorted(kwargs.items())
                print(h, dev, name, kernel.__name__, grid, " ".join(scalars), consts, flush=True)
                launches, hashes = launches + 1, hashes | {h}
    compiles = len(_ptx_hash.__defaults__[0])
    print(f"# {launches} launches, {compiles} specialisations compiled, {len(hashes)} distinct PTX", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
