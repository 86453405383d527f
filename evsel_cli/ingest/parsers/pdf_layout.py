"""A PDF's text as a reader sees it: two-column pages in column order, the running headers,
footers and page numbers printed on most pages left out (and recorded), and each table as rows
that name their columns (pdf_tables.py).

The document's text holds every kept word once: a table's rows as printed, one line each. A
table row is its own atomic segment carrying its rewritten form (`Segment.rendered`), which the
chunker makes the chunk text while the chunk's offsets point at the printed row on the page.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Callable

import pymupdf

from .base import TextBuilder
from .pdf_tables import PageTimeout, Table, Word, caption_above, find_tables

# A running line is one of a page's first or last lines (a page number may sit mid-page when
# the page is short), not a long one...
_EDGE_LINES = 2
_RUNNING_MAX_CHARS = 100
_RUNNING_GAP = 0.4  # ... set off from the body by a gap (a share of its height)...
# ... and is printed (digits aside: page numbers) on at least this share of the pages with text.
_RUNNING_SHARE = 0.5
_RUNNING_MIN_PAGES = 3
_DIGITS = re.compile(r"\d+")
# A page is read in two columns when each half holds this share of its characters in prose
# blocks (at least this share of the page wide), so label-and-number pages stay in one column.
_COLUMN_SHARE = 0.2
_PROSE_WIDTH = 0.3
_HYPHEN_BREAK = re.compile(r"(\w)-\n(\w)")

Line = tuple[float, float, float, float, str]  # x0, y0, x1, y1, text


def _lines(words: list[Word], keep: Callable[[int], bool]) -> dict[int, list[tuple[Line, list[int]]]]:
    """The kept words as printed lines, by block, in extraction order."""
    grouped: dict[tuple[int, int], list[int]] = {}
    for i, w in enumerate(words):
        if keep(i):
            grouped.setdefault((w.block, w.line), []).append(i)
    blocks: dict[int, list[tuple[Line, list[int]]]] = {}
    for (block, _), idx in grouped.items():
        ws = [words[i] for i in idx]
        line = (min(w.x0 for w in ws), min(w.y0 for w in ws), max(w.x1 for w in ws), max(w.y1 for w in ws),
                " ".join(w.text for w in ws))
        blocks.setdefault(block, []).append((line, idx))
    return blocks


def _running_key(text: str, top: bool) -> tuple[bool, str]:
    return top, " ".join(_DIGITS.sub("#", text.lower()).split())


def _margin_lines(words: list[Word]) -> list[tuple[tuple[bool, str], tuple[str, ...], list[int]]]:
    """The page's candidate running lines: (key with digits folded, its digit runs, its words). Of
    a page's lines at least one, the body, is never a candidate (a page whose only body line
    repeats, a page number with it, is not emptied)."""
    lines = sorted((line for block in _lines(words, lambda i: True).values() for line in block),
                   key=lambda item: item[0][1])
    found = []
    tops = min(_EDGE_LINES, (len(lines) - 1) // 2)
    bottoms = min(_EDGE_LINES, len(lines) - 1 - tops)

    def apart(a: int, b: int) -> bool:  # lines a above b further apart than lines of a paragraph
        upper, lower = lines[a][0], lines[b][0]
        return lower[1] - upper[3] > _RUNNING_GAP * (upper[3] - upper[1])

    for rank, (line, idx) in enumerate(lines):
        if len(line[4]) > _RUNNING_MAX_CHARS:
            continue
        if rank < tops and apart(rank, rank + 1):
            found.append((_running_key(line[4], True), tuple(_DIGITS.findall(line[4])), idx))
        elif rank >= len(lines) - bottoms and apart(rank - 1, rank):
            found.append((_running_key(line[4], False), tuple(_DIGITS.findall(line[4])), idx))
    return found


def _same_words(pages: list[tuple[int, tuple[str, ...]]]) -> set[int]:
    """Of the pages printing one folded line (page index, its digit runs), those where it repeats
    with the same words: each digit run is the same on every such page, or is the page's number
    (the page index plus one offset for them all); the most common reading of each run wins."""
    width = min(len(runs) for _, runs in pages)
    pages = [(page, runs) for page, runs in pages if len(runs) == width]
    modes = []
    for j in range(width):
        seen = Counter(("=", runs[j]) for _, runs in pages)
        seen.update(("+", int(runs[j]) - page) for page, runs in pages)
        modes.append(seen.most_common(1)[0][0])

    def fits(page: int, run: str, mode: tuple) -> bool:
        return run == mode[1] if mode[0] == "=" else int(run) - page == mode[1]

    return {page for page, runs in pages if all(fits(page, run, mode) for run, mode in zip(runs, modes))}


def running_lines(pages: list[list[Word]]) -> tuple[list[set[int]], Counter]:
    """For each page the words of its running lines, and how many times each line was dropped.
    A running line repeats with the same words (page numbers aside) on enough of the pages: a
    statement's "Total due for month 3: $1,204.50" lines differ in their figures and stay."""
    margins = [_margin_lines(words) for words in pages]
    with_text = sum(1 for words in pages if words)
    printed: dict[tuple[bool, str], dict[int, tuple[str, ...]]] = {}
    for page, found in enumerate(margins):
        for key, runs, _ in found:
            printed.setdefault(key, {}).setdefault(page, runs)
    need = max(_RUNNING_MIN_PAGES, math.ceil(_RUNNING_SHARE * with_text))
    running = {}
    for key, where in printed.items():
        if len(where) >= need:
            same = _same_words(list(where.items()))
            if len(same) >= need:
                running[key] = same
    dropped: list[set[int]] = []
    texts: Counter = Counter()  # by the line as first printed ("Page 3" stands for every page number)
    first: dict[tuple[bool, str], str] = {}
    for page, (words, found) in enumerate(zip(pages, margins)):
        out: set[int] = set()
        for key, runs, idx in found:
            if page in running.get(key, ()) and runs == printed[key][page]:
                out.update(idx)
                texts[first.setdefault(key, " ".join(words[i].text for i in idx))] += 1
        dropped.append(out)
    return dropped, texts


def _in_order(items: list[tuple[pymupdf.Rect, object]], width: float) -> list[object]:
    """Blocks (text or tables) in reading order: extraction order on a one-column page or one whose
    extraction already reads column by column; on a two-column page whose extraction goes across
    the columns, between blocks that cross the middle, the left column then the right."""
    middle = width / 2
    slack = 0.02 * width
    left = [it for it in items if it[0].x1 <= middle + slack]
    right = [it for it in items if it[0].x0 >= middle - slack and it[0].x1 > middle + slack]
    total = sum(_chars(it[1]) for it in items) or 1

    def prose(side):
        return sum(_chars(it[1]) for it in side if it[0].width >= _PROSE_WIDTH * width)

    if prose(left) < _COLUMN_SHARE * total or prose(right) < _COLUMN_SHARE * total:
        return [it[1] for it in items]
    sides = {id(it): 0 for it in left} | {id(it): 1 for it in right}
    sided = [sides[id(it)] for it in items if id(it) in sides]
    if sum(a != b for a, b in zip(sided, sided[1:])) <= 2 * (len(items) - len(sided) + 1):
        # the extraction order already reads column by column (most papers' PDFs), and keeps
        # figure labels and captions where their writer put them
        return [it[1] for it in items]
    ordered: list[object] = []
    band: list[tuple[pymupdf.Rect, object]] = []
    for it in sorted(items, key=lambda it: (it[0].y0, it[0].x0)):
        if id(it) in sides:
            band.append(it)
            continue
        ordered += [b[1] for b in sorted(band, key=lambda b: (sides[id(b)], b[0].y0))]
        band = []
        ordered.append(it[1])
    ordered += [b[1] for b in sorted(band, key=lambda b: (sides[id(b)], b[0].y0))]
    return ordered


def _chars(item: object) -> int:
    return len(item) if isinstance(item, str) else sum(len(r.raw) for r in item.rows)


def clean_block(text: str) -> str:
    """Words hyphenated across line ends joined, as the plain reader does (a page's text between
    tables: a line ending the text before a table is not joined to the table)."""
    return _HYPHEN_BREAK.sub(r"\1\2", text.replace("\x00", ""))


def read_page(page: pymupdf.Page, words: list[Word], dropped: set[int],
              finder: bool = False, deadline: float | None = None) -> tuple[list[object], list[Table] | None]:
    """The page's blocks in reading order: text (str) and tables (Table, with their caption);
    `finder`: tables start from pymupdf's table finder's boxes. Tables not read by `deadline`
    (time.monotonic()): the page's lines as text, and None for its tables."""
    taken = set(dropped)
    try:
        tables = find_tables(page, words, taken, finder, deadline)
    except PageTimeout:  # a crafted page must not hold the queue: its lines are read as text
        taken, tables = set(dropped), None
    blocks = _lines(words, lambda i: i not in taken)
    outside = [line for block in blocks.values() for line, _ in block]
    # lines, not blocks, are ordered: mupdf puts the two columns' lines in one block when they
    # alternate in the file
    items: list[tuple[pymupdf.Rect, object]] = [(pymupdf.Rect(line[:4]), line[4] + "\n") for line in outside]
    for table in tables or []:
        table.caption = " ".join(part for part in (caption_above(outside, table), table.units) if part)
        at = next((k for k, (rect, _) in enumerate(items) if rect.y0 >= table.bbox[3]), len(items))
        items.insert(at, (pymupdf.Rect(table.bbox), table))
    return _in_order(items, page.rect.width), tables


def build_text(pages: list[list[object]], builder: TextBuilder) -> list[dict]:
    """Append the pages' blocks to `builder`: a page's text runs as one segment, each table row as
    an atomic one carrying its rewritten form; a chunk starts at a table and after it. Returns the
    tables' provenance (page, box, caption, rows, character range)."""
    provenance = []
    after_table = False
    for number, blocks in enumerate(pages, start=1):
        if not blocks:
            continue
        blocks = list(blocks)
        last = blocks[-1]
        if isinstance(last, str):
            blocks[-1] = last + "\n"
        else:
            last.rows[-1].raw += "\n"  # the blank line between pages
        text = ""
        for block in blocks:
            if isinstance(block, str):
                text += block
                continue
            if text:
                builder.add(clean_block(text), page=number, break_before=after_table)
                text, after_table = "", False
            start = builder.length
            info = {"page": number, "bbox": [round(v, 1) for v in block.bbox], "caption": block.caption}
            for k, row in enumerate(block.rows):
                builder.add(row.raw, page=number, atomic=True, break_before=k == 0, rendered=row.rendered,
                            table=info)
            provenance.append({**info, "rows": len(block.rows), "char_start": start, "char_end": builder.length})
            after_table = True
        if text:
            builder.add(clean_block(text), page=number, break_before=after_table)
            after_table = False
    return provenance
