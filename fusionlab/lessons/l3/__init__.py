"""Lesson 3: its benchmark suite (``suite``) and exercise checkers (``checkers``)."""

from __future__ import annotations

from ... import bench, runtime
from . import suite

SUITE = "lesson3"


def measure(on_result=None, **case_kwargs) -> bench.SuiteRun:
    """This lesson's timings: measured here on a GPU, the recorded run elsewhere. Either way the run's
    ceilings are the ones its predictions were made with (:func:`ceilings`)."""
    run = bench.measure_suite(SUITE, suite.cases, on_result=on_result, **case_kwargs)
    if not run.live:
        run.ceilings = ceilings()
    return run


def _run_files() -> list[bench.Recorded]:
    """The files of the recorded run that holds this suite: one a suite, each with the ceilings measured
    in the process that timed it."""
    rec = bench.recorded(suite=SUITE)
    files = [bench.recorded(p) for p in bench.recorded_files()]
    return [r for r in files if (r.meta["device"], r.meta["date"]) == (rec.meta["device"], rec.meta["date"])]


def ceilings() -> bench.Ceilings:
    """One set of ceilings for this lesson: on a GPU, this process's (the suite measures with them); in a
    recording, those measured beside this suite's timings, which its predictions used (a recorded run
    merges one file a suite and would otherwise lend another suite's ceilings)."""
    if runtime.is_gpu():
        return bench.ceilings()
    return next(r.ceilings for r in _run_files() if SUITE in r.suites)


def ceiling_spread() -> list[bench.Ceilings]:
    """Every set of ceilings the recorded run measured, one per suite, each the same way: how much a
    ceiling moves between two measurements on one GPU. On a GPU, only this process's."""
    if runtime.is_gpu():
        return [bench.ceilings()]
    return [r.ceilings for r in _run_files()]
