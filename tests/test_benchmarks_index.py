"""benchmarks/ has two indexes that must match its files: the scripts a user runs (benchmarks/README.md)
and the probes (benchmarks/probes/README.md), each pointing to the note section that holds its answer."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
ROW = re.compile(r"^\| `([\w.]+)` \|.*\| (.*) \|$", re.M)
CITE = re.compile(r"`((?:notes_\w+|NOTES)\.md)` § ([^;]+)")


def _headings(note: str) -> list[str]:
    return [h.strip() for h in re.findall(r"^#{2,3} (.*)$", (BENCH / note).read_text(), re.M)]


def test_every_top_level_script_is_in_the_readme():
    listed = {m.group(1) for m in ROW.finditer((BENCH / "README.md").read_text())}
    scripts = {p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh")}
    assert scripts == listed, f"unlisted: {sorted(scripts - listed)}; listed but absent: {sorted(listed - scripts)}"


def test_every_probe_is_indexed_with_a_note_section_that_exists():
    rows = {m.group(1): m.group(2) for m in ROW.finditer((BENCH / "probes" / "README.md").read_text())}
    probes = {p.name for p in (BENCH / "probes").glob("*.py")}
    assert probes == set(rows), f"unindexed: {sorted(probes - set(rows))}; absent: {sorted(set(rows) - probes)}"
    bad = []
    for script, where in rows.items():
        cites = CITE.findall(where)
        if not cites:
            bad.append(f"{script}: no note section named")
        for note, section in cites:
            if not any(h.startswith(section.strip()) for h in _headings(note)):
                bad.append(f"{script}: {note} has no section {section.strip()!r}")
    assert not bad, "\n".join(bad)
