"""Which column a value is compared with: how a parameter given as text, or sent untyped over the wire, gets the
type of its place in the query (`age > ?` takes age's type)."""

from __future__ import annotations

from sqlglot import exp

_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ, exp.Between,
                exp.In)


def enclosing(node: exp.Expression) -> exp.Expression | None:
    """The node's parent, through parentheses and tuples (`x IN (?, ?)`)."""
    parent = node.parent
    while isinstance(parent, exp.Paren | exp.Tuple):
        parent = parent.parent
    return parent


def compared_column(node: exp.Expression) -> exp.Column | None:
    """The bare column `node` is compared with (=, <>, <, <=, >, >=, IS [NOT] DISTINCT FROM, BETWEEN, IN), if any."""
    parent = enclosing(node)
    if not isinstance(parent, _COMPARISONS):
        return None
    sides = [parent.this] if isinstance(parent, exp.Between | exp.In) else [parent.this, parent.expression]
    for side in sides:
        while isinstance(side, exp.Paren):
            side = side.this
        if isinstance(side, exp.Column):
            return side
    return None
