"""Ordinary situations get a clear line and an exit code of their own, never "internal error" (exit 70), and no
message speaks Python (a repr, a class name, a parser token): malformed SQL and bad options are fuzzed."""

from __future__ import annotations

import random
import re
import socket
from pathlib import Path

import pytest
from sqlglot.tokens import Tokenizer

from dpsql.errors import Error
from dpsql.session import PrivateSession
from tests.sizes import cases
from tests.test_cli import run


def test_serving_on_a_port_in_use_says_so(visits_policy: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _out, err = run("serve", "--policy", str(visits_policy), "--port", str(port))
    assert code == 69, err
    assert err == (f"dpsql: error: cannot listen on 127.0.0.1:{port}: the port is already in use (another server "
                   "listens on it): stop it or choose another --port\n")  # before loading (no table's progress line)


def test_a_tls_certificate_that_is_no_certificate_says_so(visits_policy: Path) -> None:
    junk = visits_policy.parent / "server.pem"
    junk.write_text("not a certificate\n")
    code, _out, err = run("serve", "--policy", str(visits_policy), "--tls-cert", str(junk), "--tls-key", str(junk))
    assert code == 78, err
    assert err.startswith(f"dpsql: error: cannot use the TLS certificate {junk} with the key {junk}: ")
    assert len(err.splitlines()) == 1 and "ssl" not in err.lower()


def test_adding_a_user_without_a_terminal_asks_for_password_stdin(visits_policy: Path) -> None:
    code, _out, err = run("user", "add", "dora", "--policy", str(visits_policy))
    assert code == 66, err
    assert err == ("dpsql: error: no terminal to ask the password of dora on: give it on the first line of stdin "
                   "with --password-stdin\n")
    code, out, err = run("user", "list", "--policy", str(visits_policy))
    assert code == 0 and "dora" not in out


# What a message must never hold: Python's own names for its objects, classes, exceptions, parser tokens and
# tracebacks.
PYTHON_SPEAK = re.compile(r"Fraction\(|Decimal\(|<class |object at 0x|Traceback|<Token|TokenType\.|sqlglot\.|"
                          r"NoneType|np\.\w+\(|numpy\.|\w+Exception\b|\(\w*Error\)")

FUZZ_BASES = (
    "SELECT region, COUNT(*) AS n, AVG(cost) FROM visits WHERE age > 30 AND sex = 'F' GROUP BY region "
    "HAVING n > 3 ORDER BY n DESC LIMIT 3",
    "SELECT CAST(age AS DOUBLE) / 2, SUM(length_of_stay) FROM visits v JOIN patients p "
    "ON v.patient_id = p.patient_id GROUP BY 1",
    "WITH a AS (SELECT age + 1 AS x, region FROM visits) SELECT region, MEDIAN(x) FROM a GROUP BY region",
    "SELECT d.specialty_group, COUNT(*) FROM visits v JOIN departments d ON v.department = d.department "
    "GROUP BY d.specialty_group",
    "SELECT COUNT(DISTINCT patient_id), QUANTILE_CONT(cost, 0.9) FROM visits "
    "WHERE visit_date BETWEEN DATE '2020-01-01' AND '2021-01-01'",
    "SELECT n_visits, COUNT(*) FROM (SELECT patient_id, COUNT(*) AS n_visits FROM visits GROUP BY patient_id) "
    "AS p GROUP BY n_visits",
    "SELECT region, CASE WHEN age > 60 THEN 'old' ELSE 'young' END AS g, COUNT(*) FILTER (WHERE smoker) "
    "FROM visits GROUP BY ALL",
    "SELECT * FROM regions WHERE population > 1000 ORDER BY 1",
)
FUZZ_WORDS = ("(", ")", ",", "SELECT", "FROM", "WHERE", "'", '"', "?", "$1", ":x", "::", "[", "]", "{", "}", "*",
              "/", "1e999", "NULL", "INTERVAL", "CAST", "AS", "ON", "JOIN", ";", "--", "/*", "\\", "\x00", "é",
              "GROUP", "BY", "OVER", "LIMIT", "-", "+", "=", "<>", "IN", "BETWEEN", "AND", "CASE", "END", "x'00'",
              "e'\\n'", "$$", "@", "#", "%", "0x", "1.2.3", "DATE", "TIMESTAMP", "'2020-13-45'", "ARRAY", "STRUCT",
              "MAP", "->", "=>", "COLUMNS(*)", "EXCLUDE", "PIVOT", "QUALIFY", "v.*", "e'\\n' AS")


def _mutated(rng: random.Random, sql: str) -> str:
    """`sql` cut short, with a token or a span deleted, or a word inserted or swapped in, at token boundaries."""
    spans = [(t.start, t.end + 1) for t in Tokenizer().tokenize(sql)]
    start, end = rng.choice(spans)
    match rng.randrange(5):
        case 0:
            return sql[:end]
        case 1:
            return sql[:start] + sql[end:]
        case 2:
            return f"{sql[:start]}{rng.choice(FUZZ_WORDS)} {sql[start:]}"
        case 3:
            return sql[:start] + rng.choice(FUZZ_WORDS) + sql[end:]
        case _:
            (first, _), (_, last) = sorted(rng.sample(spans, 2))
            return sql[:first] + sql[last:]


def test_malformed_sql_never_speaks_python(visits_policy: Path) -> None:
    """Two thousand mutations of valid queries (seeded), each described (planned, dry-run, never charged): every
    one is answered or refused with a dpsql error, and no message holds a Python repr, class or token."""
    rng = random.Random(29)
    session = PrivateSession(visits_policy, "fuzz")
    crashed, python = [], []
    try:
        for _ in range(cases(2000)):
            sql = _mutated(rng, rng.choice(FUZZ_BASES))
            try:
                session.describe(sql)
            except Error as exc:
                if PYTHON_SPEAK.search(str(exc)):
                    python.append((sql, str(exc)))
            except Exception as exc:  # would be "internal error" (exit 70) on the command line
                crashed.append((sql, f"{type(exc).__name__}: {exc}"))
    finally:
        session.close()
    assert not crashed, crashed[:5]
    assert not python, python[:5]
    assert session.history() == []


def test_the_issues_two_messages_speak_sql(visits_policy: Path) -> None:
    code, _out, err = run("query", "SELECT COUNT(*) FROM visits", "--policy", str(visits_policy), "--epsilon", "-1")
    assert code == 4 and err == "dpsql: error: epsilon must be a finite number > 0, got -1\n"
    code, _out, err = run("query", "SELECT COUNT(*) FROM visits WHERE", "--policy", str(visits_policy))
    assert code == 4 and err == ("dpsql: error: cannot parse the SQL: something is missing at line 1, column 33, "
                                 "near 'WHERE'\n")


@pytest.mark.parametrize("option", ["--epsilon", "--accuracy"])
def test_bad_numbers_on_the_command_line_never_speak_python(visits_policy: Path, option: str) -> None:
    for value in ("-1", "0", "-0.5", "nan", "inf", "-inf", "1e400", "1e-12", "abc", "", "1/3", "0x10", "1_0"):
        code, _out, err = run("explain", "SELECT COUNT(*) FROM visits", "--policy", str(visits_policy), option,
                              value)
        assert code in (0, 2, 4), (value, err)
        assert not PYTHON_SPEAK.search(err), (value, err)


def test_bad_parameters_and_options_never_speak_python(visits_policy: Path) -> None:
    sql = "SELECT COUNT(*) FROM visits WHERE age > ? AND visit_date > ? AND region = ?"
    for values in (("1e999", "2020-01-01", "north"), ("nan", "x", "y"), ("1", "2020-13-45", "\x00"),
                   ("", "", ""), ("1",), ("1", "2", "3", "4")):
        parameters = [part for value in values for part in ("-p", value)]
        code, _out, err = run("explain", sql, "--policy", str(visits_policy), *parameters)
        assert code in (0, 4), (values, err)
        assert not PYTHON_SPEAK.search(err) and len(err.splitlines()) <= 1, (values, err)
    for options in (("--format", "xml"), ("--analyst",), ("--policy", str(visits_policy.parent / "none.toml"))):
        code, _out, err = run("query", "SELECT COUNT(*) FROM visits", "--policy", str(visits_policy), *options)
        assert code in (1, 2), (options, err)
        assert not PYTHON_SPEAK.search(err), (options, err)
