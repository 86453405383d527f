"""Reading windows: the reader reads each shown prose passage with the chunks beside it.

A chunk boundary often falls between a question in the text and its answer ("But to whom?" ends
one chunk, "To an English lawyer named Norton." starts the next), or between a name and what the
question asks of it. So the answer step reads each of the top passages widened by REACH chunks on
either side in its document, each chunk once. An answer found
in a chunk beside the shown ones cites that chunk, and the evidence shows it next to its neighbour.
Dialogues are read turn by turn as shown: their passages are already whole sessions' turns.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

REACH = 1  # chunks read on each side of a shown passage


@dataclass
class Window:
    """A stretch of consecutive chunks of one document, read as one passage."""

    parts: list  # ChunkRecords in document order
    rank: int  # the best rank among the shown passages it holds
    score: float

    def __post_init__(self) -> None:
        self.offsets = []
        text = ""
        for i, chunk in enumerate(self.parts):
            if i and self.parts[i - 1].char_end != chunk.char_start:  # not contiguous (a PDF table's rows)
                text += "\n"
            self.offsets.append(len(text))
            text += chunk.text
        self.text = text

    def as_chunk(self):
        """The window as one chunk record (its first chunk's identity, the whole window's text)."""
        first, last = self.parts[0], self.parts[-1]
        return replace(first, text=self.text, char_end=last.char_end, page_end=last.page_end)

    def locate(self, start: int, end: int) -> tuple:
        """(chunk, start, end): the chunk that holds most of the window's span [start, end), and the
        span's offsets in it (a span that runs across a chunk boundary is cut there)."""
        def held(i: int) -> int:
            a = self.offsets[i]
            return min(end, a + len(self.parts[i].text)) - max(start, a)

        i = max(range(len(self.parts)), key=held)
        chunk, offset = self.parts[i], self.offsets[i]
        return chunk, max(start - offset, 0), min(end - offset, len(chunk.text))


def reading_windows(best_first: list, beside: dict, reach: int = REACH) -> list[Window]:
    """One window per shown passage (Scored, best first), in that order: the passage and up to
    `reach` chunks of its document on either side (`beside`: (doc_id, seq) -> ChunkRecord of the
    scope) that no shown passage and no better-ranked window holds, so no text is read twice and a
    window stays a few chunks long."""
    claimed = {(s.chunk.doc_id, s.chunk.seq) for s in best_first}
    windows = []
    for s in best_first:
        doc, seq = s.chunk.doc_id, s.chunk.seq
        lo = hi = seq
        while seq - lo < reach and (doc, lo - 1) in beside and (doc, lo - 1) not in claimed:
            lo -= 1
        while hi - seq < reach and (doc, hi + 1) in beside and (doc, hi + 1) not in claimed:
            hi += 1
        claimed.update((doc, k) for k in range(lo, hi + 1))
        windows.append(Window([s.chunk if k == seq else beside[(doc, k)] for k in range(lo, hi + 1)], s.rank,
                              s.score))
    return windows


def neighbours_of(chunks: list) -> dict:
    """(doc_id, seq) -> chunk, for prose chunks (dialogue passages are read as shown)."""
    return {(c.doc_id, c.seq): c for c in chunks if not c.speakers}
