"""The reader (models/reader/span_head.py): token offsets that land on the exact words, the span targets the
recipe trains on, a planted answer found among distractor passages with the shipped head on the
real model, abstention in dialogues, the smoke recipe end to end (and its resume from the state
cache), and eval's reader recall beside the rules step in one run."""

from __future__ import annotations

import json
import sys

import pytest
from evsel.models.selectors import Scored
from evsel.pipeline import answer
from evsel.store.store import ChunkRecord

DISTRACTORS = [
    "The harbour was quiet that morning. Fishing boats rocked at their moorings while gulls argued over "
    "the nets, and the harbourmaster counted the crates twice before he signed for them.",
    "In 1884 the town council voted to widen the high street. Twenty-six houses were pulled down, and "
    "the new road was paved with granite brought by rail from the quarries in the north.",
    "Mrs Alder kept the bakery on the corner. She rose at four every day, and by seven the queue of "
    "customers reached the door of the post office next to it.",
    "The winter of that year was the coldest anyone remembered. The river froze from bank to bank and "
    "children skated where the ferry usually crossed.",
]
PLANTED = ("The lighthouse on the point was kept by one man for forty years. His name was Bartholomew "
           "Quill, and he rowed to the town once a month for oil and bread.")


def _chunk(text: str, id: int, speakers=(), time_start=None, char_start=0) -> ChunkRecord:
    return ChunkRecord(id=id, doc_id=1, seq=id, text=text, content_hash=str(id), n_tokens=len(text.split()),
                       char_start=char_start, char_end=char_start + len(text), speakers=list(speakers),
                       time_start=time_start, title="t")


@pytest.fixture(scope="module")
def real_backbone():
    from evsel.models.runtime.backbone import Backbone

    return Backbone(device="cpu")


@pytest.fixture(scope="module")
def shipped(real_backbone):
    from evsel.models.reader.shipped import reader_for

    # the span head: the shipped reader of dialogues (readers.json gives prose the LoRA reader)
    reader = reader_for(real_backbone, dialogue=True)
    assert reader is not None, "the default model ships a trained reader (models/adapters/<fingerprint>/reader)"
    return reader


def test_encoded_offsets_are_the_exact_words(backbone_tokenizer):
    from evsel.models.reader.span_head import encode, gold_targets, span_mask

    text = PLANTED + "\nCaroline: We paid £4 a week, in 1890."
    encoded = encode(backbone_tokenizer.tokenizer, 0, "Who kept the lighthouse?", [text])
    offsets = encoded.offsets[0]
    assert all(0 <= a <= b <= len(text) for a, b in offsets)
    assert all(not text[a].isspace() for a, b in offsets if a < b)  # a token's leading space is not its text
    allowed = span_mask(encoded, len(encoded.rows[0]), 30)
    for needle in ("Bartholomew Quill", "£4", "1890", "forty years"):
        a = text.index(needle)
        target = gold_targets(encoded, [(0, a, a + len(needle))], len(encoded.rows[0]), 30)
        assert int(target.sum()) == 1 and bool((target & allowed).any()), needle
        t, length = [int(x) for x in target[0].nonzero()[0]]
        first = t - encoded.starts[0]
        assert text[offsets[first][0]:offsets[first + length][1]] == needle
    # no span may start or end inside a word
    i = text.index("Bartholomew")
    inner = next(k for k, (a, b) in enumerate(offsets) if a < i + 5 < b or a == i + 5)
    if offsets[inner][0] > i:  # the name is split into several tokens: the inner one starts no span
        assert not allowed[0, encoded.starts[0] + inner].any()


def test_locate_answer_finds_whole_words_and_near_copies():
    from evsel.recipes.reader import locate_answer

    passages = ["He went to the store.", "His name was Bartholomew Quill, a keeper."]
    assert locate_answer(passages, ["bartholomew  quill"]) == [(1, passages[1].index("Bartholomew"),
                                                                 passages[1].index(","))]
    assert locate_answer(passages, ["Quil"]) == []  # not inside a word
    got = locate_answer(passages, ["he went to the big store"])  # a near copy (token F1 >= 0.75)
    assert got and passages[got[0][0]][got[0][1]:got[0][2]] == "He went to the store"


KEPT_BY = ("The lighthouse on the point was kept for forty years by Bartholomew Quill, who rowed to the town "
           "once a month for oil and bread.")


def test_the_shipped_reader_finds_a_planted_answer_among_distractors(real_backbone, shipped):
    for position in range(0, 5, 2):
        texts = DISTRACTORS[:position] + [KEPT_BY] + DISTRACTORS[position:]
        offset = 0
        chunks = []
        for i, text in enumerate(texts):
            chunks.append(_chunk(text, i + 1, char_start=offset))
            offset += len(text)
        # BM25-like order that puts the planted passage second: the reader must look past the first
        order = [chunks[(position + 1) % 5], chunks[position]] + [c for c in chunks if c not in
                                                                    (chunks[position], chunks[(position + 1) % 5])]
        evidence = sorted([Scored(c, 1.0 - r / 10, r + 1) for r, c in enumerate(order)], key=lambda s: s.chunk.seq)
        out = answer(real_backbone, "Who kept the lighthouse on the point?", evidence, 16)
        assert out["kind"] == "span" and "Bartholomew Quill" in out["text"], out
        span = out["span"]
        cited = evidence[span["passage"] - 1].chunk
        assert cited.text == KEPT_BY
        assert cited.text[span["start"]:span["end"]] == out["text"] == span["text"]
        assert span["doc_start"] == cited.char_start + span["start"]
        assert 0.0 < out["confidence"] <= 1.0


def test_dialogue_answers_abstain_below_the_readers_threshold(real_backbone, shipped):
    text = ("=== Session 3 (2:10 pm on 12 June, 2023) ===\nMelanie: I finally finished the pottery class!\n"
            "Caroline: That's great, what did you make?\nMelanie: A blue bowl for my mum.\n")
    evidence = [Scored(_chunk(text, 1, speakers=["Melanie", "Caroline"], time_start="2:10 pm on 12 June, 2023"),
                       1.0, 1)]
    question = "What did Melanie make in the pottery class?"
    saved = dict(shipped.meta)
    try:
        shipped.meta["abstain_below"] = 0.0
        out = answer(real_backbone, question, evidence, 16)
        assert out["kind"] == "span" and "bowl" in out["text"]
        assert out["speaker"] == "Melanie"
        shipped.meta["abstain_below"] = 1.01  # no span is that sure
        out = answer(real_backbone, question, evidence, 16)
        assert out["text"] is None and out["kind"] == "abstained"
        assert "unsure" in out["reason"] and "\n" not in out["reason"]
        assert out["span"] is not None  # the evidence it read is still shown
    finally:
        shipped.meta.clear()
        shipped.meta.update(saved)
    # chosen on LoCoMo questions: 0 (never abstain) when no threshold reaches the recipe's precision
    assert 0.0 <= shipped.threshold < 1.0
    assert shipped.threshold == shipped.meta["abstention"]["abstain_below"]
    assert shipped.meta["abstention"]["questions"] > 0


def test_the_rules_style_stays_available(real_backbone):
    evidence = [Scored(_chunk(PLANTED, 1), 1.0, 1)]
    out = answer(real_backbone, "Who kept the lighthouse?", evidence, 16, "rules")
    assert out["confidence"] is None and out["kind"] in ("span", "abstained")


def test_train_reader_smoke_on_the_real_model_resumes_from_its_state_cache(tmp_path, capsys, monkeypatch):
    from helpers import shared_data
    from evsel.cli import main
    from evsel.models.reader.span_head import CONFIG_FILE, HEAD_FILE, Reader

    shared_data("fairytaleqa", "questions", "train")
    out = tmp_path / "reader"
    args = ["--device", "cpu", "train", "reader", "--recipe", "smoke", "--out", str(out), "--json"]
    monkeypatch.setattr(sys, "argv", ["evsel", *args])
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 4 and 0.0 <= summary["best_dev"]["f1"] <= 1.0
    assert (out / HEAD_FILE).is_file() and (out / "checkpoint" / HEAD_FILE).is_file()
    meta = json.loads((out / CONFIG_FILE).read_text())
    trained = meta["trained_on"]["fairytaleqa-train"]["question_ids"]
    assert trained and not set(trained) & set(meta["trained_on"]["dev_question_ids"])
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [0, 1, 2, 3, 4]
    states = sorted(p.name for p in (out / "states").iterdir())
    assert states and all(name.endswith(".safetensors") for name in states)
    before = {p.name: p.stat().st_mtime_ns for p in (out / "states").iterdir()}
    # a longer run resumes at step 4 and reads the cached states instead of recomputing them
    assert main(args[:-1] + ["--steps", "6", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["steps"] == 6
    assert {p.name: p.stat().st_mtime_ns for p in (out / "states").iterdir()} == before
    reader = Reader.load(out, 576)
    assert reader.config.layers == meta["layers"]
    assert main(args[:-1] + ["--source", "fairytaleqa-val"]) == 1
    assert "refusing" in capsys.readouterr().err


def test_eval_reports_reader_recall_beside_the_rules_step(capsys, monkeypatch):
    from helpers import shared_data
    from evsel.cli import main

    shared_data("fairytaleqa", "questions", "val")
    args = ["eval", "fairytaleqa", "--split", "val", "--methods", "bm25", "--generate", "--limit", "3",
            "--answer-style", "short,rules", "--json"]
    assert main(args) == 0
    result = json.loads(capsys.readouterr().out)
    rows = result["methods"]
    assert set(rows) == {"bm25 [short]", "bm25 [rules]"}
    for row in rows.values():
        assert row["answered"] == 3 and "f1" in row
        if "answer_shown" in row:
            assert 0.0 <= row["reader_recall"] <= 1.0
    assert main(args[:-3] + ["--answer-style", "short,poem"]) == 1
    assert "unknown answer style" in capsys.readouterr().err


class _Reading:
    """A reading whose span log-probabilities are given: the answer step's weighing on its own."""

    def __init__(self, passages: list[str], logps: dict):
        self.passages = passages
        self.logps = logps  # (passage, start, end) -> log-probability

    def top(self, k: int):
        from evsel.models.reader.span_head import Found

        best = sorted(self.logps.items(), key=lambda kv: -kv[1])[:k]
        return [Found(p, a, b, self.passages[p][a:b], 2.718281828 ** v) for (p, a, b), v in best]

    def logp_of(self, p: int, a: int, b: int):
        return self.logps.get((p, a, b))


def test_a_name_in_the_supporting_sentence_beats_the_readers_favourite_when_weighed():
    from evsel.answer import grounding
    from evsel.answer.step import candidate_spans

    texts = [DISTRACTORS[1], PLANTED]
    chunks = [_chunk(t, i + 1) for i, t in enumerate(texts)]
    question = "Who kept the lighthouse on the point?"
    found = grounding.sentences(chunks)
    ranked = grounding.rank_sentences(question, found)
    favourite = (0, 0, texts[0].index(" the town council"))  # "In 1884": the reader's best guess
    name = (1, PLANTED.index("Bartholomew"), PLANTED.index(", and he rowed"))
    reading = _Reading(texts, {favourite: -0.5, name: -2.5})
    candidates = {(c.passage, c.start, c.end): c for c in candidate_spans(reading, question, "person", found, ranked)}
    assert candidates[name].typed and candidates[name].text == "Bartholomew Quill"
    assert candidates[name].support > candidates[favourite].support
    # a typed phrase the reader never ranked competes too, at the floor log-probability
    assert any(c.typed and c.reader_logp == -25.0 for c in candidates.values())
    alone = max(candidates.values(), key=lambda c: c.score({}))
    weighed = max(candidates.values(), key=lambda c: c.score({"typed": 1.0, "support": 2.0}))
    assert (alone.passage, alone.start, alone.end) == favourite
    assert (weighed.passage, weighed.start, weighed.end) == name


def test_rescoring_weights_are_chosen_per_group_of_answer_types_on_dev_f1():
    from evsel.recipes.reader import choose_rescoring

    def row(source, kind, right_typed):
        # the reader prefers a wrong untyped span; the right one is typed only in the phrase rows
        return {"id": f"{source}/{kind}", "source": source, "type": kind, "candidates": [
            {"logp": -0.5, "features": {"typed": 0.0, "support": 0.2, "repeats": 0.0, "long": 0.0}, "f1": 0.0},
            {"logp": -2.0, "features": {"typed": float(right_typed), "support": 0.2, "repeats": 0.0, "long": 0.0},
             "f1": 1.0}]}

    rows = [row(s, "person", True) for s in ("a", "b")] + [row(s, "description", False) for s in ("a", "b")]
    chosen = choose_rescoring(rows, min_group=2)
    assert chosen["weights"]["person"]["typed"] >= 2.0 and chosen["dev"]["phrase"]["f1"] == 1.0
    assert chosen["dev"]["phrase"]["f1_reader_alone"] == 0.0
    # over every question, typed spans win half of them: better than the reader alone
    assert chosen["dev"]["*"]["f1"] == 0.5 and chosen["dev"]["*"]["f1_reader_alone"] == 0.0
    assert chosen["question_ids"] == [r["id"] for r in rows]
    # too few phrase questions to choose on: they take the weights of every question
    shared = choose_rescoring(rows, min_group=3)
    assert "person" not in shared["weights"] and shared["dev"]["phrase"]["weights"] == "*"
    assert shared["dev"]["phrase"]["f1"] == 1.0


def test_the_shipped_reader_carries_answer_step_weights_chosen_on_held_out_questions(shipped):
    rescore = shipped.meta["rescore"]
    assert set(rescore["sources"]) >= {"fairytaleqa-train", "locomo"}
    trained = set(shipped.meta["trained_on"]["fairytaleqa-train"]["question_ids"])
    assert not trained & set(rescore["question_ids"])
    assert shipped.rescore_weights("person") == rescore["weights"]["person"]
    assert shipped.rescore_weights("description") == rescore["weights"]["*"]


@pytest.mark.parametrize("question,expected", [
    ("How much was a member of the Red-headed League paid each week?", "£ 4"),
    ("Whom did Irene Adler marry?", "Norton"),  # in the chunk after the one that asks "But to whom?"
])
def test_questions_about_a_real_novel(question, expected, capsys, real_backbone):
    """The book ingested as a user would, then asked: the default evidence and the reader."""
    from helpers import shared_data
    from evsel.cli import main

    book = shared_data("nocha", "books", "the_adventures_of_sherlock_holmes_arthur_conan_doyle.txt")
    assert main(["ingest", str(book)]) == 0
    capsys.readouterr()
    assert main(["ask", question, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert expected.replace(" ", "") in (result["answer"] or "").replace(" ", ""), result["answer"]
    span = result["grounding"]["span"]
    cited = result["evidence"][span["passage"] - 1]
    assert cited["text"][span["start"]:span["end"]] == span["text"]
