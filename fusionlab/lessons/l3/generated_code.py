"""Lesson 3's artifacts: the code Inductor generated on a GPU for the lesson's functions, saved in
``fusionlab/lessons/l3/generated/`` so a learner without a GPU can read the Triton kernels.

    python -m fusionlab.lessons.l3.generated_code --save fusionlab/lessons/l3/generated    # on a GPU
"""

from __future__ import annotations

import argparse
import datetime as _dt
import inspect
import platform
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ...inductor import extern_calls, generated_code, kernel_names
from ...kernels.bias_gelu import bias_gelu_eager
from ...kernels.chain import CHAIN_OPS, chain_reference
from ...runtime import version
from ..l2 import suite as lesson2
from . import suite as lesson3

# -- GPU code saved in the package ------------------------------------------------------------------
GENERATED_DIR = Path(__file__).parent / "generated"
SAVE_COMMAND = "python -m fusionlab.lessons.l3.generated_code --save fusionlab/lessons/l3/generated"


@dataclass(frozen=True)
class LessonFunction:
    """A function whose generated code the lesson reads, with the inputs it is compiled for."""

    name: str
    what: str
    fn: Callable
    inputs: tuple  # ((shape, dtype), ...)


def lesson_functions(small: bool = False) -> list[LessonFunction]:
    """Lesson 3's functions at the shapes the benchmarks time them (``small``: tiny shapes, for a test).

    Inductor specialises the code to the shape (the element count and the bias's length appear in it
    as constants), so the saved code is the code that ran in the recorded timings."""
    fp32, bf16 = torch.float32, torch.bfloat16
    m2, n2 = (64, 256) if small else lesson2.SHAPES[fp32]
    n_chain = 4096 if small else lesson2.CHAIN_N
    m, k, n = (32, 64, 128) if small else (lesson3.M, lesson3.K, lesson3.N)
    chain_ops = ", ".join(name for name, _ in CHAIN_OPS)

    def chain_k4(x):
        return chain_reference(x, 4)

    return [
        LessonFunction(
            "bias_gelu_fp32",
            f"lesson 2's bias + GELU, F.gelu(h + b), fp32 {m2} x {n2}",
            bias_gelu_eager,
            (((m2, n2), fp32), ((n2,), fp32)),
        ),
        LessonFunction(
            "bias_gelu_bf16",
            f"lesson 3's small ops: bias + GELU on the layer's output, bf16 {m} x {n}",
            bias_gelu_eager,
            (((m, n), bf16), ((n,), bf16)),
        ),
        LessonFunction(
            "chain_k4",
            f"lesson 2's k-op chain, k = 4 ({chain_ops}), fp32, {n_chain} elements",
            chain_k4,
            (((n_chain,), fp32),),
        ),
        LessonFunction(
            "layer_bf16",
            f"lesson 3's layer, linear -> bias -> GELU, bf16 {m} x {k} -> {n}",
            lesson3.layer_eager,
            (((m, k), bf16), ((n, k), bf16), ((n,), bf16)),
        ),
    ]


def _device_line(device: torch.device) -> str:
    if device.type == "cuda":
        cap = ".".join(map(str, torch.cuda.get_device_capability(device)))
        return f"{torch.cuda.get_device_name(device)} (sm_{cap.replace('.', '')}), CUDA {torch.version.cuda}"
    return f"CPU ({platform.machine()})"


def _header(lf: LessonFunction, code: str, device: torch.device) -> str:
    now = _dt.datetime.now(_dt.timezone.utc)
    shapes = ", ".join(f"{tuple(s)} {str(d).replace('torch.', '')}" for s, d in lf.inputs)
    extern = extern_calls(code)
    lines = [
        "# ruff: noqa",
        f"# Code that torch.compile (Inductor) generated for fusionlab lesson 3: {lf.name}",
        f"# function: {lf.what}",
        f"# inputs: {shapes}; torch.compile(fn, dynamic=False)",
        f"# device: {_device_line(device)}",
        f"# date: {now.date().isoformat()} {now.strftime('%H:%M:%SZ')}",
        f"# torch {torch.__version__.split('+')[0]}, triton {version('triton')}, python {platform.python_version()}",
        f"# generated kernels: {', '.join(kernel_names(code)) or 'none'}",
        f"# library calls: {', '.join(extern) or 'none'}",
        f"# written by: {SAVE_COMMAND}",
        "#",
        "# the function compiled:",
        *("#   " + ln for ln in textwrap.dedent(inspect.getsource(lf.fn)).rstrip().splitlines()),
    ]
    return "\n".join(lines) + "\n\n"


def save_generated(
    outdir: str | Path = GENERATED_DIR, device: str = "cuda", names=None, small: bool = False
) -> list[Path]:
    """Compile each of :func:`lesson_functions` on ``device`` and write its generated code to
    ``outdir/<name>.py``, behind a comment header (device, date, versions, the function compiled).

    Meant for a GPU (``device="cuda"``): the files are how a learner without one reads the Triton
    kernels. ``device="cpu"`` writes the C++ versions (for a test). ``names`` limits which are done.
    """
    dev = torch.device(device)
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    todo = lesson_functions(small)
    if names is not None:
        unknown = set(names) - {lf.name for lf in todo}
        if unknown:
            raise ValueError(f"unknown names {sorted(unknown)}; have {', '.join(lf.name for lf in todo)}")
        todo = [lf for lf in todo if lf.name in names]
    written = []
    for lf in todo:
        g = torch.Generator(device=dev).manual_seed(0)
        inputs = [torch.randn(s, generator=g, device=dev, dtype=d) for s, d in lf.inputs]
        code = generated_code(lf.fn, *inputs, dynamic=False)
        path = outdir / f"{lf.name}.py"
        path.write_text(_header(lf, code, dev) + code.rstrip() + "\n")
        written.append(path)
        del inputs
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return written


def saved_generated(directory: str | Path | None = None) -> dict[str, str]:
    """The generated code saved in the package, ``{name: text}`` (empty when none is saved yet)."""
    d = Path(directory) if directory is not None else GENERATED_DIR
    if not d.is_dir():
        return {}
    return {p.stem: p.read_text() for p in sorted(d.glob("*.py")) if p.name != "__init__.py"}


def header(text: str) -> str:
    """The comment header of a saved file: where, when and from what the code was generated."""
    out = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if not line.startswith("# ruff:"):
            out.append(line)
    return "\n".join(out).rstrip("#\n ") + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Save the code Inductor generates for lesson 3's functions.")
    ap.add_argument("--save", type=Path, required=True, metavar="DIR", help="where to write <name>.py")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (C++ code, for a test)")
    ap.add_argument(
        "--names",
        default=None,
        help="comma-separated subset of: " + ", ".join(lf.name for lf in lesson_functions(small=True)),
    )
    ap.add_argument("--small", action="store_true", help="tiny shapes instead of the benchmarks' shapes")
    args = ap.parse_args(argv)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU here: the Triton code must be generated on a GPU (or pass --device cpu)", file=sys.stderr)
        return 2
    names = args.names.split(",") if args.names else None
    for path in save_generated(args.save, args.device, names, small=args.small):
        text = path.read_text()
        kernels = ", ".join(kernel_names(text)) or "none"
        print(f"wrote {path}: kernels {kernels}; library calls {', '.join(extern_calls(text)) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
