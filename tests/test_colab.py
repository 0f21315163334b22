"""``scripts/colab.py``: the Colab badge and set-up cell (on temporary copies of the notebooks), the
landing notebook, the installer's plan, and, by resolution against PyPI, that installing fusionlab
beside Colab's torch 2.11, triton 3.6 and ipywidgets 7.7.1 (Python 3.12) changes none of them.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

import fusionlab

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import clean_notebooks  # noqa: E402
import colab  # noqa: E402
import make_exercises  # noqa: E402

FAKE = "01_x.ipynb"  # a notebook name for cells made here (never a file)
LESSONS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))


@pytest.fixture
def course(tmp_path, monkeypatch):
    """A temporary course root holding copies of the real lessons, exercises and solutions."""
    monkeypatch.delenv("FUSIONLAB_REPO", raising=False)
    monkeypatch.delenv("FUSIONLAB_BRANCH", raising=False)
    for folder in ("notebooks", "exercises", "solutions"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
        for p in (tmp_path / folder).glob("*.ipynb"):  # as they were before the cells: the tests add them
            nb = clean_notebooks.read_notebook(p)
            nb.cells = [c for c in nb.cells if not {colab.TAG_BADGE, colab.TAG_SETUP} & set(_tags(c))]
            p.write_text(clean_notebooks.dumps_notebook(nb))
    return tmp_path


def _tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _original(rel: str):
    """A repository notebook without its Colab cells."""
    nb = clean_notebooks.read_notebook(ROOT / rel)
    nb.cells = [c for c in nb.cells if not {colab.TAG_BADGE, colab.TAG_SETUP} & set(_tags(c))]
    return nb


def _paths(root: Path) -> list[Path]:
    return [p for folder in ("notebooks", "exercises", "solutions") for p in sorted((root / folder).glob("*.ipynb"))]


def _cli(root: Path, *args: str) -> int:
    with contextlib.redirect_stdout(io.StringIO()):
        return colab.main([*args, "--root", str(root), *map(str, _paths(root))])


def _tagged(nb, tag):
    return [i for i, c in enumerate(nb.cells) if tag in c.get("metadata", {}).get("tags", [])]


# -- badge and set-up cell ------------------------------------------------------------------------------
def test_badge_first_setup_before_the_first_code_cell_and_idempotent(course):
    paths = _paths(course)
    assert paths, "no notebooks to try"
    assert _cli(course, "--check") == 1  # none has them yet
    assert _cli(course) == 0
    first = {p: p.read_bytes() for p in paths}
    for p in paths:
        nb = clean_notebooks.read_notebook(p)
        rel = p.relative_to(course).as_posix()
        assert _tagged(nb, colab.TAG_BADGE) == [0]
        assert nb.cells[0].source == colab.badge_source(rel)
        assert f"/blob/main/{rel})" in nb.cells[0].source
        (setup,) = _tagged(nb, colab.TAG_SETUP)
        assert nb.cells[setup].cell_type == "code"
        assert all(c.cell_type != "code" for c in nb.cells[:setup]), "the set-up cell must be the first code cell"
        assert nb.cells[setup].outputs == []
        assert f'os.chdir(f"{{clone}}/{p.parent.name}")' in nb.cells[setup].source
        # the rest of the notebook is untouched
        original = _original(rel)
        assert [c.source for i, c in enumerate(nb.cells) if i not in (0, setup)] == [c.source for c in original.cells]
        assert clean_notebooks.dumps_notebook(clean_notebooks.normalize_notebook(copy.deepcopy(nb))) == p.read_text()
    assert _cli(course, "--check") == 0
    assert _cli(course) == 0
    assert {p: p.read_bytes() for p in paths} == first, "a second run must change nothing"


def test_one_url_changes_every_badge_and_cell_in_place(course, monkeypatch):
    _cli(course)
    monkeypatch.setenv("FUSIONLAB_REPO", "https://github.com/someone/fork.git/")
    monkeypatch.setenv("FUSIONLAB_BRANCH", "spring")
    assert _cli(course, "--check") == 1
    assert _cli(course) == 0 and _cli(course, "--check") == 0
    for p in _paths(course):
        nb = clean_notebooks.read_notebook(p)
        assert len(_tagged(nb, colab.TAG_BADGE)) == 1 and len(_tagged(nb, colab.TAG_SETUP)) == 1
        text = p.read_text()
        assert "fusionlab-course" not in text
        assert "colab.research.google.com/github/someone/fork/blob/spring/" in text
        assert '\\"https://github.com/someone/fork\\"' in text and '\\"spring\\"' in text


def test_a_moved_or_edited_cell_is_put_back(course):
    _cli(course)
    path = course / "notebooks" / LESSONS[0].name
    nb = clean_notebooks.read_notebook(path)
    (setup,) = _tagged(nb, colab.TAG_SETUP)
    cell = nb.cells.pop(setup)
    cell.source += "\nprint('edited')"
    nb.cells.append(cell)
    nb.cells.insert(1, nb.cells.pop(0))  # badge no longer first
    assert not colab.is_current(nb, "notebooks/" + path.name)
    assert colab.apply(nb, "notebooks/" + path.name)
    assert colab.is_current(nb, "notebooks/" + path.name)
    assert _tagged(nb, colab.TAG_BADGE) == [0]
    assert nb.cells[_tagged(nb, colab.TAG_SETUP)[0]].source == colab.setup_source("notebooks/" + path.name)


def test_a_notebook_outside_github_is_refused(monkeypatch):
    monkeypatch.setenv("FUSIONLAB_REPO", "https://gitlab.com/a/b")
    with pytest.raises(ValueError, match="GitHub"):
        colab.repo_url()


def test_exercises_generated_from_solutions_keep_the_cells_and_get_their_own_badge(course):
    """make_exercises.py carries them: generated from a solution that has them, pointed at the exercise."""
    _cli(course)
    solution = course / "solutions" / SOLUTIONS[0].name
    ex = make_exercises.make_exercise(clean_notebooks.read_notebook(solution), solution.name)
    rel = "exercises/" + solution.name
    assert colab.is_current(ex, rel)  # make_exercise already pointed the badge at exercises/
    assert f"/blob/main/{rel})" in ex.cells[0].source
    (setup,) = _tagged(ex, colab.TAG_SETUP)
    assert ex.cells[setup].metadata["tags"] == [colab.TAG_SETUP], "the set-up cell must not be tagged to raise"


def test_once_the_course_has_colab_cells_every_notebook_has_them_up_to_date():
    paths = _paths(ROOT)
    adopted = [p for p in paths if colab.TAG_BADGE in p.read_text(encoding="utf-8")]
    if not adopted:
        pytest.skip("no notebook has Colab cells yet: `python scripts/colab.py notebooks/*.ipynb ...` adds them")
    stale = [
        str(p.relative_to(ROOT))
        for p in paths
        if not colab.is_current(clean_notebooks.read_notebook(p), p.relative_to(ROOT).as_posix())
    ]
    assert not stale, f"stale or missing Colab badge / set-up cell (run scripts/colab.py on them): {stale}"


# -- what the set-up cell does ----------------------------------------------------------------------------
def _run_cell(source: str) -> tuple[str, dict]:
    ns: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        exec(compile(source, "<colab-setup>", "exec"), ns)
    return out.getvalue(), ns


def test_off_colab_the_cell_does_nothing_and_prints_nothing(monkeypatch):
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    path, cwd = list(sys.path), os.getcwd()
    printed, ns = _run_cell(colab.setup_source("notebooks/" + FAKE))
    assert printed == ""
    assert sys.path == path and os.getcwd() == cwd
    assert set(ns) - {"__builtins__"} == {"sys"}


def test_on_colab_the_cell_clones_installs_and_moves_to_the_notebooks_folder(monkeypatch, tmp_path):
    import runpy
    import types

    calls = []
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr(
        subprocess, "run", lambda cmd, **kw: calls.append(("run", cmd)) or subprocess.CompletedProcess(cmd, 0, "", "")
    )
    monkeypatch.setattr(runpy, "run_path", lambda p: {"install": lambda clone: calls.append(("install", p, clone))})
    monkeypatch.setattr(os, "chdir", lambda d: calls.append(("chdir", d)))
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(colab, "CLONE_DIR", str(tmp_path / "absent"))
    _run_cell(colab.setup_source("exercises/" + FAKE))
    clone = str(tmp_path / "absent")
    assert calls == [
        ("run", ["git", "clone", "--quiet", "--depth", "1", "--branch", "main", colab.REPO_URL, clone]),
        ("install", f"{clone}/scripts/colab.py", clone),
        ("chdir", f"{clone}/exercises"),
    ]
    assert sys.path[0] == clone


def test_on_colab_a_failed_clone_says_what_to_do(monkeypatch, tmp_path):
    import types

    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    failed = subprocess.CompletedProcess([], 128, "", "fatal: repository 'https://github.com/x/y/' not found")
    monkeypatch.setattr(subprocess, "run", lambda cmd, **kw: failed)
    monkeypatch.setattr(colab, "CLONE_DIR", str(tmp_path / "absent"))
    with pytest.raises(SystemExit) as stop:
        _run_cell(colab.setup_source("notebooks/" + FAKE))
    message = str(stop.value)
    assert colab.REPO_URL in message and "not found" in message  # where, and what git said
    assert "upload it to /content/fusionlab" in message and "run this cell again" in message


def test_set_repo_rewrites_the_one_url_and_every_notebook(course, monkeypatch):
    (course / "scripts").mkdir()
    shutil.copy2(ROOT / "scripts" / "colab.py", course / "scripts" / "colab.py")
    monkeypatch.setattr(colab, "REPO_URL", colab.REPO_URL)  # set_repo sets it in this process too
    assert _cli(course) == 0
    with contextlib.redirect_stdout(io.StringIO()):
        assert colab.main(["--set-repo", "https://github.com/someone/published.git", "--root", str(course)]) == 0
    assert 'REPO_URL = "https://github.com/someone/published"' in (course / "scripts" / "colab.py").read_text()
    for p in [*_paths(course), course / colab.LANDING]:
        text = p.read_text()
        assert (
            "fusionlab-course" not in text and "colab.research.google.com/github/someone/published/blob/main/" in text
        )
    with contextlib.redirect_stdout(io.StringIO()):
        assert colab.main(["--all", "--check", "--root", str(course)]) == 0
        assert colab.main(["--set-repo", "https://gitlab.com/a/b", "--root", str(course)]) == 2


def test_every_badge_and_set_up_cell_uses_the_one_url():
    """What --set-repo keeps true: no notebook names another repository than REPO_URL."""
    owner_name = colab.REPO_URL.removeprefix("https://github.com/")
    for p in [*_paths(ROOT), ROOT / colab.LANDING]:
        text = p.read_text(encoding="utf-8")
        colab_links = re.findall(r"colab\.research\.google\.com/github/([\w.-]+/[\w.-]+)/", text)
        clones = re.findall(r'repo, clone = \\"(https://github\.com/[\w.-]+/[\w.-]+)\\"', text)
        assert set(colab_links) <= {owner_name} and set(clones) <= {colab.REPO_URL}, p.name
        if colab.TAG_SETUP in text:
            assert clones == [colab.REPO_URL], p.name


def test_strict_nbval_passes_on_the_cell_off_colab(tmp_path):
    """Its stored output is empty and it prints nothing: strict nbval compares equal."""
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print(6 * 7)", execution_count=1)]
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text="42\n")]
    colab.apply(nb, "notebooks/" + FAKE)
    path = tmp_path / "nb.ipynb"
    path.write_text(clean_notebooks.dumps_notebook(clean_notebooks.normalize_notebook(nb)))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval", str(path), "--nbval-current-env", "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and "2 passed" in out.stdout, out.stdout[-2000:]


# -- the installer ------------------------------------------------------------------------------------------
def test_install_plan_never_installs_what_colab_provides():
    reqs = ["torch>=2.4", "triton>=3.0; sys_platform == 'linux'", "numpy>=1.24", "matplotlib>=3.7", "ipywidgets>=7.6"]
    colab_env = {"torch": "2.11.0", "triton": "3.6.0", "ipywidgets": "7.7.1", "numpy": "2.0.2", "matplotlib": None}
    to_install, problems = colab.install_plan(reqs, colab_env)
    assert to_install == ["matplotlib>=3.7"] and problems == []
    old = {**colab_env, "torch": "2.3.0", "ipywidgets": None, "numpy": "1.20"}
    to_install, problems = colab.install_plan(reqs, old)
    assert to_install == ["numpy>=1.24", "matplotlib>=3.7"]
    assert [p.split(":")[0] for p in problems] == ["torch", "ipywidgets"]


def test_live_summary_on_a_t4_says_what_runs_where():
    import fusionlab

    recorded = fusionlab.bench.recorded().label()  # the label the set-up cell passes, as it reads
    text = colab.live_summary("interpreter", "cpu", (7, 5), "Tesla T4", recorded)
    assert "Tesla T4 (sm_75)" in text and "sm_80" in text
    assert "interpreter" in text and "torch cells:    on cpu" in text
    assert f"timings shown:  {recorded}" in text and text.lower().count("recorded on") == 1
    # the way to try Triton on the GPU is one a learner can follow: a fresh runtime, the variable first
    assert "Restart session" in text and "%env FUSIONLAB_MODE=gpu" in text
    assert "No GPU" in colab.live_summary("interpreter", "cpu", None, None, None)
    assert "live timings" in colab.live_summary("gpu", "cuda", (9, 0), "NVIDIA H100", None)


# -- the landing notebook -----------------------------------------------------------------------------------
def test_start_here_is_up_to_date():
    assert (ROOT / colab.LANDING).read_text() == colab.landing_text(ROOT), (
        "START_HERE.ipynb does not list the notebooks present: run `python scripts/colab.py --landing`"
    )


def test_landing_lists_the_lessons_present_and_links_only_files_that_exist(tmp_path):
    for folder, nums in (("notebooks", ("1", "2", "2b", "4")), ("solutions", ("1", "4")), ("exercises", ("1",))):
        (tmp_path / folder).mkdir()
        for n in nums:
            stem, title = colab.PLAN[n]
            nb = {"cells": [{"cell_type": "markdown", "source": f"# Lesson {n} — {title}\n"}], "nbformat": 4}
            (tmp_path / folder / f"{stem}.ipynb").write_text(json.dumps(nb))
    text = "\n".join(colab.landing_markdown(tmp_path))
    one, four, half = (f"{colab.PLAN[n][0]}.ipynb" for n in ("1", "4", "2b"))
    assert f"| 1 | [The warehouse](notebooks/{one}) | [exercise](exercises/{one}) | [solution](" in text
    assert f"| 4 | [Fused reductions](notebooks/{four}) | — | [solution](solutions/{four}) |" in text
    assert "| 3 |" not in text
    assert f"| 2b | [When arithmetic stops being free](notebooks/{half}) | — | — |" in text
    assert "Coming: 3 — What the compiler fuses; 5 — Gates and losses" in text
    for link in __import__("re").findall(r"\]\(((?:notebooks|exercises|solutions)/[^)]+)\)", text):
        assert (tmp_path / link).exists(), link


# -- requirement resolution against Colab's versions --------------------------------------------------------
COLAB_HAS = {"torch": "2.11.0", "triton": "3.6.0", "ipywidgets": "7.7.1"}
PLATFORMS = ["manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64", "manylinux_2_35_x86_64"]


def _online() -> str | None:
    try:
        urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=5).close()
        return None
    except OSError as e:
        return f"PyPI is unreachable ({e}); the resolution test needs it"


def _colab_like(tmp_path: Path, dependencies: list[str]) -> tuple[Path, Path]:
    """A Python environment holding Colab's torch, triton and ipywidgets (as installed distributions:
    metadata only, no code), and a project with fusionlab's name and ``dependencies``."""
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    purelib = subprocess.run(
        [str(env / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    for name, version in COLAB_HAS.items():
        info = Path(purelib) / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("pip\n")
        (info / "RECORD").write_text("")
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    proj = tmp_path / "proj"
    (proj / "fusionlab").mkdir(parents=True)
    (proj / "fusionlab" / "__init__.py").write_text("")
    (proj / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=77"]\nbuild-backend = "setuptools.build_meta"\n'
        f'[project]\nname = "fusionlab"\nversion = "{fusionlab.__version__}"\n'
        f"requires-python = {json.dumps(project['requires-python'])}\ndependencies = {json.dumps(dependencies)}\n"
    )
    return env, proj


def _resolve(env: Path, proj: Path) -> dict[str, str]:
    """What ``pip install <proj>`` would install into ``env`` for Python 3.12 on x86-64 Linux (a dry run:
    wheel metadata only), as ``{name: version}``."""
    report = env.parent / "report.json"
    cmd = [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install", "--dry-run", "--quiet"]
    cmd += ["--report", str(report), "--only-binary=:all:", "--python-version", "3.12"]
    cmd += [a for p in PLATFORMS for a in ("--platform", p)] + [str(proj)]
    # PyPI as Colab sees it: no local index, find-links or constraints from this machine's pip config
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k == "PIP_CERT"}
    out = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, env={**environ, "PIP_CONFIG_FILE": os.devnull}
    )
    if out.returncode != 0:
        if any(s in out.stderr for s in ("NewConnectionError", "Max retries", "Temporary failure", "timed out")):
            pytest.skip(f"PyPI unreachable during resolution: {out.stderr[-300:]}")
        raise AssertionError(f"pip could not resolve fusionlab beside Colab's packages:\n{out.stderr[-3000:]}")
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}


def _replaced(plan: dict[str, str]) -> list[str]:
    return [f"{n} {COLAB_HAS[n]} -> {plan[n]}" for n in COLAB_HAS if n in plan]


@pytest.fixture
def online():
    reason = _online()
    if reason:
        pytest.skip(reason)


def test_installing_fusionlab_beside_colabs_packages_changes_none_of_them(tmp_path, online):
    try:
        import tomllib
    except ModuleNotFoundError:
        tomllib = pytest.importorskip("tomli")
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    plan = _resolve(*_colab_like(tmp_path, deps))
    assert "fusionlab" in plan, plan
    assert not _replaced(plan), f"installing fusionlab would replace Colab's {_replaced(plan)}"


def test_the_resolution_test_catches_a_requirement_that_would_replace_one(tmp_path, online):
    # the control: a requirement Colab's ipywidgets 7.7.1 does not meet must show up as a replacement
    plan = _resolve(*_colab_like(tmp_path, ["ipywidgets>=8"]))
    assert _replaced(plan) and _replaced(plan)[0].startswith("ipywidgets 7.7.1 -> 8."), plan
