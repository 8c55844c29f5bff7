"""Public tables: declared `public = true`, read as written, free, exact; never a way to private rows."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks.support import seeded
from dpsql.errors import PolicyError, ProgrammingError, QueryRejected
from dpsql.policy import load_policy
from dpsql.session import PrivateSession
from tests.conftest import SAMPLE, VISITS_FILES


@pytest.fixture
def session(visits_policy: Path):
    session = PrivateSession(visits_policy, "tester", rng=seeded(3), bounding_seed=5)
    yield session
    session.close()


def test_a_query_of_public_tables_runs_as_written_and_costs_nothing(session) -> None:
    rows = session.execute("SELECT * FROM regions ORDER BY population").rows
    assert rows[0] == ("east", 560000, False) and len(rows) == 5
    joined = session.execute("SELECT d.specialty_group, SUM(d.beds) AS beds, COUNT(*) FROM departments d "
                             "JOIN departments e ON d.department = e.department GROUP BY 1 ORDER BY 1")
    assert joined.rows == [("emergency", 30, 1), ("medical", 210, 6), ("surgical", 35, 1)]
    assert [c.name for c in joined.columns] == ["specialty_group", "beds", "count_star()"]
    assert not any(c.noisy for c in joined.columns) and joined.cost.epsilon == 0 and joined.cost.delta == 0
    with_cte = session.execute("WITH u AS (SELECT region FROM regions WHERE urban) SELECT COUNT(*) FROM u").rows
    assert with_cte == [(3,)]
    assert session.spending("tester").queries == 0 and session.history("tester") == []  # no ledger entry


@pytest.mark.parametrize(("sql", "error", "message"), [
    ("SELECT * FROM regions r JOIN __dp_visits v ON true", ProgrammingError, "unknown table"),
    ("SELECT * FROM regions WHERE region IN (SELECT region FROM visits)", QueryRejected, "subqueries"),
    ("SELECT current_setting('threads') FROM regions", QueryRejected, "vetted SQL functions"),
    ("SELECT * FROM regions, read_csv('visits.csv')", QueryRejected, "private table first|table functions"),
    ("SELECT * FROM main.regions", QueryRejected, "schema"),
    # a CTE named like a loaded table, in an inner scope: the outer reference would be the private table
    ("SELECT * FROM (WITH __dp_visits AS (SELECT * FROM regions) SELECT * FROM __dp_visits) a, __dp_visits b",
     QueryRejected, "reserved"),
])
def test_public_queries_reach_no_private_row(session, sql, error, message) -> None:
    with pytest.raises(error, match=message):
        session.execute(sql)
    assert session.spending("tester").queries == 0


def test_facts_are_read_from_public_tables_only(session) -> None:
    facts = session.engine.public_facts()
    assert facts.max_rows_per_key("regions", ("urban",)) == 3
    assert facts.column("departments", "specialty_group").values == ("emergency", "medical", "surgical")
    assert facts.column("departments", "beds").lower == 10
    with pytest.raises(ValueError, match="not a public table"):
        facts.max_rows_per_key("visits", ("region",))


def test_a_public_columns_facts_are_kept_whole_and_a_private_tables_never_asked(session) -> None:
    # The check asks for them on every query (engines/public_facts.py keeps the facts, not only their rows).
    facts = session.engine.public_facts()
    assert facts.column("departments", "beds") is facts.column("departments", "beds")
    assert facts.max_rows_per_key("regions", ("urban",)) == facts.max_rows_per_key("regions", ("urban",)) == 3
    for _ in range(2):  # refused each time: a refusal is never kept
        with pytest.raises(ValueError, match="not a public table"):
            facts.column("visits", "age")
        with pytest.raises(ValueError, match="not a public table"):
            facts.max_rows_per_key("visits", ("region",))


@pytest.mark.parametrize("key", ['privacy_unit = "region"', "max_rows_per_unit = 2", "row_privacy = true",
                                 'unit = "x"'])
def test_a_public_table_declares_no_unit_or_bound(tmp_path: Path, key: str) -> None:
    for name in VISITS_FILES:
        shutil.copy(SAMPLE / name, tmp_path / name)
    policy = tmp_path / "visits.toml"
    policy.write_text(policy.read_text().replace("[tables.regions]\n", f"[tables.regions]\n{key}\n"))
    with pytest.raises(PolicyError, match="a public table has no privacy unit"):
        load_policy(policy)


def test_public_queries_run_in_a_database_without_private_tables(session) -> None:
    """Defence in depth: whatever got past the public query's checks finds no private row where it runs."""
    tables = {row[0] for row in session.engine._public[0].execute("SHOW TABLES").fetchall()}
    assert tables == {"__dp_departments", "__dp_regions"}
    assert session.execute("SELECT COUNT(*) FROM departments").rows == [(8,)]


def test_without_public_tables_no_public_database_is_opened_until_needed(pums_session) -> None:
    """A DuckDB instance costs about 25 MB and 20 ms of every CLI process: a policy without public tables opens
    its public database only if a query of public tables ever comes (none can name a table, so none today)."""
    engine = pums_session.engine
    assert engine._public is None
    assert engine.run_public("SELECT 42 AS answer") == (["answer"], ["INTEGER"], [(42,)])
    public, _ = engine._public
    assert public.execute("SHOW TABLES").fetchall() == []
    assert public.execute("SELECT current_setting('enable_external_access')").fetchone() == (False,)


def test_whether_a_query_is_free_is_known_without_a_parse_once_it_was_asked(session) -> None:
    """The server decides on its event loop, by a lookup, which turns a query takes once a Describe classified it:
    unknown before, then what the parse decided, per text and parameters."""
    public = "SELECT department FROM departments WHERE floor > ?"
    private = "SELECT COUNT(*) FROM visits WHERE age > ?"
    assert session.known_public_only(public, [1]) is None
    assert session.known_public_only(private, [1]) is None
    session.describe(public, [1])
    assert session.reads_public_only(private, [1]) is False
    assert session.known_public_only(public, [1]) is True
    assert session.known_public_only(private, [1]) is False
    assert session.known_public_only(public, [2]) is None  # other parameters: not asked yet
    assert session.reads_public_only("SELECT FROM WHERE") is False  # refused by execute, in a private turn
