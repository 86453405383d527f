"""Chunker: exact cover, token budget, sentence alignment, dialogue turns and sessions, over-long sentences.

Token counts come from the real SmolLM2 tokenizer (no model weights are loaded)."""

from __future__ import annotations

import pytest

from helpers import shared_data
from evsel.ingest.chunker import DEFAULT_CHUNK_TOKENS, chunk_document, split_sentences
from evsel.ingest.parsers import parse_file
from evsel.ingest.parsers.base import ParsedDocument, Segment
from evsel.ingest.parsers.dialogue import DialogueBuilder
from evsel.paths import sample_story_path


def sentences(text: str) -> list[str]:
    return [text[a:b] for a, b in split_sentences(text)]


def assert_cover_and_budget(doc: ParsedDocument, chunks, counter, budget: int) -> None:
    assert "".join(c.text for c in chunks) == doc.text
    position = 0
    for seq, chunk in enumerate(chunks):
        assert chunk.seq == seq
        assert chunk.start == position and chunk.end > chunk.start
        assert chunk.text == doc.text[chunk.start:chunk.end]
        position = chunk.end
        # the stored count is the joined text's own count, and it keeps to the budget
        assert chunk.n_tokens == counter.count([chunk.text])[0]
        assert chunk.n_tokens <= budget, (chunk.n_tokens, chunk.text)
    assert position == len(doc.text)


# sentence splitting


def test_sentences_cover_the_text_exactly():
    text = "One. Two!  Three?\n\nFour \u201cfive.\u201d Six (seven.) eight"
    spans = split_sentences(text)
    assert "".join(text[a:b] for a, b in spans) == text
    assert sentences(text) == ["One. ", "Two!  ", "Three?\n\n", "Four \u201cfive.\u201d ", "Six (seven.) ", "eight"]


def test_titles_and_initials_do_not_end_sentences():
    text = ("Mr. Holmes and Dr. Watson called on Mrs. Hudson. J. R. Smith came at 5 p.m. on Friday. "
            "St. Simon sent word, e.g. a telegram. He said no. No. 5 was empty. So did I. The end.")
    assert sentences(text) == [
        "Mr. Holmes and Dr. Watson called on Mrs. Hudson. ",
        "J. R. Smith came at 5 p.m. on Friday. ",
        "St. Simon sent word, e.g. a telegram. ",
        "He said no. ",
        "No. 5 was empty. ",
        "So did I. ",
        "The end.",
    ]


def test_abbreviations_end_a_sentence_before_a_capital():
    assert sentences("They sold tea, coffee, etc. The shop closed. See Fig. 3 for it.") == [
        "They sold tea, coffee, etc. ", "The shop closed. ", "See Fig. 3 for it.",
    ]
    # inside quotes a period after a title-like word still ends the sentence
    assert sentences('"Go away, Mr." He left.') == ['"Go away, Mr." ', "He left."]


def test_blank_lines_end_sentences():
    assert sentences("I.\n\nA SCANDAL IN BOHEMIA\n\n\nI.\n\nTo Sherlock Holmes") == [
        "I.\n\n", "A SCANDAL IN BOHEMIA\n\n\n", "I.\n\n", "To Sherlock Holmes",
    ]


# whole documents


def test_sample_story_exact_cover_and_budget(backbone_tokenizer):
    [doc] = parse_file(sample_story_path())
    chunks = chunk_document(doc, backbone_tokenizer)
    assert_cover_and_budget(doc, chunks, backbone_tokenizer, DEFAULT_CHUNK_TOKENS)
    # ~10,000 words: far more than one 8K window, in chunks near the budget
    assert len(chunks) > 60
    assert sum(c.n_tokens for c in chunks) / len(chunks) > 0.6 * DEFAULT_CHUNK_TOKENS
    # a chapter heading starts a chunk and no chunk runs across one
    for chunk in chunks:
        assert "\n## " not in chunk.text.rstrip("\n"), chunk.text
    headings = [c for c in chunks if c.text.startswith("## Chapter")]
    assert len(headings) == doc.text.count("\n## Chapter")


def test_chunks_end_on_sentence_ends(backbone_tokenizer):
    [doc] = parse_file(sample_story_path())
    ends = set()
    for segment in doc.segments:
        ends.update(segment.start + b for _, b in split_sentences(doc.text[segment.start:segment.end]))
    chunks = chunk_document(doc, backbone_tokenizer)
    assert all(c.end in ends for c in chunks)


def test_budget_is_configurable(backbone_tokenizer):
    [doc] = parse_file(sample_story_path())
    small = chunk_document(doc, backbone_tokenizer, budget=60)
    large = chunk_document(doc, backbone_tokenizer, budget=300)
    assert_cover_and_budget(doc, small, backbone_tokenizer, 60)
    assert_cover_and_budget(doc, large, backbone_tokenizer, 300)
    assert len(small) > 2 * len(large)


def test_nocha_book_exact_cover_and_budget(backbone_tokenizer):
    path = shared_data("nocha", "books", "the_great_gatsby_f_scott_fitzgerald.txt")
    [doc] = parse_file(path)
    assert doc.text == path.read_text(encoding="utf-8")
    progress = []
    chunks = chunk_document(doc, backbone_tokenizer, on_progress=lambda done, total: progress.append((done, total)))
    assert_cover_and_budget(doc, chunks, backbone_tokenizer, DEFAULT_CHUNK_TOKENS)
    assert len(chunks) > 300
    assert progress[-1][0] == progress[-1][1] > 0


# over-long sentences


def test_over_long_sentence_is_cut_at_whitespace(backbone_tokenizer):
    words = [f"lantern{i}" for i in range(600)]
    text = "Short start. " + " ".join(words) + ". Short end."
    doc = ParsedDocument(text, "book", "t", [Segment(0, len(text))])
    chunks = chunk_document(doc, backbone_tokenizer, budget=50)
    assert_cover_and_budget(doc, chunks, backbone_tokenizer, 50)
    assert len(chunks) >= 600 * 3 // 50  # each "lanternN" is several tokens
    for chunk in chunks[:-1]:
        assert chunk.text[-1].isspace() or chunk.text.endswith("."), chunk.text[-20:]


def test_over_long_run_without_spaces_is_still_cut(backbone_tokenizer):
    text = "x" * 3000
    doc = ParsedDocument(text, "book", "t", [Segment(0, len(text))])
    chunks = chunk_document(doc, backbone_tokenizer, budget=40)
    assert_cover_and_budget(doc, chunks, backbone_tokenizer, 40)
    assert len(chunks) > 1


# dialogues


def dialogue(turns_per_session: list[list[tuple[str, str]]]) -> ParsedDocument:
    builder = DialogueBuilder()
    for number, turns in enumerate(turns_per_session, 1):
        builder.session(str(number), f"day {number}")
        for index, (speaker, text) in enumerate(turns, 1):
            builder.turn(speaker, text, str(number), f"D{number}:{index}", f"day {number}")
    return builder.document("chat")


def test_dialogue_chunks_never_split_a_turn_or_cross_a_session(backbone_tokenizer):
    long_turn = " ".join(["The ferry was late again because of the fog over the harbour."] * 12)
    sessions = [
        [("Ann", f"Turn {i} of the first day. It has two sentences.") for i in range(1, 15)],
        [("Ben", "Short."), ("Ann", long_turn), ("Ben", "After the long one.")],
        [("Ann", f"Third day, turn {i}. Fine weather.") for i in range(1, 9)],
    ]
    doc = dialogue(sessions)
    budget = 60
    chunks = chunk_document(doc, backbone_tokenizer, budget=budget)
    assert "".join(c.text for c in chunks) == doc.text
    turns = [s for s in doc.segments if s.atomic]
    assert len(turns) == sum(len(s) for s in sessions)
    for turn in turns:
        holders = [c for c in chunks if c.start < turn.end and turn.start < c.end]
        assert len(holders) == 1, f"turn {turn.turn_id} is split"
        assert holders[0].start <= turn.start and turn.end <= holders[0].end
    for chunk in chunks:
        record = chunk.record()
        assert record["session"] is not None and "," not in record["session"], record
        assert all(t.startswith(f"D{record['session']}:") for t in record["turn_ids"])
        assert record["time_start"] == record["time_end"] == f"day {record['session']}"
        # over budget only as a single turn that is itself too long
        if chunk.n_tokens > budget:
            assert len(record["turn_ids"]) == 1 and long_turn in chunk.text
    # each session starts a chunk with its header
    assert sum(c.text.lstrip("\n").startswith("=== Session") for c in chunks) == 3


def test_chunk_record_gathers_provenance(backbone_tokenizer):
    builder_text = "Page one text. More on page one.\n\nPage two text.\n\n"
    first = len("Page one text. More on page one.\n\n")
    doc = ParsedDocument(
        builder_text, "pdf", "t",
        [Segment(0, first, page=1), Segment(first, len(builder_text), page=2)],
    )
    [chunk] = chunk_document(doc, backbone_tokenizer)
    record = chunk.record()
    assert (record["page_start"], record["page_end"]) == (1, 2)
    assert (record["char_start"], record["char_end"]) == (0, len(builder_text))
    assert record["speakers"] == [] and record["turn_ids"] == [] and record["session"] is None
    assert len(record["content_hash"]) == 64


def test_segments_must_tile_the_text(backbone_tokenizer):
    doc = ParsedDocument("abcdef", "book", "t", [Segment(0, 3), Segment(4, 6)])
    with pytest.raises(ValueError):
        chunk_document(doc, backbone_tokenizer)



# text without sentence punctuation (hardening issue, item 5)

_UNPUNCTUATED_RSS = r"""
import random, resource, sys
from evsel.ingest.chunker import chunk_document
from evsel.models.runtime.backbone import Backbone
from evsel.ingest.parsers.base import ParsedDocument, TextBuilder

def doc(text):
    builder = TextBuilder()
    builder.add(text)
    return ParsedDocument(text=text, kind="book", title="t", segments=builder.segments)

rng = random.Random(0)
words = "keeper light harbour gull point silas quint boat night brass key tide".split()
text = " ".join(rng.choice(words) for _ in range(int(float(sys.argv[1]) * 1e6) // 7)) + "\n"
backbone = Backbone()
chunk_document(doc("Warm up the tokenizer. " * 400), backbone)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
chunks = chunk_document(doc(text), backbone)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert "".join(c.text for c in chunks) == text
assert max(c.n_tokens for c in chunks) <= 140
print(len(text), (after - before) * 1024)
"""


def test_text_without_sentence_punctuation_is_chunked_in_bounded_memory(backbone_tokenizer):
    """Megabytes with no sentence end were tokenized as one sentence: 2 MB took ~280 MB more
    (22 MB took the daemon to 3 GB). Peak memory is measured in a process of its own."""
    import os
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _UNPUNCTUATED_RSS, "2"], capture_output=True, text=True,
                            timeout=900, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    chars, grown = map(int, result.stdout.split())
    assert grown <= 16 * chars, f"peak RSS grew {grown >> 20} MB chunking {chars >> 20} MB"


def test_an_overlong_unpunctuated_sentence_is_cut_at_whitespace_or_a_bound(backbone_tokenizer):
    from evsel.ingest.chunker import MAX_UNIT_CHARS, _iter_spans
    from evsel.ingest.parsers.base import TextBuilder

    words = "the keeper of the light " * (MAX_UNIT_CHARS // 8)
    solid = "x" * (MAX_UNIT_CHARS * 2 + 5)  # no whitespace at all: cut at the bound
    builder = TextBuilder()
    builder.add(words + solid + "\n")
    doc = ParsedDocument(text=builder.text(), kind="book", title="t", segments=builder.segments)
    spans = [(s, e) for s, e, _, _ in _iter_spans(doc)]
    assert "".join(doc.text[s:e] for s, e in spans) == doc.text
    assert max(e - s for s, e in spans) <= MAX_UNIT_CHARS
    assert all(doc.text[e - 1] == " " for s, e in spans if e <= len(words))  # cut after a space
    chunks = chunk_document(doc, backbone_tokenizer)
    assert_cover_and_budget(doc, chunks, backbone_tokenizer, DEFAULT_CHUNK_TOKENS)
