"""Dataset adapters on small real slices: gold evidence lands on the chunks that hold it.

The expected chunks were checked by hand (the chunk's text holds the evidence turn, section or
page) and frozen here; they move only if the parsers or the chunker change.
"""

from __future__ import annotations

import pytest
from helpers import DATA, shared_data

from evsel.evaluation.datasets import load_dataset
from evsel.evaluation.datasets import normalize_dia_ids
from evsel.evaluation.gold import locate
from evsel.evaluation.runner import build_corpus, gold_units, select_questions


def _seqs(units, corpus, key):
    by_id = {c.id: c for c in corpus.chunks[key]}
    return [sorted(by_id[i].seq for i in unit) for unit in units]


def test_dia_ids_are_normalised_defensively():
    assert normalize_dia_ids("D8:6; D9:17") == (["D8:6", "D9:17"], [])
    assert normalize_dia_ids("D9:1 D4:4 D4:6") == (["D9:1", "D4:4", "D4:6"], [])
    assert normalize_dia_ids("D:11:26") == (["D11:26"], [])
    assert normalize_dia_ids("D30:05") == (["D30:5"], [])
    assert normalize_dia_ids("D") == ([], ["D"])


def test_locate_exact_and_fuzzy():
    text = "Alpha beta.\n\nThe   quick brown fox\njumps over the lazy dog. Omega."
    start, end = locate(text, "the quick brown fox jumps")
    assert text[start:end] == "The   quick brown fox\njumps"
    # PDF extraction differs: a word changed and spacing lost, still found by word overlap
    start, end = locate(text, "quick brown cat jumps over the lazy")
    assert text[start:end].startswith("quick brown fox")
    assert locate(text, "nothing of this appears anywhere here") is None
    # a search region limits where it looks
    assert locate(text, "alpha", 5) is None


def test_locomo_one_conversation(backbone_tokenizer):
    shared_data("locomo", "locomo10.json")
    dataset = load_dataset("locomo", DATA)
    assert len(dataset.questions) == 1986
    assert dataset.separate_groups == ("adversarial",)
    # the PROVENANCE lists one bare "D" and two ids naming no turn
    assert any(n.startswith("1 malformed") for n in dataset.notes)
    assert any(n.startswith("2 evidence id(s) naming no turn") for n in dataset.notes)
    questions = [q for q in dataset.questions if q.docs == ["conv-26"]]
    assert len(questions) == 199
    corpus = build_corpus(dataset, ["conv-26"], backbone_tokenizer, 140)
    chunks = corpus.chunks["conv-26"]
    # "When did Caroline go to the LGBTQ support group?" cites D1:3, Caroline's first mention of it
    q = questions[0]
    assert [g.turn for g in q.gold] == ["D1:3"] and q.group == "temporal"
    units = gold_units(q, corpus, {})
    assert _seqs(units, corpus, "conv-26") == [[0]]
    assert "Caroline: I went to a LGBTQ support group yesterday" in chunks[0].text
    # "What fields would Caroline be likely to pursue ...?" cites D1:9 and D1:11, in two chunks
    q = questions[2]
    assert _seqs(gold_units(q, corpus, {}), corpus, "conv-26") == [[1], [2]]
    assert "D1:9" in chunks[1].turn_ids and "D1:11" in chunks[2].turn_ids
    # "How many times has Melanie gone to the beach in 2023?" cites sessions 10 and 6
    q = questions[40]
    assert _seqs(gold_units(q, corpus, {}), corpus, "conv-26") == [[72], [41]]
    assert "beach" in chunks[72].text.lower() and "beach" in chunks[41].text.lower()


def test_fairytaleqa_sections_map_to_overlapping_chunks(backbone_tokenizer):
    shared_data("fairytaleqa", "questions", "val")
    dataset = load_dataset("fairytaleqa", DATA, split="val")
    assert len(dataset.questions) == 1025
    key = "assipattle-and-the-mester-stoorworm"
    corpus = build_corpus(dataset, [key], backbone_tokenizer, 140)
    text = corpus.parsed[key].text
    questions = [q for q in dataset.questions if q.docs == [key]]
    # q1 "Who had seven sons and one daughter?" cites section 1
    q = questions[0]
    start, end = q.gold[0].span
    assert text[start:end].startswith("In far bygone days")
    assert text[start:end].endswith("telling stories\nto himself.")
    assert text[end:].startswith("\n\nAnd his brothers, working hard")
    assert _seqs(gold_units(q, corpus, {}), corpus, key) == [[0, 1]]
    assert "seven sons and one daughter" in corpus.chunks[key][0].text
    # q6 cites section 2; the chunk straddling sections 1 and 2 counts for both
    q = questions[5]
    assert q.gold[0].label.endswith("section 2")
    assert _seqs(gold_units(q, corpus, {}), corpus, key) == [[1, 2]]


def test_fairytaleqa_concatenated_long_document(backbone_tokenizer):
    shared_data("fairytaleqa", "questions", "val")
    dataset = load_dataset("fairytaleqa", DATA, split="val", concat=3)
    assert dataset.name == "fairytaleqa-concat3"
    assert len(dataset.loaders) == 8  # 23 stories in groups of 3
    key = dataset.questions[0].docs[0]
    corpus = build_corpus(dataset, [key], backbone_tokenizer, 140)
    parsed = corpus.parsed[key]
    assert parsed.text.startswith("# Assipattle And The Mester Stoorworm\n\n")
    # every gold span of the long document is its section's text, so chunks map by overlap
    questions = [q for q in dataset.questions if q.docs == [key]]
    stories = {q.qid.split("/")[0] for q in questions}
    assert len(stories) == 3
    last = questions[-1]
    start, end = last.gold[0].span
    assert parsed.text[start:end].strip() and parsed.text[start - 2:start] == "\n\n"
    assert gold_units(last, corpus, {})


def test_mmlongbench_pages(backbone_tokenizer):
    shared_data("mmlongbench_doc", "documents", "2023.findings-emnlp.248.pdf")
    dataset = load_dataset("mmlongbench", DATA)
    assert any("skipped: their evidence is only in figures" in n for n in dataset.notes)
    # questions whose evidence is only a table are counted: a table's text is on its page
    tables_only = [q for q in dataset.questions if q.gold and "Table" in q.meta["sources"]
                   and not {"Pure-text (Plain-text)", "Generalized-text (Layout)"} & set(q.meta["sources"])]
    assert tables_only and any(f"{len(tables_only)} question(s) with evidence only in tables counted" in n
                               for n in dataset.notes)
    key = "2023.findings-emnlp.248.pdf"
    corpus = build_corpus(dataset, [key], backbone_tokenizer, 140)
    questions = [q for q in dataset.questions if q.docs == [key]]

    def asking(start):
        return next(q for q in questions if q.question.startswith(start))

    # "In this paper, what symbolic solver is used ...?" Pyke, on pages 3 and 5
    q = asking("In this paper, what symbolic solver is used")
    units = gold_units(q, corpus, {})
    assert [g.page for g in q.gold] == [3, 5]
    by_id = {c.id: c for c in corpus.chunks[key]}
    for unit, page in zip(units, (3, 5)):
        assert all(by_id[i].page_start <= page <= by_id[i].page_end for i in unit)
    # page 3 introduces the logic-programming formulation; page 5's text names Pyke
    assert any("logic programming" in by_id[i].text.lower() for i in units[0])
    assert any("Pyke" in by_id[i].text for i in units[1])
    # every chunk of a page belongs to it
    on_page_3 = [c.id for c in corpus.chunks[key] if c.page_start <= 3 <= c.page_end]
    assert sorted(units[0]) == on_page_3
    # 'Not answerable' questions carry no gold pages
    q = asking("For the dataset that uses HOVER as the symbolic solver")
    assert q.gold == [] and q.answers == [] and q.group == "not-answerable"


def test_limit_spreads_questions_evenly_and_keeps_claim_pairs():
    from evsel.evaluation.records import EvalQuestion

    items = [EvalQuestion(qid=str(i), question="q", docs=["d"]) for i in range(10)]
    assert [q.qid for q in select_questions(items, 5)] == ["0", "2", "4", "6", "8"]
    assert select_questions(items, None) == items
    assert select_questions(items, 50) == items
    claims = [EvalQuestion(qid=f"{i}", question="c", docs=["d"], meta={"pair": str(i // 2)}) for i in range(10)]
    # 5 pairs, 4 questions asked for: 2 whole pairs, evenly spaced (pairs 0 and 2)
    assert [q.qid for q in select_questions(claims, 4)] == ["0", "1", "4", "5"]


def test_unknown_dataset_says_what_exists(tmp_path):
    from evsel.errors import InputError

    with pytest.raises(InputError, match="choose one of: locomo"):
        load_dataset("squad", tmp_path)
    with pytest.raises(InputError, match="EVSEL_DATA"):
        load_dataset("locomo", tmp_path)
