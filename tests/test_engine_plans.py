"""The engine's physical plans keep analyst code inside its TRY (issue 7, class 2).

DuckDB's optimizer used to move analyst expressions out of the TRY the rewrite put around them: the IN-list rewrite
(`e IN (c1, ..., cn)` became a MARK join on `e`) and common-subexpression elimination (an expression used twice in
a projection was computed once, below it). The engine switches those rules off (engine.DISABLED_OPTIMIZERS). These
tests read the physical plans (EXPLAIN) of bounded queries of the shapes that triggered them, so that a DuckDB
upgrade that renames a rule, or adds one that hoists, fails here rather than in production.

Every analyst expression below is built from `lower(s)` or `upper(s)`, which nothing in dpsql's own SQL uses: an
occurrence of either in the plan outside a `TRY(...)` is analyst code that escaped.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from benchmarks.attacks.differential import Grammar, open_worlds
from benchmarks.support import create_ledger, write_csv, write_policy
from dpsql.engines import duckdb_engine as engine
from dpsql.errors import Error
from dpsql.session import PrivateSession

MARKERS = ("lower(", "upper(")
GENERATED, GENERATED_SEED = 150, 3
L, U = "lower(s)", "upper(s)"
QUERIES = (
    f"SELECT COUNT(*) FROM t WHERE CASE WHEN b THEN {L} IN ('a', 'b', 'c', 'd', 'e', 'f') ELSE false END",
    f"SELECT COUNT(*) FROM t WHERE NOT ({L} IN ('a', 'b', 'c', 'd', 'e', 'f'))",
    f"SELECT COUNT(*) FROM t WHERE {L} IN ('a', 'b', 'c', 'd', 'e', 'f') OR n > 5",
    f"SELECT COUNT({L} || 'a'), COUNT({L} || 'b') FROM t",
    f"SELECT COUNT(CASE WHEN length({L}) > 2 THEN {L} END) FROM t",
    f"SELECT COUNT(*) FROM t WHERE {L} || 'a' = 'xa' OR {L} || 'b' = 'xb'",
    f"SELECT g, COUNT({U} || 'a'), SUM(CASE WHEN {U} = 'X' THEN n ELSE 0 END) FROM t "
    f"WHERE {U} IN ('A', 'B', 'C', 'D', 'E', 'F', 'G') GROUP BY g",
    f"SELECT SUM(CASE WHEN {L} = 'a' THEN n ELSE 0 END), AVG(CASE WHEN {L} = 'b' THEN x END) FROM t",
    f"SELECT COUNT(DISTINCT uid) FROM t WHERE coalesce({L}, 'q') <> 'z' AND coalesce({L}, 'r') <> 'y'",
    # the per-group cap (the policy bounds groups and rows per group) partitions by the analyst's keys
    f"SELECT {L} || 'k' AS k, COUNT(*), SUM(n) FROM t WHERE {U} <> 'Q' GROUP BY k",
    # a quantile's rows per candidate come from a query of their own, planned and checked like the main one
    f"SELECT g, MEDIAN(CASE WHEN {L} = 's1' THEN x END), MAX(n), COUNT(*) FROM t WHERE {U} <> 'Q' GROUP BY g",
)


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("plans")
    write_csv(folder / "t.csv", ["uid", "g", "s", "n", "x", "b"],
              [(i // 2, "ab"[i % 2], f"s{i % 50}", i % 10, (i % 7) / 2, i % 3 == 0) for i in range(4000)])
    columns = {"uid": {"type": "int"}, "g": {"type": "text", "values": ["a", "b"]}, "s": {"type": "text"},
               "n": {"type": "int", "lower": 0, "upper": 10}, "x": {"type": "float", "lower": 0, "upper": 5},
               "b": {"type": "bool"}}
    return create_ledger(write_policy(folder / "policy.toml", {"t": {
        "source": "t.csv", "privacy_unit": "uid", "max_rows_per_unit": 2, "max_groups_per_unit": 2,
        "max_rows_per_group": 1, "columns": columns}}))


def bounded_plans(session: PrivateSession, prepared: Any) -> list[Any]:
    """The physical plans of every query a private query runs on the data: the bounded one and each quantile's."""
    texts = [prepared.bounded.sql, *(sql for _, sql in prepared.bounded.buckets)]
    return [node for sql in texts for node in _as_list(json.loads(session.engine.physical_plan(sql)))]


def _as_list(plan: Any) -> list[Any]:
    return plan if isinstance(plan, list) else [plan]


def plans(policy: Path) -> list[Any]:
    session = PrivateSession(policy, "plans")
    try:
        return [bounded_plans(session, session.prepare(sql)) for sql in QUERIES]
    finally:
        session.close()


def escapes(plan: Any) -> list[str]:
    """Every reason `plan` (EXPLAIN FORMAT JSON) shows analyst code outside its TRY: a join (dpsql never joins, so
    one can only come from a rewrite such as IN to MARK join), or a marker function outside any TRY(...)."""
    found = []
    for node in _nodes(plan):
        if "JOIN" in str(node.get("name", "")).upper():
            found.append(f"operator {node['name']}")
        for text in _texts(node.get("extra_info", {})):
            found += [f"{node.get('name')}: {text}" for marker in MARKERS if _outside_try(text.lower(), marker)]
    return found


def _nodes(plan: Any):
    for node in plan if isinstance(plan, list) else [plan]:
        yield node
        yield from _nodes(node.get("children", []))


def _texts(info: Any):
    if isinstance(info, str):
        yield info
    elif isinstance(info, list):
        for item in info:
            yield from _texts(item)
    elif isinstance(info, dict):
        for value in info.values():
            yield from _texts(value)


def _outside_try(text: str, marker: str) -> bool:
    """Whether some occurrence of `marker` in `text` is not nested in a `try(` call."""
    start = text.find(marker)
    while start >= 0:
        open_calls = []  # the text before each '(' still open at `start`
        for i, char in enumerate(text[:start]):
            if char == "(":
                open_calls.append(text[max(0, i - 3):i])
            elif char == ")" and open_calls:
                open_calls.pop()
        if "try" not in open_calls:
            return True
        start = text.find(marker, start + 1)
    return False


def test_the_hoisting_rules_are_off_and_locked(policy: Path) -> None:
    session = PrivateSession(policy, "plans")
    try:
        con = session.engine._con
        disabled = con.execute("SELECT current_setting('disabled_optimizers')").fetchone()[0]
        assert set(engine.DISABLED_OPTIMIZERS) <= set(disabled.split(","))
        with pytest.raises(Exception, match="locked"):
            con.execute("SET disabled_optimizers = ''")
    finally:
        session.close()


@pytest.fixture(scope="module")
def engine_plans(policy: Path) -> list[Any]:
    return plans(policy)


@pytest.mark.parametrize("index", range(len(QUERIES)), ids=QUERIES)
def test_no_analyst_code_leaves_its_try_in_the_physical_plan(engine_plans: list[Any], index: int) -> None:
    assert escapes(engine_plans[index]) == [], json.dumps(engine_plans[index], indent=1)


HOISTED = Path(__file__).parent / "fixtures" / "plans_hoisted_duckdb_2_0_0.json"


def test_the_plan_check_sees_the_rewrites_when_they_are_on() -> None:
    """The check above can fail: on the physical plans DuckDB 2.0.0 made of these very queries with its default
    optimizers (recorded in tests/fixtures), it finds the MARK join and the hoisted subexpressions. DuckDB 2.0.1 no
    longer rewrites inside TRY at all (same plan format, the rewrites just do not happen), so live plans with the
    optimizers on would no longer show that the check has teeth; the recorded ones do, on any version."""
    recorded = json.loads(HOISTED.read_text())
    flagged = {sql: escapes(plan) for sql, plan in recorded.items()}
    assert all(flagged.values()), flagged
    assert any("operator HASH_JOIN" in reason for reasons in flagged.values() for reason in reasons), flagged
    assert len(flagged) >= 4 and set(flagged) <= set(QUERIES)


def test_live_plans_with_the_optimizers_on_are_checked_the_same_way(policy: Path, monkeypatch) -> None:
    """On a DuckDB that still hoists out of TRY (2.0.0 did), the live plans are flagged as the recorded ones are;
    on one that does not, no plan may be flagged for any other reason either."""
    monkeypatch.setitem(engine._STARTUP_CONFIG, "disabled_optimizers", "")
    live = dict(zip(QUERIES, (escapes(plan) for plan in plans(policy)), strict=True))
    recorded = set(json.loads(HOISTED.read_text()))
    assert {sql for sql, reasons in live.items() if reasons} <= recorded, live


@pytest.mark.slow  # about 2 s: every generated query's plan read
def test_no_generated_query_plans_a_join(tmp_path: Path) -> None:
    """The differential fuzzer's accepted queries (IN lists, CASE, shared subexpressions in every position): dpsql
    never joins, so a join in a physical plan can only be a rewrite of analyst code such as IN to a MARK join."""
    worlds = open_worlds(tmp_path, GENERATED_SEED, themes=())
    grammar = Grammar(random.Random(GENERATED_SEED))
    session = worlds.sessions["base"]
    joins, planned = [], 0
    try:
        for _ in range(GENERATED):
            sql, _expression = grammar.query()
            try:
                prepared = session.prepare(sql, epsilon=1.0)
            except Error:
                continue
            planned += 1
            joins += [sql for node in _nodes(bounded_plans(session, prepared))
                      if "JOIN" in str(node.get("name", "")).upper() or "CROSS" in str(node.get("name", "")).upper()]
    finally:
        worlds.close()
    assert planned >= GENERATED // 2
    assert joins == []
