"""pyproject.toml and environment.yml agree, and nothing pins what Colab already has.

Colab ships torch 2.11, triton 3.6 and ipywidgets 7.7; ``pip install fusionlab`` there must keep
them, so no dependency may pin these with ``==`` or bound them from above.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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
