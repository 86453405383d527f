"""Errors users see: one line saying what is wrong and what to do next.

Every failure a user can cause raises an EvselError; the CLI prints `evsel: error: <message>`
and exits 1. Anything else is a bug and gets a traceback only with EVSEL_DEBUG=1.
"""

from __future__ import annotations


class EvselError(Exception):
    """A failure with a message meant for the user."""

    exit_code = 1

    def __init__(self, message: str, hint: str = "", path: str | None = None):
        self.message = message
        self.hint = hint
        self.path = path
        super().__init__(self.line())

    def line(self) -> str:
        text = f"{self.path}: {self.message}" if self.path else self.message
        if self.hint:
            text = f"{text}; {self.hint}"
        return text

    def to_dict(self) -> dict:
        return {"type": type(self).__name__, "message": self.message, "hint": self.hint, "path": self.path}


class InputError(EvselError):
    """A file or path the user gave cannot be ingested."""


class NotFoundError(EvselError):
    """A document, collection or other named thing does not exist."""


class EmptyStoreError(EvselError):
    """A question was asked with nothing ingested in scope."""


class ModelError(EvselError):
    """The backbone could not be found or loaded."""


class StoreError(EvselError):
    """The database is unusable (locked for too long, newer schema, corrupt)."""


class UnsafeHomeError(EvselError):
    """EVSEL_HOME or a file in it could have been planted or swapped by another user."""


def from_dict(data: dict) -> EvselError:
    """Rebuild an error sent over the daemon protocol."""
    classes = (EvselError, InputError, NotFoundError, EmptyStoreError, ModelError, StoreError, UnsafeHomeError)
    error_cls = {c.__name__: c for c in classes}.get(data.get("type", ""), EvselError)
    return error_cls(data.get("message", "unknown error"), data.get("hint", ""), data.get("path"))


# Library failures a user can cause, as the EvselError each stands for. Checked in order; an entry
# returns None when the exception is of its type but not the failure it knows.

_SQLITE_FULL, _SQLITE_BUSY = 13, 5


def _sqlite_code(exc) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    if code is not None:
        return code & 0xFF  # the primary code, without extended bits
    text = str(exc)
    return _SQLITE_FULL if "disk is full" in text else _SQLITE_BUSY if "database is locked" in text else None


def disk_full(where: str = "") -> StoreError:
    return StoreError(f"the disk is full{where}; nothing was stored half-way",
                      "free some space (or point EVSEL_HOME at a larger disk), then run the command again")


def _missing_table(text: str) -> EvselError:
    table = text.split("no such table:", 1)[1].strip()
    if table.startswith("bm25_"):  # derived from the chunks: rebuilt when the store is next opened
        hint = "stop the daemon (evsel daemon stop) and run the command again: the BM25 index is rebuilt from the chunks"
    else:
        hint = "move evsel.db away (or restore a backup) and ingest the documents again"
    return StoreError(f"the store is damaged: its table {table} is missing", hint)


def _sqlite_error(exc) -> EvselError | None:
    if "no such table:" in str(exc):
        return _missing_table(str(exc))
    code = _sqlite_code(exc)
    if code == _SQLITE_FULL:
        return disk_full(" (the store could not grow)")
    if code == _SQLITE_BUSY:
        return StoreError("the store is locked: another evsel process kept it busy for over a minute",
                          "wait for it to finish (evsel daemon status shows the daemon's work), then run "
                          "the command again")
    return None


def _os_error(exc: OSError) -> EvselError | None:
    import errno

    name = f" {exc.filename}" if exc.filename else ""
    if exc.errno == errno.ENOSPC:
        return disk_full(f" (writing{name})" if name else "")
    if isinstance(exc, IsADirectoryError):
        return EvselError(f"{exc.filename or 'a path'} is a directory where evsel expects a file",
                          "move the directory away, then run the command again")
    if isinstance(exc, PermissionError):
        return EvselError(f"permission denied: {exc.filename or exc}", "check the file's permissions or EVSEL_HOME")
    return None


def _known_table():
    import sqlite3

    return (
        (sqlite3.Error, _sqlite_error),
        (OSError, _os_error),
        (MemoryError, lambda exc: EvselError(
            "out of memory", "ask about fewer documents (--doc) or use a smaller --top-n")),
        (RecursionError, lambda exc: EvselError(
            "the input is nested too deeply to read", "flatten it or give a simpler file")),
        (Exception, _wrapped_disk_full),
    )


# how libraries that wrap the OS error in their own say ENOSPC (safetensors: "IoError(Os { code: 28,
# kind: StorageFull ... })", shutil in a thread: "[Errno 28] No space left on device")
_DISK_FULL_WORDS = ("No space left on device", "StorageFull", "os error 28", "[Errno 28]")


def _wrapped_disk_full(exc: Exception) -> EvselError | None:
    text = str(exc)
    return disk_full("") if any(word in text for word in _DISK_FULL_WORDS) else None


def known_error(exc: BaseException) -> EvselError | None:
    """The EvselError `exc` stands for when it is a failure the user can cause and fix (a full
    disk, a locked store, a directory where a file belongs), else None: a bug."""
    if isinstance(exc, EvselError):
        return exc
    for types, make in _known_table():
        if isinstance(exc, types):
            found = make(exc)
            if found is not None:
                return found
    return None


def user_message(exc: BaseException) -> str:
    """One line for any exception reaching the CLI: known ones say what to do, others say how to report."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    found = known_error(exc)
    if found is not None:
        return found.line()
    return f"unexpected {type(exc).__name__}: {exc}; rerun with EVSEL_DEBUG=1 for a traceback"
