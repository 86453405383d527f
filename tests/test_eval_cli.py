"""`evsel eval` end to end on a generic JSONL dataset: the --json shape, the plot, the errors."""

from __future__ import annotations

import json

import pytest

from evsel.cli import main

TOPICS = [
    ("lighthouse", "The lighthouse keeper lit the lamp every evening at dusk and wound the clockwork."),
    ("orchard", "In the orchard the old gardener grafted pear branches onto quince roots each spring."),
    ("harbour", "Fishing boats came back to the harbour at noon, loaded with mackerel and herring."),
    ("school", "The village school had one classroom, a stove, and a teacher who loved geography."),
    ("mill", "The water mill ground barley for the whole valley until the river froze in January."),
    ("market", "On market day the square filled with cheese sellers, potters and a travelling dentist."),
]


def _dataset(tmp_path):
    # each topic is a Markdown section, so each lands in its own chunk
    body = "\n\n".join(f"## {name.title()}\n\n{text} " + "It was an ordinary place. " * 6 for name, text in TOPICS)
    (tmp_path / "village.md").write_text(f"# The Village\n\n{body}\n", encoding="utf-8")
    rows = [
        {"id": "q1", "question": "Who grafted pear branches in the orchard?", "answer": "the old gardener",
         "document": "village.md", "evidence": ["the old gardener grafted pear branches onto quince roots"]},
        {"id": "q2", "question": "When did the river freeze?", "answer": ["in January", "January"],
         "document": "village.md", "evidence": ["until the river froze in January"], "group": "time"},
        {"id": "q3", "question": "What fish did the boats bring back?", "answer": "mackerel and herring",
         "documents": ["village.md"], "evidence": ["loaded with mackerel and herring"]},
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_eval_json_shape_and_plot(tmp_path, capsys):
    path = _dataset(tmp_path)
    plot = tmp_path / "recall.png"
    code = main(["eval", str(path), "--methods", "bm25,dense,random,rrf:dense", "--k", "1,3", "--json",
                 "--plot", str(plot), "--per-question"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)  # exactly one JSON document on stdout
    assert set(result) >= {"dataset", "config", "methods", "seconds", "run", "per_question", "plot"}
    assert result["dataset"]["name"] == "mine"
    assert result["dataset"]["questions"] == 3 and result["dataset"]["questions_with_gold"] == 3
    assert result["dataset"]["gold_resolution"] == {"text": 3}
    assert result["config"]["methods"] == ["bm25", "dense", "random", "rrf:dense"]
    assert result["config"]["k"] == [1, 3]
    assert result["run"]["commit"] is None or len(result["run"]["commit"]) == 12
    for spec in ("bm25", "dense", "random", "rrf:dense"):
        m = result["methods"][spec]
        for key in ("recall@1", "recall@3", "complete@1", "complete@3", "chunk_recall@1", "mrr", "latency",
                    "index_s", "groups", "evidence_tokens"):
            assert key in m, (spec, key)
        assert 0.0 <= m["recall@1"] <= m["recall@3"] <= 1.0
        assert set(m["latency"]) == {"select_s"}
        assert set(m["groups"]) == {"all", "time"}
        assert len(result["per_question"][spec]) == 3
    # the questions name their evidence plainly: lexical and dense retrieval both find all of it
    assert result["methods"]["bm25"]["recall@1"] == 1.0
    assert result["methods"]["dense"]["recall@1"] == 1.0
    assert plot.stat().st_size > 1000 and plot.read_bytes()[:4] == b"\x89PNG"


def test_eval_table_output(tmp_path, capsys):
    path = _dataset(tmp_path)
    assert main(["eval", str(path), "--methods", "bm25,random", "--k", "1,2,5"]) == 0
    out = capsys.readouterr().out
    assert "R@1" in out and "bm25" in out and "random" in out


@pytest.mark.parametrize(
    "args, message",
    [
        (["eval", "nosuchset"], "unknown dataset 'nosuchset'"),
        (["eval", "{path}", "--methods", "bm25,nosuch"], "unknown selector 'nosuch'"),
        (["eval", "{path}", "--methods", "full"], "add --generate or drop full"),
        (["eval", "{path}", "--k", "0"], "positive integers"),
        (["eval", "nocha", "--data-dir", "{tmp}"], "is not there"),
    ],
)
def test_eval_errors_are_one_line(tmp_path, capsys, args, message):
    path = _dataset(tmp_path)
    args = [a.format(path=path, tmp=tmp_path) for a in args]
    assert main(args) != 0
    err = capsys.readouterr().err
    assert message in err


def test_jsonl_problems_say_what_to_fix(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "where?", "document": "missing.txt"}\n', encoding="utf-8")
    assert main(["eval", str(bad)]) == 1
    assert "document 'missing.txt' does not exist" in capsys.readouterr().err


@pytest.mark.model
def test_eval_generate_with_the_real_model(tmp_path, capsys):
    """--generate answers with SmolLM2 from the selected passages and from the whole document."""
    path = _dataset(tmp_path)
    code = main(["eval", str(path), "--methods", "bm25,full", "--k", "1", "--generate", "--max-new-tokens", "12",
                 "--answer-style", "sentence", "--json", "--per-question"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert result["config"]["backbone"].startswith("SmolLM2")
    for spec in ("bm25", "full"):
        m = result["methods"][spec]
        assert m["answered"] == 3
        assert 0.0 <= m["em"] <= m["f1"] <= 1.0
        assert m["prompt_tokens"] > 0
        assert set(m["latency"]) >= {"generate_s"}
        for record in result["per_question"][spec]:
            assert isinstance(record["answer"], str)
    # full reads the whole document: no ranking, more prompt tokens than five passages of it would be
    assert "recall@1" not in result["methods"]["full"]
    assert result["methods"]["full"]["prompt_tokens"] >= result["methods"]["bm25"]["prompt_tokens"]


GOOD_LINE = {"question": "Who grafted pear branches?", "document": "village.md"}
MALFORMED_LINES = {  # a line's damage -> what the error says
    "documents is a number": ({"documents": 5}, "'documents' must be a path or a list of paths"),
    "documents lists a number": ({"documents": [5]}, "'documents' must be a path or a list of paths"),
    "document is an object": ({"document": {"path": "village.md"}}, "'document' must be a path"),
    "document is a number": ({"document": 7}, "'document' must be a path"),
    "evidence is a number": ({"evidence": 5}, "'evidence' must be a list of strings"),
    "span is a string": ({"evidence_spans": ["0-10"]}, "an evidence span must be an object"),
    "span without start": ({"evidence_spans": [{"end": 10}]}, "evidence span's 'start' must be an integer"),
    "span with a text start": ({"evidence_spans": [{"start": "zero", "end": 10}]},
                               "evidence span's 'start' must be an integer"),
    "span with a fractional end": ({"evidence_spans": [{"start": 0, "end": 1.5}]},
                                   "evidence span's 'end' must be an integer"),
    "span names a number": ({"evidence_spans": [{"document": 3, "start": 0, "end": 9}]}, "'document' must be a path"),
    "span past the document's end": ({"evidence_spans": [{"start": 10, "end": 10 ** 7}]},
                                     "evidence span 10-10000000 is outside document 'village.md'"),
    "span ending before it starts": ({"evidence_spans": [{"start": 30, "end": 5}]}, "0 <= start < end"),
    "answer is an object": ({"answer": {"text": "the gardener"}}, "'answer' must be a string or a list of strings"),
    "answer lists an object": ({"answer": ["x", {"y": 1}]}, "'answer' must be a string or a list of strings"),
    "question is a lone surrogate": ({"question": "who \ud800?"}, "'question' holds a lone surrogate (\\ud800)"),
    "question is an object": ({"question": {"text": "who?"}}, "'question' must be a string"),
    "evidence is a lone surrogate": ({"evidence": ["\udcff"]}, "'evidence' holds a lone surrogate"),
}


@pytest.mark.parametrize("damage", MALFORMED_LINES)
def test_a_malformed_jsonl_line_is_one_line_naming_the_file_and_line(damage, tmp_path, capsys):
    _dataset(tmp_path)
    change, message = MALFORMED_LINES[damage]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(GOOD_LINE) + "\n\n" + json.dumps({**GOOD_LINE, **change}) + "\n", encoding="utf-8")
    assert main(["eval", str(bad), "--methods", "bm25"]) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("evsel: error:")]
    assert len(lines) == 1 and "unexpected" not in err and "Traceback" not in err, err
    assert f"{bad}: line 3: " in lines[0] and message in lines[0], err


def test_a_jsonl_file_that_is_not_utf8_names_its_line(tmp_path, capsys):
    _dataset(tmp_path)
    bad = tmp_path / "latin1.jsonl"
    bad.write_bytes((json.dumps(GOOD_LINE) + "\n").encode() + '{"question": "caf\u00e9?", "document": "village.md"}\n'
                    .encode("latin-1"))
    assert main(["eval", str(bad), "--methods", "bm25"]) == 1
    err = capsys.readouterr().err
    assert "unexpected" not in err and f"{bad}: line 2 is not UTF-8 text" in err and "save the file as UTF-8" in err


def test_a_missing_jsonl_file_is_not_sent_to_the_data_dir(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "mine.jsonl")]) == 1
    err = capsys.readouterr().err
    assert "is not there" in err and "--data-dir" not in err and "existing .jsonl file" in err


def test_a_plot_in_a_missing_folder_is_refused_before_the_run(tmp_path, capsys):
    path = _dataset(tmp_path)
    plot = tmp_path / "no" / "such" / "recall.png"
    assert main(["eval", str(path), "--methods", "bm25", "--plot", str(plot)]) == 1
    err = capsys.readouterr().err
    assert f"the folder {plot.parent} does not exist" in err and "unexpected" not in err
    assert not (tmp_path / "no").exists()
