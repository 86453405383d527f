"""The interface every selector implements, and the context every selector is handed."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
import time
from typing import TYPE_CHECKING, Callable

from evsel.settings import Settings

if TYPE_CHECKING:
    from evsel.store.store import ChunkRecord
    from evsel.models.runtime.backbone import Backbone
    from evsel.models.shared.statecache import StateCache
    from evsel.store.store import Store

EventSink = Callable[[dict], None]


def _ignore(_event: dict) -> None:
    pass


def build_now(_kind: str, _chunks: list[ChunkRecord], build: Callable[[], object], *_config) -> object:
    """The scope data of a one-shot process: nothing outlives the request, so just build."""
    return build()


@dataclass
class SelectorContext:
    """What a selector may use. Built by the engine for each request.

    - `backbone`: the frozen LLM, loaded on first use (selectors that do not need it never load it);
    - `states`: the per-chunk state cache (the user's store for `ask`, eval's own cache for `eval`);
    - `store`: the store the chunks live in, for indexes persisted beside them; None when the chunks
      exist only in memory (eval);
    - `scope_data(kind, chunks, build, *config)`: data built from a scope's chunks (an index,
      stacked states), kept between requests by the daemon (in memory, keyed by the chunks' ids and
      hashes); in-process it builds every time;
    - `on_event`: the progress sink of the request;
    - `settings`: the request's settings (adapter paths, ...);
    - `resources`: objects a selector loads once and keeps for the engine's lifetime (the MiniLM
      encoder), so a resident daemon loads them once; guard creation with `resources_lock`.
    """

    load_backbone: Callable[[], "Backbone"]
    states: "StateCache"
    store: "Store | None" = None
    scope_data: Callable[..., object] = build_now
    on_event: EventSink = _ignore
    settings: Settings = field(default_factory=Settings)
    resources: dict = field(default_factory=dict)
    resources_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def backbone(self) -> "Backbone":
        return self.load_backbone()


@dataclass
class IngestWork:
    """What a selector's ingest hook (`Selector.ingest_work`) works with: the selector context
    (the user's store and states), the documents (None: every one), which work the request asked
    for (`states`: per-chunk states and caches; `summaries`: memory summaries), the batch size,
    and `slice_s`: work in timed slices of about this many seconds (see `timed_slices`)."""

    context: SelectorContext
    doc_ids: list[int] | None
    states: bool = True
    summaries: bool = False
    batch: int = 64
    slice_s: float | None = None


def timed_slices(items: list, work: Callable[[list], None], slice_s: float, progress: Callable[[int], None],
                 most: int = 64, clock: Callable[[], float] = time.perf_counter) -> None:
    """Run `work` over `items` in consecutive slices of about `slice_s` seconds each: the first
    slice holds one item, each next one as many as the time per item fits (at least one, at most
    `most`, at most twice the last slice). The time per item is the last slice's, or half the
    estimate before when that is more: on a loaded machine one quick slice must not size the
    next for a quiet one (a request waits for the slice that runs). `progress(done)` is called
    before the first slice and after each one (where a caller may stop the work by raising)."""
    done, size, per_item = 0, 1, 0.0
    progress(0)
    while done < len(items):
        part = items[done:done + size]
        started = clock()
        work(part)
        per_item = max((clock() - started) / len(part), per_item / 2)
        done += len(part)
        progress(done)
        size = most if per_item <= 0 else max(1, min(most, 2 * len(part), int(slice_s / per_item)))


@dataclass
class Scored:
    chunk: ChunkRecord
    score: float
    rank: int  # 1 = best

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError("rank starts at 1")


@dataclass
class Ranking:
    """What ranking returns: the chunks (Scored, rank 1 = best) and what the selector says beside
    them: `extras` for the result ("memory": the summaries a reranker read; "no_match": no ranked
    passage shares a word with the question), `warnings` for the user, and the pipeline's stage
    `timings`."""

    scored: list[Scored]
    extras: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


class Selector(ABC):
    """Ranks chunks for a question. `needs_model` tells the engine whether to load the backbone.

    Construction is cheap: what a selector needs from the model (the backbone, an adapter) is
    loaded by `load()`, which the pipeline calls where it reports loading, or on first use.
    `argument` names the keyword a spec's NAME:ARGUMENT fills (None: the selector takes none);
    `variants` are the ones NAME:VARIANT[+VARIANT] may name.

    The class attributes below the first group are the registry's metadata, read without building
    the selector (the CLI's help, the request checks, the daemon's scheduling)."""

    name: str = ""
    needs_model: bool = False
    argument: str | None = None
    variants: tuple[str, ...] = ()
    variant_example: str = ""  # for the error naming an unknown variant

    help: str = ""  # what it ranks by, one line (ask --list-methods)
    usage: str = ""  # how a method names it where the bare name is not one (rrf:METHOD)
    forms: tuple[tuple[str, str], ...] = ()  # argument forms worth listing, each with what it does
    light: bool = False  # ranks with no model at all (no backbone, no encoder)
    corpus_first_stage: bool = False  # a corpus's indexes can stand in for it as the first stage (ask --corpus)
    settings_fields: tuple[str, ...] = ()  # the `Settings` fields it reads (EVSEL_* variables)
    ingest_order: int = 1  # where its ingest work runs among the others' (lower first)

    def __init__(self, context: SelectorContext, **_options):
        self.context = context

    def load(self) -> None:
        """Load what scoring needs from the model now (the backbone's weights, an adapter)."""
        if self.needs_model:
            _ = self.context.backbone.model

    def prepare(self, chunks: list[ChunkRecord]) -> None:
        """Build what scoring this scope needs (an index, encoded chunk states) ahead of the
        questions; eval reports it as index time. Scoring works without it (it prepares lazily)."""

    def missing_states(self, chunks: list[ChunkRecord]) -> int:
        """How many distinct chunk texts of the scope still lack what this method computes per
        chunk ahead of its questions (0: it ranks the scope without encoding anything now). A
        method with nothing per chunk is always ready."""
        return 0

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

    def ranking(self, question: str, chunks: list[ChunkRecord], top_n: int | None = None) -> Ranking:
        """`rank`, with what this selector reports beside the order (see Ranking)."""
        return Ranking(self.rank(question, chunks, top_n))

    @classmethod
    def on_chunks_deleted(cls, store: "Store", hashes: list[str]) -> None:
        """Delete what this method keeps outside the store's database (files beside it) for
        content hashes no chunk holds any more; the store runs it after the deletion commits,
        once `register_cleanups` has registered it."""

    @classmethod
    def ingest_work(cls, chunks: list[ChunkRecord], work: IngestWork) -> dict:
        """What this method computes ahead of its first question for newly stored `chunks` (the
        documents' chunks, in document order) and that is still missing: chunk states, caches,
        summaries. Ingest runs it after storing (or later, for the daemon). Returns what it did,
        merged into the ingest's outcome."""
        return {}


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

