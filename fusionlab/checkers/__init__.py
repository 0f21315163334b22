"""One module of exercise checkers per lesson, built on :mod:`fusionlab.check`."""
