"""BM25 (Okapi, rank-bm25) over the chunks in scope."""

from __future__ import annotations

import re

from rank_bm25 import BM25Okapi

from evsel.store import ChunkRecord

from . import register
from .base import Selector

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
STOPWORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further had
    has have having he her here hers herself him himself his how i if in into is it its itself just
    me more most my myself no nor not now of off on once only or other our ours ourselves out over own
    same she should so some such than that the their theirs them themselves then there these they this
    those through to too under until up very was we were what when where which while who whom why will
    with would you your yours yourself yourselves s t don""".split()
)


def _stem(word: str) -> str:
    """A light suffix stripper: enough to match 'killed'/'kill', 'letters'/'letter'."""
    if word.endswith("'s"):
        word = word[:-2]
    for suffix in ("ingly", "edly", "ing", "ies", "ied", "ed", "es", "s", "ly"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            stem = word[: -len(suffix)]
            if suffix in ("ies", "ied"):
                stem += "y"
            return stem
    return word


def tokenize(text: str) -> list[str]:
    return [_stem(w) for w in _WORD.findall(text.lower()) if w not in STOPWORDS]


@register("bm25")
class BM25Selector(Selector):
    name = "bm25"
    needs_model = False

    def __init__(self, k1: float = 1.5, b: float = 0.75, engine=None, **_):
        self.k1 = k1
        self.b = b
        self.engine = engine

    def index(self, chunks: list[ChunkRecord]) -> BM25Okapi:
        def build() -> BM25Okapi:
            return BM25Okapi([tokenize(c.text) or ["<empty>"] for c in chunks], k1=self.k1, b=self.b)

        cached = getattr(self.engine, "cached", None)
        if cached is None:
            return build()
        return cached("bm25", chunks, build, self.k1, self.b)  # the daemon keeps it per scope

    def scores(self, question: str, chunks: list[ChunkRecord]) -> list[float]:
        query = tokenize(question)
        if not query:
            return [0.0] * len(chunks)
        return [float(x) for x in self.index(chunks).get_scores(query)]
