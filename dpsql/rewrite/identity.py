"""Which rows a query's measurements are of, as text: two queries whose measurements may be combined must read the
very same bounded rows (planning/reuse.py, rule 1), and this is how the store tells.

The text is the SQL of the kept rows (rewrite/passes.kept_rows): the table or joined relation read, the row filter
with its declared-values conditions, and the cap with its m and its look-ahead, each as the engine runs it. It is
written for a canonical copy of the query, so that what only spells the query differently does not matter: the
table's alias is one fixed name, and the filter's top-level conjuncts come in a fixed order (AND commutes, NULLs
included, and the filtered cap keeps the rows that pass the whole filter). Anything else that differs (another
filter, bound, look-ahead, a public key's declared-values condition under a filter) gives other text, and so no
reuse, which is the safe side. With per-group bounds the cap depends on the grouping, which is added. The store
adds the engine's data version and ranking (engines/base.py) beside this text.
"""

from __future__ import annotations

from dataclasses import replace

from sqlglot import exp

from dpsql.planning.contribution import contribution
from dpsql.planning.plan import QueryPlan
from dpsql.planning.reuse import canonical
from dpsql.rewrite.passes import kept_rows
from dpsql.sql.parse import DIALECT

ALIAS = "__relation"


def relation_identity(plan: QueryPlan, listed: bool = True) -> str:
    """The kept rows of `plan`'s query as canonical SQL (see the module's docstring)."""
    query = plan.query
    where = None
    if query.where is not None:
        bare = query.where.unnest()
        conjuncts = bare.flatten() if isinstance(bare, exp.And) else [query.where]
        ordered = sorted((_requalified(c) for c in conjuncts), key=lambda c: c.sql(DIALECT))
        where = exp.and_(*ordered, copy=False) if len(ordered) > 1 else ordered[0]
    keys = tuple(replace(key, expression=_requalified(key.expression)) for key in query.keys)
    canonical_plan = replace(plan, query=replace(query, where=where, keys=keys), measurements=())
    text = kept_rows(canonical_plan, ALIAS, listed).sql(DIALECT)
    if contribution(query).per_group_enforced:
        text += " | capped per group of " + ", ".join(canonical(key.expression) for key in query.keys)
    return text


def _requalified(node: exp.Expression) -> exp.Expression:
    """A copy whose columns all name the canonical alias (every column of a query is of its one relation)."""
    return node.copy().transform(
        lambda part: exp.column(part.this.copy(), table=ALIAS) if isinstance(part, exp.Column) else part, copy=False)
