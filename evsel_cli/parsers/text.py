"""Plain text and Markdown books: bytes to text with honest decoding."""

from __future__ import annotations

import codecs
import re
from pathlib import Path

from ..errors import InputError
from .base import ParsedDocument, TextBuilder

# Control characters other than tab, newline, carriage return and form feed mark binary data.
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0e-\x1f]")


def read_text(path: Path, warnings: list[str]) -> str:
    """Read a text file; reject empty and binary files; fall back from UTF-8 and say so."""
    data = path.read_bytes()
    if not data.strip():
        raise InputError("the file is empty", "give a file with some text in it", path=str(path))
    if data[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):  # full of NUL bytes, yet text
        try:
            text = data.decode("utf-16")
        except UnicodeDecodeError:
            pass
        else:
            warnings.append(f"{path}: not UTF-8 but UTF-16 (it has a byte order mark); decoded as UTF-16, "
                            "convert the file to UTF-8 to silence this")
            return _normalise(path, text)
    head = data[:65536]
    if b"\x00" in head or len(_CONTROL.findall(head)) > max(8, len(head) // 100):
        raise InputError(
            "this looks like a binary file, not text",
            "ingest .txt, .md, .epub, .pdf, .json or .jsonl files",
            path=str(path),
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        try:
            text = data.decode("cp1252")
            encoding = "cp1252"
        except UnicodeDecodeError:
            text = data.decode("latin-1")
            encoding = "latin-1"
        warnings.append(
            f"{path}: not valid UTF-8 (byte {exc.start}); decoded as {encoding}, "
            "check the text or convert the file to UTF-8"
        )
    return _normalise(path, text)


def _normalise(path: Path, text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if not text.strip():
        raise InputError("the file has no text", "give a file with some text in it", path=str(path))
    return text


_MD_HEADING = re.compile(r"^#{1,6} ", re.M)


_ATX_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(```|~~~)")


def guess_title(text: str, path: Path) -> str:
    """A Markdown file's front-matter title or first heading (any level, outside code fences); a
    text file's "# " or "Title:" line near the top; else the file name."""
    lines = text.splitlines()
    if path.suffix.lower() in (".md", ".markdown"):
        title = _markdown_title(lines)
        if title:
            return title
    for line in lines[:40]:
        stripped = line.strip()
        if stripped.startswith("# ") and stripped[2:].strip():
            return stripped[2:].strip()
    for line in lines[:40]:
        stripped = line.strip()
        if stripped.lower().startswith("title:") and stripped[6:].strip():
            return stripped[6:].strip().strip("\"'")
    return path.stem.replace("_", " ")


def _markdown_title(lines: list[str]) -> str:
    start = 0
    if lines and lines[0].strip() == "---":  # YAML front matter: its title wins
        for index, line in enumerate(lines[1:], 1):
            if line.strip() in ("---", "..."):
                start = index + 1
                break
            if line.lower().startswith("title:") and line[6:].strip():
                return line[6:].strip().strip("\"'")
    in_fence = False
    for index in range(start, len(lines)):
        line = lines[index]
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        if in_fence:
            continue
        match = _ATX_HEADING.match(line)
        if match:
            return match.group(1).strip()
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if line.strip() and _SETEXT_UNDERLINE.match(following) and not _SETEXT_UNDERLINE.match(line):
            return line.strip()
    return ""


def parse_book(path: Path, text: str) -> ParsedDocument:
    """A book: one segment per Markdown section, so chunks start at headings."""
    builder = TextBuilder()
    markdown = path.suffix.lower() in (".md", ".markdown")
    starts = [m.start() for m in _MD_HEADING.finditer(text)] if markdown else []
    bounds = [0] + [s for s in starts if s > 0] + [len(text)]
    for index, (start, end) in enumerate(zip(bounds, bounds[1:])):
        builder.add(text[start:end], break_before=index > 0)
    doc = ParsedDocument(text=text, kind="book", title=guess_title(text, path), segments=builder.segments)
    return doc
