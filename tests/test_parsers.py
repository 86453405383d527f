"""Parsers on real files read in place from ../shared/data and on files the tests make."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pymupdf
import pytest

from helpers import shared_data
from evsel.ingest.chunker import chunk_document
from evsel.errors import InputError
from evsel.ingest.parsers import collect_files, parse_file
from evsel.paths import sample_story_path


def one(path: Path, kind: str = "auto", warnings: list[str] | None = None):
    docs = parse_file(path, kind, warnings)
    assert len(docs) == 1
    docs[0].check()
    return docs[0]


def chunk_at(chunks, position: int):
    [chunk] = [c for c in chunks if c.start <= position < c.end]
    return chunk.record()


def segment_at(doc, position: int):
    [segment] = [s for s in doc.segments if s.start <= position < s.end]
    return segment


# PDFs


@pytest.mark.parametrize(
    ("needle", "page"),
    [
        ("Surveying the Landscape", 1),
        ("labor-intensive and time-consuming", 7),
        ("Factpegasus", 22),
    ],
)
def test_mmlongbench_pdf_keeps_page_numbers(backbone_tokenizer, needle, page):
    path = shared_data("mmlongbench_doc", "documents", "tacl_a_00660.pdf")
    with pymupdf.open(path) as pdf:  # the needle is on that page (1-based) and nowhere else
        assert [i + 1 for i in range(pdf.page_count) if needle in pdf[i].get_text()] == [page]
        n_pages = pdf.page_count
    doc = one(path)
    assert doc.kind == "pdf" and doc.metadata["pages"] == n_pages == 23
    position = doc.text.index(needle)
    assert doc.text.count(needle) == 1
    assert segment_at(doc, position).page == page
    record = chunk_at(chunk_document(doc, backbone_tokenizer), position)
    assert record["page_start"] == page
    assert record["page_start"] <= record["page_end"] <= n_pages


@pytest.mark.parametrize("reader", ["tables", "plain"])
def test_mmlongbench_pdf_pages_in_order_and_complete(reader):
    path = shared_data("mmlongbench_doc", "documents", "2023.acl-long.386.pdf")
    doc = parse_file(path, pdf_reader=reader)[0]
    pages = [s.page for s in doc.segments]
    assert pages == sorted(pages)
    if reader == "plain":  # one segment a page; the tables reader gives each table row its own
        assert len(set(pages)) == len(pages)
    with pymupdf.open(path) as pdf:
        assert sorted(set(pages)) == [i + 1 for i in range(pdf.page_count) if pdf[i].get_text().strip()]
        # each page's segments hold its words (its printed number aside: a running line; control glyphs aside)
        for page in set(pages):
            held = [s for s in doc.segments if s.page == page]
            words = [w for w in pdf[page - 1].get_text().split() if not w.isdigit() and w.isprintable()][:5]
            assert all(w.rstrip("-") in doc.text[held[0].start:held[-1].end] for w in words)
    # printed page labels (journal page numbers) are kept beside the viewer's numbers
    assert doc.metadata["page_labels"]["1"] != "1"


def make_pdf(path: Path, pages: list[str | None], title: str = "") -> Path:
    pdf = pymupdf.open()
    for text in pages:
        page = pdf.new_page()
        if text:
            page.insert_text((72, 72), text, fontsize=11)
    if title:
        pdf.set_metadata({"title": title, "author": "A. Keeper"})
    pdf.save(path)
    pdf.close()
    return path


def test_generated_pdf_pages_titles_and_hyphens(tmp_path, backbone_tokenizer):
    body = "Page marker {n}. The keeper wrote in the light-\nhouse log on page {n}.\nA second line here."
    path = make_pdf(
        tmp_path / "log.pdf",
        [body.format(n=1), body.format(n=2), None, body.format(n=4), body.format(n=5)],
        title="Keeper's Log",
    )
    doc = one(path)
    assert doc.title == "Keeper's Log"
    assert doc.metadata["pages"] == 5 and doc.metadata["author"] == "A. Keeper"
    # the blank page 3 leaves no segment, and later pages keep their own numbers
    assert [s.page for s in doc.segments] == [1, 2, 4, 5]
    assert "lighthouse log" in doc.text and "light-" not in doc.text
    for n in (1, 2, 4, 5):
        position = doc.text.index(f"Page marker {n}.")
        assert segment_at(doc, position).page == n
    chunks = chunk_document(doc, backbone_tokenizer, budget=20)
    assert "".join(c.text for c in chunks) == doc.text
    for n in (1, 2, 4, 5):
        record = chunk_at(chunks, doc.text.index(f"Page marker {n}."))
        assert record["page_start"] <= n <= record["page_end"]
        assert record["page_end"] - record["page_start"] <= 2  # page 3 is empty
    # a chunk that begins with a page's text begins on that page
    starts = {c.record()["page_start"] for c in chunks if c.text.startswith("Page marker")}
    assert starts <= {1, 2, 4, 5} and 1 in starts
    whole = chunk_document(doc, backbone_tokenizer, budget=1000)
    assert [(c.record()["page_start"], c.record()["page_end"]) for c in whole] == [(1, 5)]


def test_pdf_title_falls_back_to_the_file_name(tmp_path):
    path = make_pdf(tmp_path / "harbour_notes.pdf", ["Some text on the only page."])
    assert one(path).title == "harbour notes"


# EPUB


def make_epub(path: Path, title: str, chapters: list[tuple[str, str]]) -> Path:
    """A minimal EPUB 2 (pymupdf reads EPUB but cannot write one)."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(zipfile.ZipInfo("mimetype"), "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        z.writestr(
            "META-INF/container.xml",
            '<?xml version="1.0"?><container version="1.0" '
            'xmlns="urn:oasis:names:tc:opendocument:xmlns:container"><rootfiles>'
            '<rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
            "</rootfiles></container>",
        )
        items = "".join(
            f'<item id="c{i}" href="c{i}.xhtml" media-type="application/xhtml+xml"/>' for i in range(len(chapters))
        )
        spine = "".join(f'<itemref idref="c{i}"/>' for i in range(len(chapters)))
        z.writestr(
            "OEBPS/content.opf",
            '<?xml version="1.0"?><package xmlns="http://www.idpf.org/2007/opf" version="2.0" '
            'unique-identifier="id"><metadata xmlns:dc="http://purl.org/dc/elements/1.1/">'
            f'<dc:title>{title}</dc:title><dc:creator>A. Writer</dc:creator><dc:identifier id="id">x</dc:identifier>'
            f"<dc:language>en</dc:language></metadata><manifest>{items}</manifest><spine>{spine}</spine></package>",
        )
        for i, (heading, body) in enumerate(chapters):
            z.writestr(
                f"OEBPS/c{i}.xhtml",
                '<?xml version="1.0"?><html xmlns="http://www.w3.org/1999/xhtml"><head>'
                f"<title>{heading}</title></head><body><h1>{heading}</h1><p>{body}</p></body></html>",
            )
    return path


def test_epub_is_read_as_a_book(tmp_path, backbone_tokenizer):
    path = make_epub(
        tmp_path / "keeper.epub",
        "The Keeper",
        [("Chapter One", "The keeper saw the boat. It was late."),
         ("Chapter Two", "The inspector found the brass key under the mat.")],
    )
    doc = one(path)
    assert doc.kind == "book" and doc.title == "The Keeper"
    assert doc.text.index("Chapter One") < doc.text.index("brass key under the mat")
    assert all(s.page is None for s in doc.segments)  # reflowed pages are not stable page numbers
    chunks = chunk_document(doc, backbone_tokenizer)
    assert "".join(c.text for c in chunks) == doc.text


def test_epub_text_follows_the_spine_with_paragraphs_and_without_markup(tmp_path):
    path = make_epub(tmp_path / "keeper.epub", "The Keeper", [
        ("Chapter Two",
         "Second <b>bold</b>\n   words &amp; more.</p><script>var x = 1;</script><p>Next line<br/>broken."),
        ("Chapter One", "First."),
    ])
    doc = one(path)
    assert doc.metadata["author"] == "A. Writer"
    assert doc.text.index("Second bold words & more.") < doc.text.index("First.")  # spine order, not name order
    assert "Next line\nbroken." in doc.text and "<" not in doc.text and "var x" not in doc.text
    assert "Chapter Two\n\nSecond" in doc.text  # a heading is a paragraph of its own
    assert len(doc.segments) == 2


def test_a_long_epub_chapter_reports_progress_and_can_be_stopped(tmp_path):
    """A 2 MB chapter took 13.6 s in one uninterruptible call (pymupdf, quadratic in the chapter).
    Now it is read in one pass that reports progress, and raising from the progress callback
    (how a daemon job is cancelled) stops the reading there."""
    paragraph = "The keeper of Gull Point was Silas Quint, and he kept the light burning every night. "
    path = make_epub(tmp_path / "long.epub", "Long", [("Chapter", "</p><p>".join([paragraph] * 25_000))])
    reports = []
    doc = parse_file(path, on_progress=lambda done, total: reports.append((done, total)))[0]
    assert doc.text.count("Silas Quint") == 25_000
    assert len(reports) >= 4 and reports[-1][0] == reports[-1][1]
    assert [d for d, _ in reports] == sorted(d for d, _ in reports)

    class Stop(BaseException):
        pass

    def stop(done: int, total: int) -> None:
        raise Stop

    with pytest.raises(Stop):
        parse_file(path, on_progress=stop)


def test_an_epub_with_encrypted_chapters_or_no_spine_says_so(tmp_path):
    locked = make_epub(tmp_path / "locked.epub", "Locked", [("One", "Text.")])
    with zipfile.ZipFile(locked, "a") as z:
        z.writestr("META-INF/encryption.xml", '<encryption xmlns="urn:oasis:names:tc:opendocument:xmlns:container" '
                   'xmlns:enc="http://www.w3.org/2001/04/xmlenc#"><enc:EncryptedData><enc:CipherData>'
                   '<enc:CipherReference URI="OEBPS/c0.xhtml"/></enc:CipherData></enc:EncryptedData></encryption>')
    with pytest.raises(InputError, match="encrypted"):
        one(locked)
    hollow = tmp_path / "hollow.epub"
    with zipfile.ZipFile(hollow, "w") as z:
        z.writestr("mimetype", "application/epub+zip")
    with pytest.raises(InputError, match="damaged or not an EPUB file"):
        one(hollow)


# books


def test_sample_story_is_a_book_in_sections():
    path = sample_story_path()
    doc = one(path)
    text = path.read_text(encoding="utf-8")
    assert doc.kind == "book" and doc.title == "The Gull Point Light"
    assert doc.text == text
    assert len(text.split()) > 9000
    # one segment per Markdown heading; each after the first starts a new chunk
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert len(doc.segments) == len(headings)
    assert [s.break_before for s in doc.segments] == [False] + [True] * (len(headings) - 1)
    assert all(doc.text[s.start:s.end].startswith("#") for s in doc.segments)


def test_nocha_book_is_read_verbatim():
    path = shared_data("nocha", "books", "the_adventures_of_sherlock_holmes_arthur_conan_doyle.txt")
    doc = one(path)
    assert doc.kind == "book"
    assert doc.title == "The Adventures of Sherlock Holmes"  # from its "title:" line
    assert doc.text == path.read_text(encoding="utf-8")
    assert "A SCANDAL IN BOHEMIA" in doc.text


def test_markdown_suffixes_split_at_headings(tmp_path):
    text = "# Title\n\nIntro.\n\n## One\n\nFirst.\n\n## Two\n\nSecond.\n"
    for name in ("a.md", "a.markdown"):
        (tmp_path / name).write_text(text)
        assert len(one(tmp_path / name).segments) == 3
    (tmp_path / "a.txt").write_text(text)
    assert len(one(tmp_path / "a.txt").segments) == 1


def test_non_utf8_text_is_decoded_with_a_warning(tmp_path):
    path = tmp_path / "cafe.txt"
    path.write_bytes("The caf\u00e9 on the quay served cr\u00eapes. It closed at nine.\n".encode("cp1252"))
    warnings: list[str] = []
    doc = one(path, warnings=warnings)
    assert "caf\u00e9" in doc.text and "cr\u00eapes" in doc.text
    [warning] = warnings
    assert str(path) in warning and "UTF-8" in warning and "cp1252" in warning


def test_utf16_text_is_not_taken_for_binary(tmp_path):
    path = tmp_path / "utf16.txt"
    path.write_bytes("The keeper\u2019s log. Second sentence.\n".encode("utf-16"))
    warnings: list[str] = []
    assert one(path, warnings=warnings).text == "The keeper\u2019s log. Second sentence.\n"
    assert len(warnings) == 1 and "UTF-16" in warnings[0]


def test_windows_line_endings_become_newlines(tmp_path):
    path = tmp_path / "crlf.txt"
    path.write_bytes(b"Line one.\r\nLine two.\r\n")
    assert one(path).text == "Line one.\nLine two.\n"


# dialogues


def test_locomo_conversations_keep_speakers_turn_ids_and_times(backbone_tokenizer):
    path = shared_data("locomo", "locomo10.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    docs = parse_file(path)
    assert len(docs) == len(data) == 10
    assert len({d.part for d in docs}) == 10
    for doc, sample in zip(docs, data):
        doc.check()
        conv = sample["conversation"]
        assert doc.kind == "dialogue" and doc.part == sample["sample_id"]
        assert conv["speaker_a"] in doc.title and conv["speaker_b"] in doc.title
        expected = []
        number = 1
        while f"session_{number}" in conv:
            for turn in conv[f"session_{number}"]:
                expected.append((turn["dia_id"], turn["speaker"], str(number), conv[f"session_{number}_date_time"]))
            number += 1
        turns = [s for s in doc.segments if s.atomic]
        assert [(s.turn_id, s.speaker, s.session, s.time) for s in turns] == expected
        assert sorted(doc.metadata["speakers"]) == sorted({conv["speaker_a"], conv["speaker_b"]})
        assert doc.metadata["sessions"] == number - 1

    # one conversation through the chunker: the turn D1:3 carries its provenance
    doc, sample = docs[0], data[0]
    turn = sample["conversation"]["session_1"][2]
    assert turn["dia_id"] == "D1:3"
    position = doc.text.index(turn["text"])
    chunks = chunk_document(doc, backbone_tokenizer)
    assert "".join(c.text for c in chunks) == doc.text
    record = chunk_at(chunks, position)
    assert "D1:3" in record["turn_ids"]
    assert turn["speaker"] in record["speakers"]
    assert record["session"] == "1"
    assert record["time_start"] == sample["conversation"]["session_1_date_time"] == "1:56 pm on 8 May, 2023"
    # image shares are kept as text so they can be found
    assert "[shares an image: a photo of a dog walking past a wall" in doc.text


def test_single_locomo_sample_object(tmp_path):
    sample = {
        "sample_id": "tiny",
        "conversation": {
            "speaker_a": "Ann", "speaker_b": "Ben",
            "session_1_date_time": "9:00 am on 1 May, 2023",
            "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "Hi Ben."},
                          {"speaker": "Ben", "dia_id": "D1:2", "text": "Hi Ann."}],
            "session_2_date_time": "9:00 am on 2 May, 2023",
            "session_2": [{"speaker": "Ann", "text": "No dia_id here."}],
        },
    }
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(sample))
    doc = one(path)
    assert doc.title == "tiny: Ann & Ben"
    assert [(s.turn_id, s.time) for s in doc.segments if s.atomic] == [
        ("D1:1", "9:00 am on 1 May, 2023"), ("D1:2", "9:00 am on 1 May, 2023"), ("D2:1", "9:00 am on 2 May, 2023"),
    ]


TRANSCRIPT = """# Session 1 - 2023-05-08
[10:02] Alice: Did you see the lighthouse last night?
Bob (10:03): Yes, the lamp was out.
It had been out since Tuesday.
Session 2: 9 May 2023
Alice: The keeper came back.
10:15 Bob: Good. Dr. Marsh will be pleased.
"""


def test_transcript_speakers_sessions_and_times(tmp_path, backbone_tokenizer):
    path = tmp_path / "harbour_chat.txt"
    path.write_text(TRANSCRIPT)
    doc = one(path)  # auto: the lines look like a transcript
    assert doc.kind == "dialogue" and doc.metadata["format"] == "transcript"
    turns = [s for s in doc.segments if s.atomic]
    assert [(s.speaker, s.session, s.turn_id, s.time) for s in turns] == [
        ("Alice", "1", "S1:1", "10:02"),
        ("Bob", "1", "S1:2", "10:03"),
        ("Alice", "2", "S2:1", "9 May 2023"),  # a turn without its own time takes the session's
        ("Bob", "2", "S2:2", "10:15"),
    ]
    # a line without a speaker continues the turn before it
    assert doc.text[turns[1].start:turns[1].end] == "Bob: Yes, the lamp was out. It had been out since Tuesday.\n"
    headers = [s for s in doc.segments if not s.atomic]
    assert [(s.session, s.time, s.break_before) for s in headers] == [
        ("1", "2023-05-08", False), ("2", "9 May 2023", True),
    ]
    chunks = chunk_document(doc, backbone_tokenizer)
    assert [c.record()["session"] for c in chunks] == ["1", "2"]
    assert chunks[1].record()["speakers"] == ["Alice", "Bob"]


def test_transcript_without_sessions_numbers_turns(tmp_path):
    path = tmp_path / "plain.txt"
    path.write_text("Ann: Morning.\nBen: Morning, Ann.\nAnn: Fog again.\n")
    doc = one(path)
    assert [(s.speaker, s.turn_id, s.session) for s in doc.segments] == [
        ("Ann", "1", None), ("Ben", "2", None), ("Ann", "3", None),
    ]


def test_prose_with_a_colon_is_not_a_transcript(tmp_path):
    path = tmp_path / "prose.txt"
    path.write_text("It was late.\nNote: the lamp was out.\nThe keeper slept.\nNobody came to the door.\n")
    assert one(path).kind == "book"


def test_jsonl_chat_messages(tmp_path, backbone_tokenizer):
    lines = [
        {"speaker": "Ann", "text": "Where is the key?", "time": "2024-01-01T09:00"},
        {"role": "user", "content": "Under the mat.", "session": "s2", "time": "2024-01-02T10:00"},
        {"role": "assistant", "content": [{"type": "text", "text": "Found it"}, {"type": "text", "text": "thanks."}]},
        {"speaker": "Ann", "text": "Good.", "id": "m-4", "timestamp": "2024-01-02T10:05"},
    ]
    path = tmp_path / "chat.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    doc = one(path)
    assert doc.kind == "dialogue" and doc.metadata["format"] == "messages"
    turns = [s for s in doc.segments if s.atomic]
    assert [(s.speaker, s.turn_id, s.session, s.time) for s in turns] == [
        ("Ann", "1", None, "2024-01-01T09:00"),
        ("user", "2", "s2", "2024-01-02T10:00"),
        ("assistant", "3", "s2", None),
        ("Ann", "m-4", "s2", "2024-01-02T10:05"),
    ]
    assert "assistant: Found it thanks.\n" in doc.text
    assert doc.metadata["speakers"] == ["Ann", "user", "assistant"]
    chunks = chunk_document(doc, backbone_tokenizer)
    assert "".join(c.text for c in chunks) == doc.text
    assert [c.record()["session"] for c in chunks] == [None, "s2"]  # the session starts a new chunk


def test_json_message_list_and_messages_object(tmp_path):
    messages = [{"role": "user", "content": "Hello."}, {"role": "assistant", "content": "Hi."}]
    for name, data in (("list.json", messages), ("object.json", {"messages": messages})):
        (tmp_path / name).write_text(json.dumps(data))
        doc = one(tmp_path / name)
        assert [s.speaker for s in doc.segments] == ["user", "assistant"]
    # JSON lines saved under .json are read as JSONL
    (tmp_path / "lines.json").write_text("\n".join(json.dumps(m) for m in messages))
    assert [s.speaker for s in one(tmp_path / "lines.json").segments] == ["user", "assistant"]


# --kind and file discovery


def test_kind_overrides(tmp_path):
    path = tmp_path / "chat.txt"
    path.write_text(TRANSCRIPT)
    assert one(path, kind="book").kind == "book"
    (tmp_path / "data.json").write_text('{"a": 1}')
    assert one(tmp_path / "data.json", kind="book").kind == "book"
    prose = tmp_path / "prose.txt"
    prose.write_text("Just a story. Nothing more.\n")
    with pytest.raises(InputError, match="Speaker: text"):
        parse_file(prose, "dialogue")
    with pytest.raises(InputError, match="damaged or not a PDF"):
        parse_file(prose, "pdf")
    pdf = make_pdf(tmp_path / "p.pdf", ["Text."])
    with pytest.raises(InputError, match="cannot be read as book"):
        parse_file(pdf, "book")


def test_collect_files_walks_directories(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / ".hidden").mkdir()
    for name in ("a.txt", "b/c.md", "b/d.PDF", "e.jsonl", "skip.docx", ".hidden/x.txt", ".f.txt"):
        (tmp_path / name).write_text("x")
    found = [p.relative_to(tmp_path).as_posix() for p in collect_files(tmp_path)]
    assert found == ["a.txt", "b/c.md", "b/d.PDF", "e.jsonl"]
    assert collect_files(tmp_path / "a.txt") == [tmp_path / "a.txt"]


def test_dialogue_text_reads_back_as_a_transcript(tmp_path):
    """The text evsel renders for a dialogue is itself a valid transcript with the same provenance."""
    path = shared_data("locomo", "locomo10.json")
    doc = parse_file(path)[1]
    copy = tmp_path / "rendered.txt"
    copy.write_text(doc.text)
    again = one(copy)
    assert again.kind == "dialogue"
    original = [(s.speaker, s.session, s.time) for s in doc.segments if s.atomic]
    assert [(s.speaker, s.session, s.time) for s in again.segments if s.atomic] == original


XMP = ('<?xpacket begin="" id="W5M0MpCehiHzreSzNTczkc9d"?><x:xmpmeta xmlns:x="adobe:ns:meta/">'
       '<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:Description rdf:about="" '
       'xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title><rdf:Alt><rdf:li xml:lang="x-default">'
       'Tide Tables &amp; Harbour Rules</rdf:li></rdf:Alt></dc:title></rdf:Description></rdf:RDF>'
       '</x:xmpmeta><?xpacket end="w"?>')


@pytest.mark.parametrize("info_title, xmp, expected", [
    ("Board Minutes, March", "", "Board Minutes, March"),
    ("", XMP, "Tide Tables & Harbour Rules"),  # only in the XMP packet
    ("Untitled", XMP, "Tide Tables & Harbour Rules"),  # a writer's placeholder
    ("Microsoft Word - minutes.docx", "", "harbour notes"),  # a file name a writer put there
    ("Microsoft Word - Board Minutes", "", "Board Minutes"),
    ("   ", "", "harbour notes"),
])
def test_pdf_title_from_its_metadata(tmp_path, info_title, xmp, expected):
    pdf = pymupdf.open()
    pdf.new_page().insert_text((72, 72), "Some text on the only page.")
    if info_title:
        pdf.set_metadata({"title": info_title})
    if xmp:
        pdf.set_xml_metadata(xmp)
    path = tmp_path / "harbour_notes.pdf"
    pdf.save(path)
    pdf.close()
    assert one(path).title == expected


@pytest.mark.parametrize("text, expected", [
    ("Notes from Tuesday.\n\n## Board meeting, March\n\nWe met.\n", "Board meeting, March"),
    ("Board meeting\n=============\n\nWe met.\n", "Board meeting"),
    ("---\ntitle: \"Harbour board\"\ndate: 2024-03-01\n---\n\n# Minutes\n\nWe met.\n", "Harbour board"),
    ("---\ndate: 2024-03-01\n---\n\n### Minutes of the board ###\n\nWe met.\n", "Minutes of the board"),
    ("```sh\n# not a heading\n```\n\n## After the code\n\nText.\n", "After the code"),
    ("Just a note with no heading at all.\n", "board"),
])
def test_markdown_title_is_its_first_heading(tmp_path, text, expected):
    path = tmp_path / "board.md"
    path.write_text(text)
    assert one(path).title == expected
