"""Many rows as one bound value: a statement that touches a thousand rows is one statement, on both backends.

A `RowSource` names a list of rows passed to SQL as a table: one JSON array of rows (each an array in the order of
the source's columns), read back by `jsonb_array_elements` on PostgreSQL and `json_each` on SQLite. A statement is
written once around `{name}` (the source, aliased `name`) and its columns are used as `name."column"` (quoted:
`partition` and `position` are keywords), so the row loop runs inside the database: no per-row round trip, no
per-row statement, no limit on bind parameters. JSON rather than PostgreSQL arrays: the driver adapts a list
element by element in Python (about 20 ms for a block of 1,600 runs), `json.dumps` and the server's parser in C.

An `ArraySource` is the same table passed column by column: on PostgreSQL one array per column, each bound as the
text of an array literal (`{1,2,3}`, built in C by the JSON encoder for integers) and read back by a multi-argument
`unnest`; on SQLite, which has no arrays, the rows as one JSON value, as a RowSource. The server reads an array
without parsing JSON or casting each field: for commit_block's 1,600 heads 14-19 % less time in the
statement (docs/scale.md). `backend` decides the form in one place, `ArraySource.sql` and `ArraySource.params`.

Lock order: rows are read in the order given (`jsonb_array_elements`, `json_each` and `unnest` yield an array in its
order), so a statement that locks a row per row given, as tiered.catalog.partitions.lock_partitions does, locks them
in the order its caller sorted them.
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


# The element types an ArraySource binds: text is quoted, integers are written as JSON writes them.
_INTEGERS = frozenset(("smallint", "integer", "bigint"))


@dataclass(frozen=True, slots=True)
class ArraySource:
    """Rows of `columns` ((name, PostgreSQL type) each; text or integers), passed as one array per column on
    PostgreSQL and as one JSON value on SQLite, aliased `name` in the statements that read them."""

    name: str
    columns: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        for column, type_ in self.columns:
            if type_ != "text" and type_ not in _INTEGERS:
                raise ValueError(f"array column {column!r} of type {type_!r}: only text and integers")

    def sql(self, backend: str) -> str:
        """The FROM item that yields the rows, aliased `name`, one column per entry of `columns`."""
        if backend == "postgresql":
            arrays = ", ".join(f"CAST(:{self.name}_{c} AS {t}[])" for c, t in self.columns)
            names = ", ".join(f'"{c}"' for c, _ in self.columns)
            return f"unnest({arrays}) AS {self.name}({names})"
        return RowSource(self.name, self.columns).sql(backend)

    def params(self, backend: str, rows: Sequence[Sequence[object]]) -> dict[str, str]:
        """The bound values that carry `rows` (each a sequence in the order of `columns`)."""
        if backend != "postgresql":
            return {self.name: _dumps(rows)}
        columns = list(zip(*rows)) or [()] * len(self.columns)  # one transposition, in C
        if len(columns) != len(self.columns) or any(len(row) != len(self.columns) for row in rows):
            raise ValueError(f"rows of {sorted(set(map(len, rows)))} values for the {len(self.columns)} columns of "
                             f"{self.name}")
        return {f"{self.name}_{c}": _text_array(values) if t == "text" else _integer_array(values)
                for (c, t), values in zip(self.columns, columns)}


def _integer_array(values: Sequence[object]) -> str:
    # JSON writes an int as PostgreSQL reads an array element, and None as null, which an array literal also reads
    # as NULL (unquoted, in any case); a bool or a float makes the cast fail, loudly.
    return "{" + _dumps(values if isinstance(values, (list, tuple)) else list(values))[1:-1] + "}"


def _text_array(values: Sequence[object]) -> str:
    # Each element double-quoted, its backslashes and double quotes escaped (an array literal's only escapes), None
    # as NULL. Quoted once per distinct value: a column of topic names repeats a few.
    quoted = {value: _quoted(value) for value in set(values)}
    return "{" + ",".join(map(quoted.__getitem__, values)) + "}"


def _quoted(value: object) -> str:
    if value is None:
        return "NULL"
    if not isinstance(value, str):
        raise TypeError(f"a text array element must be a str, not {type(value).__name__}")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@cache
def statement(backend: str, template: str, *sources: RowSource | ArraySource) -> TextClause:
    """`template` with each `{source.name}` replaced by that source's FROM item for `backend`, built once."""
    return text(template.format(**{s.name: s.sql(backend) for s in sources}))
