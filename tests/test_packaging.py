"""pyproject.toml and environment.yml agree, and nothing pins what Colab already has.

Colab ships torch 2.11, triton 3.6 and ipywidgets 7.7; ``pip install fusionlab`` there must keep
them, so no dependency may pin these with ``==`` or bound them from above.
"""

from __future__ import annotations

import ast
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

import fusionlab

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]

#: what Colab has installed; every specifier for these packages must admit each version
COLAB = {"torch": ["2.11.0"], "triton": ["3.6.0"], "ipywidgets": ["7.7.1", "8.1.5"]}
UPPER_BOUND_OPERATORS = {"==", "===", "<", "<=", "~="}


def _key(req: str) -> tuple:
    """A requirement in canonical form: whitespace, quoting and specifier order do not matter."""
    r = Requirement(req)
    return (canonicalize_name(r.name), tuple(sorted(r.extras)), str(r.specifier), str(r.marker or ""))


def _pyproject() -> dict[str, list[str]]:
    """``{group: requirements}``; the core dependencies are the group ``""``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    groups = {"": list(project.get("dependencies", []))}
    groups.update(project.get("optional-dependencies", {}))
    return groups


def _environment_pip() -> list[str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text(encoding="utf-8"))
    pip_lists = [d["pip"] for d in env.get("dependencies", []) if isinstance(d, dict) and "pip" in d]
    assert len(pip_lists) == 1, "environment.yml should have exactly one `pip:` list"
    # `-e .` (and any other pip option line) installs fusionlab itself; it is not a dependency
    return [line for line in pip_lists[0] if not str(line).strip().startswith("-")]


def _all_requirements() -> list[tuple[str, str]]:
    """``(where, requirement)`` for every requirement in both files."""
    found = [(f"pyproject.toml [{group or 'dependencies'}]", r) for group, reqs in _pyproject().items() for r in reqs]
    found += [("environment.yml", r) for r in _environment_pip()]
    return found


def test_environment_yml_pip_list_equals_pyproject_dependencies():
    wanted = {_key(r): r for reqs in _pyproject().values() for r in reqs}
    env = [str(r) for r in _environment_pip()]
    have = {_key(r): r for r in env}
    missing = sorted(r for k, r in wanted.items() if k not in have)
    extra = sorted(r for k, r in have.items() if k not in wanted)
    assert not missing and not extra, (
        "environment.yml's pip list must be pyproject.toml's dependencies plus all extras.\n"
        f"  in pyproject.toml, not in environment.yml: {missing}\n"
        f"  in environment.yml, not in pyproject.toml: {extra}"
    )
    duplicates = sorted({r for r in env if sum(_key(r) == _key(o) for o in env) > 1})
    assert not duplicates, f"listed twice in environment.yml: {duplicates}"


@pytest.mark.parametrize("package", sorted(COLAB))
def test_colab_packages_are_not_pinned(package):
    reqs = [(where, Requirement(r)) for where, r in _all_requirements()]
    mine = [(where, r) for where, r in reqs if canonicalize_name(r.name) == package]
    assert mine, f"{package} is not a dependency any more; update COLAB in this test if that is intended"
    for where, r in mine:
        bounded = [str(s) for s in r.specifier if s.operator in UPPER_BOUND_OPERATORS]
        assert not bounded, f"{where}: {r} pins or caps {package} ({', '.join(bounded)}); Colab's copy must stay"
        for version in COLAB[package]:
            assert r.specifier.contains(version, prereleases=True), (
                f"{where}: {r} does not admit {package} {version}, which Colab ships"
            )


#: what the package's code uses, and the first release that has it (read in the wheels: triton 3.3.1 has
#: none of these, 3.4.0 all of them). A use of something newer goes here with its release.
NEEDS = {
    "triton": {
        "from triton import knobs": "3.4",
        "gdc_wait": "3.4",
        "gdc_launch_dependents": "3.4",
        "launch_pdl": "3.4",
    }
}
#: torch pins the triton it was built with: the first torch built against each triton floor
TORCH_FOR_TRITON = {"3.4": "2.8"}


def _floor(package: str) -> Version:
    """The ``>=`` bound of ``package`` among the core dependencies."""
    (req,) = [Requirement(r) for r in _pyproject()[""] if canonicalize_name(Requirement(r).name) == package]
    (bound,) = [Version(s.version) for s in req.specifier if s.operator == ">="]
    return bound


def test_dependency_floors_are_what_the_code_needs():
    source = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "fusionlab").rglob("*.py")))
    for package, needs in NEEDS.items():
        used = [Version(v) for feature, v in needs.items() if feature in source]
        assert used, f"none of {sorted(needs)} is used any more: lower {package}'s floor and this table"
        assert _floor(package) == max(used), f"{package}>={_floor(package)}, but the code needs {max(used)}"
    assert _floor("torch") == Version(TORCH_FOR_TRITON[str(_floor("triton"))])


def test_installed_versions_meet_the_floors():
    # the environment the tests run in (CPU: torch 2.13, triton 3.9; the GPUs: torch 2.11, triton 3.6)
    for package in ("torch", "triton"):
        assert Version(metadata.version(package).split("+")[0]) >= _floor(package), package


def test_the_version_has_one_source():
    # setuptools reads fusionlab.__version__ for the wheel's metadata: no second copy to drift
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "fusionlab.__version__"}
    # a literal, so setuptools reads it without importing the package (and torch)
    tree = ast.parse((ROOT / "fusionlab" / "__init__.py").read_text(encoding="utf-8"))
    (value,) = [
        n.value for n in tree.body if isinstance(n, ast.Assign) and [t.id for t in n.targets] == ["__version__"]
    ]
    assert isinstance(value, ast.Constant) and Version(value.value) == Version(fusionlab.__version__)


def test_ruff_is_pinned_to_the_version_that_runs():
    # the tests run ruff's lint and format checks, whose rules change between releases
    (pin,) = [Requirement(r) for r in _pyproject()["dev"] if canonicalize_name(Requirement(r).name) == "ruff"]
    (spec,) = list(pin.specifier)
    assert spec.operator == "==", f"ruff is not pinned: {pin}"
    assert metadata.version("ruff") == spec.version, "the installed ruff is not the pinned one: pip install -e .[dev]"
