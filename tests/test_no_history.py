"""The repository speaks of itself only: no tracked file dates its work by its place in the history.

A measurement is named by its date and topic ("2026-11-26, the 32768-wide softmax's timeline"), never
by the order in which the project's work happened (an ordinal of the work's sittings, "last time", "an
earlier round"): a reader of the course was not there, and an ordinal means nothing to them.

``session`` is also a technical word (a Jupyter kernel's session, a browser session, a Python session):
those uses are allowed when the word is qualified by what it belongs to, or is part of an
identifier (``sessionContext``, ``start_new_session``). The word with no owner before it is flagged:
write "this process", "a Colab runtime", or "the kernel session" instead, which say what is meant.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
THIS = Path(__file__).resolve().relative_to(ROOT).as_posix()

_ORDINALS_SMALL = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth"
_ORDINALS_LARGE = (
    "eleventh|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|"
    r"twentieth|twenty-\w+th|twenty-first|twenty-second|twenty-third|thirtieth|thirty-\w+"
)
#: what a technical session belongs to, written just before the word
_SESSION_OWNERS = (
    "kernel|kernel's|browser|browser's|jupyter|jupyterlab|jupyter's|notebook|notebook's|colab|colab's|"
    "python|ipython|interactive|interpreter|repl|terminal|shell|ssh|tmux|http|https|requests|login|"
    "user|runtime|playwright|selenium|webdriver|restart|new|tf|onnx|onnxruntime|inference"
)

#: (name, pattern); each is searched case-insensitively in every tracked text file
PATTERNS: list[tuple[str, re.Pattern]] = [
    # an ordinal past ten reads only as a count of the work's own steps ("the nineteenth ...")
    ("ordinal past ten", re.compile(rf"\b({_ORDINALS_LARGE})\b", re.I)),
    # an ordinal right before the word or "sitting", with a space or a hyphen ("fifth sitting")
    ("ordinal session", re.compile(rf"\b({_ORDINALS_SMALL})[- ](sessions?|sittings?)\b", re.I)),
    # the word itself; _technical() lets through an identifier (x.session, session_id, sessionContext)
    # and a session whose technical owner stands right before it ("kernel session", "Colab session")
    ("session", re.compile(r"(?<![\w.])sessions?(?![\w(=])(?!\.\w)", re.I)),
    ("last time", re.compile(r"\b(last|previous|the other) time\b(?! ?steps?\b)", re.I)),
    # a round of the work, as opposed to a round of timing or of an algorithm (those are "the second
    # round", "the last round", "rounds": never "earlier" or "previous")
    ("earlier round", re.compile(r"\b(an? |the )?(earlier|previous|prior|past) (rounds?|sessions?|passes of)\b", re.I)),
    ("session number", re.compile(r"\bsession[- ]?\d+\b", re.I)),
]


def _technical(name: str, line: str, m: re.Match) -> bool:
    """Whether the match of a "session" is the technical word: its owner is the word before it."""
    if name != "session":
        return False
    before = re.findall(r"[\w']+", line[: m.start()].lower())
    return bool(before) and before[-1] in _SESSION_OWNERS.split("|")


def hits(text: str) -> list[tuple[str, str]]:
    """(pattern name, the line) for every line of ``text`` that dates the work by its history."""
    found = []
    for line in text.splitlines():
        for name, pat in PATTERNS:
            if any(not _technical(name, line, m) for m in pat.finditer(line)):
                found.append((name, line.strip()[:160]))
                break
    return found


def tracked_text_files() -> dict[str, str]:
    """Every tracked file that decodes as UTF-8 text, by its path from the repository root."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        paths = [p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: every file but caches
        skip = {".git", ".venv", "__pycache__", ".ipynb_checkpoints", ".pytest_cache", ".ruff_cache"}
        paths = [
            p.relative_to(ROOT).as_posix()
            for p in ROOT.rglob("*")
            if p.is_file() and not skip & set(p.relative_to(ROOT).parts)
        ]
    files = {}
    for p in paths:
        try:
            files[p] = (ROOT / p).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # images and other binaries; a path deleted in the work tree
    assert len(files) > 50, f"found only {len(files)} text files under {ROOT}"
    return files


FILES = tracked_text_files()


def test_no_tracked_file_dates_the_work_by_its_history():
    bad = {p: h for p, text in FILES.items() if p != THIS and (h := hits(text))}
    report = "\n".join(f"{p}: {len(h)} lines, e.g. [{h[0][0]}] {h[0][1]!r}" for p, h in sorted(bad.items()))
    assert not bad, f"name a measurement by its date and topic, not its place in the work:\n{report}"


# The patterns themselves: what must be caught and what must not. The examples write the word as {s}
# (filled in below) so that this file, which has to hold them, does not read as the project dating itself.
DATING = [
    "## 2026-11-26 (nineteenth {s}): the H200's softmax",
    "measured in the ninth {s}, see notes",
    "the fifth {s} blamed the fallback's buffers",
    "(`notes_softmax.md`, eighteenth-{s} sections)",
    "Checks of the ninth {s}'s CPU-only edits",
    "What the next GPU {s} runs first",
    "1160 s of the {s}'s 1800 s of device time",
    "the {s}-2 final run read 214 TFLOP/s",
    "{S}s 3 and 4 agreed",
    "as last time, the H100 was faster",
    "an earlier round measured 87%",
    "the previous round's table",
    "Since the sixteenth the split kernel takes these rows",
    "A bug of the {s}, fixed",
    "each half fits a {s}",
]
TECHNICAL = [
    "restart the kernel {s} and run all cells",
    "const k = w && w.{s}Context && w.{s}Context.{s}.kernel;",
    "subprocess.Popen(cmd, start_new_{s}=True)",
    "a Colab {s} keeps its files until it disconnects",
    "Open a browser {s} on the Jupyter server",
    "every function compiled earlier in the Python {s}",
    "the second round against the parts' maxima",
    "the partial last round costs about a point",
    "the whole row fits in one block this time",
    "an eighth of the tokens, by default",
    "a second run changes nothing",
    "the first pass reads the row, the second pass writes it",
    "with requests.{S}() as s:",
    "the last time step of the sequence",
]
_WORD = "".join(("sess", "ion"))
DATING = [line.format(s=_WORD, S=_WORD.capitalize()) for line in DATING]
TECHNICAL = [line.format(s=_WORD, S=_WORD.capitalize()) for line in TECHNICAL]


@pytest.mark.parametrize("line", DATING)
def test_dating_is_caught(line):
    assert hits(line), f"not caught: {line!r}"


@pytest.mark.parametrize("line", TECHNICAL)
def test_technical_words_pass(line):
    assert not hits(line), f"caught by mistake: {hits(line)}"
