"""Which method `evsel ask` runs by default for a kind of document: a candidate replaces BM25 only
when, on enough held-out questions of that kind, it is better on recall@3 by a paired test, no
worse on MRR, and fast enough. The per-question numbers come from the same pools the fusion is
fitted on (recipes/hybrid.py), so both methods are judged on the very same questions.

The test is a paired sign-flip randomisation test of the mean per-question difference (one-sided:
the candidate is better). It assumes nothing about the differences' distribution, which for
recall@3 is a few discrete values with many ties at zero, where a t-test or Wilcoxon's normal
approximation would be off."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where used: the selector registry reads KINDS at the CLI's start
    import numpy as np

KINDS = ("dialogue", "book", "pdf")  # the kinds a default is chosen for (ingest's kinds)
MIN_QUESTIONS = 200  # held-out questions of a kind before a method may replace BM25 there
ALPHA = 0.05  # the test's level
SPEED_LIMIT = 2.0  # the default's warm ask over a BM25 one (bench/daemon.py), at most
RESAMPLES = 20000  # sign flips drawn; the p-value's resolution is about 1 / RESAMPLES
FALLBACK = "bm25"

# the dev sets' kinds: what the documents of each training source are, as ingest would store them
SOURCE_KINDS = {"locomo": "dialogue", "fairytaleqa": "book", "fairytaleqa-train": "book", "musique": "book",
                "hotpotqa": "book", "nocha": "book", "financebench": "pdf", "mmlongbench": "pdf"}


def question_metrics(pool_scores: list[np.ndarray], gold: list[np.ndarray], totals: list[int] | None = None,
                     ks=(3,)) -> tuple[dict[int, np.ndarray], np.ndarray]:
    """({k: recall@k}, reciprocal rank) of each question with gold, ranking its pool by the
    scores. With `totals` (each question's gold chunks in its whole scope) recall is over all of
    them, those the pool missed too; without, over the pooled gold, and a question whose pool
    holds none is left out."""
    import numpy as np

    recall: dict[int, list[float]] = {k: [] for k in ks}
    rr = []
    for i, (scores, g) in enumerate(zip(pool_scores, gold)):
        g = np.asarray(g)
        total = totals[i] if totals is not None else g.sum()
        if not total:
            continue
        hits = g[np.argsort(-np.asarray(scores), kind="stable")]
        for k in ks:
            recall[k].append(hits[:k].sum() / total)
        first = np.flatnonzero(hits)
        rr.append(1.0 / (first[0] + 1) if len(first) else 0.0)
    return {k: np.asarray(v, dtype=np.float64) for k, v in recall.items()}, np.asarray(rr, dtype=np.float64)


def per_question(pool_scores: list[np.ndarray], gold: list[np.ndarray], totals: list[int], k: int = 3
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(recall@k, reciprocal rank) of each question with gold in its scope: what the rule pairs."""
    recall, rr = question_metrics(pool_scores, gold, totals, (k,))
    return recall[k], rr


def sign_flip_p(candidate: np.ndarray, baseline: np.ndarray, resamples: int = RESAMPLES, seed: int = 0) -> float:
    """One-sided p-value that the candidate's mean exceeds the baseline's on paired questions: the
    share of random sign flips of the differences whose mean is at least the observed one (the
    observed assignment counted, so p > 0)."""
    import numpy as np

    diff = np.asarray(candidate, dtype=np.float64) - np.asarray(baseline, dtype=np.float64)
    if len(diff) == 0:
        return 1.0
    observed = diff.mean()
    rng = np.random.default_rng(seed)
    at_least = 0
    for start in range(0, resamples, 2000):  # in blocks: a (2000, n) sign matrix at a time
        signs = rng.choice((-1.0, 1.0), size=(min(2000, resamples - start), len(diff)))
        at_least += int(((signs * diff).mean(axis=1) >= observed - 1e-12).sum())
    return (at_least + 1) / (resamples + 1)


def decide(candidate: str, recall: np.ndarray, rr: np.ndarray, base_recall: np.ndarray, base_rr: np.ndarray,
           warm_ask_ratio: float | None, min_questions: int = MIN_QUESTIONS, alpha: float = ALPHA,
           speed_limit: float = SPEED_LIMIT) -> dict:
    """The default for one kind: `candidate` when all three conditions hold, else BM25; with the
    figures, each condition's verdict and, when BM25 stays, why."""
    n = len(recall)
    p = sign_flip_p(recall, base_recall) if n else 1.0
    test = {"questions": n, "test": "paired sign-flip randomisation, one-sided", "resamples": RESAMPLES,
            "recall@3": round(float(recall.mean()) if n else 0.0, 4),
            "bm25_recall@3": round(float(base_recall.mean()) if n else 0.0, 4),
            "p": round(p, 5), "alpha": alpha,
            "mrr": round(float(rr.mean()) if n else 0.0, 4), "bm25_mrr": round(float(base_rr.mean()) if n else 0.0, 4),
            "warm_ask_ratio": warm_ask_ratio, "speed_limit": speed_limit}
    failed = []
    if n < min_questions:
        failed.append(f"only {n} held-out questions (needs {min_questions})")
    if p > alpha:
        failed.append(f"recall@3 {test['recall@3']:.3f} vs {test['bm25_recall@3']:.3f}: p = {p:.3f} > {alpha}")
    if n and rr.mean() < base_rr.mean():
        failed.append(f"MRR {test['mrr']:.3f} below BM25's {test['bm25_mrr']:.3f}")
    if warm_ask_ratio is None:
        failed.append("its warm ask time was not measured (bench/daemon.py)")
    elif warm_ask_ratio > speed_limit:
        failed.append(f"its warm ask takes {warm_ask_ratio:.2f}x a BM25 one (limit {speed_limit}x)")
    if failed:
        return {"method": FALLBACK, "why": f"{candidate} is not the default: " + "; ".join(failed), "test": test}
    return {"method": candidate, "why": (f"{candidate} beats BM25 on {n} held-out questions: recall@3 "
                                         f"{test['recall@3']:.3f} vs {test['bm25_recall@3']:.3f} (p = {p:.4f}), MRR "
                                         f"{test['mrr']:.3f} vs {test['bm25_mrr']:.3f}, warm ask "
                                         f"{warm_ask_ratio:.2f}x BM25's"), "test": test}


__all__ = ["ALPHA", "FALLBACK", "KINDS", "MIN_QUESTIONS", "SOURCE_KINDS", "SPEED_LIMIT", "decide", "per_question",
           "question_metrics", "sign_flip_p"]
