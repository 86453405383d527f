"""Reading windows: the reader reads each shown prose passage with the text beside it.

A chunk boundary often falls between a question in the text and its answer ("But to whom?" ends
one chunk, "To an English lawyer named Norton." starts the next), or between a name and what the
question asks of it. So the answer step reads each of the top passages with the text before and
after it in its section of the document: up to BESIDE_WORDS words of the chunk on either side, whole sentences
where they fit. The whole neighbouring chunk is the default: on held-out novel questions reading 40
words each side bought a third of what whole chunks did (docs/ANSWERS.md), and the reader's pass
costs in proportion to the tokens it reads, so this is the knob between the two. No text is read
twice: a neighbour that is shown, or read beside a better-ranked passage, is not read again.
An answer found beside a shown passage cites the chunk it lies in, and the evidence shows that
chunk. Dialogues are read as shown: their passages are already whole sessions' turns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..ingest.chunker import split_sentences

BESIDE_WORDS = 150  # words read on each side of a shown passage: a whole chunk (~105 words) in practice
_WORD = re.compile(r"\S+")
_HEADING = re.compile(r"\s*#{1,6}\s")  # a Markdown heading: the chunk opens a section


@dataclass
class Part:
    """The stretch [start, end) of a chunk's text that a window reads."""

    chunk: object  # ChunkRecord
    start: int
    end: int

    @property
    def text(self) -> str:
        return self.chunk.text[self.start:self.end]


class Window:
    """A shown passage with the text read beside it, as one passage."""

    def __init__(self, parts: list[Part], shown, rank: int, score: float):
        self.parts = parts
        self.shown = shown  # the shown passage's ChunkRecord
        self.rank = rank
        self.score = score
        self.offsets = []
        text = ""
        for i, part in enumerate(parts):
            previous = parts[i - 1] if i else None
            if previous is not None and not (previous.end == len(previous.chunk.text) and part.start == 0
                                             and previous.chunk.char_end == part.chunk.char_start):
                text += "\n"  # not contiguous in the document (a PDF table's rows)
            self.offsets.append(len(text))
            text += part.text
        self.text = text

    def as_chunk(self):
        """The window as one chunk record (its shown passage's identity, the window's text)."""
        return replace(self.shown, text=self.text)

    def locate(self, start: int, end: int) -> tuple:
        """(chunk, start, end): the chunk that holds most of the window's span [start, end), and the
        span's offsets in that chunk's text (a span across a chunk boundary is cut there)."""
        def held(i: int) -> int:
            a = self.offsets[i]
            return min(end, a + len(self.parts[i].text)) - max(start, a)

        i = max(range(len(self.parts)), key=held)
        part, offset = self.parts[i], self.offsets[i]
        return (part.chunk, part.start + max(start - offset, 0),
                part.start + min(end - offset, len(part.text)))


def _leading(text: str, words: int) -> int:
    """The end of the whole sentences that open `text` within `words` words (the first sentence
    cut at a word when it alone is longer)."""
    end = 0
    for a, b in split_sentences(text):
        if len(_WORD.findall(text[:b])) > words:
            break
        end = b
    if end == 0:
        found = list(_WORD.finditer(text))[:words]
        end = found[-1].end() if found else 0
    return end


def _trailing(text: str, words: int) -> int:
    """The start of the whole sentences that close `text` within `words` words."""
    start = len(text)
    for a, b in reversed(split_sentences(text)):
        if len(_WORD.findall(text[a:])) > words:
            break
        start = a
    if start == len(text):
        found = list(_WORD.finditer(text))[-words:] if words else []
        start = found[0].start() if found else len(text)
    return start


def reading_windows(best_first: list, beside: dict, words: int | None = None) -> list[Window]:
    """One window per shown passage (Scored, best first), in that order: the passage with up to
    `words` (None: BESIDE_WORDS) words of the chunk before and after it in its document (`beside`:
    (doc_id, seq) -> ChunkRecord of the scope), leaving out chunks that are shown or read beside a
    better-ranked passage."""
    words = BESIDE_WORDS if words is None else words
    claimed = {(s.chunk.doc_id, s.chunk.seq) for s in best_first}
    windows = []
    for s in best_first:
        doc, seq = s.chunk.doc_id, s.chunk.seq
        parts = [Part(s.chunk, 0, len(s.chunk.text))]
        before, after = beside.get((doc, seq - 1)), beside.get((doc, seq + 1))
        if words and before is not None and (doc, seq - 1) not in claimed and not opens_section(s.chunk):
            claimed.add((doc, seq - 1))
            parts.insert(0, Part(before, _trailing(before.text, words), len(before.text)))
        if words and after is not None and (doc, seq + 1) not in claimed and not opens_section(after):
            claimed.add((doc, seq + 1))
            parts.append(Part(after, 0, _leading(after.text, words)))
        windows.append(Window([p for p in parts if p.end > p.start], s.chunk, s.rank, s.score))
    return windows


def opens_section(chunk) -> bool:
    """Does the chunk start a Markdown section? Chunks never cross one, and the text across it is
    another article (a corpus of Wikipedia paragraphs) or chapter: not read beside."""
    return bool(_HEADING.match(chunk.text))


def neighbours_of(chunks: list) -> dict:
    """(doc_id, seq) -> chunk, for prose chunks (dialogue passages are read as shown)."""
    return {(c.doc_id, c.seq): c for c in chunks if not c.speakers}
