"""PostgreSQL frontend/backend protocol version 3: reading the client's messages and encoding the server's.

Only framing and field encoding live here; what a message means is the connection's business (server.py). Every
length is checked before anything is allocated: a message longer than the limit, or one whose fields run past its
end, is a ProtocolViolation, which closes that one connection.
"""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

PROTOCOL_3_0 = 196608  # major 3, minor 0
SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
MAX_STARTUP_LENGTH = 10_000  # PostgreSQL's limit for the startup packet
DEFAULT_MAX_MESSAGE = 1 << 20


class ProtocolViolation(Exception):
    """The client broke the protocol (SQLSTATE 08P01): the connection is closed after one error message."""

    sqlstate = "08P01"


@dataclass(frozen=True)
class Message:
    kind: bytes  # one byte: b"Q", b"P", ...
    body: bytes


async def read_startup(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The first packet of a connection: (code, rest), where code is a protocol version or a request code."""
    header = await reader.readexactly(4)
    (length,) = struct.unpack("!i", header)
    if length < 8 or length > MAX_STARTUP_LENGTH:
        raise ProtocolViolation(f"invalid startup packet length {length}")
    body = await reader.readexactly(length - 4)
    return struct.unpack("!i", body[:4])[0], body[4:]


async def read_message(reader: asyncio.StreamReader, max_length: int) -> Message:
    header = await reader.readexactly(5)
    kind = header[:1]
    (length,) = struct.unpack("!i", header[1:])
    if length < 4:
        raise ProtocolViolation(f"invalid message length {length}")
    if length - 4 > max_length:
        raise ProtocolViolation(f"message of {length - 4} bytes is larger than the limit of {max_length}")
    return Message(kind, await reader.readexactly(length - 4))


def startup_parameters(rest: bytes) -> dict[str, str]:
    """The name/value pairs of a StartupMessage, ending with an empty name."""
    fields = BodyReader(rest)
    found = {}
    while True:
        name = fields.cstring()
        if not name:
            break
        found[name] = fields.cstring()
    return found


class BodyReader:
    """Reads the fields of one message body in order."""

    def __init__(self, body: bytes) -> None:
        self._body = body
        self._at = 0

    def _take(self, count: int) -> bytes:
        if count < 0 or self._at + count > len(self._body):
            raise ProtocolViolation("a message ends in the middle of a field")
        data = self._body[self._at:self._at + count]
        self._at += count
        return data

    def byte(self) -> bytes:
        return self._take(1)

    def int16(self) -> int:
        return struct.unpack("!h", self._take(2))[0]

    def int32(self) -> int:
        return struct.unpack("!i", self._take(4))[0]

    def uint32(self) -> int:
        return struct.unpack("!I", self._take(4))[0]

    def cstring(self) -> str:
        end = self._body.find(b"\0", self._at)
        if end < 0:
            raise ProtocolViolation("a string is not terminated")
        data = self._body[self._at:end]
        self._at = end + 1
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolViolation("a string is not valid UTF-8") from None

    def counted(self) -> bytes | None:
        """An int32 length and that many bytes; -1 is NULL."""
        length = self.int32()
        return None if length == -1 else self._take(length)

    def rest(self) -> bytes:
        return self._take(len(self._body) - self._at)

    def end(self) -> None:
        if self._at != len(self._body):
            raise ProtocolViolation("a message has bytes after its last field")


# ---- what the server sends -------------------------------------------------------------------------------------

def message(kind: bytes, body: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


def cstring(text: str) -> bytes:
    return text.replace("\0", "").encode("utf-8") + b"\0"


def authentication(code: int, data: bytes = b"") -> bytes:
    return message(b"R", struct.pack("!i", code) + data)


AUTH_OK = 0
AUTH_SASL = 10
AUTH_SASL_CONTINUE = 11
AUTH_SASL_FINAL = 12


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", cstring(name) + cstring(value))


def backend_key_data(process_id: int, secret: int) -> bytes:
    return message(b"K", struct.pack("!iI", process_id, secret))


def ready_for_query(status: bytes) -> bytes:
    return message(b"Z", status)


def negotiate_protocol_version(minor: int, unsupported: list[str]) -> bytes:
    return message(b"v", struct.pack("!ii", minor, len(unsupported)) + b"".join(cstring(o) for o in unsupported))


@dataclass(frozen=True)
class Field:
    name: str
    type_oid: int
    type_size: int
    type_modifier: int = -1
    format: int = 0


def row_description(fields: list[Field]) -> bytes:
    body = struct.pack("!h", len(fields))
    for field in fields:
        body += cstring(field.name) + struct.pack("!ihihih", 0, 0, field.type_oid, field.type_size,
                                                  field.type_modifier, field.format)
    return message(b"T", body)


def parameter_description(oids: list[int]) -> bytes:
    return message(b"t", struct.pack(f"!h{len(oids)}I", len(oids), *oids))


def data_row(values: list[bytes | None]) -> bytes:
    parts = [struct.pack("!h", len(values))]
    for value in values:
        parts.append(struct.pack("!i", -1) if value is None else struct.pack("!i", len(value)) + value)
    return message(b"D", b"".join(parts))


def command_complete(tag: str) -> bytes:
    return message(b"C", cstring(tag))


def _fields(severity: str, sqlstate: str, text: str, detail: str | None, hint: str | None) -> bytes:
    body = b"S" + cstring(severity) + b"V" + cstring(severity) + b"C" + cstring(sqlstate) + b"M" + cstring(text)
    if detail:
        body += b"D" + cstring(detail)
    if hint:
        body += b"H" + cstring(hint)
    return body + b"\0"


def error_response(severity: str, sqlstate: str, text: str, *, detail: str | None = None,
                   hint: str | None = None) -> bytes:
    return message(b"E", _fields(severity, sqlstate, text, detail, hint))


def notice_response(text: str, *, sqlstate: str = "00000", detail: str | None = None) -> bytes:
    return message(b"N", _fields("NOTICE", sqlstate, text, detail, None))


PARSE_COMPLETE = message(b"1")
BIND_COMPLETE = message(b"2")
CLOSE_COMPLETE = message(b"3")
NO_DATA = message(b"n")
EMPTY_QUERY = message(b"I")
PORTAL_SUSPENDED = message(b"s")


def copy_out_response(binary: bool, columns: int) -> bytes:
    """CopyOutResponse: the overall format and each column's (all the same)."""
    code = 1 if binary else 0
    return message(b"H", struct.pack(f"!bh{columns}h", code, columns, *([code] * columns)))


def copy_data(data: bytes) -> bytes:
    return message(b"d", data)


COPY_DONE = message(b"c")
