"""Where a bound parameter's literal stands in SQL rendered from the stages' trees, so that the SQL made for one
value can be made for another by filling in text, without running the stages or rendering the trees again (the
session's plan-once templates).

A literal bound from a parameter carries its label in its meta (sql/parse.PARAMETER_LABEL), and the stages' copies
keep it. The marking dialect renders each node so labelled as a marker no rendered SQL holds otherwise (it has NUL
characters; the session plans once only a text without one). `substituted` does the same to the trees themselves:
every labelled node replaced by another value's literal. Neither proves that the result is what the stages would
make for that value: the session checks that for each statement before it reuses anything (session.py, plan once).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB

from dpsql.sql.parse import DIALECT, PARAMETER_LABEL, literal

MARK = "\x00"


class MarkedDuckDB(DuckDB):
    """DuckDB's dialect, each parameter's literal rendered as `MARK label MARK`."""

    class Generator(DuckDB.Generator):
        def sql(self, expression: Any, key: str | None = None, comment: bool = True) -> str:
            if isinstance(expression, exp.Expression) and key is None:
                label = expression.meta.get(PARAMETER_LABEL)
                if label is not None:
                    return f"{MARK}{label}{MARK}"
            return super().sql(expression, key, comment)


def bound_literals(values: Mapping[str, Any]) -> dict[str, exp.Expression]:
    """Each label's value as parse binds it (sql/parse.literal, with its checks: a DataError for a value it refuses),
    labelled as parse labels it."""
    nodes = {}
    for label, value in values.items():
        node = literal(value)
        node.meta[PARAMETER_LABEL] = label
        nodes[label] = node
    return nodes


def rendered(nodes: Mapping[str, exp.Expression]) -> dict[str, str]:
    """Each label's literal as DuckDB SQL, for `filled`."""
    return {label: node.sql(DIALECT) for label, node in nodes.items()}


def filled(template: str, texts: Mapping[str, str]) -> str:
    """`template` (rendered with MarkedDuckDB) with each marker replaced by its label's literal (`rendered`)."""
    parts = template.split(MARK)
    # Markers split the text into: text, label, text, label, ..., text.
    for i in range(1, len(parts), 2):
        parts[i] = texts[parts[i]]
    return "".join(parts)


def substituted(value: Any, nodes: Mapping[str, exp.Expression], memo: dict[int, Any] | None = None) -> Any:
    """`value` (a tree, or dataclasses, tuples, lists and dicts holding trees) with every labelled node replaced by
    a copy of its label's node in `nodes`. What holds no labelled node is shared, not copied; an object reached twice
    becomes one substituted object, as it was one before."""
    memo = {} if memo is None else memo
    found = memo.get(id(value))
    if found is not None:
        return found[1]
    result = _substituted(value, nodes, memo)
    memo[id(value)] = (value, result)  # the original is kept alive so that its id is not reused meanwhile
    return result


def _substituted(value: Any, nodes: Mapping[str, exp.Expression], memo: dict[int, Any]) -> Any:
    if isinstance(value, exp.Expression):
        if not any(PARAMETER_LABEL in node.meta for node in value.walk()):
            return value
        return value.transform(lambda node: nodes[node.meta[PARAMETER_LABEL]].copy()
                               if PARAMETER_LABEL in node.meta else node)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {}
        for field in dataclasses.fields(value):
            if not field.init:
                continue
            old = getattr(value, field.name)
            new = substituted(old, nodes, memo)
            if new is not old:
                changes[field.name] = new
        return dataclasses.replace(value, **changes) if changes else value
    if isinstance(value, tuple | list):
        items = [substituted(item, nodes, memo) for item in value]
        if all(new is old for new, old in zip(items, value, strict=True)):
            return value
        return type(value)(items) if not hasattr(value, "_fields") else type(value)(*items)
    if isinstance(value, dict):
        entries = {key: substituted(item, nodes, memo) for key, item in value.items()}
        return value if all(entries[key] is item for key, item in value.items()) else type(value)(entries)
    return value


def identical(one: Any, other: Any) -> bool:
    """Whether two values (trees, or dataclasses, tuples, lists and dicts holding them) are the same in every field,
    those left out of a dataclass's own comparison included (compare=False). Trees compare by their structure."""
    if dataclasses.is_dataclass(one) and not isinstance(one, type):
        return type(one) is type(other) and all(identical(getattr(one, f.name), getattr(other, f.name))
                                                for f in dataclasses.fields(one))
    if isinstance(one, tuple | list):
        return type(one) is type(other) and len(one) == len(other) and all(
            identical(a, b) for a, b in zip(one, other, strict=True))
    if isinstance(one, dict):
        return type(one) is type(other) and one.keys() == other.keys() and all(
            identical(one[key], other[key]) for key in one)
    return type(one) is type(other) and bool(one == other)
