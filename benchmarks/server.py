"""The wire server against the DB-API (issue 11): `python -m benchmarks.server [--rounds 200] [--clients 50]`.

Overhead: the same grouped query on the sample visits data (GROUP BY department: COUNT(*), AVG(cost), a parameter
in WHERE), through psycopg to `dpsql serve` running as its own process, and through `dpsql.connect` in this
process, alternating round by round. Each round uses a new parameter value, so every query is planned, charged,
run and noised on both sides (the server's answer cache is off for the same reason). The figure is the median of
the per-round differences, in milliseconds, and the median ratio.

Load: N clients at once (threads here, each with its own psycopg connection and its own login), each asking Q
distinct queries; throughput, p50 and p99 latency; then the ledger is read: the number of charges equals the
number of answers, and the total spent equals the sum of the charges (no overspend, nothing lost).

Sized for the 2-core machine (the server and the clients share it): the defaults run in about a minute.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path

import psycopg

import dpsql
from dpsql.frontends.server.users import UserStore, users_path
from dpsql.policy import load_policy
from dpsql.store.ledger import BudgetLedger

SAMPLE = Path(__file__).resolve().parent.parent / "sample_data"
QUERY = "SELECT department, COUNT(*), AVG(cost) FROM visits WHERE age > {} GROUP BY department"
PASSWORD = "benchmark password"


def _policy(folder: Path, clients: int) -> Path:
    for name in ("visits.csv", "patients.csv", "departments.csv", "regions.csv"):
        shutil.copy(SAMPLE / name, folder / name)
    text = (SAMPLE / "visits.toml").read_text().replace("epsilon = 50.0", "epsilon = 1000000.0")
    policy = folder / "visits.toml"
    policy.write_text(text + "\n[server]\nanswers = false\n")
    loaded = load_policy(policy)
    BudgetLedger(loaded.budget.ledger, loaded.budget, create=True).close()
    users = UserStore.load(users_path(loaded), create=True)
    for name in ["direct", "wire", *(f"client{i}" for i in range(clients))]:
        users.add(name, PASSWORD)
    users.save()
    return policy


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _serve(policy: Path, port: int) -> subprocess.Popen:
    log = (policy.parent / "serve.log").open("wb")  # a file, not a pipe: a full pipe would stall the server
    server = subprocess.Popen([sys.executable, "-c", "from dpsql.frontends.cli import main; main()", "serve",
                               "--policy", str(policy), "--port", str(port)], stdout=log, stderr=log)
    while True:  # ready when it accepts a connection (loading the tables takes a moment)
        if server.poll() is not None:
            raise RuntimeError(f"dpsql serve exited: {(policy.parent / 'serve.log').read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server
        except OSError:
            time.sleep(0.1)


def _dsn(port: int, user: str) -> str:
    return f"host=127.0.0.1 port={port} user={user} password='{PASSWORD}' dbname=visits sslmode=disable"


def _timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def overhead(policy: Path, port: int, rounds: int) -> dict:
    direct = dpsql.connect(policy, analyst="direct")
    wire = psycopg.connect(_dsn(port, "wire"), autocommit=True)
    try:
        cursor = direct.cursor()
        for warm in range(5):  # both sides prepared and warm, as a dashboard's connection is
            cursor.execute(QUERY.format(warm))
            cursor.fetchall()
            wire.execute(QUERY.format(warm)).fetchall()
        pairs = []
        for value in range(5, 5 + rounds):
            sql = QUERY.format(value)
            dbapi = _timed(lambda: (cursor.execute(sql), cursor.fetchall()))  # noqa: B023 - called at once
            server = _timed(lambda: wire.execute(sql).fetchall())  # noqa: B023
            pairs.append((dbapi, server))
    finally:
        wire.close()
        direct.close()
    return {"rounds": rounds,
            "dbapi_ms": statistics.median(p[0] for p in pairs) * 1e3,
            "server_ms": statistics.median(p[1] for p in pairs) * 1e3,
            "overhead_ms": statistics.median(p[1] - p[0] for p in pairs) * 1e3,
            "ratio": statistics.median(p[1] / p[0] for p in pairs)}


def load(policy: Path, port: int, clients: int, queries: int) -> dict:
    latencies: list[float] = []
    failures: list[str] = []
    lock = threading.Lock()
    start_line = threading.Barrier(clients + 1)

    def client(index: int) -> None:
        with psycopg.connect(_dsn(port, f"client{index}"), autocommit=True) as conn:
            start_line.wait()
            for number in range(queries):
                sql = QUERY.format(1000 + index * queries + number)  # every question distinct: all are charged
                try:
                    took = _timed(lambda: conn.execute(sql).fetchall())  # noqa: B023 - called at once
                except psycopg.Error as exc:
                    with lock:
                        failures.append(str(exc))
                    continue
                with lock:
                    latencies.append(took)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    start_line.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    loaded = load_policy(policy)
    ledger = BudgetLedger(loaded.budget.ledger, loaded.budget)
    try:
        charges = [c for c in ledger.history() if c.analyst.startswith("client")]
        spent = ledger.spending().epsilon_spent
        every = ledger.history()
    finally:
        ledger.close()
    ordered = sorted(latencies)
    return {"clients": clients, "queries": clients * queries, "answered": len(latencies), "failed": len(failures),
            "throughput_per_s": len(latencies) / elapsed,
            "p50_ms": ordered[len(ordered) // 2] * 1e3, "p99_ms": ordered[int(len(ordered) * 0.99) - 1] * 1e3,
            "charges": len(charges),
            "ledger_exact": len(charges) == len(latencies)
            and abs(float(sum((c.epsilon for c in every), Fraction(0))) - spent) < 1e-9}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--queries", type=int, default=10, help="queries per client in the load test")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        policy = _policy(Path(scratch), args.clients)
        port = _free_port()
        server = _serve(policy, port)
        try:
            cost = overhead(policy, port, args.rounds)
            print(f"overhead: DB-API {cost['dbapi_ms']:.2f} ms, server {cost['server_ms']:.2f} ms per query "
                  f"(median of {cost['rounds']} alternating rounds); protocol overhead {cost['overhead_ms']:.2f} ms, "
                  f"ratio {cost['ratio']:.2f}")
            busy = load(policy, port, args.clients, args.queries)
            print(f"load: {busy['clients']} clients, {busy['answered']}/{busy['queries']} answered "
                  f"({busy['failed']} failed), {busy['throughput_per_s']:.0f} queries/s, p50 {busy['p50_ms']:.1f} ms, "
                  f"p99 {busy['p99_ms']:.1f} ms; ledger: {busy['charges']} charges, exact: {busy['ledger_exact']}")
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    main()
