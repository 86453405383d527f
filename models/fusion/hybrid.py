"""The learned fusion's arithmetic (the selector: models/selectors/hybrid.py): features normalised
per question, the weight file, the linear model over a pool, and its listwise fit."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from evsel.errors import EvselError, ModelError
from evsel.models.shared.trained_files import read_json, reading
from evsel.store.store import ChunkRecord


FORMAT = "evsel-hybrid/1"
WEIGHTS_FILE = "hybrid.json"
TRAIN_COMMAND = "evsel train hybrid"
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
POOLING_GROUPS = ("dense", "unreal")  # besides BM25, the signals whose top chunks make the pool
WORD = re.compile(r"[A-Za-z][A-Za-z'-]+")


def shipped_dir(fingerprint: str) -> Path:
    return Path(__file__).resolve().parent.parent / "adapters" / fingerprint[:16] / "hybrid"


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
    data = read_json(path, "the hybrid weights", TRAIN_COMMAND)
    if data.get("format") != FORMAT or not data.get("weight_sets"):
        raise ModelError(f"{path} is not a hybrid weight file ({FORMAT})", "give a hybrid.json written by: evsel train hybrid")
    with reading(path, "the hybrid weights", TRAIN_COMMAND):
        for ws in data["weight_sets"]:
            weights = [float(w) for w in ws["weights"]]
            if len(weights) != len(columns(list(ws["groups"]))):
                raise ValueError(f"a weight set of {ws['groups']} has {len(weights)} weights")
            bad = [w for w in weights if not math.isfinite(w)]
            if bad:  # NaN scores order the evidence by position and show score nan
                raise ValueError(f"a weight set of {ws['groups']} has a weight that is not a finite number ({bad[0]})")
    return data


def save_weights(path: str | Path, data: dict) -> Path:
    path = Path(path)
    if path.suffix != ".json":
        path = path / WEIGHTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": FORMAT, **data}, indent=1) + "\n")
    return path


def choose_set(data: dict, available: set[str], kind: str | None = None) -> dict | None:
    """The weight set using the most groups among those `available` (None: no set fits); among
    equals, the one fitted for documents of `kind`. A set without a kind serves every kind, one
    fitted for another kind none."""
    fitting = [ws for ws in data["weight_sets"] if set(ws["groups"]) <= available and ws.get("kind") in (None, kind)]
    return max(fitting, key=lambda ws: (len(ws["groups"]), ws.get("kind") is not None), default=None)


def parse_groups(text: str | None) -> list[str] | None:
    if not text:
        return None
    chosen = list(dict.fromkeys(g.strip() for g in text.replace(",", "+").split("+") if g.strip()))
    unknown = [g for g in chosen if g not in GROUPS]
    if unknown or "bm25" not in chosen:
        raise EvselError(f"hybrid:{text}: the groups are {', '.join(GROUPS)} joined by +, bm25 among them",
                         "e.g. hybrid:bm25+dense or hybrid:bm25+dense+qr")
    return chosen

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


def evaluate(pool_scores: list[np.ndarray], gold: list[np.ndarray], ks=(1, 3, 5, 10),
             totals: list[int] | None = None) -> dict:
    """Recall@k and MRR of ranking each pool by its scores, gold as a 0/1 vector per pool. With
    `totals` (each question's gold chunks in its whole scope) recall is over all of them, and a
    question whose gold missed the pool counts, with recall and MRR 0: the share of gold chunks
    in the top k, as eval's chunk_recall@k (k <= 10 lies inside the pool). Without, only the
    questions with gold in the pool count, over their pooled gold."""
    from .paired import question_metrics

    recall, rr = question_metrics(pool_scores, gold, totals, ks)
    counted = len(rr)
    out = {f"recall@{k}": float(recall[k].mean()) if counted else 0.0 for k in ks}
    out["mrr"] = float(rr.mean()) if counted else 0.0
    return out | {"questions": counted}


def fit(features: list[np.ndarray], gold: list[np.ndarray], groups: list[str], l2: float = 1e-3,
        steps: int = 300, lr: float = 0.05, seed: int = 0) -> list[float]:
    """Weights of a linear listwise model: minimise, over the pools with a gold chunk, -log of the
    softmax mass on the gold chunks, plus l2 |w|^2. Starts from BM25 alone (w = 1 on bm25_z), so
    what it learns is a departure from BM25 the data asks for. A few lines of torch (Adam)."""
    import torch

    torch.manual_seed(seed)
    cols = columns(groups)
    kept = [(x[:, cols], g) for x, g in zip(features, gold) if g.any() and not g.all()]
    w = torch.zeros(len(cols))
    w[columns(["bm25"])[0]] = 1.0
    w.requires_grad_(True)
    if not kept:
        return w.detach().tolist()
    # every pool padded to the largest, in one tensor: a step is a few batched ops, not one per pool
    width = max(len(x) for x, _ in kept)
    x_all = torch.zeros(len(kept), width, len(cols), dtype=torch.float32)
    in_pool = torch.zeros(len(kept), width, dtype=torch.bool)
    is_gold = torch.zeros(len(kept), width, dtype=torch.bool)
    for i, (x, g) in enumerate(kept):
        x_all[i, : len(x)] = torch.as_tensor(x, dtype=torch.float32)
        in_pool[i, : len(x)] = True
        is_gold[i, : len(x)] = torch.as_tensor(g > 0)
    optimizer = torch.optim.Adam([w], lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        scores = x_all @ w
        loss = (torch.logsumexp(scores.masked_fill(~in_pool, float("-inf")), 1)
                - torch.logsumexp(scores.masked_fill(~is_gold, float("-inf")), 1)).mean()
        (loss + l2 * (w ** 2).sum()).backward()
        optimizer.step()
    return [float(v) for v in w.detach()]


__all__ = ["FEATURES", "FORMAT", "GROUPS", "HybridSelector", "POOL_EACH", "WEIGHTS_FILE", "choose_set", "evaluate",
           "fit", "fused_scores", "load_weights", "save_weights", "score_pool", "shipped_dir"]
