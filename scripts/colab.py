"""Colab: an "Open in Colab" badge and a guarded set-up cell on every notebook; the landing notebook.

One repository URL serves every badge and every set-up cell: :data:`REPO_URL`, overridden by the
environment variable ``FUSIONLAB_REPO`` (and the branch by ``FUSIONLAB_BRANCH``, default ``main``).
To publish the course under another address, one command sets it here and rewrites every badge, every
set-up cell and START_HERE.ipynb; then commit (a test checks that every notebook agrees with it)::

    python scripts/colab.py --set-repo https://github.com/<owner>/<name>

What it adds to a notebook (idempotent: a second run changes nothing; a changed URL is updated in place):

- a markdown cell tagged ``colab-badge``, first in the notebook: the badge, linking Colab to this
  notebook's path in the repository;
- a code cell tagged ``colab-setup``, just before the first other code cell. Off Colab it does nothing
  and prints nothing (its stored output is empty, so strict nbval passes everywhere). On Colab
  (``"google.colab" in sys.modules``) it clones the repository if it is not there yet, runs
  :func:`install` from the clone's copy of this file, puts the clone on ``sys.path`` (importable
  without restarting the runtime) and moves to the notebook's folder, as a local run would.

Why :func:`install` uses ``pip install --no-deps -e`` and not a plain install: Colab ships torch, triton
and ipywidgets, and a resolver that sees fusionlab's requirements together with Colab's whole
environment may decide to "fix" something in torch's own dependency tree (Colab's is not always
consistent) and download gigabytes of CUDA wheels. ``--no-deps`` makes that impossible by construction.
The light requirements (numpy, matplotlib, whatever ``pyproject.toml`` lists) are then installed only
if missing or too old, and with a constraints file that pins torch, triton and ipywidgets at the
versions installed, so even they cannot move those three: pip fails instead of replacing them.
That fusionlab's requirements admit Colab's versions at all is tested by resolution in
``tests/test_colab.py``.

Usage::

    python scripts/colab.py notebooks/*.ipynb exercises/*.ipynb solutions/*.ipynb  # add or update
    python scripts/colab.py --check notebooks/*.ipynb exercises/*.ipynb solutions/*.ipynb  # exit 1 if stale
    python scripts/colab.py --landing           # (re)write START_HERE.ipynb from the notebooks present
    python scripts/colab.py --check --landing   # exit 1 if START_HERE.ipynb is stale
    python scripts/colab.py --all               # every notebook of the course, and START_HERE.ipynb
    python scripts/colab.py --set-repo URL      # REPO_URL := URL in this file, then --all
    python scripts/colab.py --install DIR       # on Colab (the set-up cell calls install()): install DIR

For ``exercises/``, which ``make_exercises.py`` generates from ``solutions/``, call :func:`apply` on each
generated notebook with its exercise path, so that ``make_exercises.py --check`` and ``--check`` here agree.
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: the one place the repository's address lives (``FUSIONLAB_REPO`` overrides it)
REPO_URL = "https://github.com/fusionlab-course/fusionlab"
BRANCH = "main"
#: where the set-up cell clones the repository on Colab
CLONE_DIR = "/content/fusionlab"
#: what Colab provides and the set-up cell must never replace
PROTECTED = ("torch", "triton", "ipywidgets")

TAG_BADGE = "colab-badge"
TAG_SETUP = "colab-setup"
BADGE_IMAGE = "https://colab.research.google.com/assets/colab-badge.svg"
LANDING = "START_HERE.ipynb"

#: the course's lessons as planned: number -> (notebook stem, title); the landing lists those present
#: and names the others as coming. A lesson in two halves numbers its second half "2b".
PLAN = {
    "1": ("01_the_warehouse", "The warehouse"),
    "2": ("02_count_the_trips", "Count the trips"),
    "2b": ("02b_when_arithmetic_stops_being_free", "When arithmetic stops being free"),
    "3": ("03_what_the_compiler_fuses", "What the compiler fuses"),
    "4": ("04_fused_reductions", "Fused reductions"),
    "5": ("05_gates_and_losses", "Gates and losses"),
    "6": ("06_fused_epilogues", "Fused epilogues and prologues"),
    "7": ("07_flash_attention", "FlashAttention forward"),
    "8": ("08_flash_attention_backward", "FlashAttention backward"),
    "9": ("09_the_whole_block", "The whole block"),
}


# -- the URL ----------------------------------------------------------------------------------------------
def repo_url() -> str:
    """The repository's GitHub address, without a trailing ``/`` or ``.git``."""
    url = os.environ.get("FUSIONLAB_REPO", "").strip() or REPO_URL
    url = url.rstrip("/").removesuffix(".git")
    if not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", url):
        raise ValueError(
            f"FUSIONLAB_REPO={url!r}: Colab opens notebooks from GitHub only; give https://github.com/<owner>/<name>"
        )
    return url


def branch() -> str:
    return os.environ.get("FUSIONLAB_BRANCH", "").strip() or BRANCH


def colab_url(repo_path: str) -> str:
    """Colab's address for the notebook at ``repo_path`` (``notebooks/01_the_warehouse.ipynb``)."""
    owner_name = repo_url().removeprefix("https://github.com/")
    return f"https://colab.research.google.com/github/{owner_name}/blob/{branch()}/{repo_path}"


# -- the two cells ----------------------------------------------------------------------------------------
def badge_source(repo_path: str) -> str:
    return f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(repo_path)})"


def setup_source(repo_path: str) -> str:
    folder = Path(repo_path).parent.as_posix()
    cd = f"{{clone}}/{folder}" if folder not in ("", ".") else "{clone}"
    return f'''# Colab only (elsewhere this cell does nothing): fetch the course, install it beside Colab's own
# torch, triton and ipywidgets (none of them is replaced), and say what runs live on this runtime.
import sys

if "google.colab" in sys.modules:
    import os
    import runpy
    import subprocess

    repo, clone = "{repo_url()}", "{CLONE_DIR}"
    if not os.path.isdir(clone):
        cmd = ["git", "clone", "--quiet", "--depth", "1", "--branch", "{branch()}", repo, clone]
        got = subprocess.run(cmd, capture_output=True, text=True)
        if got.returncode != 0:
            raise SystemExit(
                f"Could not fetch the course from {{repo}} (git said: {{got.stderr.strip()}}).\\n"
                "Either it is not published at that address, or this runtime has no network. If you have the "
                "course as a folder or a zip, upload it to /content/fusionlab (Files panel, or copy it from "
                "Google Drive) and run this cell again."
            )
    runpy.run_path(f"{{clone}}/scripts/colab.py")["install"](clone)  # pip --no-deps; prints what runs live
    sys.path.insert(0, clone)  # fusionlab importable now, without restarting the runtime
    os.chdir(f"{cd}")  # this notebook's folder, as when it runs locally'''


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def _find(nb, tag: str) -> int | None:
    for i, cell in enumerate(nb.cells):
        if tag in _tags(cell):
            return i
    return None


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _new_cell(kind: str, source: str, tag: str):
    import nbformat

    make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
    cell = make(source)
    cell["id"] = tag  # deterministic, unique (the tag appears once), readable
    cell.metadata["tags"] = [tag]
    return cell


def _put(nb, tag: str, kind: str, source: str, index_fn) -> None:
    """Make the cell tagged ``tag`` hold ``source`` and sit where ``index_fn(cells without it)`` says."""
    at = _find(nb, tag)
    if at is None:
        cell = _new_cell(kind, source, tag)
    else:
        cell = nb.cells.pop(at)
        if cell.cell_type != kind:  # the tag on the wrong kind of cell: replace the cell
            cell = _new_cell(kind, source, tag)
        elif _source(cell) != source:
            cell.source = source
            if kind == "code":  # stale outputs would belong to the old source
                cell.outputs = []
                cell.execution_count = None
    index = index_fn(nb.cells)
    if index is not None:
        nb.cells.insert(index, cell)


def _first_code(cells) -> int | None:
    return next((i for i, c in enumerate(cells) if c.cell_type == "code"), None)


def apply(nb, repo_path: str) -> bool:
    """Add or update the badge and the set-up cell of ``nb`` (in place) for a notebook that lives at
    ``repo_path`` in the repository; return whether anything changed. A notebook without code cells
    gets the badge only."""
    before = json.dumps(nb.cells, sort_keys=True, default=str)
    _put(nb, TAG_BADGE, "markdown", badge_source(repo_path), lambda cells: 0)
    _put(nb, TAG_SETUP, "code", setup_source(repo_path), _first_code)
    return json.dumps(nb.cells, sort_keys=True, default=str) != before


def is_current(nb, repo_path: str) -> bool:
    """Does ``nb`` already hold an up-to-date badge and set-up cell, in their places?"""
    return not apply(copy.deepcopy(nb), repo_path)


def repo_path_of(path: Path, root: Path = ROOT) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        raise SystemExit(f"{path} is not inside the repository {root}; give --root") from None


# -- the landing notebook ---------------------------------------------------------------------------------
def _title(path: Path) -> str:
    """The lesson's title from its first heading: ``# Lesson 1 — The warehouse`` gives ``The warehouse``."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "markdown":
            continue
        for line in _source(cell).splitlines():
            if line.startswith("# "):
                return re.sub(r"^Lesson\s+\d+[a-z]?\s*[—–:-]\s*", "", line[2:].strip())
    return path.stem


def lessons(root: Path = ROOT) -> list[tuple[str, Path]]:
    """``(number, path)`` of every lesson notebook present, in order: ``("2", .../02_count_the_trips.ipynb)``,
    ``("2b", .../02b_....ipynb)`` for a lesson's second half."""
    found = []
    for p in sorted((root / "notebooks").glob("[0-9][0-9]*_*.ipynb")):
        m = re.match(r"(\d\d)([a-z]?)_", p.name)
        if m:
            found.append((f"{int(m[1])}{m[2]}", p))
    return found


def landing_markdown(root: Path = ROOT) -> list[str]:
    """The landing notebook's markdown cells, from the notebooks present under ``root``."""
    present = lessons(root)
    rows = []
    for n, path in present:
        cols = [f"[{_title(path)}](notebooks/{path.name})"]
        for folder in ("exercises", "solutions"):
            twin = root / folder / path.name
            cols.append(f"[{folder[:-1]}]({folder}/{path.name})" if twin.exists() else "—")
        cols.append(f"[![Open In Colab]({BADGE_IMAGE})]({colab_url(f'notebooks/{path.name}')})")
        deep = root / "notebooks" / "deep" / f"{path.stem}_deep.ipynb"  # the optional tuning notebook
        cols.append(f"[deep dive](notebooks/deep/{deep.name})" if deep.exists() else "—")
        rows.append(f"| {n} | " + " | ".join(cols) + " |")
    have = {n for n, _ in present}
    coming = [f"{n} — {title}" for n, (_, title) in PLAN.items() if n not in have]

    intro = """# fusionlab — operator fusion, from `x.cos().cos()` to FlashAttention

Between the big matrix multiplies of a model sit chains of tiny operations. Run one at a time, each
drags the whole tensor through the GPU's slow memory (HBM) and back; fused, the chain touches slow
memory once on the way in and once on the way out. Same math, fewer trips. Every lesson follows one
discipline: **count the trips, predict the time, measure — and explain the gap.**

Each lesson is a notebook in `notebooks/` (45–90 minutes), with an exercise notebook in `exercises/`
(blanks to fill, each checked by a checker that tells you what is wrong in a few lines) and its twin
with the answers in `solutions/`. Take the lesson first, then its exercises; open the solution only
to compare."""

    head = "| # | lesson | exercises | solutions | Colab | optional |\n|---|---|---|---|---|---|\n"
    table = "## The lessons\n\n" + head + "\n".join(rows)
    if coming:
        table += "\n\nComing: " + "; ".join(coming) + "."

    where = """## Where it runs

- **A laptop or any Linux machine without a GPU**: every notebook runs top to bottom. Triton kernels
  run in Triton's *interpreter* on the CPU (the same kernel code, correct, slow, small sizes), and
  the timings shown are **recorded** GPU results, each labelled with the device, date and versions.
- **A GPU Triton supports** (compute capability 8.0 or newer: A100, L4, H100, H200): full sizes,
  live timings, the roofline of your own GPU.
- **Colab**: the badge on each lesson opens it there, and its first code cell installs the course
  beside Colab's own torch, triton and ipywidgets (it replaces none of them), then says what runs
  live on your runtime. On a T4 (sm_75, which Triton does not support) the Triton cells run in the
  interpreter and the torch cells on the CPU beside them (a lesson compares a kernel with torch on one
  device); the timings are the recorded GPU ones, labelled. To try Triton on the T4 itself: restart
  the runtime (Runtime → Restart), run `%env FUSIONLAB_MODE=gpu` first, then Run all.
- macOS and Windows have no Triton wheels: the torch cells run, the Triton cells say they need Linux
  or Colab.

`import fusionlab` decides where kernels run, once, and `fusionlab.info()` says what it decided.
To override it, set `FUSIONLAB_MODE=gpu` or `FUSIONLAB_MODE=interpreter` before that import: in a
fresh kernel, `%env FUSIONLAB_MODE=gpu` as the first cell."""

    more = """Instructors and maintainers: `INSTRUCTORS.md` has what each lesson teaches, how long it takes,
where learners stumble and how to grade; `README.md` lists the commands (tests, nbval, recording,
the browser test). This page is generated by `python scripts/colab.py --landing`."""
    return [intro, table, where, more]


def landing_notebook(root: Path = ROOT):
    import nbformat

    nb = nbformat.v4.new_notebook()
    for i, text in enumerate(landing_markdown(root)):
        cell = nbformat.v4.new_markdown_cell(text)
        cell["id"] = f"start-here-{i}"
        nb.cells.append(cell)
    return nb


def _clean():
    """``scripts/clean_notebooks.py`` (imported on use: :func:`install` on Colab needs none of it)."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import clean_notebooks

    return clean_notebooks


def landing_text(root: Path = ROOT) -> str:
    clean = _clean()
    return clean.dumps_notebook(clean.normalize_notebook(landing_notebook(root)))


# -- on Colab: install ------------------------------------------------------------------------------------
def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _requirement(text: str):
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pip always carries a copy
        from pip._vendor.packaging.requirements import Requirement
    return Requirement(text)


def install_plan(requirements: list[str], installed: dict[str, str | None]) -> tuple[list[str], list[str]]:
    """``(to_install, problems)`` for fusionlab's ``requirements`` given the ``installed`` versions
    (name -> version or None). Protected packages (torch, triton, ipywidgets) are never installed: if
    Colab's copy does not satisfy a requirement, that is reported as a problem instead."""
    to_install, problems = [], []
    for text in requirements:
        req = _requirement(text)
        if req.marker is not None and not req.marker.evaluate():
            continue
        name = req.name.lower().replace("_", "-")
        have = installed.get(name)
        ok = have is not None and req.specifier.contains(have, prereleases=True)
        if ok:
            continue
        if name in PROTECTED:
            problems.append(
                f"{name}: fusionlab asks for {req.specifier or 'any version'}, this runtime has "
                f"{have or 'none'}; left as it is (fusionlab does not replace {name})."
            )
        else:
            to_install.append(str(req))
    return to_install, problems


def _requirements(clone: Path) -> list[str]:
    try:
        import tomllib
    except ImportError:  # Python 3.10: Colab has 3.12; skip the light-deps check rather than fail
        return []
    project = tomllib.loads((clone / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return list(project.get("dependencies", []))


def live_summary(
    mode: str, device: str, capability: tuple[int, int] | None, gpu_name: str | None, recorded: str | None
) -> str:
    """What runs live on this runtime, in a few lines (pure: tested on any machine). ``recorded`` is the
    label of the recording the lessons show (``fusionlab.bench.recorded().label()``, which says itself
    that it is recorded)."""
    lines = []
    if capability is None:
        lines.append("No GPU in this runtime (Runtime > Change runtime type > T4 GPU gives one).")
    else:
        lines.append(f"GPU: {gpu_name} (sm_{capability[0]}{capability[1]}).")
    if mode == "gpu":
        lines.append("Live here: Triton kernels and torch cells on this GPU, full sizes, live timings.")
    else:
        if capability is not None and capability < (8, 0):
            lines.append("Triton supports sm_80 and newer, so on this GPU:")
        lines += [
            "  Triton kernels: in Triton's interpreter on the CPU (correct, slow, small sizes)",
            f"  torch cells:    on {device}, beside them (each lesson compares a kernel with torch on one device)",
            f"  timings shown:  {recorded or 'recorded on a GPU, and labelled so'}",
        ]
        if capability is not None:
            lines.append(
                "To try Triton on this GPU anyway (element-wise kernels often work; tl.dot is slow or fails): "
                "Runtime > Restart session, run `%env FUSIONLAB_MODE=gpu` in a new first cell, then Run all. "
                "The mode is decided once, at `import fusionlab` (this cell imported it)."
            )
    return "\n".join(lines)


def _pip(*args: str) -> None:
    out = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if out.returncode != 0:
        print(out.stdout[-3000:], out.stderr[-3000:], sep="\n")
        raise RuntimeError(f"pip {' '.join(args)} failed (exit {out.returncode}); its output is above")


def install(clone: str | Path = CLONE_DIR) -> None:
    """Install the course at ``clone`` into this Python without replacing torch, triton or ipywidgets,
    then print what runs live here. (What the Colab set-up cell calls; see the module docstring.)"""
    clone = Path(clone)
    kept = {name: _installed(name) for name in PROTECTED}
    if _installed("fusionlab") is None:
        _pip("install", "--quiet", "--no-deps", "--editable", str(clone))
    requirements = _requirements(clone)
    installed = {_requirement(r).name.lower().replace("_", "-"): None for r in requirements}
    installed = {name: _installed(name) for name in installed}
    to_install, problems = install_plan(requirements, installed)
    if to_install:
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write("".join(f"{n}=={v}\n" for n, v in kept.items() if v))  # pip fails rather than move these
        _pip("install", "--quiet", "--constraint", f.name, *to_install)
    for p in problems:
        print("warning:", p)
    have = ", ".join(f"{n} {v}" for n, v in kept.items() if v)
    print(f"fusionlab installed from {clone}" + (f"; kept as they were: {have}" + "." if have else "."))
    if str(clone) not in sys.path:
        sys.path.insert(0, str(clone))
    try:
        import torch

        import fusionlab  # noqa: F401  (decides the mode, as the lesson's own import would)
        from fusionlab import runtime

        cap = runtime.CAPABILITY
        name = torch.cuda.get_device_name(0) if cap is not None else None
        try:
            recorded = fusionlab.bench.recorded().label()
        except Exception:  # no recording in this copy: say so generically
            recorded = None
        print(live_summary(runtime.MODE, str(runtime.DEVICE), cap, name, recorded))
    except Exception as e:  # the message is a courtesy: never fail the set-up over it
        print(f"(could not summarise what runs live here: {e!r}; `fusionlab.info()` in the next cell says)")


def course_notebooks(root: Path = ROOT) -> list[Path]:
    """Every notebook that carries a badge and a set-up cell: lessons, exercises, solutions."""
    return [p for folder in ("notebooks", "exercises", "solutions") for p in sorted((root / folder).glob("*.ipynb"))]


_REPO_LINE = re.compile(r'^REPO_URL = "[^"]*"$', re.M)


def set_repo(url: str, root: Path = ROOT) -> None:
    """Make ``url`` the course's address: the :data:`REPO_URL` line of ``root``'s copy of this script,
    and this process's value (``FUSIONLAB_REPO`` set in the environment would still win)."""
    global REPO_URL
    url = url.strip().rstrip("/").removesuffix(".git")
    if not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", url):
        raise ValueError(f"{url!r}: Colab opens notebooks from GitHub only; give https://github.com/<owner>/<name>")
    script = root / "scripts" / "colab.py"
    text = script.read_text(encoding="utf-8")
    if len(_REPO_LINE.findall(text)) != 1:
        raise ValueError(f'{script} has no single `REPO_URL = "..."` line to rewrite')
    script.write_text(_REPO_LINE.sub(f'REPO_URL = "{url}"', text), encoding="utf-8")
    REPO_URL = url


# -- the command line -------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", type=Path, help="notebooks to give a badge and a set-up cell")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 listing what is stale")
    parser.add_argument("--landing", action="store_true", help=f"also write (or check) {LANDING}")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository root (default: this checkout)")
    parser.add_argument("--install", metavar="DIR", help="install the course at DIR here (what Colab runs)")
    parser.add_argument("--all", action="store_true", help="every notebook of the course, and the landing page")
    parser.add_argument("--set-repo", metavar="URL", help="set REPO_URL in this script to URL, then --all")
    args = parser.parse_args(argv)

    if args.install:
        install(args.install)
        return 0
    if args.set_repo:
        if args.check:
            parser.error("--set-repo writes; check with --all --check")
        try:
            set_repo(args.set_repo, args.root)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        args.all = True
    if args.all:
        args.paths = [*args.paths, *course_notebooks(args.root)]
        args.landing = True
    if not args.paths and not args.landing:
        parser.error("nothing to do: give notebooks, --landing, --all or --set-repo")

    clean = _clean()
    try:
        repo_url()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stale = []
    for path in args.paths:
        nb = clean.read_notebook(path)
        repo_path = repo_path_of(path, args.root)
        if args.check:
            if not is_current(nb, repo_path):
                stale.append(str(path))
        elif apply(nb, repo_path):
            clean.write_if_changed(path, clean.dumps_notebook(clean.normalize_notebook(nb)))
            print(f"updated {path}")
    if args.landing:
        target = args.root / LANDING
        text = landing_text(args.root)
        current = target.exists() and target.read_text(encoding="utf-8") == text
        if args.check and not current:
            stale.append(str(target))
        elif not args.check and clean.write_if_changed(target, text):
            print(f"wrote {target}")
    if stale:
        print("Stale Colab badge, set-up cell or landing page (run `python scripts/colab.py` on them):")
        for s in stale:
            print(f"  {s}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
