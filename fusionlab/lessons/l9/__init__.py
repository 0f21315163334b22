"""Lesson 9: its benchmark suite (``suite``), the decode step's ledger and flash-decoding's spec
(``ledger``), the training recording (``training``) and exercise checkers (``checkers``)."""

from __future__ import annotations

from ... import bench
from . import suite

SUITE = "lesson9"


def measure(on_result=None, **case_kwargs) -> bench.SuiteRun:
    """This lesson's timings: measured here on a GPU, the recorded run elsewhere (``KeyError`` where no
    recording holds the suite yet)."""
    return bench.measure_suite(SUITE, suite.cases, on_result=on_result, **case_kwargs)
