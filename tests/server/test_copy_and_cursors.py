"""psycopg's COPY (text, CSV, binary) and server-side (named) cursors over private answers: the answer is computed
and charged once, then streamed; cursors page through it, close with their transaction (unless WITH HOLD) and
show in pg_cursors."""

from __future__ import annotations

import psycopg
import pytest

from tests.server.conftest import charges, dsn

QUERY = "SELECT region, COUNT(*) AS n FROM visits WHERE age > 20 GROUP BY region ORDER BY region"
REGIONS = ["central", "east", "north", "south", "west"]


def test_copy_in_every_format_is_one_answer_charged_once(served) -> None:
    before = len(charges(served.policy))
    with psycopg.connect(dsn(served), autocommit=True) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY ({QUERY}) TO STDOUT") as copy:
            text = b"".join(bytes(chunk) for chunk in copy).decode()
        with cur.copy(f"COPY ({QUERY}) TO STDOUT WITH (FORMAT csv, HEADER)") as copy:
            csv = b"".join(bytes(chunk) for chunk in copy).decode()
        with cur.copy(f"COPY ({QUERY}) TO STDOUT (FORMAT binary)") as copy:
            copy.set_types(["text", "int8"])
            binary = list(copy.rows())
    rows = [tuple(line.split("\t")) for line in text.splitlines()]
    assert [r[0] for r in rows] == REGIONS
    assert csv.splitlines() == ["region,n", *(f"{r},{n}" for r, n in rows)]
    assert binary == [(r, int(n)) for r, n in rows]  # the same released answer each time
    assert len(charges(served.policy)) == before + 1  # the first COPY paid; the others are the answer released


def test_copy_quotes_csv_and_escapes_text_as_postgres_does(served) -> None:
    sql = "SELECT 'a,b' AS x, 'say \"hi\"' AS y, NULL AS z, 'tab\there' AS w"
    with psycopg.connect(dsn(served), autocommit=True) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY ({sql}) TO STDOUT (FORMAT csv)") as copy:
            assert b"".join(bytes(c) for c in copy) == b'"a,b","say ""hi""",,tab\there\n'
        with cur.copy(f"COPY ({sql}) TO STDOUT") as copy:
            assert b"".join(bytes(c) for c in copy) == b'a,b\tsay "hi"\t\\N\ttab\\there\n'


def test_copy_of_a_public_table_and_refusals(served) -> None:
    before = len(charges(served.policy))
    with psycopg.connect(dsn(served), autocommit=True) as conn, conn.cursor() as cur:
        with cur.copy("COPY regions TO STDOUT (FORMAT csv)") as copy:
            assert len(b"".join(bytes(c) for c in copy).decode().splitlines()) == 5  # public rows, free
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="individual rows"), \
                cur.copy("COPY visits TO STDOUT") as copy:
            list(copy)
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="read-only"), \
                cur.copy("COPY regions FROM STDIN") as copy:
            copy.write(b"")
    assert len(charges(served.policy)) == before


def test_a_named_cursor_fetches_one_answer_in_pages(served) -> None:
    before = len(charges(served.policy))
    with psycopg.connect(dsn(served, "bob")) as conn:  # a transaction: the cursor lives until it ends
        with conn.cursor(name="pages") as cur:
            cur.execute(QUERY.replace("20", "21"))
            assert [d.name for d in cur.description] == ["region", "n"]  # Describe of the cursor's portal
            listed = conn.execute("SELECT name, is_holdable FROM pg_catalog.pg_cursors").fetchall()
            assert listed == [("pages", False)]
            first = cur.fetchmany(2)
            rest = cur.fetchall()
        assert [r[0] for r in first + rest] == REGIONS and len(first) == 2
        conn.commit()
        assert conn.execute("SELECT count(*) FROM pg_catalog.pg_cursors").fetchone() == (0,)
    assert len(charges(served.policy)) == before + 1


def test_cursor_commands_on_the_wire(served) -> None:
    with psycopg.connect(dsn(served), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.NoActiveSqlTransaction):
            conn.execute(f"DECLARE c CURSOR FOR {QUERY}")  # outside a transaction only WITH HOLD lives
        conn.execute(f"DECLARE c NO SCROLL CURSOR WITH HOLD FOR {QUERY}")
        assert [r[0] for r in conn.execute("FETCH 2 FROM c").fetchall()] == REGIONS[:2]
        assert [r[0] for r in conn.execute("FETCH FORWARD 1 FROM c").fetchall()] == REGIONS[2:3]
        conn.execute("MOVE ALL IN c")
        assert conn.execute("FETCH NEXT FROM c").fetchall() == []
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="forward"):
            conn.execute("FETCH BACKWARD 1 FROM c")
        conn.execute("CLOSE c")
        with pytest.raises(psycopg.errors.InvalidCursorName):
            conn.execute("FETCH 1 FROM c")
