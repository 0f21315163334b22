"""What every launcher shares: input checks and launch configurations.

Bad input gets a clear error, never a wrong answer. Triton kernels index raw pointers, so a tensor
on the wrong device, of the wrong dtype, with strides the kernel does not expect, or a negated or
conjugated *view* (torch keeps the sign as a flag, the memory is unchanged) would be read as garbage,
and the interpreter never fires ``tl.device_assert``. The launcher checks on the host, before the
launch. The checks are attribute reads (well under a microsecond each): a launcher is on the hot
path of small tensors, where host time per call is the whole cost.

Launch configurations are cached per (mode, size class, dtype): a launcher must not re-derive them
(or allocate to learn an element size) on every call.
"""

from __future__ import annotations

import functools
import inspect

import torch

from .. import _triton, runtime

#: Triton's largest block (TRITON_MAX_TENSOR_NUMEL)
MAX_TILE = 2**20
#: int32 offsets: a kernel whose offsets are int32 takes fewer elements than this
INT32_LIMIT = 2**31


_IS_CUDA = runtime.DEVICE.type == "cuda"


def current_device() -> int:
    """The current CUDA device's index (torch's own call without its Python wrapper: this runs on
    every launch, and the wrapper costs more than the answer)."""
    getter = getattr(torch._C, "_cuda_getDevice", None)
    return getter() if getter is not None else torch.cuda.current_device()


class KernelInputError(ValueError):
    """A launcher was given a tensor (or argument) its kernel cannot take."""


#: SMs assumed for a GPU configuration asked for on a machine without one (an H100 SXM)
DEFAULT_SMS = 132


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count() -> int:
    """This GPU's multiprocessor count (:data:`DEFAULT_SMS` without one). Asked on every call of a
    norm (its configuration's key): the device through :func:`current_device`, not torch's wrapper."""
    if runtime.is_gpu():
        return _sm_count(current_device())
    return DEFAULT_SMS


@functools.cache
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def device_name() -> str:
    """This GPU's name, "" without one: for the few configurations measured to differ between GPUs."""
    return _device_name(current_device()) if _IS_CUDA else ""


#: peak DRAM bandwidth in GB/s of GPUs a configuration may be asked for by name (their spec sheets: an
#: H100 SXM, an H200); a name not here, or a GPU configuration asked for without a GPU, gets an H100's
DRAM_GBPS = {"H200": 4800.0, "H100": 3350.0}
DEFAULT_DRAM_GBPS = DRAM_GBPS["H100"]


@functools.cache
def _dram_gbps(index: int) -> float:
    from triton.testing import get_dram_gbps  # memory clock x bus width, as the driver reports them

    return float(get_dram_gbps(index))


def dram_gbps(device: str | None = None) -> float:
    """Peak DRAM bandwidth in GB/s: this GPU's, from its driver (``device=None``), or that of the GPU
    named ``device`` (:data:`DRAM_GBPS`), so a lesson on a CPU can ask what a given GPU's kernel does.
    For the few configurations measured to differ between GPUs: chosen by what the GPU can do, not by
    its name."""
    if device is None:
        return _dram_gbps(current_device()) if _IS_CUDA else DEFAULT_DRAM_GBPS
    return next((v for name, v in DRAM_GBPS.items() if name in device), DEFAULT_DRAM_GBPS)


def dtype_name(d: torch.dtype) -> str:
    return str(d).replace("torch.", "")


@functools.cache
def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def cdiv(a: int, b: int) -> int:
    """``ceil(a / b)`` for host code. Not ``triton.cdiv``: since Triton 3.5 that is a constexpr function
    whose call costs about 2 µs of host time (unwrapping its arguments), several times a launch."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (int(n) - 1).bit_length())


def check_tensor(
    x,
    name: str,
    *,
    op: str,
    dtypes=None,
    ndim=None,
    contiguous: bool = True,
    grad: bool = False,
    max_numel: int | None = INT32_LIMIT,
) -> torch.Tensor:
    """Validate one kernel argument and return it unchanged.

    ``contiguous=False`` lets through any layout whose last dimension has stride 1 (row-strided
    kernels). ``grad=False`` refuses a tensor that requires grad while autograd is on: an op without
    a backward would silently cut the graph. ``max_numel``: the kernel's offset limit (None: any).
    """
    if not isinstance(x, torch.Tensor):
        raise KernelInputError(f"{op}: {name} must be a torch.Tensor, got {type(x).__name__}.")
    if not (x.is_cuda if _IS_CUDA else x.is_cpu):
        raise KernelInputError(
            f"{op}: {name} is on {x.device}, but in {runtime.MODE} mode the kernels run on {runtime.DEVICE}. "
            f"Move it with {name}.to(fusionlab.runtime.DEVICE)."
        )
    if _IS_CUDA and x.get_device() != current_device():
        raise KernelInputError(
            f"{op}: {name} is on {x.device} but the current CUDA device is cuda:{torch.cuda.current_device()}; "
            f"Triton launches on the current device. Use `with torch.cuda.device({x.device.index}):` around the call."
        )
    # (each tensor attribute read below costs 50-150 ns, and a decode step checks 26 tensors: each is read
    # once, the cheap ones first; 830 -> 580 ns a 4-D check with rows of any stride on a 2-core CPU, 2026-11-27)
    dt = x.dtype
    dtypes = runtime.DTYPES if dtypes is None else dtypes
    if dt not in dtypes:
        hint = " (Triton's interpreter does not support bfloat16)" if dt == torch.bfloat16 else ""
        raise KernelInputError(
            f"{op}: {name} has dtype {dtype_name(dt)}; supported here: {', '.join(map(dtype_name, dtypes))}{hint}."
        )
    if ndim is not None:
        d = x.dim()
        if (d != ndim) if isinstance(ndim, int) else (d not in tuple(ndim)):
            raise KernelInputError(f"{op}: {name} must have {ndim} dimension(s), got shape {tuple(x.shape)}.")
    if x.is_neg() or (dt.is_complex and x.is_conj()):  # only a complex tensor can be conjugated
        raise KernelInputError(
            f"{op}: {name} is a lazily negated (or conjugated) view: its memory holds the values before the "
            f"sign flip, which is what a kernel would read. Pass {name}.resolve_neg() (a real copy)."
        )
    if contiguous:
        if not x.is_contiguous():
            raise KernelInputError(
                f"{op}: {name} is not contiguous (strides {x.stride()} for shape {tuple(x.shape)}); the kernel "
                f"walks memory in order. Pass {name}.contiguous()."
            )
    # the stride before the shape: most rows have stride 1, and then the shape is never read (not
    # is_contiguous() first: an empty tensor is contiguous whatever its strides, and is refused here too)
    elif x.dim() and x.stride()[-1] != 1 and x.shape[-1] > 1:  # (stride()[-1]: 0.1 us, stride(-1) 0.15)
        raise KernelInputError(
            f"{op}: {name}'s last dimension has stride {x.stride(-1)}; the kernel needs its rows contiguous "
            f"(stride 1). Pass {name}.contiguous()."
        )
    if max_numel is not None and x.numel() >= max_numel:
        raise KernelInputError(
            f"{op}: {name} has {x.numel()} elements; this kernel's int32 offsets take fewer than {max_numel}."
        )
    if not grad and x.requires_grad and torch.is_grad_enabled():
        raise KernelInputError(
            f"{op}: {name} requires grad, but this kernel has no backward: the gradient would be lost. "
            f"Call it under torch.no_grad(), or pass {name}.detach() if you mean to."
        )
    return x


def signature(*tensors) -> tuple | None:
    """What every check of :func:`check_tensor` (and an op's own checks and configuration lookups) can
    depend on, for each of ``tensors`` (None: an absent optional tensor), with the grad mode and, on a
    GPU, the current device: a key under which an op keeps what its checks and lookups worked out
    (:class:`Plans`). None when an argument is not a tensor (or a tensor without memory): the op then
    takes its full path, whose checks raise. A call whose signature equals that of a call that passed
    every check passes them all the same way, so it skips them; any other call is checked in full.

    Per tensor: its type (a subclass may view itself otherwise), device, dtype, shape, strides, the
    negation flag and, for complex dtypes, the conjugation flag (a real tensor's ``conj()`` is itself),
    ``requires_grad``, and the 16-byte alignment of its data (the TMA path's test and Triton's
    specialisation). Numel, contiguity and rank follow from shape and strides. About 0.4 us a tensor on
    a 2-core CPU, where the checks and lookups it stands in for cost several (2026-11-27)."""
    sig = [torch.is_grad_enabled(), current_device() if _IS_CUDA else None]
    for t in tensors:
        if t is None:
            sig.append(None)
            continue
        if not isinstance(t, torch.Tensor):
            return None
        dt = t.dtype
        try:
            ptr = t.data_ptr()
        except RuntimeError:  # no memory behind it (a fake tensor): the full path says what is wrong
            return None
        sig.append(
            (type(t), t.device, dt, t.shape, t.stride(), t.is_neg(), dt.is_complex and t.is_conj(), t.requires_grad,
             ptr & 15)
        )  # fmt: skip
    return tuple(sig)


def plain_choices(*values) -> bool:
    """Whether ``values`` (an op's string options) can go into a :func:`signature`'s key as they are:
    each None or exactly a str. Anything else (an unhashable list, ``True == 1``, a str subclass) takes
    the full path, whose checks say what is wrong."""
    for v in values:
        if v is not None and type(v) is not str:
            return False
    return True


class Plans:
    """An op's plans (what its checks, layouts and configuration lookups worked out for one call
    signature: the grid, the constexprs, the launcher's key), kept by :func:`signature`-based key, so
    that a repeated call (a decode step's) does its signature, one lookup, its allocations and the
    launch. Filled only by calls that passed every check; at ``maxsize`` plans it starts again empty
    (a program's calls have few signatures: more means shapes that change every call)."""

    def __init__(self, maxsize: int = 1024):
        self._plans: dict = {}
        self.maxsize = maxsize
        self.get = self._plans.get  # the hit path's one call: a dict's own get

    def put(self, key, plan) -> None:
        if len(self._plans) >= self.maxsize:
            self._plans.clear()
        self._plans[key] = plan

    def clear(self) -> None:
        self._plans.clear()

    def __len__(self) -> int:
        return len(self._plans)


def host_range(t: torch.Tensor) -> tuple[int, int]:
    """``(min, max)`` of a non-empty integer tensor in host memory (lengths, offsets a launcher checks),
    read through numpy: no torch op (a fused call counts only its kernels). A decode batch's few values
    go through a list: numpy's two reductions cost a batch-1 decode step's cache write and attention
    2-3 us each on a 2-core CPU (2026-11-27), a list's min and max a tenth of that up to 64 values."""
    host = t.numpy()
    if host.size <= 64:
        values = host.tolist()
        return min(values), max(values)
    return int(host.min()), int(host.max())


def check_choice(value, choices, name: str, *, op: str):
    """``choices[value]`` (a dict) or ``value`` (a sequence) when ``value`` is one of ``choices``, else a
    clear error: an unhashable value (``[]``) would make a dict lookup raise torch-free TypeError, and a
    tensor an ambiguous truth value, both far from the mistake."""
    if (value is None or type(value) is str) and value in choices:  # the usual case: exact, 0.3 us less
        return choices[value] if isinstance(choices, dict) else value
    try:
        ok = any(value is c or (type(value) is type(c) and value == c) for c in choices)
    except (TypeError, RuntimeError):  # a tensor compared with a string, an object without ==
        ok = False
    if not ok:
        raise KernelInputError(f"{op}: {name}={value!r}; choose one of {', '.join(map(repr, choices))}.")
    return choices[value] if isinstance(choices, dict) else value


def check_overrides(override, name: str, *, op: str) -> dict:
    """A tuning run's configuration override: None or a dict (a string would fail far inside)."""
    if override is None:
        return {}
    if not isinstance(override, dict):
        raise KernelInputError(
            f"{op}: {name} must be a dict of configuration overrides (e.g. {{'BLOCK_N': 1024}}) or None, "
            f"got {type(override).__name__} {override!r}."
        )
    return override


def check_same(a: torch.Tensor, b: torch.Tensor, names: str, *, op: str, shape: bool = True) -> None:
    if a.dtype != b.dtype:
        raise KernelInputError(
            f"{op}: {names} must share a dtype, got {dtype_name(a.dtype)} and {dtype_name(b.dtype)}."
        )
    if a.device != b.device:
        raise KernelInputError(f"{op}: {names} must be on the same device, got {a.device} and {b.device}.")
    if shape and a.shape != b.shape:
        raise KernelInputError(f"{op}: {names} must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}.")


def check_block(value, name: str, op: str, *, max_value: int = MAX_TILE) -> int:
    """A user-given block size or warp count: a power of two in [1, max_value]."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
        raise KernelInputError(f"{op}: {name}={value!r} must be a power of two >= 1 (tl.arange needs one).")
    if value > max_value:
        raise KernelInputError(f"{op}: {name}={value} is over the limit of {max_value}.")
    return value


def check_tile(*blocks: int, op: str) -> None:
    """A tile's element count must fit Triton's limit."""
    n = 1
    for b in blocks:
        n *= b
    if n > MAX_TILE:
        raise KernelInputError(
            f"{op}: a {' x '.join(map(str, blocks))} tile has {n} elements; Triton allows {MAX_TILE}."
        )


def pdl_supported() -> bool:
    """Programmatic dependent launch: on Hopper (sm_90) and later a kernel launched with it may be placed
    on the SMs while the kernel before it in the stream still runs, and waits (``gdc_wait``) only where it
    first needs what that kernel wrote: the launch's gap and the kernel's start overlap the one before.
    Used between a call's own kernels (a loss's prologue, kernel and finish; a backward's partial sums);
    a call's first kernel takes it only where it waits before its first read (cross-entropy's prologue
    and backward), so that nothing but its launch overlaps what came before it."""
    return runtime.is_gpu() and runtime.CAPABILITY is not None and runtime.CAPABILITY >= (9, 0)


def launch_kwargs(
    num_warps: int | None = None, num_stages: int | None = None, maxnreg: int | None = None, *, pdl: bool = False
) -> dict:
    """``num_warps``/``num_stages`` (and ``maxnreg``, a cap on registers a thread; ``pdl``, a
    programmatic dependent launch where :func:`pdl_supported`) for a GPU launch; the interpreter takes
    none of them."""
    if not runtime.is_gpu():
        return {}
    out = {"launch_pdl": True} if pdl and pdl_supported() else {}
    if num_warps is not None:
        out["num_warps"] = num_warps
    if num_stages is not None:
        out["num_stages"] = num_stages
    if maxnreg is not None:
        out["maxnreg"] = maxnreg
    return out


@functools.lru_cache(maxsize=4096)
def elementwise_config(n_rows: int, n_cols: int, dtype: torch.dtype, gpu: bool | None = None) -> dict:
    """A (BLOCK_M, BLOCK_N, num_warps) tile for an element-wise op over a (rows, cols) view.

    On a GPU: 32 bytes per thread with 4 warps — 1 x 1024 tiles for 4-byte types, 2 x 1024 for 2-byte
    ones (benchmarks/NOTES.md has the sweep). BLOCK_N covers up to 1024 columns, so a warp reads
    contiguous row segments; short rows get whole rows per tile and more rows instead. In the
    interpreter every program costs milliseconds of Python however small its tile, so tiles are
    64 Ki elements there: a few large programs instead of many small ones.
    """
    gpu = runtime.is_gpu() if gpu is None else gpu
    if gpu:
        num_warps = 4
        tile, max_n = 128 * 32 // element_size(dtype), 1024
    else:
        tile, max_n, num_warps = 65536, 8192, 8
    block_n = max(16, min(next_pow2(n_cols), max_n))  # masks make tiny ranges safe
    block_m = max(1, min(tile // block_n, next_pow2(n_rows)))
    if block_m * block_n < 32 * num_warps:  # a tiny tensor: fewer warps than the tile has lanes for
        num_warps = 4
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "num_warps": num_warps}


@functools.lru_cache(maxsize=4096)
def head_and_tail(n_cols: int, block_n: int) -> tuple[int, int] | None:
    """``(head, tail)`` for a one-tile row that fits three quarters of its power-of-two tile
    ``block_n``: a head of half the tile and a tail of the smallest power of two (at least 16) that
    covers the rest, so 11008 takes 8192 + 4096 lanes, not 16384. None for a row that does not fit."""
    head = block_n // 2
    if n_cols - head > head // 2:
        return None
    return head, max(16, next_pow2(n_cols - head))


def tail_warps(num_warps: int, head: int, tail: int, dtype: torch.dtype) -> int:
    """The warps of a head and a tail: no more than give each thread 16 bytes of the tail (one vector
    load); with more, the tail's loads split into 8- or 4-byte pieces. LayerNorm's forward, bf16,
    32768 x 5120 (a head of 4096 and a tail of 1024) on an H200: 62% of copy at 8 warps, 96% at 4
    (benchmarks/notes_norms.md, 2026-11-24, LayerNorm's forward at 5120 and 11008). A tail under a
    quarter of the head (4097: 4096 + 16, 9000: 8192 + 1024) is too short to set the warps: fewer would
    crowd the head's registers."""
    if tail * 4 < head:
        return num_warps
    return max(1, min(num_warps, tail * element_size(dtype) // (16 * 32)))


def row_config(n_cols: int, dtype: torch.dtype, *, max_block: int | None = None, gpu: bool | None = None) -> dict:
    """A launch configuration for a row-wise reduction (norms, softmax, cross-entropy).

    Returns ``{"BLOCK_N", "num_warps", "SINGLE_TILE"}``. A row of up to ``max_block`` columns is held
    on chip in one tile (``SINGLE_TILE``: one read per element); a wider row is walked in tiles of
    ``max_block`` and re-read (the ledger's re-read term). Warps grow with the tile, so each thread
    holds at most ~16 elements in registers: more spills, fewer starve the memory system.
    Default ``max_block``: 64 KiB of row on a GPU (16384 fp32 or 32768 bf16 elements); 4096 elements
    in the interpreter, where each tile is a numpy array and memory, not registers, is the limit.
    """
    gpu = runtime.is_gpu() if gpu is None else gpu
    if max_block is None:
        max_block = (65536 // element_size(dtype)) if gpu else 4096
    block_n = min(next_pow2(max(n_cols, 1)), next_pow2(max_block))
    block_n = max(block_n, 16)
    if gpu:
        # ~16 elements a thread at most, 1..32 warps
        num_warps = min(32, max(1, block_n // (32 * 16)))
        num_warps = next_pow2(num_warps)
    else:
        num_warps = 4
    return {"BLOCK_N": block_n, "num_warps": num_warps, "SINGLE_TILE": n_cols <= block_n}


#: an int in (1, 2**31) is specialised by Triton only on its being a multiple of 16 (it is an i32, not 1)
_I32, _I64 = 2**31, 2**63


def _key(args) -> tuple:
    """What Triton specialises a launch on, per argument, or finer: a tensor's dtype and 16-byte
    alignment; an int's being 1, a multiple of 16, and its type (i32, i64, or u64 from 2**63); any
    other argument's type and value. Each argument's first entry tells its kind (a dtype, a type, or an
    int's own entry: an int, or a tuple outside (1, 2**31)), and no kind's first entry equals another's,
    so two argument lists never run together into one key. Never coarser: ``tests/test_launch.py``
    checks it against the installed Triton's own specialiser. (A plain loop: this runs every call
    without a caller's key. The common int, a size or stride in (1, 2**31), takes one entry, its
    residue mod 16: 1.9 us less than four entries an int for a matmul's 18 arguments on a 2-core CPU,
    2026-11-27.)"""
    key = []
    for a in args:
        t = type(a)
        if t is int:
            if 1 < a < _I32:
                key.append(a & 15)
            else:
                key.append((a == 1, a & 15, a >= _I32 or a < -_I32, a >= _I64))
        elif isinstance(a, torch.Tensor):
            key.append(a.dtype)
            key.append(a.data_ptr() & 15)
        else:  # its type too: 1.0 == True, but Triton compiles a float and a bool differently
            key.append(t)
            key.append(a)
    return tuple(key)


class Launcher:
    """Launch a ``@triton.jit`` kernel with less host time per call than ``kernel[grid](...)``.

    Small tensors are launch-bound: the time per call is host work, and Triton's own launch path
    (binding arguments, hashing the specialisation, looking up the compiled kernel, building launch
    metadata) costs about as much as two eager PyTorch kernels (``benchmarks/NOTES.md``). The first
    call for a specialisation goes through that path (it compiles); later calls with the same
    specialisation — argument dtypes, 16-byte alignment, ints that are 1 or multiples of 16, the same
    constexprs — call the compiled kernel's launcher directly, with the full argument list Triton
    itself passes. In the interpreter, while ``fusionlab.instrument`` watches launches, and while a
    launch hook (a profiler) is installed, every call takes Triton's own path.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        self._compiled: dict = {}
        self._ids: dict = {}  # intern's table
        fn = kernel
        while hasattr(fn, "fn") and not hasattr(fn, "arg_names"):
            fn = fn.fn
        self._names = list(getattr(fn, "arg_names", []))
        params = getattr(fn, "params", [])
        self._defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}

    def intern(self, key) -> int:
        """A small int standing for ``key`` (a caller's summary, as ``__call__``'s ``key`` takes it), the
        same for equal keys: a plan keeps it, and the launch then hashes an int, not the summary."""
        return self._ids.setdefault(key, len(self._ids))

    def spec_key(self, args, kwargs: dict) -> int:
        """:meth:`intern` of what ``__call__`` would work out from these arguments itself (:func:`_key`
        and the constexprs): for a plan that launches again with arguments of the same specialisation."""
        return self.intern((_key(args), tuple(kwargs.items())))

    def __call__(self, grid, *args, key=None, device=None, **kwargs):
        """``kernel[grid](*args, **kwargs)``. ``key``: the caller's own summary of everything Triton
        specialises on (dtypes, 16-byte alignments, ints equal to 1 or multiples of 16, constexprs),
        when it can say it more cheaply than :func:`_key` can work it out. ``device``: the current
        CUDA device's index when the caller has already asked (:func:`signature` does)."""
        return self.launch(grid, args, kwargs, key, device)

    def launch(self, grid, args: tuple, kwargs: dict, key=None, device=None):
        """``__call__`` with the arguments as a tuple and the constexprs as a dict (not read, nor
        changed, on the hit path): for a caller that keeps them in a plan. Unpacking a dozen of each
        into a call costs about 0.8 us on a 2-core CPU (2026-11-27)."""
        if not runtime.is_gpu() or _triton.watching() or not self._names:
            return self.kernel[grid](*args, **kwargs)
        if device is None:
            device = current_device()
        key = (_key(args), tuple(kwargs.items()), device) if key is None else (key, device)
        hit = self._compiled.get(key)
        if hit is None or _triton.launch_hooks_set():
            compiled = self.kernel[grid](*args, **kwargs)
            options = {"num_warps", "num_stages", "num_ctas", "maxnreg", "launch_pdl"}
            tail = tuple(kwargs[n] if n in kwargs else self._defaults.get(n) for n in self._names[len(args) :])
            if compiled is not None and not (set(kwargs) - options - set(self._names)):
                self._compiled[key] = (compiled, compiled.run, compiled.function, compiled.packed_metadata, tail)
            return compiled
        compiled, run, function, packed, tail = hit
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        run(grid[0], g1, g2, _triton.current_stream(device), function, packed, None, None, None, *args, *tail)
        return compiled
