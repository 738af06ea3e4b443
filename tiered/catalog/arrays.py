"""Many rows as one bound value: a statement that touches a thousand rows is one statement, on both backends.

A `RowSource` names a list of rows passed to SQL as a table: one JSON array of rows (each an array in the order of
the source's columns), read back by `jsonb_array_elements` on PostgreSQL and `json_each` on SQLite. A statement is
written once around `{name}` (the source, aliased `name`) and its columns are used as `name."column"` (quoted:
`partition` and `position` are keywords), so the row loop runs inside the database: no per-row round trip, no
per-row statement, no limit on bind parameters. JSON rather than PostgreSQL arrays: the driver adapts a list
element by element in Python (about 20 ms for a block of 1,600 runs), `json.dumps` and the server's parser in C.

Lock order: rows are read in the order given (`jsonb_array_elements` and `json_each` yield an array in its order),
so a statement that locks a row per row given, as tiered.catalog.partitions.lock_partitions does, locks them in the
order its caller sorted them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from sqlalchemy import TextClause, text

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, check_circular=False).encode


@dataclass(frozen=True, slots=True)
class RowSource:
    """Rows of `columns` ((name, PostgreSQL type) each), aliased `name` in the statements that read them."""

    name: str
    columns: tuple[tuple[str, str], ...]

    def sql(self, backend: str) -> str:
        """The FROM item that yields the rows, aliased `name`, one column per entry of `columns`."""
        if backend == "postgresql":
            picks = ", ".join(f'CAST(value ->> {i} AS {t}) AS "{c}"' for i, (c, t) in enumerate(self.columns))
            return f"(SELECT {picks} FROM jsonb_array_elements(CAST(:{self.name} AS jsonb))) AS {self.name}"
        # `->>` gives a JSON number as an INTEGER and a JSON string as TEXT, the columns' own types.
        picks = ", ".join(f'value ->> {i} AS "{c}"' for i, (c, _) in enumerate(self.columns))
        return f"(SELECT {picks} FROM json_each(:{self.name})) AS {self.name}"

    def params(self, rows: Sequence[Sequence[object]]) -> dict[str, str]:
        """The bound value that carries `rows` (each a sequence in the order of `columns`)."""
        return {self.name: _dumps(rows)}


@cache
def statement(backend: str, template: str, *sources: RowSource) -> TextClause:
    """`template` with each `{source.name}` replaced by that source's FROM item for `backend`, built once."""
    return text(template.format(**{s.name: s.sql(backend) for s in sources}))
