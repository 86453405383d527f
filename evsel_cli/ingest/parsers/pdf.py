"""PDF through pymupdf. Pages keep their 1-based numbers. (EPUB is read in text.py.)"""

from __future__ import annotations

import html
import re
import time
from pathlib import Path

import pymupdf

from ...errors import InputError
from .base import ParsedDocument, TextBuilder
from .pdf_layout import build_text, read_page, running_lines
from .pdf_tables import page_words

pymupdf.TOOLS.mupdf_display_errors(False)  # its own warnings go to stderr; ours say what to do

# mupdf's own exceptions (FzErrorBase) derive from Exception only; pymupdf asserts on some files
# (page labels of an HTML file opened as a PDF)
_PYMUPDF_ERRORS = (pymupdf.FileDataError, pymupdf.EmptyFileError, pymupdf.mupdf.FzErrorBase, RuntimeError, ValueError,
                   AssertionError)
_MUPDF_CODE = re.compile(r"^code=\d+:\s*")


def _reason(exc: BaseException) -> str:
    """mupdf's words for a failure ("too deep xml element nesting"), without its "code=8: "."""
    text = _MUPDF_CODE.sub("", str(exc)).strip()
    return text or type(exc).__name__


def read_with_pymupdf(parse, path: Path, filetype: str, warnings: list[str] | None = None):
    """`parse(path)` (parse_pdf, parse_epub) with any failure of pymupdf's on a bad file said in
    one line, and mupdf's repairs of a damaged PDF (a truncated download opens with fewer pages or
    less text) reported in `warnings`: the text stored may be incomplete."""
    pymupdf.TOOLS.reset_mupdf_warnings()
    try:
        doc = parse(path)
    except InputError:
        raise
    except (*_PYMUPDF_ERRORS, RecursionError) as exc:
        raise InputError(f"cannot read this {filetype.upper()} ({_reason(exc)}): it is damaged or malformed",
                         "re-export or re-download the file", path=str(path)) from exc
    if warnings is not None:
        said = pymupdf.TOOLS.mupdf_warnings() or ""
        if "repair" in said:
            first = next(line for line in said.splitlines() if line.strip())
            warnings.append(f"{path}: the {filetype.upper()} is damaged and mupdf repaired it ({first}); some text "
                            f"may be missing ({len(doc.text)} characters read), re-download or re-export the file")
    return doc

# A page's tables are read within this many seconds; a page past it is read as lines of text (a
# crafted page of value rows must not hold the daemon's queue)
PAGE_SECONDS = 5.0
_HYPHEN_BREAK = re.compile(r"(\w)-\n(\w)")
_TRAILING_SPACE = re.compile(r"[ \t]+\n")


def _open(path: Path, filetype: str, data: bytes | None = None) -> pymupdf.Document:
    if (path.stat().st_size if data is None else len(data)) == 0:
        raise InputError("the file is empty", "give a non-empty file", path=str(path))
    damaged = InputError(
        f"cannot read this {filetype.upper()}: it is damaged or not {'an' if filetype.lower() == 'epub' else 'a'} "
        f"{filetype.upper()} file",
        "re-export or re-download the file",
        path=str(path),
    )
    try:
        doc = pymupdf.open(str(path), filetype=filetype) if data is None else pymupdf.open(stream=data,
                                                                                           filetype=filetype)
    except _PYMUPDF_ERRORS as exc:
        raise damaged from exc
    if filetype == "pdf" and not doc.is_pdf:  # mupdf reads by content: HTML or an image named .pdf
        found = (doc.metadata or {}).get("format") or "something else"
        doc.close()
        raise InputError(f"this is not a PDF file: it holds {found}",
                         "give it its real extension, or convert it to PDF", path=str(path))
    if doc.needs_pass:
        doc.close()
        raise InputError(
            f"the {filetype.upper()} is encrypted with a password",
            "decrypt it first (for example: qpdf --decrypt --password=... in.pdf out.pdf)",
            path=str(path),
        )
    if doc.page_count == 0:  # a truncated download opens "repaired" with no pages
        doc.close()
        raise damaged
    return doc


def clean_page_text(text: str) -> str:
    """Join words hyphenated across line ends and drop trailing spaces; keep line structure."""
    text = text.replace("\r\n", "\n").replace("\x00", "")
    text = _HYPHEN_BREAK.sub(r"\1\2", text)
    return _TRAILING_SPACE.sub("\n", text)


def parse_pdf(path: Path, data: bytes | None = None, reader: str = "tables") -> ParsedDocument:
    """A PDF (from `data`, its bytes, when read already). `reader` "tables" (pdf_layout.py): the
    text in reading order without running headers and footers, tables as rows that name their
    columns; "finder": the same with pymupdf's table finder locating tables; "plain": each page's
    text as pymupdf extracts it, one segment a page."""
    doc = _open(path, "pdf", data)
    try:
        builder = TextBuilder()
        labels = {}
        n_pages = doc.page_count
        layout = []  # tables: (page, its words) until the running lines are known
        for index in range(n_pages):
            try:
                page = doc.load_page(index)
                if reader == "plain":
                    text = clean_page_text(page.get_text("text"))
                else:
                    layout.append((page, page_words(page)))
            except _PYMUPDF_ERRORS as exc:  # "page not in document": the PDF claims more pages than it has
                raise _page_error(path, index, n_pages, exc) from exc
            label = page.get_label() if hasattr(page, "get_label") else ""
            if label and label != str(index + 1):
                labels[str(index + 1)] = label
            if reader == "plain" and text.strip():
                if not text.endswith("\n"):
                    text += "\n"
                builder.add(text + "\n", page=index + 1)
        extra = _read_layout(path, layout, builder, reader) if reader != "plain" else {}
        meta = doc.metadata or {}
        title = pdf_title(meta, _xmp(doc), path)
    finally:
        doc.close()
    if not builder.segments:
        raise InputError(
            f"no extractable text in {n_pages} page(s): it looks scanned or image-only",
            "OCR is not supported; run OCR first (for example ocrmypdf) and ingest its output",
            path=str(path),
        )
    metadata = {"pages": n_pages, "author": (meta.get("author") or "").strip(), "reader": reader, **extra}
    if labels:
        metadata["page_labels"] = labels
    return ParsedDocument(text=builder.text(), kind="pdf", title=title, segments=builder.segments, metadata=metadata)


def _page_error(path: Path, index: int, n_pages: int, exc: BaseException) -> InputError:
    return InputError(f"cannot extract text from page {index + 1} of {n_pages} ({_reason(exc)}): the PDF is damaged",
                      "re-export or re-download the PDF", path=str(path))


def _read_layout(path: Path, pages: list, builder: TextBuilder, reader: str) -> dict:
    """The layout reader's pages into `builder`; what it found (tables, dropped running lines)."""
    dropped, texts = running_lines([words for _, words in pages])
    blocks = []
    plain = []  # pages whose tables were not read within PAGE_SECONDS
    for index, ((page, words), drop) in enumerate(zip(pages, dropped)):
        try:
            read, tables = read_page(page, words, drop, finder=reader == "finder",
                                     deadline=time.monotonic() + PAGE_SECONDS)
        except _PYMUPDF_ERRORS as exc:
            raise _page_error(path, index, len(pages), exc) from exc
        blocks.append(read)
        if tables is None:
            plain.append(index + 1)
    tables = build_text(blocks, builder)
    extra: dict = {"tables": tables}
    if plain:
        extra["pages_read_as_text"] = {"pages": plain, "seconds": PAGE_SECONDS}
    if texts:
        extra["dropped_lines"] = {"count": sum(texts.values()), "lines": [t for t, _ in texts.most_common(10)]}
    return extra


# what writers put in the title field when the user gave none
_PLACEHOLDER_TITLE = re.compile(r"^(untitled|no title|title|document\d*|microsoft word|unknown)$", re.I)
_WORD_PREFIX = re.compile(r"^microsoft (word|powerpoint|excel) - ", re.I)
_XMP_TITLE = re.compile(r"<dc:title>.*?<rdf:li[^>]*>(.*?)</rdf:li>", re.S)


def _xmp(doc: pymupdf.Document) -> str:
    try:
        return doc.get_xml_metadata() or ""
    except _PYMUPDF_ERRORS:
        return ""


def pdf_title(info: dict, xmp: str, path: Path) -> str:
    """The title from the PDF's document information, else its XMP dc:title, else the file name.
    Placeholders ("Untitled") and a file name a writer put there ("Microsoft Word - x.docx") do not count."""
    found = _XMP_TITLE.search(xmp)
    xmp_title = html.unescape(found.group(1)) if found else ""
    for candidate in (info.get("title") or "", xmp_title):
        candidate = " ".join(_WORD_PREFIX.sub("", candidate).split())
        if not candidate or _PLACEHOLDER_TITLE.match(candidate):
            continue
        if re.search(r"\.(docx?|pptx?|odt|rtf|tex|pdf)$", candidate, re.I):
            continue
        return candidate
    return path.stem.replace("_", " ")
