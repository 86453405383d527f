"""Sentence-aligned chunks of about `budget` backbone tokens that exactly cover a document's text.

Concatenating a document's chunks gives its text back. A chunk never crosses a segment marked
`break_before` (a Markdown section, a dialogue session, a PDF table) and never splits an atomic
segment (a dialogue turn, a table row); a sentence longer than the budget is cut at word boundaries.
A PDF table's chunk is the exception to the first sentence: its text is its rows rewritten
(`Segment.rendered`, under the table's caption), its offsets the printed rows' span on the page.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

from ..defaults import DEFAULT_CHUNK_TOKENS  # defined there for the CLI's options
from .parsers.base import ParsedDocument, Segment


# Words that a period follows without ending the sentence. Titles always precede a name.
_TITLES = {
    "mr", "mrs", "ms", "messrs", "mme", "mlle", "dr", "st", "prof", "capt", "col", "gen", "lt", "rev", "hon",
    "sgt", "mt", "fr", "sen", "rep", "gov", "supt", "insp",
}
# These may also end a sentence: they do when the next word is capitalised.
_ABBREVIATIONS = {
    "jr", "sr", "vs", "etc", "e.g", "i.e", "fig", "figs", "eq", "vol", "pp", "al", "approx", "dept", "inc",
    "ltd", "co", "cf", "ca", "jan", "feb", "mar", "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
}
# A sentence ends at . ! ? (optionally followed by closing quotes/brackets) before whitespace,
# or at a blank line.
_END = re.compile(r"[.!?]+[\"')\]\u201d\u2019]*(?=\s)|\n[ \t]*\n")
_WORD_BEFORE = re.compile(r"([\w.]+)\.$")
_DOTTED = re.compile(r"(?:\w\.)+\w")  # e.g, U.S, p.m
_NEXT_WORD = re.compile(r"\s*[\"'(\[\u201c\u2018]*(\w)")


def content_hash(text: str) -> str:
    """The store's key of a chunk text: what its states, KV and key files are cached under."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class TokenCounter(Protocol):
    def count(self, texts: list[str]) -> list[int]: ...

    def offsets(self, text: str) -> list[tuple[int, int]]: ...


def _ends_sentence(text: str, end: int) -> bool:
    """Whether the bare period just before `end` ends a sentence ("Mr.", "J.", "e.g." do not)."""
    word = _WORD_BEFORE.search(text[max(0, end - 24):end])
    if not word:
        return True
    token = word.group(1).rstrip(".")
    lower = token.lower()
    following = _NEXT_WORD.match(text, end)
    next_char = following.group(1) if following else ""
    if lower in _TITLES:
        return False
    if len(token) == 1 and token.isupper() and token != "I":  # an initial; "I." is mostly the pronoun
        return False
    if lower == "no":  # "No. 5", but "he said no."
        return not next_char.isdigit()
    if lower in _ABBREVIATIONS or _DOTTED.fullmatch(token):
        return next_char.isupper()
    return True


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Spans of sentences covering `text` exactly; trailing whitespace stays with its sentence."""
    return list(_iter_sentences(text))


def _iter_sentences(text: str) -> Iterator[tuple[int, int]]:
    """split_sentences, lazily: a book's sentences are found as its pieces are packed."""
    start = 0
    for match in _END.finditer(text):
        end = match.end()
        if match.group() == "." and not _ends_sentence(text, end):
            continue
        while end < len(text) and text[end].isspace():
            end += 1
        if end > start:
            yield (start, end)
            start = end
    if start < len(text):
        yield (start, len(text))


@dataclass
class Piece:
    start: int
    end: int
    tokens: int
    segment: Segment
    new_chunk: bool = False  # a chunk must start here


@dataclass
class Chunk:
    seq: int
    start: int
    end: int
    text: str
    n_tokens: int
    segments: list[Segment] = field(default_factory=list)

    def record(self) -> dict:
        """The chunk as the store writes it, with provenance gathered from its segments."""
        pages = [s.page for s in self.segments if s.page is not None]
        speakers: list[str] = []
        turn_ids: list[str] = []
        times = [s.time for s in self.segments if s.time]
        sessions: list[str] = []
        for s in self.segments:
            if s.speaker and s.speaker not in speakers:
                speakers.append(s.speaker)
            if s.turn_id and s.atomic:
                turn_ids.append(s.turn_id)
            if s.session and s.session not in sessions:
                sessions.append(s.session)
        return {
            "seq": self.seq,
            "text": self.text,
            "content_hash": content_hash(self.text),
            "n_tokens": self.n_tokens,
            "char_start": self.start,
            "char_end": self.end,
            "page_start": min(pages) if pages else None,
            "page_end": max(pages) if pages else None,
            "speakers": speakers,
            "session": ",".join(sessions) if sessions else None,
            "turn_ids": turn_ids,
            "time_start": times[0] if times else None,
            "time_end": times[-1] if times else None,
        }


def _split_long(text: str, start: int, end: int, budget: int, counter: TokenCounter) -> list[tuple[int, int]]:
    """Cut an over-long sentence into pieces of at most `budget` tokens, at whitespace where there is
    some. Each cut is checked by counting the piece itself: a substring can tokenize differently."""
    piece = text[start:end]
    offsets = counter.offsets(piece)
    starts = [o[0] for o in offsets]
    spans = []
    cursor = 0
    first = 0  # first token that starts at or after the cursor
    while len(offsets) - first > budget or counter.count([piece[cursor:]])[0] > budget:
        take = min(budget, len(offsets) - first)
        while True:
            cut = offsets[first + take - 1][1]
            space = max(piece.rfind(c, cursor + 1, cut + 1) for c in " \n\t")
            if space > cursor:
                cut = space + 1
            excess = counter.count([piece[cursor:cut]])[0] - budget
            if excess <= 0 or take == 1:
                break
            take = max(1, take - excess)
        spans.append((start + cursor, start + cut))
        cursor = cut
        first = bisect.bisect_left(starts, cursor, lo=first)
        if first >= len(offsets):
            break
    spans.append((start + cursor, end))
    return [s for s in spans if s[1] > s[0]]


# Sentences tokenized per call: bounds the tokenizer output held at once (a whole book's encodings
# took ~60x the file's size) and lets progress, and so cancellation, be seen between calls.
_COUNT_BATCH = 2048
_COUNT_BATCH_CHARS = 1 << 18  # ... and characters per call, however long the sentences are
# The longest unit the tokenizer sees: text without sentence punctuation is one "sentence", and
# tokenizing megabytes at once took ~130x their size in memory. A longer sentence is cut at its
# last whitespace before this bound (else at the bound); pieces are packed into chunks as usual.
MAX_UNIT_CHARS = 8192


def iter_pieces(doc: ParsedDocument, budget: int, counter: TokenCounter) -> Iterator[Piece]:
    """The document's pieces in order, tokenized `_COUNT_BATCH` sentences at a time (counts are per
    text, so the batching does not change them)."""
    batch: list[tuple[int, int, Segment, bool]] = []
    chars = 0
    for span in _iter_spans(doc):
        batch.append(span)
        chars += span[1] - span[0]
        if len(batch) >= _COUNT_BATCH or chars >= _COUNT_BATCH_CHARS:
            yield from _batch_pieces(doc, batch, budget, counter)
            batch = []
            chars = 0
    if batch:
        yield from _batch_pieces(doc, batch, budget, counter)


def _iter_spans(doc: ParsedDocument) -> Iterator[tuple[int, int, Segment, bool]]:
    for segment in doc.segments:
        if segment.atomic:
            yield (segment.start, segment.end, segment, segment.break_before)
            continue
        first = True
        for s, e in _iter_sentences(doc.text[segment.start:segment.end]):
            for a, b in _capped(doc.text, segment.start + s, segment.start + e):
                yield (a, b, segment, segment.break_before and first)
                first = False


def _capped(text: str, start: int, end: int) -> Iterator[tuple[int, int]]:
    """[start, end) in consecutive spans of at most MAX_UNIT_CHARS, cut after whitespace where
    there is some in the second half of the span."""
    while end - start > MAX_UNIT_CHARS:
        bound = start + MAX_UNIT_CHARS
        cut = max(text.rfind(c, start + MAX_UNIT_CHARS // 2, bound) for c in " \n\t") + 1
        if cut <= start:
            cut = bound
        yield (start, cut)
        start = cut
    if end > start:
        yield (start, end)


def _batch_pieces(doc: ParsedDocument, spans: list[tuple[int, int, Segment, bool]], budget: int,
                  counter: TokenCounter) -> Iterator[Piece]:
    counts = counter.count([segment.rendered if segment.rendered is not None else doc.text[s:e]
                            for s, e, segment, _ in spans])
    for (start, end, segment, new_chunk), tokens in zip(spans, counts):
        if tokens > budget and not segment.atomic:
            cuts = _split_long(doc.text, start, end, budget, counter)
            for j, ((s, e), n) in enumerate(zip(cuts, counter.count([doc.text[s:e] for s, e in cuts]))):
                yield Piece(s, e, n, segment, new_chunk and j == 0)
        else:
            yield Piece(start, end, tokens, segment, new_chunk)


def chunk_text(doc: ParsedDocument, group: list[Piece]) -> str:
    """What a chunk of these pieces says: the document's text, or for a table's rows (a chunk never
    holds anything else with them) its caption and the rows as rewritten."""
    table = group[0].segment.table
    if table is None:
        return doc.text[group[0].start:group[-1].end]
    caption = f"{table['caption']}\n" if table.get("caption") else ""
    return caption + "".join(p.segment.rendered or doc.text[p.start:p.end] for p in group)


def chunk_document(
    doc: ParsedDocument,
    counter: TokenCounter,
    budget: int = DEFAULT_CHUNK_TOKENS,
    on_progress: Callable[[int, int], None] | None = None,
) -> list[Chunk]:
    """Every chunk of `iter_chunks`, in a list."""
    return list(iter_chunks(doc, counter, budget, on_progress))


def iter_chunks(
    doc: ParsedDocument,
    counter: TokenCounter,
    budget: int = DEFAULT_CHUNK_TOKENS,
    on_progress: Callable[[int, int], None] | None = None,
) -> Iterator[Chunk]:
    """Greedy packing of sentence pieces into chunks of at most `budget` tokens (a single atomic
    turn longer than the budget becomes one chunk of its own), yielded as they are made, so an
    ingest stores a book's chunks in batches instead of holding them all. `on_progress(done,
    total)` counts characters of the text."""
    doc.check()
    current: list[Piece] = []
    made: list[Chunk] = []  # what `close` emitted, handed out by the caller's loop
    seq = 0

    def emit(group: list[Piece], n_tokens: int) -> None:
        nonlocal seq
        start, end = group[0].start, group[-1].end
        segments = []
        for p in group:
            if not segments or segments[-1] is not p.segment:
                segments.append(p.segment)
        made.append(Chunk(seq, start, end, chunk_text(doc, group), n_tokens, segments))
        seq += 1

    def close(flush: bool) -> None:
        """Emit the open pieces as a chunk. Pieces counted apart can tokenize into more tokens
        joined ("\n\n" + "\u201c" is 3 tokens, not 2), so trailing pieces that push the joined count
        over the budget move on: into the next chunk, or with `flush` (a break) into their own."""
        while current:
            take = len(current)
            n = counter.count([chunk_text(doc, current[:take])])[0]
            while n > budget and take > 1:
                take -= 1
                n = counter.count([chunk_text(doc, current[:take])])[0]
            emit(current[:take], n)
            del current[:take]
            if not flush:
                return

    # Whitespace-only pieces (blank lines between pages) join whatever chunk is open.
    # Pieces are made as they are packed, so the progress is in characters of the document's text.
    total = len(doc.text)
    for index, piece in enumerate(iter_pieces(doc, budget, counter)):
        blank = not doc.text[piece.start:piece.end].strip()
        if current and piece.new_chunk:
            close(flush=True)
        elif current and not blank and sum(p.tokens for p in current) + piece.tokens > budget:
            close(flush=False)
        current.append(piece)
        if made:
            yield from made
            made.clear()
        if on_progress and index % 200 == 0:
            on_progress(piece.start, total)
    close(flush=True)
    yield from made
    made.clear()
    if on_progress:
        on_progress(total, total)
