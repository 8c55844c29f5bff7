"""What a load reads, as one fingerprint: the engine's data version.

Two engines with the same version hold the same data, so an answer released about one still holds for the other
(store/answers.py keys answers on it) and a prepared store built for it may be used (engines/store.py). It covers
the policy's text and each source: a file's path, size, modification time and a sample of its content; a database
source's version, read in the same snapshot as its rows (engines/database.py).
"""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
from collections.abc import Mapping

from dpsql.policy import Policy

_SAMPLE = 1 << 16  # bytes read from the start and from the end of each source file for its fingerprint


def data_version(policy: Policy, versions: Mapping[str, bytes]) -> str:
    """The fingerprint of the policy's text and of each source's version (`versions`, by table name): a file
    source's from `file_versions`, taken before a load (a file changed during the load gives a new version next
    time, never an old one for new data), a database source's as read in the snapshot its rows come from."""
    digest = hashlib.sha256()
    try:
        digest.update(policy.path.read_bytes())
    except OSError:
        digest.update(repr(policy).encode())
    for table in sorted(policy.tables.values(), key=lambda t: t.name):
        source = table.source
        # A file source is named as dpsql always named it, so that its version (the answers kept for it) stays.
        named = repr(source) if source.kind == "database" else \
            f"Source(kind={source.kind!r}, pattern={source.pattern!r}, table={source.table!r})"
        digest.update(f"({table.name!r}, {named})".encode())
        digest.update(versions[table.name])
    return digest.hexdigest()


def file_versions(policy: Policy) -> dict[str, bytes]:
    """Each file source's version now, by table name: its files' fingerprints."""
    return {table.name: b"".join(map(file_fingerprint, source_files(table.source.kind, table.source.pattern)))
            for table in policy.tables.values() if table.source.kind != "database"}


def source_files(kind: str, pattern: str) -> list[str]:
    """The files a source reads: DuckDB's glob matches hidden files (`*.csv` matches `.x.csv`), and a database
    file is opened with its write-ahead log replayed (DuckDB's `<file>.wal`, SQLite's `-wal` and `-journal`),
    present or not."""
    if kind == "sqlite":
        return [pattern, f"{pattern}-wal", f"{pattern}-journal"]
    files = sorted(glob.glob(pattern, recursive=True, include_hidden=True))
    if kind == "duckdb":
        return [part for name in files for part in (name, f"{name}.wal")]
    return files


def file_fingerprint(name: str) -> bytes:
    """A file's path, size, modification time and a digest of its first and last 64 KiB (a copy that keeps the size
    and the times still changes it, and a large file is not read whole). As dpsql has always taken it: a file
    source's version, and so the answers kept for it, stay what they were."""
    stamp = b""
    with contextlib.suppress(OSError):
        stat = os.stat(name)
        stamp = repr((name, stat.st_size, stat.st_mtime_ns)).encode()
    try:
        with open(name, "rb") as file:
            head = file.read(_SAMPLE)
            size = file.seek(0, os.SEEK_END)
            file.seek(max(size - _SAMPLE, len(head)))
            return stamp + hashlib.sha256(head + file.read()).digest()
    except OSError:
        return stamp + b"unreadable"
