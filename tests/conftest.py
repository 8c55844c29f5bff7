"""Fixtures only: the shipped sample policies with fresh ledgers, and a seeded session over PUMS.

The helpers the tests share with the benchmarks (data files, policies, ledgers, seeded sessions) are in
benchmarks/support.py. Randomness: every test that draws noise passes `seeded(n)`, so runs repeat exactly;
statistical tolerances come from the distribution, never from hand-picked slack.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks.support import create_ledger, seeded
from dpsql.session import PrivateSession
from tests import sizes

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "sample_data"
# The files of the sample visits policy: its tables' data beside it.
VISITS_FILES = ("visits.toml", "visits.csv", "patients.csv", "departments.csv", "regions.csv")


def copy_visits_data(folder: Path) -> None:
    """The sample visits data (every table of visits.toml) into `folder`, the policy not included."""
    for name in VISITS_FILES[1:]:
        shutil.copy(SAMPLE / name, folder / name)


@pytest.fixture
def pums_policy(tmp_path: Path) -> Path:
    """The shipped PUMS policy, with its data and a fresh ledger in a temporary folder."""
    for name in ("pums.toml", "PUMS_pid.csv"):
        shutil.copy(SAMPLE / "pums" / name, tmp_path / name)
    return create_ledger(tmp_path / "pums.toml")


def pytest_configure(config: pytest.Config) -> None:
    # Before the test modules are imported: their sweep sizes are read at import (tests/sizes.py).
    sizes.FAST = "not slow" in (config.option.markexpr or "")


@pytest.fixture
def visits_policy(tmp_path: Path) -> Path:
    for name in VISITS_FILES:
        shutil.copy(SAMPLE / name, tmp_path / name)
    return create_ledger(tmp_path / "visits.toml")


@pytest.fixture
def pums_session(pums_policy: Path):
    session = PrivateSession(pums_policy, "tester", rng=seeded(1), bounding_seed=7)
    yield session
    session.close()
