"""What the daemon keeps in memory between requests: the chunks of hot scopes and data derived from
them (a BM25 index; selectors' stacked chunk states), beside the loaded backbone. The daemon hands
one `ScopeDataCache` to its stores (`chunk_cache`) and engines (`scope_cache`).

Every entry is keyed by what it was built from (the documents' ids, versions and chunk hashes), so
a changed store can never be answered from a stale entry, even when another process (an
`evsel --no-daemon ingest`) wrote it. Ingest and rm also drop the entries of the documents they
touched, to free the memory early.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Callable

from evsel.store.store import ChunkRecord

MAX_ENTRIES = 32  # a book's chunks plus its BM25 index is a few MB


def chunk_key(chunks: list[ChunkRecord]) -> str:
    digest = hashlib.sha1()
    for c in chunks:
        digest.update(f"{c.id}:{c.content_hash}\n".encode())
    return digest.hexdigest()


class ScopeDataCache:
    """Data built from scopes' chunks (their chunk lists, BM25 indexes, selectors' stacked states),
    in a small LRU with hit/miss counts per kind; safe across threads."""

    def __init__(self, max_entries: int = MAX_ENTRIES):
        self.max_entries = max_entries
        self.entries: OrderedDict[tuple, tuple[frozenset, object]] = OrderedDict()
        self.counts: dict[str, dict[str, int]] = {}
        self.lock = threading.Lock()

    def get_or_build(self, kind: str, key: tuple, doc_ids: Callable[[object], set], build: Callable[[], object]):
        full_key = (kind, *key)
        with self.lock:
            counts = self.counts.setdefault(kind, {"hits": 0, "misses": 0})
            if full_key in self.entries:
                self.entries.move_to_end(full_key)
                counts["hits"] += 1
                return self.entries[full_key][1]
            counts["misses"] += 1
        value = build()  # outside the lock: building a big index must not block status
        with self.lock:
            self.entries[full_key] = (frozenset(doc_ids(value)), value)
            self.entries.move_to_end(full_key)
            while len(self.entries) > self.max_entries:
                self.entries.popitem(last=False)
        return value

    def invalidate(self, doc_ids: set[int] | None = None) -> int:
        """Drop entries built from any of `doc_ids` (all entries when None). Returns how many."""
        with self.lock:
            doomed = [k for k, (docs, _) in self.entries.items() if doc_ids is None or docs & doc_ids]
            for key in doomed:
                del self.entries[key]
        return len(doomed)

    def scope_chunks(self, scope: tuple, read: Callable[[], list[ChunkRecord]]) -> list[ChunkRecord]:
        """A scope's chunks (a store's `chunk_cache`): `scope` names the documents and their versions."""
        return list(self.get_or_build("chunks", scope, lambda chunks: {c.doc_id for c in chunks}, read))

    def scope_data(self, kind: str, chunks: list[ChunkRecord], build: Callable[[], object], *config) -> object:
        """Data derived from a scope's chunks (an engine's `scope_cache`)."""
        key = (repr(config), chunk_key(chunks))
        return self.get_or_build(kind, key, lambda _value: {c.doc_id for c in chunks}, build)

    def stats(self) -> dict:
        with self.lock:
            out = {"entries": len(self.entries)}
            for kind, c in sorted(self.counts.items()):
                total = c["hits"] + c["misses"]
                out[kind] = {**c, "hit_rate": round(c["hits"] / total, 3) if total else None}
            return out
