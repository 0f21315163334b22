"""No measured number is typed into a notebook's prose by hand.

A number that a run measured (a time, a bandwidth, a throughput, a share, a ratio) and that a markdown
cell states drifts from the run the day the kernel or the GPU changes, and then the lesson contradicts its
own chart. So a lesson renders every such number from a code cell (``display(Markdown(f"..."))`` over the
run or the recording it describes), and this test reads every markdown cell of every notebook in
``notebooks/`` (``notebooks/deep/`` too) and ``solutions/`` and fails on what looks like a hand-typed
measurement: a number followed by

- a time unit (ns, µs, us, ms),
- a bandwidth (GB/s, TB/s) or a throughput (TFLOP/s),
- a percent sign,
- a ratio sign (``×`` or ``x``) that no second number follows (``1.25×`` is a ratio; ``32768 × 4096``
  is a shape and passes).

A fact that no run of ours measured — a spec sheet's bandwidth, a datasheet's register file — may stay
in prose if its line carries the marker ``<!-- spec -->`` (invisible once rendered). The marker is the only
escape, and it is meant to be rare: a count the ledger computes is rendered by code too.

A second test a notebook fails on a code cell that parses the Markdown benchmark notes
(``bench.notes_section``/``notes_table``/``notes_label``): a lesson reads data files with device, date and
versions instead. One test a notebook, so each lesson's failure is its own. How it works is said in each
lesson's closing note; the planted cases below show that the scans can fail.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: the marker that lets one line state a spec-sheet fact
SPEC_MARKER = "<!-- spec -->"

_NUMBER = r"(?<![\w.])\d+(?:[.,]\d+)*"
_UNIT = r"(?:ns|µs|μs|us|ms|GB/s|TB/s|TFLOP/s|TFLOPS|%)"
#: a number and a unit; or a number and a ratio sign that no number, capital letter (``32768 × N``) or
#: bracket follows (those are shapes)
MEASUREMENT = re.compile(
    rf"{_NUMBER}\s?(?:{_UNIT}(?![\w/])|[×x](?![\w])(?!\s*(?:\d|[A-Z]\b|[(`])))",
)


def notebooks(root: Path = ROOT) -> list[Path]:
    """Every notebook whose prose a learner reads: ``notebooks/`` (deep dives included) and ``solutions/``
    (``exercises/`` are generated from ``solutions/``)."""
    found = sorted((root / "notebooks").rglob("*.ipynb")) + sorted((root / "solutions").glob("*.ipynb"))
    return [p for p in found if ".ipynb_checkpoints" not in p.parts]


def _strip_code(text: str) -> str:
    """Markdown without its code: fenced blocks, indented blocks and inline spans are code, not prose."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = "\n".join("" if line.startswith(("    ", "\t")) else line for line in text.split("\n"))
    return re.sub(r"`[^`\n]*`", "", text)


def hand_typed(markdown: str) -> list[str]:
    """The hand-typed measurements in one markdown cell's source: the matched texts, in order."""
    hits = []
    for line in _strip_code(markdown).split("\n"):
        if SPEC_MARKER in line:
            continue
        hits += [m.group(0) for m in MEASUREMENT.finditer(line)]
    return hits


def findings(path: Path) -> list[str]:
    """``"[cell] text"`` for every hand-typed measurement in the markdown cells of one notebook."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        out += [f"[{index}] {hit!r}" for hit in hand_typed(source)]
    return out


def _param(path: Path):
    return pytest.param(path, id=path.relative_to(ROOT).as_posix())


@pytest.mark.parametrize("path", [_param(p) for p in notebooks()])
def test_no_hand_typed_measurement_in_prose(path):
    found = findings(path)
    assert not found, (
        f"{path.relative_to(ROOT)}: hand-typed measurements in markdown (render them from the run or the "
        f"recording in a code cell; a spec-sheet fact may carry {SPEC_MARKER} on its line):\n  " + "\n  ".join(found)
    )


#: the calls that read numbers out of the Markdown benchmark notes (the first device and date they match)
NOTES_READERS = ("notes_section(", "notes_table(", "notes_label(")


def notes_readers(path: Path) -> list[str]:
    """``"[cell] call"`` for every code cell of one notebook that parses the benchmark notes."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for index, cell in enumerate(nb["cells"]):
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        if cell["cell_type"] == "code":
            out += [f"[{index}] {call}" for call in NOTES_READERS if call in source]
    return out


@pytest.mark.parametrize("path", [_param(p) for p in notebooks()])
def test_lessons_read_data_not_the_notes(path):
    """A lesson's numbers come from data files with device, date and versions (``fusionlab/recorded/``),
    never from the Markdown notes, whose prose a regex may misread."""
    found = notes_readers(path)
    assert not found, f"{path.relative_to(ROOT)} parses the benchmark notes: " + ", ".join(found)


# -- the scan itself can fail ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        "The fused kernel ran at 93% of copy.",
        "a 50.8 µs excess",
        "took 0.42 ms on an H100",
        "eager runs at 2.34× its prediction",
        "measured 1.01x against the ledger",
        "HBM moved 3,350 GB/s here",
        "the matmul reached 612 TFLOP/s",
        "about 13us a launch",
    ],
)
def test_a_planted_measurement_is_caught(text):
    assert hand_typed(text), text


@pytest.mark.parametrize(
    "text",
    [
        "At 32768 × 4096 in bf16, one fused kernel.",  # a shape
        "a 4x4 tile",  # a shape
        "P × N fp32 against 32768 × N",  # shapes with a dimension's letter
        "The H100 SXM's HBM3 is rated 3.35 TB/s. <!-- spec -->",  # a spec-sheet fact, marked
        "rows of `1e-6` and `x = 3ms`",  # inline code
        "    y = 2x + 1 % 5",  # an indented code block
        "Lesson 4 of 8, section 2b, 2**27 elements",
    ],
)
def test_what_is_not_a_measurement_passes(text):
    assert not hand_typed(text), text


def _planted(tmp_path, cells) -> Path:
    """A notebook of these cells, written where a test can read it."""
    nb = {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "planted.ipynb"
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


def test_a_planted_notes_reader_is_caught(tmp_path):
    code = {"cell_type": "code", "metadata": {}, "source": "fl.bench.notes_table('notes', 'Bars')", "outputs": []}
    assert notes_readers(_planted(tmp_path, [code])) == ["[0] notes_table("]


def test_a_planted_notebook_fails(tmp_path):
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": ["# A lesson\n", "It ran at 1.78× eager.\n"]},
        {"cell_type": "code", "metadata": {}, "source": "print(f'{1.78:.2f}x')", "outputs": []},
        {"cell_type": "markdown", "metadata": {}, "source": "HBM3: 3.35 TB/s <!-- spec -->"},
    ]
    assert findings(_planted(tmp_path, cells)) == ["[0] '1.78×'"]
