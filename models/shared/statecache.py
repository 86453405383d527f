"""Per-chunk backbone states, cached in the store by (content hash, model, method, config).

Methods that encode chunks independently (UNREAL residual states, the intrinsic selector's
pooled keys, the dense selector's embeddings) fill the cache through `ensure_states`: states
already stored are read back, the rest are encoded in batches and written after each batch, so a
cached chunk is never encoded twice and an interrupted run keeps what it finished. BlockSearch
does not use it: its routing keys are .npy files beside the store (models/blocksearch/routing.py).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from evsel.store.store import ChunkRecord, Store

# encode(texts) -> {config: array (len(texts), ...)}; one pass may produce several configs
Encoder = Callable[[list[str]], dict[str, np.ndarray]]


class StateCache:
    """Per-chunk states in one store's `chunk_states` table: the user's store for `ask` and
    ingest, eval's own cache (EVSEL_HOME/cache/eval.db) for `evsel eval`, so eval never writes
    into the user's store."""

    def __init__(self, store: Store):
        self.store = store

    def ensure(self, model: str, method: str, configs: list[str], chunks: list[ChunkRecord], encode: Encoder,
               on_event: Callable[[dict], None] | None = None, label: str = "encoding chunks",
               batch: int = 64) -> dict[str, np.ndarray]:
        return ensure_states(self.store, model, method, configs, chunks, encode, on_event, label, batch)


def ensure_states(
    store: Store,
    model: str,
    method: str,
    configs: list[str],
    chunks: list[ChunkRecord],
    encode: Encoder,
    on_event: Callable[[dict], None] | None = None,
    label: str = "encoding chunks",
    batch: int = 64,
) -> dict[str, np.ndarray]:
    """States of `chunks` for each config, stacked in chunk order: {config: (N, ...)}.

    A chunk is encoded when any requested config lacks it; duplicates (same text) once."""
    hashes = [c.content_hash for c in chunks]
    text_of = {c.content_hash: c.text for c in chunks}
    found = {cfg: store.get_states(model, method, cfg, hashes) for cfg in configs}
    missing = [h for h in dict.fromkeys(hashes) if any(h not in found[cfg] for cfg in configs)]
    if missing and on_event:
        on_event({"type": "progress", "task": "encode", "label": label, "done": 0, "total": len(missing)})
    for at in range(0, len(missing), batch):
        part = missing[at:at + batch]
        produced = encode([text_of[h] for h in part])
        for cfg in configs:
            fresh = {h: produced[cfg][i] for i, h in enumerate(part)}
            store.put_states(model, method, cfg, fresh)
            found[cfg].update(fresh)
        if on_event:
            on_event({"type": "progress", "task": "encode", "label": label, "done": at + len(part),
                      "total": len(missing)})
    return {cfg: np.stack([found[cfg][h] for h in hashes]) if hashes else np.zeros((0,)) for cfg in configs}
