"""`default`: the method `evsel ask` uses with no --select, and `evsel eval --methods default`
evaluates. It is the method measured best on the dev splits for this backbone, as recorded in the
hybrid weights shipped for it (hybrid.json's "default": the method and why, written after the
measurements of docs/FUSION.md); with no such record, or when the named method's trained parts are
missing here, it is BM25, and the request says so once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from evsel.errors import EvselError

from . import get_selector, register
from .base import Ranking, Selector

if TYPE_CHECKING:  # annotations only: the registry stays light to import (the CLI's help)
    from evsel.store import ChunkRecord

FALLBACK = "bm25"
NO_RECORD = "no measured default ships for this backbone: BM25 (words), the best method without trained parts"


def default_method(backbone, settings=None) -> tuple[str, str]:
    """(method, why) for this backbone: what the shipped (or EVSEL_HYBRID_WEIGHTS) hybrid.json
    records as measured best, else BM25. Reads the file only (no weights, no model)."""
    from pathlib import Path

    from evsel.models import hybrid

    setting = getattr(settings, "hybrid_weights", None)
    where = Path(setting) if setting else hybrid.shipped_dir(backbone.fingerprint)
    try:
        data = hybrid.load_weights(where)
    except EvselError:
        return FALLBACK, NO_RECORD
    record = data.get("default") or {}
    if not record.get("method"):
        return FALLBACK, NO_RECORD
    return record["method"], record.get("why", "")


def resolve_select(select: str, settings) -> str:
    """What an ask with --select `select` runs first: `default` resolved for the settings' model
    (the daemon's check whether an ask needs the model); any other name as given."""
    if select != "default":
        return select
    from evsel.models.backbone import Backbone

    return default_method(Backbone(settings.model, settings.device), settings)[0]


@register("default")
class DefaultSelector(Selector):
    name = "default"
    help = "the method measured best for the model, else bm25 (evsel models info names it and why)"

    def __init__(self, context, **_):
        super().__init__(context)
        self._chosen: tuple[str, str] | None = None
        self._inner: Selector | None = None
        self.fallback_reason: str | None = None

    @property
    def chosen(self) -> tuple[str, str]:
        if self._chosen is None:
            self._chosen = default_method(self.context.backbone, self.context.settings)
        return self._chosen

    @property
    def needs_model(self) -> bool:  # the engine asks before loading: decided from the record alone
        return self.chosen[0] != FALLBACK

    @property
    def inner(self) -> Selector:
        if self._inner is None:
            method = self.chosen[0]
            inner = get_selector(method, self.context)
            if method != FALLBACK:
                try:
                    inner.load()
                except EvselError as exc:  # the trained parts are missing here: BM25, said once
                    self.fallback_reason = exc.message
                    self.context.on_event({"type": "warning", "message": (
                        f"the default method {method} cannot run here ({exc.message}); using {FALLBACK}")})
                    inner = get_selector(FALLBACK, self.context)
            self._inner = inner
        return self._inner

    @property
    def resolved(self) -> str:
        """The name of the method this default runs (what ask's result reports)."""
        return self.inner.name

    def load(self) -> None:
        self.inner.load()

    def prepare(self, chunks: list[ChunkRecord]) -> None:
        self.inner.prepare(chunks)

    def scores(self, question: str, chunks: list[ChunkRecord]) -> list[float]:
        return self.inner.scores(question, chunks)

    def ranking(self, question: str, chunks: list[ChunkRecord], top_n: int | None = None) -> Ranking:
        return self.inner.ranking(question, chunks, top_n)
