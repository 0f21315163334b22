"""Read what ``torch.compile`` wrote: the code Inductor generates for a function, and its kernels.

Lesson 3 asks *what the compiler fused*. The answer is in the code Inductor emits: on a GPU a Python
module with one ``@triton.jit`` kernel per fused group (``triton_poi_fused_add_gelu_0``: "poi" for
pointwise, then the ops it fused); on a CPU the same module with C++ kernels
(``cpp_fused_add_gelu_0``, an ``extern "C"`` function with OpenMP loops). Matmuls are not generated
but called from a library (``extern_kernels.mm``/``addmm``: cuBLAS, or MKL/oneDNN on a CPU).

    >>> code = generated_code(lambda x, b: F.gelu(x + b), x, b)
    >>> kernel_names(code)
    ['cpp_fused_add_gelu_0']            # on a GPU: ['triton_poi_fused_add_gelu_0']
    >>> eager_ops(lambda x, b: F.gelu(x + b), x, b)
    ['add', 'gelu']                     # eager: one kernel per op
    >>> print(kernel_excerpt(code))     # the kernel's loop (C++) or its @triton.jit function (GPU)

A CPU has no Triton code to show: lesson 3 ships the code Inductor generated on a GPU for its own
functions (``fusionlab.lessons.l3.generated_code``).
"""

from __future__ import annotations

import contextlib
import logging
import re
import textwrap
import warnings
from collections.abc import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from ._triton import one_profiler_cycle, quiet_stderr
from .instrument import FREE, PASSES, LaunchCounter

#: aten ops that do not compute: allocations, views, copies and fills
_NOT_COMPUTE = FREE | PASSES

# `name = async_compile.triton('name', '''...` (GPU) or `name = async_compile.cpp_pybinding([...], r'''`
# (CPU): each generated kernel is bound to a module-level name once, however often `call` launches it.
_ASYNC_KERNEL = re.compile(r"^(\w+)\s*=\s*async_compile\.(?:triton|cpp_pybinding|cpp|cuda|halide)\(", re.M)
# A Triton kernel's own definition inside the source string (also what older Inductor versions show)
_TRITON_DEF = re.compile(r"@triton\.jit\s*\n\s*def\s+(\w+)\s*\(")
# Library calls Inductor does not generate code for: matmuls, convolutions, ...
_EXTERN_CALL = re.compile(r"\bextern_kernels\.(\w+)\(")

_SEPARATOR = "\n\n# ---- next compiled graph ----\n\n"
_LOGGERS = ("torch._inductor.graph.__output_code", "torch._inductor.codecache.__output_code")


def _run_with_logs(compiled: Callable, inputs: tuple) -> list[str]:
    """Fallback for a torch without ``run_and_get_code``: switch on the ``output_code`` log
    (what ``TORCH_LOGS=output_code`` does) and keep the records that carry the code."""
    codes: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record):
            if str(record.msg).startswith("Output code:") and record.args:
                codes.append(str(record.args[0]))

    handler = _Keep(level=logging.DEBUG)
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    torch._logging.set_logs(output_code=True)
    for lg in loggers:
        lg.addHandler(handler)
    try:
        torch._dynamo.reset()
        compiled(*inputs)
    finally:
        for lg in loggers:
            lg.removeHandler(handler)
        torch._logging.set_logs()  # back to the defaults (this also drops any earlier set_logs call)
    return list(dict.fromkeys(codes))  # the codecache logs a cache hit's code a second time


def compile_with_code(
    fn: Callable, *example_inputs, method: str = "auto", kernel_profile: bool = True, **compile_kwargs
) -> tuple[Callable, str]:
    """Compile ``fn`` with ``torch.compile`` (Inductor), run it once on ``example_inputs`` and
    return ``(compiled, code)``: the compiled function, ready to call again, and the code Inductor
    generated for it (C++ kernels on a CPU, Triton kernels on a GPU).

    Inductor caches compiled graphs, so the code is only generated (and seen) on a fresh compile:
    this calls ``torch._dynamo.reset()`` first, and every function compiled earlier in the process
    recompiles on its next call (keep that out of a timing: warm up again; Inductor's on-disk cache
    makes the recompile quick). Several graphs (graph breaks) come back joined by a
    ``# ---- next compiled graph ----`` line. ``compile_kwargs`` go to ``torch.compile`` (e.g.
    ``mode="max-autotune"``). ``method``: ``"auto"`` uses ``torch._inductor.utils.run_and_get_code``
    where it exists, ``"logs"`` the ``output_code`` log. ``kernel_profile``: on a CPU, let each
    generated C++ kernel announce itself to ``torch.profiler`` (Inductor's
    ``cpp.enable_kernel_profile``; one extra line in the C++), so :func:`profiled_kernels` can name
    it; GPU kernels are seen by the profiler anyway.
    """
    if method not in ("auto", "logs"):
        raise ValueError(f"method={method!r}; choose 'auto' or 'logs'.")
    compiled = torch.compile(fn, **compile_kwargs)
    run_and_get_code = None
    if method == "auto":
        with contextlib.suppress(ImportError, AttributeError):
            from torch._inductor.utils import run_and_get_code
    patch = contextlib.nullcontext()
    if kernel_profile:
        from torch._inductor import config

        if hasattr(config, "cpp") and hasattr(config.cpp, "enable_kernel_profile"):
            patch = config.patch({"cpp.enable_kernel_profile": True})
    with patch, warnings.catch_warnings():
        # A GPU with TF32 tensor cores gets a hint, once per process, to enable them for fp32 matmuls:
        # advice about speed, not about what was generated, and noise in a notebook that reads code.
        warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores")
        if run_and_get_code is not None:
            _, codes = run_and_get_code(compiled, *example_inputs)  # it resets dynamo itself
        else:
            codes = _run_with_logs(compiled, example_inputs)
    if not codes:
        raise RuntimeError(
            "torch.compile generated no code for this function: nothing to compile (no tensor ops), "
            "or a backend other than Inductor ran."
        )
    return compiled, _SEPARATOR.join(codes)


def generated_code(fn: Callable, *example_inputs, method: str = "auto", **compile_kwargs) -> str:
    """The code Inductor generates for ``fn`` on ``example_inputs``: C++ kernels on a CPU, Triton
    kernels on a GPU. :func:`compile_with_code` without the compiled function (and without the
    profiler hook, so the C++ is exactly what a plain ``torch.compile`` builds)."""
    return compile_with_code(fn, *example_inputs, method=method, kernel_profile=False, **compile_kwargs)[1]


def kernel_names(code: str) -> list[str]:
    """The kernels Inductor generated, in order of definition: ``triton_*`` on a GPU, ``cpp_*`` on a CPU.

    Library calls (``extern_kernels.mm``) are not generated kernels: see :func:`extern_calls`.
    """
    names = _ASYNC_KERNEL.findall(code) + _TRITON_DEF.findall(code)
    return list(dict.fromkeys(names))  # a Triton kernel is named twice: its binding and its def


def extern_calls(code: str) -> list[str]:
    """Library kernels the generated code calls (``mm``, ``addmm``, ``bmm``, ...), one per call."""
    return _EXTERN_CALL.findall(code)


def count_kernels(code: str, *, include_extern: bool = False) -> int:
    """How many kernels Inductor generated (fused groups); with ``include_extern``, plus the
    library calls, i.e. every kernel the compiled function launches once per call."""
    return len(kernel_names(code)) + (len(extern_calls(code)) if include_extern else 0)


def eager_ops(fn: Callable, *inputs) -> list[str]:
    """The compute ops eager PyTorch runs for ``fn(*inputs)``, one kernel each (aten names; views,
    allocations and copies left out), for comparison with :func:`count_kernels` of the compiled code."""
    with torch.no_grad(), LaunchCounter() as counter:
        fn(*inputs)
    return counter.torch_ops


# -- reading the code -------------------------------------------------------------------------------
_KERNEL_PREFIX = re.compile(r"^(?:graph_\d+_)?(?:triton_(?:poi|red|per|tem|tma|mm)_|triton_|cpp_|cuda_|halide_)")


def fused_name(kernel: str) -> str:
    """What a generated kernel's name says it fused: ``"triton_poi_fused_add_gelu_0"`` and
    ``"cpp_fused_add_gelu_0"`` both give ``"add_gelu"``.

    Inductor names a kernel after the aten ops it holds, sorted alphabetically (not in the order they
    run), and drops ops that are only views. A name too long is cut short by Inductor, so read the
    code when it matters.
    """
    name = _KERNEL_PREFIX.sub("", kernel)
    name = re.sub(r"_\d+$", "", name)
    return name[len("fused_") :] if name.startswith("fused_") else name


def kernel_source(code: str, name: str | None = None) -> str:
    """The source of one generated kernel (the first one if ``name`` is None): a Triton kernel from
    its ``@triton.jit`` line to the end of its function, a C++ kernel as the whole ``extern "C"``
    text Inductor hands to the compiler."""
    names = kernel_names(code)
    if not names:
        raise ValueError("no generated kernel in this code (a library call only, or not Inductor's output)")
    name = names[0] if name is None else name
    if name not in names:
        raise ValueError(f"no kernel {name!r} in this code; it has: {', '.join(names)}")
    m = re.search(rf"^[ \t]*@triton\.jit\s*\n\s*def\s+{re.escape(name)}\s*\(", code, re.M)
    if m:
        lines = textwrap.dedent(code[m.start() :]).splitlines()
        head = next(i for i, line in enumerate(lines) if line.startswith("def "))
        end = head + 1
        while end < len(lines) and (not lines[end].strip() or lines[end][:1] in (" ", "\t")):
            end += 1  # the body: indented lines; back at column 0 is the end (the string's closing quotes)
        return "\n".join(lines[:end]).strip("\n") + "\n"
    m = re.search(rf"^{re.escape(name)}\s*=\s*async_compile\.\w+\(.*?r?('''|\"\"\")", code, re.M | re.S)
    if not m:
        raise ValueError(f"found the name {name!r} but not its source")
    body = code[m.end() :]
    return body[: body.find(m.group(1))].strip("\n") + "\n"


def _tidy_cpp(line: str) -> str:
    """``static_cast<int64_t>(256L)`` -> ``256``: Inductor's casts say nothing a reader needs."""
    prev = None
    while prev != line:
        prev = line
        line = re.sub(r"static_cast<int64_t>\(([^()]*)\)", r"\1", line)
    return re.sub(r"\b(\d+)L\b", r"\1", line)


def kernel_excerpt(code: str, name: str | None = None) -> str:
    """A generated kernel, trimmed for reading: a Triton kernel's ``@triton.jit`` function; a C++
    kernel's loop nest down to its first store (OpenMP pragma kept, braces, bounds guards and
    ``static_cast<int64_t>`` dropped, indentation by loop depth)."""
    src = kernel_source(code, name)
    if src.startswith("@triton.jit"):
        return src
    lines = src.splitlines()
    first = next((i for i, ln in enumerate(lines) if ln.strip().startswith("for(")), None)
    if first is None:
        return src
    if first > 0 and lines[first - 1].strip().startswith("#pragma omp for"):
        first -= 1
    out, depth = [], 0
    for ln in lines[first:]:
        text = ln.strip()
        if not text or text in ("{", "}") or text.startswith("if(C10_LIKELY") or text.startswith("if(C10_UNLIKELY"):
            continue
        out.append("    " * depth + _tidy_cpp(text))
        if text.startswith("for("):
            depth += 1
        if ".store(" in text or re.match(r"(in_)?out_ptr\d+\[", text):
            break
    return "\n".join(out) + "\n"


def launch_lines(code: str) -> list[str]:
    """The lines of the generated ``call`` function that launch work, in order: library calls
    (``extern_kernels.mm(...)``) and generated kernels (``cpp_fused_..(...)``,
    ``triton_poi_fused_...run(...)``). This is the schedule the compiled function runs per call."""
    names = kernel_names(code)
    launch = (
        re.compile(r"\bextern_kernels\.\w+\(|\b(?:" + "|".join(map(re.escape, names)) + r")(?:\.run)?\(")
        if names
        else _EXTERN_CALL
    )
    out = []
    for block in re.finditer(r"^([ \t]*)def call\(.*?\):\n(.*?)(?=^\1\S|\Z)", code, re.M | re.S):
        for line in block.group(2).splitlines():
            text = line.strip()
            if launch.search(text) and not text.startswith(("#", "def ")) and "async_compile" not in text:
                out.append(text)
    return out


def profiled_kernels(fn: Callable, *inputs, warmup: bool = True) -> list[str]:
    """The kernels one call of ``fn(*inputs)`` launches, as ``torch.profiler`` sees them.

    With CUDA inputs: every CUDA kernel the GPU ran (cuBLAS, PyTorch's element-wise kernels, Triton
    kernels), memory copies and sets left out. On a CPU there is no kernel launch to see, so this
    lists what stands for one: each aten op that computes, as your code called it (``relu``, not
    the ``clamp_min`` it runs inside; views and allocations left out), and each generated C++
    kernel — these show up only if the function was compiled with the profiler hook
    (:func:`compile_with_code` sets it).
    ``warmup`` runs ``fn`` once first, so compilation or autotuning is not what gets profiled.
    """
    cuda = any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs)
    # (no torch.no_grad() here: a compiled function is guarded on the grad mode it was compiled in,
    # and would recompile, without the profiler hook, under another)
    if warmup:
        fn(*inputs)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.synchronize()
    # On a CPU, some torch builds have the profiler library log "profiler_start/stop" lines on the
    # process's stderr, which a notebook shows; silence them there (on a GPU, keep its warnings).
    with contextlib.ExitStack() as stack:
        if not cuda:
            stack.enter_context(quiet_stderr())
        stack.enter_context(one_profiler_cycle())
        prof = stack.enter_context(profile(activities=activities))
        fn(*inputs)
        if cuda:
            torch.cuda.synchronize()
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    if cuda:
        return [
            e.name for e in events if e.device_type == DeviceType.CUDA and not e.name.startswith(("Memcpy", "Memset"))
        ]

    def computes(e) -> bool:
        return e.name.startswith("aten::") and e.name[len("aten::") :] not in _NOT_COMPUTE

    def outer_compute(e) -> bool:
        p = e.cpu_parent
        while p is not None:
            if computes(p):
                return True
            p = p.cpu_parent
        return False

    generated = re.compile(r"^(?:graph_\d+_)?((?:cpp|triton|cuda|halide)_\w+)$")
    out = []
    for e in events:
        m = generated.match(e.name)
        if m:
            out.append(m.group(1))
        elif computes(e) and not outer_compute(e):
            out.append(e.name)
    return out
