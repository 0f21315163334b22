"""The package's shape, checked: the imports run one way, nothing dodges a cycle, every repository path
quoted in code and docs exists, lint and format are clean."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "fusionlab"

#: the layers, lowest first; a module may import only from its own layer or those before it
LAYERS = [
    {"fusionlab._exercise", "fusionlab._no_triton", "fusionlab._triton", "fusionlab.runtime"},
    {"fusionlab.ledger"},
    {"fusionlab.kernels"},
    {
        "fusionlab.bench",
        "fusionlab.grading",
        "fusionlab.inductor",
        "fusionlab.instrument",
        "fusionlab.measure",
        "fusionlab.optim",
        "fusionlab.model",
    },
    {"fusionlab.viz"},
    {"fusionlab.lessons", "fusionlab.record", "fusionlab.benchcli", "fusionlab.grade", "fusionlab.__main__"},
]
#: third-party modules a function may import lazily: optional dependencies, never fusionlab itself
LAZY_OK = ("triton", "IPython", "importlib", "numpy", "subprocess", "matplotlib")


def _modules():
    for path in sorted(PKG.rglob("*.py")):
        if "generated" in path.parts:
            continue  # Inductor's own output, saved as data
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), path


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> list[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        pkg = pkg[: len(pkg) - (node.level - 1)]
        base = ".".join(pkg + ([node.module] if node.module else []))
    return [f"{base}.{a.name}" for a in node.names] + [base]


def _imports(module: str, path: Path):
    """(imported module, at module level?) for every import statement."""
    tree = ast.parse(path.read_text())
    top = set(id(n) for n in tree.body)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, id(node) in top or _in_type_checking(tree, node)
        elif isinstance(node, ast.ImportFrom):
            for name in _resolve(module, path, node):
                yield name, id(node) in top or _in_type_checking(tree, node)


def _in_type_checking(tree, node) -> bool:
    for n in tree.body:
        if isinstance(n, (ast.If, ast.Try)) and any(node is m for m in ast.walk(n)):
            return True  # `if ...:` / `try:` at module level (optional dependencies) count as module level
    return False


def _layer(name: str) -> int | None:
    for i, layer in enumerate(LAYERS):
        if any(name == m or name.startswith(m + ".") for m in layer):
            return i
    return None


def test_imports_run_one_way():
    bad = []
    for module, path in _modules():
        mine = _layer(module)
        if mine is None:
            if module != "fusionlab":
                bad.append(f"{module}: not in any layer (add it to LAYERS)")
            continue
        for name, _ in _imports(module, path):
            theirs = _layer(name)
            if theirs is not None and theirs > mine:
                bad.append(f"{module} (layer {mine}) imports {name} (layer {theirs})")
    assert not bad, "\n".join(bad)


#: (module, what it may import inside a function): why each is lazy
FUNCTION_LEVEL_OK = {
    ("fusionlab.benchcli", "fusionlab.viz"): "the drawing stack (ipywidgets) only to draw the roofline PNG: the "
    "bench's tables and JSON run on a headless GPU box without it (tests/test_bench.py holds that)",
}


def test_no_function_level_import_of_fusionlab():
    bad = []
    for module, path in _modules():
        for name, top in _imports(module, path):
            if top or any(module == m and name.startswith(n) for m, n in FUNCTION_LEVEL_OK):
                continue
            if name.startswith("fusionlab") and module != "fusionlab":
                bad.append(f"{module}: imports {name} inside a function")
            elif not name.startswith("fusionlab") and not name.startswith(LAZY_OK) and not name.startswith("torch"):
                bad.append(f"{module}: lazily imports {name} (not an optional dependency)")
    assert not bad, "\n".join(bad)


def test_a_library_module_never_imports_a_lesson():
    # the same rule as test_imports_run_one_way, stated on its own for the reader
    for module, path in _modules():
        if module.startswith(("fusionlab.lessons", "fusionlab.record", "fusionlab.benchcli")) or module == "fusionlab":
            continue
        lessons = [n for n, _ in _imports(module, path) if n.startswith("fusionlab.lessons")]
        assert not lessons, f"{module} imports {lessons}"


_PATH = re.compile(
    r"(?<![\w/.-])((?:fusionlab|benchmarks|scripts|tests|notebooks|solutions|exercises|\.ci)/[\w/.-]*\w)"
)


def _quoted_paths():
    files = [p for p in ROOT.rglob("*") if p.suffix in (".py", ".md", ".ipynb", ".sh", ".toml", ".yml", ".cfg")]
    files += [ROOT / ".ci" / "run"]
    for f in files:
        if any(part in (".venv", ".git", ".whl", "generated", "node_modules") for part in f.relative_to(ROOT).parts):
            continue
        text = f.read_text(errors="ignore")
        for m in _PATH.finditer(text):
            yield f.relative_to(ROOT), m.group(1).rstrip(".")


def test_every_quoted_repository_path_exists():
    missing = set()
    for f, p in _quoted_paths():
        if any(c in p for c in "<>*{}") or p.endswith(("/lN", "/l", "_N")):
            continue
        candidates = [ROOT / p, ROOT / (p + ".py")]
        if not any(c.exists() for c in candidates):
            missing.add(f"{f}: {p}")
    assert not missing, "paths quoted but absent:\n" + "\n".join(sorted(missing))


def _ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is not installed: `pip install -e .[dev]` (the README's test command does)")
    return [exe]


def test_ruff_check_is_clean():
    out = subprocess.run([*_ruff(), "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:]


def test_ruff_format_is_clean():
    out = subprocess.run([*_ruff(), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout[-3000:]


def test_notebooks_are_clean():
    out = subprocess.run(
        [sys.executable, "scripts/clean_notebooks.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


#: what an unanswered prediction looks like when printed raw ("you predicted Nonex")
UNSET_GUESS = re.compile(r"\bNone ?(x\b|GiB|kernel)|\b(said|guessed|predicted|prediction:?) None\b")


def test_no_stored_output_prints_an_unset_guess():
    # a prediction left at None goes through fusionlab.said, which prints "(not set)"
    from fusionlab import said

    assert said(None, "x") == "(not set)" and said(1.5, "x") == "1.5x" and said(3) == "3"
    for path in sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb")]):
        for i, cell in enumerate(json.loads(path.read_text())["cells"]):
            for out in cell.get("outputs", []):
                text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
                hit = UNSET_GUESS.search(text)
                assert hit is None, f"{path.name}, cell {i}: {hit.group(0)!r}: print the guess with fusionlab.said"


def test_license_matches_pyproject():
    assert (ROOT / "LICENSE").is_file()
    assert 'license = "MIT"' in (ROOT / "pyproject.toml").read_text()
    assert "MIT License" in (ROOT / "LICENSE").read_text()
