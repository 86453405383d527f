"""Metrics: evidence recall over ranked chunks, answer EM/F1 (SQuAD) and LoCoMo's own F1.

Ranking metrics take the ranked chunk ids and the gold units, each unit being the set of chunk
ids that hold one piece of gold evidence (one chunk for a dialogue turn or a sentence; all chunks
of a section or a page).
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter

from evsel.answer.grounding import STOPWORDS


def dedupe_units(units: list[set[int]]) -> list[set[int]]:
    """Units with the same chunks are one unit (two evidence turns in one chunk)."""
    seen: list[set[int]] = []
    for unit in units:
        if unit and unit not in seen:
            seen.append(set(unit))
    return seen


def ranking_metrics(ranked: list[int], units: list[set[int]], ks: list[int]) -> dict[str, float]:
    """recall@k: share of gold units with a chunk in the top k; complete@k: 1 if every unit has
    one; chunk_recall@k: share of all gold chunks in the top k; mrr: 1 / rank of the first gold
    chunk (0 if none is ranked)."""
    units = dedupe_units(units)
    if not units:
        raise ValueError("no gold units")
    gold_chunks = set().union(*units)
    position = {chunk: i for i, chunk in enumerate(ranked)}
    first = min((position[c] for c in gold_chunks if c in position), default=None)
    out: dict[str, float] = {}
    for k in ks:
        top = set(ranked[:k])
        found = sum(1 for u in units if u & top)
        out[f"recall@{k}"] = found / len(units)
        out[f"complete@{k}"] = float(found == len(units))
        out[f"chunk_recall@{k}"] = len(gold_chunks & top) / len(gold_chunks)
    out["mrr"] = 0.0 if first is None else 1.0 / (first + 1)
    return out


# SQuAD answer normalisation and scores ---------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD v1.1: lower case, drop punctuation and articles, collapse whitespace."""
    text = str(text).lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _f1(prediction_tokens: list[str], reference_tokens: list[str]) -> float:
    common = Counter(prediction_tokens) & Counter(reference_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(prediction_tokens)
    recall = same / len(reference_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, references: list[str]) -> float:
    if not references:
        return 0.0
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(r) for r in references))


def token_f1(prediction: str, references: list[str]) -> float:
    """Token F1 after SQuAD normalisation, best over the references."""
    if not references:
        return 0.0
    p = normalize_answer(prediction).split()
    return max(_f1(p, normalize_answer(r).split()) for r in references)


def contained(prediction: str, references: list[str]) -> float:
    """1 when every content word of some reference (after SQuAD normalisation; all its words when it
    has only function words) appears in the prediction: the answer holds the reference, however long."""
    said = set(normalize_answer(prediction).split())
    for reference in references:
        wanted = normalize_answer(reference).split()
        content = {w for w in wanted if w not in STOPWORDS} or set(wanted)
        if content and content <= said:
            return 1.0
    return 0.0


_FIGURE = re.compile(r"\(?-?[$\u20ac\u00a3]?\s*(\d[\d,]*(?:\.\d+)?)\s*\)?\s*%?")
# A reference is a figure when it is one number with at most a currency, a percent, a unit word.
_FIGURE_ONLY = re.compile(r"^\s*\(?-?[$\u20ac\u00a3]?\s*\d[\d,]*(?:\.\d+)?\s*\)?\s*%?\s*"
                          r"(?:million|millions|billion|billions|thousand|times|x)?\s*$", re.I)


def is_figure(reference: str) -> bool:
    return bool(_FIGURE_ONLY.match(reference))


def _numbers(text: str) -> list[float]:
    return [float(m.group(1).replace(",", "")) for m in _FIGURE.finditer(text) if m.group(1).strip(",")]


def numeric_match(prediction: str, references: list[str]) -> float:
    """1 when the prediction states a figure reference's number: 1,577 and (1,577) match $1577.00 (a
    table's parentheses mark the sign, which the question's wording carries), within a rounding."""
    said = _numbers(prediction)
    for reference in references:
        if not is_figure(reference):
            continue
        wanted = _numbers(reference)
        if wanted and any(math.isclose(n, wanted[0], rel_tol=5e-3, abs_tol=5e-3) for n in said):
            return 1.0
    return 0.0


def shown(passages: list[str], references: list[str]) -> bool:
    """Does some passage hold some reference word for word (after SQuAD normalisation)? The
    questions a reader can answer from the evidence it was shown."""
    texts = [f" {normalize_answer(p)} " for p in passages]
    for reference in references:
        wanted = normalize_answer(reference)
        if wanted and any(f" {wanted} " in t for t in texts):
            return True
    return False


# LoCoMo's F1 (task_eval/evaluation.py of snap-research/locomo) ----------------------------------

_LOCOMO_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_stemmer = None


def _stem(word: str) -> str:
    global _stemmer
    if _stemmer is None:
        from nltk.stem import PorterStemmer

        _stemmer = PorterStemmer()
    return _stemmer.stem(word)


def _locomo_normalize(text: str) -> str:
    text = str(text).replace(",", "").lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _LOCOMO_ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _locomo_token_f1(prediction: str, reference: str) -> float:
    p = [_stem(w) for w in _locomo_normalize(prediction).split()]
    r = [_stem(w) for w in _locomo_normalize(reference).split()]
    if not p or not r:
        return 0.0
    return _f1(p, r)


def locomo_f1(prediction: str, answer: str, category: int) -> float:
    """The benchmark's score: stemmed token F1; for multi-hop (1) the mean over the answer's
    comma-separated parts of the best F1 against any comma-separated part of the prediction;
    open-domain (3) answers are cut at ';'; adversarial (5) scores 1 when the prediction says
    the information is not there."""
    prediction = str(prediction)
    if category == 5:
        low = prediction.lower()
        return float("no information available" in low or "not mentioned" in low)
    answer = str(answer)
    if category == 3:
        answer = answer.split(";")[0].strip()
    if category == 1:
        predictions = [p.strip() for p in prediction.split(",")]
        parts = [a.strip() for a in answer.split(",")]
        return sum(max(_locomo_token_f1(p, a) for p in predictions) for a in parts) / len(parts)
    return _locomo_token_f1(prediction, answer)


# Claims (NoCha) -----------------------------------------------------------------------------------

_TRUE_FALSE = re.compile(r"\b(true|false)\b", re.I)


def claim_verdict(output: str) -> bool | None:
    """The first 'true' or 'false' in a model's output, or None if it says neither."""
    m = _TRUE_FALSE.search(output or "")
    return None if m is None else m.group(1).lower() == "true"


def pair_accuracy(verdicts: dict[str, list[bool]]) -> float:
    """NoCha: a pair counts only when both of its claims are judged right."""
    if not verdicts:
        return 0.0
    return sum(1 for v in verdicts.values() if v and all(v)) / len(verdicts)


# Aggregation --------------------------------------------------------------------------------------

def mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
