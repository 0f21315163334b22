"""A table a lesson prints: HTML in a notebook (its cells never break inside a number, whatever the
output's width), the same table as aligned text everywhere else (``print``, a terminal, ``text/plain``).

    fl.viz.Table([("eager", "2.00x", "50%"), ("fused", "1.00x", "100%")], header=("schedule", "time", "of copy"))

Displayed as the last expression of a cell (or with ``display``), a notebook front end shows the HTML;
``str(table)`` is the text, columns padded to their widest cell, numbers right-aligned.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence

from ._style import INK, MUTED

_NUMBER = re.compile(r"^[-+~≈]?[\d.,]+\s*(?:[%x×]|[a-zA-Zµ/]+)?$")


def _is_number(text: str) -> bool:
    return bool(_NUMBER.match(text.strip()))


class Table:
    """Rows of cells (any values, shown with ``str``), an optional header and note (a line under it)."""

    def __init__(self, rows: Iterable[Sequence], header: Sequence | None = None, note: str | None = None):
        self.rows = [[str(c) for c in row] for row in rows]
        self.header = [str(h) for h in header] if header is not None else None
        self.note = note
        widths = {len(r) for r in self.rows} | ({len(self.header)} if self.header else set())
        if len(widths) > 1:
            raise ValueError(f"every row (and the header) needs the same number of cells, got {sorted(widths)}")
        self.n_cols = widths.pop() if widths else 0
        # a column is numeric when every body cell in it reads as a number: right-aligned, as in print
        self._right = [
            bool(self.rows) and all(_is_number(r[i]) for r in self.rows if r[i].strip()) for i in range(self.n_cols)
        ]

    def __str__(self) -> str:
        lines = ([self.header] if self.header else []) + self.rows
        widths = [max((len(r[i]) for r in lines), default=0) for i in range(self.n_cols)]
        out = []
        for k, r in enumerate(lines):
            cells = [
                c.rjust(w) if self._right[i] else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))
            ]
            out.append("  ".join(cells).rstrip())
            if k == 0 and self.header:
                out.append("  ".join("-" * w for w in widths))
        if self.note:
            out.append(self.note)
        return "\n".join(out)

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, p, cycle):  # IPython's text/plain: the table, not the object
        p.text(str(self))

    def _repr_html_(self) -> str:
        def row(cells, tag):
            tds = "".join(
                f'<{tag} style="text-align:{"right" if self._right[i] else "left"};white-space:nowrap;'
                f'padding:2px 10px">{html.escape(c)}</{tag}>'
                for i, c in enumerate(cells)
            )
            return f"<tr>{tds}</tr>"

        head = f"<thead>{row(self.header, 'th')}</thead>" if self.header else ""
        body = "".join(row(r, "td") for r in self.rows)
        note = f'<div style="color:{MUTED};font-size:90%">{html.escape(self.note)}</div>' if self.note else ""
        return (
            f'<table style="border-collapse:collapse;color:{INK};font-variant-numeric:tabular-nums">'
            f"{head}<tbody>{body}</tbody></table>{note}"
        )
