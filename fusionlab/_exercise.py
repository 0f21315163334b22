"""Answer keys: package functions an exercise answer may not call while it is being checked.

The package's op ledgers and references are the checkers' answer keys. A learner asked to build
the bias + GELU ledger could otherwise return ``bias_gelu_ledger(...)`` and pass. ``fusionlab.grading``
marks the time it spends inside a learner's code; an answer key called then raises
:class:`AnswerKeyCalled`, which the checker turns into a message. Outside a check they work as usual.
Lowest layer (imports nothing of fusionlab), so kernel modules can mark their functions.
"""

from __future__ import annotations

import functools

#: > 0 while a checker runs a learner's answer
DEPTH = [0]


class AnswerKeyCalled(Exception):
    """An answer under check called one of the package's answer keys."""


def answer_key(fn):
    """Mark ``fn`` as an answer key: calling it from inside an answer being checked is refused."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if DEPTH[0]:
            raise AnswerKeyCalled(
                f"your answer calls fusionlab's {fn.__module__}.{fn.__name__}, one of the checker's answer "
                "keys. Write it yourself: that is the exercise."
            )
        return fn(*args, **kwargs)

    return wrapped
