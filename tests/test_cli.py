"""The command line: answers in three formats, explain, budget, init, policy check; errors as one line."""

from __future__ import annotations

import csv
import io
import json
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from benchmarks.support import caps_rows, create_ledger, sql_tree, write_csv, write_policy
from dpsql.frontends import cli
from dpsql.session import PrivateSession
from dpsql.sql import names
from tests.conftest import VISITS_FILES

GROUPED = "SELECT region, COUNT(*) AS visits, AVG(cost) AS avg_cost FROM visits GROUP BY region"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli.main, list(args), env={"DPSQL_ANALYST": "cli"})
    return result.exit_code, result.stdout, result.stderr


def test_query_prints_a_table_with_intervals_and_the_cost(visits_policy: Path) -> None:
    code, out, err = run("query", GROUPED, "--policy", str(visits_policy), "--ci")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["region", "visits", "avg_cost"] and len(lines) == 2 + 5
    assert "[" in lines[2]  # an interval beside each noisy value
    assert "cost: epsilon 1;" in err and "cli has epsilon 49 of 50 left" in err


def test_query_as_csv_and_json(visits_policy: Path) -> None:
    code, out, _ = run("query", GROUPED, "--policy", str(visits_policy), "--format", "csv", "--ci",
                       "--epsilon", "0.5")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 5 and set(rows[0]) == {"region", "visits", "visits_ci_low", "visits_ci_high", "avg_cost",
                                                  "avg_cost_ci_low", "avg_cost_ci_high"}
    assert all(float(r["avg_cost_ci_low"]) <= float(r["avg_cost"]) <= float(r["avg_cost_ci_high"]) for r in rows)
    code, out, _ = run("query", GROUPED, "--policy", str(visits_policy), "--format", "json")
    document = json.loads(out)
    assert code == 0 and document["cost"] == {"epsilon": 1.0, "delta": 0.0}
    assert [c["noisy"] for c in document["columns"]] == [False, True, True] and len(document["rows"]) == 5
    assert document["budget"]["epsilon_spent"] == 1.5


def test_csv_writes_null_as_an_empty_field_and_non_finite_numbers_by_name(visits_policy: Path) -> None:
    sql = ("SELECT region, CAST('inf' AS DOUBLE) * (COUNT(*) * COUNT(*) + 1) AS up, "
           "CAST('-inf' AS DOUBLE) * (COUNT(*) * COUNT(*) + 1) AS down, CAST('nan' AS DOUBLE) + COUNT(*) AS odd, "
           "CASE WHEN COUNT(*) * COUNT(*) >= 0 THEN NULL ELSE 'x' END AS nothing FROM visits GROUP BY region")
    code, out, err = run("query", sql, "--policy", str(visits_policy), "--format", "csv")
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 5
    assert {(r["up"], r["down"], r["odd"], r["nothing"]) for r in rows} == {("inf", "-inf", "nan", "")}
    code, out, err = run("query", "SELECT CASE WHEN COUNT(*) * COUNT(*) >= 0 THEN NULL END AS n, "
                         "CAST('inf' AS DOUBLE) * (COUNT(*) * COUNT(*) + 1) AS up FROM visits",
                         "--policy", str(visits_policy), "--format", "csv")
    assert code == 0, err
    assert out.splitlines() == ["n,up", ",inf"]


def test_parameters_from_the_command_line(visits_policy: Path) -> None:
    sql = "SELECT COUNT(*) FROM visits WHERE age > ? AND region = ?"
    code, out, err = run("query", sql, "--policy", str(visits_policy), "-p", "40", "-p", "north")
    assert code == 0, err
    assert out.splitlines()[0].strip() == "count(*)" and out.splitlines()[2].strip().isdigit()
    code, _out, err = run("query", "SELECT COUNT(*) FROM visits WHERE age > :a", "--policy", str(visits_policy),
                         "-p", "a=40")
    assert code == 0, err


def test_explain_shows_the_plan_and_spends_nothing(visits_policy: Path) -> None:
    code, out, _ = run("explain", GROUPED, "--policy", str(visits_policy), "--epsilon", "2")
    assert code == 0
    for expected in ("Cost: epsilon 2, delta 0", "at most 5 row(s) per unit", "discrete Laplace", "COUNT(*)",
                     "SUM(5000 - cost)", "sensitivity", "noise scale", "95% +/-", "Rewritten SQL",
                     "AVG(cost) = 2500 + (m0 - m1) / 2 / ((m0 + m1) / 5000)", "COUNT(*) = (m0 + m1 + m2) / 5000",
                     "m0 and m1 and m2 split each row's hi - lo = 5000 between them"):
        assert expected in out, expected
    shown = sql_tree(out.split("Rewritten SQL", 1)[1].split("\n", 1)[1])  # the SQL printed last
    session = PrivateSession(visits_policy, "cli")
    try:
        assert shown == sql_tree(session.prepare(GROUPED, epsilon=2).bounded.sql)  # what runs, as it runs
    finally:
        session.close()
    assert caps_rows(shown, names.RANK, 5)  # 5 rows per unit
    code, out, _ = run("budget", "--policy", str(visits_policy))
    assert "0 queries" in out


def test_budget_shows_total_spent_remaining_and_history(visits_policy: Path) -> None:
    run("query", GROUPED, "--policy", str(visits_policy), "--epsilon", "2")
    code, out, _ = run("budget", "--policy", str(visits_policy))
    assert code == 0
    assert "total:     epsilon 2 spent of 50, 48 left" in out and "cli: epsilon 2 spent of 50" in out
    assert "#1" in out and GROUPED in out


@pytest.mark.parametrize(("args", "code", "message"), [
    (["query", "SELECT MODE(cost) FROM visits"], 4, "rejected: SELECT MODE(cost): MODE is not supported"),
    (["query", "SELECT COUNT(*) FROM visits; DROP TABLE visits"], 4, "rejected: send one statement"),
    (["query", "SELECT COUNT(*) FROM visits", "--epsilon", "inf"], 4, "finite number > 0"),
    (["query", "SELECT COUNT(*) FROM visits", "--epsilon", "51"], 4, "more than the whole budget"),
    (["query", "SELECT COUNT(*) FROM visits", "--epsilon", "0"], 4, "finite number > 0"),
    (["query", "SELEC COUNT(*) FROM visits"], 4, "error: cannot parse the SQL"),
    (["query", "SELECT COUNT(*) FROM visits WHERE age > ?"], 4, "error: the query has 1 placeholders"),
])
def test_errors_are_one_line_with_an_exit_code(visits_policy: Path, args, code, message) -> None:
    exit_code, out, err = run(*args, "--policy", str(visits_policy))
    assert exit_code == code and out == ""
    assert err.startswith("dpsql: ") and message in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("args", [
    ["query"],  # no SQL
    ["query", "SELECT COUNT(*) FROM visits", "--format", "xml"],
    ["query", "SELECT COUNT(*) FROM visits", "--no-such-option"],
    ["query", "SELECT COUNT(*) FROM visits", "--epsilon", "abc"],  # text that is no number: click's type says so
    ["frobnicate"],
])
def test_usage_errors_exit_2_and_differ_from_refusals(visits_policy: Path, args) -> None:
    exit_code, out, err = run(*args, "--policy", str(visits_policy))
    assert exit_code == 2 and out == "" and "Usage:" in err


def test_a_missing_policy_option_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli.main, ["query", "SELECT COUNT(*) FROM visits"], env={"DPSQL_POLICY": ""})
    assert result.exit_code == 2 and "Missing option '--policy'" in result.stderr


def test_budget_exhaustion_exits_3(visits_policy: Path) -> None:
    assert run("query", "SELECT COUNT(*) FROM visits", "--policy", str(visits_policy), "--epsilon", "49.5")[0] == 0
    code, out, err = run("query", "SELECT COUNT(*) FROM visits", "--policy", str(visits_policy), "--epsilon", "1")
    assert code == 3 and out == "" and "would overspend" in err


def test_a_broken_policy_or_missing_file_is_one_line(tmp_path: Path) -> None:
    code, _, err = run("query", "SELECT 1", "--policy", str(tmp_path / "none.toml"))
    assert code == 1 and "cannot read the file" in err and "Traceback" not in err
    (tmp_path / "p.toml").write_text('[budget]\nepsilon = 1\n[tables.t]\nsource = "gone.csv"\n')
    code, _, err = run("policy", "check", str(tmp_path / "p.toml"))
    assert code == 1 and "table 't', key 'source': no file matches" in err


def test_an_internal_error_is_one_line_too(visits_policy: Path, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("boom")
    monkeypatch.setattr(cli.PrivateSession, "execute", broken)
    code, _out, err = run("query", GROUPED, "--policy", str(visits_policy))
    assert code == 70 and "internal error (boom): a bug in dpsql" in err and "Traceback" not in err
    assert "RuntimeError" not in err


def test_init_then_policy_check(tmp_path: Path) -> None:
    (tmp_path / "people.csv").write_text("person,age,city\n1,30,a\n2,41,b\n")
    policy = tmp_path / "people.toml"
    code, _, err = run("init", str(tmp_path / "people.csv"), "--unit", "person", "-o", str(policy))
    assert code == 0 and "fill in its TODOs" in err
    parsed = tomllib.loads(policy.read_text())
    assert parsed["tables"]["people"]["privacy_unit"] == "person"
    code, out, _ = run("policy", "check", str(policy))
    assert code == 0 and "table people: 3 columns, unit person" in out
    assert out.strip().endswith("loads, but is not finished: 5 TODO(s) left (see the warnings)")
    code, _, err = run("init", str(tmp_path / "people.csv"), "-o", str(policy))
    assert code == 4 and "exists already" in err


def test_policy_check_warns_on_every_todo_left(tmp_path: Path) -> None:
    """An unedited skeleton loads (its placeholders are valid TOML), but is not a finished policy: every marker
    `dpsql init` left is a warning naming its line, and only a policy without any says ok."""
    (tmp_path / "people.csv").write_text("person,age,city\n1,30,a\n2,41,b\n")
    policy = tmp_path / "people.toml"
    assert run("init", str(tmp_path / "people.csv"), "--unit", "person", "-o", str(policy))[0] == 0
    lines = policy.read_text().splitlines()
    marked = [number for number, line in enumerate(lines, start=1) if "TODO:" in line]
    code, out, err = run("policy", "check", str(policy))
    warned = [line for line in err.splitlines() if line.startswith("dpsql: warning: people.toml, line ")]
    assert code == 0 and len(marked) == 5
    assert [int(line.split("line ")[1].split(":")[0]) for line in warned] == marked
    assert "a TODO is left: how many rows one person may contribute to a query" in err
    assert out.splitlines()[-1] == "loads, but is not finished: 5 TODO(s) left (see the warnings)"
    policy.write_text("\n".join(line.split("#")[0].rstrip() for line in lines) + "\n")  # every marker removed
    code, out, err = run("policy", "check", str(policy))
    assert code == 0 and out.splitlines()[-1] == "ok" and "warning" not in err
    (tmp_path / "bare.toml").write_text(policy.read_text().replace('privacy_unit = "person"', 'privacy_unit = "TODO"'))
    code, _, err = run("policy", "check", str(tmp_path / "bare.toml"))  # the unit's placeholder, then the error
    assert code == 1 and "bare.toml, line 11: a TODO is left" in err and "column 'todo' is not declared" in err


def test_no_ledger_no_answer_until_the_steward_creates_it(tmp_path: Path) -> None:
    """A missing ledger is never a fresh budget: `query` refuses until `budget --init` creates it."""
    policy = tmp_path / "visits.toml"
    for name in VISITS_FILES:
        (tmp_path / name).write_bytes((Path(__file__).parent.parent / "sample_data" / name).read_bytes())
    code, out, err = run("query", "SELECT COUNT(*) FROM visits", "--policy", str(policy))
    assert code == 1 and out == "" and "no budget ledger" in err and "dpsql budget --init" in err
    code, out, _ = run("policy", "check", str(policy))
    assert code == 0 and "does not exist yet" in out
    code, out, err = run("budget", "--init", "--policy", str(policy))
    assert code == 0 and "ledger created" in err and "0 queries" in out
    assert run("query", "SELECT COUNT(*) FROM visits", "--policy", str(policy))[0] == 0
    code, out, err = run("budget", "--init", "--policy", str(policy))
    assert code == 0 and "ledger exists" in err and "1 queries" in out  # a second init changes nothing


def test_an_empty_grouped_answer_says_why_on_stderr(tmp_path: Path) -> None:
    write_csv(tmp_path / "people.csv", ["person", "city", "smoker"],
              [(i, f"city{i % 4}", i % 2 == 0) for i in range(12)])
    policy = create_ledger(write_policy(tmp_path / "people.toml", {"people": {
        "source": "people.csv", "privacy_unit": "person", "max_rows_per_unit": 1,
        "columns": {"person": {"type": "int"}, "city": {"type": "text"}, "smoker": {"type": "bool"}}}},
        {"delta": 1e-7, "query_delta": 1e-8}))
    code, out, err = run("query", "SELECT city, COUNT(*) FROM people GROUP BY city", "--policy", str(policy),
                         "--epsilon", "0.1")
    assert code == 0 and "(no rows)" in out
    assert "no rows: every group of city has a noisy row count below the partition-selection threshold" in err
    code, out, err = run("query", "SELECT smoker, COUNT(*) AS n FROM people GROUP BY smoker HAVING n > 1e9",
                         "--policy", str(policy), "--epsilon", "0.1")
    assert code == 0 and "(no rows)" in out
    assert "2 group(s) were released, and HAVING, LIMIT or OFFSET removed them all" in err


def test_the_skeleton_tells_bool_from_text_columns(tmp_path: Path) -> None:
    (tmp_path / "people.csv").write_text("person,smoker,city\n1,true,a\n2,false,b\n")
    code, out, _ = run("init", str(tmp_path / "people.csv"), "--unit", "person")
    assert code == 0
    lines = {line.split(" =")[0]: line for line in out.splitlines() if "type =" in line}
    assert "no values needed" in lines["smoker"] and "TODO" not in lines["smoker"]
    assert "TODO: add values" in lines["city"] and "threshold" in lines["city"]


def test_a_command_line_parameter_that_does_not_fit_its_column_is_refused_and_not_charged(visits_policy) -> None:
    sql = "SELECT COUNT(*) FROM visits WHERE age > ?"
    code, out, err = run("query", sql, "--policy", str(visits_policy), "-p", "abc")
    assert code == 4 and out == "" and "parameter 1 ('abc') is compared with the int column 'age'" in err
    code, out, _ = run("budget", "--policy", str(visits_policy))
    assert "0 queries" in out
    code, out, err = run("query", "SELECT COUNT(*) FROM visits WHERE region = ? AND age > ? LIMIT ?",
                         "--policy", str(visits_policy), "-p", "north", "-p", "40", "-p", "1")
    assert code == 0, err
