"""Lesson 8: its benchmark suite (``suite``) and exercise checkers (``checkers``)."""

from __future__ import annotations

from ... import bench
from . import suite

SUITE = "lesson8"


def measure(on_result=None, **case_kwargs) -> bench.SuiteRun:
    """This lesson's timings: measured here on a GPU, the recorded run elsewhere (``KeyError`` where no
    recording holds the suite yet)."""
    return bench.measure_suite(SUITE, suite.cases, on_result=on_result, **case_kwargs)
