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
from collections.abc import Callable, Mapping
from pathlib import Path

from dpsql.engines import store

SPARK_STORE_FORMAT = 1
_IDENTITY = "identity.json"


def identity(data_version: str, bounding_seed: int | None, spark_version: str, load: str) -> store.Identity:
    """As the DuckDB store's (`store.identity`), with Spark's version and `load`, the SQL that prepares the tables
    (`store.load_sql`): a store prepared by other load logic is rebuilt, not used."""
    return store.identity(f"{data_version}|spark {spark_version}|{SPARK_STORE_FORMAT}", bounding_seed, load)


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
    """Write each prepared table (a function that writes it as Parquet where it is told), then the identity, in a
    private building folder (`store.building_folder`, which also removes what killed builds left), and put the
    finished store in its place. A folder cannot replace a non-empty one: an old store first moves into the building
    folder, which is removed with it."""
    with store.building_folder(path) as building:
        built = building / "store"
        built.mkdir(mode=0o700)  # the store's own mode: only its owner may read what Spark writes in it
        for name, write in tables.items():
            write(table_path(built, name))
        (built / _IDENTITY).write_text(json.dumps({"fingerprint": wanted.fingerprint, "salt": wanted.salt}))
        if path.exists():
            os.replace(path, building / "old")
        os.replace(built, path)
