"""Golden cases for the bounded SQL (tests/fixtures/rewrite.sql), in the manner of sqlglot's optimizer fixtures.

Each case is a query and the SQL dpsql runs for it on the prepared table. They are compared as parsed trees,
not as text, so a change in sqlglot's spacing or parentheses is no failure; a change in what runs is. After an
intended change to the rewrite, regenerate the expected side and review the diff:

    DPSQL_UPDATE_GOLDEN=1 pytest tests/test_rewrite_golden.py && git diff tests/fixtures/rewrite.sql

The other tests hold the rewrite to its properties (rows capped, values clamped, answers right); this file shows
what a change does to the SQL of every query shape at once.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.support import open_session, sql_tree, write_csv, write_policy
from dpsql.session import PrivateSession
from dpsql.sql.parse import DIALECT

FIXTURE = Path(__file__).parent / "fixtures" / "rewrite.sql"
UPDATE = os.environ.get("DPSQL_UPDATE_GOLDEN") == "1"
_TITLE = "# title: "
_STATEMENT_END = re.compile(r";[ \t]*$", re.M)


@dataclass
class Case:
    title: str
    query: str
    expected: str | None  # None until generated


def read_cases(path: Path) -> tuple[str, list[Case]]:
    """The file's header comment and its cases: blocks apart by blank lines, each a `# title:` line, the query
    and the expected SQL, both ending with `;`."""
    header, *blocks = re.split(r"\n\s*\n(?=# title: )", path.read_text().strip())
    cases = []
    for block in blocks:
        title, body = block.split("\n", 1)
        statements = [s.strip() for s in _STATEMENT_END.split(body) if s.strip()]
        if not title.startswith(_TITLE) or len(statements) not in (1, 2):
            raise ValueError(f"{path.name}: a case is `# title: ...`, a query and its SQL, got {block[:80]!r}")
        cases.append(Case(title.removeprefix(_TITLE), statements[0], statements[1] if len(statements) > 1 else None))
    return header, cases


def write_cases(path: Path, header: str, cases: list[Case]) -> None:
    blocks = [f"{_TITLE}{c.title}\n{c.query};" + (f"\n{c.expected};" if c.expected else "") for c in cases]
    path.write_text("\n\n".join([header, *blocks]) + "\n")


def pretty(sql: str) -> str:
    return sql_tree(sql).sql(DIALECT, pretty=True)


HEADER, CASES = read_cases(FIXTURE)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory):
    """One table with a public-domain key (grp), a private key (city), bounded x and y, a bool and a text."""
    folder = tmp_path_factory.mktemp("golden")
    write_csv(folder / "t.csv", ["pid", "grp", "city", "x", "y", "flag", "note"],
              [(1, "a", "p", 1.0, 2, True, "n"), (2, "b", "q", 3.5, -1, False, None)])
    policy = write_policy(folder / "p.toml", {"t": {
        "source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 3,
        "columns": {"pid": {"type": "int"}, "grp": {"type": "text", "values": ["a", "b", "c"]},
                    "city": {"type": "text"}, "x": {"type": "float", "lower": 0, "upper": 10},
                    "y": {"type": "int", "lower": -5, "upper": 5, "nullable": False},
                    "flag": {"type": "bool"}, "note": {"type": "text"}}}},
        {"epsilon": 1e12, "delta": 1e-3, "query_epsilon": 1.0, "query_delta": 1e-6})
    session = open_session(policy, 1, "golden")
    yield session
    session.close()
    if UPDATE:
        write_cases(FIXTURE, HEADER, CASES)


def test_the_fixture_has_a_dozen_shapes_with_distinct_titles() -> None:
    assert len(CASES) >= 12 and len({c.title for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.title)
def test_the_bounded_sql_is_the_golden_one(session: PrivateSession, case: Case) -> None:
    actual = session.prepare(case.query).bounded.sql
    if UPDATE:
        case.expected = pretty(actual)  # written when the module's session closes
        return
    assert case.expected is not None, f"no expected SQL for {case.title!r}: run with DPSQL_UPDATE_GOLDEN=1"
    assert sql_tree(actual) == sql_tree(case.expected), \
        f"{case.title}: the SQL that runs changed; if intended, regenerate (see the module docstring)\n" \
        f"expected:\n{pretty(case.expected)}\nactual:\n{pretty(actual)}"
