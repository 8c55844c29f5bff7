"""Malformed steward input (the policy, the data files) gets one clear line naming the problem, never a crash.

Seeded fuzzers mutate a valid policy (cut short, a line deleted or doubled, a value of the wrong TOML type, deep
nesting, binary garbage, a byte-order mark, an empty file) and a valid CSV (ragged rows, a quote never closed, a
header naming a column twice, bytes that are not UTF-8, an empty file) and damage a Parquet file: each is loaded,
and each either loads or fails with a dpsql error whose message speaks TOML and CSV, not Python. On the command
line such a failure is exit 1 (a broken policy or data: cli.py), never 70.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import duckdb
import pytest

from dpsql.errors import Error, PolicyError
from dpsql.policy import load_policy
from dpsql.session import build_engine
from tests.conftest import SAMPLE, VISITS_FILES
from tests.test_cli import run
from tests.test_cli_errors import PYTHON_SPEAK

# Python's names for TOML's kinds of value, which a policy's messages used to print ("expected str, got int 2").
PYTHON_TYPES = re.compile(r"\b(got|expected) (str|int|float|bool|dict|list|date|datetime|time)\b|\{'|\['")


def _loads_or_says_why(policy: Path) -> str | None:
    """None if the policy loads (tables included), else its error message; anything but a dpsql error fails."""
    try:
        build_engine(load_policy(policy)).close()
    except Error as exc:
        return str(exc)
    return None


@pytest.fixture
def small_sample(tmp_path: Path) -> Path:
    """The sample policy over the first rows of each of its files: the same shapes, quick to load many times."""
    for name in VISITS_FILES[1:]:
        lines = (SAMPLE / name).read_text().splitlines()[:40]
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    policy = tmp_path / "visits.toml"
    policy.write_text((SAMPLE / "visits.toml").read_text() + "\n[engine]\ntime_limit_seconds = 30\n\n[server]\n"
                      "answers = false\n\n[budget.analysts.alice]\nepsilon = 5\n")
    return policy


VALUES = ('"x"', '""', '"\\u0000"', '"a b"', "0", "-1", "1", "2", "1e400", "inf", "nan", "-inf", "1.5", "true",
          "false", "[]", '[1, "a"]', "[[1]]", "{}", "{ a = 1 }", "1979-05-27", "1979-05-27T07:32:00Z", "07:32:00",
          '"int"', '"*.csv"', '"visits.csv"', '["a", "a"]', "[1.5, 2]", '"' + "x" * 3000 + '"', '{ type = "int" }',
          '"TODO"', "99999999999999999999", '"../visits.csv"', '"duckdb"', '"spark"', '"parquet"')


def _mutated_policy(rng: random.Random, text: str) -> bytes:
    lines = text.splitlines()
    match rng.randrange(8):
        case 0:
            return text[:rng.randrange(len(text))].encode()
        case 1:
            del lines[rng.randrange(len(lines))]
        case 2:
            at = rng.randrange(len(lines))
            lines.insert(at, lines[at])
        case 3 | 4:
            at = rng.choice([i for i, line in enumerate(lines) if " = " in line])
            key, _, value = lines[at].partition(" = ")
            inner = list(re.finditer(r"(\w+) = (\[[^\]]*\]|\"[^\"]*\"|[^,}]+)", value)) if value.startswith("{") \
                else []
            if inner and rng.random() < 0.6:
                part = rng.choice(inner)
                value = value[:part.start(2)] + rng.choice(VALUES) + value[part.end(2):]
            else:
                value = rng.choice(VALUES)
            lines[at] = f"{key} = {value}"
        case 5:
            at = rng.randrange(len(text))
            return text[:at].encode() + rng.randbytes(rng.randrange(1, 8)) + text[at:].encode()
        case 6:
            depth = rng.choice([10, 500, 5000])
            opening, closing = rng.choice([("{ a = ", " }"), ("[", "]")])
            return f"{text}\n[server.x]\ny = {opening * depth}1{closing * depth}\n".encode()
        case _:
            return rng.choice([b"", b"\xef\xbb\xbf" + text.encode(), b"\x00\x01\x02",
                               text.replace("\n", "\r\n").encode(), text.replace("=", "==").encode(),
                               b"[budget\nepsilon=1"])
    return "\n".join(lines).encode()


@pytest.mark.slow  # a property test of many generated cases: the full suite runs it
def test_a_fuzzed_policy_loads_or_says_why_in_toml_terms(small_sample: Path) -> None:
    rng = random.Random(14)
    text = small_sample.read_text()
    target = small_sample.parent / "fuzzed.toml"
    wrong = []
    for _ in range(150):
        target.write_bytes(_mutated_policy(rng, text))
        said = _loads_or_says_why(target)
        if said is not None and (PYTHON_SPEAK.search(said) or PYTHON_TYPES.search(said)):
            wrong.append(said)
    assert not wrong, wrong[:5]


def test_deep_nesting_and_wrong_types_read_as_toml(tmp_path: Path, small_sample: Path) -> None:
    """The issue's policy: an inline table nested 500 deep made every command exit 70 (a RecursionError)."""
    deep = tmp_path / "deep.toml"
    deep.write_text(small_sample.read_text() + "\n[server.x]\ny = " + "{ a = " * 500 + "1" + " }" * 500 + "\n")
    code, _out, err = run("policy", "check", str(deep))
    assert code == 1 and err == (f"dpsql: error: policy {deep}: not valid TOML (arrays or inline tables nested too "
                                 "deeply)\n")
    typed = tmp_path / "typed.toml"
    typed.write_text(small_sample.read_text().replace("max_rows_per_unit = 5", 'max_rows_per_unit = "five"'))
    with pytest.raises(PolicyError, match=r"key 'max_rows_per_unit': expected an integer, got a string \(\"five\"\)$"):
        load_policy(typed)
    typed.write_text(small_sample.read_text().replace('privacy_unit = "patient_id"', "privacy_unit = 1979-05-27", 1))
    with pytest.raises(PolicyError, match=r"key 'privacy_unit': expected a string, got a date \(1979-05-27\)$"):
        load_policy(typed)


def test_a_byte_order_mark_is_not_part_of_the_policy(small_sample: Path) -> None:
    small_sample.write_bytes(b"\xef\xbb\xbf" + small_sample.read_bytes())
    assert _loads_or_says_why(small_sample) is None
    text = small_sample.read_bytes()[3:]
    line = text[:text.index(b"visits.csv")].count(b"\n") + 1
    small_sample.write_bytes(text.replace(b"visits.csv", b"visits\xff.csv", 1))
    assert _loads_or_says_why(small_sample).endswith(f"not valid TOML (line {line} is not UTF-8 text)")


CSV_POLICY = """[budget]
epsilon = 1
[tables.t]
source = "t.csv"
privacy_unit = "pid"
max_rows_per_unit = 2
[tables.t.columns]
pid = { type = "int" }
s = { type = "text" }
v = { type = "int", lower = 0, upper = 10 }
d = { type = "date" }
"""


def _csv_rows(count: int) -> list[str]:
    return ["pid,s,v,d"] + [f"{i},name{i},{i % 10},2020-01-{i % 28 + 1:02d}" for i in range(count)]


def _load_csv(folder: Path, data: bytes) -> str | None:
    (folder / "t.csv").write_bytes(data)
    (folder / "t.toml").write_text(CSV_POLICY)
    return _loads_or_says_why(folder / "t.toml")


@pytest.mark.parametrize(("change", "said"), [
    (lambda rows: rows.__setitem__(3, rows[3] + ",extra"),
     "t.csv: line 4 has 5 fields, but the header has 4: a field too many or too few, or the delimiter inside a value "
     "that is not quoted"),
    (lambda rows: rows.__setitem__(3, rows[3].rsplit(",", 1)[0]), "t.csv: line 4 has 3 fields, but the header has 4"),
    (lambda rows: rows.__setitem__(3, '"' + rows[3]), "t.csv: a quoted field that starts on line 4 or after is never "
                                                      "closed"),
    (lambda rows: rows.__setitem__(0, rows[0] + ",pid"), "t.csv: the header (line 1) names the column 'pid' twice"),
    (lambda rows: rows.__setitem__(29990, rows[29990] + ",x"), "t.csv: line 29991 has 5 fields"),  # past the sniffing
])
def test_a_malformed_csv_row_is_named_by_its_line(tmp_path: Path, change, said: str) -> None:
    rows = _csv_rows(30000)
    change(rows)
    message = _load_csv(tmp_path, ("\n".join(rows) + "\n").encode())
    assert message is not None and message.startswith(f"policy t.toml: table 't', key 'source': {said}"), message
    assert not re.search(r"name\d", message)  # a place, never a value


def test_empty_and_binary_csv_files_say_so(tmp_path: Path) -> None:
    assert _load_csv(tmp_path, b"").endswith("t.csv: the file is empty: its first line must name the columns")
    data = ("\n".join(_csv_rows(100)) + "\n").encode()
    at = data.index(b"name50")
    assert _load_csv(tmp_path, data[:at] + b"\xff\xfe" + data[at:]).endswith("t.csv: line 52 is not UTF-8 text")
    assert _load_csv(tmp_path, b"\xef\xbb\xbf" + data) is None  # a byte-order mark is not data
    assert _load_csv(tmp_path, data.replace(b"\n", b"\r\n")) is None


@pytest.mark.slow  # about 2.5 s: a fuzzer
def test_a_fuzzed_csv_loads_or_says_why(tmp_path: Path) -> None:
    rng = random.Random(140)
    base = _csv_rows(60)
    wrong = []
    for _ in range(80):
        rows = list(base)
        at = rng.randrange(1, len(rows))
        match rng.randrange(8):
            case 0:
                rows[at] += ",extra"
            case 1:
                rows[at] = rows[at].rsplit(",", 1)[0]
            case 2:
                rows[at] = rows[at].replace(",", ";", 1)
            case 3:
                rows[at] = '"' + rows[at]
            case 4:
                rows[0] = rng.choice(["pid,s,v,d,pid", "pid2,s,v,d", "", "pid;s;v;d"])
            case 5:
                rows = rows[:rng.randrange(len(rows))]
            case 6:
                rows[at] = rows[at].replace("name", "x" * rng.choice([10, 200_000]), 1)
        data = ("\n".join(rows) + "\n").encode()
        if rng.random() < 0.3:
            cut = rng.randrange(len(data))
            data = data[:cut] + rng.randbytes(rng.randrange(1, 6)) + data[cut:]
        said = _load_csv(tmp_path, data)
        if said is not None and (PYTHON_SPEAK.search(said) or "\n" in said or "Original Line" in said):
            wrong.append(said)
    assert not wrong, wrong[:5]


def test_a_damaged_parquet_file_says_so(tmp_path: Path) -> None:
    duckdb.sql(f"COPY (SELECT i AS pid, 'n' || i AS s, i % 10 AS v, DATE '2020-01-01' AS d FROM range(1000) t(i)) "
               f"TO '{tmp_path / 'good.parquet'}'")
    good = (tmp_path / "good.parquet").read_bytes()
    (tmp_path / "t.toml").write_text(CSV_POLICY.replace("t.csv", "t.parquet"))
    rng = random.Random(1400)
    for data in [b"", good[:len(good) // 2], *(good[:i] + bytes([good[i] ^ 0xFF]) + good[i + 1:]
                                             for i in rng.sample(range(len(good)), 12))]:
        (tmp_path / "t.parquet").write_bytes(data)
        said = _loads_or_says_why(tmp_path / "t.toml")
        assert said is None or (said.startswith("policy t.toml: table 't', key 'source': cannot")
                                and "\n" not in said and not PYTHON_SPEAK.search(said)), said


def test_the_command_line_says_it_in_one_line_with_exit_1(tmp_path: Path) -> None:
    """The issue's CSV: one ragged row was refused as 'no column pid (it has: pid,s,v)'."""
    (tmp_path / "t.csv").write_text("pid,s,v,d\n1,a,2,2020-01-01\n2,b,3,2020-01-02,9\n3,c,4,2020-01-03\n")
    (tmp_path / "t.toml").write_text(CSV_POLICY)
    code, _out, err = run("policy", "check", str(tmp_path / "t.toml"))
    assert code == 1 and len(err.splitlines()) == 1 and "no column" not in err
    assert err.startswith("dpsql: error: policy t.toml: table 't', key 'source': t.csv: line 3 has 5 fields, but "
                          "the header has 4")
