"""UNREAL selection (seed 000) with the trained adapter shipped for the backbone: cached chunk
states at layer l_c against retrieval-token queries read from the frozen LLM, scored by MaxSim.
C0, the passages the query pass reads before the question, are the top BM25 chunks of the scope."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from . import get_selector, register
from .base import IngestWork, Selector, timed_slices

if TYPE_CHECKING:  # annotations only: the registry stays light to import (the CLI's help)
    from evsel.store.store import ChunkRecord


MAX_QUERIES = 4096  # query vectors kept per selector (~9 KB each)


@register("unreal")
class UnrealSelector(Selector):
    name = "unreal"
    needs_model = True
    help = "the backbone's own states with the trained adapter"
    corpus_first_stage = True
    settings_fields = ("unreal_adapter",)

    def __init__(self, context, adapter: str | None = None, **_):
        super().__init__(context)
        self.adapter_setting = adapter or context.settings.unreal_adapter
        self._loaded: tuple | None = None  # (adapter, query, adapter digest)
        self.bm25 = get_selector("bm25", context)
        # query vectors by (question, C0): a second method over the same questions in one eval
        # run (rrf:unreal beside unreal) reuses the query pass
        self._queries: OrderedDict = OrderedDict()
        self._scope: tuple[tuple, object] | None = None  # last scope's keys

    def load(self) -> None:
        """The backbone and the trained adapter with its query pass."""
        from evsel.models.unreal import selection as unreal

        if self._loaded is None:
            super().load()
            backbone = self.context.backbone
            adapter = unreal.default_adapter(backbone, self.adapter_setting)
            self._loaded = (adapter, unreal.UnrealQuery(backbone, adapter), adapter.digest())

    def _part(self, index: int):
        self.load()
        return self._loaded[index]

    adapter = property(lambda self: self._part(0))
    query = property(lambda self: self._part(1))
    _adapter_id = property(lambda self: self._part(2))

    def prepare(self, chunks: list[ChunkRecord]) -> None:
        self.keys(chunks)

    def missing_states(self, chunks: list[ChunkRecord]) -> int:
        """Chunk texts without stored states at the adapter's layer (read from the store's index)."""
        from evsel.models.unreal import selection as unreal

        if self._scope is not None and self._scope[0] == tuple(c.content_hash for c in chunks):
            return 0
        cfg = self.adapter.config
        hashes = {c.content_hash for c in chunks}
        return len(hashes - self.context.states.store.stored_state_hashes(
            self.context.backbone.fingerprint, unreal.METHOD, unreal.state_key(cfg.layer, cfg.pool), hashes))


    @classmethod
    def ingest_work(cls, chunks: list[ChunkRecord], work: IngestWork) -> dict:
        """The chunk states of the adapter in use that these chunks lack (none without an adapter
        for the backbone), so the first ask encodes nothing."""
        from evsel.models.unreal import selection as unreal

        if not work.states:
            return {}
        context = work.context
        backbone, store, adapter = context.backbone, context.store, context.settings.unreal_adapter
        key = unreal.ingest_state_key(backbone, adapter)
        if key is None or not chunks:
            return {"encoded": 0, "missing_before": 0}
        method, config = key
        missing = store.chunks_missing_states(backbone.fingerprint, method, config, work.doc_ids)
        if missing and work.slice_s is not None:
            total = len({c.content_hash for c in chunks})

            def encode(part: list[ChunkRecord]) -> None:
                unreal.encode_at_ingest(backbone, context.states, part, adapter, None, batch=len(part))

            def progress(done: int) -> None:
                context.on_event({"type": "progress", "task": "encode", "label": "UNREAL chunk states",
                                  "done": total - len(missing) + done, "total": total})

            timed_slices(missing, encode, work.slice_s, progress, most=work.batch)
        elif missing:
            unreal.encode_at_ingest(backbone, context.states, missing, adapter, context.on_event, batch=work.batch)
        return {"encoded": len(missing), "missing_before": len(missing)}

    def keys(self, chunks: list[ChunkRecord]):
        """The scope's chunk keys as scored (standardized fp32, N x L_p x d); the states are
        encoded now if not in the state cache (index time), and the daemon keeps the keys."""
        from evsel.models.unreal import selection as unreal

        context = self.context
        key = tuple(c.content_hash for c in chunks)
        if self._scope is None or self._scope[0] != key:
            cfg = self.adapter.config

            def build():
                states = unreal.chunk_states(context.backbone, context.states, chunks, cfg.layer, cfg.pool,
                                             context.on_event)
                return self.query.chunk_keys(states)

            keys = context.scope_data("unreal", chunks, build, cfg.cache_key(), self._adapter_id)
            self._scope = (key, keys)
        return self._scope[1]

    def c0(self, question: str, chunks: list[ChunkRecord]) -> list[str]:
        """C0: the top BM25 chunks, best first."""
        return [s.chunk.text for s in self.bm25.rank(question, chunks, self.adapter.config.c0)]

    def scores(self, question: str, chunks: list[ChunkRecord]) -> list[float]:
        keys = self.keys(chunks)
        c0 = self.c0(question, chunks)
        key = (question, tuple(c0))
        queries = self._queries.get(key)
        if queries is None:
            queries = self.query.encode_question(question, c0)
            self._queries[key] = queries
            while len(self._queries) > MAX_QUERIES:
                self._queries.popitem(last=False)
        return self.query.score_keys(queries, keys).tolist()
