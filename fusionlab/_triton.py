"""Every place fusionlab reaches into Triton's internals, in one module.

Five reaches, each reversible and tested:

- :func:`reinterpret_helpers`: when Triton was imported *before* fusionlab and fusionlab then chose
  the interpreter, Triton's own ``@triton.jit`` helpers (``tl.cdiv``, ``tl.sigmoid``, ...) were
  already compiled for a GPU and fail inside interpreted kernels; rebuild them as interpreted ones.
- :func:`launch_hook`: see every kernel launch in a ``with`` block (name, defining module, the
  tensors passed), counting one *logical* launch per call: an ``@triton.autotune`` kernel benchmarks
  its configs by launching the same kernel again from inside its own ``run``, and those nested
  launches are not the learner's.
- :func:`kernel_run_hook`: call a function around every run of a kernel itself (the jit function's
  own ``run``, under any autotune or heuristics wrapper, each config the autotuner times included).
- :func:`memory_hook`: in Triton's interpreter, see the addresses every ``tl.load`` and ``tl.store``
  touches (masked lanes left out), and where each execution of a kernel's grid begins.
- :func:`compile_for`: compile a kernel for a Hopper GPU on a machine without one (also in
  interpreter mode, by lending the compiler Triton's helpers as compilable functions for the call),
  so a lesson can count the machine instructions a kernel needs before anything is timed.

Triton is imported inside the functions, not at the top: it is optional (no wheels for macOS or
Windows), and ``fusionlab.runtime`` must decide the interpreter before Triton is first imported.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field


def reinterpret_helpers() -> int:
    """Rebuild Triton's own GPU-compiled jit helpers as interpreted functions; returns how many."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    swapped: dict[int, object] = {}
    for name, mod in list(sys.modules.items()):
        if not name.startswith("triton.language") or mod is None:
            continue
        for attr, val in list(vars(mod).items()):
            if isinstance(val, JITFunction) and not isinstance(val, InterpretedFunction):
                if id(val) not in swapped:
                    swapped[id(val)] = InterpretedFunction(val.fn)
                setattr(mod, attr, swapped[id(val)])
    return len(swapped)


def _kernel_classes() -> list[type]:
    """The classes whose ``run`` a ``kernel[grid](...)`` call goes through."""
    out: list[type] = []
    with contextlib.suppress(ImportError):
        from triton.runtime.jit import JITFunction

        out.append(JITFunction)
    with contextlib.suppress(ImportError):
        from triton.runtime.interpreter import InterpretedFunction

        out.append(InterpretedFunction)
    with contextlib.suppress(ImportError):
        from triton.runtime.autotuner import Autotuner, Heuristics

        out += [Autotuner, Heuristics]
    return out


def _base_fn(kernel):
    """The Python function under a jit / autotune / heuristics wrapper (each keeps it in ``.fn``)."""
    for _ in range(8):
        inner = getattr(kernel, "fn", None)
        if inner is None:
            return kernel
        kernel = inner
    return kernel


def _param_names(fn) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin or an object without a signature
        return []


@dataclass
class Launch:
    """One logical kernel launch: what was launched and the tensors it was given."""

    name: str
    module: str
    tensors: list = field(default_factory=list)  # torch.Tensor arguments, in order
    #: the kernel's parameter name of each of ``tensors`` (``"x_ptr"``), where the signature tells it
    arg_names: list = field(default_factory=list)


@dataclass
class _State:
    depth: int = 0


#: launch hooks active now: while one is, launchers take Triton's own (hooked) path
_WATCHING = [0]


def watching() -> bool:
    return _WATCHING[0] > 0


_RT: list = []  # (triton's runtime knobs, its active driver), looked up once: these run every launch


def _runtime():
    if not _RT:
        from triton import knobs
        from triton.runtime.driver import driver

        _RT.extend((knobs.runtime, driver.active))
    return _RT


def _active(hook) -> bool:
    # Triton 3.x keeps its hooks in a HookChain that is never None: a chain with no calls is no hook
    return hook is not None and bool(getattr(hook, "calls", True))


def launch_hooks_set() -> bool:
    """Whether a launch enter/exit hook (Triton's profiling interface, e.g. proton) is installed."""
    rt = _runtime()[0]
    return _active(rt.launch_enter_hook) or _active(rt.launch_exit_hook)


def current_stream(device: int):
    """The current CUDA stream of ``device``, as Triton's launcher takes it."""
    return _runtime()[1].get_current_stream(device)


@contextlib.contextmanager
def launch_hook(on_launch: Callable[[Launch], None]):
    """Call ``on_launch(Launch)`` for each outermost kernel launch inside the block."""
    import torch

    state = _State()
    patched = []
    for cls in _kernel_classes():
        orig = cls.__dict__.get("run")
        if orig is None:
            continue

        def run(self_, *args, __orig=orig, **kwargs):
            if state.depth == 0:
                fn = _base_fn(self_)
                name = getattr(fn, "__name__", None) or type(self_).__name__
                module = getattr(fn, "__module__", "") or ""
                params = _param_names(fn)
                pos = [(params[i] if i < len(params) else f"arg{i}", a) for i, a in enumerate(args)]
                named = [(k, v) for k, v in (*pos, *kwargs.items()) if isinstance(v, torch.Tensor)]
                on_launch(Launch(name, module, [v for _, v in named], [k for k, _ in named]))
            state.depth += 1
            try:
                return __orig(self_, *args, **kwargs)
            finally:
                state.depth -= 1

        cls.run = run
        patched.append((cls, orig))
    _WATCHING[0] += 1
    try:
        yield state
    finally:
        _WATCHING[0] -= 1
        for cls, orig in reversed(patched):
            cls.run = orig


def _innermost_classes() -> list[type]:
    """The classes whose ``run`` executes the kernel itself (the wrappers' ``run`` call into these)."""
    return [cls for cls in _kernel_classes() if cls.__name__ in ("JITFunction", "InterpretedFunction")]


@contextlib.contextmanager
def kernel_run_hook(before: Callable, after: Callable, launched: Callable | None = None):
    """Call ``before(kernel, args, kwargs)`` as each run of a kernel itself begins, after any heuristics
    function or autotuner hook has run, and ``after(kernel, args, kwargs)`` when it ends (also when it
    raises); ``kernel`` is the jit function, ``args``/``kwargs`` its call's arguments. ``launched(kernel,
    compiled)``: the build this run launched (what the jit function's run returns), where it returned.
    A compile-only run (``warmup``) is left alone."""
    patched = []
    for cls in _innermost_classes():
        orig = cls.__dict__.get("run")
        if orig is None:
            continue

        def run(self_, *args, __orig=orig, **kwargs):
            if kwargs.get("warmup"):
                return __orig(self_, *args, **kwargs)
            before(self_, args, kwargs)
            try:
                compiled = __orig(self_, *args, **kwargs)
                if launched is not None:
                    launched(self_, compiled)
                return compiled
            finally:
                after(self_, args, kwargs)

        cls.run = run
        patched.append((cls, orig))
    try:
        yield
    finally:
        for cls, orig in reversed(patched):
            cls.run = orig


def learner_hooks(kernel) -> list[str]:
    """Code that Triton runs *within* a run of ``kernel``, between its start and the launch, that the
    kernel's author can supply: pre-run hooks, a ``launch_metadata`` function, and Triton's global
    compile and launch hooks. Named, for a refusal; empty for a plain kernel."""
    found = []
    if getattr(kernel, "pre_run_hooks", None):
        found.append("a pre-run hook (add_pre_run_hook)")
    if getattr(kernel, "launch_metadata", None) is not None:
        found.append("a launch_metadata function")
    with contextlib.suppress(ImportError, AttributeError):
        from triton import knobs  # not _runtime(): the interpreter has no active driver

        rt = knobs.runtime
        for knob in ("jit_cache_hook", "jit_post_compile_hook", "launch_enter_hook", "launch_exit_hook"):
            hook = getattr(rt, knob, None)
            calls = getattr(hook, "calls", None if hook is None else [hook])  # a HookChain, or one callable
            if any(not _library_code(c) for c in calls or []):
                found.append(f"triton.knobs.runtime.{knob}")
    return found


def _library_code(fn) -> bool:
    """A hook that torch or Triton installed (their profilers), not the learner's."""
    module = getattr(fn, "__module__", None) or getattr(type(fn), "__module__", "") or ""
    return module.split(".")[0] in ("torch", "triton")


@contextlib.contextmanager
def _compilable_helpers():
    """Triton's own jit helpers (``tl.cdiv``, ``tl.sigmoid``...) as compilable ``JITFunction``s for a
    ``with`` block, and its language builtins as they are outside the interpreter. In interpreter mode
    the helpers are ``InterpretedFunction``s, which the compiler cannot lower, and builtins may still
    be wrapped by an earlier interpreted kernel; outside it nothing is swapped."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    def _leaked(val):
        # the interpreter's wrapper of a language builtin, ``lambda *args, member=member, **kwargs``: a
        # call of a nested jit function in the interpreter (InterpretedFunction.__call__) patches
        # triton.language.core and never restores it, and the compiler then calls the wrapper, which
        # hands it the interpreter's semantic (with a cold Triton cache: 'value' object has no
        # attribute 'dtype')
        return getattr(val, "__name__", "") == "<lambda>" and "member" in (getattr(val, "__kwdefaults__", None) or {})

    import triton.language as tl

    swapped = []
    owners = [mod for name, mod in list(sys.modules.items()) if name.startswith("triton.language") and mod]
    # the classes whose methods the interpreter wraps too (tensor_descriptor_base: Triton 3.9's)
    owners += [getattr(tl.core, name) for name in ("tensor", "tensor_descriptor_base") if hasattr(tl.core, name)]
    for mod in owners:
        for attr, val in list(vars(mod).items()):
            if isinstance(val, InterpretedFunction):
                swapped.append((mod, attr, val))
                setattr(mod, attr, JITFunction(val.fn))
            elif _leaked(val):
                swapped.append((mod, attr, val))
                setattr(mod, attr, val.__kwdefaults__["member"])
    try:
        yield
    finally:
        for mod, attr, val in swapped:
            setattr(mod, attr, val)


@contextlib.contextmanager
def quiet_stderr():
    """Send file descriptor 2 (C++ code's stderr) to /dev/null for the duration; Python's own
    exceptions are unaffected."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def one_profiler_cycle():
    """Silence torch's warning (2.11, on a GPU) that a profiler "clears events at the end of each cycle":
    the profilers here run one cycle, and the warning would show in every notebook cell that uses one."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events", category=UserWarning)
        yield


def compile_for(kernel, signature: dict, constexprs: dict, *, num_warps: int, arch: int = 90) -> dict:
    """Compile ``kernel`` for an NVIDIA GPU of compute capability ``arch`` (90: Hopper) **without one**:
    Triton's compiler and its bundled ``ptxas`` run on any Linux machine, also in interpreter mode.

    ``signature`` maps each argument name to its Triton type (``"*bf16"``, ``"i32"``, ``"constexpr"``),
    ``constexprs`` gives the compile-time values. Returns the compiled stages by name (``"ptx"``,
    ``"cubin"``...) and ``"sass"``, the disassembled machine code (``None`` if Triton's ``cuobjdump``
    cannot run here).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import JITFunction

    with _compilable_helpers(), warnings.catch_warnings():
        # Triton 3.9 warns that FP fusion (FMA contraction) will stop being its default in 3.10; the
        # kernels here are measured with it on, as Triton 3.6 on the GPU machines compiles them
        warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")
        src = ASTSource(fn=JITFunction(_base_fn(kernel)), signature=signature, constexprs=constexprs)
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
    asm = dict(compiled.asm)
    try:
        from triton.tools.disasm import get_sass

        with quiet_stderr():  # nvdisasm notes its ELF format on stderr, which a notebook would show
            asm["sass"] = get_sass(asm["cubin"])
    except Exception:  # no cuobjdump on this machine: the PTX is still there
        asm["sass"] = None
    return asm


def _element_bytes(ptrs) -> int:
    """Bytes per element behind an interpreter pointer handle (a pointer type, or a block of them)."""
    ty = ptrs.dtype
    while hasattr(ty, "element_ty"):
        ty = ty.element_ty
    return max(1, (ty.primitive_bitwidth + 7) // 8)


def _lanes(ptrs, mask):
    """The addresses of the active lanes of a memory op: ``ptrs`` where ``mask`` (a handle, a numpy array
    or None) is true."""
    import numpy as np

    addrs = np.asarray(ptrs.data).astype(np.uint64, copy=False)
    if mask is None:
        return addrs.ravel()
    m = np.broadcast_to(np.asarray(getattr(mask, "data", mask), dtype=bool), addrs.shape)
    return addrs[m]


@contextlib.contextmanager
def memory_hook(
    on_access: Callable[[str, object, int], None], on_grid: Callable[[], None] | None = None, reads: bool = True
):
    """Triton's interpreter only: call ``on_access(direction, addresses, element_bytes)`` for every memory
    op of an interpreted kernel inside the block, ``direction`` ``"read"`` or ``"write"`` and
    ``addresses`` a numpy array of the byte addresses of the lanes the mask lets through; and
    ``on_grid()`` as each execution of a kernel's grid begins (an autotuner runs its configs first).

    The reach: every load and store of the interpreter funnels through its builder's
    ``create_masked_load(ptrs, mask, other, ...)`` and ``create_masked_store(ptrs, value, mask, ...)``
    (plain, block-pointer and descriptor loads included), with these leading arguments in Triton 3.2
    to 3.9; the trailing cache arguments changed, so the wrappers pass them through untouched. An
    atomic read-modify-write (``create_atomic_rmw(op, ptr, val, mask, ...)``) reads and writes; a
    compare-and-swap (``create_atomic_cas(ptr, cmp, val, ...)``), unmasked, likewise. ``reads=False``:
    plain loads are left alone (a caller that wants only the writes does not pay for every load)."""
    from triton.runtime import interpreter as it

    builder, executor = it.InterpreterBuilder, it.GridExecutor
    saved = [
        (cls, name, cls.__dict__[name])
        for cls, name in (
            (builder, "create_masked_load"),
            (builder, "create_masked_store"),
            (executor, "__call__"),
            (builder, "create_atomic_rmw"),
            (builder, "create_atomic_cas"),
        )
        if name in cls.__dict__ and (reads or name != "create_masked_load")
    ]
    orig = {name: fn for _, name, fn in saved}

    def load(self, ptrs, mask, other, *args, **kwargs):
        on_access("read", _lanes(ptrs, mask), _element_bytes(ptrs))
        return orig["create_masked_load"](self, ptrs, mask, other, *args, **kwargs)

    def store(self, ptrs, value, mask, *args, **kwargs):
        on_access("write", _lanes(ptrs, mask), _element_bytes(ptrs))
        return orig["create_masked_store"](self, ptrs, value, mask, *args, **kwargs)

    def rmw(self, op, ptr, val, mask, *args, **kwargs):
        lanes, size = _lanes(ptr, mask), _element_bytes(ptr)
        on_access("read", lanes, size)
        on_access("write", lanes, size)
        return orig["create_atomic_rmw"](self, op, ptr, val, mask, *args, **kwargs)

    def cas(self, ptr, cmp, val, *args, **kwargs):
        lanes, size = _lanes(ptr, None), _element_bytes(ptr)
        on_access("read", lanes, size)
        on_access("write", lanes, size)
        return orig["create_atomic_cas"](self, ptr, cmp, val, *args, **kwargs)

    def grid(self, *args, **kwargs):
        if on_grid is not None:
            on_grid()
        return orig["__call__"](self, *args, **kwargs)

    mine = {
        "create_masked_load": load,
        "create_masked_store": store,
        "create_atomic_rmw": rmw,
        "create_atomic_cas": cas,
        "__call__": grid,
    }
    for cls, name, _ in saved:
        setattr(cls, name, mine[name])
    try:
        yield
    finally:
        for cls, name, fn in reversed(saved):
            setattr(cls, name, fn)
