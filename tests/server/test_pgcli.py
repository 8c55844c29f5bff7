"""pgcli, through its own Python API: its start-up (server version, time zone), its special commands (\\dt, \\d,
\\dn, \\l, \\df) and its completion refresher, which reads every schema, table, column, function and type, then a
grouped private query. Only the private query is charged."""

from __future__ import annotations

import pytest
from pgcli.completion_refresher import CompletionRefresher
from pgcli.pgcompleter import PGCompleter
from pgcli.pgexecute import PGExecute
from pgspecial.main import PGSpecial
from prompt_toolkit.document import Document

from tests.server.conftest import PASSWORDS, charges


@pytest.fixture
def executor(served):
    connected = PGExecute("visits", "alice", PASSWORDS["alice"], "127.0.0.1", served.port, "", sslmode="disable")
    yield connected
    connected.conn.close()


def _run(executor: PGExecute, command: str) -> tuple[list[str], list[tuple]]:
    (_, cursor, headers, _, *_), = executor.run(command, pgspecial=PGSpecial())
    return list(headers or []), [tuple(row) for row in cursor] if cursor is not None else []


def test_pgcli_starts_and_its_special_commands_show_the_policys_tables(served, executor) -> None:
    before = charges(served.policy)
    assert executor.server_version == "16.0" and executor.dbname == "visits"
    assert executor.get_timezone() == "UTC"
    executor.set_timezone("Europe/Paris")  # pgcli sets the machine's zone at start
    assert executor.get_timezone() == "Europe/Paris"
    headers, rows = _run(executor, "\\dt")
    assert headers == ["Schema", "Name", "Type", "Owner"]
    assert [row[:3] for row in rows] == [("public", name, "table") for name in ("departments", "patients",
                                                                                 "regions", "visits")]
    _, rows = _run(executor, "\\d visits")
    assert [(name, kind, modifiers.strip()) for name, kind, modifiers in rows] == [
        ("patient_id", "bigint", ""), ("visit_date", "date", ""), ("region", "character varying(1000)", ""),
        ("department", "character varying(1000)", ""), ("age", "bigint", "not null"),
        ("sex", "character varying(1000)", ""), ("smoker", "boolean", ""), ("cost", "double precision", ""),
        ("length_of_stay", "bigint", "not null")]
    assert _run(executor, "\\dn")[1] == [("public", "dpsql")]
    assert [row[0] for row in _run(executor, "\\l")[1]] == ["visits"]
    assert _run(executor, "\\df")[1] == []
    assert charges(served.policy) == before


def test_pgcli_completes_tables_and_columns_from_the_catalog(served, executor) -> None:
    before = charges(served.policy)
    completers: list[PGCompleter] = []
    CompletionRefresher()._bg_refresh(executor, PGSpecial(), completers.append, settings={"single_connection": True})
    (completer,) = completers
    tables = {c.text for c in completer.get_completions(Document("SELECT * FROM vi"), None)}
    assert "visits" in tables
    columns = {c.text for c in completer.get_completions(Document("SELECT r FROM visits", cursor_position=8), None)}
    assert "region" in columns
    assert executor.search_path() == ["pg_catalog", "public"]
    assert charges(served.policy) == before


def test_pgcli_runs_a_grouped_private_query_and_is_charged_once(served, executor) -> None:
    before = len(charges(served.policy))
    headers, rows = _run(executor, "SELECT sex, COUNT(*) AS n FROM visits WHERE age > 33 GROUP BY sex ORDER BY sex")
    assert headers == ["sex", "n"] and [row[0] for row in rows] == ["F", "M"]
    with pytest.raises(Exception, match="individual rows"):
        _run(executor, "SELECT * FROM visits")
    assert len(charges(served.policy)) == before + 1
