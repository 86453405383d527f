"""Turn a file into parsed documents; pick the parser from --kind or the file itself."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from ...defaults import KINDS  # defined there for the CLI's options
from ...errors import InputError
from .base import ParsedDocument, Segment, TextBuilder
from .dialogue import looks_like_transcript, parse_json_dialogue, parse_jsonl_dialogue, parse_transcript
from .text import HEAD_BYTES, check_not_binary, parse_book, parse_epub, read_text

SUPPORTED_SUFFIXES = (".txt", ".md", ".markdown", ".epub", ".pdf", ".json", ".jsonl")

__all__ = ["ParsedDocument", "Segment", "TextBuilder", "parse_file", "read_file", "collect_files",
           "SUPPORTED_SUFFIXES", "KINDS"]


def _check_regular_file(path: Path) -> None:
    if not path.exists():
        raise InputError("no such file", "check the path", path=str(path))
    if not path.is_file():
        raise InputError("not a regular file", "give a file or a directory", path=str(path))


def read_file(path: Path, kind: str = "auto") -> bytes:
    """A file's bytes, read once, so that the caller hashes exactly what `parse_file` parses. A
    file read as text whose first bytes look binary is refused before the rest is read."""
    _check_regular_file(path)
    with open(path, "rb") as handle:
        if not (path.suffix.lower() in (".pdf", ".epub") or kind == "pdf"):
            check_not_binary(path, handle.read(HEAD_BYTES))
            handle.seek(0)
        return handle.read()


def parse_file(path: Path, kind: str = "auto", warnings: list[str] | None = None, data: bytes | None = None,
               on_progress: Callable[[int, int], None] | None = None,
               pdf_reader: str = "tables") -> list[ParsedDocument]:
    """Parse one file into one or more documents (a LoCoMo JSON file holds several conversations),
    from `data`, its bytes, when read already (`read_file`). `on_progress(done, total)` is called
    while a long file is read (an EPUB's chapters), so a caller can show it or stop there.
    `pdf_reader`: how a PDF is read (Settings.pdf_reader)."""
    warnings = warnings if warnings is not None else []
    suffix = path.suffix.lower()
    if data is None:
        _check_regular_file(path)
    if suffix == ".pdf" or kind == "pdf":
        if suffix == ".pdf" and kind not in ("auto", "pdf"):
            raise InputError(f"a PDF cannot be read as {kind}", "use --kind auto or pdf", path=str(path))
        if suffix == ".epub":
            raise InputError("an EPUB cannot be read as pdf", "use --kind auto or book", path=str(path))
        from .pdf import parse_pdf, read_with_pymupdf  # pymupdf takes ~1 s to import; a daemon client needs none of it

        return [read_with_pymupdf(lambda p: parse_pdf(p, data, pdf_reader), path, "pdf", warnings)]
    if suffix == ".epub":
        if kind == "dialogue":
            raise InputError("an EPUB cannot be read as a dialogue", "use --kind auto or book", path=str(path))
        return [parse_epub(path, data, on_progress)]
    text = read_text(path, warnings, data)
    if suffix == ".json":
        if kind == "book":
            return [parse_book(path, text)]
        return _refuse_lone_surrogates(path, text, parse_json_dialogue(path, text))
    if suffix == ".jsonl":
        if kind == "book":
            return [parse_book(path, text)]
        return _refuse_lone_surrogates(path, text, parse_jsonl_dialogue(path, text))
    if kind == "dialogue" or (kind == "auto" and suffix not in (".md", ".markdown") and looks_like_transcript(text)):
        return [parse_transcript(path, text)]
    return [parse_book(path, text)]


_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _refuse_lone_surrogates(path: Path, raw: str, docs: list[ParsedDocument]) -> list[ParsedDocument]:
    """JSON's "\\ud800" escape without its pair decodes to a lone surrogate: not a character, so
    neither the tokenizer nor the store (UTF-8) can take it."""
    for doc in docs:
        for text in (doc.text, doc.title, doc.part):
            found = _SURROGATE.search(text)
            if found:
                escape = f"\\u{ord(found.group()):04x}"
                at = raw.lower().find(escape)
                where = f" at line {raw.count(chr(10), 0, at) + 1}" if at >= 0 else ""
                raise InputError(
                    f"the JSON holds a lone UTF-16 surrogate escape {escape}{where}, which is not a character",
                    "fix that escape in the file (a high surrogate needs its low pair), then ingest it again",
                    path=str(path))
    return docs


def collect_files(target: Path) -> list[Path]:
    """A file as given, or the supported files under a directory (hidden ones skipped), sorted."""
    if not target.exists():
        raise InputError("no such file or directory", "check the path", path=str(target))
    if target.is_file():
        return [target]
    if not target.is_dir():  # a pipe or device: reading it could block or never end
        raise InputError("not a regular file or directory", "give a file or a directory", path=str(target))
    found = sorted(
        p
        for p in target.rglob("*")
        if p.is_file()
        and p.suffix.lower() in SUPPORTED_SUFFIXES
        and not any(part.startswith(".") for part in p.relative_to(target).parts)
    )
    if not found:
        raise InputError(
            "the directory has no supported files",
            f"evsel reads {', '.join(SUPPORTED_SUFFIXES)}",
            path=str(target),
        )
    return found
