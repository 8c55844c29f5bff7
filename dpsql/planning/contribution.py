"""What one privacy unit can do to the vector of a query's cells, in rows, from the contribution bounds.

The rewrite keeps at most m rows per unit in the whole query. With the policy's per-group bounds (a single-table
query with GROUP BY: rewrite/passes.cap_rows_per_group), it also keeps at most k groups per unit and r rows per
group. One unit then puts c_g rows in group g with c_g <= r, at most k of the c_g non-zero, and sum c_g <= m:

- L1 (Laplace): sum c_g <= min(m, k r);
- L2 (Gaussian): sum c_g^2 is largest with as many groups full as fit, min(k, m // r) groups of r rows plus the
  rest of m in one more group if k allows: sqrt(k) r when k r <= m, against m with no per-group bound;
- groups reached: at most min(m, k, the number of groups), each by one unit of COUNT(DISTINCT unit).

Without per-group bounds r = m and k = m: L1 = m, L2 = m (all of a unit's rows may fall in one group). With G
grouping sets (ROLLUP, CUBE) each row counts once in each grouping: m is G m, k is G m and r is m, so L1 = G m and
L2 = sqrt(G) m; the policy's per-group bounds are not enforced there.
"""

from __future__ import annotations

from dataclasses import dataclass

from dpsql.analysis.check import CheckedQuery


@dataclass(frozen=True)
class Contribution:
    max_rows: int  # m
    groups: int  # k: groups one unit can reach
    rows_per_group: int  # r
    per_group_enforced: bool  # whether the rewrite enforces k and r (else they are m)

    @property
    def l1(self) -> int:
        return min(self.max_rows, self.groups * self.rows_per_group)

    @property
    def l2_squared(self) -> int:
        full = min(self.groups, self.max_rows // self.rows_per_group)
        rest = self.max_rows - full * self.rows_per_group if full < self.groups else 0
        return full * self.rows_per_group**2 + rest**2

    def reach(self, cells: int | None) -> int:
        """How many groups one unit's rows can reach: at most one unit of COUNT(DISTINCT unit) in each."""
        bound = min(self.max_rows, self.groups)
        return min(bound, cells) if cells is not None else bound

    def allocations(self) -> list[tuple[tuple[int, int], ...]]:
        """The ways a unit can spread its rows that partition selection must survive, each as (groups, rows in each)
        pairs: for each number of groups j, as many groups full (r rows) as its m rows allow with at least one row in
        each of the others. A sum of a convex tail over the groups is largest at such a peaked allocation, so these
        bound every other."""
        found = []
        step = self.rows_per_group - 1
        for j in range(1, min(self.groups, self.max_rows) + 1):
            extra = self.max_rows - j  # rows beyond one per group
            full = min(j, extra // step) if step else j  # r = 1: every group holds one row
            rest = extra - full * step if full < j else 0
            parts = [(full, self.rows_per_group)] + ([(1, 1 + rest)] if full < j else []) + \
                [(max(0, j - full - 1), 1)]
            found.append(tuple((count, rows) for count, rows in parts if count))
        return found


def contribution(query: CheckedQuery) -> Contribution:
    bound = query.table.bound
    m = bound.max_rows
    if query.groupings:
        # G groupings (analysis/grouping_sets.py): each row falls in one group of each, so a unit is G m rows with at
        # most m in any one group: L1 G m, L2 sqrt(G) m, at most min(m, groups) groups of each grouping reached.
        g = len(query.groupings)
        return Contribution(g * m, g * m, m, False)
    enforced = bool(query.keys) and query.relation is None and bound.per_group
    if not enforced:
        return Contribution(m, m, m, False)
    return Contribution(m, bound.max_groups or m, bound.max_rows_per_group or m, True)
