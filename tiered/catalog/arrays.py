"""Many rows as one bound value: a statement that touches a thousand rows is one statement, on both backends.

A `RowSource` names a list of rows passed to SQL as a table: on PostgreSQL one array per column, read back with
`unnest(CAST(:x_col AS type[]), ...)`; on SQLite one JSON array of rows, read back with `json_each`. A statement is
written once around `{name}` (the source, aliased `name`) and its columns are used as `name."column"` (quoted:
`partition` and `position` are keywords), so the row
loop runs inside the database: no per-row round trip, no per-row statement, and no limit on bind parameters.

Lock order: a source joined to `partitions` under `FOR UPDATE` sorts before locking (`ORDER BY ... FOR UPDATE`
locks rows as the sort emits them), so it keeps the catalog's (topic, partition) order.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from sqlalchemy import TextClause, text


@dataclass(frozen=True, slots=True)
class RowSource:
    """Rows of `columns` ((name, PostgreSQL type) each), aliased `name` in the statements that read them."""

    name: str
    columns: tuple[tuple[str, str], ...]

    def sql(self, backend: str) -> str:
        """The FROM item that yields the rows, aliased `name`, one column per entry of `columns`."""
        if backend == "postgresql":
            arrays = ", ".join(f"CAST(:{self.name}_{c} AS {t}[])" for c, t in self.columns)
            names = ", ".join('"' + c + '"' for c, _ in self.columns)
            return f"unnest({arrays}) AS {self.name}({names})"
        # `->>` gives a JSON number as an INTEGER and a JSON string as TEXT, the columns' own types.
        picks = ", ".join(f'value ->> {i} AS "{c}"' for i, (c, _) in enumerate(self.columns))
        return f"(SELECT {picks} FROM json_each(:{self.name}_rows)) AS {self.name}"

    def params(self, backend: str, rows: Sequence[Sequence[object]]) -> dict[str, object]:
        """The bound values that carry `rows` (each a sequence in the order of `columns`)."""
        if backend == "postgresql":
            return {f"{self.name}_{c}": [row[i] for row in rows] for i, (c, _) in enumerate(self.columns)}
        return {f"{self.name}_rows": json.dumps(rows, separators=(",", ":"))}


@cache
def statement(backend: str, template: str, *sources: RowSource) -> TextClause:
    """`template` with each `{source.name}` replaced by that source's FROM item for `backend`, built once."""
    return text(template.format(**{s.name: s.sql(backend) for s in sources}))
