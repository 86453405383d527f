"""A learned fusion of BM25 with the LLM's own signals (issue 21): per chunk of a small candidate
pool, BM25's score and rank, the dense (MiniLM) cosine and rank, UNREAL's similarity and rank,
the QR heads' score and rank (QRRanker's scorer with its trained adapter), and dialogue features
(the chunk is a turn of a speaker the question names; where the chunk sits in its document).

Scores are normalised per question (z-scores over the scope, ranks as 1 / log2(1 + rank)), so one
weight vector transfers across documents. The pool is the union of the top POOL_EACH of BM25,
dense and UNREAL; it is ordered by a linear model (w . features, trained by a listwise softmax:
recipes/hybrid.py), and the chunks outside it keep BM25's order after it.

The weights ship as models/adapters/<fingerprint>/hybrid/hybrid.json: one weight set per group
of signals (all of them, and fallbacks without the LLM's parts), so a backbone without an UNREAL
adapter or QR heads uses the best set whose signals it has, and says so once.
`hybrid:GROUP+GROUP` restricts the signals (the ablation rows: e.g. hybrid:bm25+dense)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from evsel.errors import EvselError, ModelError

from . import get_selector, register
from .base import Ranking, Selector

if TYPE_CHECKING:  # annotations only: the registry stays light to import (the CLI's help)
    from evsel.store.store import ChunkRecord

PARTS = {"dense": "dense", "unreal": "unreal", "qr": "qrranker"}  # group -> the selector that scores it

# numpy and the fusion's arithmetic (evsel.models.fusion.hybrid) load with the selector, not with the
# registry: the client checks method names without them


@register("hybrid")
class HybridSelector(Selector):
    name = "hybrid"
    needs_model = True
    argument = "groups"  # hybrid:GROUP+GROUP
    help = "BM25 fused with dense, UNREAL and QR-head scores and dialogue cues by learned weights"
    forms = (("hybrid:GROUPS", "... with fewer signals, e.g. hybrid:bm25+dense (groups: bm25, dense, unreal, qr, "
                               "dialogue)"),)
    settings_fields = ("hybrid_weights",)

    def __init__(self, context, groups: str | None = None, weights: str | dict | None = None,
                 only_ready: bool = False, **_):
        from evsel.models.fusion import hybrid as fusion

        super().__init__(context)
        self.wanted = fusion.parse_groups(groups)
        if self.wanted is not None:
            self.name = "hybrid:" + "+".join(self.wanted)
            self.needs_model = any(g in fusion.LLM_GROUPS for g in self.wanted)
        self.weights_setting = weights if weights is not None else getattr(context.settings, "hybrid_weights", None)
        self.bm25 = get_selector("bm25", context)
        self.parts: dict[str, Selector] = {}
        self.weight_set: dict | None = None
        self.weights_data: dict = {}
        self.weights_from: str | None = None
        self.missing: dict[str, str] = {}  # group -> why it is not available
        self.signals: dict = {}  # the last scoring's groups: {"ran": [...], "waiting": {group: progress}}
        # as the default: rank with the signals already encoded for the whole scope, never wait for
        # an encode; asked for by name (--select hybrid), compute what is missing, as any method does
        self.only_ready = only_ready

    # what scoring uses ---------------------------------------------------------------------

    def available_parts(self, groups: list[str]) -> dict[str, Selector]:
        """The selectors of `groups` that load here; a group whose model part is missing (no
        UNREAL adapter, no QR heads, no MiniLM) is left out and its reason kept in `missing`."""
        parts = {}
        for group in groups:
            if group not in PARTS:
                continue
            try:
                part = get_selector(PARTS[group], self.context)
                part.load()
            except EvselError as exc:  # ModelError is one
                self.missing[group] = exc.message
                continue
            parts[group] = part
        return parts

    def load(self) -> None:
        from evsel.models.fusion import hybrid as fusion

        if self.weight_set is not None:
            return
        data = self.weights_setting if isinstance(self.weights_setting, dict) else None
        if data is None:
            if self.weights_setting:
                where = Path(self.weights_setting)
            else:
                where = fusion.shipped_dir(self.context.backbone.fingerprint)
            if not (where / fusion.WEIGHTS_FILE).is_file() and not where.is_file():
                raise ModelError(f"no hybrid weights for this backbone (fingerprint {self.context.backbone.fingerprint[:16]})"
                                 if not self.weights_setting else f"no hybrid weights in {where}",
                                 "train them with: evsel train hybrid --out DIR, then set EVSEL_HYBRID_WEIGHTS=DIR")
            data = fusion.load_weights(where)
            self.weights_from = str(where)
        wanted = self.wanted or sorted({g for ws in data["weight_sets"] for g in ws["groups"]})
        self.parts = self.available_parts(wanted)
        have = {"bm25", "dialogue", *self.parts} & set(wanted)
        chosen = fusion.choose_set(data, have)
        if chosen is None or (self.wanted is not None and set(chosen["groups"]) != set(self.wanted)):
            fitted = sorted({"hybrid:" + "+".join(ws["groups"]) for ws in data["weight_sets"]}, key=len)
            raise ModelError(f"the hybrid weights have no set for the signals {'+'.join(sorted(have))}"
                             + (f" ({'; '.join(self.missing.values())})" if self.missing else ""),
                             f"choose one they have ({', '.join(fitted)}), or train them with: evsel train hybrid")
        self.weight_set = chosen
        self.weights_data = data
        self.parts = {g: p for g, p in self.parts.items() if g in chosen["groups"]}
        if self.missing:
            self.context.on_event({"type": "warning", "message": (
                f"hybrid: without {', '.join(sorted(self.missing))} ({'; '.join(self.missing.values())}); "
                f"using its weights for {'+'.join(chosen['groups'])}")})

    def prepare(self, chunks: list[ChunkRecord]) -> None:
        self.load()
        self.bm25.prepare(chunks)
        for group, part in self.parts.items():
            if group != "qr":  # the QR heads score only the pool, at question time
                part.prepare(chunks)

    def features(self, question: str, chunks: list[ChunkRecord], groups: list[str]) -> tuple["np.ndarray", "np.ndarray", "np.ndarray"]:
        """(pool: indices into `chunks`, best BM25 first; (P, len(FEATURES)) features with zeros
        for the groups not computed; BM25's scores of every chunk)."""
        import numpy as np

        from evsel.models.fusion import hybrid as fusion

        n = len(chunks)
        full = {"bm25": np.asarray(self.bm25.scores(question, chunks), dtype=np.float64)}
        for group in fusion.POOLING_GROUPS:
            if group in groups and group in self.parts:
                full[group] = np.asarray(self.parts[group].scores(question, chunks), dtype=np.float64)
        bm25_order = np.argsort(-full["bm25"], kind="stable")
        pool: list[int] = []
        for values in full.values():
            for i in np.argsort(-values, kind="stable")[:fusion.POOL_EACH].tolist():
                if i not in pool:
                    pool.append(i)
        at = {i: r for r, i in enumerate(bm25_order.tolist())}
        pool = np.array(sorted(pool, key=lambda i: at[i]), dtype=np.int64)
        x = np.zeros((len(pool), len(fusion.FEATURES)))
        for group, values in full.items():
            z, r = fusion.GROUPS[group]
            x[:, fusion.FEATURES.index(z)] = fusion.zscore(values)[pool]
            x[:, fusion.FEATURES.index(r)] = fusion.rank_feature(values)[pool]
        if "qr" in groups and "qr" in self.parts:
            qr = np.asarray(self.parts["qr"].scores(question, [chunks[i] for i in pool]), dtype=np.float64)
            x[:, fusion.FEATURES.index("qr_z")] = fusion.zscore(qr)
            x[:, fusion.FEATURES.index("qr_rank")] = fusion.rank_feature(qr)
        if "dialogue" in groups:
            pooled = [chunks[i] for i in pool]
            x[:, fusion.FEATURES.index("speaker_named")] = fusion.speaker_named(question, pooled)
            x[:, fusion.FEATURES.index("position")] = fusion.positions(chunks)[pool] if n else 0.0
        return pool, x, full["bm25"]

    def ready_groups(self, chunks: list[ChunkRecord]) -> dict[str, int]:
        """{group: chunk texts it still lacks} for the loaded LLM and dense parts whose per-chunk
        states are not all stored for this scope yet (the background encode is still on them). A
        group found ready stays ready for the scope (the daemon keeps the note with the scope)."""
        ready = self.context.scope_data("hybrid.ready", chunks, dict)
        waiting = {}
        for group, part in self.parts.items():
            if ready.get(group):
                continue
            missing = part.missing_states(chunks)
            if missing:
                waiting[group] = missing
            else:
                ready[group] = True
        return waiting

    def ranking(self, question: str, chunks: list[ChunkRecord], top_n: int | None = None) -> Ranking:
        """With "signals": the groups that ranked, and those waiting for their states."""
        ranked = self.rank(question, chunks, top_n)
        return Ranking(ranked, {"signals": self.signals} if self.signals else {})

    def scores(self, question: str, chunks: list[ChunkRecord]) -> list[float]:
        """With `only_ready` (as the default), the fusion of the signals ready for every chunk of
        the scope: a group whose states are not all encoded yet sits out (its weights are not
        fitted on part of a scope), and the weight set fitted without it ranks; with none ready,
        BM25 alone does. Nothing is encoded for the whole scope then; the QR heads score only the
        pool, as always. Asked for by name, it encodes what its signals lack first."""
        from evsel.models.fusion import hybrid as fusion

        if not chunks:
            return []
        self.load()
        waiting = self.ready_groups(chunks) if self.only_ready else {}
        weight_set = self.weight_set_for(chunks, set(waiting))
        total = len({c.content_hash for c in chunks})
        self.signals = {"ran": list(weight_set["groups"]),
                        "waiting": {group: f"{total - missing} of {total} chunks encoded"
                                    for group, missing in sorted(waiting.items())}}
        if weight_set["groups"] == ["bm25"]:
            return self.bm25.scores(question, chunks)
        pool, x, bm25 = self.features(question, chunks, weight_set["groups"])
        return fusion.fused_scores(fusion.score_pool(x, weight_set), pool, bm25).tolist()

    def weight_set_for(self, chunks: list[ChunkRecord], waiting: set[str] = frozenset()) -> dict:
        """The set over the loaded set's signals less those `waiting`, fitted for the chunks' kind
        of document where the weights hold one (else the one fitted on every kind)."""
        from evsel.models.fusion import hybrid as fusion

        kinds = {c.kind for c in chunks}
        kind = kinds.pop() if len(kinds) == 1 else None
        groups = set(self.weight_set["groups"]) - waiting
        if not waiting:
            own = fusion.choose_set(self.weights_data, groups, kind) if kind else None
            return own if own is not None and own["groups"] == self.weight_set["groups"] else self.weight_set
        return fusion.choose_set(self.weights_data, groups, kind) or {"name": "bm25", "groups": ["bm25"],
                                                                      "weights": [1.0, 0.0]}
