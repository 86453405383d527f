"""`default`: the method `evsel ask` uses with no --select, and `evsel eval --methods default`
evaluates. For each kind of document (chats, books, PDFs) it is the method measured best on that
kind's questions for this backbone, as its defaults record says (defaults.json, written by
`evsel train defaults` from the fusion's fit and the runs no fit looked at; an older record lives
in hybrid.json's "defaults"; each chosen by the paired test of models/fusion/paired.py; docs/FUSION.md);
with no such record, or when the named method's trained parts are missing here, it is BM25, and
the request says so once. A scope of several kinds has each kind ranked by its own method, merged
on BM25's scale over the whole scope (the score shown is BM25's)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from evsel.errors import EvselError

from . import get_selector, register
from .base import Ranking, Selector
from ..fusion.paired import KINDS

if TYPE_CHECKING:  # annotations only: the registry stays light to import (the CLI's help)
    from evsel.store.store import ChunkRecord

FALLBACK = "bm25"
DEFAULTS_FILE = "defaults.json"  # each kind's method and why, apart from the fusion's weights
DEFAULTS_FORMAT = "evsel-defaults/1"
NO_RECORD = "no measured default ships for this backbone: BM25 (words), the best method without trained parts"


def default_methods(backbone, settings=None) -> dict[str, tuple[str, str]]:
    """{kind: (method, why)} for every kind of document: what the shipped (or
    EVSEL_HYBRID_WEIGHTS) hybrid.json records as measured best for that kind ("defaults", chosen
    by the paired test of models/fusion/paired.py; an older record's one "default" serves every kind),
    else BM25. Reads the file only (no weights, no model)."""
    from pathlib import Path

    from evsel.models.fusion import hybrid

    setting = getattr(settings, "hybrid_weights", None)
    where = Path(setting) if setting else hybrid.shipped_dir(backbone.fingerprint)
    record = defaults_file(where, shipped=not setting)
    try:
        data = read_defaults(record) if record.is_file() else hybrid.load_weights(where)
    except EvselError:
        return {kind: (FALLBACK, NO_RECORD) for kind in KINDS}
    per_kind, shared = data.get("defaults") or {}, data.get("default") or {}
    out = {}
    tested = "+".join(sorted(per_kind)) or "no kind"
    for kind in KINDS:
        record = per_kind.get(kind) or shared
        if record.get("method"):
            out[kind] = (record["method"], record.get("why", ""))
        else:  # the shipped fusion was tested on other kinds of document than this one
            out[kind] = (FALLBACK, f"not measured on {kind} documents (the shipped fusion's dev questions are "
                                   f"{tested} ones): BM25 (words), the best method without that test")
    return out


def defaults_file(weights: Path, shipped: bool) -> Path:
    """The defaults record that goes with a weights folder: EVSEL_HYBRID_WEIGHTS's DEFAULTS_FILE,
    or for the shipped weights (models/adapters/<fingerprint>/hybrid) the one beside the
    backbone's other adapters. `evsel train defaults` writes it."""
    weights = weights.parent if weights.suffix == ".json" else weights
    return (weights.parent if shipped else weights) / DEFAULTS_FILE


def read_defaults(path: Path) -> dict:
    from evsel.models.shared.trained_files import read_json

    data = read_json(path, "the defaults record", "evsel train defaults")
    if data.get("format") != DEFAULTS_FORMAT or not isinstance(data.get("defaults"), dict):
        from evsel.errors import ModelError

        raise ModelError(f"{path} is not a defaults record ({DEFAULTS_FORMAT})",
                         "write it with: evsel train defaults --held-out FILE --out DIR")
    return data


def default_method(backbone, settings=None, kind: str | None = None) -> tuple[str, str]:
    """(method, why) for one kind of document; with no kind, the method every kind shares, or
    "by kind" and each kind's method when they differ."""
    methods = default_methods(backbone, settings)
    if kind:
        return methods[kind_of(kind)]
    if len({m for m, _ in methods.values()}) == 1:
        return next(iter(methods.values()))
    return "by kind", "; ".join(f"{kind}: {m}" for kind, (m, _) in methods.items())


def kind_of(kind: str) -> str:
    """The kind a default is chosen for: a chunk without one (made in memory) reads as prose."""
    return kind if kind in KINDS else "book"


def states_read(method: str) -> set[str]:
    """The selectors whose per-chunk states `method` reads (what an ingest encodes ahead of the
    first ask for a kind whose default it is): none for BM25."""
    from .hybrid import PARTS

    name, _, argument = method.partition(":")
    if name == "hybrid":
        from evsel.models.fusion import hybrid

        groups = hybrid.parse_groups(argument) or list(hybrid.GROUPS)
        return {PARTS[g] for g in groups if g in PARTS}
    if name == "rrf":
        return states_read(argument)
    return set() if name == FALLBACK else {name}


@dataclass(frozen=True)
class Resolved:
    """A first stage with `default` resolved: the concrete method (and why) for each kind of
    document the scope holds, every kind when the scope is not known. A method asked for by name
    stands for itself, whatever the kind."""

    asked: str
    by_kind: dict[str, tuple[str, str]]

    @property
    def is_default(self) -> bool:
        return self.asked == "default"

    def methods(self) -> list[str]:
        """The concrete methods the scope runs, each once, sorted."""
        return sorted({method for method, _ in self.by_kind.values()})

    def method_for(self, kind: str) -> str:
        return self.by_kind[kind_of(kind)][0]


OVER_A_CORPUS = "a corpus holds one index per first stage: the default over a corpus is BM25 (words)"


def resolve(select: str, settings, load_backbone, kinds: set[str] | None = None, corpus: bool = False) -> Resolved:
    """The one place `default` becomes concrete methods, before any selector is built: for each
    kind in `kinds` (None: every kind), the method the defaults record names for this backbone
    (`default_methods`); over a corpus, BM25. `load_backbone` is called only for `default` (its
    fingerprint picks the record). Any other `select` is returned as asked."""
    wanted = sorted({kind_of(k) for k in kinds}) if kinds is not None else list(KINDS)
    if select != "default":
        return Resolved(select, {kind: (select, "asked for") for kind in wanted})
    if corpus:
        return Resolved(select, {kind: (FALLBACK, OVER_A_CORPUS) for kind in wanted})
    chosen = default_methods(load_backbone(), settings)
    return Resolved(select, {kind: chosen[kind] for kind in wanted})


@register("default")
class DefaultSelector(Selector):
    name = "default"
    help = "the method measured best for each kind of document (chats, books, PDFs), else bm25 (evsel models info)"

    def __init__(self, context, resolution: Resolved | None = None, **_):
        """`resolution`: `resolve`'s methods for the scope's kinds (the pipeline resolves them
        before building this); built without one, it resolves for every kind."""
        super().__init__(context)
        self.resolution = resolution or resolve("default", context.settings, lambda: context.backbone)
        self._inners: dict[str, Selector] = {}
        self._ran: list[str] = []
        self.fallback_reason: str | None = None

    @property
    def chosen(self) -> dict[str, tuple[str, str]]:
        """{kind: (method, why)} for the kinds this default ranks."""
        return self.resolution.by_kind

    @property
    def needs_model(self) -> bool:  # the engine asks before loading: decided from the record alone
        return any(get_selector(method, self.context).needs_model
                   for method in self.resolution.methods() if method != FALLBACK)

    def inner(self, kind: str) -> Selector:
        """The selector that ranks documents of `kind` (BM25, said once, where its method cannot run)."""
        method = self.resolution.method_for(kind)
        if method not in self._inners:
            inner = get_selector(method, self.context, only_ready=True)  # the default never waits for an encode
            if method != FALLBACK:
                try:
                    inner.load()
                except EvselError as exc:  # the trained parts are missing here: BM25, said once
                    self.fallback_reason = exc.message
                    self.context.on_event({"type": "warning", "message": (
                        f"the default method {method} cannot run here ({exc.message}); using {FALLBACK}")})
                    inner = get_selector(FALLBACK, self.context)
            self._inners[method] = inner
        return self._inners[method]

    @property
    def resolved(self) -> str:
        """The name of the method this default ran last (what ask's result reports): one name, or
        each kind's as "method (kind) + ..." when the scope held kinds with different methods."""
        return " + ".join(self._ran) if self._ran else self.inner("book" if "book" in self.chosen else next(iter(self.chosen))).name

    def _parts(self, chunks: list[ChunkRecord]) -> dict[str, tuple[Selector, list[int]]]:
        """By the name of the selector that ranks them: that selector and the chunks' indices (one
        entry for a single-kind scope)."""
        parts: dict[str, tuple[Selector, list[int]]] = {}
        kinds: dict[str, list[str]] = {}
        for i, chunk in enumerate(chunks):
            kind = kind_of(chunk.kind)
            inner = self.inner(kind)
            parts.setdefault(inner.name, (inner, []))[1].append(i)
            if kind not in kinds.setdefault(inner.name, []):
                kinds[inner.name].append(kind)
        self._ran = [name if len(parts) == 1 else f"{name} ({', '.join(kinds[name])})" for name in parts]
        return parts

    def plan(self, chunks: list[ChunkRecord]) -> str:
        """The name of what ranking `chunks` runs (as `resolved` reports it afterwards)."""
        self._parts(chunks)
        return self.resolved

    def load(self) -> None:
        for kind in self.chosen:
            self.inner(kind).load()

    def prepare(self, chunks: list[ChunkRecord]) -> None:
        for inner, at in self._parts(chunks).values():
            inner.prepare([chunks[i] for i in at])

    def scores(self, question: str, chunks: list[ChunkRecord]) -> list[float]:
        parts = list(self._parts(chunks).values())
        if len(parts) == 1:
            return parts[0][0].scores(question, chunks)
        # several kinds, several methods: each orders its own kind's chunks, and the orders are merged
        # on one scale, BM25's over the whole scope: a kind's r-th chunk gets the r-th best BM25 score
        # among that kind's chunks. A kind that holds the question's words keeps its share of the top;
        # one that does not (an unrelated filing beside a chat) gets no fixed share, as it did by rank.
        import numpy as np

        scale = np.asarray(get_selector(FALLBACK, self.context).scores(question, chunks), dtype=np.float64)
        out = np.zeros(len(chunks))
        for inner, at in parts:
            order = np.argsort(-np.asarray(inner.scores(question, [chunks[i] for i in at]), dtype=np.float64),
                               kind="stable")
            out[np.asarray(at)[order]] = np.sort(scale[at])[::-1]
        return out.tolist()

    def ranking(self, question: str, chunks: list[ChunkRecord], top_n: int | None = None) -> Ranking:
        parts = list(self._parts(chunks).values())
        if len(parts) == 1:
            return parts[0][0].ranking(question, chunks, top_n)
        return super().ranking(question, chunks, top_n)
