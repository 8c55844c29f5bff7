"""Ordinary situations get a clear line and an exit code of their own, never "internal error" (exit 70)."""

from __future__ import annotations

import socket
from pathlib import Path

from tests.test_cli import run


def test_serving_on_a_port_in_use_says_so(visits_policy: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _out, err = run("serve", "--policy", str(visits_policy), "--port", str(port), "--quiet")
    assert code == 69, err
    assert err == (f"dpsql: error: cannot listen on 127.0.0.1:{port}: the port is already in use (another server "
                   "listens on it): stop it or choose another --port\n")


def test_a_tls_certificate_that_is_no_certificate_says_so(visits_policy: Path) -> None:
    junk = visits_policy.parent / "server.pem"
    junk.write_text("not a certificate\n")
    code, _out, err = run("serve", "--policy", str(visits_policy), "--tls-cert", str(junk), "--tls-key", str(junk))
    assert code == 78, err
    assert err.startswith(f"dpsql: error: cannot use the TLS certificate {junk} with the key {junk}: ")
    assert len(err.splitlines()) == 1 and "ssl" not in err.lower()


def test_adding_a_user_without_a_terminal_asks_for_password_stdin(visits_policy: Path) -> None:
    code, _out, err = run("user", "add", "dora", "--policy", str(visits_policy))
    assert code == 66, err
    assert err == ("dpsql: error: no terminal to ask the password of dora on: give it on the first line of stdin "
                   "with --password-stdin\n")
    code, out, err = run("user", "list", "--policy", str(visits_policy))
    assert code == 0 and "dora" not in out
