"""How much slower one row can make a query: the per-row cost model of dpsql/analysis/typecheck.py, measured.

A table of `rows` rows where one row holds a text of the default maximum length (policy.DEFAULT_MAX_LENGTH) and
the others a single character. Each expression is reached only on that row (`CASE WHEN i = <row> THEN ... END` in
the filter); the query's time with the row reaching it and with no row reaching it (best of `repeats`, one thread)
gives the slowdown one row causes. ACCEPTED are among the costliest expressions the checker admits (near its
bounds); GROWING are expressions whose text grows with nesting, which the checker now refuses: they are run raw,
as the build before the cost model ran them (inside TRY), to show what the bound prevents.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import duckdb
import sqlglot

from benchmarks.attacks.script import options
from dpsql.analysis.typecheck import typed_expression
from dpsql.errors import QueryRejected
from dpsql.policy import DEFAULT_MAX_LENGTH, ColumnPolicy, ColumnType

COLUMNS = {"i": ColumnPolicy("i", ColumnType.INT),
           "t": ColumnPolicy("t", ColumnType.TEXT, max_length=DEFAULT_MAX_LENGTH)}
_NINE = "'aaaaaaaaa'"
ACCEPTED = (
    f"replace(replace(t, 'a', {_NINE}), 'a', {_NINE}) LIKE '%b%'",
    f"strpos(replace(t, 'a', {_NINE}), '{'a' * 90}b') > 0", f"t ILIKE '%{'a_' * 450}b'",
    f"replace(t, 'a', {_NINE}) LIKE '%a_a%{'a' * 80}b'",
    "concat(" + ", ".join(["t"] * 99) + ") LIKE '%b%'",
    "length(concat(" + ", ".join(["t"] * 99) + ")) > 0 AND "
    + " AND ".join([f"strpos(replace(t, 'a', {_NINE}), 'aaaab') = 0"] * 10),
)


def _doubled(levels: int) -> str:
    text = "t"
    for _ in range(levels):
        text = f"concat({text}, {text})"
    return f"{text} LIKE '%b%'"


GROWING = (_doubled(12), f"replace(replace(replace(t, 'a', {_NINE}), 'a', {_NINE}), 'a', {_NINE}) LIKE '%b%'",
           f"replace(replace(t, 'a', {_NINE}), 'a', {_NINE}) ILIKE '%{'a_' * 50}b'")


@dataclass(frozen=True)
class Slowdown:
    expression: str
    cost: int | None  # the checker's bound; None when it refuses the expression
    with_row_ms: float
    without_row_ms: float

    def line(self) -> str:
        bound = f"cost bound {self.cost:>9}" if self.cost is not None else "refused now       "
        return (f"  {bound}: {self.with_row_ms:8.2f} ms with the row, {self.without_row_ms:6.2f} ms without "
                f"(+{self.with_row_ms - self.without_row_ms:.2f} ms, x{self.with_row_ms / self.without_row_ms:.1f})"
                f"  {self.expression[:60]}")


def measure(expression: str, con: duckdb.DuckDBPyConnection, repeats: int) -> Slowdown:
    node = sqlglot.parse_one(expression, read="duckdb")
    try:
        typed = typed_expression(node, COLUMNS, "row cost")
        sql, cost = typed.node.sql("duckdb"), typed.cost
    except QueryRejected:
        sql, cost = f"TRY({node.sql('duckdb')})", None

    def best(target: int) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            con.execute(f"SELECT count(*) FROM t WHERE CASE WHEN i = {target} THEN {sql} ELSE false END").fetchall()
            times.append(time.perf_counter() - start)
        return min(times) * 1000

    return Slowdown(expression, cost, best(0), best(-1))


def main() -> None:
    args = options(__doc__, rows=1000, repeats=7)
    con = duckdb.connect(":memory:")
    con.execute("SET threads = 1")
    con.execute(f"CREATE TABLE t AS SELECT range AS i, CASE WHEN range = 0 THEN repeat('a', {DEFAULT_MAX_LENGTH}) "
                f"ELSE 'x' END AS t FROM range({args.rows})")
    print(f"row cost: {args.rows} rows, one with {DEFAULT_MAX_LENGTH} characters; best of {args.repeats}")
    for expression in (*ACCEPTED, *GROWING):
        print(measure(expression, con, args.repeats).line())
    con.close()


if __name__ == "__main__":
    main()
