"""One SQLite helper the store, its migrations and the BM25 index share; it sits apart so that
none of them imports another for it."""

from __future__ import annotations

import sqlite3


def rollback(conn: sqlite3.Connection) -> None:
    """Roll back the open transaction, if SQLite has not already: on a full disk (SQLITE_FULL) it
    rolls back by itself, and a second "rollback" would fail and hide the real error."""
    if conn.in_transaction:
        try:
            conn.execute("rollback")
        except sqlite3.Error:
            pass  # the error being raised says what went wrong
