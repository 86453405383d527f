"""Evaluation metrics on toy rankings computed by hand."""

from __future__ import annotations

import pytest

from evsel.evaluation import metrics


def test_ranking_metrics_two_gold_units():
    # ranking 7, 3, 9, 1, 4; gold units {3} and {4}: first gold at rank 2
    out = metrics.ranking_metrics([7, 3, 9, 1, 4], [{3}, {4}], [1, 2, 5])
    assert out["recall@1"] == 0.0
    assert out["recall@2"] == 0.5
    assert out["recall@5"] == 1.0
    assert out["complete@2"] == 0.0
    assert out["complete@5"] == 1.0
    assert out["mrr"] == pytest.approx(0.5)


def test_a_unit_spanning_chunks_is_found_by_any_of_them():
    # a section split into chunks 5 and 6; only 6 ranked first
    out = metrics.ranking_metrics([6, 1, 2, 5], [{5, 6}], [1, 3])
    assert out["recall@1"] == 1.0
    assert out["complete@1"] == 1.0
    assert out["chunk_recall@1"] == 0.5  # one of its two chunks
    assert out["chunk_recall@3"] == 0.5
    assert out["mrr"] == 1.0


def test_duplicate_units_count_once_and_missing_gold_scores_zero():
    # two evidence turns in the same chunk are one unit
    out = metrics.ranking_metrics([1, 2, 3], [{3}, {3}], [1, 3])
    assert out["recall@3"] == 1.0 and out["mrr"] == pytest.approx(1 / 3)
    out = metrics.ranking_metrics([1, 2, 3], [{8}], [3])
    assert out["recall@3"] == 0.0 and out["mrr"] == 0.0
    with pytest.raises(ValueError):
        metrics.ranking_metrics([1], [], [1])


def test_squad_normalisation_em_and_f1():
    assert metrics.normalize_answer("The  Cat, sat!") == "cat sat"
    assert metrics.exact_match("the cat", ["A cat", "dog"]) == 1.0
    assert metrics.exact_match("cat sat", ["cat"]) == 0.0
    # prediction "cat sat on mat" vs "the cat sat": common {cat, sat}; P = 2/4, R = 2/2, F1 = 2/3
    assert metrics.token_f1("cat sat on mat", ["the cat sat"]) == pytest.approx(2 / 3)
    assert metrics.token_f1("anything", []) == 0.0
    assert metrics.token_f1("dog", ["cat", "a dog"]) == 1.0


def test_locomo_f1_by_category():
    # stemmed: "painting" and "painted" both stem to "paint"
    assert metrics.locomo_f1("painting", "painted", 4) == 1.0
    # commas are dropped before scoring, 'and' is removed like an article
    assert metrics.locomo_f1("7 May 2023", "7 May, 2023", 2) == 1.0
    # category 3 scores only the part before ';'
    assert metrics.locomo_f1("Likely yes", "Likely yes; she likes it", 3) == 1.0
    # category 1: mean over answer parts of the best part of the prediction: (1 + 0) / 2
    assert metrics.locomo_f1("beach, mountains", "beach, museum", 1) == pytest.approx(0.5)
    # category 5: right only when the prediction says the information is not there
    assert metrics.locomo_f1("Not mentioned in the conversation", "", 5) == 1.0
    assert metrics.locomo_f1("She went to Paris", "", 5) == 0.0


def test_claims_and_pair_accuracy():
    assert metrics.claim_verdict("False. The claim is wrong") is False
    assert metrics.claim_verdict("It is TRUE") is True
    assert metrics.claim_verdict("I cannot tell") is None
    assert metrics.pair_accuracy({"a": [True, True], "b": [True, False], "c": [False, False]}) == pytest.approx(1 / 3)


def test_percentiles():
    values = [0.5, 0.1, 0.3, 0.2, 0.4]
    assert metrics.median(values) == 0.3
    assert metrics.median([1.0, 3.0]) == 2.0
    assert metrics.percentile(values, 95) == 0.5  # nearest rank: ceil(0.95 * 5) = 5th
    assert metrics.percentile(list(range(1, 101)), 95) == 95
    assert metrics.percentile([], 95) is None


@pytest.mark.parametrize(("prediction", "reference", "score"), [
    ("(1,577)", "$1577.00", 1.0),  # the cash-flow statement's figure, its sign in parentheses
    ("Capital expenditure was $1,577 million in 2018.", "$1577.00", 1.0),
    ("8.7", "$8.70", 1.0),
    ("1,373", "$1577.00", 0.0),
    ("The margin fell.", "$1577.00", 0.0),
    ("0.62%", "0.62%", 1.0),
    ("20 billion", "Yes, about $20 billion from the exchange offer", 0.0),  # not a figure reference
])
def test_numeric_match_reads_figures_as_a_filing_prints_them(prediction, reference, score):
    assert metrics.numeric_match(prediction, [reference]) == score


def test_only_a_lone_number_is_a_figure():
    assert metrics.is_figure("$1577.00") and metrics.is_figure("77.78") and metrics.is_figure("15%")
    assert not metrics.is_figure("Yes, it's spinning off Upjohn.") and not metrics.is_figure("Trillium, Array")
