"""A corpus whose Lance data file was removed: `ask --corpus` says in one line that it is damaged
and how to repair it, and the resumed build drops the lost fragment and reads its documents again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("lance", reason="the scale extra is not installed (pip install '.[scale]')")

from evsel.cli import main  # noqa: E402

TEXTS = {
    "lighthouse.txt": "The keeper of the lighthouse lit the lamp at dusk and wound the clockwork.",
    "orchard.txt": "The old gardener grafted pear branches onto quince roots in the orchard.",
    "harbour.txt": "Fishing boats came back to the harbour at noon with mackerel and herring.",
}


def _corpus(tmp_path: Path, backbone) -> tuple[Path, list]:
    """A corpus of three documents, one fragment each (one write a document)."""
    from evsel.corpus import rows, schema

    source = tmp_path / "docs"
    source.mkdir()
    manifest = schema.new_manifest(backbone=backbone.fingerprint, chunk_tokens=140, source=str(source),
                                   methods=["bm25"], dims={}, configs={})
    out = tmp_path / "corpus"
    per_file = []
    for name, text in TEXTS.items():
        (source / name).write_text(text + "\n", encoding="utf-8")
        per_file.append(rows.rows_of_file(source / name, source, backbone))
        rows.write_local(per_file[-1], out, manifest, index=True)
    return out, per_file


def _ask(capsys, corpus: Path) -> tuple[int, str, str]:
    code = main(["ask", "Who grafted pear branches?", "--corpus", str(corpus), "--evidence-only", "--json"])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_removed_data_file_is_one_line_and_a_resumed_build_repairs_it(tmp_path, backbone_tokenizer, capsys):
    import lance

    from evsel.corpus import rows, schema
    from evsel.corpus.build import drop_lost_fragments

    corpus, per_file = _corpus(tmp_path, backbone_tokenizer)
    code, out, _ = _ask(capsys, corpus)
    assert code == 0
    before = [(e["path"], e["seq"]) for e in json.loads(out)["evidence"]]
    uri = str(corpus / schema.CHUNKS)
    orchard = next(f for f in lance.dataset(uri).get_fragments()
                   if "orchard" in str(f.to_table(columns=["doc_path"]).column(0)[0]))
    (Path(uri) / "data" / orchard.metadata.files[0].path).unlink()

    code, out, err = _ask(capsys, corpus)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and "unexpected" not in err and "Traceback" not in err, err
    assert f"the corpus {corpus} is damaged: a data file is missing" in lines[0], err
    assert f"repair it with: evsel corpus build {corpus.parent / 'docs'} --out {corpus}" in lines[0], err

    # what a resumed build does first, then the documents it finds missing written again
    assert drop_lost_fragments(uri) == 1 and drop_lost_fragments(uri) == 0
    kept = lance.dataset(uri).to_table(columns=["doc_path"]).column(0).to_pylist()
    assert sorted({Path(p).name for p in kept}) == ["harbour.txt", "lighthouse.txt"]
    rows.write_local(per_file[1], corpus, index=True)
    code, out, err = _ask(capsys, corpus)
    assert code == 0, err
    assert [(e["path"], e["seq"]) for e in json.loads(out)["evidence"]] == before
