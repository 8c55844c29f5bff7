"""Reading a quantile call: the expression it orders and the fraction q of rows below the answer, from the SQL.

MEDIAN(x), QUANTILE_CONT(x, q), QUANTILE_DISC(x, q), QUANTILE(x, q), APPROX_QUANTILE(x, q) and
PERCENTILE_CONT(q) / PERCENTILE_DISC(q) WITHIN GROUP (ORDER BY x [DESC]) all ask for the same thing here: the DP
mechanism releases a value of a grid over the bounds (dp/quantile.py), so the continuous and discrete variants,
which differ only in how they pick between two neighbouring rows, have the same answer. DESC asks for 1 - q.
The fraction must be a number literal (a bound parameter is one) between 0 and 1: a column or an expression would
make q depend on a row.
"""

from __future__ import annotations

from fractions import Fraction

from sqlglot import exp

from dpsql.errors import QueryRejected

QUANTILE_CALLS = (exp.Median, exp.PercentileCont, exp.PercentileDisc, exp.Quantile, exp.ApproxQuantile)


def quantile_parts(node: exp.Expression) -> tuple[exp.Expression, Fraction] | None:
    """(the ordered expression, q) of a quantile call; None when `node` is not one."""
    if isinstance(node, exp.WithinGroup):
        return _within_group(node)
    if isinstance(node, exp.Median):
        return node.this, Fraction(1, 2)
    if isinstance(node, exp.PercentileCont | exp.PercentileDisc):
        return node.this, _fraction(node.expression, node)
    if isinstance(node, exp.Quantile | exp.ApproxQuantile):
        extra = [key for key, value in node.args.items() if value is not None and key not in ("this", "quantile")]
        if extra:
            raise QueryRejected(f"{_name(node)}: takes an expression and a fraction only")
        return node.this, _fraction(node.args.get("quantile"), node)
    return None


def _within_group(node: exp.WithinGroup) -> tuple[exp.Expression, Fraction]:
    inner, order = node.this, node.expression
    if not isinstance(inner, exp.PercentileCont | exp.PercentileDisc) or inner.expression is not None:
        raise QueryRejected(f"{_name(node)}: only PERCENTILE_CONT(q) and PERCENTILE_DISC(q) are supported "
                            "WITHIN GROUP (ORDER BY x)")
    if not isinstance(order, exp.Order) or len(order.expressions) != 1:
        raise QueryRejected(f"{_name(node)}: WITHIN GROUP needs ORDER BY one expression")
    (ordered,) = order.expressions
    q = _fraction(inner.this, node)
    return ordered.this, (1 - q if ordered.args.get("desc") else q)


def _fraction(node: exp.Expression | None, call: exp.Expression) -> Fraction:
    if isinstance(node, exp.Array | exp.Tuple):
        raise QueryRejected(f"{_name(call)}: one fraction per call: ask each quantile as its own call, e.g. "
                            "QUANTILE_CONT(x, 0.1), QUANTILE_CONT(x, 0.9)")
    if not isinstance(node, exp.Literal) or node.is_string:
        raise QueryRejected(f"{_name(call)}: the fraction must be a number between 0 and 1 written in the query")
    try:
        q = Fraction(node.this)
    except (ValueError, ZeroDivisionError):
        raise QueryRejected(f"{_name(call)}: the fraction {node.this} is not a number") from None
    if not 0 <= q <= 1:
        raise QueryRejected(f"{_name(call)}: the fraction must be between 0 and 1, not {node.this}")
    return q


def _name(node: exp.Expression) -> str:
    """The call as the analyst wrote it, without the table qualifiers the checker added."""
    def bare(part: exp.Expression) -> exp.Expression:
        return exp.column(part.name) if isinstance(part, exp.Column) else part
    return node.copy().transform(bare, copy=False).sql("duckdb")
