"""The exercise pipeline: ``exercises/`` is generated from ``solutions/`` by ``scripts/make_exercises.py``.

Parametrised over the notebooks that exist (none yet is fine); the generator's own tests on a
synthetic notebook always run.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import clean_notebooks  # noqa: E402
import make_exercises as mx  # noqa: E402

SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
REGENERATE = "run `python scripts/make_exercises.py` and commit exercises/"


def _ids(paths):
    return [p.name for p in paths]


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


# -- (a) exercises are in sync with solutions -------------------------------------------------------
@pytest.mark.parametrize("solution", SOLUTIONS, ids=_ids(SOLUTIONS))
def test_exercise_is_up_to_date(solution):
    exercise = ROOT / "exercises" / solution.name
    assert exercise.exists(), f"{exercise.relative_to(ROOT)} is missing: {REGENERATE}"
    expected = mx.render_exercise(solution)
    assert exercise.read_text(encoding="utf-8") == expected, (
        f"{exercise.relative_to(ROOT)} is not what {solution.relative_to(ROOT)} generates: {REGENERATE}"
    )


@pytest.mark.parametrize("exercise", EXERCISES, ids=_ids(EXERCISES))
def test_exercise_has_a_solution(exercise):
    assert (ROOT / "solutions" / exercise.name).exists(), (
        f"{exercise.relative_to(ROOT)} has no solution twin; exercises are generated from solutions/ "
        "(delete it, or run `python scripts/make_exercises.py --prune`)"
    )


# -- (b) exercises give nothing away ----------------------------------------------------------------
@pytest.mark.parametrize("exercise", EXERCISES, ids=_ids(EXERCISES))
def test_exercise_has_no_answers_or_outputs(exercise):
    nb = nbformat.read(exercise, as_version=4)
    for i, cell in enumerate(nb.cells, 1):
        src = _source(cell)
        for marker in (mx.BEGIN, mx.END, mx.HINT):
            assert marker not in src, f"{exercise.name}, cell {i}: contains {marker!r}"
        assert mx.TAG_SOLUTION_ONLY not in cell.metadata.get("tags", []), f"{exercise.name}, cell {i}"
        if cell.cell_type == "code":
            assert not cell.outputs, f"{exercise.name}, cell {i}: has stored outputs"
            assert cell.execution_count is None, f"{exercise.name}, cell {i}: has an execution count"


# -- (c) solution markup is well formed -------------------------------------------------------------
@pytest.mark.parametrize("solution", SOLUTIONS, ids=_ids(SOLUTIONS))
def test_solution_markers_are_balanced(solution):
    """Checked with a plain scan, independent of the generator's parser."""
    nb = nbformat.read(solution, as_version=4)
    pairs = 0
    for i, cell in enumerate(nb.cells, 1):
        depth = 0
        for n, line in enumerate(_source(cell).splitlines(), 1):
            where = f"{solution.name}, cell {i}, line {n}"
            if line.strip() == mx.BEGIN:
                assert cell.cell_type == "code", f"{where}: marker in a {cell.cell_type} cell"
                assert depth == 0, f"{where}: nested {mx.BEGIN}"
                depth = 1
            elif line.strip() == mx.END:
                assert depth == 1, f"{where}: {mx.END} without {mx.BEGIN}"
                depth = 0
                pairs += 1
        assert depth == 0, f"{solution.name}, cell {i}: {mx.BEGIN} never closed"
    assert pairs >= 1, f"{solution.name} has no {mx.BEGIN} / {mx.END} block, so its exercise is the solution"


# -- (d) the generator on a synthetic notebook ------------------------------------------------------
def _synthetic() -> nbformat.NotebookNode:
    v4 = nbformat.v4
    nb = v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"name": "fl", "display_name": "Some Env", "language": "python"},
        "language_info": {"name": "python", "version": "3.11.7", "mimetype": "text/x-python"},
        "widgets": {"application/vnd.jupyter.widget-state+json": {"state": {}}},
    }
    cells = [
        v4.new_markdown_cell("# Lesson\nWrite `double`."),
        v4.new_code_cell("import math\n\ndef check_double(f):\n    assert f(2) == 4\n    print('ok')"),
        v4.new_code_cell(
            "def double(x):\n"
            "    y = x\n"
            "    ### BEGIN SOLUTION\n"
            '    ### HINT: multiply by "two"\n'
            "    y = 2 * x\n"
            "    ### END SOLUTION\n"
            "    return y",
            execution_count=3,
            outputs=[v4.new_output("stream", name="stdout", text="hi\n")],
        ),
        v4.new_code_cell(
            "check_double(double)", execution_count=4, outputs=[v4.new_output("stream", name="stdout", text="ok\n")]
        ),
        v4.new_code_cell("for i in range(2):\n    ### BEGIN SOLUTION\n    total = i\n    ### END SOLUTION\n"),
        v4.new_code_cell("print(total)"),
        v4.new_code_cell("secret = 42", metadata={"tags": ["solution-only"]}),
        v4.new_markdown_cell("Why 42? Because.", metadata={"tags": ["solution-only"]}),
        v4.new_code_cell("print(secret + 1)"),
        v4.new_code_cell(
            "other = math.pi",
            execution_count=7,
            outputs=[v4.new_output("execute_result", data={"text/plain": "3.14"}, execution_count=7)],
            metadata={"execution": {"iopub.execute_input": "2026-01-01T00:00:00Z"}},
        ),
        v4.new_code_cell("results = []", metadata={"tags": ["raises-in-exercise"]}),
    ]
    nb.cells = cells
    return nb


def test_generator_stubs_blocks_with_hint_and_indentation():
    ex = mx.make_exercise(_synthetic(), "synthetic.ipynb")
    sources = [_source(c) for c in ex.cells]
    assert sources[2] == (
        'def double(x):\n    y = x\n    raise NotImplementedError("Exercise: multiply by \\"two\\"")\n    return y'
    )
    assert sources[4] == f"for i in range(2):\n    raise NotImplementedError({json.dumps(mx.DEFAULT_HINT)})\n"
    # the stub is valid Python that raises with the hint
    namespace: dict = {}
    exec(sources[2], namespace)
    with pytest.raises(NotImplementedError, match='multiply by "two"'):
        namespace["double"](1)


def test_blocks_inside_a_triton_kernel_become_static_asserts():
    # the GPU compiler rejects `raise` inside @triton.jit; a static_assert carries the hint on both paths
    src = (
        "@triton.jit\ndef k(x_ptr, BLOCK: tl.constexpr):\n    ### BEGIN SOLUTION\n    ### HINT: load it\n"
        "    pass\n    ### END SOLUTION\n\n\ndef launcher(x):\n    ### BEGIN SOLUTION\n    return x\n"
        "    ### END SOLUTION\n"
    )
    out = mx.stub_source(src, mx.find_blocks(src))
    assert '    tl.static_assert(False, "Exercise: load it")\n' in out
    assert f"    raise NotImplementedError({json.dumps(mx.DEFAULT_HINT)})\n" in out


def test_generator_drops_solution_only_and_clears_outputs():
    solution = _synthetic()
    ex = mx.make_exercise(solution, "synthetic.ipynb")
    assert len(ex.cells) == len(solution.cells) - 2
    assert all("secret = 42" not in _source(c) and "Why 42" not in _source(c) for c in ex.cells)
    for cell in ex.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
            assert "execution" not in cell.metadata
    assert solution.cells[2].outputs, "the solution itself must not be modified"


def test_generator_tags_cells_that_fail_without_the_answers():
    ex = mx.make_exercise(_synthetic(), "synthetic.ipynb")
    tagged = {_source(c).splitlines()[0]: mx.TAG_RAISES in c.metadata.get("tags", []) for c in ex.cells}
    assert tagged == {
        "# Lesson": False,
        "import math": False,  # before any block, defines the checker
        "def double(x):": True,  # contains a block
        "check_double(double)": True,  # calls a checker on an unfilled answer
        "for i in range(2):": True,  # block at top level
        "print(total)": True,  # uses a name the stub never binds
        "print(secret + 1)": True,  # uses a name from a dropped solution-only cell
        "other = math.pi": False,  # unrelated to the exercise
        "results = []": True,  # forced by the author
    }
    assert all("raises-in-exercise" not in c.metadata.get("tags", []) for c in ex.cells)


def test_generator_normalises_metadata_deterministically():
    first = clean_notebooks.dumps_notebook(mx.make_exercise(_synthetic(), "synthetic.ipynb"))
    again = mx.make_exercise(nbformat.reads(first, as_version=4), "synthetic.ipynb")
    assert clean_notebooks.dumps_notebook(again) == first  # idempotent (and no random cell ids)
    meta = json.loads(first)["metadata"]
    assert meta["kernelspec"]["name"] == "python3"
    assert meta["language_info"] == {"name": "python"}
    assert "widgets" not in meta
    assert first.endswith("}\n") and not first.endswith("\n\n")
    assert first == nbformat.writes(nbformat.reads(first, as_version=4)) + "\n"  # nbformat's own layout


@pytest.mark.parametrize(
    "source",
    [
        "### BEGIN SOLUTION\nx = 1",
        "x = 1\n### END SOLUTION",
        "### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION\n### END SOLUTION",
        "if True:\n    ### BEGIN SOLUTION\n    x = 1\n### END SOLUTION",
    ],
    ids=["unclosed", "unopened", "nested", "misindented"],
)
def test_generator_rejects_malformed_markup(source):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    with pytest.raises(mx.MarkupError):
        mx.make_exercise(nb)


def test_check_mode_and_orphans(tmp_path, capsys):
    sol, ex = tmp_path / "solutions", tmp_path / "exercises"
    sol.mkdir()
    ex.mkdir()
    nbformat.write(_synthetic(), sol / "lesson.ipynb")
    dirs = ["--solutions", str(sol), "--exercises", str(ex)]
    assert mx.main([*dirs, "--check"]) == 1  # missing exercise
    assert mx.main(dirs) == 0
    assert mx.main([*dirs, "--check"]) == 0
    (ex / "stray.ipynb").write_text((ex / "lesson.ipynb").read_text())
    assert mx.main([*dirs, "--check"]) == 1
    assert "stray.ipynb has no solution twin" in capsys.readouterr().out
    assert mx.main([*dirs, "--prune"]) == 0 and not (ex / "stray.ipynb").exists()
    (ex / "lesson.ipynb").write_text((ex / "lesson.ipynb").read_text().replace("NotImplementedError", "X"))
    assert mx.main([*dirs, "--check"]) == 1
    assert "lesson.ipynb differs" in capsys.readouterr().out


def test_synthetic_exercise_runs_top_to_bottom(tmp_path):
    """The raises-exception tags are enough for a kernel to run the whole exercise notebook."""
    nbclient = pytest.importorskip("nbclient")
    ex = mx.make_exercise(_synthetic(), "synthetic.ipynb")
    client = nbclient.NotebookClient(
        ex, timeout=60, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError if an untagged cell fails
    errors = [c for c in ex.cells if any(o.output_type == "error" for o in c.get("outputs", []))]
    assert errors and all(mx.TAG_RAISES in c.metadata["tags"] for c in errors)


@pytest.mark.parametrize("name", ["01_the_warehouse.ipynb", "02_count_the_trips.ipynb"])
def test_an_exercise_run_top_to_bottom_shows_one_short_message_per_blank(name):
    """Run All on an untouched exercise: every blank (and every cell that needs one) says what to do in
    at most five lines, never a traceback through the checker's internals."""
    from nbclient import NotebookClient

    nb = nbformat.read(ROOT / "exercises" / name, as_version=4)
    NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(ROOT / "exercises")}},
    ).execute()
    blanks = 0
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for out in cell.outputs:
            assert out.output_type != "error", f"cell {i}: a traceback ({out.ename}: {out.evalue})"
            if out.output_type == "stream" and out.name == "stderr" and "✗" in out.text:
                blanks += 1
                assert len(out.text.strip().splitlines()) <= 5, f"cell {i}: {out.text}"
                assert "Traceback" not in out.text and "fusionlab/" not in out.text
    assert blanks >= 3


def test_the_short_messages_line_displays_nothing():
    """The line the generator appends ends the cell: without its semicolon IPython would show the call's
    return value (a stray `True`) under the learner's imports."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    shell = InteractiveShell.instance()
    shell.user_ns["fl"] = type(
        "fl", (), {"grading": type("g", (), {"install_notebook_messages": staticmethod(lambda **k: True)})}
    )
    with capture_output() as shown:
        shell.run_cell("x = 1\n" + mx.SHORT_MESSAGES, store_history=True)
    assert shown.stdout == "", shown.stdout
