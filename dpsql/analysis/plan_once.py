"""Which parameterised statements may be planned once and run again with new values (the session's plan once).

The plan of a query (its checks, bounds, costs, types, the per-person work bound, the public facts it asks for) is
a function of the SQL with its parameters bound as literals. A plan made for one value may serve another only where
no stage can tell the two apart. That is claimed here, conservatively, for:

- a value's *class*: its Python type, its sign, whether it is zero, the shape of its literal (every digit one
  digit, so the same number of digits before and after the point and in the exponent: DuckDB types a decimal literal
  by its digits) and, for an integer, which of the checker's integer types hold it (the checker types an integer
  literal as the narrowest that does). Numbers only (int, float, Decimal), finite: NULL, booleans, text, dates and
  anything else have no class, and their statement takes the full path each time.
- a parameter's *position*: a direct operand of a comparison (=, <>, <, <=, >, >=, BETWEEN, IN list) whose other
  side is a bare column of a private table, in the WHERE of the query, reached from it through AND, OR, NOT and
  parentheses only, in a query of declared tables (no subquery, no CTE, no set operation). Not in an aggregate, a
  key, the select list, HAVING, LIMIT, a join condition, a CASE or a function. Where a value of one class stands
  there, the checker types the comparison alike; no bound, cost or public fact reads it.

The session checks the claim besides, for each statement (session.py): the plan made for a second value of each
class, filled in, must equal the full path's plan for it, or the statement is never reused.
"""

from __future__ import annotations

import decimal
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from sqlglot import exp

from dpsql.analysis.typecheck import INTEGER_TYPES
from dpsql.policy import Policy
from dpsql.sql.parse import PARAMETER_LABEL

_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
_LOGIC = (exp.And, exp.Or, exp.Not, exp.Paren)
_MAX_DIGITS = 40  # beyond any integer type; longer texts take the full path, which says so
_MAX_BITS = 133  # what 40 digits hold at most


def value_class(value: Any) -> Hashable | None:
    """The class of one parameter value (see the module's docstring), or None: not one that may reuse a plan."""
    kind = type(value)  # exactly: a subclass (bool is an int's, an enum's) may render otherwise
    if kind is int:
        if value.bit_length() > _MAX_BITS:  # str() refuses an integer of over 4300 digits
            return None
        text = str(value)
        if len(text) > _MAX_DIGITS:
            return None
        fits = tuple(low <= value <= high for low, high in INTEGER_TYPES.values())
        magnitude = tuple(low <= -value <= high for low, high in INTEGER_TYPES.values())
        return "int", value < 0, value == 0, _shape(text), fits, magnitude
    if kind is float:
        if value != value or value in (float("inf"), float("-inf")):
            return None
        return "float", value < 0, value == 0, _shape(repr(value))
    if kind is decimal.Decimal:
        if not value.is_finite() or len(str(value)) > _MAX_DIGITS:
            return None
        return "decimal", value < 0, value == 0, _shape(str(value)), value.is_signed()
    return None


def _shape(text: str) -> str:
    return "".join("9" if c.isdigit() else c for c in text)


def parameters_class(parameters: Sequence[Any] | Mapping[str, Any] | None) -> Hashable | None:
    """The classes of all the parameters (positional or named), or None if one has none."""
    if isinstance(parameters, Mapping):
        classes = tuple((name, value_class(value)) for name, value in sorted(parameters.items(), key=_name))
        return ("named", classes) if all(c is not None for _, c in classes) else None
    if isinstance(parameters, list | tuple) and parameters:
        classes = tuple(value_class(value) for value in parameters)
        return ("positional", classes) if all(c is not None for c in classes) else None
    return None


def _name(item: tuple[Any, Any]) -> str:
    return str(item[0])


def shadow_value(value: Any) -> Any:
    """Another value of the same class as `value`, to check a template with; None if there is none (zero)."""
    kind = type(value)
    text = str(value) if kind is not float else repr(value)
    digits = [i for i, c in enumerate(text.split("e")[0].split("E")[0]) if c.isdigit()]
    for position in reversed(digits):
        for digit in "123456789":
            if digit == text[position]:
                continue
            candidate = text[:position] + digit + text[position + 1:]
            try:
                other = kind(candidate)
            except (ValueError, decimal.InvalidOperation):
                continue
            rendered = str(other) if kind is not float else repr(other)
            if rendered == candidate and other != value and value_class(other) == value_class(value):
                return other
    return None


def shadow_parameters(parameters: Sequence[Any] | Mapping[str, Any]) -> Sequence[Any] | Mapping[str, Any] | None:
    """Every parameter replaced by its shadow value, or None if one has none."""
    if isinstance(parameters, Mapping):
        shadows = {name: shadow_value(value) for name, value in parameters.items()}
        return shadows if all(v is not None for v in shadows.values()) else None
    values = [shadow_value(value) for value in parameters]
    return type(parameters)(values) if all(v is not None for v in values) else None


def value_of(label: str, parameters: Sequence[Any] | Mapping[str, Any]) -> Any:
    """The value a bound literal labelled `label` (sql/parse: `$n`, `:name`, or its place among the `?`s) stands
    for."""
    if label.startswith(":"):
        return parameters[label[1:]]  # type: ignore[index]
    return parameters[int(label.removeprefix("$")) - 1]  # type: ignore[index]


def opaque_positions(tree: exp.Select, policy: Policy) -> bool:
    """Whether every parameter of the bound `tree` stands where its value cannot change the plan (see the module's
    docstring), and there is one."""
    if not isinstance(tree, exp.Select) or tree.args.get("with") is not None:
        return False
    if any(node is not tree for node in tree.find_all(exp.Query)):
        return False
    tables = _private_tables(tree, policy)
    if tables is None:
        return False
    labelled = [node for node in tree.walk() if PARAMETER_LABEL in node.meta]
    return bool(labelled) and all(_opaque(node, tree, tables) for node in labelled)


def _private_tables(tree: exp.Select, policy: Policy) -> dict[str, bool] | None:
    """The query's tables by the name its columns use: whether each is private; None if it reads anything else."""
    source = tree.args.get("from_")
    sources = [source.this if source is not None else None, *(join.this for join in tree.args.get("joins") or ())]
    tables = {}
    for table in sources:
        if not isinstance(table, exp.Table) or table.args.get("db") or table.args.get("catalog"):
            return None
        declared = policy.table(table.name)
        if declared is None:
            return None
        tables[table.alias_or_name] = not declared.public
    return tables


def _opaque(node: exp.Expression, tree: exp.Select, tables: dict[str, bool]) -> bool:
    if not isinstance(node, exp.Literal | exp.Neg):
        return False
    place = node
    while isinstance(place.parent, exp.Paren):
        place = place.parent
    comparison = place.parent
    if isinstance(comparison, _COMPARISONS):
        other = comparison.expression if place is comparison.this else comparison.this
    elif isinstance(comparison, exp.Between | exp.In) and place is not comparison.this and not any(
            comparison.args.get(arg) for arg in ("query", "unnest", "field")):
        other = comparison.this
    else:
        return False
    while isinstance(other, exp.Paren):
        other = other.this
    if not (isinstance(other, exp.Column) and isinstance(other.this, exp.Identifier) and _private(other, tables)):
        return False
    above = comparison.parent
    while isinstance(above, _LOGIC):
        above = above.parent
    return isinstance(above, exp.Where) and above.parent is tree


def _private(column: exp.Column, tables: dict[str, bool]) -> bool:
    if column.args.get("db") or column.args.get("catalog"):
        return False
    if column.table:
        return tables.get(column.table, False)
    return len(tables) == 1 and next(iter(tables.values()))
