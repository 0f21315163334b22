"""Generate ``exercises/*.ipynb`` from ``solutions/*.ipynb`` (the single source of every exercise).

Markup, in code cells of a solution notebook::

    def gelu(x):
        ### BEGIN SOLUTION
        ### HINT: GELU(x) = x * sigmoid(1.702 x) is close enough here
        return x * torch.sigmoid(1.702 * x)
        ### END SOLUTION

becomes, in the exercise notebook, one line at the indentation of ``### BEGIN SOLUTION``::

    def gelu(x):
        raise NotImplementedError("GELU(x) = x * sigmoid(1.702 x) is close enough here")

The ``### HINT:`` line is optional and must directly follow ``### BEGIN SOLUTION``; without it the
message is :data:`DEFAULT_HINT`. ``### END SOLUTION`` must have the indentation of its BEGIN. Blocks
may not nest, and markers may only appear in code cells.

Cell tags:

- ``solution-only`` (solution notebook): the cell (code or markdown) is left out of the exercise.
- ``raises-in-exercise`` (solution notebook): force ``raises-exception`` on the exercise copy, for a
  cell that fails without the answers in a way the analysis below cannot see; the tag itself is
  not copied.
- ``raises-exception`` (exercise notebook, added by this script; kept if the solution has it):
  the cell may raise, so Jupyter's "Run All" and nbval/nbclient go on past it. It is added to

  * every cell that contains a solution block,
  * every cell that calls a checker (``check_...(``) once a solution block has appeared, and
  * every cell that uses a name which, in the exercise, is unbound or broken: names bound by a
    solution cell from its first block on (``def gelu`` above: calling it raises), names bound
    only in ``solution-only`` cells, and, transitively, names bound by cells tagged here. A later
    cell that binds the name again without using a broken one makes it good again.

  Tagging a cell that would not in fact raise does no harm (the tag allows an error, it does not
  demand one).

Every code cell of the exercise has its outputs and execution count cleared, and the metadata is
normalised by ``clean_notebooks.normalize_notebook``, so the files are byte-for-byte reproducible.

Usage::

    python scripts/make_exercises.py            # (re)write exercises/*.ipynb
    python scripts/make_exercises.py --check    # exit 1, listing the files, if exercises/ is stale
    python scripts/make_exercises.py --prune    # also delete exercises that have no solution
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import colab  # noqa: E402
from clean_notebooks import dumps_notebook, normalize_notebook, read_notebook, write_if_changed  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS_DIR = ROOT / "solutions"
EXERCISES_DIR = ROOT / "exercises"

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
HINT = "### HINT:"
DEFAULT_HINT = "Exercise: fill in this block (see the markdown above)."

TAG_SOLUTION_ONLY = "solution-only"
TAG_FORCE_RAISES = "raises-in-exercise"
TAG_RAISES = "raises-exception"

CHECKER_CALL = re.compile(r"\bcheck_\w*\s*\(")


class MarkupError(ValueError):
    """The solution markup is malformed (unbalanced, nested, misplaced or mis-indented markers)."""


@dataclass(frozen=True)
class Block:
    """One ``### BEGIN SOLUTION`` ... ``### END SOLUTION`` block; line numbers are 0-based, inclusive."""

    begin: int
    end: int
    indent: str
    hint: str


def _source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def find_blocks(source: str, where: str = "cell") -> list[Block]:
    """Return the solution blocks of one cell's source, or raise :class:`MarkupError`."""
    lines = source.splitlines()
    blocks: list[Block] = []
    open_at: int | None = None
    for i, line in enumerate(lines):
        text = line.strip()
        if text == BEGIN:
            if open_at is not None:
                raise MarkupError(f"{where}, line {i + 1}: {BEGIN} inside the block opened on line {open_at + 1}")
            open_at = i
        elif text == END:
            if open_at is None:
                raise MarkupError(f"{where}, line {i + 1}: {END} without a {BEGIN}")
            indent = _indent(lines[open_at])
            if _indent(line) != indent:
                raise MarkupError(f"{where}, line {i + 1}: {END} is not indented like its {BEGIN} (line {open_at + 1})")
            hint = DEFAULT_HINT
            if open_at + 1 < i and lines[open_at + 1].strip().startswith(HINT):
                hint = lines[open_at + 1].strip()[len(HINT) :].strip() or DEFAULT_HINT
            blocks.append(Block(open_at, i, indent, hint))
            open_at = None
    if open_at is not None:
        raise MarkupError(f"{where}, line {open_at + 1}: {BEGIN} is never closed by {END}")
    return blocks


def _inside_triton_kernel(lines: list[str], block: Block) -> bool:
    """Is the block in the body of a function decorated with ``@triton.jit``?"""
    for i in range(block.begin - 1, -1, -1):
        text = lines[i].strip()
        if text.startswith("def ") and len(_indent(lines[i])) < len(block.indent):
            j = i - 1
            while j >= 0 and lines[j].strip().startswith("@"):
                if lines[j].strip().startswith(("@triton.jit", "@jit")):
                    return True
                j -= 1
            return False
    return False


def stub_source(source: str, blocks: list[Block]) -> str:
    """``source`` with every block replaced by ``raise NotImplementedError("<hint>")``."""
    if not blocks:
        return source
    lines = source.splitlines(keepends=True)
    out: list[str] = []
    pos = 0
    for block in blocks:
        out.extend(lines[pos : block.begin])
        newline = "\n" if lines[block.end].endswith("\n") else ""
        text = block.hint if block.hint.startswith("Exercise") else f"Exercise: {block.hint}"
        # json.dumps gives a double-quoted literal that Python reads back as the same string
        hint = json.dumps(text, ensure_ascii=False)
        if _inside_triton_kernel(lines, block):
            # Triton's GPU compiler rejects `raise`; a failed static_assert carries the hint instead
            # (and the interpreter raises it as an AssertionError). The checkers recognise both.
            out.append(f"{block.indent}tl.static_assert(False, {hint}){newline}")
        else:
            out.append(f"{block.indent}raise NotImplementedError({hint}){newline}")
        pos = block.end + 1
    out.extend(lines[pos:])
    return "".join(out)


# -- which cells fail in the exercise ---------------------------------------------------------------
def _python(source: str) -> ast.Module | None:
    """Parse a cell as Python (IPython magics turned into calls first); None if it does not parse."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        source = TransformerManager().transform_cell(source)
    except Exception:  # no IPython, or a transform it does not know: try the source as it is
        pass
    try:
        return ast.parse(source)
    except SyntaxError:
        return None


def _bound_by(node: ast.AST) -> set[str]:
    """Names that a top-level statement binds in the notebook's namespace (not inside defs)."""
    names: set[str] = set()

    def visit(n: ast.AST) -> None:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(n.name)
            for d in n.decorator_list:
                visit(d)
            return
        if isinstance(n, ast.Lambda):
            return
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            names.add(n.id)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            for alias in n.names:
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(n, ast.ExceptHandler) and n.name:
            names.add(n.name)
        for child in ast.iter_child_nodes(n):
            visit(child)

    visit(node)
    return names


_IDENT = re.compile(r"[A-Za-z_]\w*")
_MAGIC_CALLS = ("run_line_magic", "run_cell_magic", "system", "getoutput")


def _used_by(tree: ast.Module) -> set[str]:
    """Names a cell reads, including every identifier in the text of its magics (``%timeit f(x)``
    and ``%%time`` bodies reach the AST only as strings)."""
    used: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            used.add(n.id)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _MAGIC_CALLS:
            for arg in n.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    used |= set(_IDENT.findall(arg.value))
    return used


def _analyse(source: str, from_line: int | None) -> tuple[set[str], set[str], set[str]]:
    """``(used, bound, bound_from)`` for one cell: names read, names bound, and names bound by the
    top-level statements that end at or after 0-based line ``from_line`` (all of them if None).
    A cell that does not parse reads and binds every identifier in it (safe for tagging)."""
    tree = _python(source)
    if tree is None:
        idents = set(_IDENT.findall(source))
        return idents, idents, idents
    bound: set[str] = set()
    bound_from: set[str] = set()
    for stmt in tree.body:
        names = _bound_by(stmt)
        bound |= names
        if from_line is None or (stmt.end_lineno or stmt.lineno) - 1 >= from_line:
            bound_from |= names
    return _used_by(tree), bound, bound_from


# -- the generator ----------------------------------------------------------------------------------
#: the import of a lesson's checkers (l4b, l7b: a second half), after which the exercise switches on short messages
CHECKERS_IMPORT = re.compile(r"^from fusionlab\.lessons\.l\d+[a-z]? import checkers as ex\s*$", re.M)
#: (the semicolon: the call returns whether it installed them, which the cell would otherwise show as `True`)
SHORT_MESSAGES = "fl.grading.install_notebook_messages(exercise=True);  # a blank not yet filled: one short message"


def make_exercise(solution: nbformat.NotebookNode, name: str = "notebook") -> nbformat.NotebookNode:
    """Return the exercise notebook for ``solution`` (which is not modified)."""
    nb = copy.deepcopy(solution)
    cells = []
    broken: set[str] = set()  # names that are unbound or raise in the exercise at this point
    seen_block = False
    installed = False
    for index, cell in enumerate(nb.cells):
        where = f"{name}, cell {index + 1}"
        src = _source(cell)
        tags = list(cell.get("metadata", {}).get("tags", []))
        if cell.cell_type != "code":
            if BEGIN in src or END in src:
                raise MarkupError(f"{where}: solution markers are only allowed in code cells")
            if TAG_SOLUTION_ONLY not in tags:
                cells.append(cell)
            continue
        blocks = find_blocks(src, where)
        if TAG_SOLUTION_ONLY in tags:
            broken |= _analyse(src, None)[1]
            continue
        used, bound, bound_from_block = _analyse(src, blocks[0].begin if blocks else None)
        raises = (
            bool(blocks)
            or TAG_FORCE_RAISES in tags
            or (seen_block and CHECKER_CALL.search(src) is not None)
            or bool(used & broken)
        )
        seen_block = seen_block or bool(blocks)
        if TAG_RAISES in tags:
            pass  # raises in the solution too: what it binds is the author's business
        elif blocks and not used & broken:
            # runs up to its first block: what it binds before that is good, the rest is broken
            broken = (broken - (bound - bound_from_block)) | bound_from_block
        elif raises:
            broken |= bound
        else:
            broken -= bound

        tags = [t for t in tags if t != TAG_FORCE_RAISES]
        if raises and TAG_RAISES not in tags:
            tags.append(TAG_RAISES)
        if tags:
            cell.metadata["tags"] = tags
        else:
            cell.metadata.pop("tags", None)
        cell.source = stub_source(src, blocks)
        if not installed and CHECKERS_IMPORT.search(cell.source):
            # an unfinished blank (and a cell that needs it) shows one short message, not a traceback
            cell.source = cell.source.rstrip("\n") + "\n" + SHORT_MESSAGES
            installed = True
        cell.outputs = []
        cell.execution_count = None
        cells.append(cell)
    nb.cells = cells
    if any(colab.TAG_BADGE in c.get("metadata", {}).get("tags", []) for c in nb.cells):
        colab.apply(nb, f"exercises/{name}")  # the solution's Colab cells, pointed at the exercise itself
    return normalize_notebook(nb)


def render_exercise(solution_path: Path) -> str:
    """The exact text ``exercises/<name>`` should hold for ``solution_path``."""
    return dumps_notebook(make_exercise(read_notebook(solution_path), solution_path.name))


def pair_up(solutions_dir: Path, exercises_dir: Path) -> tuple[list[Path], list[Path]]:
    """``(solutions, orphans)``: every solution notebook, and exercises without a solution twin."""
    solutions = sorted(solutions_dir.glob("*.ipynb"))
    names = {p.name for p in solutions}
    orphans = sorted(p for p in exercises_dir.glob("*.ipynb") if p.name not in names)
    return solutions, orphans


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 and list the files if exercises/ is not up to date"
    )
    parser.add_argument("--prune", action="store_true", help="delete exercises that have no solution")
    parser.add_argument("--solutions", type=Path, default=SOLUTIONS_DIR, help=argparse.SUPPRESS)
    parser.add_argument("--exercises", type=Path, default=EXERCISES_DIR, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    solutions, orphans = pair_up(args.solutions, args.exercises)
    stale: list[str] = []
    for sol in solutions:
        target = args.exercises / sol.name
        try:
            text = render_exercise(sol)
        except MarkupError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if not target.exists():
            stale.append(f"{target} is missing (solution {sol} has no exercise)")
        elif target.read_text(encoding="utf-8") != text:
            stale.append(f"{target} differs from what {sol} generates")
        else:
            continue
        if not args.check:
            write_if_changed(target, text)
            print(f"wrote {target}")
    for orphan in orphans:
        message = f"{orphan} has no solution twin in {args.solutions}"
        if args.check:
            stale.append(message)
        elif args.prune:
            orphan.unlink()
            print(f"removed {orphan} (no solution)")
        else:
            print(f"warning: {message} (delete it, or run with --prune)", file=sys.stderr)

    if args.check and stale:
        print("exercises/ is out of date; run `python scripts/make_exercises.py`:")
        for line in stale:
            print(f"  {line}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
