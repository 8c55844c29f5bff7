"""What one person's rows can make a query do: a static bound on the work of a whole privacy unit.

Why. The noise hides what one person does to an answer; it does not hide how long the answer took. The row cost of
typecheck.py bounds what one *row* can cost, but joins, per-unit subqueries, the bucket queries of quantiles and the
filtered cap multiply the rows of one person, and a filter on one person (`pid = 7 AND <secret condition>`) lets only
that person's rows multiply: a self-join chained seven times made one person's 5 rows 78,125, and a costly argument
on them made the query 20-50 times slower exactly when the secret condition held. The bound that matters is the
work of a whole person: the rows one person can have at each stage of the bounded query, times the cost of
everything evaluated on them, over every time the engine reads them. It is decided from the SQL and the policy
alone, before anything is charged, so a refusal says nothing about the data.

The model, in typecheck's units of work (about one per character touched; every figure an upper bound that holds
whatever the data):
- rows: one person has at most m_i rows of a private table that any analyst code sees (the rewrite evaluates a
  filter only on rows ranked within the cap: rewrite/bounding.py), at most m = prod(m_i) * prod(k_j) joined rows
  after the joins (relation.py), one row after a per-unit subquery; a single table's filtered cap reads at most
  `examined` rows of each person and runs the filter `filter_runs` times on them;
- every stage a row passes through (scan, filter, projection, aggregate) costs ROW units, every row a join outputs
  JOIN units; an analyst expression costs its typecheck cost on every row it may see (the WHERE on the rows it
  filters, keys and aggregate arguments on the kept rows; COUNT(DISTINCT) also hashes its value);
- each quantile argument reads the bounded rows again (its bucket query): all of the above runs once per pass;
- Python's partition selection draws one noise for each candidate group, and one person adds at most m of them
  (with public keys the groups are the declared ones, whatever the data).
The total is compared with the policy's bound, `max_person_slowdown` times QUERY_FLOOR: the work every query costs
whatever the data. A query is never cheaper than that, so with any one person it takes at most about
(1 + max_person_slowdown) times as long as without them. The filtered cap's look-ahead is what is left of the bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dpsql.errors import QueryRejected
from dpsql.policy import WorkLimits

# The work of the smallest query whatever the data (parse to answer, about 1 ms on the 2-core reference machine:
# `python -m benchmarks.attacks.person_work` measures it beside the units' own time).
QUERY_FLOOR = 500_000
ROW = 4  # one row through one stage of the bounded query (measured: 2-8 ns per row and stage)
JOIN = 8  # one row a join outputs (measured: 7-9 ns per joined row)
DRAW = 2_500  # one noise draw in Python (measured: about 5 us)
# A candidate group of partition selection: its selection count's noise and its cells in Python (about 8 us a
# group, measured over 10,000), its group in the engine and its row fetched (1-3 us): about 10 us, 5,000 units.
# (At 3,000, fifteen groups of one person told the secret in 42 of 48 rounds at the bound, counting DuckDB's fixed
# cost of a vector flowing: benchmarks/attacks/person_timing.py --bound 1, "candidate groups".)
CANDIDATE = 5_000
# One row the filtered cap ranks past the lists (its window: a sort and a running count per person), measured
# about 200 ns a row by benchmarks/attacks/person_work.py (its "cheap filter, long look-ahead").
WINDOW = 100
LISTED = 4  # rewrite/bounding.LISTED_DEPTH: the later rows whose earlier rows' values are listed beside them
MAX_EXAMINED = 1_000_000  # the filtered cap's look-ahead never exceeds this many rows per person


@dataclass(frozen=True)
class WorkTerm:
    """One part of a person's work: `what` runs on at most `rows` rows of one person, at most `units` each."""

    what: object  # a text, or what renders as one when shown (check.ReadableText: a filter kept as its tree)
    rows: int
    units: int

    @property
    def total(self) -> int:
        return self.rows * self.units


@dataclass(frozen=True)
class PersonWork:
    """The most work one person's rows can cause in one query, and the bound it was checked against."""

    terms: tuple[WorkTerm, ...]  # the engine's, once per pass
    passes: int  # how many times the engine reads the bounded rows: 1 + one bucket query per quantile argument
    limit: int
    examined: int | None = None  # single table with a filter: the rows of one person the filtered cap may read
    release: tuple[WorkTerm, ...] = ()  # Python's, once

    @property
    def total(self) -> int:
        return self.passes * sum(term.total for term in self.terms) + sum(term.total for term in self.release)

    @property
    def largest(self) -> WorkTerm:
        return max((*self.terms, *self.release), key=lambda term: term.total)

    def describe(self) -> str:
        share = self.total / QUERY_FLOOR
        return (f"at most {self.total:,} units of work for one person's rows ({share:.2g}x the fixed work of a "
                f"query; the policy allows {self.limit:,})")


def limit_of(limits: WorkLimits) -> int:
    return int(limits.max_person_slowdown * QUERY_FLOOR)


def join_terms(what: str, rows_before: int, rows_after: int) -> list[WorkTerm]:
    """A join stage: each of the person's rows so far probes the other table, and each joined row is output."""
    return [WorkTerm(what, rows_before, ROW), WorkTerm(what, rows_after, JOIN)]


def grouping_terms(groupings: int, aggregates: int) -> list[tuple[str, int]]:
    """GROUPING SETS: each row goes into the hash table of every grouping with its aggregates' states, where a plain
    GROUP BY has one: the groupings beyond the first, as an expression costing that much on each row."""
    if groupings <= 1:
        return []
    return [(f"aggregating each row into {groupings} groupings", (groupings - 1) * ROW * (2 + aggregates))]


def stage_terms(rows: int, filter_cost: int | None, filter_text: object,
                expressions: Sequence[tuple[str, int]]) -> list[WorkTerm]:
    """Rows through a filter (once on each), then through keys and aggregate arguments (`expressions`: their text
    and cost per row) and the stages that project and aggregate them."""
    terms = [WorkTerm("reading and aggregating the rows", rows, ROW * (3 + len(expressions)))]
    if filter_cost is not None:
        terms.append(WorkTerm(filter_text, rows, filter_cost))
    terms += [WorkTerm(text, rows, cost) for text, cost in expressions]
    return terms


def bound(terms: Sequence[WorkTerm], passes: int, limits: WorkLimits, groups: int = 0) -> PersonWork:
    """The person's work, refused when over the policy's bound. `groups`: the candidate groups one person can add
    to what Python's partition selection handles (each one noise draw: release/cells.py)."""
    release = (WorkTerm("selecting the groups one person adds", groups, CANDIDATE),) if groups else ()
    work = PersonWork(tuple(terms), passes, limit_of(limits), release=release)
    _refuse_over(work, limits)
    return work


def filter_runs(examined: int, m: int) -> int:
    """How often the filtered cap (rewrite/bounding.cap_rows) runs the filter on one person's rows when it reads
    `examined` of them: once on each of the first m; past them, on each of the LISTED later rows and on the values
    of every row listed before it; past those, once more on each row read and on the first m (the window's part)."""
    runs = m
    if examined > m:
        runs += sum(range(m + 1, m + LISTED + 1))
    if examined > m + LISTED:
        runs += examined + m
    return runs


def with_lookahead(terms: Sequence[WorkTerm], passes: int, limits: WorkLimits, filter_text: object, filter_cost: int,
                   m: int, groups: int = 0) -> PersonWork:
    """A single table's filtered cap: the rows it reads of one person (its look-ahead) are as many as the bound
    leaves room for, at least m (then it is the cap before the filter, each row filtered once)."""
    fixed = bound(terms, passes, limits, groups)
    room = (fixed.limit - fixed.total) // passes

    def read(examined: int) -> list[WorkTerm]:
        """The filter's runs, and past the lists the window that ranks the rows read."""
        ranked = [WorkTerm("ranking the rows the filter reads", examined, WINDOW)] if examined > m + LISTED else []
        return [WorkTerm(filter_text, filter_runs(examined, m), filter_cost), *ranked]

    def cost(examined: int) -> int:
        return sum(term.total for term in read(examined))

    examined = m
    if cost(m + LISTED + 1) <= room:
        examined = min(MAX_EXAMINED, m + LISTED + 1 + (room - cost(m + LISTED + 1)) // (filter_cost + WINDOW))
    elif cost(m + LISTED) <= room:
        examined = m + LISTED
    work = PersonWork((*fixed.terms, *read(examined)), passes, fixed.limit, examined, fixed.release)
    _refuse_over(work, limits)
    return work


def _refuse_over(work: PersonWork, limits: WorkLimits) -> None:
    if work.total <= work.limit:
        return
    largest = work.largest
    passes = (f", and the engine reads the rows {work.passes} times (once more for each quantile's argument)"
              if work.passes > 1 else "")
    raise QueryRejected(
        f"one person's rows could cost up to {work.total:,} units of work in this query, more than the policy "
        f"allows ({work.limit:,}: [engine] max_person_slowdown = {limits.max_person_slowdown:g} of a query's fixed "
        f"work), so its running time could tell about that person. The most: {largest.what}, on up to "
        f"{largest.rows:,} row(s) of one person at up to {largest.units:,} units each{passes}. Join fewer tables or "
        "on keys with fewer rows per value, or use cheaper expressions (shorter LIKE patterns, fewer text "
        "functions)")


__all__ = ["QUERY_FLOOR", "PersonWork", "WorkTerm", "bound", "grouping_terms", "join_terms", "limit_of",
           "stage_terms", "with_lookahead"]
