"""The engine's half of a DP quantile: rows per (group, candidate bucket), never the rows themselves.

`bucket_counts` wraps the bounded rows of a query (already filtered and capped at m rows per unit by the usual
passes) in one GROUP BY: for each group and each candidate of dp/quantile.Grid that some row rounds down to, the
number of such rows. Python then holds at most #candidates integers per group (dp/quantile.py turns them into
every candidate's utility by cumulative sums).

Privacy: the bucket of a row is a function of that row alone (clamp to the bounds, then floor onto the grid), so
one unit still changes at most m rows, each of which moves from one bucket to none or back; that is the
sensitivity dp/quantile.py uses. The bucket index is computed in the engine's floats: rounding at a bucket edge
may put a value in the neighbouring bucket, which is again a function of the row only (an accuracy matter of at
most one grid step, not a privacy one). Rows whose argument is NULL are not counted, as in SQL's quantiles.
Counts of the buckets themselves are never released: only the candidate the mechanism picks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlglot import exp

from dpsql.dp.quantile import Grid
from dpsql.sql import names

BUCKET = "__dp_bucket"
ROWS = "__dp_rows"


def bucket_of(argument: exp.Expression, grid: Grid) -> exp.Expression:
    """floor((clamp(x) - low) / width), clamped to [0, K]: the candidate a row is rounded down to."""
    value = exp.cast(argument.copy(), "DOUBLE")
    low, width = float(grid.low), float(grid.width)
    scaled = exp.Floor(this=exp.Div(this=exp.paren(exp.Sub(this=value, expression=exp.Literal.number(repr(low)))),
                                    expression=exp.Literal.number(repr(width))))
    # DuckDB's own GREATEST and LEAST (sqlglot's would wrap each in a CASE for NULLs, which callers filter out):
    # a NaN value goes to the top candidate (LEAST(NaN, K) is K, as NaN sorts above every number), an infinity to
    # an end, so the cast to BIGINT cannot fail on any row.
    inside = exp.Anonymous(this="greatest", expressions=[scaled, exp.Literal.number(0)])
    return exp.cast(exp.Anonymous(this="least", expressions=[inside, exp.Literal.number(grid.buckets)]), "BIGINT")


# How the rows are grouped: (rows, measures, extra columns) -> SELECT keys, extra, measures ... GROUP BY keys and
# extra (passes.grouped: with the coded keys decoded, and the grouping sets of a query with ROLLUP or CUBE).
Grouper = Callable[[exp.Expression, list[exp.Expression], tuple[exp.Expression, ...]], exp.Select]


def bucket_counts(bounded: exp.Select, keys: Sequence[str], argument: exp.Expression, grid: Grid,
                  grouper: Grouper | None = None) -> exp.Select:
    """SELECT keys, bucket, COUNT(*) over the bounded rows, grouped by both (one row per occupied bucket); grouped by
    `grouper` when given (it selects the keys itself)."""
    counted = (exp.select("*", exp.alias_(bucket_of(argument, grid), BUCKET))
               .from_(exp.Subquery(this=bounded.copy(), alias=exp.TableAlias(this=exp.to_identifier(names.BOUNDED))))
               .where(argument.copy().is_(exp.null()).not_()))
    source, measures = counted.subquery(names.BOUNDED), [exp.alias_(exp.Count(this=exp.Star()), ROWS)]
    if grouper is not None:
        return grouper(source, measures, (exp.column(BUCKET),))
    columns = [*(exp.column(key) for key in keys), exp.column(BUCKET)]
    return exp.select(*columns, *measures).from_(source).group_by(*[c.copy() for c in columns])


def vector(buckets: dict | None, grid: Grid) -> list[int]:
    """A group's {bucket: rows} (release/cells.with_buckets; None for a group with no non-NULL value) as one count
    per candidate."""
    counts = [0] * grid.candidates
    for bucket, rows in (buckets or {}).items():
        counts[int(bucket)] += int(rows)
    return counts


def count_vectors(rows: Iterable[Sequence[Any]], keys: int, grid: Grid) -> dict[tuple, list[int]]:
    """The engine's (keys..., bucket, rows) result as one count per candidate for each group seen.

    Which groups are released (public keys, partition selection) is the planner's business, as for every other
    aggregate; a public group with no row gets all zeros from the caller."""
    vectors: dict[tuple, list[int]] = {}
    for row in rows:
        key, bucket, count = tuple(row[:keys]), int(row[keys]), int(row[keys + 1])
        vectors.setdefault(key, [0] * grid.candidates)[bucket] += count
    return vectors
