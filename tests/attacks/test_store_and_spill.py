"""Red team (stop 22's surface): where DuckDB writes pieces of the data, and the prepared store's identity.

DuckDB spills to `temp_directory` whatever does not fit in its memory limit. Its default, for an in-memory database,
is `.tmp` in the process's working directory, created with the process's umask (0755 folder, 0644 files on a usual
system), and the sandbox's `enable_external_access = false` does not stop it (checked by hand: a 3M-row sort under a
60MB limit wrote duckdb_temp_*_storage_*.tmp files of mode 0644 into ./.tmp of a locked sandbox connection). Without
`[engine] memory_limit` dpsql left that default, so a query that needs more than 80% of the machine's memory (the
default limit: large data, a large join) wrote sorted private rows, readable by others, wherever dpsql was started."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from benchmarks.support import write_csv, write_policy
from dpsql.engines.duckdb_engine import DuckDBEngine
from dpsql.policy import load_policy


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
