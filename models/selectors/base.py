"""The interface every selector implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from evsel.store import ChunkRecord


@dataclass
class Scored:
    chunk: ChunkRecord
    score: float
    rank: int  # 1 = best

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError("rank starts at 1")


class Selector(ABC):
    """Ranks chunks for a question. `needs_model` tells the engine whether to load the backbone."""

    name: str = ""
    needs_model: bool = False

    @abstractmethod
    def scores(self, question: str, chunks: list[ChunkRecord]) -> list[float]:
        """One score per chunk, higher is better."""

    def rank(self, question: str, chunks: list[ChunkRecord], top_n: int | None = None) -> list[Scored]:
        """Chunks by descending score; ties keep document order (a stable sort)."""
        if not chunks:
            return []
        values = self.scores(question, chunks)
        if len(values) != len(chunks):
            raise RuntimeError(f"{self.name} returned {len(values)} scores for {len(chunks)} chunks")
        order = sorted(range(len(chunks)), key=lambda i: -values[i])
        if top_n is not None:
            order = order[:top_n]
        return [Scored(chunks[i], float(values[i]), rank) for rank, i in enumerate(order, 1)]
