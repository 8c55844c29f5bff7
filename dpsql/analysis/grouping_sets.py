"""GROUP BY ROLLUP, CUBE and GROUPING SETS: several groupings of one query's rows, released together.

`GROUP BY ROLLUP (region, sex)` is the groupings (region, sex), (region) and (): one query's cells for each, a
rolled-up key NULL in its cells, as DuckDB returns them. The checker reads such a GROUP BY as the flat list of its
distinct keys and the groupings as index tuples into it (`flat_grouping_sets`, `grouping_indices`); the rewrite
groups by GROUPING SETS and adds DuckDB's GROUPING() of all the keys as a hidden last key, the grouping id, so that a
rolled-up NULL is never one of the data's NULLs.

Why the sensitivity holds (planning/contribution.py): each of a unit's m capped rows falls in exactly one group of
each grouping, so in each grouping one unit moves the cells by at most m in L1 (and its rows may all fall in one
group: m in L2), and over G groupings by at most G m in L1 and sqrt(G) m in L2 (no group of one grouping holds more
than m of its rows). That is the bound of a unit with G m rows at most m of which share a group: the planner calibrates
every measurement to it, whatever the split of the budget between groupings would be (with Laplace noise, G equal
shares of epsilon each at sensitivity m give the same noise as the whole epsilon at G m; with Gaussian noise the L2
bound sqrt(G) m is what G equal shares of rho give). Partition selection covers every way G m such rows can make
groups, and a unit reaches at most min(m, groups) groups of each grouping for COUNT(DISTINCT unit).
"""

from __future__ import annotations

import itertools

from sqlglot import exp

from dpsql.errors import QueryRejected
from dpsql.sql.parse import DIALECT

# The most groupings one query may release: each multiplies the noise of every cell (CUBE of five keys is 32).
MAX_GROUPINGS = 32
_SETS = (exp.Rollup, exp.Cube, exp.GroupingSets)


def flat_grouping_sets(tree: exp.Select) -> tuple[exp.Select, tuple[tuple[int, ...], ...]]:
    """The query with GROUP BY as the flat list of its distinct expressions, and each grouping as the positions in that
    list of the expressions it groups by; the query untouched and () when its GROUP BY has no grouping sets."""
    group = tree.args.get("group")
    if group is None or not any(isinstance(e, _SETS) for e in group.expressions):
        return tree, ()
    text = group.sql(DIALECT)
    flat: list[exp.Expression] = []

    def position(expression: exp.Expression) -> int:
        bare = expression.unnest() if isinstance(expression, exp.Paren) else expression
        if bare not in flat:
            flat.append(bare)
        return flat.index(bare)

    factors = [_sets(e, position, text) for e in group.expressions]  # each item of GROUP BY: its groupings
    groupings = [tuple(sorted(set(itertools.chain(*combination)))) for combination in itertools.product(*factors)]
    if len(groupings) > MAX_GROUPINGS:
        raise QueryRejected(f"{text}: {len(groupings)} groupings; at most {MAX_GROUPINGS} are released in one query "
                            "(each one adds the noise of another query to every cell)")
    if len(set(groupings)) != len(groupings):
        raise QueryRejected(f"{text}: a grouping is listed twice, and DuckDB would return its groups twice: list each "
                            "grouping once")
    if not flat:
        raise QueryRejected(f"{text}: no group key: ask the query without GROUP BY")
    tree = tree.copy()
    tree.set("group", exp.Group(expressions=[e.copy() for e in flat]))
    return tree, tuple(groupings)


def _sets(item: exp.Expression, position, text: str) -> list[tuple[int, ...]]:
    """The groupings one item of GROUP BY stands for, as positions in the flat list."""
    if isinstance(item, exp.Rollup):
        keys = [position(e) for e in item.expressions]
        return [tuple(keys[:n]) for n in range(len(keys), -1, -1)]
    if isinstance(item, exp.Cube):
        keys = [position(e) for e in item.expressions]
        return [tuple(k for k, keep in zip(keys, mask, strict=True) if keep)
                for mask in itertools.product((True, False), repeat=len(keys))]
    if isinstance(item, exp.GroupingSets):
        found: list[tuple[int, ...]] = []
        for member in item.expressions:
            if isinstance(member, _SETS):
                found += _sets(member, position, text)
            elif isinstance(member, exp.Tuple):
                found.append(tuple(position(e) for e in member.expressions))
            else:
                found.append((position(member),))
        return found
    if isinstance(item, exp.Tuple):
        return [tuple(position(e) for e in item.expressions)]
    return [(position(item),)]


def grouping_indices(tree: exp.Select, groupings: tuple[tuple[int, ...], ...],
                     keys: list[exp.Expression]) -> tuple[tuple[int, ...], ...]:
    """The groupings as indices of `keys` (the query's distinct keys once qualified: two positions may be one key)."""
    if not groupings:
        return ()
    flat = tree.args["group"].expressions
    indexed = tuple(tuple(sorted({keys.index(flat[p]) for p in grouping})) for grouping in groupings)
    if len(set(indexed)) != len(indexed):
        raise QueryRejected(f"GROUP BY {', '.join(k.sql(DIALECT) for k in keys)}: two groupings are one once their "
                            "keys are resolved, and DuckDB would return its groups twice: list each grouping once")
    return indexed


def grouping_ids(groupings: tuple[tuple[int, ...], ...], keys: int) -> tuple[int, ...]:
    """DuckDB's GROUPING() of all `keys` keys for each grouping: a bit per key, the first key the highest, set where
    the key is rolled up (not grouped by)."""
    return tuple(sum(1 << (keys - 1 - i) for i in range(keys) if i not in grouping) for grouping in groupings)


def grouping_bits(indices: list[int], keys: int, grouping_id: exp.Expression) -> exp.Expression:
    """GROUPING(k_i, k_j, ...) of the released groups, from their grouping id: DuckDB's bit for each named key, the
    first the highest, set where the key is rolled up."""
    def bit(i: int) -> exp.Expression:  # (id // 2^(keys - 1 - i)) % 2
        shifted = exp.IntDiv(this=grouping_id.copy(), expression=exp.Literal.number(1 << (keys - 1 - i)))
        return exp.paren(exp.Mod(this=exp.paren(shifted), expression=exp.Literal.number(2)))

    terms = [exp.Mul(this=bit(i), expression=exp.Literal.number(1 << (len(indices) - 1 - j)))
             for j, i in enumerate(indices)]
    total = terms[0]
    for term in terms[1:]:
        total = exp.Add(this=total, expression=term)
    return exp.paren(total)


__all__ = ["MAX_GROUPINGS", "flat_grouping_sets", "grouping_bits", "grouping_ids", "grouping_indices"]
