"""Plain text, Markdown and EPUB books: bytes to text with honest decoding."""

from __future__ import annotations

import codecs
import io
import posixpath
import re
import zipfile
from html.parser import HTMLParser
from pathlib import Path
from typing import Callable
from urllib.parse import unquote
from xml.etree import ElementTree

from ...errors import InputError
from .base import ParsedDocument, TextBuilder

# Control characters other than tab, newline, carriage return and form feed mark binary data.
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0e-\x1f]")
HEAD_BYTES = 65536  # what the binary check looks at


def check_not_binary(path: Path, head: bytes) -> None:
    """Refuse a file whose first bytes look binary (UTF-16 with a byte order mark is text)."""
    if head[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
        return
    head = head[:HEAD_BYTES]
    if b"\x00" in head or len(_CONTROL.findall(head)) > max(8, len(head) // 100):
        raise InputError(
            "this looks like a binary file, not text",
            "ingest .txt, .md, .epub, .pdf, .json or .jsonl files",
            path=str(path),
        )


def read_text(path: Path, warnings: list[str], data: bytes | None = None) -> str:
    """A text file's text (from `data`, its bytes, when read already); reject empty and binary
    files; fall back from UTF-8 and say so."""
    if data is None:
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
    check_not_binary(path, data[2:HEAD_BYTES + 2] if data[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE) else data)
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


# EPUB: a zip of XHTML chapters in the order of its OPF spine, read here in one linear pass per
# chapter. (pymupdf lays a chapter out page by page and re-walks it for every page: quadratic,
# 13.6 s for a 2 MB chapter, inside one call that no progress event or cancellation can reach.)

Progress = Callable[[int, int], None]
_PROGRESS_EVERY = 1 << 18  # characters of markup between progress reports
# elements whose start or end breaks a paragraph
_BLOCK_TAGS = frozenset({
    "address", "article", "aside", "blockquote", "body", "caption", "dd", "div", "dl", "dt", "figcaption",
    "figure", "footer", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr", "li", "main", "nav", "ol", "p",
    "pre", "section", "table", "td", "th", "tr", "ul",
})
_HIDDEN_TAGS = frozenset({"head", "script", "style", "template", "svg", "math"})  # no reading text inside
_SPACES = re.compile(r"\s+")
_XML_ENCODING = re.compile(rb"""^\s*<\?xml[^>]*encoding=["']([A-Za-z0-9._-]+)["']""")


class _ChapterText(HTMLParser):
    """A chapter's reading text: one paragraph per block element, whitespace collapsed as a
    browser does (kept inside <pre>), line breaks at <br>. `tick(n)` is called with the size of
    each piece of markup read, so a long chapter reports progress (and can be cancelled) as it goes."""

    def __init__(self, tick: Callable[[int], None]):
        super().__init__(convert_charrefs=True)
        self.tick = tick
        self.paragraphs: list[str] = []
        self.parts: list[str] = []
        self.hidden = 0
        self.pre = 0

    def _break(self) -> None:
        text = "".join(self.parts)
        self.parts = []
        lines = [line.rstrip() if self.pre else line.strip() for line in text.split("\n")]
        text = "\n".join(line for line in lines if line.strip()) if not self.pre else text.strip("\n")
        if text.strip():
            self.paragraphs.append(text)

    def handle_starttag(self, tag: str, attrs) -> None:
        self.tick(len(tag) + 2)
        if tag in _HIDDEN_TAGS:
            self.hidden += 1
        elif tag == "br":
            self.parts.append("\n")
        elif tag in _BLOCK_TAGS:
            self._break()
            self.pre += tag == "pre"

    def handle_endtag(self, tag: str) -> None:
        self.tick(len(tag) + 3)
        if tag in _HIDDEN_TAGS:
            self.hidden = max(0, self.hidden - 1)
        elif tag in _BLOCK_TAGS:
            self._break()
            if tag == "pre":
                self.pre = max(0, self.pre - 1)

    def handle_data(self, data: str) -> None:
        self.tick(len(data))
        if not self.hidden:
            self.parts.append(data if self.pre else _SPACES.sub(" ", data))

    def text(self) -> str:
        self.close()
        self._break()
        return "\n\n".join(self.paragraphs)


def _epub_damaged(path: Path, why: str = "") -> InputError:
    return InputError(f"cannot read this EPUB: it is damaged or not an EPUB file{f' ({why})' if why else ''}",
                      "re-export or re-download the file", path=str(path))


def _decode_markup(raw: bytes) -> str:
    if raw[:2] in (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE):
        return raw.decode("utf-16", errors="replace")
    declared = _XML_ENCODING.match(raw[:200])
    try:
        return raw.decode(declared.group(1).decode("ascii") if declared else "utf-8", errors="replace")
    except LookupError:  # an encoding Python does not know
        return raw.decode("utf-8", errors="replace")


def _spine(path: Path, book: zipfile.ZipFile) -> tuple[list[str], dict[str, str]]:
    """The chapters' names inside the zip, in reading order, and the book's title and author."""
    try:
        container = ElementTree.fromstring(book.read("META-INF/container.xml"))
        rootfile = container.find(".//{*}rootfile")
        opf_name = unquote(rootfile.get("full-path", "")) if rootfile is not None else ""
        package = ElementTree.fromstring(book.read(opf_name))
    except KeyError as exc:
        raise _epub_damaged(path, f"{exc.args[0] if exc.args else 'a file'} is missing") from None
    except ElementTree.ParseError as exc:
        raise _epub_damaged(path, f"its package file is not XML: {exc}") from None
    base = posixpath.dirname(opf_name)
    manifest = {item.get("id"): item for item in package.iterfind("{*}manifest/{*}item")}
    chapters = []
    for ref in package.iterfind("{*}spine/{*}itemref"):
        item = manifest.get(ref.get("idref"))
        if item is None or "html" not in (item.get("media-type") or "") or not item.get("href"):
            continue  # an image or a missing entry: no text
        chapters.append(posixpath.normpath(posixpath.join(base, unquote(item.get("href").split("#")[0]))))
    meta = {}
    for key, tag in (("title", "title"), ("author", "creator")):
        found = package.find(f"{{*}}metadata/{{*}}{tag}")
        meta[key] = (found.text or "").strip() if found is not None else ""
    return chapters, meta


def _encrypted(book: zipfile.ZipFile, chapters: list[str]) -> bool:
    """Whether a chapter is encrypted (DRM); fonts alone may be obfuscated, which is fine."""
    try:
        encryption = ElementTree.fromstring(book.read("META-INF/encryption.xml"))
    except (KeyError, ElementTree.ParseError):
        return False
    names = {unquote(ref.get("URI", "")) for ref in encryption.iterfind(".//{*}CipherReference")}
    return any(chapter in names for chapter in chapters)


def parse_epub(path: Path, data: bytes | None = None, on_progress: Progress | None = None) -> ParsedDocument:
    """An EPUB as a book (from `data`, its bytes, when read already): one segment per chapter of
    its spine. Reflowed pages carry no stable page numbers, so none are kept. `on_progress(done,
    total)` counts characters of the chapters' markup."""
    if data is None:
        data = path.read_bytes()
    if not data:
        raise InputError("the file is empty", "give a non-empty file", path=str(path))
    try:
        book = zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError):
        raise _epub_damaged(path) from None
    with book:
        chapters, meta = _spine(path, book)
        if _encrypted(book, chapters):
            raise InputError("the EPUB is encrypted (DRM)", "evsel reads only DRM-free books; export a DRM-free copy "
                             "from where you got it", path=str(path))
        sizes = {info.filename: info.file_size for info in book.infolist()}
        total = sum(sizes.get(name, 0) for name in chapters) or 1
        builder = TextBuilder()
        done = 0
        reported = 0

        def tick(n: int) -> None:
            nonlocal done, reported
            done += n
            if on_progress is not None and done - reported >= _PROGRESS_EVERY:
                reported = done
                on_progress(min(done, total), total)

        for name in chapters:
            try:
                raw = book.read(name)
            except KeyError:
                continue  # listed but absent: readers skip it too
            except (zipfile.BadZipFile, OSError, ValueError, NotImplementedError, EOFError) as exc:
                raise _epub_damaged(path, f"{name}: {exc}") from None
            reader = _ChapterText(tick)
            reader.feed(_decode_markup(raw).replace("\x00", "").replace("\xad", ""))
            del raw
            text = reader.text()
            if text.strip():
                builder.add(text + "\n\n")
    if on_progress is not None:
        on_progress(total, total)
    if not builder.segments:
        raise InputError("the EPUB has no text", "check the file in an e-book reader", path=str(path))
    title = meta["title"] or path.stem.replace("_", " ")
    return ParsedDocument(text=builder.text(), kind="book", title=title, segments=builder.segments,
                          metadata={"author": meta["author"]})
