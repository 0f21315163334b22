"""Normalise notebook metadata so that committed notebooks only change when their content does.

This module is the one place that knows what "clean" means; ``run_notebooks.py`` and
``make_exercises.py`` import :func:`normalize_notebook`, :func:`read_notebook` and
:func:`dumps_notebook` from here.

What cleaning does (outputs are left alone: committed outputs are part of the course):

- notebook metadata: ``kernelspec`` becomes the stock ``python3`` kernel, ``language_info`` keeps
  its ``name`` only, the ``widgets`` key (saved widget state) is dropped, and so is Colab's
  ``colab.provenance``;
- cell metadata: execution timestamps (``execution``, ``ExecuteTime``) and Colab's per-run keys
  (``executionInfo``, ``outputId``, ``colab``) are dropped; duplicate tags are removed and an empty
  ``tags`` list is deleted;
- format: nbformat 4.5 with a cell id on every cell; a missing or duplicate id gets one derived
  from the cell's position and source (never a random one), so regenerating gives the same bytes;
- serialisation: what ``nbformat.write`` produces (JSON, indent 1, sorted keys, one trailing newline).

Usage::

    python scripts/clean_notebooks.py                 # clean notebooks/*.ipynb and solutions/*.ipynb in place
    python scripts/clean_notebooks.py a.ipynb b.ipynb # clean these
    python scripts/clean_notebooks.py --check         # exit 1 and list the files that are not clean
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIRS = ("notebooks", "notebooks/deep", "solutions")  # deep: the lessons' optional deep dives

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
#: notebook-level metadata keys that change on every run or save and carry nothing for the course
VOLATILE_NOTEBOOK_KEYS = ("widgets",)
#: cell-level metadata keys written by JupyterLab, nbclient and Colab when a cell runs
VOLATILE_CELL_KEYS = ("execution", "ExecuteTime", "executionInfo", "outputId", "colab")


def read_notebook(path: str | Path) -> nbformat.NotebookNode:
    """Read a notebook as nbformat 4 without letting nbformat invent random cell ids.

    (``nbformat.read`` fills a missing id with a random one, which would make the generated
    exercises differ from run to run; :func:`normalize_notebook` assigns deterministic ones.)
    """
    text = Path(path).read_text(encoding="utf-8")
    if json.loads(text).get("nbformat") != 4:
        return nbformat.reads(text, as_version=4)
    return nbformat.v4.reads(text)  # sources as strings, no validation, nothing invented


def _cell_id(index: int, cell) -> str:
    digest = hashlib.sha1(f"{index}\0{cell.get('cell_type')}\0{cell.get('source', '')}".encode()).hexdigest()
    return digest[:8]


def _source_text(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def normalize_notebook(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Strip volatile metadata from ``nb`` in place (see the module docstring) and return it.

    Idempotent: normalising a normalised notebook changes nothing.
    """
    meta = nb.setdefault("metadata", nbformat.NotebookNode())
    for key in VOLATILE_NOTEBOOK_KEYS:
        meta.pop(key, None)
    meta["kernelspec"] = nbformat.NotebookNode(KERNELSPEC)
    meta["language_info"] = nbformat.NotebookNode(name="python")
    colab = meta.get("colab")
    if isinstance(colab, dict):
        colab.pop("provenance", None)
        if not colab:
            del meta["colab"]

    nb["nbformat"] = 4
    nb["nbformat_minor"] = max(int(nb.get("nbformat_minor", 0)), 5)
    seen: set[str] = set()
    for index, cell in enumerate(nb.cells):
        # sources as one string (how nbformat holds them in memory; the writer splits lines again)
        cell["source"] = _source_text(cell)
        cell_meta = cell.setdefault("metadata", nbformat.NotebookNode())
        for key in VOLATILE_CELL_KEYS:
            cell_meta.pop(key, None)
        if "tags" in cell_meta:
            tags = list(dict.fromkeys(cell_meta["tags"]))
            if tags:
                cell_meta["tags"] = tags
            else:
                del cell_meta["tags"]
        cid = cell.get("id")
        if not cid or cid in seen:
            cid = _cell_id(index, cell)
            while cid in seen:
                cid = hashlib.sha1(cid.encode()).hexdigest()[:8]
            cell["id"] = cid
        seen.add(cid)
    return nb


def dumps_notebook(nb: nbformat.NotebookNode) -> str:
    """Serialise exactly as ``nbformat.write`` does, ending in one newline."""
    text = nbformat.writes(nb, version=nbformat.NO_CONVERT)
    return text if text.endswith("\n") else text + "\n"


def write_if_changed(path: str | Path, text: str) -> bool:
    """Write ``text`` to ``path`` unless it already holds exactly that; return whether it wrote."""
    path = Path(path)
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return True


def default_notebooks(root: Path = ROOT) -> list[Path]:
    """The notebooks an instructor maintains by hand: ``notebooks/*.ipynb``, ``notebooks/deep/*.ipynb`` and
    ``solutions/*.ipynb``."""
    return [p for d in DEFAULT_DIRS for p in sorted((root / d).glob("*.ipynb"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "paths", nargs="*", type=Path, help="notebooks to clean (default: notebooks/*.ipynb solutions/*.ipynb)"
    )
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file is not clean")
    args = parser.parse_args(argv)

    paths = args.paths or default_notebooks()
    dirty = []
    for path in paths:
        text = dumps_notebook(normalize_notebook(read_notebook(path)))
        if path.read_text(encoding="utf-8") == text:
            continue
        dirty.append(path)
        if not args.check:
            write_if_changed(path, text)
            print(f"cleaned {path}")
    if args.check and dirty:
        print("Notebooks with volatile metadata (run `python scripts/clean_notebooks.py`):")
        for path in dirty:
            print(f"  {path}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
