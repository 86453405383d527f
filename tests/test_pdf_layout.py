"""PDFs as a reader sees them (parsers/pdf_layout.py, pdf_tables.py): a table's rows with their
headers and exact offsets, two columns in column order, running headers and page numbers left
out; the plain reader stays selectable (EVSEL_PDF_READER=plain)."""

from __future__ import annotations

import json
from pathlib import Path

import pymupdf
import pytest

from evsel.ingest.chunker import chunk_document
from evsel.errors import EvselError
from evsel.ingest.parsers import parse_file
from evsel.ingest.parsers.pdf import parse_pdf
from evsel.settings import Settings

ROWS = [("Purchases of PP&E", "(1,577)", "(1,373)"), ("Proceeds from sale of PP&E", "262", "49"),
        ("Acquisitions, net of cash acquired", "13", "(2,023)"), ("Dividends paid to shareholders", "(3,193)", "(2,803)")]
PROSE = ("The company reviews its capital spending every year. Spending rose with new plants. "
         "The board approved the plan in March. ")


def _table_pdf(path: Path) -> None:
    """One page: prose, a caption, a ruled table (header row of years, four rows), prose."""
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_textbox(pymupdf.Rect(72, 60, 540, 140), PROSE * 2, fontsize=10)
    page.insert_text((72, 170), "Consolidated Statement of Cash Flows (Millions)", fontsize=10)
    xs, top, height = (72, 340, 440, 540), 180, 18
    lines = [("", "2018", "2017"), *ROWS]
    for r, cells in enumerate(lines):
        y = top + r * height
        for c, text in enumerate(cells):
            page.insert_text((xs[c] + 4, y + 13), text, fontsize=10)
    for r in range(len(lines) + 1):
        page.draw_line((xs[0], top + r * height), (xs[-1], top + r * height))
    for x in xs:
        page.draw_line((x, top), (x, top + len(lines) * height))
    page.insert_textbox(pymupdf.Rect(72, 300, 540, 400), "After the table the report goes on. " * 4, fontsize=10)
    doc.save(path)


class Words:
    """Counts whitespace words: enough to pack chunks, no model needed."""

    def count(self, texts):
        return [len(t.split()) for t in texts]

    def offsets(self, text):
        import re

        return [m.span() for m in re.finditer(r"\S+", text)]


@pytest.mark.parametrize("reader", ["tables", "finder"])
def test_a_table_is_chunked_into_rows_with_headers_and_exact_offsets(tmp_path, reader):
    path = tmp_path / "cash.pdf"
    _table_pdf(path)
    doc = parse_pdf(path, reader=reader)
    doc.check()
    rows = [s for s in doc.segments if s.rendered is not None]
    rendered = [s.rendered.strip() for s in rows]
    assert "Purchases of PP&E | 2018: (1,577) | 2017: (1,373)" in rendered
    assert "Dividends paid to shareholders | 2018: (3,193) | 2017: (2,803)" in rendered
    for segment in rows:  # each row's offsets hold the row as printed, on its page
        printed = doc.text[segment.start:segment.end]
        label = segment.rendered.split(" | ")[0]
        assert printed.startswith(label) and segment.page == 1
    [table] = doc.metadata["tables"]
    assert table["page"] == 1 and table["caption"] == "Consolidated Statement of Cash Flows (Millions)"
    assert len(table["bbox"]) == 4 and table["bbox"][1] < 200 < table["bbox"][3]

    chunks = chunk_document(doc, Words(), budget=40)
    assert chunks[0].start == 0 and chunks[-1].end == len(doc.text)
    assert all(a.end == b.start for a, b in zip(chunks, chunks[1:]))  # the page's text covered once
    in_table = [c for c in chunks if table["char_start"] <= c.start and c.end <= table["char_end"]]
    assert len(in_table) >= 2  # the budget splits the rows; every chunk repeats caption and headers
    assert "".join(doc.text[c.start:c.end] for c in in_table) == doc.text[table["char_start"]:table["char_end"]]
    for chunk in in_table:
        assert chunk.text.startswith("Consolidated Statement of Cash Flows (Millions)\n")
        assert chunk.record()["page_start"] == 1
    texts = "".join(c.text for c in in_table)
    for label, a, b in ROWS:
        assert f"{label} | 2018: {a} | 2017: {b}" in texts
    outside = [c for c in chunks if c not in in_table]
    assert all(c.text == doc.text[c.start:c.end] for c in outside)
    assert any("After the table" in c.text for c in outside)


def test_the_plain_reader_stays_selectable(tmp_path):
    path = tmp_path / "cash.pdf"
    _table_pdf(path)
    plain = parse_file(path, pdf_reader="plain")[0]
    assert plain.metadata["reader"] == "plain" and "tables" not in plain.metadata
    assert all(s.rendered is None for s in plain.segments)
    assert Settings.resolve(env={"EVSEL_PDF_READER": "plain"}).pdf_reader == "plain"
    assert Settings.resolve(env={}).pdf_reader == "tables"
    with pytest.raises(EvselError, match="EVSEL_PDF_READER"):
        Settings.resolve(env={"EVSEL_PDF_READER": "fancy"})


LEFT = "Left column line of the paper that runs on"
RIGHT = "Right column line of the paper, carrying on"


def test_a_two_column_page_is_read_in_column_order(tmp_path):
    path = tmp_path / "paper.pdf"
    doc = pymupdf.open()
    page = doc.new_page(width=612, height=792)
    page.insert_text((72, 60), "A Title Across The Whole Page Of This Paper", fontsize=14)
    # written line by line across both columns, so extraction order interleaves them
    for k in range(12):
        page.insert_text((72, 100 + 14 * k), f"{LEFT} {k}.", fontsize=10)
        page.insert_text((320, 107 + 14 * k), f"{RIGHT} {k}.", fontsize=10)  # off the left baseline
    doc.save(path)
    text = parse_pdf(path).text
    assert text.index("A Title") < text.index(f"{LEFT} 0.") < text.index(f"{LEFT} 11.") < text.index(f"{RIGHT} 0.")
    assert all(text.index(f"{LEFT} {k}.") < text.index(f"{LEFT} {k + 1}.") for k in range(11))
    assert all(text.index(f"{RIGHT} {k}.") < text.index(f"{RIGHT} {k + 1}.") for k in range(11))
    plain = parse_pdf(path, reader="plain").text
    assert plain.index(f"{RIGHT} 0.") < plain.index(f"{LEFT} 11.")  # what the plain reader gives


def test_a_running_header_and_page_numbers_are_dropped_on_every_page(tmp_path):
    path = tmp_path / "report.pdf"
    doc = pymupdf.open()
    for n in range(1, 6):
        page = doc.new_page(width=612, height=792)
        page.insert_text((72, 40), "ACME Corporation Annual Report", fontsize=9)
        page.insert_textbox(pymupdf.Rect(72, 80, 540, 400), f"Section {n} says something of its own. " * 6,
                            fontsize=10)
        page.insert_text((300, 760), f"Page {n}", fontsize=9)
    doc.save(path)
    parsed = parse_pdf(path)
    assert "ACME" not in parsed.text and "Page " not in parsed.text
    assert all(f"Section {n} says" in parsed.text for n in range(1, 6))
    dropped = parsed.metadata["dropped_lines"]
    assert dropped["count"] == 10 and dropped["lines"][:2] == ["ACME Corporation Annual Report", "Page 1"]
    assert "ACME Corporation Annual Report" in parse_pdf(path, reader="plain").text


def test_ingest_stores_table_chunks_that_docs_show_marks_with_their_page(tmp_path, capsys, monkeypatch):
    from evsel.cli import main

    path = tmp_path / "cash.pdf"
    _table_pdf(path)
    assert main(["ingest", "--json", str(path)]) == 0
    capsys.readouterr()
    assert main(["docs", "show", "1", "--chunks", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["metadata"]["reader"] == "tables" and len(doc["metadata"]["tables"]) == 1
    tables = [c for c in doc["chunks"] if c.get("table")]
    assert tables and all(c["table"]["page"] == 1 for c in tables)
    assert any("Purchases of PP&E | 2018: (1,577) | 2017: (1,373)" in c["text"] for c in tables)
    assert not any("|" in c["text"] for c in doc["chunks"] if not c.get("table"))
    assert main(["docs", "show", "1", "--chunks"]) == 0
    shown = capsys.readouterr().out
    assert "table on page 1" in shown and "tables:" in shown
    # the plain reader is another reading of the same file: ingest reads it again
    monkeypatch.setenv("EVSEL_PDF_READER", "plain")
    assert main(["ingest", "--json", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["files"][0]["status"] == "ingested"
    assert main(["docs", "show", "1", "--chunks", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["metadata"]["reader"] == "plain" and not any(c.get("table") for c in doc["chunks"])


def _value_rows_pdf(path: Path, rows: int, pages: int = 1) -> None:
    """Pages of rows that hold only values (no label): they never form a table."""
    doc = pymupdf.open()
    font = pymupdf.Font("helv")
    for p in range(pages):
        page = doc.new_page(width=612, height=max(792, 40 + rows * 6))
        writer = pymupdf.TextWriter(page.rect)
        for r in range(rows):
            for c in range(4):
                writer.append((72 + c * 100, 20 + r * 6), f"{(r * 7 + c * 13 + p) % 9973}", font=font, fontsize=5)
        writer.write_text(page)
    doc.save(path)


def test_rows_of_values_are_each_grown_once(tmp_path, monkeypatch):
    """Every value row seeds a table search; rows that formed no table are not grown again for
    each later seed (that made a page of value rows quadratic: minutes for one crafted page)."""
    from evsel.ingest.parsers import pdf_tables

    grown = []
    real = pdf_tables._grow
    monkeypatch.setattr(pdf_tables, "_grow", lambda *args: grown.append(args[3]) or real(*args))
    path = tmp_path / "values.pdf"
    _value_rows_pdf(path, 300)
    parsed = parse_pdf(path)
    assert parsed.metadata["tables"] == [] and len(grown) <= 3
    assert parsed.text.split() == parse_pdf(path, reader="plain").text.split()  # every value kept


def test_a_page_past_the_time_bound_is_read_as_text_and_docs_show_says_so(tmp_path, capsys, monkeypatch):
    from evsel.cli import main
    from evsel.ingest.parsers import pdf

    path = tmp_path / "cash.pdf"
    _table_pdf(path)
    monkeypatch.setattr(pdf, "PAGE_SECONDS", -1.0)  # every page's tables already past their bound
    parsed = parse_pdf(path)
    assert parsed.metadata["tables"] == [] and parsed.metadata["pages_read_as_text"]["pages"] == [1]
    assert all(label in parsed.text for label, _, _ in ROWS) and "After the table" in parsed.text
    assert main(["--no-daemon", "ingest", "--no-encode", str(path)]) == 0
    capsys.readouterr()
    assert main(["--no-daemon", "docs", "show", "1"]) == 0
    shown = capsys.readouterr().out
    assert "page(s) 1 read as plain text: their tables took over -1.0 s to read" in shown


def test_a_statements_total_lines_are_kept_while_its_header_and_page_numbers_go(tmp_path):
    """Lines that differ in their figures are body, not running lines: only a line repeating with
    the same words (page numbers aside) is dropped."""
    path = tmp_path / "statement.pdf"
    doc = pymupdf.open()
    totals = [f"Total due for month {n}: ${(n * 7919) % 5000 + 100:,}.{n * 3 % 100:02d}" for n in range(1, 13)]
    for n in range(1, 13):
        page = doc.new_page(width=612, height=792)
        page.insert_text((72, 40), "First Harbour Bank - Account statement 2024", fontsize=9)
        page.insert_textbox(pymupdf.Rect(72, 80, 540, 300), f"Purchases and payments of month {n}. " * 5,
                            fontsize=10)
        page.insert_text((72, 700), totals[n - 1], fontsize=10)
        page.insert_text((300, 760), f"Page {n} of 12", fontsize=9)
    doc.save(path)
    parsed = parse_pdf(path)
    assert all(total in parsed.text for total in totals)
    assert "First Harbour Bank" not in parsed.text and "Page 3 of 12" not in parsed.text
    assert parsed.metadata["dropped_lines"]["count"] == 24


def test_a_page_whose_one_body_line_repeats_keeps_it_and_is_not_called_scanned(tmp_path):
    """A header, one line of prose, a page number a page: the prose is the body, never a running line."""
    path = tmp_path / "story.pdf"
    doc = pymupdf.open()
    for n in range(1, 31):
        page = doc.new_page(width=612, height=792)
        page.insert_text((72, 40), "The Long Story", fontsize=9)
        page.insert_text((72, 300), f"This is line {n} of the story.", fontsize=10)
        page.insert_text((300, 760), str(n), fontsize=9)
    doc.save(path)
    parsed = parse_pdf(path)
    assert all(f"This is line {n} of the story." in parsed.text for n in range(1, 31))
    assert "The Long Story" not in parsed.text and parsed.metadata["dropped_lines"]["count"] == 60
