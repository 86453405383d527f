"""The wire format between the CLI and the daemon: JSON lines over a Unix socket (see PROTOCOL.md)."""

from __future__ import annotations

import json
import socket
from pathlib import PurePath

PROTOCOL_VERSION = 2  # 2: requests carry `settings` (was: cwd, env, engine)
MAX_LINE = 64 << 20  # a request or response line larger than this is refused

# Requests answered at once on the connection's own thread: they never wait behind model work.
FAST_METHODS = frozenset(
    {"hello", "status", "shutdown", "watch_add", "watch_remove", "watch_list", "docs_list", "docs_show", "docs_rm"}
)


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
    return (json.dumps(message, ensure_ascii=False, default=_plain) + "\n").encode()


class LineReader:
    """Reads newline-terminated JSON messages from a socket."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = b""

    def pending(self) -> bool:
        return b"\n" in self.buffer

    def read(self) -> dict | None:
        """The next message, or None at end of stream."""
        while b"\n" not in self.buffer:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                if self.buffer.strip():
                    raise ProtocolError("the stream ended in the middle of a message")
                return None
            self.buffer += chunk
            if len(self.buffer) > MAX_LINE:
                raise ProtocolError("message too large")
        line, _, self.buffer = self.buffer.partition(b"\n")
        try:
            message = json.loads(line)
        except ValueError as exc:
            raise ProtocolError(f"not JSON: {exc}") from None
        if not isinstance(message, dict):
            raise ProtocolError("a message must be a JSON object")
        return message
