"""Probe: where cross-entropy's fwd+bwd time goes beside the split kernel, and split parts of 2 warps
(benchmarks/notes_lesson5.md, 2026-11-25 "the time beside the kernel, extra tiles, the cap at 96").

    PYTHONPATH=. python3 benchmarks/probes/probe_ce_overhead.py [--parts|--quick|--frag|--extra|--cap96|--order]
    PYTHONPATH=. python3 benchmarks/probes/probe_ce_overhead.py [--prologue|--first]
    PYTHONPATH=. python3 benchmarks/probes/probe_ce_overhead.py --pdl [--small]

The 2026-11-25 "cross-entropy's split with the target's reference, shipped" section's shares fit ``time = bytes / rate
+ F`` with F about 20 us a call on both GPUs
(H200 4096 -> 16384 tokens at 65552 and 128256 columns: 82.6 -> 87.0% and 86.0 -> 88.0% of copy), as if
something cost a fixed 20 us beside the kernel's streaming. Here, by shape: the whole fwd+bwd call, the
forward's launches without autograd, the prologue with the split kernel, the prologue alone (GPU clock,
back to back), and each kernel's GPU time from the profiler. ``--parts``: split parts of other sizes
and warps (registers from the compiled kernel), checked against float64 first. ``--pdl``: the package
with programmatic dependent launch (``_launch.PDL``) against without, in turn, after checking that both give
the same bits (2026-11-25 "programmatic dependent launch between a call's own kernels").
"""

from __future__ import annotations

import os
import re
import sys
import time

import torch
import torch.nn.functional as F
import triton
from torch.profiler import ProfilerActivity, profile

import fusionlab  # noqa: F401
from fusionlab import bench
from fusionlab.kernels import _cross_entropy_kernels as cek
from fusionlab.kernels import _launch
from fusionlab.kernels import cross_entropy as ce
from fusionlab.kernels.cross_entropy import CrossEntropyFunction, cross_entropy_config

SHAPES = ((4096, 65552), (8192, 65552), (4096, 128256), (4096, 50257), (4096, 40000), (4096, 32000), (8192, 32000))
#: (part, warps, maxnreg)
PARTS = (
    (16384, 4, 104),
    (16384, 2, None),
    (16384, 2, 168),
    (8192, 2, None),
    (8192, 2, 96),
    (8192, 2, 80),
    (8192, 1, None),
    (8192, 4, 64),
)


def _kernels(fn, calls=10):
    """GPU microseconds a call, by kernel name, from the profiler."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t and ev.count:
            out[ev.key[:60]] = (t / calls, ev.count // calls)
    return out


def _split_cfg(vocab, dtype, part, warps, cap):
    base = {k: v for k, v in cross_entropy_config(vocab, dtype).items() if not k.startswith(("SPLIT", "ROW"))}
    parts = triton.cdiv(vocab, part)
    if parts > 1 and vocab - (parts - 1) * part <= ce.SPLIT_TAIL:
        parts -= 1
    cfg = {**base, "SPLIT": parts, "SPLIT_BLOCK": part, "SPLIT_WARPS": warps, "SPLIT_EARLY": True}
    if cap:
        cfg["SPLIT_MAXNREG"] = cap
    return cfg


def _pdl_ab(copy):
    """fwd+bwd with and without PDL, in turn (three rounds, fastest of each), after a check that both
    give the same bits, also over many calls with a fresh share of ignored rows (a count read before the
    prologue wrote it would change the mean)."""
    big = [(n, v) for n in (4096, 8192, 16384) for v in (32000, 50257, 65552, 128256, 151936, 262144)]
    big = [] if "--small" in sys.argv else big
    small = [(8, 32000), (64, 32000), (512, 32000), (512, 128256), (2048, 50257), (1024, 1000)]
    for tokens, vocab in small + big:
        g = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(tokens, vocab, device="cuda", generator=g) * 2).to(torch.bfloat16).requires_grad_()
        t = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
        nb = 2 * x.numel() * x.element_size()

        def full(t=t):
            return torch.autograd.grad(ce.cross_entropy(x, t), x)

        same, calls = True, 200 if tokens * vocab <= 2**27 else 20
        for i in range(calls):
            ti = t.clone()
            ti[torch.rand(tokens, device="cuda", generator=g) < (i % 11) / 10] = -100  # 0..100% ignored
            got = {}
            for flag in (False, True):
                _launch.PDL = flag
                loss = ce.cross_entropy(x, ti)
                (dx,) = torch.autograd.grad(loss, x)
                got[flag] = (loss, dx)
            same &= torch.equal(got[0][0], got[1][0]) or bool(got[0][0].isnan() & got[1][0].isnan())
            same &= torch.equal(got[0][1], got[1][1])
        times = {False: [], True: []}
        for _ in range(3):
            for flag in (False, True):
                _launch.PDL = flag
                times[flag].append(bench.queued_ms(full))
        host = {}
        if tokens * vocab <= 2**26:  # launch-bound: the call as the host sees it too (wall clock, 200 calls)
            for flag in (False, True, False, True):
                _launch.PDL = flag
                full()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(200):
                    full()
                torch.cuda.synchronize()
                host[flag] = min(host.get(flag, 1e9), (time.perf_counter() - t0) / 200 * 1e3)
        a, b = min(times[False]), min(times[True])
        line = f"{tokens:6d} x {vocab:6d}: no PDL {a * 1e3:8.1f} us {nb / a / 1e6 / copy:6.1%}"
        line += f"  PDL {b * 1e3:8.1f} us {nb / b / 1e6 / copy:6.1%}  ({(a - b) * 1e3:+5.1f} us)"
        if host:
            line += f"  host clock {host[False] * 1e3:.1f} -> {host[True] * 1e3:.1f} us"
        print(line + ("" if same else f"  DIFFERENT BITS over {calls} calls"), flush=True)
        _launch.PDL = True
        x = None
        torch.cuda.empty_cache()


def _prologue_step(copy):
    """The prologue's step sized to the targets (the package) against 16 Ki always (before), fwd+bwd and
    the prologue alone, in turn, fastest of three rounds."""
    for tokens, vocab in ((1024, 32000), (4096, 32000), (4096, 50257), (8192, 32000), (8192, 50257)):
        g = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(tokens, vocab, device="cuda", generator=g) * 2).to(torch.bfloat16).requires_grad_()
        t = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
        nb = 2 * x.numel() * x.element_size()
        split = bool(cross_entropy_config(vocab, torch.bfloat16).get("SPLIT"))
        times = {}
        for _ in range(3):
            for least in (16384, cek.COUNT_BLOCK_MIN):
                cek.COUNT_BLOCK_MIN, saved = least, cek.COUNT_BLOCK_MIN
                full = bench.queued_ms(lambda: torch.autograd.grad(ce.cross_entropy(x, t), x))
                alone = bench.queued_ms(
                    lambda: ce._prologue(t, -100, count=True, n_rows_split=tokens if split else None)
                )
                cek.COUNT_BLOCK_MIN = saved
                a, b = times.get(least, (1e9, 1e9))
                times[least] = (min(a, full), min(b, alone))
        line = f"{tokens:6d} x {vocab}:"
        for least, (full, alone) in times.items():
            line += (
                f"  step >= {least}: {full * 1e3:7.1f} us {nb / full / 1e6 / copy:6.1%} (prologue {alone * 1e3:.2f} us)"
            )
        print(line, flush=True)
        x = None
        torch.cuda.empty_cache()


def _first_kernel(copy):
    """The prologue launched dependent on the kernel before the call (the package: it waits for it before
    reading the targets) against launched plainly, fwd+bwd in turn, fastest of three rounds."""
    package = ce._prologue

    def plain(target, ignore_index, *, count, n_rows_split=None):
        n_sync = 1 if n_rows_split is None else 2 + n_rows_split
        sync = torch.empty(n_sync, dtype=torch.int32, device=target.device)
        block = min(cek._COUNT_BLOCK, max(cek.COUNT_BLOCK_MIN, triton.next_power_of_2(max(target.shape[0], n_sync))))
        cek._cross_entropy_prologue_kernel[(1,)](
            target, sync, target.shape[0], n_sync, ignore_index, COUNT=count, BLOCK=block, PDL=True, num_warps=16
        )
        return sync

    for tokens, vocab in ((8, 32000), (512, 32000), (4096, 32000), (4096, 50257), (8192, 32000), (16384, 50257)):
        g = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(tokens, vocab, device="cuda", generator=g) * 2).to(torch.bfloat16).requires_grad_()
        t = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
        nb = 2 * x.numel() * x.element_size()
        times = {"plain": [], "dependent": []}
        for _ in range(3):
            for label, fn in (("plain", plain), ("dependent", package)):
                ce._prologue = fn
                times[label].append(bench.queued_ms(lambda: torch.autograd.grad(ce.cross_entropy(x, t), x)))
        ce._prologue = package
        line = f"{tokens:6d} x {vocab}:"
        for label, ts in times.items():
            line += f"  prologue {label} {min(ts) * 1e3:7.1f} us {nb / min(ts) / 1e6 / copy:6.1%}"
        print(line, flush=True)
        x = None
        torch.cuda.empty_cache()


_MEMORY = re.compile(r"^\s*(@!?%p\d+\s+)?(ld\.global|atom\.|red\.|st\.global|cp\.async)")


def _wait_order():
    """Which memory instructions come before each dependent kernel's griddepcontrol.wait in its
    compiled code (predicated ones included)."""
    # the compiled order: what each dependent kernel does first after its wait (a split and a
    # head-and-tail call first, so that those kernels are compiled in this process too)
    for vocab in (50257, 32000, 1000):
        xs = torch.randn(64, vocab, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        ce.cross_entropy(xs, torch.randint(0, vocab, (64,), device="cuda")).backward()
    for name, fn in (
        ("rows", cek._cross_entropy_rows_kernel),
        ("split", cek._cross_entropy_split_kernel),
        ("head-and-tail", ce._cross_entropy_fwd_kernel),
        ("finish", cek._cross_entropy_finish_kernel),
        ("backward", cek._cross_entropy_bwd_kernel),
    ):
        caches = getattr(fn, "device_caches", {})  # (3.6 and 3.9: device -> (kernels by key, ...))
        kernels = [k for cache in caches.values() for k in list(cache[0].values())[:4]]
        for k in kernels:
            ptx = k.asm["ptx"].splitlines()
            at = [i for i, line in enumerate(ptx) if "griddepcontrol.wait" in line]
            if not at:
                continue
            before = [line.strip() for line in ptx[: at[0]] if _MEMORY.match(line)]
            after = [line.strip() for line in ptx[at[0] :] if _MEMORY.match(line)]
            print(f"{name}: before the wait {len(before)} {before[:3]}; after it {after[:2]}")


def main():
    copy = bench.measure_copy_bandwidth()
    dev = torch.cuda.get_device_name()
    print(f"{dev}, torch {torch.__version__}, triton {triton.__version__}, copy {copy:.0f} GB/s")
    if "--pdl" in sys.argv:
        return _pdl_ab(copy)
    if "--order" in sys.argv:
        return _wait_order()
    if "--prologue" in sys.argv:
        return _prologue_step(copy)
    if "--first" in sys.argv:
        return _first_kernel(copy)
    shapes = SHAPES + ((16384, 50257),)
    frag = "--frag" in sys.argv  # 50257 as three parts and the last part's fragment (1105 columns), by cap
    if frag:
        shapes = ((4096, 50257), (8192, 50257), (16384, 50257))
    extra = "--extra" in sys.argv  # whole parts and the remainder shared among them, in extra tiles
    if extra:
        shapes = ((4096, 50257), (8192, 50257), (16384, 50257), (8192, 49408), (8192, 50304, torch.float16))
        shapes += ((4096, 151936), (8192, 151936), (8192, 200064), (8192, 100000), (8192, 66000), (4096, 40000))
        shapes += ((4096, 128256), (8192, 128256), (16384, 128256), (8192, 128256, torch.float16), (8192, 36000))
        shapes += ((4096, 262144), (8192, 262144), (8192, 65536))
    cap96 = "--cap96" in sys.argv  # a 16-column fragment beside whole parts: 101 registers (four programs a SM)
    if cap96:
        shapes = ((4096, 65552), (8192, 65552), (16384, 65552), (8192, 49168), (8192, 131088), (8192, 98311))
        shapes += ((8192, 65552, torch.float16), (8192, 128256, torch.float16), (8192, 98311, torch.float16))
        shapes += ((8192, 128256), (8192, 32000))
    if "--quick" in sys.argv:
        shapes = ((4096, 65552), (8192, 65552), (16384, 50257), (4096, 32000), (8192, 32000))
    if "--asm" in sys.argv:  # one shape's compiled code
        shapes = shapes[:1]
    for tokens, vocab, *rest in shapes:
        dtype = rest[0] if rest else torch.bfloat16
        g = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(tokens, vocab, device="cuda", generator=g) * 2).to(dtype)
        t = torch.randint(0, vocab, (tokens,), device="cuda", generator=g)
        xg = x.clone().requires_grad_()
        grad = torch.empty_like(x)
        nb = 2 * x.numel() * x.element_size()
        what = f"{tokens} x {vocab} {str(dtype)[6:]}"
        print(f"{what}: two trips {nb / 1e6:.0f} MB, {nb / copy / 1e3:.1f} us at copy", flush=True)

        def show(label, ms):
            print(f"  {label:44s} {ms * 1e3:8.1f} us  {nb / ms / 1e6 / copy:6.1%}", flush=True)

        cfgs = {"package": cross_entropy_config(vocab, dtype)}
        for cap in (104, 112, 120, 128, 136, None) if frag else ():
            cfgs[f"split 3 x 16384 + fragment, cap {cap}"] = {
                **_split_cfg(vocab, dtype, 16384, 4, cap),
                "SPLIT": vocab // 16384,
            }
        if extra:  # the package's choice against the split without extra tiles, and with them
            cfgs["no extra tiles"] = _split_cfg(vocab, dtype, 16384, 4, 96)
            fewest = triton.cdiv(vocab, 20480)  # parts of up to 16384 + 4096 columns
            if dtype != torch.float32 and fewest < cfgs["package"]["SPLIT"]:
                part_n = triton.cdiv(vocab, 16 * fewest) * 16
                cfg = {**_split_cfg(vocab, dtype, 16384, 4, 96), "SPLIT": fewest, "SPLIT_PART": part_n}
                cfgs[f"fewest parts: {fewest} x {part_n}"] = cfg
            for cap in (96,) if "SPLIT_PART" not in cfgs["package"] else ():
                cfg = _split_cfg(vocab, dtype, 16384, 4, cap)
                whole = vocab // 16384
                cfg.update(SPLIT=whole, SPLIT_PART=16384 + triton.cdiv(vocab - whole * 16384, 16 * whole) * 16)
                cfgs[f"split {whole} x {cfg['SPLIT_PART']} (extra tile), cap {cap}"] = cfg
        for cap in (96, 100) if cap96 else ():
            cfgs[f"package, cap {cap}"] = {**cfgs["package"], "SPLIT_MAXNREG": cap}
        for part, warps, cap in PARTS if "--parts" in sys.argv else ():
            cfg = _split_cfg(vocab, dtype, part, warps, cap)
            cfgs[f"split {cfg['SPLIT']} x {part} w{warps} cap {cap}"] = cfg
        ts = t[:64].clone()
        ts[::5] = -100
        xs = x[:64].double().requires_grad_()
        (want,) = torch.autograd.grad(F.cross_entropy(xs, ts), xs)
        for label, cfg in cfgs.items():
            split = bool(cfg.get("SPLIT"))
            xc = x[:64].clone().requires_grad_()
            (got,) = torch.autograd.grad(CrossEntropyFunction.apply(xc, ts, -100, "mean", 0.0, False, cfg), xc)
            err = ((got.double() - want).norm() / want.norm()).item()
            regs = ""
            if split:
                sync = ce._prologue(ts, -100, count=True, n_rows_split=64)
                k = ce._launch_split(xc.detach(), ts, got, torch.empty(64, device="cuda"), sync, -100, 0.0, cfg, True)
                regs = f" ({k.n_regs} regs, {k.n_spills} spills)"
            if err > 1e-2:
                print(f"  {label}: WRONG, error {err:.1e}")
                continue

            def full(cfg=cfg):
                return torch.autograd.grad(CrossEntropyFunction.apply(xg, t, -100, "mean", 0.0, False, cfg), xg)

            show(f"{label}{regs}: fwd+bwd", bench.queued_ms(full))
            if "--asm" in sys.argv and split:  # the compiled code, to compare registers' uses
                from triton.tools.disasm import get_sass

                name = f"{os.environ.get('OUT', '.')}/split_{vocab}_{label.replace(' ', '_').replace(',', '')}"
                for kind, text in (("ptx", k.asm["ptx"]), ("sass", get_sass(k.asm["cubin"]))):
                    with open(f"{name}.{kind}", "w") as f:
                        f.write(text)
            if label != "package" or frag or extra or cap96:
                continue
            fwd = bench.queued_ms(lambda: ce._loss(x, t, grad, -100, "mean", 0.0, cfg))
            show("forward's launches (no autograd)", fwd)
            half = torch.tensor(0.5, device="cuda", dtype=dtype)

            def scaled(cfg=cfg):
                loss = CrossEntropyFunction.apply(xg, t, -100, "mean", 0.0, False, cfg)
                return torch.autograd.grad(loss, xg, grad_outputs=half)

            show("fwd+bwd, grad_output 0.5 (a second pass)", bench.queued_ms(scaled))
            loss = torch.empty(tokens, dtype=torch.float32, device="cuda")

            def prologue():
                return ce._prologue(t, -100, count=True, n_rows_split=tokens if split else None)

            def kernel():
                ce.cross_entropy_rows(x, t, grad, loss, prologue(), -100, 0.0, cfg, mean=True)

            show("prologue + loss kernel", bench.queued_ms(kernel))
            show("prologue alone", bench.queued_ms(prologue))
            for name, (us, n) in sorted(_kernels(full).items(), key=lambda kv: -kv[1][0]):
                print(f"    {name:60s} {us:8.1f} us x{n}")
        x = xg = grad = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
