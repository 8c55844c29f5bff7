"""The Spark engine's prepared store: each prepared table written as Parquet by Spark, once, into a folder the
steward owns (`[engine] store` with kind = "spark"; `true`: `<policy>.store.spark` beside the ledger).

The same rules as the DuckDB store (engines/store.py), whose identity and privacy checks it shares: the folder holds
the rows and their secret ranks, so it is created mode 0700 and refused if others can read it; it is used only for
the very policy, sources, PySpark version, store format and kind of salt it was built for (`identity.json`,
written last); a build writes into a private temporary folder beside it and is renamed into place when complete, so
a crash leaves the old store (stale, so rebuilt) or none, never half of one in use.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from dpsql.engines import store

SPARK_STORE_FORMAT = 1
_IDENTITY = "identity.json"


def identity(data_version: str, bounding_seed: int | None, spark_version: str) -> store.Identity:
    return store.identity(f"{data_version}|spark {spark_version}|{SPARK_STORE_FORMAT}", bounding_seed)


def ready(path: Path, wanted: store.Identity) -> bool:
    """Whether the store at `path` exists and was built for `wanted` (refused if others can read it)."""
    if not path.exists():
        return False
    store.check_private(path)
    try:
        found = json.loads((path / _IDENTITY).read_text())
    except (OSError, ValueError):
        return False  # no identity: a build that never finished, or not a store
    return found == {"fingerprint": wanted.fingerprint, "salt": wanted.salt}


def table_path(path: Path, name: str) -> Path:
    return path / "tables" / name


def build(path: Path, wanted: store.Identity, tables: Mapping[str, Callable[[Path], None]]) -> None:
    """Write each prepared table (a function that writes it as Parquet where it is told), then the identity, into
    a private temporary folder, and put that folder in the store's place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".building", dir=path.parent))  # mode 0700
    try:
        for name, write in tables.items():
            write(table_path(building, name))
        (building / _IDENTITY).write_text(json.dumps({"fingerprint": wanted.fingerprint, "salt": wanted.salt}))
        old = None
        if path.exists():  # a directory cannot replace a non-empty one: the old store steps aside first
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old / "store")
        os.replace(building, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(building, ignore_errors=True)
