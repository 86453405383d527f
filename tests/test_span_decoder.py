"""The span decoder (models/reader/span_decoder.py): what the model read maps back to the passage's
own offsets; with the real model every decoded answer is an exact word-edged span of a passage, the
likeliest first, its score is the model's likelihood of that span as the whole answer, and it
answers a plain question; a shipped folder selects it through reader_for."""

from __future__ import annotations

import math

import pytest

QUESTION = "What was the name of Jabez Wilson's assistant?"
PASSAGES = ["Mr. Jabez Wilson told us about his shop.\n\n'I have an assistant,' said he. 'His name is Vincent "
            "Spaulding, and he is willing to come for half wages.' Holmes listened.",
            "Sherlock Holmes sat in Baker Street with Dr. Watson. Arthur came in later with the letter."]


def test_a_collapsed_window_maps_its_spans_back_to_the_passages_offsets():
    from evsel.models.reader.span_decoder import Collapsed

    text = "so   far,\n\n\tthe keeper said"
    window = Collapsed(text[3:], 3)
    assert window.text == "far, the keeper said"
    i = window.word_starts("the keeper")[0]
    a, b = window.original(i, len("the keeper"))
    assert text[a:b] == "the keeper"
    assert window.word_starts("eeper") == []  # a span starts at a word's start
    assert window.ends_word(i, len("the keeper")) and not window.ends_word(i, len("the keep"))


@pytest.mark.model
def test_the_decoded_answers_are_exact_spans_scored_as_the_model_scores_them():
    from evsel.models.reader.span_decoder import SpanDecoder
    from evsel.models.runtime.backbone import Backbone

    backbone = Backbone(device="cpu")
    reading = SpanDecoder().reading(backbone, QUESTION, PASSAGES)
    found = reading.top(10)
    assert found and found[0].text == "Vincent Spaulding"
    assert [f.probability for f in found] == sorted((f.probability for f in found), reverse=True)
    for f in found:
        text = PASSAGES[f.passage]
        assert text[f.start:f.end] == f.text
        assert (f.start == 0 or not text[f.start - 1].isalnum()) and (f.end == len(text) or not text[f.end].isalnum())
    # the beam's score is the model's probability of that span (its tokens, then the closing quote)
    best = found[0]
    assert reading.logp_of(best.passage, best.start, best.end) == pytest.approx(math.log(best.probability), abs=0.15)  # bf16, batched or not
    # a span the model would not say is far less likely
    assert reading.logp_of(1, 0, len("Sherlock Holmes")) < math.log(best.probability) - 2


@pytest.mark.model
def test_the_shipped_folder_selects_the_decoder_through_the_answer_step():
    from pathlib import Path

    from evsel.answer.step import grounded_answer
    from evsel.models.reader.shipped import reader_for
    from evsel.models.reader.span_decoder import SpanDecoder
    from evsel.models.runtime.backbone import Backbone
    from evsel.models.selectors.base import Scored
    from evsel.store.store import ChunkRecord

    backbone = Backbone(device="cpu")
    folder = next((Path(__file__).parent.parent / "models" / "adapters").glob("*/span-decoder"))
    assert isinstance(reader_for(backbone, folder), SpanDecoder)
    evidence = [Scored(ChunkRecord(id=i + 1, doc_id=1, seq=i, text=t, content_hash=str(i), n_tokens=len(t.split()),
                               char_start=0, char_end=len(t), title="t"), 1.0 - i / 10, i + 1)
                for i, t in enumerate(PASSAGES)]
    answer = grounded_answer(backbone, QUESTION, evidence, reader_dir=str(folder))
    assert answer.text == "Vincent Spaulding" and answer.kind == "span"
    assert PASSAGES[answer.passage][answer.start:answer.end] == answer.text
