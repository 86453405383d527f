"""BM25 (Okapi, rank-bm25's BM25Okapi) over the chunks in scope.

With a store (`evsel ask`), the scores come from the index persisted at ingest (evsel/bm25_index.py),
equal to BM25Okapi's over the scope's chunks without tokenizing them; chunks that are not whole
stored documents (a reranker's candidates) and eval's in-memory chunks get BM25Okapi built from
their texts, kept between requests by the daemon's scope-data cache.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import register
from .base import Ranking, Selector

if TYPE_CHECKING:
    from evsel.store.store import ChunkRecord
    from rank_bm25 import BM25Okapi

__all__ = ["BM25Selector", "STOPWORDS", "tokenize"]

NO_MATCH = ("no passage shares a word with the question; the passages shown are not evidence "
            "(rephrase it, or try --select dense)")


@register("bm25")
class BM25Selector(Selector):
    name = "bm25"
    needs_model = False
    help = "words"
    light = True
    corpus_first_stage = True

    def __init__(self, context, k1: float = 1.5, b: float = 0.75, **_):
        super().__init__(context)
        self.k1 = k1
        self.b = b

    def index(self, chunks: list[ChunkRecord]):
        """The scope's index: the one persisted in the store when the chunks are whole stored
        documents, else BM25Okapi built from their texts. The daemon keeps either per scope."""
        store = self.context.store

        def build():
            if store is not None:
                scope = store.bm25_scope(chunks)
                if scope is not None:
                    return scope
            return self.build(chunks)

        return self.context.scope_data("bm25", chunks, build, self.k1, self.b)

    def build(self, chunks: list[ChunkRecord]) -> BM25Okapi:
        from rank_bm25 import BM25Okapi

        from evsel.store.bm25_index import chunk_tokens

        return BM25Okapi([chunk_tokens(c.text) for c in chunks], k1=self.k1, b=self.b)

    def prepare(self, chunks: list[ChunkRecord]) -> None:
        self.index(chunks)

    def scores(self, question: str, chunks: list[ChunkRecord]) -> list[float]:
        from rank_bm25 import BM25Okapi

        from evsel.store.bm25_index import tokenize

        query = tokenize(question)
        if not query:
            return [0.0] * len(chunks)
        index = self.index(chunks)
        if not isinstance(index, BM25Okapi):  # persisted
            values = self.context.store.bm25_scores(index, query, self.k1, self.b)
            if values is not None:
                return values.tolist()
            index = self.build(chunks)  # a document changed under the scope: score the chunks in hand
        return [float(x) for x in index.get_scores(query)]

    def ranking(self, question: str, chunks: list[ChunkRecord], top_n: int | None = None) -> Ranking:
        """When no word of the question is in any ranked passage, every score is 0 (or, in a scope
        of a document or two, negative idf) and the passages are not evidence: "no_match" says so."""
        from evsel.store.bm25_index import tokenize

        ranked = self.rank(question, chunks, top_n)
        if ranked and all(s.score <= 0 for s in ranked):
            words = set(tokenize(question))
            if not any(words & set(tokenize(s.chunk.text)) for s in ranked):
                return Ranking(ranked, {"no_match": True}, [NO_MATCH])
        return Ranking(ranked)


def __getattr__(name: str):
    # bm25_index's names (numpy at import), re-exported when first read: the CLI's request checks
    # load this module to know the selector names
    if name in ("STOPWORDS", "chunk_tokens", "tokenize"):
        from evsel.store import bm25_index

        return getattr(bm25_index, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
