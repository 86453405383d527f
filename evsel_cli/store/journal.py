"""The daemon's journal, in the store's database: the folders it watches and the work an ingest
began or left for later (files being ingested, chunk states and summaries to compute). Rows a crash
leaves behind are picked up at the daemon's next start. The core writes them on the daemon's behalf
(an ingest with `journal` or `defer`, `evsel --no-daemon watch`); only the daemon reads them."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace

from ..errors import EvselError
from ..settings import Settings
from .store import Store


@dataclass
class PendingIngest:
    """One file of an ingest request, recorded before it is read and deleted once it is done
    (stored, unchanged, failed or cancelled): a row a crash leaves behind is ingested again."""

    path: str
    collection: str
    kind: str
    chunk_tokens: int | None
    options: dict = field(default_factory=dict)  # the request's other `Engine.ingest` arguments (none before m006)
    encode: bool = False  # compute the file's chunk states afterwards
    summaries: bool = False  # write its memory summaries afterwards
    settings: Settings | None = None  # the request's (None before m006: whoever resumes it uses its own)
    id: int | None = None  # the row, once recorded
    unreadable: str | None = None  # why the row's options could not be read (then there are none)


@dataclass
class PendingEncode:
    """Work an ingest left for later: these documents' chunk states and/or memory summaries,
    recorded until it is done, so a process killed in the middle resumes it."""

    doc_ids: list[int]
    settings: Settings  # the ingest request's
    states: bool = True  # UNREAL's per-chunk states
    summaries: bool = False  # QRRanker's memory summaries
    id: int | None = None  # the row, once recorded

    @property
    def what(self) -> str:
        return " and ".join(w for w, on in (("chunk states", self.states), ("summaries", self.summaries)) if on)


class Journal:
    """The journal's tables (m002, m005, m006, m009) of one store's database."""

    def __init__(self, store: Store):
        self.store = store

    # watched folders (m002), kept by the daemon
    def watches(self) -> list[dict]:
        return list(self.store.db.query("select path, collection, created_at from watches order by path"))

    def add_watch(self, path: str, collection: str) -> bool:
        """Remember a folder; True when it was not watched before (an existing one takes the new collection)."""
        existed = self.store.db.execute("select 1 from watches where path = ?", [path]).fetchone() is not None
        self.store.db.execute(
            "insert into watches (path, collection, created_at) values (?, ?, ?) "
            "on conflict(path) do update set collection = excluded.collection",
            [path, collection, time.time()],
        )
        return not existed

    def remove_watch(self, path: str) -> bool:
        return self.store.db.execute("delete from watches where path = ?", [path]).rowcount > 0

    # pending work (m002, m005, m006, m009): what an ingest began or left for later
    def add_pending_ingests(self, files: list[PendingIngest]) -> list[PendingIngest]:
        """Record these files (in one transaction); returns them with their row ids."""
        now = time.time()
        recorded = []
        with self.store.transaction() as conn:
            for item in files:
                options = {**item.options, "encode": bool(item.encode), "summaries": bool(item.summaries)}
                settings = json.dumps(item.settings.to_dict()) if item.settings is not None else None
                row_id = conn.execute(
                    "insert into pending_ingests (path, collection, kind, chunk_tokens, options, settings, created_at) "
                    "values (?, ?, ?, ?, ?, ?, ?)",
                    [item.path, item.collection, item.kind, item.chunk_tokens, json.dumps(options), settings, now],
                ).lastrowid
                recorded.append(replace(item, id=row_id))
        return recorded

    def pending_ingests(self) -> list[PendingIngest]:
        """The files recorded and not finished, oldest first. A row whose options or settings this
        version cannot read comes back without them (`unreadable` says why)."""
        out = []
        for row in self.store.db.query("select * from pending_ingests order by id"):
            options, settings, unreadable = {}, None, None
            try:
                options = json.loads(row.get("options") or "{}")
                if row.get("settings"):
                    settings = Settings.from_dict(json.loads(row["settings"]))
            except (ValueError, TypeError, EvselError) as exc:
                options, settings, unreadable = {}, None, str(exc)
            options = dict(options) if isinstance(options, dict) else {}
            out.append(PendingIngest(
                path=row["path"], collection=row["collection"], kind=row["kind"], chunk_tokens=row["chunk_tokens"],
                encode=bool(options.pop("encode", False)), summaries=bool(options.pop("summaries", False)),
                options=options, settings=settings, id=row["id"], unreadable=unreadable,
            ))
        return out

    def finish_pending_ingest(self, row_id: int) -> None:
        self.store.db.execute("delete from pending_ingests where id = ?", [row_id])

    def add_pending_encode(self, work: PendingEncode) -> PendingEncode:
        """Record deferred work; returns it with its row id."""
        row_id = self.store.db.execute(
            "insert into pending_encodes (doc_ids, settings, created_at, states, summaries) values (?, ?, ?, ?, ?)",
            [json.dumps(work.doc_ids), json.dumps(work.settings.to_dict()), time.time(), int(work.states),
             int(work.summaries)],
        ).lastrowid
        return replace(work, id=row_id)

    def pending_encodes(self) -> list[PendingEncode]:
        """The deferred work recorded and not finished, oldest first. A row this version cannot read
        is deleted instead: its states and summaries are computed when an ask first needs them."""
        out = []
        for row in list(self.store.db.query("select * from pending_encodes order by id")):
            try:
                settings = Settings.from_dict(json.loads(row["settings"]))
                doc_ids = [int(i) for i in json.loads(row["doc_ids"])]
            except (ValueError, TypeError, EvselError):
                self.finish_pending_encode(row["id"])
                continue
            out.append(PendingEncode(doc_ids, settings, states=bool(row["states"]), summaries=bool(row["summaries"]),
                                     id=row["id"]))
        return out

    def finish_pending_encode(self, row_id: int) -> None:
        self.store.db.execute("delete from pending_encodes where id = ?", [row_id])
