"""Benchmark suites, one per lesson: the same cases a notebook times live on a GPU and that
``python -m fusionlab.record`` writes to ``fusionlab/recorded/`` for learners without one."""

from __future__ import annotations

import importlib

SUITES = ("lesson1",)


def cases(suite: str, **kwargs):
    """The cases of one suite, built at the mode's sizes (GPU-only: they allocate on CUDA)."""
    if suite not in SUITES:
        raise KeyError(f"unknown suite {suite!r}; have {', '.join(SUITES)}")
    return importlib.import_module(f"{__name__}.{suite}").cases(**kwargs)
