"""A prepared store: the engine's prepared tables (typed, cleaned, ranked by the secret salted hash, fixed-point
columns) built once into a DuckDB file, so that a query attaches it read-only instead of loading every source again.

The store is as secret as the data: it holds the rows, and its ranks were drawn with a salt that must stay
unpredictable. It lives where the steward names it (`[engine] store` in the policy; default beside the ledger), is
written mode 0600 inside a folder of mode 0700, and a store that others can read is refused, as is one built for
other data: the identity kept inside it (`Identity`) must match the engine's data version (the policy's text, each
source file's path, size, modification time and a sample of its content, each database source's version:
engines/versions.py), the DuckDB version, the store format and
the SQL that prepares the tables, and how its salt was chosen (secret and random, or a test's fixed seed: a store
built with a known seed is never used without it).

A build writes into a private temporary folder beside the store and renames the finished file into place, so a
crash leaves the old store (which no longer matches, so it is rebuilt) or none, never half of one in use.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import duckdb
from sqlglot import exp

from dpsql.engines.database import versions_now
from dpsql.engines.loading import TableLoader, portable_ranks
from dpsql.engines.progress import SILENT, Progress, duckdb_percent
from dpsql.engines.versions import data_version
from dpsql.errors import PolicyError
from dpsql.policy import Policy
from dpsql.rewrite import bounding
from dpsql.sql import sandbox
from dpsql.sql.names import TWIN_SCHEMA
from dpsql.sql.parse import DIALECT

# 2: a float's sign bit joins the row hash; a store built with a fixed seed ranks by the portable key.
# 3: the prepared tables have the known flags and the varies mask, rows of units over the bound last (bounding.py).
# 4: a value not exactly of its declared type (1.5 in an int column) fails the load: an older store may hold it
#    rounded (engines/exact_values.py).
STORE_FORMAT = 4
_IDENTITY_TABLE = "__dp_store_identity"
# A random token drawn at each build: which ranking (which secret salt) the store's rows carry, never the salt itself.
_BUILD_TABLE = "__dp_store_build"


@dataclass(frozen=True)
class Identity:
    """What a store was built from; a store is used only for the very same."""

    fingerprint: str  # the policy, its sources, DuckDB's version, the store format
    salt: str  # "secret" for a random salt; for a test's fixed seed, a digest of it


def identity(data_version: str, bounding_seed: int | None, load: str = "") -> Identity:
    """`data_version` is the engine's fingerprint of the policy and its sources (duckdb_engine.data_version); `load`
    the SQL a build runs (load_sql)."""
    fingerprint = hashlib.sha256(f"{data_version}|{duckdb.__version__}|{STORE_FORMAT}|{load}".encode()).hexdigest()
    salt = "secret" if bounding_seed is None else hashlib.sha256(f"seed {bounding_seed}".encode()).hexdigest()
    return Identity(fingerprint, salt)


def ensure(policy: Policy, files: Mapping[str, bytes], bounding_seed: int | None, config: dict[str, str],
           progress: Progress = SILENT) -> tuple[Identity, bool, str]:
    """The identity of the policy's store, whether it had to be built (it was missing or stale), and the data version
    it holds. `files`: the file sources' versions, taken before (versions.file_versions); database sources are asked
    for theirs now, and a build reads them again in the snapshot of the rows it copies, so the store is labelled
    with the version of the very rows it holds."""
    assert policy.store is not None
    portable = portable_ranks(bounding_seed)
    load = load_sql(policy, portable)
    if policy.store.exists():  # asking a database for its version may scan its table: only when there is a store
        version = data_version(policy, {**files, **versions_now(policy)})
        wanted = identity(version, bounding_seed, load)
        if ready(policy.store, wanted):
            return wanted, False, version
    version = build(policy.store, policy, files, bounding_seed, load, config, portable, progress)
    return identity(version, bounding_seed, load), True, version


def load_sql(policy: Policy, portable: bool = False, listed: bool = True) -> str:
    """The SQL that prepares each table, over a placeholder source and salt: part of the store's identity, so that a
    store prepared by other load logic (an older dpsql: ranks, cleaning, fixed point) is rebuilt, not used, without
    anyone having to remember to change STORE_FORMAT."""
    source = exp.to_table("__dp_source")
    parts = []
    for table in policy.tables.values():
        if table.public:
            parts.append(bounding.cleaned_rows(table, source))
        else:
            parts.append(bounding.prepared_rows(table, source, 0, portable))
            later = bounding.later_rows(table, "__dp_prepared") if listed else None
            if later is not None:
                parts.append(later)
    return "\n".join(part.sql(DIALECT) for part in parts)


def ready(path: Path, wanted: Identity) -> bool:
    """Whether the store at `path` exists and was built for `wanted` (refused if others can read it)."""
    if not path.exists():
        return False
    check_private(path)
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error:
        return False  # not a store this DuckDB can open: rebuilt
    try:
        return matches(con, wanted)
    finally:
        con.close()


def matches(con: duckdb.DuckDBPyConnection, wanted: Identity) -> bool:
    """Whether the store open as `con`'s default database was built for `wanted`."""
    try:
        found = con.execute(f"SELECT fingerprint, salt FROM {_IDENTITY_TABLE}").fetchall()
    except duckdb.Error:
        return False
    return found == [(wanted.fingerprint, wanted.salt)]


def build(path: Path, policy: Policy, files: Mapping[str, bytes], bounding_seed: int | None, load: str,
          config: dict[str, str], portable: bool = False, progress: Progress = SILENT) -> str:
    """Build the store for `policy` at `path` (replacing any older one), atomically, telling `progress` of each
    step; returns the data version it holds."""
    with building_folder(path) as building:
        target = building / path.name
        with sandbox.opened(config, database=str(target)) as con, duckdb_percent(con, progress) as percent:
            con.execute(f"CREATE SCHEMA {TWIN_SCHEMA}")
            loader = TableLoader(con, policy.path.name, portable, progress, percent, store=path)
            salt = new_salt(bounding_seed)
            for table in policy.tables.values():
                loader.load(table, salt)
            version = data_version(policy, {**files, **loader.versions})
            wanted = identity(version, bounding_seed, load)
            con.execute(f"CREATE TABLE {_IDENTITY_TABLE} (fingerprint VARCHAR, salt VARCHAR)")
            con.execute(f"INSERT INTO {_IDENTITY_TABLE} VALUES (?, ?)", [wanted.fingerprint, wanted.salt])
            con.execute(f"CREATE TABLE {_BUILD_TABLE} (token VARCHAR)")
            con.execute(f"INSERT INTO {_BUILD_TABLE} VALUES (?)", [secrets.token_hex(16)])
            with progress.step(f"writing the prepared store {path.name}"):
                con.execute("CHECKPOINT")
        con.close()
        os.chmod(target, 0o600)
        os.replace(target, path)
    return version


_BUILDING = ".building"
_BUILD_LOCK = "build.lock"


@contextlib.contextmanager
def building_folder(path: Path) -> Iterator[Path]:
    """A private folder (mode 0700) beside the store at `path` to build it in, removed with what is left in it when
    the block ends; the build renames what it made into place.

    Until then the folder holds a partial copy of the data. A build killed mid-way (kill -9, the OOM killer) cannot
    remove its folder; the next build does: each live build holds an exclusive lock on its folder's lock file,
    which the kernel drops with the process, so a folder whose lock can be taken belongs to no running build."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned_builds(path)
    building = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=_BUILDING, dir=path.parent))
    lock = os.open(building / _BUILD_LOCK, os.O_WRONLY | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        yield building
    finally:
        shutil.rmtree(building, ignore_errors=True)
        os.close(lock)  # after the folder is gone: until then no other build may take it for abandoned


def _remove_abandoned_builds(path: Path) -> None:
    """Remove the building folders beside `path` whose build's process has died (see `building_folder`). A folder
    without a lock file yet (its build is starting) or whose lock is held is left alone."""
    for folder in path.parent.glob(f".{glob.escape(path.name)}.*{_BUILDING}"):
        try:
            lock = os.open(folder / _BUILD_LOCK, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # a live build holds it
        else:
            shutil.rmtree(folder, ignore_errors=True)
        finally:
            os.close(lock)


def build_token(con: duckdb.DuckDBPyConnection) -> str | None:
    """The token of the build the store open as `con`'s default database came from (None: built before tokens)."""
    try:
        found = con.execute(f"SELECT token FROM {_BUILD_TABLE}").fetchall()
    except duckdb.Error:
        return None
    return found[0][0] if len(found) == 1 else None


def ranking(data_version: str, bounding_seed: int | None, load: str, token: str | None = None) -> tuple[str, bool]:
    """The identity of a ranking of each person's rows, and whether it outlives the engine: a test's fixed seed
    ranks alike every time (with the same load SQL and DuckDB); a store's secret salt is the store build's (its
    token); a fresh secret salt is this engine's alone."""
    if bounding_seed is not None:
        digest = hashlib.sha256(f"seed {bounding_seed}|{load}|{duckdb.__version__}".encode()).hexdigest()
        return f"seed {digest}", True
    if token is not None:
        return f"store {hashlib.sha256(f'{data_version}|{token}'.encode()).hexdigest()}", True
    return f"load {secrets.token_hex(16)}", False


def new_salt(bounding_seed: int | None) -> int:
    # The salt makes the per-unit choice of rows unpredictable; a fixed one is for tests only.
    return bounding_seed if bounding_seed is not None else secrets.randbits(62)


def check_private(path: Path) -> None:
    """Refuse a store that anyone but its owner can read or write: it holds the rows and their secret ranks."""
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise PolicyError(f"the prepared store {path} can be read or written by others (mode {stat.filemode(mode)});"
                          f" it holds the data: `chmod 600` it, or delete it and it is rebuilt private")
