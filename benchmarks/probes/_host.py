"""What the host_* probes share: a call's host time on a CPU, the Triton launches stubbed out by the probe."""

import time


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
