"""The wire format between the CLI and the daemon: JSON lines over a Unix socket (see PROTOCOL.md)."""

from __future__ import annotations

import json
import socket
from pathlib import PurePath

from evsel.requests import REQUEST

PROTOCOL_VERSION = 2  # 2: requests carry `settings` (was: cwd, env, engine)
MAX_LINE = 64 << 20  # a request or response line larger than this is refused
CANCEL_WAIT_S = 5.0  # how long a client waits, after a cancel, for the daemon to say what was stored

# The daemon's own requests; every other method names an engine request (evsel.requests).
DAEMON_METHODS = frozenset({"hello", "status", "shutdown"})
# Requests answered at once on the connection's own thread: they never wait behind model work (the
# daemon's own, and the engine requests declared fast).
FAST_METHODS = frozenset({*DAEMON_METHODS, *(name for name, r in REQUEST.items() if r.fast)})


class ProtocolError(Exception):
    """The other side sent something that is not this protocol."""


def _plain(value):
    """json.dumps fallback: paths as strings, numpy scalars and arrays as numbers and lists."""
    if isinstance(value, PurePath):
        return str(value)
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def encode(message: dict) -> bytes:
    """One message as a line of ASCII JSON. Non-ASCII text travels as \\uXXXX escapes, which keeps
    lone surrogates too: a file name that is not UTF-8 (os.fsdecode gives `caf\\udce9.txt`) is sent
    and `json.loads` restores exactly that str, so `os.fsencode` on the far side gives the same bytes."""
    return (json.dumps(message, ensure_ascii=True, default=_plain) + "\n").encode("ascii")


class LineReader:
    """Reads newline-terminated JSON messages from a socket.

    The size limit is enforced while reading: a line longer than `max_line` (default MAX_LINE) is
    refused once that many bytes have arrived, without reading the rest. Each read searches only
    the bytes that arrived since the last search, so a long line costs linear time.
    """

    def __init__(self, sock: socket.socket, max_line: int | None = None):
        self.sock = sock
        self.buffer = bytearray()
        self.max_line = max_line

    def pending(self) -> bool:
        return b"\n" in self.buffer

    def read(self) -> dict | None:
        """The next message, or None at end of stream."""
        limit = self.max_line if self.max_line is not None else MAX_LINE
        searched = 0  # bytes of the buffer already known to hold no newline
        while True:
            end = self.buffer.find(b"\n", searched)
            if end >= 0:
                break
            searched = len(self.buffer)
            if searched > limit:
                raise ProtocolError(f"message too large (over {limit} bytes)")
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                if self.buffer.strip():
                    raise ProtocolError("the stream ended in the middle of a message")
                return None
            self.buffer += chunk
        if end > limit:
            raise ProtocolError(f"message too large (over {limit} bytes)")
        line = bytes(self.buffer[:end])
        del self.buffer[:end + 1]
        try:
            message = json.loads(line)
        except ValueError as exc:  # UnicodeDecodeError included
            raise ProtocolError(f"not JSON: {exc}") from None
        except RecursionError:  # a deeply nested line ([[[[...) exhausts the parser's stack
            raise ProtocolError("not JSON this daemon reads: nested too deeply") from None
        if not isinstance(message, dict):
            raise ProtocolError("a message must be a JSON object")
        return message
