"""The measurement store: every released noisy measurement, kept so that later answers can be derived from it.

What is kept of a measurement: what it measures (its relation's digest: the data version, the ranking of each
person's rows and the SQL of the bounded rows, rewrite/identity.py; its linear functional of those rows,
planning/functionals.py; its grouping with each key's declared values, and whether the cells outside them were
measured too), its noise (the mechanism, whose law is exact), the noisy integer of every cell, who paid for it and
which ledger entry. Only measurements whose noise was drawn and charged are kept: the public groups of a query
without partition selection (every one released, whatever the data), and the cells outside the declared values that
the same noise covers (planning/reuse.py, rule 3). A group that partition selection dropped was never noised and is
never stored.

Whose measurements a query may use: its analyst's own, unless the steward shares them (`[reuse] shared = true`):
see `MeasurementStore.candidates`. A SQLite file beside the ledger, mode 0600, owned by the steward like the ledger;
measurements of data that has changed (another data version) are deleted when it is opened, and those of another
ranking are never read. An engine whose ranking is its own (a fresh load draws a new secret salt) keeps its
measurements in memory only: no other engine could use them.
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from dpsql.dp.mechanisms import GaussianMechanism, LaplaceMechanism
from dpsql.errors import LedgerError
from dpsql.planning.functionals import Functional
from dpsql.planning.reuse import OTHER, Grouping, StoredMeasurement
from dpsql.store.answers import decode_value, encode_value

_SCHEMA = """
CREATE TABLE IF NOT EXISTS measurements (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at TEXT NOT NULL,
    analyst TEXT NOT NULL,
    charge INTEGER,
    data_version TEXT NOT NULL,
    relation TEXT NOT NULL,
    label TEXT NOT NULL,
    functional TEXT NOT NULL,
    grouping TEXT NOT NULL,
    mechanism TEXT NOT NULL,
    step TEXT NOT NULL,
    cells TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS measurements_by_relation ON measurements (relation, analyst);
"""
_CACHE = 4096  # measurements kept decoded in memory


def relation_key(data_version: str, ranking: str, relation: str) -> str:
    """The digest a measurement's relation is stored under: the data, the ranking, and the bounded rows' SQL."""
    return hashlib.sha256(json.dumps([data_version, ranking, relation]).encode()).hexdigest()


@dataclass(frozen=True)
class NewMeasurement:
    """A measurement just released, to be stored."""

    label: str
    functional: Functional
    grouping: Grouping
    mechanism: LaplaceMechanism | GaussianMechanism
    step: Fraction
    cells: dict[tuple[Any, ...], int]


class MeasurementStore:
    """The released measurements of one policy (thread-safe; shared by processes through SQLite). `path` None: in
    memory, for this process only."""

    def __init__(self, path: Path | None, data_version: str) -> None:
        self.path = path
        self.data_version = data_version
        self._lock = threading.Lock()
        self._decoded: dict[int, StoredMeasurement] = {}
        try:
            fresh = path is not None and not path.exists()
            self._con = sqlite3.connect(":memory:" if path is None else path, timeout=60, isolation_level=None,
                                        check_same_thread=False)
            if fresh:
                with contextlib.suppress(OSError):
                    os.chmod(path, 0o600)
            if path is not None:
                self._con.execute("PRAGMA journal_mode = WAL")
            self._con.executescript(_SCHEMA)
            # Invalidated when the data changes: measurements of other data can never be used again.
            self._con.execute("DELETE FROM measurements WHERE data_version != ?", (data_version,))
        except sqlite3.Error as exc:
            raise LedgerError(f"measurement store {path}: cannot be opened ({exc})") from None

    def put(self, relation: str, analyst: str, charge: int | None, measurements: Sequence[NewMeasurement]) -> None:
        """Keep measurements just released (their charge committed). A measurement that cannot be kept exactly is
        dropped: it is only lost for reuse."""
        at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        rows = []
        for m in measurements:
            try:
                rows.append((at, analyst, charge, self.data_version, relation, m.label, _text(m.functional),
                             _grouping_text(m.grouping), _mechanism_text(m.mechanism), str(m.step),
                             json.dumps([[[_cell_value(v) for v in cell], str(value)] for cell, value in
                                         m.cells.items()])))
            except (TypeError, ValueError):
                continue
        with self._lock:
            try:
                self._con.executemany(
                    "INSERT INTO measurements (at, analyst, charge, data_version, relation, label, functional, "
                    "grouping, mechanism, step, cells) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)
            except sqlite3.Error:
                return

    def candidates(self, relation: str, analyst: str, shared: bool) -> list[StoredMeasurement]:
        """The stored measurements of this relation that `analyst` may use: their own, or everyone's when shared. An
        unreadable store (or row) is no measurement: the query is then measured afresh."""
        query = "SELECT id, analyst, charge, label, functional, grouping, mechanism, step, cells FROM measurements " \
                "WHERE relation = ? AND data_version = ?"
        args: tuple[Any, ...] = (relation, self.data_version)
        if not shared:
            query, args = query + " AND analyst = ?", (*args, analyst)
        with self._lock:
            try:
                rows = self._con.execute(query + " ORDER BY id", args).fetchall()
            except sqlite3.Error:
                return []
        found = []
        for row in rows:
            decoded = self._decoded.get(row[0])
            if decoded is None:
                try:
                    decoded = _decoded(row)
                except (ValueError, KeyError, TypeError, IndexError):
                    continue
                if len(self._decoded) >= _CACHE:
                    self._decoded.pop(next(iter(self._decoded)))
                self._decoded[row[0]] = decoded
            found.append(decoded)
        return found

    def close(self) -> None:
        with self._lock, contextlib.suppress(sqlite3.Error):
            self._con.close()


def _decoded(row: tuple[Any, ...]) -> StoredMeasurement:
    identifier, analyst, charge, label, functional, grouping, mechanism, step, cells = row
    return StoredMeasurement(identifier, analyst, charge, label, _tuples(json.loads(functional)),
                             _grouping(json.loads(grouping)), _mechanism(json.loads(mechanism)), Fraction(step),
                             {tuple(_cell_decoded(v) for v in cell): int(value) for cell, value in json.loads(cells)})


def _text(functional: Functional) -> str:
    return json.dumps(functional)


def _tuples(value: Any) -> Any:
    """JSON's lists back to the tuples a functional is made of."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _grouping_text(grouping: Grouping) -> str:
    return json.dumps({"keys": list(grouping.keys), "domains": [[encode_value(v) for v in d] for d in grouping.domains],
                       "others": grouping.others})


def _grouping(found: dict[str, Any]) -> Grouping:
    return Grouping(tuple(found["keys"]), tuple(tuple(decode_value(v) for v in d) for d in found["domains"]),
                    bool(found["others"]))


def _cell_value(value: Any) -> Any:
    return {"other": ""} if value is OTHER else encode_value(value)


def _cell_decoded(value: Any) -> Any:
    return OTHER if isinstance(value, dict) and "other" in value else decode_value(value)


def _mechanism_text(mechanism: LaplaceMechanism | GaussianMechanism) -> str:
    if isinstance(mechanism, LaplaceMechanism):
        return json.dumps({"laplace": [mechanism.sensitivity, mechanism.epsilon]})
    return json.dumps({"gaussian": [mechanism.sensitivity, mechanism.rho, mechanism.squared]})


def _mechanism(found: dict[str, Any]) -> LaplaceMechanism | GaussianMechanism:
    if "laplace" in found:
        sensitivity, epsilon = found["laplace"]
        return LaplaceMechanism(int(sensitivity), float(epsilon))
    sensitivity, rho, squared = found["gaussian"]
    return GaussianMechanism(int(sensitivity), float(rho), None if squared is None else int(squared))
