"""The interface every selector implements, and the context every selector is handed."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from evsel.settings import Settings
from evsel.store import ChunkRecord

if TYPE_CHECKING:
    from evsel.models.backbone import Backbone
    from evsel.models.statecache import StateCache
    from evsel.store import Store

EventSink = Callable[[dict], None]


def _ignore(_event: dict) -> None:
    pass


def build_now(_kind: str, _chunks: list[ChunkRecord], build: Callable[[], object], *_config) -> object:
    """The memo of a one-shot process: nothing outlives the request, so just build."""
    return build()


@dataclass
class SelectorContext:
    """What a selector may use. Built by the engine for each request.

    - `backbone`: the frozen LLM, loaded on first use (selectors that do not need it never load it);
    - `states`: the per-chunk state cache (the user's store for `ask`, eval's own cache for `eval`);
    - `store`: the store the chunks live in, for indexes persisted beside them; None when the chunks
      exist only in memory (eval);
    - `memo(kind, chunks, build, *config)`: scope data kept between requests (the daemon keeps it
      in memory, keyed by the chunks' ids and hashes; in-process it builds every time);
    - `on_event`: the progress sink of the request;
    - `settings`: the request's settings (adapter paths, ...);
    - `resources`: objects a selector loads once and keeps for the engine's lifetime (the MiniLM
      encoder), so a resident daemon loads them once; guard creation with `resources_lock`.
    """

    load_backbone: Callable[[], "Backbone"]
    states: "StateCache"
    store: "Store | None" = None
    memo: Callable[..., object] = build_now
    on_event: EventSink = _ignore
    settings: Settings = field(default_factory=Settings)
    resources: dict = field(default_factory=dict)
    resources_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def backbone(self) -> "Backbone":
        return self.load_backbone()


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

    def __init__(self, context: SelectorContext, **_options):
        self.context = context

    def prepare(self, chunks: list[ChunkRecord]) -> None:
        """Build what scoring this scope needs (an index, encoded chunk states) ahead of the
        questions; eval reports it as index time. Scoring works without it (it prepares lazily)."""

    @abstractmethod
    def scores(self, question: str, chunks: list[ChunkRecord]) -> list[float]:
        """One score per chunk, higher is better."""

    def rank(self, question: str, chunks: list[ChunkRecord], top_n: int | None = None) -> list[Scored]:
        """Chunks by descending score; ties keep document order (a stable sort)."""
        if not chunks:
            return []
        import numpy as np  # here, not at import: the CLI imports the selector registry for its help text

        values = np.asarray(self.scores(question, chunks), dtype=np.float64)
        if len(values) != len(chunks):
            raise RuntimeError(f"{self.name} returned {len(values)} scores for {len(chunks)} chunks")
        order = np.argsort(-values, kind="stable")  # ties keep document order
        if top_n is not None:
            order = order[:top_n]
        return [Scored(chunks[i], float(values[i]), rank) for rank, i in enumerate(order.tolist(), 1)]


def parse_variants(selector: str, text: str | None, allowed: tuple[str, ...], example: str) -> list[str]:
    """A spec's SELECTOR:VARIANTS part (`untrained+memory`, also comma-separated), in order, each
    once; one that `allowed` lacks fails naming them."""
    chosen = list(dict.fromkeys(v.strip() for v in (text or "").replace(",", "+").split("+") if v.strip()))
    unknown = [v for v in chosen if v not in allowed]
    if unknown:
        from evsel.errors import EvselError

        raise EvselError(f"unknown {selector} variant {unknown[0]!r}",
                         f"use one or more of {', '.join(allowed)}, joined by + (e.g. {example})")
    return chosen

