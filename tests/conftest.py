"""Fixtures only: the shipped sample policies with fresh ledgers, and a seeded session over PUMS.

The helpers the tests share with the benchmarks (data files, policies, ledgers, seeded sessions) are in
benchmarks/support.py. Randomness: every test that draws noise passes `seeded(n)`, so runs repeat exactly;
statistical tolerances come from the distribution, never from hand-picked slack.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import warnings
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


def pytest_configure(config: pytest.Config) -> None:
    # Before the test modules are imported: their sweep sizes are read at import (tests/sizes.py).
    sizes.FAST = "not slow" in (config.option.markexpr or "")
    # The suite builds many short-lived syntax trees: collecting the young generation every 700 allocations cost
    # about a tenth of its CPU (benchmarks/results/query_overhead.md). Collected less often, nothing else changes.
    gc.set_threshold(50_000, 20, 20)


def _pums_policy(folder: Path) -> Path:
    for name in ("pums.toml", "PUMS_pid.csv"):
        shutil.copy(SAMPLE / "pums" / name, folder / name)
    return create_ledger(folder / "pums.toml")


def _visits_policy(folder: Path) -> Path:
    for name in VISITS_FILES:
        shutil.copy(SAMPLE / name, folder / name)
    return create_ledger(folder / "visits.toml")


@pytest.fixture
def pums_policy(tmp_path: Path) -> Path:
    """The shipped PUMS policy, with its data and a fresh ledger in a temporary folder."""
    return _pums_policy(tmp_path)


@pytest.fixture
def visits_policy(tmp_path: Path) -> Path:
    return _visits_policy(tmp_path)


# One session shared by a module's refusal cases: each case asserts that its refused query spent nothing, so a fresh
# session per case (opening one was most of their time) would check nothing more.
@pytest.fixture(scope="module")
def refusing_pums_session(tmp_path_factory: pytest.TempPathFactory):
    with contextlib.closing(PrivateSession(_pums_policy(tmp_path_factory.mktemp("pums")), "tester", rng=seeded(1),
                                           bounding_seed=7)) as session:
        yield session


@pytest.fixture(scope="module")
def refusing_visits_session(tmp_path_factory: pytest.TempPathFactory):
    with contextlib.closing(PrivateSession(_visits_policy(tmp_path_factory.mktemp("visits")), "tester",
                                           rng=seeded(3), bounding_seed=5)) as session:
        yield session


@pytest.fixture
def pums_session(pums_policy: Path):
    session = PrivateSession(pums_policy, "tester", rng=seeded(1), bounding_seed=7)
    yield session
    session.close()


@pytest.fixture(scope="session")
def postgres():
    """A PostgreSQL server of the tests' own (benchmarks/postgres.py), started once per test process and stopped at
    its end. The database-source tests need the system's PostgreSQL binaries: .ci/run installs them; without them
    the tests are skipped here, loudly, and fail in CI (.ci/run sets DPSQL_REQUIRE_POSTGRES=1; not CI=true, which
    changes Hypothesis's settings), where a skip would hide that they never ran."""
    from benchmarks.postgres import LocalPostgres, binaries

    if binaries() is None:
        message = ("NO POSTGRESQL SERVER BINARIES (apt-get install postgresql): the database-source tests against a "
                   "real PostgreSQL server did not run")
        if os.environ.get("DPSQL_REQUIRE_POSTGRES"):
            pytest.fail(message)
        warnings.warn(message, stacklevel=1)
        pytest.skip(message)
    with LocalPostgres() as server:
        yield server


@pytest.fixture
def pg_password(postgres, monkeypatch):
    """The steward's environment: libpq reads the password from PGPASSWORD, never from a policy."""
    for name, value in postgres.environment().items():
        monkeypatch.setenv(name, value)
    return postgres
