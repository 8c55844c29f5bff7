"""A throwaway PostgreSQL server for the tests and benchmarks of database sources (engines/database.py).

`LocalPostgres` runs the system's own PostgreSQL binaries (Debian's `postgresql` package puts them under
/usr/lib/postgresql/<version>/bin, not on PATH) on a free local port, its cluster and socket in a fresh temporary
folder, with password authentication (SCRAM) for every connection, so that the tests see credentials travel as a
steward's would: from PGPASSWORD, a service file or .pgpass, never from a policy.

PostgreSQL refuses to run as root, and CI runs as root: then the cluster belongs to the `postgres` account the
package creates (else `nobody`), and initdb, pg_ctl and the server run as that user (subprocess's `user=`, which
drops privileges before exec: no su or sudo to configure). The folder is made for that user; nothing outside it
is touched. `stop` ends the server (pg_ctl stop -m immediate, then the folder is removed); the class is a context
manager so that a failing test still stops it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

SUPERUSER = "steward"
PASSWORD = "s3cret-Pa55word"  # the tests' own cluster: what they check never shows up in any output


def binaries() -> Path | None:
    """The folder of the newest installed PostgreSQL server's binaries (initdb, pg_ctl, postgres), or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).resolve().parent if on_path else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _server_user() -> pwd.struct_passwd | None:
    """The account the server runs as: None (this process's own) unless this process is root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("running as root, and neither a 'postgres' nor a 'nobody' account exists to run PostgreSQL")


class LocalPostgres:
    """A PostgreSQL cluster of its own: `start()`, then `uri(database)` to reach it, `stop()` at the end."""

    def __init__(self, bin_dir: Path | None = None) -> None:
        found = bin_dir or binaries()
        if found is None:
            raise FileNotFoundError("no PostgreSQL server binaries (apt-get install postgresql)")
        self.bin = found
        self.port = 0
        self.folder: Path | None = None
        self._user = _server_user()

    @property
    def data(self) -> Path:
        assert self.folder is not None
        return self.folder / "data"

    def _run(self, *args: str) -> None:
        kwargs = {} if self._user is None else {"user": self._user.pw_uid, "group": self._user.pw_gid,
                                                 "extra_groups": []}
        done = subprocess.run([str(self.bin / args[0]), *args[1:]], capture_output=True, text=True,
                              cwd=self.folder, env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C.UTF-8"},
                              **kwargs)
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")

    def start(self) -> LocalPostgres:
        self.folder = Path(tempfile.mkdtemp(prefix="dpsql-pg-"))
        password = self.folder / "pwfile"
        password.write_text(PASSWORD + "\n")
        if self._user is not None:
            os.chown(self.folder, self._user.pw_uid, self._user.pw_gid)
            os.chown(password, self._user.pw_uid, self._user.pw_gid)
        os.chmod(self.folder, 0o700)
        self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, f"--pwfile={password}", "--auth=scram-sha-256",
                  "-E", "UTF8", "--locale=C", "--no-sync")
        password.unlink()
        self.port = _free_port()
        options = (f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=40")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.folder / "log"), "-o", options, "-w", "start")
        return self

    def stop(self) -> None:
        if self.folder is None:
            return
        with contextlib.suppress(RuntimeError):
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None

    def __enter__(self) -> LocalPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def uri(self, database: str = "postgres", password: bool = False) -> str:
        """The URI of a database, without the password unless asked (a policy never holds it)."""
        secret = f":{PASSWORD}" if password else ""
        return f"postgresql://{SUPERUSER}{secret}@127.0.0.1:{self.port}/{database}"

    def environment(self) -> dict[str, str]:
        """The variables that let libpq log in: the password from the environment, as a steward's service would."""
        return {"PGPASSWORD": PASSWORD}

    def connect(self, database: str = "postgres"):  # psycopg's connection, for loading test data
        import psycopg
        return psycopg.connect(self.uri(database, password=True), autocommit=True)

    def create_database(self, name: str, encoding: str = "UTF8") -> None:
        with self.connect() as con:
            con.execute(f'CREATE DATABASE "{name}" ENCODING \'{encoding}\' TEMPLATE template0 LC_COLLATE \'C\' '
                        "LC_CTYPE 'C'")


# The PostgreSQL type each declared type is stored as when a policy's CSV files are loaded (`serve_from_postgres`).
PG_TYPES = {"int": "bigint", "float": "double precision", "text": "text", "bool": "boolean", "date": "date",
            "timestamp": "timestamp"}


def serve_from_postgres(server: LocalPostgres, database: str, policy: Path, target: Path,
                        types: dict[str, str] | None = None) -> Path:
    """Load each CSV table of `policy` into `database` (created) and write `target`: the same policy, each table's
    source now that PostgreSQL table (no password in it: PGPASSWORD gives it). `types` overrides the PostgreSQL
    type of a column (`"visits.cost": "numeric(10, 2)"`)."""
    import csv
    import re

    from dpsql.policy import load_policy

    loaded = load_policy(policy)
    server.create_database(database)
    with server.connect(database) as con:
        for table in loaded.tables.values():
            columns = ", ".join(f'"{name}" {(types or {}).get(f"{table.name}.{name}", PG_TYPES[column.type.value])}'
                                for name, column in table.columns.items())
            con.execute(f'CREATE TABLE "{table.name}" ({columns})')
            with open(table.source.pattern, newline="") as header:
                order = ", ".join(f'"{name.strip().lower()}"' for name in next(csv.reader(header)))
            with open(table.source.pattern, "rb") as data, con.cursor().copy(
                    f'COPY "{table.name}" ({order}) FROM STDIN WITH (FORMAT csv, HEADER true)') as copy:
                while chunk := data.read(1 << 20):
                    copy.write(chunk)
    text = policy.read_text()
    for table in loaded.tables.values():
        uri = server.uri(database)
        text, count = re.subn(rf'(?m)^(\[tables\.{table.name}\]\s*\nsource = )"[^"]*"',
                              rf'\1{{ uri = "{uri}", table = "{table.name}" }}', text)
        assert count == 1, f"table {table.name}: its source line is not right below its header"
    target.write_text(text)
    return target
