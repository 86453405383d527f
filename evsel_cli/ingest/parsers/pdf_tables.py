"""A PDF page's tables as a reader uses them: each row with its label and every value named by its
column header ("Purchases of PP&E | 2018: (1,577) | 2017: (1,373)"), under the table's caption.

A table starts from a printed row of a label and values or, with EVSEL_PDF_READER=finder, from a
box of pymupdf's table finder (`Page.find_tables`, its line-based detector; its layout model is ~7x
slower again); either is grown to the whole table from its words: rows of values, the header rows
above, the one-cell rows between (section titles, wrapped labels). Its columns are where the values
line up. Cells keep the words' own spacing (the finder's cell text runs words together in some
filings). The finder made the filings' ingest over 3x the plain reader's (the target is 2x) for the
same FinanceBench recall (docs/RESULTS.md compares the readers).
"""

from __future__ import annotations

import bisect
import re
import time
from dataclasses import dataclass, field

import pymupdf

# A value cell: a number with its sign, currency, parentheses and percent, or a dash for none.
_NUMBER = re.compile(r"^[(\-\u2212$\u20ac\u00a3]*\d[\d,.]*%?\)?%?$|^[\u2014\u2013\-]+$")
_YEAR = re.compile(r"^(19|20)\d\d$")
# Words of one line further apart than this share of the line's height are in different cells.
_CELL_GAP = 0.6
# Pages with at least this many printed rows of a label and values are searched for tables.
_MIN_TABULAR_LINES = 3
_HEADER_ROWS = 3
# Table regions this close (points) one above the other, overlapping across, are one table (the
# finder cuts a table with shaded rows into one table per row).
_JOIN_GAP = 14.0
# Caption: up to this many lines directly above a table, none further than this above the next.
_CAPTION_LINES = 3
_CAPTION_GAP = 14.0
_CAPTION_CHARS = 100


@dataclass
class Word:
    x0: float
    y0: float
    x1: float
    y1: float
    text: str
    block: int
    line: int


@dataclass
class Cell:
    x0: float
    y0: float
    x1: float
    y1: float
    text: str


@dataclass
class TableRow:
    raw: str  # the row's words as printed, one line: what the page's text holds
    rendered: str  # the row with its label and column headers: what its chunk says


@dataclass
class Table:
    bbox: tuple[float, float, float, float]
    units: str  # what the header row says where row labels stand: "(Millions)"
    rows: list[TableRow] = field(default_factory=list)
    words: set[int] = field(default_factory=set)  # indexes of the page's words the table holds


def page_words(page: pymupdf.Page) -> list[Word]:
    return [Word(*w[:5], w[5], w[6]) for w in page.get_text("words")]


def _cells(words: list[Word]) -> list[Cell]:
    """Words of one printed line cut into cells at wide gaps."""
    cells: list[Cell] = []
    for w in sorted(words, key=lambda w: w.x0):
        last = cells[-1] if cells else None
        if last is not None and w.x0 - last.x1 <= _CELL_GAP * max(1.0, w.y1 - w.y0):
            cells[-1] = Cell(last.x0, min(last.y0, w.y0), w.x1, max(last.y1, w.y1), f"{last.text} {w.text}")
        else:
            cells.append(Cell(w.x0, w.y0, w.x1, w.y1, w.text))
    return cells


def _visual_rows(words: list[Word]) -> list[list[Word]]:
    """Words grouped by printed row: their vertical middles within half a line of each other."""
    rows: list[list[Word]] = []
    for w in sorted(words, key=lambda w: ((w.y0 + w.y1) / 2, w.x0)):
        middle = (w.y0 + w.y1) / 2
        if rows:
            head = rows[-1][0]
            if abs(middle - (head.y0 + head.y1) / 2) <= 0.5 * max(1.0, head.y1 - head.y0):
                rows[-1].append(w)
                continue
        rows.append([w])
    return rows


def tabular_box(words: list[Word]) -> pymupdf.Rect | None:
    """Where the page's rows of values are (the finder searches only there, which is cheaper), or
    None when fewer than `_MIN_TABULAR_LINES` rows hold a label and values: no table to find."""
    rows = [r for r in _row_ids(words, set()) if _kind(words, r) == "data"]
    if len(rows) < _MIN_TABULAR_LINES:
        return None
    return pymupdf.Rect(_box([words[i] for r in rows for i in r])) + (-5, -5, 5, 5)


def _glue(cells: list[Cell]) -> list[Cell]:
    """A lone "$" joins the value after it; a lone "%" or ")" the value before it."""
    out: list[Cell] = []
    pending = ""
    for cell in cells:
        if cell.text in ("$", "\u20ac", "\u00a3", "("):
            pending += cell.text
            continue
        if cell.text in ("%", ")") and out:
            last = out[-1]
            out[-1] = Cell(last.x0, last.y0, cell.x1, last.y1, last.text + cell.text)
            continue
        out.append(Cell(cell.x0, cell.y0, cell.x1, cell.y1, pending + cell.text) if pending else cell)
        pending = ""
    return out


def _is_value(text: str) -> bool:
    return bool(_NUMBER.match(text.replace(" ", "")))


def _regions(page: pymupdf.Page, clip: pymupdf.Rect) -> list[pymupdf.Rect]:
    """The finder's table boxes, with boxes stacked within `_JOIN_GAP` of each other joined."""
    try:
        found = page.find_tables(clip=clip, use_layout=False)  # its layout model: ~7x slower a page
    except TypeError:  # a pymupdf without the layout model
        found = page.find_tables(clip=clip)
    boxes = sorted((pymupdf.Rect(t.bbox) for t in found.tables), key=lambda r: r.y0)
    joined: list[pymupdf.Rect] = []
    for box in boxes:
        for other in joined:
            across = min(box.x1, other.x1) - max(box.x0, other.x0)
            if across > 0.5 * min(box.width, other.width) and box.y0 - other.y1 <= _JOIN_GAP \
                    and other.y0 - box.y1 <= _JOIN_GAP:
                other |= box
                break
        else:
            joined.append(pymupdf.Rect(box))
    return joined


def _inside(word: Word, box: pymupdf.Rect) -> bool:
    x, y = (word.x0 + word.x1) / 2, (word.y0 + word.y1) / 2
    return box.x0 - 1 <= x <= box.x1 + 1 and box.y0 - 1 <= y <= box.y1 + 1


class PageTimeout(Exception):
    """A page's tables took longer than its bound to read (the caller reads it as plain text)."""


def find_tables(page: pymupdf.Page, words: list[Word], taken: set[int], finder: bool = False,
                deadline: float | None = None) -> list[Table]:
    """The page's tables, top to bottom; `taken`: words already used (running lines, tables).
    A table starts from a printed row of a label and values, or with `finder` from a box of
    pymupdf's line-based table finder. Past `deadline` (time.monotonic()) raises PageTimeout."""
    clip = tabular_box([w for i, w in enumerate(words) if i not in taken])
    if clip is None:
        return []
    rows = _row_ids(words, taken)
    kinds = [_kind(words, row) for row in rows]
    if finder:
        seeds = []
        for box in _regions(page, clip):
            inside = [k for k, row in enumerate(rows) if sum(_inside(words[i], box) for i in row) * 2 > len(row)]
            if inside:
                seeds.append((inside[0], inside[-1]))
    else:
        seeds = [(k, k) for k, kind in enumerate(kinds) if kind == "data"]
    tables = []
    used = -1  # rows up to this one are in a table already
    tried = -1  # rows up to this one were grown from a seed already: each row is considered once
    for first, last in seeds:
        if last <= max(used, tried if not finder else -1):
            continue
        if deadline is not None and time.monotonic() > deadline:
            raise PageTimeout
        first, last = _grow(words, rows, kinds, first, last)
        tried = last  # a seed inside rows that formed no table grows to the same rows again
        first = max(first, used + 1)
        if not finder and sum(kind == "data" for kind in kinds[first:last + 1]) < _MIN_TABULAR_LINES:
            continue
        held = [i for row in rows[first:last + 1] for i in row]
        table = _table(words, held, pymupdf.Rect(_box([words[i] for i in held])))
        if table is not None:
            taken.update(table.words)
            tables.append(table)
            used = last
    return sorted(tables, key=lambda t: t.bbox[1])


def _box(words: list[Word]) -> tuple[float, float, float, float]:
    return min(w.x0 for w in words), min(w.y0 for w in words), max(w.x1 for w in words), max(w.y1 for w in words)


def _row_ids(words: list[Word], taken: set[int]) -> list[list[int]]:
    """The page's printed rows (indexes of their words), top to bottom."""
    index = {id(w): i for i, w in enumerate(words)}
    return [[index[id(w)] for w in row] for row in _visual_rows([w for i, w in enumerate(words) if i not in taken])]


def _kind(words: list[Word], row: list[int]) -> str:
    """"data": a label and values (ending in one, values at least half its cells), or values;
    "header": several cells; "line": one cell. (Justified prose has wide gaps and a bare number
    now and then; it rarely ends in one.)"""
    cells = _glue(_cells([words[i] for i in row]))
    if len(cells) >= 2 and _is_value(cells[-1].text) \
            and 2 * sum(_is_value(c.text) for c in cells[1:]) >= len(cells) - 1:
        return "data"
    return "header" if len(cells) >= 2 else "line"


def _grow(words: list[Word], rows: list[list[int]], kinds: list[str], first: int, last: int) -> tuple[int, int]:
    """The finder's rows extended to the whole table: printed rows of values above and below, one-
    cell rows between them (section titles, wrapped labels), and the header rows on top."""
    def near(a: int, b: int) -> bool:  # rows a above b, at most about a blank line apart
        upper, lower = [words[i] for i in rows[a]], [words[i] for i in rows[b]]
        height = max(w.y1 - w.y0 for w in upper + lower)
        return min(w.y0 for w in lower) - max(w.y1 for w in upper) <= 1.5 * height

    while last + 1 < len(rows) and near(last, last + 1):
        if kinds[last + 1] == "data":
            last += 1
            continue
        # up to two one-cell rows (a section title, a label wrapped over two lines), then values
        ahead = next((k for k in range(last + 1, min(last + 4, len(rows))) if kinds[k] != "line"), None)
        if ahead is None or kinds[ahead] != "data" or not all(near(k, k + 1) for k in range(last, ahead)):
            break
        last = ahead
    headers = 0  # header rows on top: a few (column names over two or three lines), not a paragraph
    while first > 0 and near(first - 1, first):
        if kinds[first - 1] == "data" or (kinds[first - 1] == "header" and headers < _HEADER_ROWS):
            headers += kinds[first - 1] == "header"
            first -= 1
        elif first > 1 and kinds[first - 1] == "line" and kinds[first - 2] == "data" and near(first - 2, first - 1):
            first -= 2
        else:
            break
    return first, last


def _table(words: list[Word], held: list[int], box: pymupdf.Rect) -> Table | None:
    rows = [_glue(_cells(r)) for r in _visual_rows([words[i] for i in held])]
    rows = [r for r in rows if r]
    if len(rows) < 2:
        return None
    left = min(c.x0 for r in rows for c in r)
    width = max(c.x1 for r in rows for c in r) - left
    labelled = []  # (label, cells) per row
    for r in rows:
        if not _is_value(r[0].text) and r[0].x0 < left + 0.3 * width:
            labelled.append((r[0], r[1:]))
        else:
            labelled.append((None, r))
    data = [i for i, (label, cells) in enumerate(labelled) if cells and any(_is_value(c.text) for c in cells)]
    # the first row of the body has a label and values; values alone or years ("2018 2017") head columns
    first = next((i for i in data if labelled[i][0] is not None
                  and not all(_YEAR.match(c.text) for c in labelled[i][1])), None)
    if len(data) < 2 or first is None:
        return None
    columns = _columns([c for label, cells in labelled[first:] for c in cells])
    if len(columns) < 1:
        return None
    headers = [[] for _ in columns]
    units = []
    header_rows = {k for k in range(first) if labelled[k][1]}
    starts, ends = [x0 for x0, _ in columns], [x1 for _, x1 in columns]
    for label, cells in (labelled[k] for k in sorted(header_rows)):
        if label is not None:
            units.append(label.text)
        for cell in cells:
            lo, hi = bisect.bisect_right(ends, cell.x0), bisect.bisect_left(starts, cell.x1)
            over = [k for k in range(lo, hi) if min(cell.x1, columns[k][1]) - max(cell.x0, columns[k][0]) > 0]
            for k in over or [_column_of(cell, columns, (starts, ends))]:
                headers[k].append(cell.text)
    names = [" ".join(h) for h in headers]
    table = Table(bbox=(box.x0, min(words[i].y0 for i in held), box.x1, box.y1), units=" ".join(units),
                  words=set(held))
    for k, (label, cells) in enumerate(labelled):
        if k in header_rows:
            printed = [label.text] if label else []
            printed += [c.text for c in cells]
            table.rows.append(TableRow(" ".join(printed) + "\n", " | ".join(printed) + "\n"))
            continue
        raw = " ".join(c.text for c in ([label] if label else []) + cells)
        parts = [label.text if label else ""]
        for cell in cells:
            name = names[_column_of(cell, columns, (starts, ends))]
            parts.append(f"{name}: {cell.text}" if name and name != cell.text else cell.text)
        table.rows.append(TableRow(raw + "\n", " | ".join(parts) + "\n"))
    return table


def _columns(cells: list[Cell]) -> list[tuple[float, float]]:
    """Column extents: the x-ranges of the value cells merged where they overlap."""
    spans = sorted((c.x0, c.x1) for c in cells)
    merged: list[list[float]] = []
    for x0, x1 in spans:
        if merged and x0 <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], x1)
        else:
            merged.append([x0, x1])
    return [(a, b) for a, b in merged]


def _column_of(cell: Cell, columns: list[tuple[float, float]], edges: tuple | None = None) -> int:
    """The column the cell overlaps most, else the nearest (a centred "2018" over right-aligned figures).
    Columns are disjoint and sorted: only those it overlaps and the nearest on each side can win."""
    starts, ends = edges or ([x0 for x0, _ in columns], [x1 for _, x1 in columns])
    lo = max(0, bisect.bisect_right(ends, cell.x0) - 1)
    hi = min(len(columns), bisect.bisect_left(starts, cell.x1) + 1)
    return max(range(lo, hi), key=lambda k: min(cell.x1, columns[k][1]) - max(cell.x0, columns[k][0]))


def caption_above(lines: list[tuple[float, float, float, float, str]], table: Table) -> str:
    """The printed lines directly above a table (its title and units), top to bottom. `lines`:
    (x0, y0, x1, y1, text) of the page's lines outside tables."""
    x0, top, x1, _ = table.bbox
    found = []
    for lx0, ly0, lx1, ly1, text in sorted(lines, key=lambda line: -line[3]):
        if ly1 > top + 1 or lx1 < x0 or lx0 > x1:
            continue
        if top - ly1 > _CAPTION_GAP or len(found) >= _CAPTION_LINES or len(text) > _CAPTION_CHARS:
            break  # a line of prose above ends the caption
        found.append(text)
        top = ly0
    return " ".join(reversed(found))
