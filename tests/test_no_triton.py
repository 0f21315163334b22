"""Without Triton (macOS, Windows): the torch cells run, the Triton cells say they need Linux or Colab, and
Run All goes on (``fusionlab._no_triton``).

Triton is made unimportable in a child process by a ``sitecustomize`` whose import hook refuses it, as on
a machine that has none; the lessons then run in a real Jupyter kernel (nbclient) under that hook.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKER = """
import sys


class _NoTriton:  # a machine without Triton: any import of it fails
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NoTriton())
"""
NOTE = "needs Triton. Triton is not installed"


@pytest.fixture(scope="module")
def no_triton_env(tmp_path_factory):
    site = tmp_path_factory.mktemp("no_triton")
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET",)}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])  # this checkout's fusionlab, Triton refused
    env["FUSIONLAB_MODE"] = "interpreter"
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT
    )


def test_without_triton_the_package_imports_and_a_kernel_says_what_it_needs(no_triton_env):
    pytest.importorskip("ipywidgets", reason="fusionlab.viz needs the course's widgets (not on the GPU machines)")
    out = _python(
        """
        import importlib, pkgutil, torch
        import fusionlab, fusionlab.kernels, fusionlab.viz, fusionlab.lessons
        from fusionlab import runtime
        from fusionlab._no_triton import TritonUnavailable
        assert not runtime.HAS_TRITON and fusionlab.info().triton is None
        assert runtime.MODE == "interpreter" and "Triton is not installed" in runtime.REASON
        for m in pkgutil.walk_packages(fusionlab.lessons.__path__, "fusionlab.lessons."):
            importlib.import_module(m.name)  # every lesson's modules import
        from fusionlab.kernels.cos import cos_cos
        try:
            cos_cos(torch.randn(64))
        except TritonUnavailable as e:
            print("raised:", e)
        try:
            import triton.testing
        except TritonUnavailable as e:
            print("import:", e)
        """,
        no_triton_env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "raised: the Triton kernel" in out.stdout and "needs Triton" in out.stdout
    assert "Linux or Colab" in out.stdout and "import: triton.testing needs Triton" in out.stdout


def test_with_triton_nothing_is_replaced():
    out = _python(
        "import fusionlab, triton, sys; from fusionlab import runtime;"
        "print(runtime.HAS_TRITON, hasattr(triton, 'FUSIONLAB_STAND_IN'), 'fusionlab._no_triton' in sys.modules)",
        {**os.environ, "PYTHONPATH": str(ROOT), "FUSIONLAB_MODE": "interpreter"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "False", "False"]


def test_in_ipython_a_triton_cell_prints_a_note_and_the_next_cells_run(no_triton_env):
    pytest.importorskip("IPython", reason="the notebook front end (the GPU machines have no Jupyter)")
    out = _python(
        """
        import json
        from IPython.core.interactiveshell import InteractiveShell
        from IPython.utils.capture import capture_output

        shell = InteractiveShell.instance()
        cells = {
            "import": "import torch\\nimport fusionlab as fl\\nimport triton\\nimport triton.language as tl",
            "triton": (
                "@triton.jit\\ndef k(x_ptr, n, BLOCK: tl.constexpr):\\n    pass\\n"
                "x = torch.ones(4)\\nk[(1,)](x, 4, BLOCK=4)\\ny = x * 2\\n"
            ),
            "uses_y": "z = y + 1\\nz",
            "torch": "w = torch.ones(3) * 3\\nw.sum().item()",
            "typo": "print(undefined_name)",
            "quiet": "w.sum().item();",
        }
        report = {}
        for name, src in cells.items():
            with capture_output() as io:
                r = shell.run_cell(src, store_history=True)
            err = r.error_in_exec or r.error_before_exec
            report[name] = {"ok": r.success, "error": type(err).__name__ if err else None,
                            "stdout": io.stdout, "result": repr(r.result)}
        print(json.dumps(report))
        """,
        no_triton_env,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["import"]["ok"]
    # the launch fails for want of Triton: a note, not an error, so Run All goes on
    assert r["triton"]["ok"] and "Skipped: the Triton kernel k needs Triton" in r["triton"]["stdout"]
    assert "Linux or Colab" in r["triton"]["stdout"]
    # a later cell that needs what the skipped cell would have defined says so
    assert (
        r["uses_y"]["ok"]
        and "uses `y`, which an earlier cell that needs Triton did not define" in r["uses_y"]["stdout"]
    )
    # a torch cell runs, and its last expression is still the cell's result (displayed)
    assert r["torch"]["ok"] and r["torch"]["result"] == "9.0" and "9.0" in r["torch"]["stdout"]
    # a real mistake is still an error; a trailing semicolon still hides the value
    assert not r["typo"]["ok"] and r["typo"]["error"] == "NameError"
    assert r["quiet"]["ok"] and "9.0" not in r["quiet"]["stdout"]


#: every lesson, run whole without Triton (4 to 7 s each on a 2-core CPU, kernel start included)
LESSONS = sorted(p.name for p in (ROOT / "notebooks").glob("0*.ipynb"))
#: lessons that launch no Triton kernel on a CPU (lesson 3 reads what torch.compile generates, which on a
#: CPU is C++, and needs no Triton): every cell runs, none is skipped
TORCH_ONLY = {"03_what_the_compiler_fuses.ipynb"}


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_lesson_runs_all_without_triton(lesson, no_triton_env, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(ROOT / "notebooks" / lesson, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}
    )
    # raises CellExecutionError on a cell's error, where Run All would have stopped
    client.execute(env=no_triton_env)

    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    assert all(isinstance(c.execution_count, int) for c in code), "a cell did not run"

    def text(c):
        return "".join(o.get("text", "") for o in c.outputs if o.output_type == "stream")

    skipped = [c for c in code if "Skipped:" in text(c)]
    ran = [c for c in code if c.outputs and "Skipped:" not in text(c)]
    if lesson in TORCH_ONLY:
        assert not skipped, [c.source[:80] for c in skipped]
    else:
        assert skipped, "no cell needed Triton: is the import hook refusing it?"
        assert any(NOTE in text(c) for c in skipped), "no cell says it needs Triton"
    assert len(ran) >= len(code) // 3, f"only {len(ran)} of {len(code)} cells ran with output"
    info = "".join(text(c) for c in code)
    assert "triton : not installed" in info, "fusionlab.info() should say Triton is not installed"
