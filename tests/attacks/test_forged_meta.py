"""Analyst SQL can forge the node meta the checker trusts to mark the outer query's key and aggregate columns.

names.py: "A stage that needs to know *which* key or aggregate a column stands for reads it from the node's meta
(`AGGREGATE_INDEX`), set where the column was made". sqlglot also sets meta from a comment: `x /* sqlglot.meta
dpsql_aggregate_index=1 */` parses as a column x whose meta says it is aggregate 1 (the value reads as True).
The checker then takes a raw table column for a released aggregate (`_replace_private` lets it through), and
`ORDER BY x /* sqlglot.meta dpsql_output_reference */` skips the ORDER BY check altogether.

What saves privacy: post-processing runs in a DuckDB that holds only the noisy cells, so a raw column there fails to
bind, and the reserved columns (`__position`, `__a0_sd`) cannot be named because qualify() refuses columns the
policy does not declare. What goes wrong: the checker's claim is false, and the query below is *charged* and then
fails with the generic "could depend on the data" error (the plain projection indexes the cells with the forged
True), where the checker should have refused it at no cost; `dpsql_key_index=1` gives an internal IndexError.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.support import Table, column, open_session, write_dataset
from dpsql.errors import QueryRejected

SPEC = Table("t", "uid", (column("uid", "int"), column("g", "text", values=("a", "b")),
                          column("x", "float", 0, 10), column("k", "int", 0, 10)), 1)


@pytest.mark.parametrize("sql", [
    "SELECT g, x /* sqlglot.meta dpsql_aggregate_index=1 */, COUNT(*), SUM(k) FROM t GROUP BY g",
    "SELECT g, x /* sqlglot.meta dpsql_key_index=1 */, COUNT(*) FROM t GROUP BY g",
    "SELECT g, COUNT(*), SUM(x) FROM t GROUP BY g HAVING x /* sqlglot.meta dpsql_aggregate_index=1 */ > 0",
    "SELECT g, COUNT(*) FROM t GROUP BY g ORDER BY x /* sqlglot.meta dpsql_output_reference */",
])
@pytest.mark.xfail(strict=True, reason="a sqlglot.meta comment forges the meta that marks key/aggregate columns: "
                                       "the checker lets a raw column through (caught later by the post-processing "
                                       "sandbox, or charged and failed, or an IndexError)")
def test_forged_meta_is_refused_by_the_checker_at_no_cost(tmp_path: Path, sql: str) -> None:
    policy = write_dataset(tmp_path, SPEC, [(u, "ab"[u % 2], 1.0, u % 10) for u in range(20)])
    session = open_session(policy, 1)
    try:
        before = session.spending().epsilon_spent
        with pytest.raises(QueryRejected, match="outside an aggregate|not a GROUP BY key"):
            session.execute(sql, epsilon=0.5)
        assert session.spending().epsilon_spent == before
    finally:
        session.close()
