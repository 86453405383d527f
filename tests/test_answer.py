"""Grounded answers: sentences and offsets, snapping, dates, abstention, and the answer step on a
tiny random model (every answer is a span of the evidence) and on the real one."""

from __future__ import annotations

import json
import random
from datetime import date

import pytest
from fixtures_tiny import SMALL_SHAPE
from evsel.answer import grounding
from evsel.models.selectors import Scored
from evsel.pipeline import answer
from evsel.store.store import ChunkRecord


def _chunk(text: str, id: int = 1, speakers=(), time_start=None, char_start=0) -> ChunkRecord:
    return ChunkRecord(id=id, doc_id=1, seq=id, text=text, content_hash=str(id), n_tokens=len(text.split()),
                       char_start=char_start, char_end=char_start + len(text), speakers=list(speakers),
                       time_start=time_start, title="t")


def test_sentences_cover_turns_without_labels_or_headers():
    text = "\n=== Session 2 (1:56 pm on 8 May, 2023) ===\nCaroline: I went to a support group yesterday. It helped.\nMel: Nice!\n"
    found = grounding.sentences([_chunk(text, speakers=["Caroline", "Mel"])])
    assert [(s.text, s.speaker) for s in found] == [
        ("I went to a support group yesterday.", "Caroline"), ("It helped.", "Caroline"), ("Nice!", "Mel")]
    for s in found:
        assert text[s.start:s.end] == s.text


def test_rank_prefers_rare_question_words():
    found = grounding.sentences([_chunk("The cat sat on the mat. Roland Pryce killed Ambrose Tenterden. The cat ran.")])
    best = grounding.rank_sentences("Who killed Ambrose Tenterden, the cat's owner?", found)[0][1]
    assert best.text == "Roland Pryce killed Ambrose Tenterden."


@pytest.mark.parametrize("generated,expected", [
    ("The answer is: \"Roland Pryce\".", "Roland Pryce"),
    ("Answer: in the library", "in the library"),
    ("the lighthouse keeper\nmore text", "the lighthouse keeper"),
])
def test_clean_generated(generated, expected):
    assert grounding.clean_generated(generated) == expected


def test_snap_finds_the_closest_stretch():
    text = "She found Imogen Farrow in the library, standing at the window."
    score, a, b = grounding.snap("in the Library", text)
    assert text[a:b] == "in the library" and score == 1.0
    assert grounding.snap("nothing shared", text) == (0.0, 0, 0)


@pytest.mark.parametrize("said,expected", [
    ("I went there yesterday and loved it.", "7 May 2023"),
    ("We went last week.", "the week before 8 May 2023"),
    ("Last Fri I took my kids.", "the Friday before 8 May 2023"),
    ("That was last year.", "2022"),
    ("Two weeks ago we met.", "2 weeks before 8 May 2023"),
    ("It was on 3 March, 2021.", "3 March 2021"),
    ("Back in 2019 I moved.", "2019"),
    ("I did it today.", "8 May 2023"),
])
def test_relative_times_resolve_against_the_session(said, expected):
    phrase, a, b = grounding.resolve_time(said, date(2023, 5, 8))
    assert phrase == expected
    assert a < b and said[a:b].strip()


def test_session_times_parse():
    assert grounding.parse_time("1:56 pm on 8 May, 2023") == date(2023, 5, 8)
    assert grounding.parse_time("2024-02-01T10:00:00") == date(2024, 2, 1)
    assert grounding.parse_time("sometime") is None
    assert grounding.is_temporal("When did Caroline go?") and not grounding.is_temporal("Who went?")


def test_speaker_swap_is_detected():
    text = ("Caroline: This necklace is a gift from my grandma in my home country, Sweden.\n"
            "Melanie: That's lovely, it must mean a lot.\n")
    found = grounding.sentences([_chunk(text, speakers=["Caroline", "Melanie"])])
    names = {"Caroline", "Melanie"}
    assert grounding.speaker_swap("What country is Melanie's grandma from?", found, names, 0.3) == ("Melanie", "Caroline")
    assert grounding.speaker_swap("What country is Caroline's grandma from?", found, names, 0.3) is None


class _Echo:
    """A generator that answers with a fixed text (the answer step's logic without a model)."""

    def __init__(self, text: str):
        self.text = text

    def generate(self, messages, max_new_tokens):
        return {"text": self.text, "prompt_tokens": 10, "generated_tokens": 3}


def test_temporal_dialogue_question_answers_with_the_resolved_date():
    text = "Caroline: I went to a LGBTQ support group yesterday and it was so powerful.\n"
    chunk = _chunk(text, speakers=["Caroline", "Melanie"], time_start="1:56 pm on 8 May, 2023", char_start=100)
    out = answer(_Echo("unused"), "When did Caroline go to the LGBTQ support group?", [Scored(chunk, 1.0, 1)], 16)
    assert out["text"] == "7 May 2023" and out["kind"] == "date"
    assert out["span"]["text"] == "yesterday" and text[out["span"]["start"]:out["span"]["end"]] == "yesterday"
    assert out["span"]["doc_start"] == 100 + text.index("yesterday")


def test_a_when_question_finds_the_time_word_later_in_the_turn():
    # the greeting matches the question's name; the time word ends the same turn
    text = "John: Hi Maria! The shelter volunteering went great yesterday, thanks.\nMaria: Glad!\n"
    chunk = _chunk(text, speakers=["John", "Maria"], time_start="1:56 pm on 22 December, 2022")
    out = answer(_Echo("unused"), "When did John say hi to Maria?", [Scored(chunk, 1.0, 1)], 16)
    assert out["text"] == "21 December 2022" and out["kind"] == "date"
    assert text[out["span"]["start"]:out["span"]["end"]] == "yesterday"


def test_abstains_when_no_word_is_shared_or_the_model_says_so():
    chunk = _chunk("The lighthouse stood on the point.")
    out = answer(_Echo("x"), "What was the weapon?", [Scored(chunk, 1.0, 1)], 16)
    assert out["text"] is None and out["kind"] == "abstained" and out["metric_text"]
    turn = _chunk("Mel: The lighthouse stood on the point.\n", speakers=["Mel"])
    out = answer(_Echo("The passage does not mention it."), "Where is Mel's lighthouse?", [Scored(turn, 1.0, 1)], 16)
    assert out["text"] is None and out["kind"] == "abstained"
    assert out["span"]["text"] == "The lighthouse stood on the point."


def test_prose_answer_is_the_supporting_sentence_without_the_question():
    chunk = _chunk("It rained all night. Then Roland Pryce killed Ambrose Tenterden. The boat sank.")
    out = answer(_Echo("unused"), "Who killed Ambrose Tenterden?", [Scored(chunk, 1.0, 1)], 16)
    assert out["text"] == "Roland Pryce" and out["kind"] == "span"
    assert chunk.text[out["span"]["start"]:out["span"]["end"]] == "Roland Pryce"


def test_unknown_style_is_an_error():
    from evsel.errors import EvselError

    with pytest.raises(EvselError, match="answer style"):
        answer(_Echo("x"), "q?", [], 16, "poem")


@pytest.fixture(scope="module")
def chat_backbone(tiny_llama):
    from evsel.models.runtime.backbone import Backbone

    words = ["system", "user", "assistant", ":", ".", ",", "?", "!", "Passage", "Question", "Answer", "the", "a", "in", "on", "of", "and", "keeper", "lighthouse", "lamp", "went", "out", "storm", "night", "Roland", "Pryce", "killed", "Ambrose", "Tenterden", "who", "what", "where", "when", "why", "library", "tower", "said", "boat", "rocks", "light", "was", "were", "he", "she", "it"]
    return Backbone(model=str(tiny_llama(words, chat=True, **SMALL_SHAPE, max_position_embeddings=512)), device="cpu")


def test_span_answers_are_always_evidence_text_at_their_offsets(chat_backbone):
    vocab = ["the", "keeper", "lighthouse", "lamp", "went", "out", "storm", "night", "Roland", "Pryce", "killed", "Ambrose", "Tenterden", "library", "tower", "boat", "rocks", "light"]
    rng = random.Random(0)
    for trial in range(12):
        chunks = []
        offset = rng.randrange(0, 500)
        dialogue = trial % 2 == 1  # dialogue turns go through the generator, prose is cut from its sentence
        for i in range(3):
            sentences = [" ".join(rng.choice(vocab) for _ in range(rng.randint(3, 9))) + "." for _ in range(3)]
            if dialogue:
                text = "".join(f"{rng.choice(['Roland', 'Pryce'])}: {s}\n" for s in sentences)
                chunks.append(_chunk(text, id=i + 1, char_start=offset, speakers=["Roland", "Pryce"]))
            else:
                text = " ".join(sentences)
                chunks.append(_chunk(text, id=i + 1, char_start=offset))
            offset += len(text) + 1
        question = " ".join(rng.choice(vocab) for _ in range(4)) + "?"
        evidence = [Scored(c, 1.0 - i / 10, i + 1) for i, c in enumerate(chunks)]
        out = answer(chat_backbone, question, evidence, 8, "span")
        if out["text"] is None:
            assert out["kind"] == "abstained"
            continue
        span = out["span"]
        cited = evidence[span["passage"] - 1].chunk
        assert out["text"] == span["text"] == cited.text[span["start"]:span["end"]]
        assert cited.char_start + span["start"] == span["doc_start"]


def _ask_sample(capsys, question: str) -> dict:
    """The bundled sample ingested, then `question` asked with --json, in-process."""
    from evsel.cli import main

    assert main(["sample"]) == 0
    sample = capsys.readouterr().out.strip()
    assert main(["ingest", sample]) == 0
    capsys.readouterr()
    assert main(["ask", question, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_sample_answer_is_right_and_points_into_the_document(capsys):
    """The quickstart with the real model: the answer names the killer and its offsets point at
    that text in the stored document."""
    from evsel.cli import main

    result = _ask_sample(capsys, "Who killed Ambrose Tenterden?")
    assert "Roland Pryce" in result["answer"] and "Lionel" not in result["answer"]
    span = result["grounding"]["span"]
    assert main(["docs", "show", str(span["doc_id"]), "--chunks", "--json"]) == 0
    chunks = json.loads(capsys.readouterr().out)["chunks"]
    document = "".join(c["text"] for c in chunks)  # chunks cover the stored text exactly
    assert chunks[0]["char_start"] == 0 and len(document) == chunks[-1]["char_end"]
    assert "Roland Pryce" in document[span["doc_start"]:span["doc_end"]]
    assert span["text"] == document[span["doc_start"]:span["doc_end"]]


def test_unanswerable_question_abstains_with_the_real_model(capsys):
    result = _ask_sample(capsys, "What is the capital of Mongolia?")
    assert result["answer"] is None and result["grounding"]["kind"] == "abstained"
    assert result["grounding"]["reason"] and result["evidence"]
