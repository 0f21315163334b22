"""The grading command, ``python -m fusionlab grade NOTEBOOK``: a right answer passes; cheats fail, with
a verdict per exercise and a non-zero exit.

Each exercise runs in a learner's process of its own (a Python start, torch and Triton imported), so
the notebooks here are small: lesson 1's exp_cos exercise answered in several ways in one notebook, and
the solution notebook's exp_cos alone."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.lesson1
ROOT = Path(__file__).resolve().parent.parent

SETUP = """import sys
import torch
import fusionlab as fl
import triton
import triton.language as tl
from fusionlab.lessons.l1 import checkers as ex
%matplotlib inline
"""

KERNEL = """@triton.jit
def exp_cos_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(tl.float32)
    tl.store(y_ptr + offs, tl.exp(tl.cos(x)).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def copy_kernel(src_ptr, x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def exp_cos(x):
    y = torch.empty_like(x)
    exp_cos_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y
"""

#: answers by name: each one a cell that defines ``answer`` and checks it
ANSWERS = {
    "right": "answer = exp_cos",
    # torch with dispatch switched off, then one copy kernel handed the input too
    "no_dispatch": """def answer(x):
    with torch._C._DisableTorchDispatch():
        r = torch.exp(torch.cos(x.float())).to(x.dtype)
    y = torch.empty_like(x)
    copy_kernel[(triton.cdiv(x.numel(), 1024),)](r, x, y, x.numel(), BLOCK=1024)
    return y""",
    # numpy (any library) computes, one copy kernel handed the input too: the values it saw were decoys
    "numpy": """def answer(x):
    import numpy as np
    r = torch.from_numpy(np.exp(np.cos(x.cpu().numpy().astype(np.float32))).astype(x.cpu().numpy().dtype))
    y = torch.empty_like(x)
    copy_kernel[(triton.cdiv(x.numel(), 1024),)](r.to(x.device), x, y, x.numel(), BLOCK=1024)
    return y""",
    # Triton's own run path patched, so numpy runs inside the kernel's run, where the inputs are real
    "triton_patched": """import numpy as np
from triton.runtime.jit import JITFunction
from triton.runtime.interpreter import InterpretedFunction
for cls in (JITFunction, InterpretedFunction):
    def run(self, *args, __orig=cls.run, **kwargs):
        if self.fn.__name__ == "copy_kernel":
            args[1].numpy()[:] = np.exp(np.cos(args[0].numpy().astype(np.float32))).astype(args[0].numpy().dtype)
        return __orig(self, *args, **kwargs)
    cls.run = run
def answer(x):
    y = torch.empty_like(x)
    copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, y, x.numel(), BLOCK=1024)
    return y""",
    # last (every later cell runs with it): the comparison switched off in the learner's process, a wrong kernel
    "patched": """import fusionlab.grading
fusionlab.grading.assert_close = lambda *a, **k: None
def answer(x):
    return exp_cos(x) * 0""",
}


def notebook(path, names) -> str:
    cells = [SETUP, KERNEL] + [f"{ANSWERS[n]}\n\nex.check_exp_cos(answer)" for n in names]
    nb = {
        "cells": [
            {"cell_type": "code", "metadata": {}, "source": c, "outputs": [], "execution_count": None} for c in cells
        ],  # fmt: skip
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(nb))
    return str(path)


def grade(*argv):
    cmd = [sys.executable, "-m", "fusionlab", "grade", *argv]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    return res.returncode, res.stdout


def test_grade_passes_the_right_answer_and_fails_each_cheat(tmp_path):
    names = list(ANSWERS)
    rc, out = grade(notebook(tmp_path / "learner.ipynb", names))
    lines = [line for line in out.splitlines() if line.startswith(("  PASS", "  FAIL"))]
    assert len(lines) == len(names), out
    verdicts = dict(zip(names, lines, strict=True))
    assert verdicts["right"].startswith("  PASS l1.check_exp_cos") and "✓ exp_cos" in verdicts["right"]
    assert verdicts["no_dispatch"].startswith("  FAIL") and "dispatch switched off" in verdicts["no_dispatch"]
    # (on a GPU, x.cpu() is itself a torch pass, refused first)
    assert verdicts["numpy"].startswith("  FAIL")
    assert "computed outside the kernel" in verdicts["numpy"] or "moves tensor data with torch" in verdicts["numpy"]
    assert verdicts["triton_patched"].startswith("  FAIL") and "JITFunction.run" in verdicts["triton_patched"]
    assert verdicts["patched"].startswith("  FAIL") and "changes fusionlab's grading machinery" in verdicts["patched"]
    assert rc == 1 and out.rstrip().endswith(f"{len(names) - 1} failed")


def test_grade_passes_the_solution_and_exits_zero():
    rc, out = grade(str(ROOT / "solutions" / "01_the_warehouse.ipynb"), "--only", "check_exp_cos")
    assert rc == 0 and out.rstrip().endswith("all passed") and out.count("  PASS") == 1, out


def test_grade_reads_a_checker_call_handed_measured_ceilings():
    # lesson 6's gate prediction is checked against the ceilings the notebook measured (a bench.Ceilings)
    rc, out = grade(str(ROOT / "solutions" / "06_fused_epilogues.ipynb"), "--only", "check_gate_prediction")
    assert rc == 0 and out.count("  PASS l6.check_gate_prediction") == 1, out
