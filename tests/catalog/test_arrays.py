"""Rows bound as one value (tiered.catalog.arrays): what a statement reads back is what it was given, in order, on
every backend (arrays on PostgreSQL, JSON on SQLite)."""

from __future__ import annotations

import pytest

from tiered.catalog.arrays import ArraySource, RowSource, statement

SOURCE = ArraySource("x", (("name", "text"), ("small", "integer"), ("big", "bigint")))
# What an array literal gives a meaning to (quotes, backslashes, commas, braces, blanks, the word NULL, the empty
# string) and what JSON would (escapes), in a text column; integers at the edges of bigint; NULLs in every column.
NAMES = ['plain', 'with "quotes"', 'back\\slash', 'a,b', '{braces}', ' padded ', 'NULL', 'null', '', 'tab\there',
         'line\nend', 'é ü 字', '\\"', None, 'plain']
SMALLS = [0, -1, 2**31 - 1, -(2**31), None, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
BIGS = [2**63 - 1, -(2**63), 0, 1, 2, None, 4, 5, 6, 7, 8, 9, 10, 11, 12]


def _read_back(cat, source, rows):
    with cat.read() as conn:
        backend = conn.dialect.name
        query = statement(backend, 'SELECT x.name, x.small, x.big FROM {x}', source)
        return [tuple(row) for row in conn.execute(query, source.params(backend, rows))]


def test_rows_come_back_as_given_in_order(cat):
    rows = list(zip(NAMES, SMALLS, BIGS))
    assert _read_back(cat, SOURCE, rows) == rows


def test_rows_may_be_lists_and_none(cat):
    assert _read_back(cat, SOURCE, [[NAMES[0], 1, 3], [NAMES[1], 2, 4]]) == [(NAMES[0], 1, 3), (NAMES[1], 2, 4)]
    assert _read_back(cat, SOURCE, []) == []


def test_a_wide_table_comes_back_whole(cat):
    rows = [(f"topic{i % 8}", i, 10**12 + i) for i in range(5000)]
    assert _read_back(cat, SOURCE, rows) == rows


def test_rows_of_another_width_are_refused_before_any_statement():
    with pytest.raises(ValueError, match="values for the 3 columns"):
        SOURCE.params("postgresql", [("a", 1, 2), ("b", 1)])
    with pytest.raises(ValueError, match="values for the 3 columns"):
        SOURCE.params("postgresql", [("a", 1)])


def test_a_text_array_element_must_be_a_string():
    with pytest.raises(TypeError, match="must be a str"):
        SOURCE.params("postgresql", [(1, 1, 1)])


def test_only_text_and_integer_columns():
    with pytest.raises(ValueError, match="only text and integers"):
        ArraySource("y", (("at", "timestamptz"),))


def test_the_same_statement_reads_either_form(cat):
    """A template is written once around `{x}`: a RowSource of the same columns gives the same rows."""
    rows = list(zip(NAMES, SMALLS, BIGS))
    with cat.read() as conn:
        backend = conn.dialect.name
        as_json = RowSource("x", SOURCE.columns)
        query = statement(backend, 'SELECT x.name, x.small, x.big FROM {x}', as_json)
        assert [tuple(r) for r in conn.execute(query, as_json.params(rows))] == rows
