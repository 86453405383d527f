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

import json
import re
from pathlib import Path

import numpy as np

from evsel.errors import EvselError, ModelError
from evsel.store import ChunkRecord

from . import get_selector, register
from .base import Selector

FORMAT = "evsel-hybrid/1"
WEIGHTS_FILE = "hybrid.json"
POOL_EACH = 10  # each retriever's top chunks that enter the pool (<= 30 candidates)
# feature groups, in the order of the feature vector; bm25 is always there (it orders the rest)
GROUPS = {
    "bm25": ("bm25_z", "bm25_rank"),
    "dense": ("dense_z", "dense_rank"),
    "unreal": ("unreal_z", "unreal_rank"),
    "qr": ("qr_z", "qr_rank"),
    "dialogue": ("speaker_named", "position"),
}
FEATURES = tuple(f for names in GROUPS.values() for f in names)
LLM_GROUPS = ("unreal", "qr")  # the groups that need the backbone
WORD = re.compile(r"[A-Za-z][A-Za-z'-]+")


def shipped_dir(fingerprint: str) -> Path:
    return Path(__file__).resolve().parents[1] / "adapters" / fingerprint[:16] / "hybrid"


def rank_feature(values: np.ndarray) -> np.ndarray:
    """1 / log2(1 + rank) of each value (rank 1 = highest; ties keep order)."""
    order = np.argsort(-values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(1, len(values) + 1)
    return 1.0 / np.log2(1.0 + ranks)


def zscore(values: np.ndarray) -> np.ndarray:
    std = values.std()
    return (values - values.mean()) / std if std > 1e-12 else np.zeros_like(values)


def speaker_named(question: str, chunks: list[ChunkRecord]) -> np.ndarray:
    """1 where a speaker of the chunk is named in the question (first names count)."""
    words = {w.lower() for w in WORD.findall(question)}
    out = np.zeros(len(chunks))
    for i, chunk in enumerate(chunks):
        names = {part.lower() for s in chunk.speakers for part in s.split()}
        out[i] = float(bool(names & words))
    return out


def positions(chunks: list[ChunkRecord]) -> np.ndarray:
    """Where each chunk sits in its document, 0 (start) to 1 (end): session order for a dialogue."""
    last: dict[int, int] = {}
    for c in chunks:
        last[c.doc_id] = max(last.get(c.doc_id, 0), c.seq)
    return np.array([c.seq / last[c.doc_id] if last[c.doc_id] else 0.0 for c in chunks])


# ---------------------------------------------------------------------------------------------
# the weights


def columns(groups: list[str] | tuple[str, ...]) -> list[int]:
    """Indices into FEATURES of the groups' features."""
    return [FEATURES.index(f) for g in groups for f in GROUPS[g]]


def score_pool(features: np.ndarray, weight_set: dict) -> np.ndarray:
    """The linear model of one weight set over a pool's (P, len(FEATURES)) features."""
    cols = columns(weight_set["groups"])
    return features[:, cols] @ np.asarray(weight_set["weights"], dtype=np.float64)


def load_weights(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / WEIGHTS_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot read hybrid weights from {path}: {exc}",
                         "give a hybrid.json written by: evsel train hybrid") from exc
    if data.get("format") != FORMAT or not data.get("weight_sets"):
        raise ModelError(f"{path} is not a hybrid weight file ({FORMAT})", "give a hybrid.json written by: evsel train hybrid")
    for ws in data["weight_sets"]:
        if len(ws["weights"]) != len(columns(ws["groups"])):
            raise ModelError(f"{path}: a weight set of {ws['groups']} has {len(ws['weights'])} weights")
    return data


def save_weights(path: str | Path, data: dict) -> Path:
    path = Path(path)
    if path.suffix != ".json":
        path = path / WEIGHTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": FORMAT, **data}, indent=1) + "\n")
    return path


def choose_set(data: dict, available: set[str]) -> dict | None:
    """The weight set using the most groups among those `available` (None: no set fits)."""
    fitting = [ws for ws in data["weight_sets"] if set(ws["groups"]) <= available]
    return max(fitting, key=lambda ws: len(ws["groups"]), default=None)


def parse_groups(text: str | None) -> list[str] | None:
    if not text:
        return None
    chosen = list(dict.fromkeys(g.strip() for g in text.replace(",", "+").split("+") if g.strip()))
    unknown = [g for g in chosen if g not in GROUPS]
    if unknown or "bm25" not in chosen:
        raise EvselError(f"hybrid:{text}: the groups are {', '.join(GROUPS)} joined by +, bm25 among them",
                         "e.g. hybrid:bm25+dense or hybrid:bm25+dense+qr")
    return chosen


# ---------------------------------------------------------------------------------------------
# the selector


@register("hybrid")
class HybridSelector(Selector):
    name = "hybrid"
    needs_model = True
    argument = "groups"  # hybrid:GROUP+GROUP

    def __init__(self, context, groups: str | None = None, weights: str | dict | None = None, **_):
        super().__init__(context)
        self.wanted = parse_groups(groups)
        if self.wanted is not None:
            self.name = "hybrid:" + "+".join(self.wanted)
            self.needs_model = any(g in LLM_GROUPS for g in self.wanted)
        self.weights_setting = weights if weights is not None else getattr(context.settings, "hybrid_weights", None)
        self.bm25 = get_selector("bm25", context)
        self.parts: dict[str, Selector] = {}
        self.weight_set: dict | None = None
        self.weights_from: str | None = None
        self.missing: dict[str, str] = {}  # group -> why it is not available

    # what scoring uses ---------------------------------------------------------------------

    def available_parts(self, groups: list[str]) -> dict[str, Selector]:
        """The selectors of `groups` that load here; a group whose model part is missing (no
        UNREAL adapter, no QR heads, no MiniLM) is left out and its reason kept in `missing`."""
        names = {"dense": "dense", "unreal": "unreal", "qr": "qrranker"}
        parts = {}
        for group in groups:
            if group not in names:
                continue
            try:
                part = get_selector(names[group], self.context)
                part.load()
            except EvselError as exc:  # ModelError is one
                self.missing[group] = exc.message
                continue
            parts[group] = part
        return parts

    def load(self) -> None:
        if self.weight_set is not None:
            return
        data = self.weights_setting if isinstance(self.weights_setting, dict) else None
        if data is None:
            if self.weights_setting:
                where = Path(self.weights_setting)
            else:
                where = shipped_dir(self.context.backbone.fingerprint)
            if not (where / WEIGHTS_FILE).is_file() and not where.is_file():
                raise ModelError(f"no hybrid weights for this backbone (fingerprint {self.context.backbone.fingerprint[:16]})"
                                 if not self.weights_setting else f"no hybrid weights in {where}",
                                 "train them with: evsel train hybrid --out DIR, then set EVSEL_HYBRID_WEIGHTS=DIR")
            data = load_weights(where)
            self.weights_from = str(where)
        wanted = self.wanted or sorted({g for ws in data["weight_sets"] for g in ws["groups"]})
        self.parts = self.available_parts(wanted)
        have = {"bm25", "dialogue", *self.parts} & set(wanted)
        chosen = choose_set(data, have)
        if chosen is None or (self.wanted is not None and set(chosen["groups"]) != set(self.wanted)):
            raise ModelError(f"the hybrid weights have no set for the signals {'+'.join(sorted(have))}"
                             + (f" ({'; '.join(self.missing.values())})" if self.missing else ""),
                             "train them with: evsel train hybrid, or choose other groups (hybrid:bm25+dense)")
        self.weight_set = chosen
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

    def features(self, question: str, chunks: list[ChunkRecord], groups: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(pool: indices into `chunks`, best BM25 first; (P, len(FEATURES)) features with zeros
        for the groups not computed; BM25's scores of every chunk)."""
        n = len(chunks)
        full = {"bm25": np.asarray(self.bm25.scores(question, chunks), dtype=np.float64)}
        for group in ("dense", "unreal"):
            if group in groups and group in self.parts:
                full[group] = np.asarray(self.parts[group].scores(question, chunks), dtype=np.float64)
        bm25_order = np.argsort(-full["bm25"], kind="stable")
        pool: list[int] = []
        for values in full.values():
            for i in np.argsort(-values, kind="stable")[:POOL_EACH].tolist():
                if i not in pool:
                    pool.append(i)
        at = {i: r for r, i in enumerate(bm25_order.tolist())}
        pool = np.array(sorted(pool, key=lambda i: at[i]), dtype=np.int64)
        x = np.zeros((len(pool), len(FEATURES)))
        for group, values in full.items():
            z, r = GROUPS[group]
            x[:, FEATURES.index(z)] = zscore(values)[pool]
            x[:, FEATURES.index(r)] = rank_feature(values)[pool]
        if "qr" in groups and "qr" in self.parts:
            qr = np.asarray(self.parts["qr"].scores(question, [chunks[i] for i in pool]), dtype=np.float64)
            x[:, FEATURES.index("qr_z")] = zscore(qr)
            x[:, FEATURES.index("qr_rank")] = rank_feature(qr)
        if "dialogue" in groups:
            pooled = [chunks[i] for i in pool]
            x[:, FEATURES.index("speaker_named")] = speaker_named(question, pooled)
            x[:, FEATURES.index("position")] = positions(chunks)[pool] if n else 0.0
        return pool, x, full["bm25"]

    def scores(self, question: str, chunks: list[ChunkRecord]) -> list[float]:
        if not chunks:
            return []
        self.load()
        pool, x, bm25 = self.features(question, chunks, self.weight_set["groups"])
        return fused_scores(score_pool(x, self.weight_set), pool, bm25).tolist()


def fused_scores(pool_scores: np.ndarray, pool: np.ndarray, bm25: np.ndarray) -> np.ndarray:
    """Scores whose descending order is the pool by `pool_scores`, then the other chunks in BM25's
    order (each below every pooled chunk)."""
    n = len(bm25)
    out = np.empty(n)
    floor = float(pool_scores.min()) if len(pool_scores) else 0.0
    order = np.argsort(-bm25, kind="stable")
    inside = np.zeros(n, dtype=bool)
    inside[pool] = True
    rest = [i for i in order.tolist() if not inside[i]]
    out[pool] = pool_scores
    for r, i in enumerate(rest, 1):
        out[i] = floor - 1.0 - r / (n + 1)
    return out


def evaluate(pool_scores: list[np.ndarray], gold: list[np.ndarray], ks=(1, 3, 5, 10)) -> dict:
    """Recall@k and MRR of ranking each pool by its scores, gold as a 0/1 vector per pool (a gold
    chunk outside the pool counts as missed: the metrics are of the pool's order)."""
    out = {f"recall@{k}": 0.0 for k in ks}
    out["mrr"] = 0.0
    counted = 0
    for s, g in zip(pool_scores, gold):
        total = g.sum() if g.ndim == 1 else 0
        if not total:
            continue
        counted += 1
        order = np.argsort(-s, kind="stable")
        hits = g[order]
        for k in ks:
            out[f"recall@{k}"] += hits[:k].sum() / total
        first = np.flatnonzero(hits)
        out["mrr"] += 1.0 / (first[0] + 1) if len(first) else 0.0
    return {k: v / counted if counted else 0.0 for k, v in out.items()} | {"questions": counted}


def fit(features: list[np.ndarray], gold: list[np.ndarray], groups: list[str], l2: float = 1e-3,
        steps: int = 300, lr: float = 0.05, seed: int = 0) -> list[float]:
    """Weights of a linear listwise model: minimise, over the pools with a gold chunk, -log of the
    softmax mass on the gold chunks, plus l2 |w|^2. Starts from BM25 alone (w = 1 on bm25_z), so
    what it learns is a departure from BM25 the data asks for. A few lines of torch (Adam)."""
    import torch

    torch.manual_seed(seed)
    cols = columns(groups)
    data = [(torch.tensor(x[:, cols], dtype=torch.float32), torch.tensor(g, dtype=torch.bool))
            for x, g in zip(features, gold) if g.any() and not g.all()]
    w = torch.zeros(len(cols))
    w[columns(["bm25"])[0]] = 1.0
    w.requires_grad_(True)
    if not data:
        return w.detach().tolist()
    optimizer = torch.optim.Adam([w], lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = sum(torch.logsumexp(x @ w, 0) - torch.logsumexp((x @ w)[g], 0) for x, g in data) / len(data)
        (loss + l2 * (w ** 2).sum()).backward()
        optimizer.step()
    return [float(v) for v in w.detach()]


__all__ = ["FEATURES", "FORMAT", "GROUPS", "HybridSelector", "POOL_EACH", "WEIGHTS_FILE", "choose_set", "evaluate",
           "fit", "fused_scores", "load_weights", "save_weights", "score_pool", "shipped_dir"]
