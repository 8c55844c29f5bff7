"""The server's parts on their own: SCRAM against RFC 7677's example, the users file, the `dpsql user` commands,
the policy's [server] key, statement splitting, local commands and the wire encoding of values."""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import stat
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from dpsql.errors import DataError, PolicyError
from dpsql.frontends.cli import main
from dpsql.frontends.server import types
from dpsql.frontends.server.commands import Settings, local_command
from dpsql.frontends.server.scram import ScramError, ScramExchange, Verifier, make_verifier
from dpsql.frontends.server.statements import split_statements
from dpsql.frontends.server.users import UserStore, users_path
from dpsql.policy import load_policy
from dpsql.sql.parse import TextParameter
from tests.conftest import SAMPLE, copy_visits_data

# RFC 7677, section 3: user "user", password "pencil".
_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                 b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")


def test_scram_matches_rfc_7677() -> None:
    exchange = ScramExchange(make_verifier("pencil", salt=_SALT), server_nonce=_SERVER_NONCE)
    assert exchange.server_first(_CLIENT_FIRST) == (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                                                    b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    assert exchange.server_final(_CLIENT_FINAL) == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


@pytest.mark.parametrize("client_final", [
    _CLIENT_FINAL.replace(b"p=dH", b"p=eH"),  # a wrong proof
    _CLIENT_FINAL.replace(b"k0,", b"k1,"),  # another nonce
    _CLIENT_FINAL.replace(b"c=biws", b"c=eSws"),  # another gs2 header
    b"c=biws,r=x",  # no proof
])
def test_scram_refuses_a_wrong_client_final(client_final: bytes) -> None:
    exchange = ScramExchange(make_verifier("pencil", salt=_SALT), server_nonce=_SERVER_NONCE)
    exchange.server_first(_CLIENT_FIRST)
    with pytest.raises(ScramError):
        exchange.server_final(client_final)


def test_scram_refuses_channel_binding_it_did_not_offer() -> None:
    with pytest.raises(ScramError):
        ScramExchange(make_verifier("pencil")).server_first(b"p=tls-server-end-point,,n=,r=abc")


def test_scram_plus_binds_to_the_certificate_and_refuses_a_stripped_plus() -> None:
    binding = b"certificate hash"
    header = b"p=tls-server-end-point,,"
    verifier = make_verifier("pencil", salt=_SALT)
    exchange = ScramExchange(verifier, channel_binding=binding, server_nonce=_SERVER_NONCE)
    assert exchange.mechanisms == ("SCRAM-SHA-256-PLUS", "SCRAM-SHA-256")
    exchange.server_first(header + _CLIENT_FIRST[3:], "SCRAM-SHA-256-PLUS")
    wrong = b"c=" + base64.b64encode(header + b"another hash") + _CLIENT_FINAL[6:]
    with pytest.raises(ScramError, match="channel binding"):
        exchange.server_final(wrong)
    with pytest.raises(ScramError, match="stripped"):  # "y": I could bind, but you cannot; yet PLUS was offered
        ScramExchange(verifier, channel_binding=binding).server_first(b"y" + _CLIENT_FIRST[1:])
    with pytest.raises(ScramError):
        ScramExchange(verifier).server_first(header + _CLIENT_FIRST[3:], "SCRAM-SHA-256-PLUS")  # not over TLS


def test_verifier_round_trips_in_postgres_text_form() -> None:
    verifier = make_verifier("pencil", salt=_SALT)
    assert verifier.encode().startswith("SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$")
    assert Verifier.decode(verifier.encode()) == verifier
    with pytest.raises(ValueError):
        Verifier.decode(verifier.encode().replace("$4096:", "$1000:"))  # too few iterations
    with pytest.raises(ValueError):
        make_verifier("pencil", iterations=1000)


def _policy(tmp_path: Path, extra: str = "") -> Path:
    copy_visits_data(tmp_path)
    policy = tmp_path / "visits.toml"
    policy.write_text((SAMPLE / "visits.toml").read_text() + extra)
    return policy


def test_the_users_file_holds_verifiers_only_and_is_private(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    runner = CliRunner()
    added = runner.invoke(main, ["user", "add", "alice", "--policy", str(policy), "--password-stdin"],
                          input="s3cret-pass\n")
    assert added.exit_code == 0, added.output
    path = users_path(load_policy(policy))
    assert path == tmp_path / "visits.users.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert "s3cret-pass" not in text and "SCRAM-SHA-256$4096:" in text
    assert json.loads(text)["users"].keys() == {"alice"}
    runner.invoke(main, ["user", "add", "bob", "--policy", str(policy), "--password-stdin"], input="other\n")
    assert runner.invoke(main, ["user", "list", "--policy", str(policy)]).output.split() == ["alice", "bob"]
    assert runner.invoke(main, ["user", "remove", "alice", "--policy", str(policy)]).exit_code == 0
    assert runner.invoke(main, ["user", "list", "--policy", str(policy)]).output.split() == ["bob"]
    missing = runner.invoke(main, ["user", "remove", "alice", "--policy", str(policy)])
    assert missing.exit_code == 1 and "no user 'alice'" in missing.output
    empty = runner.invoke(main, ["user", "add", "carol", "--policy", str(policy), "--password-stdin"], input="\n")
    assert empty.exit_code == 1 and "empty" in empty.output


def test_unknown_names_get_a_fake_verifier_stable_for_the_store(tmp_path: Path) -> None:
    store = UserStore.load(tmp_path / "users.json", create=True)
    store.add("alice", "pw")
    store.save()
    again = UserStore.load(tmp_path / "users.json")
    fake, known = again.verifier("mallory")
    assert not known and fake == store.verifier("mallory")[0] and fake.iterations == 4096
    assert again.verifier("alice") == (store.verifiers["alice"], True)


def test_policy_names_the_users_file(tmp_path: Path) -> None:
    policy = load_policy(_policy(tmp_path, '\n[server]\nusers = "steward/analysts.json"\n'))
    assert policy.users == tmp_path / "steward" / "analysts.json"
    with pytest.raises(PolicyError, match=r"\[server\], key 'port': unknown key"):
        load_policy(_policy(tmp_path, "\n[server]\nport = 5\n"))
    with pytest.raises(PolicyError, match=r"\[server\], key 'users': expected a string, got an integer"):
        load_policy(_policy(tmp_path, "\n[server]\nusers = 5\n"))


def test_statements_are_split_outside_strings_and_comments() -> None:
    assert split_statements("SELECT ';' ; -- a; comment\n SET x = 'a;b';;") == ["SELECT ';'",
                                                                              "-- a; comment\n SET x = 'a;b'"]
    assert split_statements(" ; -- nothing") == []
    assert split_statements("SELECT $$;$$") == ["SELECT $$;$$"]


def test_local_commands_are_whole_statements_only() -> None:
    assert local_command("SET application_name TO 'x'") is not None
    assert local_command("select VERSION ( )") is None  # not exactly a known form: goes to the pipeline
    assert local_command("SELECT 1 FROM visits") is None
    assert local_command("SHOW dpsql.budget").columns[0] == ("analyst", "VARCHAR")
    settings = Settings.initial("alice", {"application_name": "psql"})
    assert settings.get("TimeZone") == "UTC" and settings.get("application_name") == "psql"
    assert settings.set("timezone", "Etc/UTC") == "TimeZone"
    # Any zone the system knows (no released value has a time zone; pgcli sets the machine's), none other.
    assert settings.set("TimeZone", "Europe/Paris") == "TimeZone" and settings.get("TimeZone") == "Europe/Paris"
    with pytest.raises(DataError, match="TimeZone"):
        settings.set("TimeZone", "Mars/Olympus_Mons")


def test_values_in_text_as_postgres_writes_them() -> None:
    assert [types.encode_text(v) for v in (None, True, 50.0, 0.1, 1e20, float("inf"), float("nan"))] == [
        None, b"t", b"50", b"0.1", b"1e+20", b"Infinity", b"NaN"]
    assert types.encode_text(decimal.Decimal("1E+3")) == b"1000"
    assert types.encode_text(datetime.datetime(2020, 1, 2, 3, 4, 5)) == b"2020-01-02 03:04:05"
    assert types.encode_text("infinity") == b"infinity"  # a date beyond Python's, kept as DuckDB's text
    assert types.wire_type("DECIMAL(18,3)").oid == types.NUMERIC
    assert types.field("x", "DECIMAL(18,3)", 0).type_modifier == (18 << 16 | 3) + 4
    assert types.wire_type("STRUCT(a INTEGER)").oid == types.TEXT


def test_parameters_decoded_from_text_and_binary() -> None:
    assert types.decode_parameter(b"north", 0, False) == TextParameter("north")
    assert types.decode_parameter(b"40", types.INT8, False) == 40
    assert types.decode_parameter(struct.pack("!q", -7), types.INT8, True) == -7
    assert types.decode_parameter(struct.pack("!d", 2.5), types.FLOAT8, True) == 2.5
    assert types.decode_parameter(b"\1", types.BOOL, True) is True
    assert types.decode_parameter(struct.pack("!i", 1), types.DATE, True) == datetime.date(2000, 1, 2)
    # numeric 12.5: digits [12, 5000], weight 0, positive, scale 1
    assert types.decode_parameter(struct.pack("!hhHH2H", 2, 0, 0, 1, 12, 5000), types.NUMERIC, True) == \
        decimal.Decimal("12.5")
    assert types.decode_parameter(None, types.INT8, True) is None
    with pytest.raises(Exception, match="invalid binary value"):
        types.decode_parameter(b"\0\0", types.INT8, True)


def test_serve_checks_its_tls_options(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    runner = CliRunner()
    alone = runner.invoke(main, ["serve", "--policy", str(policy), "--require-tls"])
    assert alone.exit_code == 4 and "--require-tls needs --tls-cert and --tls-key" in alone.output
    (tmp_path / "server.crt").write_text("")
    half = runner.invoke(main, ["serve", "--policy", str(policy), "--tls-cert", str(tmp_path / "server.crt")])
    assert half.exit_code == 4 and "together" in half.output


def test_serve_refuses_to_start_without_a_ledger(tmp_path: Path) -> None:
    policy = _policy(tmp_path)
    failed = CliRunner().invoke(main, ["serve", "--policy", str(policy), "--port", "0"])
    assert failed.exit_code == 1 and "ledger" in failed.output
