"""A new user's first hour: one passage numbering in every output, PDFs shown on one
line, `docs show` without internal fields, compact --select help, and a README that shows the
next steps (with lines that work)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pymupdf
import pytest

from evsel.paths import sample_story_path
from test_cli_ingest import one_json, run

README = Path(__file__).resolve().parent.parent / "README.md"




def passages(out: str) -> list[tuple[int, int, str]]:
    """(number shown, rank, text) of each evidence passage of `ask`'s human output."""
    found = re.findall(r"^#(\d+) rank (\d+) \|[^\n]*\n[^\n]*\n([^\n]*)$", out, re.M)
    return [(int(number), int(rank), text) for number, rank, text in found]


def test_one_passage_numbering_in_human_and_json_output(capsys):
    """The human output numbers passages in the order shown and cites the answer's by that number:
    the number --json gives as grounding.span.passage and evidence[].passage."""
    assert run(capsys, "ingest", str(sample_story_path()))[0] == 0
    question = "Who killed Ambrose Tenterden?"
    code, out, _ = run(capsys, "ask", question)
    assert code == 0
    cited = int(re.search(r"^Answer: Roland Pryce \(person, passage #(\d+)\)$", out, re.M).group(1))
    shown = passages(out)
    assert [number for number, _, _ in shown] == list(range(1, len(shown) + 1)) and len(shown) == 5
    assert "Roland Pryce killed Ambrose Tenterden." in shown[cited - 1][2]

    code, out, _ = run(capsys, "ask", "--json", question)
    result = one_json(out)
    assert result["grounding"]["span"]["passage"] == cited
    assert [e["passage"] for e in result["evidence"]] == list(range(1, 6))
    assert [e["rank"] for e in result["evidence"]] == [rank for _, rank, _ in shown]
    assert result["grounding"]["span"]["text"] in result["evidence"][cited - 1]["text"]


@pytest.fixture
def tide_pdf(tmp_path) -> Path:
    """Twelve pages labelled i-xii; page 11's sentence runs over three lines, the name over two."""
    pdf = pymupdf.open()
    for n in range(1, 13):
        text = (f"Page {n} lists the tides and the weather for the week." if n != 11 else
                "The harbour master Edwin\nMarsh signed the tide register\non the Tuesday before the storm.")
        pdf.new_page().insert_text((72, 72), text, fontsize=11)
    pdf.set_page_labels([{"startpage": 0, "prefix": "", "style": "r", "firstpagenum": 1}])
    pdf.set_metadata({"title": "Tide Register 1931"})
    path = tmp_path / "tides.pdf"
    pdf.save(path)
    pdf.close()
    return path


def test_pdf_answer_and_evidence_are_shown_on_one_line(tide_pdf, capsys):
    assert run(capsys, "ingest", str(tide_pdf))[0] == 0
    question = "Who signed the tide register?"
    code, out, _ = run(capsys, "ask", "--json", "--style", "span", question)
    answer = one_json(out)["answer"]
    assert answer == "Edwin\nMarsh"  # the data keeps the page's text
    code, out, _ = run(capsys, "ask", "--style", "span", question)
    assert code == 0
    assert "\nAnswer: Edwin Marsh (person, passage #" in "\n" + out
    cited = int(re.search(r"\(person, passage #(\d+)\)", out).group(1))
    assert "Edwin Marsh signed the tide register on the Tuesday" in passages(out)[cited - 1][2]


def test_docs_show_without_internal_fields_and_page_labels_in_page_order(tide_pdf, capsys):
    assert run(capsys, "ingest", str(tide_pdf))[0] == 0
    code, out, _ = run(capsys, "docs", "show", "1")
    assert code == 0
    fields = [line.split(":", 1)[0] for line in out.splitlines()]
    assert fields == ["id", "collection", "title", "kind", "path", "sha256", "n_chars", "n_chunks", "n_tokens",
                      "page_labels", "pages"]  # no part, kind_arg, chunker, nor an empty author
    assert "title: Tide Register 1931" in out
    labels = ", ".join(f"{n}={r}" for n, r in enumerate(
        "i ii iii iv v vi vii viii ix x xi xii".split(), 1))
    assert f"page_labels: {labels}\n" in out
    # --json keeps everything, page labels in page order too
    metadata = one_json(run(capsys, "docs", "show", "--json", "1")[1])["metadata"]
    assert metadata["kind_arg"] == "auto" and "chunker" in metadata
    assert list(metadata["page_labels"]) == [str(n) for n in range(1, 13)]


def test_docs_show_names_a_part_in_the_path(tmp_path, capsys):
    """A document that is one of several in a file (a LoCoMo conversation) shows path#part."""
    sample = {"sample_id": "conv-7", "conversation": {
        "speaker_a": "Ann", "speaker_b": "Ben", "session_1_date_time": "1:00 pm on 3 May, 2023",
        "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "The ferry left at noon."},
                      {"speaker": "Ben", "dia_id": "D1:2", "text": "With the mail sacks."}]}}
    path = tmp_path / "two.json"
    path.write_text(json.dumps([sample, dict(sample, sample_id="conv-8")]))
    assert run(capsys, "ingest", str(path))[0] == 0
    out = run(capsys, "docs", "show", "2")[1]
    assert f"path: {path}#conv-8\n" in out and "\npart:" not in out
    assert "speakers: Ann, Ben\n" in out and "sessions: 1\n" in out


# compact help


def test_select_help_names_the_methods_and_list_methods_names_the_variants(capsys):
    from evsel.models.selectors import available, listing

    code, out, _ = run(capsys, "ask", "--help")
    select = re.search(r"^  --select METHOD(.*?)^  --", out, re.M | re.S).group(1)  # up to the next option
    assert len(select.strip().splitlines()) <= 4 and "--list-methods" in select
    assert "blocksearch:" not in select and "qrranker:" not in select
    assert all(name in select for name in available())

    code, out, err = run(capsys, "ask", "--list-methods")  # no QUESTION needed
    assert code == 0 and err == ""
    listed = [line.split()[0] for line in out.splitlines()]
    assert listed == [name for name, _ in listing()]  # the registry's listing, in its order
    assert set(available()) <= {name.split(":")[0] for name in listed}


# README


def next_steps() -> str:
    text = README.read_text()
    return text[text.index("## Next steps"):text.index("\n## ", text.index("## Next steps") + 1)]


def test_readme_lists_commands_one_per_line():
    """`a | b` in a shell block is a pipe: alternatives are on lines of their own."""
    blocks = re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)
    for line in "".join(blocks).splitlines():
        command = line.split("  #")[0]
        assert not re.search(r"\|\s*evsel\b", command), line
        assert not re.search(r"\bstop \| start\b", command), line


def test_readme_next_steps_quote_measured_numbers():
    section = next_steps()
    for heading in ("One LoCoMo conversation", "bigger local GGUF", "first model-based ask on a novel"):
        assert heading in section
    results = (README.parent / "docs" / "RESULTS.md").read_text()
    for number in ("7.52", "3.72", "90.7", "2174", "933", "212.52", "8.08", "13.6", "0.303", "12.921"):
        assert number in results, f"{number} is no longer in docs/RESULTS.md"
    for quoted in ("7.52 s", "3.72 s", "90.7 s", "2174 MiB", "933 MiB", "212.5 s", "8.1 s", "13.6 s"):
        assert quoted in section


def test_readme_warns_that_sentence_style_invents_on_the_small_model():
    text = README.read_text()
    assert "--style sentence" in text and "invents answers" in text and "Lionel Pryce" in text


def locomo_file(path: Path) -> Path:
    def sample(sample_id: str, line: str) -> dict:
        return {"sample_id": sample_id, "conversation": {
            "speaker_a": "Ann", "speaker_b": "Ben", "session_1_date_time": "1:00 pm on 3 May, 2023",
            "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": line},
                          {"speaker": "Ben", "dia_id": "D1:2", "text": "Good to hear."}]}}

    path.write_text(json.dumps([sample("conv-26", "I went to the support group."),
                                sample("conv-30", "I sold the boat.")]))
    return path


@pytest.mark.parametrize("tool", ["jq", "python3"])
def test_readme_line_ingests_one_locomo_conversation(tool, tmp_path, capsys):
    [line] = [line for line in next_steps().splitlines() if line.startswith(f"{tool} ")]
    if shutil.which(tool) is None:
        pytest.skip(f"no {tool} here to run the README's line with")
    data = locomo_file(tmp_path / "locomo10.json")
    assert "../shared/data/locomo/locomo10.json" in line
    subprocess.run(["bash", "-c", line.replace("../shared/data/locomo/locomo10.json", str(data))],
                   cwd=tmp_path, check=True)
    code, _, _ = run(capsys, "ingest", str(tmp_path / "conv-26.json"), "--collection", "locomo")
    assert code == 0
    [doc] = one_json(run(capsys, "docs", "list", "--json")[1])
    assert doc["title"] == "conv-26: Ann & Ben" and doc["collection"] == "locomo"
