"""Execute notebooks in place, store their outputs, then regenerate ``exercises/``.

This is how an instructor refreshes the committed outputs that strict nbval compares against::

    python scripts/run_notebooks.py                          # notebooks/*.ipynb and solutions/*.ipynb
    python scripts/run_notebooks.py solutions/02_count_the_trips.ipynb  # just these
    python scripts/run_notebooks.py --keep-env               # on this machine's device, env untouched
    python scripts/run_notebooks.py --no-exercises           # do not regenerate exercises/ afterwards

Each notebook runs top to bottom in a fresh ``python3`` kernel (this interpreter), with its own
folder as the working directory and a limit of 600 s per cell (``--timeout``). A cell that raises
stops the notebook unless it is tagged ``raises-exception``; a notebook that fails is not written,
the others are, and the exit status is 1.

Unless ``--keep-env`` is given, the kernel runs on the CPU as CI does: ``FUSIONLAB_MODE=interpreter``
(Triton kernels through Triton's interpreter) and ``CUDA_VISIBLE_DEVICES=""`` (torch sees no GPU,
so device names, dtypes and timings read as they will in CI).

After execution the volatile metadata is stripped with ``clean_notebooks.normalize_notebook``
(execution timestamps, widget state, ...), and ``make_exercises`` regenerates ``exercises/`` from
``solutions/``. Exercise notebooks are generated, never executed here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_exercises  # noqa: E402
from clean_notebooks import (  # noqa: E402
    ROOT,
    default_notebooks,
    dumps_notebook,
    normalize_notebook,
    read_notebook,
    write_if_changed,
)

KERNEL = "python3"
CPU_ENV = {"FUSIONLAB_MODE": "interpreter", "CUDA_VISIBLE_DEVICES": ""}


def execute_notebook(path: Path, timeout: int = 600, kernel_name: str = KERNEL) -> str:
    """Run the notebook at ``path`` and return its cleaned text (the file is not touched).

    Raises ``nbclient.exceptions.CellExecutionError`` (or a timeout error) if a cell that is not
    tagged ``raises-exception`` fails.
    """
    from nbclient import NotebookClient

    nb = read_notebook(path)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=kernel_name,
        resources={"metadata": {"path": str(path.resolve().parent)}},
        record_timing=False,
        store_widget_state=False,
    )
    client.execute()
    return dumps_notebook(normalize_notebook(nb))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "paths", nargs="*", type=Path, help="notebooks to run (default: notebooks/*.ipynb and solutions/*.ipynb)"
    )
    parser.add_argument(
        "--keep-env",
        action="store_true",
        help="run with the environment as it is (default: " + " ".join(f"{k}={v!r}" for k, v in CPU_ENV.items()) + ")",
    )
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    parser.add_argument("--no-exercises", action="store_true", help="do not regenerate exercises/ afterwards")
    args = parser.parse_args(argv)

    paths = args.paths or default_notebooks()
    exercises_dir = (ROOT / "exercises").resolve()
    for path in paths:
        if not path.is_file():
            parser.error(f"{path}: no such notebook")
        if path.resolve().parent == exercises_dir:
            parser.error(f"{path}: exercises are generated from solutions/; run the solution instead")
    if not args.keep_env:
        os.environ.update(CPU_ENV)  # the kernel inherits this process's environment

    failed = []
    for path in paths:
        start = time.perf_counter()
        print(f"running {path} ...", flush=True)
        try:
            text = execute_notebook(path, timeout=args.timeout)
        except Exception as e:  # CellExecutionError, timeouts, a kernel that died
            failed.append(path)
            print(f"FAILED {path}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        changed = write_if_changed(path, text)
        print(f"  {'updated' if changed else 'unchanged'} in {time.perf_counter() - start:.0f} s")

    status = 0
    if not args.no_exercises:
        status = make_exercises.main([])
    if failed:
        print(f"{len(failed)} notebook(s) failed and were not written: {', '.join(map(str, failed))}", file=sys.stderr)
        return 1
    return status


if __name__ == "__main__":
    sys.exit(main())
