"""What every parser returns: a document's text tiled by segments that carry provenance."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Segment:
    """A span [start, end) of a document's text with where it came from.

    Segments tile the text exactly. A chunk never crosses a segment marked `break_before`,
    and never splits an `atomic` segment (a dialogue turn, a table row).
    """

    start: int
    end: int
    page: int | None = None  # 1-based, as a PDF viewer numbers pages
    speaker: str | None = None
    session: str | None = None
    turn_id: str | None = None
    time: str | None = None
    atomic: bool = False
    break_before: bool = False
    # A PDF table row: its text as a reader needs it (label, column headers), the chunk's text in
    # place of the printed row, and the table it belongs to (page, box, caption), shared by its rows
    rendered: str | None = None
    table: dict | None = None


@dataclass
class ParsedDocument:
    text: str
    kind: str  # book | pdf | dialogue
    title: str
    segments: list[Segment]
    part: str = ""  # key of this document inside a file that holds several
    metadata: dict = field(default_factory=dict)

    def check(self) -> None:
        """Segments must tile the text: the chunker's exact-cover guarantee rests on it."""
        position = 0
        for segment in self.segments:
            if segment.start != position or segment.end < segment.start:
                raise ValueError(f"segments do not tile the text at {position}")
            position = segment.end
        if position != len(self.text):
            raise ValueError("segments do not reach the end of the text")


class TextBuilder:
    """Appends pieces of text, recording a segment for each."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.segments: list[Segment] = []
        self.length = 0

    def add(self, text: str, **provenance) -> None:
        if not text:
            return
        self.segments.append(Segment(self.length, self.length + len(text), **provenance))
        self.parts.append(text)
        self.length += len(text)

    def text(self) -> str:
        return "".join(self.parts)
