"""Reciprocal-rank fusion of BM25 and another selector (dense by default):
score = sum over the two rankings of 1 / (K + rank). Cheap, and the usual companion of a
model-internal selector whose signal is weak alone."""

from __future__ import annotations

from typing import TYPE_CHECKING

from evsel.errors import EvselError

from . import get_selector, register
from .base import Selector

if TYPE_CHECKING:  # annotations only: the registry stays light to import (the CLI's help)
    from evsel.store.store import ChunkRecord

K = 60  # the constant of Cormack et al. (2009)


@register("rrf")
class RRFSelector(Selector):
    name = "rrf"
    argument = "other"  # rrf:OTHER
    usage = "rrf:METHOD"
    help = "BM25 fused with METHOD, e.g. rrf:unreal"

    def __init__(self, context, other: str = "dense", **kwargs):
        super().__init__(context)
        if other in ("rrf", "bm25") or other.startswith("rrf:"):
            raise EvselError(f"rrf fuses bm25 with another selector, not {other!r}", "use e.g. rrf:dense")
        self.name = f"rrf:{other}"
        # both parts share the context, so their progress (chunks encoded at ask time) is shown
        self.parts = [get_selector("bm25", context), get_selector(other, context)]
        self.needs_model = any(p.needs_model for p in self.parts)

    def load(self) -> None:
        for part in self.parts:
            part.load()

    def prepare(self, chunks: list[ChunkRecord]) -> None:
        for part in self.parts:
            part.prepare(chunks)

    def scores(self, question: str, chunks: list[ChunkRecord]) -> list[float]:
        fused = [0.0] * len(chunks)
        for part in self.parts:
            values = part.scores(question, chunks)
            order = sorted(range(len(chunks)), key=lambda i: -values[i])
            for rank, i in enumerate(order, 1):
                fused[i] += 1.0 / (K + rank)
        return fused
