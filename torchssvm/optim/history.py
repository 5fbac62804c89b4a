"""`History`: the list of step reports that every solver's `fit` returns, with a one-line repr."""

from __future__ import annotations

import math


def _short(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else repr(value)
    return repr(value)


class History(list):
    """The reports of the steps a `fit` took, oldest first: a plain ``list`` of dicts (index it, iterate it,
    ``[r["gap"] for r in history]``) whose repr is one line, ``History(12 steps; last: primal=0.31, gap=9.7e-4
    (exact), passes=12)``, so that a fit typed at a REPL prints a summary rather than every report."""

    _shown = ("primal", "dual", "gap", "passes", "iteration", "time")

    def __repr__(self) -> str:
        if not self:
            return "History(0 steps)"
        last = self[-1]
        parts = []
        for key in self._shown:
            value = last.get(key) if isinstance(last, dict) else None
            if value is None:
                continue
            text = f"{key}={_short(value)}"
            if key == "gap" and "gap_exact" in last:
                text += " (exact)" if last["gap_exact"] else " (estimate)"
            parts.append(text)
        steps = "1 step" if len(self) == 1 else f"{len(self)} steps"
        return f"History({steps}; last: {', '.join(parts)})" if parts else f"History({steps})"

    __str__ = __repr__
