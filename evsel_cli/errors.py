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


def from_dict(data: dict) -> EvselError:
    """Rebuild an error sent over the daemon protocol."""
    cls = {c.__name__: c for c in (EvselError, InputError, NotFoundError, EmptyStoreError, ModelError, StoreError)}
    error_cls = cls.get(data.get("type", ""), EvselError)
    return error_cls(data.get("message", "unknown error"), data.get("hint", ""), data.get("path"))


def user_message(exc: BaseException) -> str:
    """One line for any exception reaching the CLI: known ones say what to do, others say how to report."""
    if isinstance(exc, EvselError):
        return exc.line()
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, MemoryError):
        return "out of memory; ask about fewer documents (--doc) or use a smaller --top-n"
    if isinstance(exc, PermissionError):
        return f"permission denied: {exc.filename or exc}; check the file's permissions or EVSEL_HOME"
    return f"unexpected {type(exc).__name__}: {exc}; rerun with EVSEL_DEBUG=1 for a traceback"
