"""`default`: the method `evsel ask` uses with no --select, and `evsel eval --methods default`
evaluates. For each kind of document (chats, books, PDFs) it is the method measured best on that
kind's questions for this backbone, as its defaults record says (defaults.json, written by
`evsel train defaults` from the fusion's fit and the runs no fit looked at; an older record lives
in hybrid.json's "defaults"; each chosen by the paired test of models/fusion/paired.py; docs/FUSION.md);
with no such record, or when the named method's trained parts are missing here, it is BM25, and
the request says so once. A scope of several kinds has each kind ranked by its own method, merged
on BM25's scale over the whole scope (the score shown is BM25's)."""

from __future__ import annotations

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


def resolve_selects(select: str, settings, kinds: set[str] | None = None) -> list[str]:
    """What an ask with --select `select` may run first: `default` resolved for the settings'
    model, the method of each kind in `kinds` (None: of every kind; the daemon's check whether an
    ask needs the model); any other name as given."""
    if select != "default":
        return [select]
    from evsel.models.runtime.backbone import Backbone

    return sorted(methods_for(default_methods(Backbone(settings.model, settings.device), settings), kinds))


def methods_for(methods: dict[str, tuple[str, str]], kinds: set[str] | None) -> set[str]:
    """The methods `default_methods` names for `kinds` (None: for every kind)."""
    wanted = {kind_of(k) for k in kinds} if kinds is not None else set(methods)
    return {m for kind, (m, _) in methods.items() if kind in wanted}


@register("default")
class DefaultSelector(Selector):
    name = "default"
    help = "the method measured best for each kind of document (chats, books, PDFs), else bm25 (evsel models info)"

    def __init__(self, context, **_):
        super().__init__(context)
        self._chosen: dict[str, tuple[str, str]] | None = None
        self._inners: dict[str, Selector] = {}
        self._ran: list[str] = []
        self.fallback_reason: str | None = None
        self.scope_kinds: set[str] | None = None  # limit_to_kinds: the kinds the scope holds

    @property
    def chosen(self) -> dict[str, tuple[str, str]]:
        if self._chosen is None:
            self._chosen = default_methods(self.context.backbone, self.context.settings)
        return self._chosen

    def limit_to_kinds(self, kinds: set[str]) -> None:
        """The scope holds only these kinds of document: the others' methods are not needed."""
        self.scope_kinds = {kind_of(k) for k in kinds}

    @property
    def needs_model(self) -> bool:  # the engine asks before loading: decided from the record alone
        methods = methods_for(self.chosen, self.scope_kinds)
        return any(get_selector(method, self.context).needs_model for method in methods if method != FALLBACK)

    def inner(self, kind: str) -> Selector:
        """The selector that ranks documents of `kind` (BM25, said once, where its method cannot run)."""
        method = self.chosen[kind_of(kind)][0]
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
        return " + ".join(self._ran) if self._ran else self.inner("book").name

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
        for kind in KINDS if self.scope_kinds is None else sorted(self.scope_kinds):
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
