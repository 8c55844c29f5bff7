"""The prepared store (engines/store.py, `[engine] store`): built once, used only for the very data, policy and salt
it was built from, private to the steward, never half-built in use, and the same rows as loading the sources."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from sqlglot import exp

from benchmarks.support import write_csv, write_policy
from dpsql.engines import store
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.engines.loading import TableLoader, portable_ranks
from dpsql.errors import PolicyError
from dpsql.policy import load_policy
from dpsql.rewrite.bounding import prepared_rows
from dpsql.sql import names

ROWS = [(pid, g, v) for pid in range(1, 41) for g, v in [("a", pid % 7), ("b", pid % 5), ("a", pid % 3)][:pid % 3 + 1]]


def _policy(folder: Path, engine: str = "store = true", max_rows: int = 2) -> Path:
    write_csv(folder / "t.csv", ["pid", "grp", "v"], ROWS)
    write_csv(folder / "pub.csv", ["grp", "label"], [("a", "first"), ("b", "second")])
    path = write_policy(folder / "p.toml", {
        "t": {"source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": max_rows,
              "columns": {"pid": {"type": "int"}, "grp": {"type": "text", "values": ["a", "b"]},
                          "v": {"type": "int", "lower": 0, "upper": 9}}},
        "pub": {"source": "pub.csv", "public": True,
                "columns": {"grp": {"type": "text"}, "label": {"type": "text"}}}})
    path.write_text(path.read_text() + f"\n[engine]\n{engine}\n")
    return path


def _prepared_rows(engine: DuckDBEngine) -> list[tuple]:
    return sorted(engine.run(f"SELECT {names.UNIT}, {names.RANK}, {names.UNIT_ROWS}, grp, v, "
                             f"{names.quantized_column('v')} FROM {names.prepared_table('t')}"))


def _engine(policy: Path, seed: int | None = 7) -> DuckDBEngine:
    return DuckDBEngine(load_policy(policy), bounding_seed=seed)


def test_a_store_is_built_once_and_holds_what_loading_the_sources_gives(tmp_path) -> None:
    policy = _policy(tmp_path)
    first = _engine(policy)
    assert first.store_built
    built = _prepared_rows(first)
    first.close()
    inode = os.stat(tmp_path / "p.store.duckdb").st_ino
    again = _engine(policy)
    assert not again.store_built and os.stat(tmp_path / "p.store.duckdb").st_ino == inode
    assert _prepared_rows(again) == built
    assert again.run_public("SELECT label FROM __dp_pub ORDER BY grp")[2] == [("first",), ("second",)]
    again.close()
    (tmp_path / "mem").mkdir()
    in_memory = _engine(_policy(tmp_path / "mem", engine="store = false"))
    assert _prepared_rows(in_memory) == built  # the same salt gives the same ranks either way
    in_memory.close()


def test_the_store_is_private_to_its_owner(tmp_path) -> None:
    policy = _policy(tmp_path)
    _engine(policy).close()
    path = tmp_path / "p.store.duckdb"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    os.chmod(path, 0o644)
    with pytest.raises(PolicyError, match="can be read or written by others"):
        _engine(policy)


@pytest.mark.parametrize("change", ["source", "source, same size and time", "policy"])
def test_a_changed_source_or_policy_rebuilds_the_store(tmp_path, change) -> None:
    policy = _policy(tmp_path)
    before = _engine(policy)
    count = before.run(f"SELECT COUNT(*) FROM {names.prepared_table('t')}")
    before.close()
    if change == "policy":
        policy.write_text(policy.read_text().replace("max_rows_per_unit = 2", "max_rows_per_unit = 3"))
    else:
        data = tmp_path / "t.csv"
        times = os.stat(data)
        text = data.read_bytes()
        # The last row's pid 40 becomes 41: the same size, a different person.
        data.write_bytes(text[:text.rindex(b"40,")] + b"41," + text[text.rindex(b"40,") + 3:])
        if change == "source, same size and time":
            os.utime(data, ns=(times.st_atime_ns, times.st_mtime_ns))
            assert os.stat(data).st_size == times.st_size
    after = _engine(policy)
    assert after.store_built
    if change != "policy":
        units = {row[0] for row in after.run(f"SELECT {names.UNIT} FROM {names.prepared_table('t')}")}
        assert 41 in units and after.run(f"SELECT COUNT(*) FROM {names.prepared_table('t')}") == count
    after.close()


def test_a_store_built_with_a_known_seed_is_never_used_without_it(tmp_path) -> None:
    policy = _policy(tmp_path)
    _engine(policy, seed=1).close()
    other_seed = _engine(policy, seed=2)
    assert other_seed.store_built
    other_seed.close()
    production = _engine(policy, seed=None)
    assert production.store_built  # the seeded store's ranks are predictable to whoever knows the seed
    production.close()
    assert not _engine(policy, seed=None).store_built  # a store with a secret salt serves every secret-salt engine
    assert _engine(policy, seed=2).store_built


def test_a_build_that_fails_leaves_no_half_store_in_use(tmp_path, monkeypatch) -> None:
    policy = _policy(tmp_path)
    _engine(policy).close()
    with open(tmp_path / "t.csv", "a") as data:  # stale now
        data.write("99,a,1\r\n")
    loaded = []

    def failing_load(self, table, salt):
        if loaded:
            raise OSError("disk full")
        loaded.append(table.name)
        original(self, table, salt)

    original = TableLoader.load
    monkeypatch.setattr(TableLoader, "load", failing_load)
    with pytest.raises(OSError, match="disk full"):
        _engine(policy)
    monkeypatch.setattr(TableLoader, "load", original)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".p.store")] == []  # no building folder left
    stale = store.identity(_version(policy), 7)
    assert not store.ready(tmp_path / "p.store.duckdb", stale)  # the old store is kept but never used for new data
    rebuilt = _engine(policy)
    assert rebuilt.store_built
    assert rebuilt.run(f"SELECT COUNT(*) FROM {names.prepared_table('t')} WHERE {names.UNIT} = 99") == [(1,)]
    rebuilt.close()


def test_the_attached_store_is_read_only_and_the_sandbox_still_locked(tmp_path) -> None:
    engine = _engine(_policy(tmp_path))
    try:
        for statement in (f"DELETE FROM {names.prepared_table('t')}",
                          f"ATTACH '{tmp_path / 'other.duckdb'}' AS other",
                          f"COPY (SELECT 1) TO '{tmp_path / 'out.csv'}'",
                          "SET enable_external_access = true"):
            with pytest.raises(duckdb.Error):
                engine._con.execute(statement)
    finally:
        engine.close()


def test_a_memory_limit_spills_to_a_private_folder(tmp_path) -> None:
    engine = _engine(_policy(tmp_path, engine='store = true\nmemory_limit = "64MB"'))
    try:
        limit = engine._con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
        assert limit.replace(" ", "") in ("61.0MiB", "64.0MiB", "64MB", "61MiB")
        spill = tmp_path / "p.spill"
        assert stat.S_IMODE(spill.stat().st_mode) == 0o700
        assert engine.run(f"SELECT COUNT(*) FROM {names.prepared_table('t')}")[0][0] == len(ROWS)
    finally:
        engine.close()


def test_the_build_has_a_memory_limit_of_its_own(tmp_path, monkeypatch) -> None:
    """A build sorts the whole table; a query reads a few columns: the steward may give them different limits."""
    seen: list[dict[str, str]] = []
    real_build = store.build
    monkeypatch.setattr(store, "build", lambda path, policy, files, seed, load, config, *rest: (
        seen.append(dict(config)), real_build(path, policy, files, seed, load, config, *rest))[1])
    engine = _engine(_policy(tmp_path, engine='store = true\nmemory_limit = "48MB"\nprepare_memory_limit = "1GB"'))
    try:
        limit = engine._con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
        assert limit.replace(" ", "") in ("45.7MiB", "48.0MiB", "48MB", "45MiB")
    finally:
        engine.close()
    assert [config["memory_limit"] for config in seen] == ["1GB"]
    assert stat.S_IMODE((tmp_path / "p.spill").stat().st_mode) == 0o700


@pytest.mark.parametrize(("setting", "problem"), [('store = ""', "must be true, false or a file name"),
                                                  ("store = 3", "store"),
                                                  ('memory_limit = "lots"', "is not a size"),
                                                  ('store = true\nprepare_memory_limit = "9 parsecs"',
                                                   "prepare_memory_limit.*is not a size"),
                                                  ('prepare_memory_limit = "1GB"', "set store too")])
def test_a_broken_engine_section_is_named(tmp_path, setting, problem) -> None:
    with pytest.raises(PolicyError, match=problem):
        load_policy(_policy(tmp_path, engine=setting))


def _version(policy: Path) -> str:
    from dpsql.engines.versions import data_version, file_versions
    loaded = load_policy(policy)
    return data_version(loaded, file_versions(loaded))


def test_duckdb_keeps_its_hash_ranks_unless_a_seed_is_fixed() -> None:
    """The portable md5 key costs DuckDB 2-3x its load (FINDINGS.md): only a fixed bounding seed asks for it."""
    table = load_policy(Path(__file__).parent.parent / "sample_data" / "visits.toml").tables["visits"]
    assert "HASH(" in prepared_rows(table, exp.to_table("src"), 1).sql("duckdb")
    assert "MD5(" in prepared_rows(table, exp.to_table("src"), 1, portable=True).sql("duckdb")
    assert not portable_ranks(None) and portable_ranks(7)


@pytest.mark.slow  # about 2 s: processes of their own
def test_the_load_sql_in_the_store_s_identity_is_the_same_text_in_every_process() -> None:
    """A store is used only by a process that computes the same identity; the known flags were a set, whose order
    follows Python's per-process string hashing, so every new process (each CLI query) rebuilt the store."""
    script = ("import hashlib; from dpsql.policy import load_policy; from dpsql.engines.store import load_sql; "
              "print(hashlib.sha256(load_sql(load_policy('sample_data/visits.toml')).encode()).hexdigest())")
    root = Path(__file__).resolve().parent.parent
    found = {subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True, check=True,
                            env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in (1, 2, 3, 4)}
    assert len(found) == 1, found
