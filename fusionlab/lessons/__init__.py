"""Lesson content, one package per lesson: ``lN.suite`` (the benchmark cases a notebook times live on a
GPU and ``python -m fusionlab.record`` records), ``lN.checkers`` (the exercise checkers) and any
artifacts the lesson reads (lesson 3's saved Inductor code).

The library (runtime, ledger, kernels, bench, grading, instrument, inductor, viz) never imports from
here; lessons import the library.
"""

from __future__ import annotations

import importlib
from pathlib import Path

#: suite name (as recorded) -> the lesson package that defines it
LESSONS = {**{f"lesson{i}": f"l{i}" for i in range(1, 9)}, "lesson4b": "l4b", "lesson7b": "l7b", "lesson9": "l9"}
#: the suites this copy of the course has (a lesson still being written has no suite yet)
SUITES = tuple(s for s, pkg in LESSONS.items() if (Path(__file__).parent / pkg / "suite.py").is_file())


def suite_module(suite: str):
    """The ``suite`` module of a lesson, by its recorded name (``"lesson2"``)."""
    if suite not in SUITES:
        raise KeyError(f"unknown suite {suite!r}; have {', '.join(SUITES)}")
    return importlib.import_module(f"{__name__}.{LESSONS[suite]}.suite")
