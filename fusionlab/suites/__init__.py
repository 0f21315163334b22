"""Benchmark suites, one per lesson: the same cases a notebook times live on a GPU and that
``python -m fusionlab.record`` writes to ``fusionlab/recorded/`` for learners without one."""

from __future__ import annotations

import importlib
import inspect

SUITES = ("lesson1", "lesson2", "lesson3")


def cases(suite: str, **kwargs):
    """The cases of one suite, built at the mode's sizes (GPU-only: they allocate on CUDA)."""
    if suite not in SUITES:
        raise KeyError(f"unknown suite {suite!r}; have {', '.join(SUITES)}")
    return importlib.import_module(f"{__name__}.{suite}").cases(**kwargs)


def prediction_kwargs(suite: str, ceil) -> dict:
    """The measured ceilings a suite's ``cases()`` takes to fill in each case's prediction."""
    params = inspect.signature(importlib.import_module(f"{__name__}.{suite}").cases).parameters
    have = {"copy_GBps": ceil.copy_GBps, "matmul_TFLOPs": ceil.matmul_TFLOPs}
    return {k: v for k, v in have.items() if k in params}
