"""UNREAL selection (seed 000) with the trained adapter shipped for the backbone: cached chunk
states at layer l_c against retrieval-token queries read from the frozen LLM, scored by MaxSim.
C0, the passages the query pass reads before the question, are the top BM25 chunks of the scope."""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np

from evsel.store import ChunkRecord

from . import get_selector, register
from .base import Selector


# Query vectors by (adapter, question, C0): `rrf:unreal` or a second method over the same
# questions in one `evsel eval` run reuses the query pass instead of repeating it.
_QUERIES: OrderedDict = OrderedDict()
_MAX_QUERIES = 4096  # ~9 KB each


@register("unreal")
class UnrealSelector(Selector):
    name = "unreal"
    needs_model = True
    on_event = None  # progress callback for chunks encoded at ask time (set by the engine)

    def __init__(self, engine=None, adapter: str | None = None, **_):
        from evsel.engine import Engine
        from evsel.models import unreal

        self.engine = engine or Engine()
        self.adapter = unreal.default_adapter(self.engine.backbone, adapter)
        self.query = unreal.UnrealQuery(self.engine.backbone, self.adapter)
        self.bm25 = get_selector("bm25", engine=self.engine)
        tensors = b"".join(t.detach().numpy().tobytes() for t in [*self.adapter.trainable(), self.adapter.stats])
        self._adapter_id = hashlib.sha256(tensors).hexdigest()
        self._scope: tuple[tuple, object] | None = None  # last scope's keys

    def prepare(self, chunks: list[ChunkRecord], on_event=None):
        """The scope's chunk keys as scored (standardized fp32, N x L_p x d); the states are
        encoded now if not in the state cache (index time), and the daemon keeps the keys."""
        from evsel.models import unreal

        on_event = on_event or self.on_event
        key = tuple(c.content_hash for c in chunks)
        if self._scope is None or self._scope[0] != key:
            cfg = self.adapter.config

            def build():
                states = unreal.chunk_states(self.engine, chunks, cfg.layer, cfg.pool, on_event)
                return self.query.chunk_keys(states)

            cached = getattr(self.engine, "cached", None)
            keys = cached("unreal", chunks, build, cfg.cache_key(), self._adapter_id) if cached else build()
            self._scope = (key, keys)
        return self._scope[1]

    def context(self, question: str, chunks: list[ChunkRecord]) -> list[str]:
        """C0: the top BM25 chunks, best first."""
        return [s.chunk.text for s in self.bm25.rank(question, chunks, self.adapter.config.c0)]

    def scores(self, question: str, chunks: list[ChunkRecord]) -> list[float]:
        keys = self.prepare(chunks)
        context = self.context(question, chunks)
        key = (self.engine.backbone.fingerprint, self._adapter_id, question, tuple(context))
        queries = _QUERIES.get(key)
        if queries is None:
            queries = self.query.encode_question(question, context)
            _QUERIES[key] = queries
            while len(_QUERIES) > _MAX_QUERIES:
                _QUERIES.popitem(last=False)
        return self.query.score_keys(queries, keys).tolist()
