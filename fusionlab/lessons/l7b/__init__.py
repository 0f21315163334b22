"""Lesson 7b: its benchmark suite (``suite``), the ledger of skipped blocks (``ledger``) and exercise
checkers (``checkers``)."""

from __future__ import annotations

from ... import bench
from . import suite

SUITE = "lesson7b"


def measure(on_result=None, **case_kwargs) -> bench.SuiteRun:
    """This lesson's timings: measured here on a GPU, the recorded run elsewhere."""
    return bench.measure_suite(SUITE, suite.cases, on_result=on_result, **case_kwargs)
