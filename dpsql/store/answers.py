"""Answers already released, kept so that the same question asked again costs nothing.

Returning an answer that was already released is post-processing: it reveals nothing the analyst does not hold,
so it is free. A dashboard that refreshes every minute would otherwise drain the budget, and an analyst who repeats
a query to average its noise away gets the same noise back instead.

An answer is stored under a key naming everything that decided it: the analyst, the query as parsed with its
parameters bound (so whitespace, comments and the spelling of keywords do not matter), the query's budget
(epsilon, delta, accounting, mechanism) and the data's version (the policy and the sources' sizes and times, so a
changed table is a new question). Answers are kept per analyst: another analyst's answer would be free for them
too, but which questions someone asked is theirs.

A SQLite file beside the ledger, owned by the steward like the ledger (mode 0600): it holds released answers
only, never rows. What cannot be stored losslessly (a value type the codec does not know) is simply not kept.
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import hashlib
import json
import math
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpsql.errors import LedgerError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS answers (
    key TEXT PRIMARY KEY,
    at TEXT NOT NULL,
    answer TEXT NOT NULL
)
"""


@dataclass(frozen=True)
class StoredAnswer:
    rows: list[tuple[Any, ...]]
    intervals: list[tuple[tuple[float, float] | None, ...]]
    noise_std: list[tuple[float | None, ...]]
    released_groups: int
    at: str  # when it was first released (UTC, ISO 8601)


def answer_key(analyst: str, canonical_query: str, budget: object, data_version: str,
               quantile_intervals: bool = True) -> str:
    """One text naming everything that decided an answer (see the module's docstring). A quantile measured
    without its interval (its value had the whole epsilon) is another answer; the flag joins the key only then, so
    the keys of answers stored before it existed stay as they were."""
    parts = json.dumps([analyst, canonical_query, repr(budget), data_version,
                        *([] if quantile_intervals else ["quantile values without intervals"])])
    return hashlib.sha256(parts.encode()).hexdigest()


class AnswerStore:
    """The released answers, shared by the sessions of one process (thread-safe) and by processes (SQLite)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        try:
            fresh = not path.exists()
            self._con = sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)
            if fresh:
                with contextlib.suppress(OSError):
                    os.chmod(path, 0o600)
            self._con.execute("PRAGMA journal_mode = WAL")
            self._con.execute(_SCHEMA)
        except sqlite3.Error as exc:
            raise LedgerError(f"answer cache {path}: cannot be opened ({exc})") from None

    def get(self, key: str) -> StoredAnswer | None:
        with self._lock:
            try:
                found = self._con.execute("SELECT at, answer FROM answers WHERE key = ?", (key,)).fetchone()
            except sqlite3.Error:
                return None  # an unreadable cache is a miss: the query is then answered (and charged) afresh
        if found is None:
            return None
        try:
            answer = json.loads(found[1])
            return StoredAnswer(rows=[tuple(map(decode_value, row)) for row in answer["rows"]],
                                intervals=[tuple(None if i is None else (i[0], i[1]) for i in row)
                                           for row in answer["intervals"]],
                                noise_std=[tuple(row) for row in answer["noise_std"]],
                                released_groups=answer["released_groups"], at=found[0])
        except (ValueError, KeyError, TypeError, IndexError):
            return None

    def put(self, key: str, rows: list[tuple[Any, ...]], intervals: list, noise_std: list,
            released_groups: int) -> bool:
        """Keep an answer just released; False (and nothing kept) if a value cannot be stored exactly."""
        try:
            text = json.dumps({"rows": [[encode_value(value) for value in row] for row in rows],
                               "intervals": [[None if i is None else [_number(i[0]), _number(i[1])] for i in row]
                                             for row in intervals],
                               "noise_std": [[None if s is None else _number(s) for s in row] for row in noise_std],
                               "released_groups": released_groups}, allow_nan=False)
        except (TypeError, ValueError):
            return False
        at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        with self._lock:
            try:  # the first answer stays: two sessions racing on one question both paid for theirs
                self._con.execute("INSERT OR IGNORE INTO answers VALUES (?, ?, ?)", (key, at, text))
            except sqlite3.Error:
                return False
        return True

    def close(self) -> None:
        with self._lock, contextlib.suppress(sqlite3.Error):
            self._con.close()


def _number(value: Any) -> float:
    """A float that JSON keeps exactly (repr round-trips); infinities cannot be kept."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise TypeError(f"not a finite number: {value!r}")
    return value


# Values as tagged JSON: each type the released rows hold, restored to the same Python type and value.
def encode_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return {"int": str(value)}
    if isinstance(value, float):
        return {"float": value.hex()}  # exact, NaN and infinities included
    if isinstance(value, decimal.Decimal):
        return {"decimal": str(value)}
    if isinstance(value, datetime.datetime):
        return {"datetime": value.isoformat()}
    if isinstance(value, datetime.date):
        return {"date": value.isoformat()}
    if isinstance(value, datetime.time):
        return {"time": value.isoformat()}
    raise TypeError(f"cannot keep a {type(value).__name__}")


def decode_value(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    (tag, text), = value.items()
    decoders = {"int": int, "float": float.fromhex, "decimal": decimal.Decimal,
                "datetime": datetime.datetime.fromisoformat, "date": datetime.date.fromisoformat,
                "time": datetime.time.fromisoformat}
    return decoders[tag](text)
