"""The range of each 128-bit integer the bounded SQL computes: what Spark cannot hold is refused before the charge.

DuckDB computes the checker's widened integer arithmetic (analysis/typecheck.py) in HUGEINT, which holds about
+-1.7e38; Spark's widest integer is DECIMAL(38, 0), which holds less than +-1e38 and is NULL beyond (ANSI mode off).
A value between the two would be a value on DuckDB and NULL on Spark: a filter, a key or a count that one row
decides. So every integer operation in 128 bits is given the range of values it can take, from its operands' types
and literals (as the checker bounds them) and through subqueries' columns, and a query with one whose range leaves
DECIMAL(38, 0)'s is refused on Spark. The checker's ranges are per type, and a double's come only from the literals
that clamp it (GREATEST(LEAST(x, hi), lo)), so the decision is the SQL's alone.
"""

from __future__ import annotations

import decimal
import math

from sqlglot import exp

from dpsql.analysis.typecheck import INTEGER_TYPES

Range = tuple[int, int]

DECIMAL_LIMIT = 10 ** 38  # DECIMAL(38, 0) holds -(10**38 - 1) .. 10**38 - 1
_T = exp.DataType.Type
# The checker's signed integer types (the bounded SQL has no unsigned ones), by sqlglot's type, and a boolean as 0/1.
_TYPE_RANGES: dict[exp.DataType.Type, Range] = {
    exp.DataType.build(name, dialect="duckdb").this: values for name, values in INTEGER_TYPES.items()
    if not name.startswith("U")} | {_T.BOOLEAN: (0, 1)}
_ROWS = 2 ** 63  # the most rows an aggregate can see: bounds a SUM and a COUNT
_WIDE_OPERATIONS = (exp.Add, exp.Sub, exp.Mul, exp.Neg, exp.Abs, exp.Sum)


def first_too_wide(tree: exp.Expression) -> exp.Expression | None:
    """The first integer operation or cast to HUGEINT in `tree` (qualified and typed by sqlglot) whose values may
    leave DECIMAL(38, 0)'s range, or None."""
    ranges = _Ranges()
    for node in tree.walk():
        # Any integer type: sqlglot types SUM(x) + 1 as BIGINT, where DuckDB (and the translation) has 128 bits.
        wide = (isinstance(node, _WIDE_OPERATIONS) and _integer(node)) or \
            (isinstance(node, exp.Cast | exp.TryCast) and node.to.this is _T.INT128)
        if wide:
            low, high = ranges.of(node)
            if low <= -DECIMAL_LIMIT or high >= DECIMAL_LIMIT:
                return node
    return None


class _Ranges:
    def __init__(self) -> None:
        self._known: dict[int, Range] = {}

    def of(self, node: exp.Expression) -> Range:
        """The values an integer-typed node can take (its type's range where nothing narrower is known)."""
        key = id(node)
        if key not in self._known:
            self._known[key] = self._range(node)
        return self._known[key]

    def _range(self, node: exp.Expression) -> Range:
        if isinstance(node, exp.Paren | exp.Alias):
            return self.of(node.this)
        if isinstance(node, exp.Distinct) and len(node.expressions) == 1:  # SUM(DISTINCT x)
            return self.of(node.expressions[0])
        if isinstance(node, exp.Literal) and not node.is_string:
            return _literal(node.name)
        if isinstance(node, exp.Neg):
            low, high = self.of(node.this)
            return -high, -low
        if isinstance(node, exp.Abs):
            low, high = self.of(node.this)
            return (max(low, 0) if high >= 0 else -high), max(abs(low), abs(high))
        if isinstance(node, exp.Add | exp.Sub | exp.Mul):
            (a, b), (c, d) = self.of(node.this), self.of(node.expression)
            if isinstance(node, exp.Add):
                return a + c, b + d
            if isinstance(node, exp.Sub):
                return a - d, b - c
            corners = (a * c, a * d, b * c, b * d)
            return min(corners), max(corners)
        if isinstance(node, exp.Greatest | exp.Least):
            parts = [self.of(p) for p in (node.this, *node.expressions)]
            pick = max if isinstance(node, exp.Greatest) else min
            return pick(p[0] for p in parts), pick(p[1] for p in parts)
        if isinstance(node, exp.Case | exp.If | exp.Coalesce):
            return self._either(node)
        if isinstance(node, exp.Sum):
            low, high = self.of(node.this)
            return min(low * _ROWS, 0), max(high * _ROWS, 0)
        if isinstance(node, exp.Count):
            return 0, _ROWS
        if isinstance(node, exp.Cast | exp.TryCast) and (_integer(node.this) or _double(node.this)):
            return self._within(self.of(node.this), node)  # a double rounds to within its bounds' floor and ceil
        if isinstance(node, exp.Column):
            traced = self._column(node)
            if traced is not None:  # not narrowed by the column's type: sqlglot types a SUM as BIGINT, DuckDB HUGEINT
                return traced
        return self._type_range(node)

    def _either(self, node: exp.Expression) -> Range:
        """CASE, IF and COALESCE: any of their integer branches (a NULL branch adds no value)."""
        if isinstance(node, exp.Case):
            branches = [i.args["true"] for i in node.args["ifs"]] + [node.args.get("default")]
        elif isinstance(node, exp.If):
            branches = [node.args.get("true"), node.args.get("false")]
        else:
            branches = [node.this, *node.expressions]
        parts = [self.of(b) for b in branches if b is not None and not isinstance(b, exp.Null)]
        if not parts:
            return self._type_range(node)
        return min(p[0] for p in parts), max(p[1] for p in parts)

    def _column(self, column: exp.Column) -> Range | None:
        """A subquery's column: the range of what its SELECT (each SELECT of a UNION) computes under that name."""
        select = column.find_ancestor(exp.Select)
        if select is None or not column.table:
            return None
        sources = [select.args["from_"].this] if select.args.get("from_") else []
        sources += [join.this for join in select.args.get("joins") or []]
        for source in sources:
            if isinstance(source, exp.Subquery) and source.alias == column.table:
                parts = [self._projection(s, column.name) for s in _selects(source.this)]
                if not parts or None in parts:
                    return None
                return min(p[0] for p in parts), max(p[1] for p in parts)  # type: ignore[index]
        return None

    def _projection(self, select: exp.Select, name: str) -> Range | None:
        for projection in select.expressions:
            if projection.alias_or_name == name and _integer(projection):
                return self.of(projection)
        return None

    def _within(self, found: Range, node: exp.Expression) -> Range:
        typed = self._type_range(node)
        return max(found[0], typed[0]), min(found[1], typed[1])

    @staticmethod
    def _type_range(node: exp.Expression) -> Range:
        kind = node.type.this if node.type is not None else None
        return _TYPE_RANGES.get(kind, _TYPE_RANGES[_T.INT128])


def _integer(node: exp.Expression) -> bool:
    return node.type is not None and node.type.this in _TYPE_RANGES


def _double(node: exp.Expression) -> bool:
    return node.type is not None and node.type.this in (_T.DOUBLE, _T.FLOAT)


def _literal(text: str) -> Range:
    """A number literal's value, widened to integers (1.5 lies in 1..2)."""
    try:
        value = decimal.Decimal(text)
    except decimal.InvalidOperation:
        return _TYPE_RANGES[_T.INT128]
    return math.floor(value), math.ceil(value)


def _selects(query: exp.Expression) -> list[exp.Select]:
    if isinstance(query, exp.Union):
        return [*_selects(query.this), *_selects(query.expression)]
    return [query] if isinstance(query, exp.Select) else []
