"""Gold evidence and how it maps onto evsel's own chunks.

A gold item names evidence the way its dataset does: a dialogue turn id, a PDF page, a character
span of the document text, or a piece of text to find in it. `resolve` turns each item into the
set of chunks that hold it, so every method is scored against exactly the chunks a user gets.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from evsel.ingest.parsers.base import ParsedDocument

# A chunk counts as holding a span when it shares at least this many non-space characters
# with it (or the whole span, if shorter): a chunk that only touches a span's edge does not.
MIN_OVERLAP_CHARS = 20
# Fuzzy text location accepts the best window of document words when it holds this share
# of the evidence's words (PDF text extraction differs between tools).
MIN_TEXT_OVERLAP = 0.5

_WORD = re.compile(r"\w+")


@dataclass
class Gold:
    """One piece of gold evidence in one document (exactly one of turn/page/span/text is set,
    except that `text` may come with the `page` it is on)."""

    doc: str | None  # key of the document in the dataset; None: whichever document of the scope holds it
    label: str  # as the dataset names it, for reports
    turn: str | None = None
    page: int | None = None  # 1-based
    span: tuple[int, int] | None = None  # [start, end) in the parsed document's text
    text: str | None = None


def page_range(doc: ParsedDocument, page: int) -> tuple[int, int] | None:
    """Character range of a PDF page in the parsed text."""
    spans = [(s.start, s.end) for s in doc.segments if s.page == page]
    if not spans:
        return None
    return spans[0][0], spans[-1][1]


def _normalized(text: str) -> tuple[str, list[int]]:
    """Lower-cased text with whitespace runs collapsed to one space, and for each kept
    character its index in `text`."""
    out: list[str] = []
    index: list[int] = []
    space = False
    for i, ch in enumerate(text):
        if ch.isspace():
            if not space and out:
                out.append(" ")
                index.append(i)
            space = True
            continue
        space = False
        out.append(ch.lower())
        index.append(i)
    return "".join(out), index


def locate(text: str, needle: str, start: int = 0, end: int | None = None) -> tuple[int, int] | None:
    """Where `needle` sits in text[start:end]: exactly up to case and whitespace, else the
    window of words that shares the most of the needle's words (at least MIN_TEXT_OVERLAP)."""
    end = len(text) if end is None else end
    region = text[start:end]
    norm_needle, _ = _normalized(needle.strip())
    if not norm_needle:
        return None
    norm, index = _normalized(region)
    at = norm.find(norm_needle)
    if at >= 0:
        return start + index[at], start + index[at + len(norm_needle) - 1] + 1
    words = [(m.start(), m.end(), m.group().lower()) for m in _WORD.finditer(region)]
    wanted = Counter(w.lower() for w in _WORD.findall(needle))
    n = sum(wanted.values())
    if not n or not words:
        return None
    size = min(n, len(words))
    window: Counter = Counter(w for _, _, w in words[:size])
    best, best_at = sum((window & wanted).values()), 0
    for i in range(size, len(words)):
        window[words[i][2]] += 1
        window[words[i - size][2]] -= 1
        # Counter & Counter is O(vocabulary); only recompute when the new word matters
        if words[i][2] in wanted or words[i - size][2] in wanted:
            shared = sum((window & wanted).values())
            if shared > best:
                best, best_at = shared, i - size + 1
    if best / n < MIN_TEXT_OVERLAP:
        return None
    first, last = words[best_at], words[best_at + size - 1]
    return start + first[0], start + last[1]


def _overlap(text: str, a: tuple[int, int], b: tuple[int, int]) -> int:
    lo, hi = max(a[0], b[0]), min(a[1], b[1])
    if hi <= lo:
        return 0
    return sum(1 for ch in text[lo:hi] if not ch.isspace())


def chunks_for_span(text: str, chunks: list, span: tuple[int, int]) -> list[int]:
    """Indexes (into `chunks`) of the chunks holding the span."""
    need = min(MIN_OVERLAP_CHARS, max(1, sum(1 for ch in text[span[0]:span[1]] if not ch.isspace())))
    return [i for i, c in enumerate(chunks) if _overlap(text, (c.char_start, c.char_end), span) >= need]


def resolve(gold: Gold, doc: ParsedDocument, chunks: list) -> tuple[list[int], str]:
    """The chunks (indexes into this document's `chunks`) holding a gold item, and how they were
    found: "turn", "page", "span", "text", "page-fallback" (text not found, its page used), or
    "unresolved" with no chunks."""
    if gold.turn is not None:
        found = [i for i, c in enumerate(chunks) if gold.turn in c.turn_ids]
        return found, "turn" if found else "unresolved"
    if gold.span is not None:
        found = chunks_for_span(doc.text, chunks, gold.span)
        return found, "span" if found else "unresolved"
    if gold.text is not None:
        lo, hi = 0, len(doc.text)
        if gold.page is not None:
            bounds = page_range(doc, gold.page)
            if bounds is None:
                return [], "unresolved"
            lo, hi = bounds
        span = locate(doc.text, gold.text, lo, hi)
        if span is not None:
            found = chunks_for_span(doc.text, chunks, span)
            if found:
                return found, "text"
        if gold.page is None:
            return [], "unresolved"
    if gold.page is not None:
        found = [
            i for i, c in enumerate(chunks)
            if c.page_start is not None and c.page_start <= gold.page <= (c.page_end or c.page_start)
        ]
        how = "page" if gold.text is None else "page-fallback"
        return found, how if found else "unresolved"
    return [], "unresolved"
