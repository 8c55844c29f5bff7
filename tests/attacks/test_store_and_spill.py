"""Red team (stop 22's surface): where DuckDB writes pieces of the data, and the prepared store's identity.

DuckDB spills to `temp_directory` whatever does not fit in its memory limit. Its default, for an in-memory database,
is `.tmp` in the process's working directory, created with the process's umask (0755 folder, 0644 files on a usual
system), and the sandbox's `enable_external_access = false` does not stop it (checked by hand: a 3M-row sort under a
60MB limit wrote duckdb_temp_*_storage_*.tmp files of mode 0644 into ./.tmp of a locked sandbox connection). Without
`[engine] memory_limit` dpsql left that default, so a query that needs more than 80% of the machine's memory (the
default limit: large data, a large join) wrote sorted private rows, readable by others, wherever dpsql was started."""

from __future__ import annotations

import fcntl
import os
import random
import signal
import stat
import subprocess
import sys
from pathlib import Path

from sqlglot import exp

from benchmarks.attacks import differential
from benchmarks.support import open_session, write_csv, write_dataset, write_policy
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.errors import Error
from dpsql.policy import load_policy
from dpsql.rewrite import bounding


def _policy(folder: Path, engine: str = "") -> Path:
    write_csv(folder / "t.csv", ["pid", "v"], [(p, p % 7) for p in range(1, 30)])
    path = write_policy(folder / "p.toml", {
        "t": {"source": "t.csv", "privacy_unit": "pid", "max_rows_per_unit": 2,
              "columns": {"pid": {"type": "int"}, "v": {"type": "int", "lower": 0, "upper": 9}}}})
    if engine:
        path.write_text(path.read_text() + f"\n[engine]\n{engine}\n")
    return path


def _spill_setting(engine: DuckDBEngine) -> str:
    return engine._con.execute("SELECT current_setting('temp_directory')").fetchone()[0]


def _private_folder(setting: str) -> bool:
    folder = Path(setting)
    return folder.is_absolute() and folder.is_dir() and stat.S_IMODE(folder.stat().st_mode) == 0o700 and \
        folder.stat().st_uid == os.getuid()


def test_without_a_memory_limit_the_engine_still_spills_only_to_a_private_folder(tmp_path, monkeypatch) -> None:
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)  # where an analyst's or a service's process happens to start
    for engine_section in ("", "store = true"):
        folder = tmp_path / (engine_section.replace(" ", "") or "plain")
        folder.mkdir()
        engine = DuckDBEngine(load_policy(_policy(folder, engine_section)), bounding_seed=3)
        try:
            setting = _spill_setting(engine)
            assert _private_folder(setting), f"spills to {setting!r} (relative to {os.getcwd()})"
        finally:
            engine.close()


def test_a_hidden_file_the_source_glob_reads_is_part_of_the_data_version(tmp_path) -> None:
    """DuckDB's glob matches files whose names start with a dot (`d/*.csv` reads `d/.late.csv`); Python's glob, which
    data_version listed the sources with, skips them. A hidden file added, changed or removed then left the data
    version as it was: the prepared store (and the answer cache, keyed on the same version) kept answering from the
    data as it was, while a fresh load read the new file."""
    folder = tmp_path / "d"
    folder.mkdir()
    write_csv(folder / "a.csv", ["pid", "v"], [(p, p % 7) for p in range(1, 30)])
    write_csv(folder / ".late.csv", ["pid", "v"], [(100, 1)])
    policy = write_policy(tmp_path / "p.toml", {
        "t": {"source": "d/*.csv", "privacy_unit": "pid", "max_rows_per_unit": 2,
              "columns": {"pid": {"type": "int"}, "v": {"type": "int", "lower": 0, "upper": 9}}}})
    policy.write_text(policy.read_text() + "\n[engine]\nstore = true\n")
    first = DuckDBEngine(load_policy(policy), bounding_seed=3)
    units = "SELECT COUNT(DISTINCT __dp_unit) FROM __dp_t"
    assert first.run(units) == [(30,)]  # DuckDB read the hidden file
    first.close()
    write_csv(folder / ".late.csv", ["pid", "v"], [(100, 1), (101, 2)])  # one more person, in the hidden file
    again = DuckDBEngine(load_policy(policy), bounding_seed=3)
    try:
        assert again.store_built, "the store built before the hidden file changed was used"
        assert again.run(units) == [(31,)]
    finally:
        again.close()


def _write_in_wal_only(database: Path, statement: str) -> None:
    """Run `statement` in a process that then dies before any checkpoint: the change is in `<database>.wal` only,
    where a crashed (or killed) writer leaves it; DuckDB replays it when the file is next opened, read-only too."""
    script = (f"import duckdb, os; c = duckdb.connect({str(database)!r}, config={{'checkpoint_threshold': '1GB'}}); "
              f"c.execute({statement!r}); os._exit(0)")
    subprocess.run([sys.executable, "-c", script], check=True)


def test_a_duckdb_sources_write_ahead_log_is_part_of_the_data_version(tmp_path) -> None:
    """A DuckDB source is read with its WAL replayed, but data_version fingerprinted the main file only: rows a
    writer left in the WAL (it crashed, or was killed, before a checkpoint) changed what a load reads and not the
    version, so the store built before them (and the answer cache) kept answering from the data without them."""
    database = tmp_path / "source.duckdb"
    _write_in_wal_only(database, "CREATE TABLE t AS SELECT range AS pid, range % 7 AS v FROM range(1, 30)")
    policy = write_policy(tmp_path / "p.toml", {
        "t": {"source": "source.duckdb", "table": "t", "privacy_unit": "pid", "max_rows_per_unit": 2,
              "columns": {"pid": {"type": "int"}, "v": {"type": "int", "lower": 0, "upper": 9}}}})
    policy.write_text(policy.read_text() + "\n[engine]\nstore = true\n")
    units = "SELECT COUNT(DISTINCT __dp_unit) FROM __dp_t"
    first = DuckDBEngine(load_policy(policy), bounding_seed=3)
    assert first.run(units) == [(29,)]
    first.close()
    _write_in_wal_only(database, "INSERT INTO t VALUES (100, 1)")  # one more person, in the WAL only
    again = DuckDBEngine(load_policy(policy), bounding_seed=3)
    try:
        assert again.store_built, "the store built before the WAL's rows was used"
        assert again.run(units) == [(30,)]
    finally:
        again.close()


def test_an_engine_on_the_store_measures_what_an_engine_loading_the_sources_does(tmp_path) -> None:
    """The differential fuzzer's generated queries (plain and nested forms: filters, keys, quantiles, per-unit
    aggregation, semi-joins, self-joins) on the same rows and bounding seed, one engine attaching the prepared store
    and one loading the sources: the same bounded SQL and the same exact measurements, every one."""
    rows = [*differential.base_rows(3), *(differential.ADVERSARIAL_ROWS[t] for t in ("odd text", "infinities"))]
    plain = write_dataset(tmp_path / "plain", differential.TABLE, rows, differential.BUDGET)
    stored = write_dataset(tmp_path / "stored", differential.TABLE, rows, differential.BUDGET)
    stored.write_text(stored.read_text() + "\n[engine]\nstore = true\n")
    loading, attached = open_session(plain, 3, "x", threads=2), open_session(stored, 3, "x", threads=2)
    try:
        assert attached.engine.store_built
        grammar, compared = differential.Grammar(random.Random(9)), 0
        for i in range(160):
            sql, _ = grammar.nested_query() if i % 2 else grammar.query()
            try:
                first, second = loading.prepare(sql, epsilon=1.0), attached.prepare(sql, epsilon=1.0)
            except Error:
                continue
            assert first.bounded == second.bounded, sql
            assert _comparable(loading.measure(first)) == _comparable(attached.measure(second)), sql
            compared += 1
        assert compared >= 100
    finally:
        loading.close()
        attached.close()


def _comparable(rows: list[tuple]) -> list[str]:
    """Rows in a canonical order, a quantile's {bucket: rows} as sorted pairs."""
    return sorted(repr(tuple(sorted(v.items()) if isinstance(v, dict) else v for v in row)) for row in rows)


def test_a_build_killed_mid_way_leaves_no_copy_of_the_data_behind(tmp_path) -> None:
    """A killed build cannot remove its private building folder (a partial copy of the data); the next build does,
    and leaves alone the folder of a build still running (its lock is held)."""
    policy = _policy(tmp_path, "store = true")
    script = ("import os, signal\n"
              "from dpsql.engines import loading\n"
              "from dpsql.engines.duckdb_engine import DuckDBEngine\n"
              "from dpsql.policy import load_policy\n"
              "original = loading.TableLoader.load\n"
              "def load(self, table, salt):\n"
              "    original(self, table, salt)\n"
              "    self.con.execute('CHECKPOINT')\n"
              "    os.kill(os.getpid(), signal.SIGKILL)  # the machine's OOM killer, a power cut, kill -9\n"
              "loading.TableLoader.load = load\n"
              f"DuckDBEngine(load_policy({str(policy)!r}))\n")
    assert subprocess.run([sys.executable, "-c", script]).returncode == -signal.SIGKILL
    killed = [p for p in tmp_path.iterdir() if p.name.endswith(".building")]
    assert len(killed) == 1 and (killed[0] / "build.lock").exists()
    running = tmp_path / ".p.store.duckdb.live.building"  # the folder of another build, still running
    running.mkdir(mode=0o700)
    held = os.open(running / "build.lock", os.O_WRONLY | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        DuckDBEngine(load_policy(policy)).close()  # a later build succeeds
    finally:
        os.close(held)
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".building"))
    assert left == [running.name], f"left: {left}"


def test_a_store_prepared_by_other_load_logic_is_rebuilt(tmp_path, monkeypatch) -> None:
    """The rank's hash changed (a float's sign bit joined it: test_zero_sign_ties.py) and a store ranked the old way
    would have stayed in use had STORE_FORMAT not been changed by hand. The SQL that prepares the tables is part of
    the store's identity now: any change to the load logic rebuilds the store."""
    policy = _policy(tmp_path, "store = true")
    DuckDBEngine(load_policy(policy), bounding_seed=3).close()
    assert not DuckDBEngine(load_policy(policy), bounding_seed=3).store_built
    original = bounding._ranks
    monkeypatch.setattr(bounding, "_ranks", lambda table, *rest: [*original(table, *rest), exp.alias_(
        exp.Literal.number(1), "__dp_extra")])
    changed = DuckDBEngine(load_policy(policy), bounding_seed=3)
    try:
        assert changed.store_built, "a store prepared by other load logic was used"
    finally:
        changed.close()
