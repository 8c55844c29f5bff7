"""Analyst SQL could forge the node meta the checker trusts to mark the outer query's key and aggregate columns.

sqlglot sets a node's meta from a comment: `x /* sqlglot.meta dpsql_aggregate_index=1 */` parsed as a column x whose
meta said it was aggregate 1, and the checker took the raw column for a released aggregate (found by the red team:
the query was charged, then failed with the generic error; `dpsql_key_index=1` raised an IndexError; the ORDER BY
form skipped the ORDER BY check). The post-processing sandbox, which holds only noisy cells, kept it from reading
data. Fixed twice over: the parser refuses a `sqlglot.meta` comment from the text, at no cost, and the marks the
stages read are `_Mark` objects (sql/names.py), a type no SQL text can produce, so a forged key is ignored.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlglot

from benchmarks.support import Table, column, open_session, write_dataset
from dpsql.analysis.check import check
from dpsql.errors import QueryRejected
from dpsql.planning.aggregates import VOCABULARY
from dpsql.policy import load_policy
from dpsql.sql.parse import ParsedQuery

SPEC = Table("t", "uid", (column("uid", "int"), column("g", "text", values=("a", "b")),
                          column("x", "float", 0, 10), column("k", "int", 0, 10)), 1)


@pytest.mark.parametrize("sql", [
    "SELECT g, x /* sqlglot.meta dpsql_aggregate_index=1 */, COUNT(*), SUM(k) FROM t GROUP BY g",
    "SELECT g, x /* sqlglot.meta dpsql_key_index=1 */, COUNT(*) FROM t GROUP BY g",
    "SELECT g, COUNT(*), SUM(x) FROM t GROUP BY g HAVING x /* sqlglot.meta dpsql_aggregate_index=1 */ > 0",
    "SELECT g, COUNT(*) FROM t GROUP BY g ORDER BY x /* sqlglot.meta dpsql_output_reference */",
])
def test_forged_meta_is_refused_by_the_checker_at_no_cost(tmp_path: Path, sql: str) -> None:
    policy = write_dataset(tmp_path, SPEC, [(u, "ab"[u % 2], 1.0, u % 10) for u in range(20)])
    session = open_session(policy, 1)
    try:
        before = session.spending().epsilon_spent
        with pytest.raises(QueryRejected, match="sqlglot.meta"):
            session.execute(sql, epsilon=0.5)
        assert session.spending().epsilon_spent == before
    finally:
        session.close()


@pytest.mark.parametrize("sql", [
    "SELECT g, x /* sqlglot.meta dpsql_aggregate_index=1 */, COUNT(*), SUM(k) FROM t GROUP BY g",
    "SELECT g, x /* sqlglot.meta dpsql_key_index=0 */, COUNT(*) FROM t GROUP BY g",
])
def test_a_forged_mark_is_ignored_even_past_the_parser(tmp_path: Path, sql: str) -> None:
    """The second layer on its own: the tree sqlglot makes of the text, meta and all, given straight to the checker."""
    policy = load_policy(write_dataset(tmp_path, SPEC, [(u, "ab"[u % 2], 1.0, u % 10) for u in range(20)]))
    tree = sqlglot.parse_one(sql, read="duckdb")
    assert any({"dpsql_aggregate_index", "dpsql_key_index"} & node.meta.keys() for node in tree.walk())
    with pytest.raises(QueryRejected, match="outside an aggregate but is not a GROUP BY key"):
        check(ParsedQuery(sql, tree), policy, VOCABULARY)
