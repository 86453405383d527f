"""Answer types: what a question asks for, the evidence phrases of that kind, abstention when the
evidence has none, the answer step on a tiny random model (every answer is evidence text of the
asked type, or none), and the real model on the bundled sample."""

from __future__ import annotations

import json
import random

import pytest
from fixtures_tiny import SMALL_SHAPE
from evsel.answer import grounding
from evsel.evaluation import metrics
from evsel.models.selectors import Scored
from evsel.pipeline import answer
from evsel.store.store import ChunkRecord


def _chunk(text: str, id: int = 1, speakers=(), char_start=0) -> ChunkRecord:
    return ChunkRecord(id=id, doc_id=1, seq=id, text=text, content_hash=str(id), n_tokens=len(text.split()),
                       char_start=char_start, char_end=char_start + len(text), speakers=list(speakers), title="t")


class _NoModel:
    """The answer step without a model: candidates are taken in order, nothing is generated."""

    def generate(self, messages, max_new_tokens):
        raise AssertionError("typed answers need no generation")


@pytest.mark.parametrize("question,kind", [
    ("Who killed Ambrose Tenterden?", "person"),
    ("Whom did Irene Adler marry?", "person"),
    ("Whose lantern was found on the rocks?", "person"),
    ("Which actor played the detective?", "person"),
    ("Where did Cecily go to wash up?", "place"),
    ("In what city was the composer born?", "place"),
    ("Rhiwallon was an Earl of which location, that overthrew Gruffydd?", "place"),
    ("How much was a member of the Red-headed League paid each week?", "number"),
    ("How many people live in the town?", "number"),
    ("What was the population of the county in 2010?", "number"),
    ("When did Caroline go to the support group?", "date"),
    ("What year was the film released?", "date"),
    ("At what time did Ambrose take the lantern?", "date"),
    ("What company published the journal?", "organisation"),
    ("Which band was formed first, Killing Joke or Acceptance?", "organisation"),
    ("What kind of animal was the speckled band?", "thing"),
    ("What is Caroline's identity?", "thing"),
    ("Is the tower older than the boat?", "yesno"),
    ("Are both magazines published in New York?", "yesno"),
    ("Why did the lamp go out?", "description"),
    ("How did the girl feel when she saw the bird?", "description"),
    ("What did the king do after the feast?", "description"),
    ("What happened to the boat?", "description"),
])
def test_answer_type_of_a_question(question, kind):
    assert grounding.answer_type(question) == kind


def test_choice_questions_offer_their_alternatives():
    assert grounding.options("Which band was formed first, Killing Joke or Acceptance?") == ["Killing Joke", "Acceptance"]
    assert grounding.options("Who killed Ambrose Tenterden?") == []


@pytest.mark.parametrize("text,kind,expected", [
    ("Then Roland Pryce killed Ambrose Tenterden.", "person", ["Roland Pryce", "Ambrose Tenterden"]),
    ("The League paid him four pounds a week, and later £ 4.", "number", ["four pounds a week", "£ 4"]),
    ("At ten o'clock, on 3 March 1890, he left.", "date", ["ten o'clock", "3 March 1890"]),
    ("Cecily went to the kitchen to wash up.", "place", ["Cecily", "kitchen"]),
])
def test_typed_spans_find_phrases_of_the_kind(text, kind, expected):
    found = [text[a:b] for a, b in grounding.typed_spans(text, kind)]
    assert all(e in found for e in expected), found


def test_contained_needs_every_content_word_of_the_reference():
    assert metrics.contained("He married Godfrey Norton, a lawyer", ["Godfrey Norton"]) == 1.0
    assert metrics.contained("Godfrey", ["Godfrey Norton"]) == 0.0
    assert metrics.contained("anything", []) == 0.0


def test_typed_answer_is_the_phrase_of_the_asked_kind_with_its_offsets():
    text = "It rained all night. The League paid each member four pounds a week. The boat sank."
    chunk = _chunk(text, char_start=40)
    out = answer(_NoModel(), "How much did the League pay each member?", [Scored(chunk, 1.0, 1)], 16)
    assert out["text"] == "four pounds a week" and out["answer_type"] == "number"
    assert text[out["span"]["start"]:out["span"]["end"]] == "four pounds a week"
    assert out["span"]["doc_start"] == 40 + text.index("four pounds")


def test_abstains_when_the_evidence_has_no_phrase_of_the_asked_kind():
    chunk = _chunk("The boat struck the rocks in the storm. Everyone on board was saved.")
    out = answer(_NoModel(), "How many boats struck the rocks?", [Scored(chunk, 1.0, 1)], 16)
    assert out["text"] is None and out["kind"] == "abstained" and out["answer_type"] == "number"
    assert "number" in out["reason"]
    out = answer(_NoModel(), "Who was on the boat that struck the rocks?", [Scored(chunk, 1.0, 1)], 16)
    assert out["text"] is None and out["kind"] == "abstained" and "person" in out["reason"]


@pytest.fixture(scope="module")
def chat_backbone(tiny_llama):
    from evsel.models.runtime.backbone import Backbone

    words = ["system", "user", "assistant", ":", ".", ",", "?", "Passage", "Question", "the", "a", "in", "to", "of",
             "keeper", "lighthouse", "lamp", "went", "storm", "Roland", "Pryce", "Agnes", "Quarrie", "killed", "paid",
             "four", "pounds", "1890", "March", "kitchen", "tower", "who", "where", "when", "how", "many", "much",
             "what", "Who", "Where", "When", "How", "What"]
    return Backbone(model=str(tiny_llama(words, chat=True, **SMALL_SHAPE, max_position_embeddings=512)), device="cpu")


def test_returned_span_is_evidence_text_of_the_asked_type_or_none(chat_backbone):
    """Property, on random evidence and questions: an answer is exact evidence text at its offsets
    and, for a phrase question, one of the phrases of the asked type in its sentence; or the step
    abstains (yes/no questions answer yes or no)."""
    vocab = ["the", "keeper", "lighthouse", "lamp", "went", "storm", "Roland", "Pryce", "Agnes", "Quarrie", "killed",
             "paid", "four", "pounds", "1890", "March", "to", "kitchen", "in", "tower", "at", "3"]
    openers = ["Who", "Where", "When", "How many", "How much", "What", "Why", "Is"]
    rng = random.Random(0)
    seen_types = set()
    for trial in range(16):
        chunks, offset = [], rng.randrange(0, 300)
        dialogue = trial % 4 == 3
        for i in range(3):
            sentences = [" ".join(rng.choice(vocab) for _ in range(rng.randint(3, 9))) + "." for _ in range(3)]
            if dialogue:
                text = "".join(f"{rng.choice(['Roland', 'Agnes'])}: {s}\n" for s in sentences)
                chunks.append(_chunk(text, id=i + 1, char_start=offset, speakers=["Roland", "Agnes"]))
            else:
                text = " ".join(sentences)
                chunks.append(_chunk(text, id=i + 1, char_start=offset))
            offset += len(text) + 1
        question = f"{rng.choice(openers)} " + " ".join(rng.choice(vocab) for _ in range(3)) + "?"
        evidence = [Scored(c, 1.0 - i / 10, i + 1) for i, c in enumerate(chunks)]
        out = answer(chat_backbone, question, evidence, 8, "span")
        kind = out["answer_type"]
        seen_types.add(kind)
        if out["text"] is None:
            assert out["kind"] == "abstained" and out["reason"]
            continue
        if out["kind"] == "yesno":
            assert out["text"] in ("yes", "no")
            continue
        span = out["span"]
        cited = evidence[span["passage"] - 1].chunk
        assert out["text"] == span["text"] == cited.text[span["start"]:span["end"]]
        assert cited.char_start + span["start"] == span["doc_start"]
        if kind in grounding.ENTITY_TYPES and not grounding.options(question):
            holder = next(s for s in grounding.sentences([cited]) if s.start <= span["start"] and span["end"] <= s.end)
            assert (span["start"] - holder.start, span["end"] - holder.start) in grounding.typed_spans(holder.text, kind)
    assert {"person", "number", "date"} <= seen_types


def _ask_sample(capsys, questions: list[str], style: str = "short") -> list[dict]:
    """The bundled sample ingested, then each question asked with --json, in-process."""
    from evsel.cli import main

    assert main(["sample"]) == 0
    sample = capsys.readouterr().out.strip()
    assert main(["--no-daemon", "ingest", "--no-encode", sample]) == 0
    capsys.readouterr()
    out = []
    for question in questions:
        assert main(["--no-daemon", "ask", question, "--json", "--style", style]) == 0
        out.append(json.loads(capsys.readouterr().out))
    return out


def test_real_model_answers_who_where_how_much_and_when_on_the_sample(capsys):
    """The rules step (--style rules): the type table, the tagger's phrases and the LLM's pick."""
    asked = {
        "Who killed Ambrose Tenterden?": ("person", "Roland Pryce"),
        "Where did Cecily go to wash up?": ("place", "kitchen"),
        "How much had Roland Pryce lost to the doctor?": ("number", "eleven shillings"),
        "When did Agnes ask Bart to unlock the tower door?": ("date", "nine o'clock"),
    }
    for result, (kind, expected) in zip(_ask_sample(capsys, list(asked), "rules"), asked.values()):
        grounded = result["grounding"]
        assert grounded["answer_type"] == kind
        assert result["answer"] == expected, result["question"]
        span = grounded["span"]
        passage = result["evidence"][span["passage"] - 1]
        assert passage["text"][span["start"]:span["end"]] == expected
        assert span["doc_start"] == passage["char_start"] + span["start"]
