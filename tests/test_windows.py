"""Reading windows (evsel/answer/windows.py): the shown passages widened by the chunks beside them, merged
where they meet, offsets mapped back to the chunk that holds an answer; and with the shipped reader
on the real model, an answer planted in the chunk after a shown passage is found and cited there."""

from __future__ import annotations

import pytest
from evsel.models.selectors import Scored
from evsel.pipeline import answer
from evsel.store.store import ChunkRecord
from evsel.answer.windows import neighbours_of, reading_windows
from test_reader import DISTRACTORS


def _book(texts: list[str], doc_id: int = 1, gap: int = 0) -> list[ChunkRecord]:
    out, offset = [], 0
    for seq, text in enumerate(texts):
        out.append(ChunkRecord(id=doc_id * 100 + seq, doc_id=doc_id, seq=seq, text=text, content_hash=str(seq),
                               n_tokens=len(text.split()), char_start=offset, char_end=offset + len(text),
                               title="t"))
        offset += len(text) + gap
    return out


def test_windows_read_the_sentences_beside_each_passage_once():
    chunks = _book([f"Sentence {i} one. Sentence {i} two. " for i in range(10)])
    beside = neighbours_of(chunks)
    shown = [Scored(chunks[6], 3.0, 1), Scored(chunks[2], 2.0, 2), Scored(chunks[4], 1.0, 3), Scored(chunks[9], 0.5, 4)]
    windows = reading_windows(shown, beside, words=3)
    # best first; 4's neighbours are read beside 6 and 2 already; 9 has no chunk after it
    assert [[p.chunk.seq for p in w.parts] for w in windows] == [[5, 6, 7], [1, 2, 3], [4], [8, 9]]
    assert [w.rank for w in windows] == [1, 2, 3, 4]
    # the last sentence before, the first after: whole sentences within 3 words, joined as written
    assert windows[0].text == "Sentence 5 two. " + chunks[6].text + "Sentence 7 one. "
    assert windows[0].as_chunk().id == chunks[6].id
    # a first sentence longer than the words allowed is cut at a word
    [window] = reading_windows([Scored(chunks[0], 1.0, 1)], beside, words=2)
    assert window.text == chunks[0].text + "Sentence 1"
    [alone] = reading_windows([Scored(chunks[0], 1.0, 1)], beside, words=0)
    assert alone.text == chunks[0].text


def test_a_span_in_a_window_maps_to_the_chunk_that_holds_it():
    chunks = _book(["The first part. ", "The keeper was Quill. ", "The end."], gap=1)  # not contiguous: a line break
    [window] = reading_windows([Scored(chunks[1], 1.0, 1)], neighbours_of(chunks))
    assert window.text == "The first part. \nThe keeper was Quill. \nThe end."
    start = window.text.index("Quill")
    chunk, a, b = window.locate(start, start + len("Quill"))
    assert chunk is chunks[1] and chunk.text[a:b] == "Quill"
    chunk, a, b = window.locate(window.text.index("end"), len(window.text))
    assert chunk is chunks[2] and chunk.text[a:b] == "end."
    # a span across a chunk boundary cites the chunk that holds most of it, cut there
    chunk, a, b = window.locate(start, len(window.text) - len("end."))
    assert chunk is chunks[1] and chunk.text[a:b] == "Quill. "
    chunk, a, b = window.locate(window.text.index("part"), start)
    assert chunk is chunks[1] and chunk.text[a:b] == "The keeper was "
    # the part of a chunk read beside maps to its offsets in that chunk
    long = _book(["One. Two. Three. Four.", "The keeper was Quill."])
    [window] = reading_windows([Scored(long[1], 1.0, 1)], neighbours_of(long), words=2)
    assert window.text == "Three. Four.The keeper was Quill."
    chunk, a, b = window.locate(0, len("Three"))
    assert chunk is long[0] and chunk.text[a:b] == "Three"


def test_nothing_is_read_across_a_section_heading():
    chunks = _book(["# Alpha\n\nAlpha is a river. ", "It is long. ", "# Beta\n\nBeta is a town. ", "It is small."])
    beside = neighbours_of(chunks)
    [window] = reading_windows([Scored(chunks[1], 1.0, 1)], beside)
    assert [p.chunk.seq for p in window.parts] == [0, 1]  # Beta's section is another article
    [window] = reading_windows([Scored(chunks[2], 1.0, 1)], beside)
    assert [p.chunk.seq for p in window.parts] == [2, 3]


def test_dialogue_chunks_are_not_read_beside():
    chunks = _book(["A: hello", "B: hi"])
    chunks[0].speakers.append("A")
    assert (1, 0) not in neighbours_of(chunks) and (1, 1) in neighbours_of(chunks)


ASKED = "The lighthouse on the point stood for two hundred years, and its lamp was never once put out."
ANSWERED = ("For forty years it was kept by Bartholomew Quill, who rowed to the town once a month for oil and "
            "bread.")


@pytest.mark.model
def test_an_answer_in_the_chunk_after_a_shown_passage_is_found_and_cited_there():
    from evsel.models.runtime.backbone import Backbone

    backbone = Backbone(device="cpu")
    chunks = _book(DISTRACTORS[:2] + [ASKED, ANSWERED] + DISTRACTORS[2:], gap=1)
    shown = [c for c in chunks if c.text != ANSWERED]  # the retriever missed the chunk with the name
    evidence = [Scored(c, 1.0, rank) for rank, c in enumerate(shown, 1)]
    alone = answer(backbone, "Who kept the lighthouse on the point?", evidence, 16)
    assert "Quill" not in (alone["text"] or "")
    out = answer(backbone, "Who kept the lighthouse on the point?", evidence, 16, beside=neighbours_of(chunks))
    assert out["kind"] == "span" and "Bartholomew Quill" in out["text"], out
    span = out["span"]
    assert span["passage"] is None and span["beside"].text == ANSWERED
    assert span["beside"].text[span["start"]:span["end"]] == span["text"] == out["text"]
    assert span["doc_start"] == span["beside"].char_start + span["start"]
