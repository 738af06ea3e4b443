"""Benchmarks of the broker (issue 3) and of durable acknowledgement (issue 4): `python -m bench` runs them all.

See bench/README.md for what each figure means and how it is measured; docs/benchmarks.md holds the figures.
"""

from __future__ import annotations

import math
from typing import Sequence


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]], title: str = "") -> str:
    """A plain-text table: text columns left-aligned, numbers right-aligned, a rule under the header."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    numeric = [all(_is_number(row[i]) for row in rows) if rows else False for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [title] if title else []
    out.append(line(list(headers)))
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) or value in ("-", "n/a")


def _cell(value: object) -> str:
    if isinstance(value, float):
        if value != value:  # NaN: nothing measured
            return "-"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of already sorted values, nearest rank; NaN when there are none."""
    if not sorted_values:
        return float("nan")
    rank = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[rank]
