"""Shared test helpers: write small policies and data files into a temporary folder.

Randomness: every test that draws noise passes `seeded(n)`, dpsql's insecure generator for tests, so runs
repeat exactly; statistical tolerances come from the distribution, never from hand-picked slack.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path
from typing import Any

import pytest

from dpsql.dp.noise import InsecureSeededRandomForTests
from dpsql.policy import load_policy
from dpsql.session import PrivateSession
from dpsql.store.ledger import BudgetLedger

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_data"


def seeded(seed: int) -> InsecureSeededRandomForTests:
    return InsecureSeededRandomForTests(seed)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str | Path):
        return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(type(value))


def create_ledger(policy: Path) -> Path:
    """The steward's one-time step: create the policy's budget ledger (`dpsql budget --init`)."""
    loaded = load_policy(policy)
    BudgetLedger(loaded.budget.ledger, loaded.budget, create=True).close()
    return policy


def write_policy(path: Path, tables: dict[str, dict[str, Any]], budget: dict[str, Any] | None = None) -> Path:
    """A policy TOML: `tables` maps a name to its keys, with `columns` mapping column names to inline tables.
    Its ledger is not created: sessions in the tests that need one pass create_ledger=True or call
    create_ledger."""
    budget = {"epsilon": 100.0, "delta": 1e-6, "query_epsilon": 1.0, **(budget or {})}
    lines = ["[budget]", *(f"{k} = {toml_value(v)}" for k, v in budget.items())]
    for name, spec in tables.items():
        lines += ["", f"[tables.{name}]"]
        lines += [f"{k} = {toml_value(v)}" for k, v in spec.items() if k != "columns"]
        lines += ["", f"[tables.{name}.columns]"]
        lines += [f"{col} = {toml_value(c)}" for col, c in spec["columns"].items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_csv(path: Path, header: list[str], rows: list[tuple]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(["" if v is None else v for v in row] for row in rows)
    return path


@pytest.fixture
def pums_policy(tmp_path: Path) -> Path:
    """The shipped PUMS policy, with its data and a fresh ledger in a temporary folder."""
    for name in ("pums.toml", "PUMS_pid.csv"):
        shutil.copy(SAMPLE / "pums" / name, tmp_path / name)
    return create_ledger(tmp_path / "pums.toml")


@pytest.fixture
def visits_policy(tmp_path: Path) -> Path:
    for name in ("visits.toml", "visits.csv"):
        shutil.copy(SAMPLE / name, tmp_path / name)
    return create_ledger(tmp_path / "visits.toml")


@pytest.fixture
def pums_session(pums_policy: Path):
    session = PrivateSession(pums_policy, "tester", rng=seeded(1), bounding_seed=7)
    yield session
    session.close()
