"""What the host_* probes share: a call's host time on a CPU, and a :class:`HitPath` each probe puts in
place of the launchers it times (the Launcher's GPU hit path run on a CPU, the kernel launch a no-op)."""

import argparse
import time
import types

from fusionlab.kernels import _launch


def per_call_us(fn, calls=400, rounds=7, warmup=200):
    """Host microseconds a call of ``fn()``: the fastest of ``rounds`` rounds of ``calls`` calls (this
    machine's other work only ever adds time)."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - t0)
    return best / calls * 1e6


def arguments(doc: str) -> argparse.Namespace:
    """A host probe's command line: ``--rounds`` (default 7) and ``--no-profile``; ``doc``: its docstring."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-profile", action="store_true")
    return ap.parse_args()


def print_profile(fn, calls: int, sort: str = "tottime", top: int = 10) -> None:
    """cProfile of ``calls`` calls of ``fn()``, its ``top`` lines by ``sort``."""
    import cProfile
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    for _ in range(calls):
        fn()
    pr.disable()
    pstats.Stats(pr).sort_stats(sort).print_stats(top)


class _Compiled:
    """What Triton hands back for a compiled kernel, with a launch that does nothing."""

    function = packed_metadata = None

    @staticmethod
    def run(*args, **kwargs):
        return None


class _Kernel:
    """A kernel whose first launch (the Launcher's miss) compiles nothing: it returns :class:`_Compiled`."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: _Compiled()


# the Launcher's own launch (what __call__ calls), its module's GPU switches on: the same code object, other globals
_GPU_GLOBALS = dict(vars(_launch))
_GPU_GLOBALS.update(
    runtime=types.SimpleNamespace(is_gpu=lambda: True),
    _triton=types.SimpleNamespace(watching=lambda: False, launch_hooks_set=lambda: False, current_stream=lambda d: 0),
    current_device=lambda: 0,
)
_gpu_launch = types.FunctionType(_launch.Launcher.launch.__code__, _GPU_GLOBALS, "launch")
_gpu_launch.__defaults__ = _launch.Launcher.launch.__defaults__


class HitPath(_launch.Launcher):
    """A Launcher on its GPU hit path whose kernel launch is a no-op."""

    def __init__(self, launcher):
        self.__dict__.update(vars(launcher))
        self.kernel, self._compiled = _Kernel(), {}

    launch = _gpu_launch  # (``__call__`` passes its arguments to it)
