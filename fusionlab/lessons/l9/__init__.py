"""Lesson 9: its benchmark suite (``suite``), the decode step's ledger and flash-decoding's spec
(``ledger``), the training recording (``training``) and exercise checkers (``checkers``)."""

from __future__ import annotations

from ... import bench, runtime
from . import suite

SUITE = "lesson9"


def measure(on_result=None, **case_kwargs) -> bench.SuiteRun:
    """This lesson's timings: measured here on a GPU, the recorded run elsewhere (``KeyError`` where no
    recording holds the suite yet), its bytes and predictions as the layer's ledger counts them now
    (:func:`suite.recounted`: the recorded times against today's count)."""
    if runtime.is_gpu():  # counted by this ledger as it is timed
        return bench.measure_suite(SUITE, suite.cases, on_result=on_result, **case_kwargs)
    run = bench.measure_suite(SUITE, suite.cases, **case_kwargs)
    run.results = suite.recounted(run.results, run.ceilings)
    for r in run.results:
        if on_result is not None:
            on_result(r)
    return run
