"""Dataset adapters: the real benchmark files turned into documents, questions and gold evidence.

Each adapter reads a dataset in place (see its folder's PROVENANCE.md under the data directory),
builds documents with evsel's own parsers, and names gold evidence the way the dataset does
(turn ids, pages, sections as character spans, evidence text); `gold.resolve` maps it onto
chunks later. Documents load lazily, so a `--limit` run parses only what it needs.
"""

from __future__ import annotations

import ast
import csv
import json
import re
from pathlib import Path
from typing import Callable

from evsel.errors import InputError
from evsel.ingest.parsers import parse_file
from evsel.ingest.parsers.base import ParsedDocument
from evsel.ingest.parsers.dialogue import parse_locomo_sample
from evsel.ingest.parsers.pdf import parse_pdf
from evsel.ingest.parsers.text import parse_book

from .folds import check_fold, select_fold
from .gold import Gold
from .records import EvalDataset, EvalQuestion


def default_data_dir() -> Path:
    """../shared/data beside the checkout that holds this package (--data-dir / EVSEL_DATA, resolved
    by the settings, come first)."""
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def _need(path: Path, what: str,
          hint: str = "point --data-dir (or EVSEL_DATA) at the folder holding the benchmark data") -> Path:
    if not path.exists():
        raise InputError(f"{what} is not there", hint, path=str(path))
    return path


def _pretty(slug: str) -> str:
    return slug.replace("-", " ").replace("_", " ").strip().title()


# LoCoMo ---------------------------------------------------------------------------------------

LOCOMO_CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
_DIA = re.compile(r"^D:?(\d+):(\d+)$")


def normalize_dia_ids(raw: str) -> tuple[list[str], list[str]]:
    """LoCoMo evidence string -> (well-formed ids as D<int>:<int>, pieces that are not ids).
    Handles joined ids ("D8:6; D9:17"), the "D:11:26" typo and zero padding ("D30:05")."""
    good, bad = [], []
    for piece in re.split(r"[;,\s]+", str(raw).strip()):
        if not piece:
            continue
        m = _DIA.match(piece)
        if m:
            good.append(f"D{int(m.group(1))}:{int(m.group(2))}")
        else:
            bad.append(piece)
    return good, bad


def load_locomo(data_dir: Path, **_) -> EvalDataset:
    path = _need(data_dir / "locomo" / "locomo10.json", "LoCoMo (locomo/locomo10.json)")
    samples = json.loads(path.read_text(encoding="utf-8"))
    loaders: dict[str, Callable[[], ParsedDocument]] = {}
    questions: list[EvalQuestion] = []
    malformed = missing = no_gold = 0
    for index, sample in enumerate(samples):
        key = str(sample.get("sample_id") or f"conversation-{index + 1}")
        loaders[key] = lambda s=sample, i=index: parse_locomo_sample(path, s, i)
        known = {
            f"D{int(m.group(1))}:{int(m.group(2))}"
            for turns in sample["conversation"].values() if isinstance(turns, list)
            for t in turns if isinstance(t, dict) and (m := _DIA.match(str(t.get("dia_id", ""))))
        }
        for n, qa in enumerate(sample.get("qa", [])):
            ids: list[str] = []
            for raw in qa.get("evidence") or []:
                good, bad = normalize_dia_ids(raw)
                malformed += len(bad)
                for turn in good:
                    if turn not in known:
                        missing += 1
                    elif turn not in ids:
                        ids.append(turn)
            if not ids:
                no_gold += 1
            category = int(qa.get("category", 0))
            answer = qa.get("answer")
            questions.append(EvalQuestion(
                qid=f"{key}/{n}",
                question=str(qa["question"]),
                docs=[key],
                answers=[] if answer is None else [str(answer)],
                gold=[Gold(doc=key, label=t, turn=t) for t in ids],
                group=LOCOMO_CATEGORIES.get(category, str(category)),
                meta={"category": category},
            ))
    notes = [
        f"{malformed} malformed evidence id piece(s) skipped (e.g. a bare 'D')",
        f"{missing} evidence id(s) naming no turn of their conversation skipped",
        f"{no_gold} question(s) with no usable evidence id: left out of recall, kept for answers",
        "category 5 (adversarial) is reported separately from the headline",
    ]
    return EvalDataset("locomo", loaders, questions, notes, answer_metric="locomo",
                       separate_groups=("adversarial",), source=str(path))


# FairytaleQA ----------------------------------------------------------------------------------

def _read_csv(path: Path) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _story_sections(path: Path) -> list[tuple[str, str]]:
    return [(row["section"].strip(), row["text"].strip()) for row in _read_csv(path)]


def load_fairytaleqa(data_dir: Path, split: str = "val", concat: int = 0, **_) -> EvalDataset:
    """Each story one document (sections joined by blank lines, read as a plain-text book), or with
    `concat` N > 0 every N stories (in file order) joined into one Markdown book, a heading per story."""
    split = split or "val"
    if split not in ("train", "val"):
        raise InputError(f"FairytaleQA has no split {split!r} here", "use --split train or val")
    root = _need(data_dir / "fairytaleqa", "FairytaleQA (fairytaleqa/)")
    story_dir = _need(root / "section-stories" / split, f"FairytaleQA {split} stories")
    question_dir = _need(root / "questions" / split, f"FairytaleQA {split} questions")
    stories = sorted(p.name[: -len("-story.csv")] for p in story_dir.glob("*-story.csv"))
    if concat < 0:
        raise InputError(f"--concat {concat} must be 0 or more")
    groups = [stories] if concat and concat >= len(stories) else (
        [stories[i:i + concat] for i in range(0, len(stories), concat)] if concat else [[s] for s in stories]
    )
    loaders: dict[str, Callable[[], ParsedDocument]] = {}
    questions: list[EvalQuestion] = []
    for members in groups:
        long_doc = len(members) > 1 or concat > 0
        key = members[0] if not long_doc else f"{split}-{members[0]}+{len(members) - 1}"
        parts: list[str] = []
        spans: dict[tuple[str, str], tuple[int, int]] = {}
        length = 0
        for story in members:
            if long_doc:
                heading = f"# {_pretty(story)}\n\n"
                parts.append(heading)
                length += len(heading)
            for section, text in _story_sections(story_dir / f"{story}-story.csv"):
                spans[(story, section)] = (length, length + len(text))
                piece = text + "\n\n"
                parts.append(piece)
                length += len(piece)
        text = "".join(parts)
        name = f"{key}.md" if long_doc else f"{key}.txt"
        loaders[key] = lambda t=text, n=name: parse_book(Path(n), t)
        for story in members:
            for row in _read_csv(question_dir / f"{story}-questions.csv"):
                sections = [s.strip() for s in row["cor_section"].split(",") if s.strip()]
                answers = [row.get(f"answer{i}", "").strip() for i in (1, 4)]
                if split == "train":
                    answers += [row.get(f"answer{i}", "").strip() for i in (2, 3, 5, 6)]
                questions.append(EvalQuestion(
                    qid=f"{story}/{row['question_id']}",
                    question=row["question"].strip(),
                    docs=[key],
                    answers=[a for a in answers if a],
                    gold=[Gold(doc=key, label=f"{story} section {s}", span=spans[(story, s)])
                          for s in sections if (story, s) in spans],
                    group=row.get("local-or-sum", "").strip() or "all",
                    meta={"attribute": row.get("attribute1", "")},
                ))
    name = "fairytaleqa" + (f"-concat{concat}" if concat else "")
    notes = [f"split {split}: {len(stories)} stories in {len(groups)} document(s)"]
    return EvalDataset(name, loaders, questions, notes, source=str(root))


# HippoRAG MuSiQue / HotpotQA ------------------------------------------------------------------

def _passage_corpus(passages: list[tuple[str, list[str]]]) -> tuple[str, dict, dict]:
    """The corpus as one Markdown book, a heading per passage (so chunks never cross passages).
    Returns the text, passage spans by (title, text) and sentence spans by (title, index)."""
    parts: list[str] = []
    by_passage: dict[tuple[str, str], tuple[int, int]] = {}
    by_sentence: dict[tuple[str, int], tuple[int, int]] = {}
    length = 0
    for title, sentences in passages:
        heading = f"# {title}\n\n"
        parts.append(heading)
        length += len(heading)
        start = length
        for i, sentence in enumerate(sentences):
            by_sentence[(title, i)] = (length, length + len(sentence))
            parts.append(sentence)
            length += len(sentence)
        body = "".join(sentences)
        by_passage[(title, " ".join(body.split()))] = (start, length)
        parts.append("\n\n")
        length += 2
    return "".join(parts), by_passage, by_sentence


def load_musique(data_dir: Path, **_) -> EvalDataset:
    root = _need(data_dir / "hipporag_multihop", "HippoRAG data (hipporag_multihop/)")
    corpus = json.loads((root / "musique_train_corpus.json").read_text(encoding="utf-8"))
    text, by_passage, _ = _passage_corpus([(p["title"], [p["text"]]) for p in corpus])
    key = "musique-corpus"
    questions = []
    unmatched = 0
    for item in json.loads((root / "musique_train.json").read_text(encoding="utf-8")):
        gold = []
        for p in item["paragraphs"]:
            if not p.get("is_supporting"):
                continue
            span = by_passage.get((p["title"], " ".join(p["paragraph_text"].split())))
            if span is None:
                unmatched += 1
                continue
            gold.append(Gold(doc=key, label=p["title"], span=span))
        hops = item["id"].split("__")[0]
        questions.append(EvalQuestion(
            qid=item["id"], question=item["question"], docs=[key],
            answers=[item["answer"], *item.get("answer_aliases", [])], gold=gold, group=hops,
        ))
    notes = [f"retrieval over the whole corpus: {len(corpus)} passages in one document",
             f"{unmatched} supporting paragraph(s) not found in the corpus"]
    return EvalDataset("musique", {key: lambda: parse_book(Path(f"{key}.md"), text)}, questions, notes,
                       source=str(root))


def load_hotpotqa(data_dir: Path, **_) -> EvalDataset:
    root = _need(data_dir / "hipporag_multihop", "HippoRAG data (hipporag_multihop/)")
    corpus = json.loads((root / "hotpotqa_train_corpus.json").read_text(encoding="utf-8"))
    text, _, by_sentence = _passage_corpus(list(corpus.items()))
    key = "hotpotqa-corpus"
    questions = []
    unmatched = 0
    for item in json.loads((root / "hotpotqa_train.json").read_text(encoding="utf-8")):
        gold = []
        for title, index in item["supporting_facts"]:
            span = by_sentence.get((title, int(index)))
            if span is None:
                unmatched += 1
                continue
            gold.append(Gold(doc=key, label=f"{title} #{index}", span=span))
        questions.append(EvalQuestion(
            qid=item["_id"], question=item["question"], docs=[key], answers=[item["answer"]], gold=gold,
            group=item.get("type", "all"),
        ))
    notes = [f"retrieval over the whole corpus: {len(corpus)} passages in one document; gold = supporting sentences",
             f"{unmatched} supporting sentence(s) not in the corpus"]
    return EvalDataset("hotpotqa", {key: lambda: parse_book(Path(f"{key}.md"), text)}, questions, notes,
                       source=str(root))


# PDFs: MMLongBench-Doc and FinanceBench ---------------------------------------------------------

_TEXT_SOURCES = ("Pure-text (Plain-text)", "Generalized-text (Layout)")


def load_mmlongbench(data_dir: Path, pdf_reader: str = "tables", **_) -> EvalDataset:
    root = _need(data_dir / "mmlongbench_doc", "MMLongBench-Doc (mmlongbench_doc/)")
    present = {p.name: p for p in (root / "documents").glob("*.pdf")}
    loaders = {name: (lambda p=path: parse_pdf(p, reader=pdf_reader)) for name, path in sorted(present.items())}
    questions = []
    visual_only = tables = 0
    for n, item in enumerate(json.loads((root / "samples.json").read_text(encoding="utf-8"))):
        if item["doc_id"] not in present:
            continue
        pages = [int(p) for p in ast.literal_eval(item["evidence_pages"] or "[]")]
        sources = ast.literal_eval(item["evidence_sources"] or "[]")
        if pages and not any(s in _TEXT_SOURCES for s in sources):
            if "Table" not in sources:
                visual_only += 1  # evidence only in figures or charts
                continue
            tables += 1  # a table's text is on its page (both PDF readers keep it)
        answerable = item["answer"] != "Not answerable"
        questions.append(EvalQuestion(
            qid=f"{item['doc_id']}/{n}", question=item["question"], docs=[item["doc_id"]],
            answers=[str(item["answer"])] if answerable else [],
            gold=[Gold(doc=item["doc_id"], label=f"page {p}", page=p) for p in pages],
            group="answerable" if answerable else "not-answerable",
            meta={"sources": sources},
        ))
    notes = [f"{len(present)} PDF(s) present; PDF reader: {pdf_reader}",
             f"{visual_only} question(s) skipped: their evidence is only in figures or charts",
             f"{tables} question(s) with evidence only in tables counted",
             "'Not answerable' questions have no gold pages: answers only"]
    return EvalDataset("mmlongbench", loaders, questions, notes, source=str(root))


def load_financebench(data_dir: Path, pdf_reader: str = "tables", **_) -> EvalDataset:
    root = _need(data_dir / "financebench", "FinanceBench (financebench/)")
    present = {p.stem: p for p in (root / "pdfs").glob("*.pdf")}
    loaders = {name: (lambda p=path: parse_pdf(p, reader=pdf_reader)) for name, path in sorted(present.items())}
    questions = []
    absent = 0
    for line in (root / "financebench_open_source.jsonl").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        if item["doc_name"] not in present:
            absent += 1
            continue
        gold = [
            # evidence_page_num is 0-based; evsel numbers pages from 1 as viewers do
            Gold(doc=e["doc_name"], label=f"page {int(e['evidence_page_num']) + 1}",
                 page=int(e["evidence_page_num"]) + 1, text=e.get("evidence_text") or None)
            for e in item.get("evidence", []) if e.get("doc_name") in present
        ]
        questions.append(EvalQuestion(
            qid=item["financebench_id"], question=item["question"], docs=[item["doc_name"]],
            answers=[str(item["answer"])], gold=gold, group=item.get("question_type", "all"),
        ))
    notes = [f"{len(present)} PDF(s) present; PDF reader: {pdf_reader}; {absent} question(s) skipped: their PDF is "
             "not in the data",
             "gold = evidence text located on its page (the whole page when the text is not found)"]
    return EvalDataset("financebench", loaders, questions, notes, source=str(root))


# NoCha ------------------------------------------------------------------------------------------

def load_nocha(data_dir: Path, **_) -> EvalDataset:
    root = _need(data_dir / "nocha", "NoCha (nocha/)")
    books = {p.stem: p for p in (root / "books").glob("*.txt")}
    loaders = {name: (lambda p=path: parse_file(p)[0]) for name, path in sorted(books.items())}
    questions = []
    absent = 0
    for n, item in enumerate(json.loads((root / "data_sample.json").read_text(encoding="utf-8"))):
        if item["book_title"] not in books:
            absent += 1
            continue
        label = item["type"] if isinstance(item["type"], bool) else str(item["type"]).lower() == "true"
        questions.append(EvalQuestion(
            qid=f"{item['book_title']}/{item['index']}/{'true' if label else 'false'}",
            question=item["claim"], docs=[item["book_title"]], answers=["True" if label else "False"],
            group=item["book_title"], meta={"label": label, "pair": f"{item['book_title']}/{item['index']}"},
        ))
    notes = [f"{len(books)} book(s); {absent} claim(s) skipped: their book is absent",
             "no gold evidence: the metric is pair accuracy (both claims of a pair right), needs --generate"]
    return EvalDataset("nocha", loaders, questions, notes, task="claims", answer_metric="claims", source=str(root))


# Generic JSONL ----------------------------------------------------------------------------------

JSONL_HELP = (
    'one JSON object a line: {"question": str, "answer": str or [str] (optional), '
    '"document": path or "documents": [paths] (relative to the JSONL file), '
    '"evidence": [str] (text found in the document) and/or "evidence_spans": '
    '[{"document": path, "start": int, "end": int}] (offsets in the text evsel extracts), '
    '"id" and "group" optional}'
)


def _jsonl_lines(path: Path):
    """(line number, text) of each non-blank line; a line that is not UTF-8 is refused by number."""
    for line_no, raw in enumerate(path.read_bytes().splitlines(), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"line {line_no} is not UTF-8 text (byte {exc.start + 1})",
                             "save the file as UTF-8", path=str(path)) from exc
        if line.strip():
            yield line_no, line


def _names(value, field_name: str) -> list[str]:
    """A document field's paths: one string or a list of strings, else ValueError saying what it is."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"'{field_name}' must be a path or a list of paths, not {json.dumps(value)[:60]}")
    return names


def _span(span, names: list[str]) -> tuple[str, int, int]:
    """(document name, start, end) of one evidence span, else ValueError saying what is wrong."""
    if not isinstance(span, dict):
        raise ValueError(f"an evidence span must be an object, not {json.dumps(span)[:60]}")
    for key in ("start", "end"):
        if not isinstance(span.get(key), int) or isinstance(span.get(key), bool):
            raise ValueError(f"an evidence span's '{key}' must be an integer, not {json.dumps(span.get(key))[:60]}")
    if not 0 <= span["start"] < span["end"]:
        raise ValueError(f"an evidence span must have 0 <= start < end, not {span['start']}-{span['end']}")
    return _names(span.get("document", names[0]), "document")[0], span["start"], span["end"]


def _text(value: str, field_name: str) -> str:
    """`value` when it is text a model can read: a lone surrogate ("\\ud800" in the JSON) is not."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"'{field_name}' holds a lone surrogate (\\u{ord(value[exc.start]):04x}), which is not "
                         "text; write the character itself") from None
    return value


def _answers(value) -> list[str]:
    """An answer field: a string (or number), a list of them, or absent."""
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(a, (str, int, float)) and not isinstance(a, bool) for a in items):
        raise ValueError(f"'answer' must be a string or a list of strings, not {json.dumps(value)[:60]}")
    return [_text(str(a), "answer") for a in items]


def _jsonl_item(item) -> tuple[list[str], list[str], list[tuple[str, int, int]]]:
    """(document names, evidence texts, evidence spans) of one line's object, checked field by field."""
    if not isinstance(item, dict) or item.get("question") is None or not str(item.get("question")).strip():
        raise ValueError("it has no 'question'")
    if not isinstance(item["question"], str):
        raise ValueError(f"'question' must be a string, not {json.dumps(item['question'])[:60]}")
    _text(item["question"], "question")
    _answers(item.get("answer", item.get("answers")))
    names = item.get("documents") or item.get("document")
    if not names:
        raise ValueError("it names no 'document'")
    names = _names(names, "documents" if item.get("documents") else "document")
    evidence = item.get("evidence") or []
    evidence = [evidence] if isinstance(evidence, str) else evidence
    if not isinstance(evidence, list) or not all(isinstance(t, str) for t in evidence):
        raise ValueError(f"'evidence' must be a list of strings, not {json.dumps(item.get('evidence'))[:60]}")
    evidence = [_text(t, "evidence") for t in evidence]
    spans = item.get("evidence_spans") or []
    if not isinstance(spans, list):
        raise ValueError(f"'evidence_spans' must be a list of objects, not {json.dumps(spans)[:60]}")
    return names, evidence, [_span(span, names) for span in spans]


def _resolve(base: Path, name: str) -> Path:
    return (base / name).resolve() if not Path(name).is_absolute() else Path(name)


def load_jsonl(path: Path, **_) -> EvalDataset:
    path = _need(path, "the JSONL file", "give the path of an existing .jsonl file (or a dataset's name)")
    base = path.parent
    loaders: dict[str, Callable[[], ParsedDocument]] = {}
    questions = []
    spans_of: dict[str, list[tuple[int, str, int, int]]] = {}  # document -> (line, name, start, end)
    for line_no, line in _jsonl_lines(path):
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"line {line_no} is not JSON ({exc.msg})", JSONL_HELP, path=str(path)) from exc
        try:
            names, evidence, spans = _jsonl_item(item)
        except ValueError as exc:
            raise InputError(f"line {line_no}: {exc}", JSONL_HELP, path=str(path)) from exc
        keys = []
        for name in names:
            doc_path = _resolve(base, name)
            if not doc_path.is_file():
                raise InputError(f"line {line_no}: document {name!r} does not exist",
                                 "paths are relative to the JSONL file", path=str(path))
            key = str(doc_path)
            if key not in loaders:
                # a file holding several documents (LoCoMo JSON) is read as its first one here
                loaders[key] = lambda p=doc_path: parse_file(p)[0]
            keys.append(key)
        gold = [Gold(doc=None, label=text[:40], text=text) for text in evidence]
        for doc_name, start, end in spans:
            key = str(_resolve(base, doc_name))
            if key not in keys:
                raise InputError(f"line {line_no}: evidence span names a document the line does not list",
                                 JSONL_HELP, path=str(path))
            gold.append(Gold(doc=key, label=f"{start}-{end}", span=(start, end)))
            spans_of.setdefault(key, []).append((line_no, doc_name, start, end))
        answers = _answers(item.get("answer", item.get("answers")))
        questions.append(EvalQuestion(
            qid=str(item.get("id", line_no)), question=str(item["question"]).strip(), docs=keys,
            answers=answers, gold=gold, group=str(item.get("group", "all")),
        ))
    if not questions:
        raise InputError("the JSONL file has no questions", JSONL_HELP, path=str(path))
    for key, spans in spans_of.items():  # offsets past a document's end would count as gold never found
        doc = loaders[key]()
        loaders[key] = lambda doc=doc: doc
        for line_no, name, start, end in spans:
            if end > len(doc.text):
                raise InputError(f"line {line_no}: evidence span {start}-{end} is outside document {name!r} "
                                 f"({len(doc.text)} characters)",
                                 "offsets count the characters of the text evsel extracts from the document",
                                 path=str(path))
    notes = ["evidence strings found in a listed document by text overlap (whichever documents hold them)"]
    return EvalDataset(path.stem, loaders, questions, notes, source=str(path))


ADAPTERS = {
    "locomo": load_locomo,
    "fairytaleqa": load_fairytaleqa,
    "musique": load_musique,
    "hotpotqa": load_hotpotqa,
    "mmlongbench": load_mmlongbench,
    "financebench": load_financebench,
    "nocha": load_nocha,
}


def load_dataset(name: str, data_dir: Path | None = None, split: str | None = None, concat: int = 0,
                 fold: int | None = None, pdf_reader: str = "tables") -> EvalDataset:
    """A dataset by name, or a generic JSONL file by path; `fold` keeps one of the fixed folds
    (evaluation/folds.py) of LoCoMo, MuSiQue or HotpotQA; `pdf_reader`: how PDFs are read
    (Settings.pdf_reader)."""
    if name.endswith(".jsonl") or Path(name).is_file():
        return load_jsonl(Path(name).expanduser())
    if name not in ADAPTERS:
        raise InputError(f"unknown dataset {name!r}",
                         f"choose one of: {', '.join(ADAPTERS)}, or give a path to a .jsonl file")
    check_fold(name, fold)
    data_dir = data_dir or default_data_dir()
    data = ADAPTERS[name](data_dir, split=split, concat=concat, pdf_reader=pdf_reader)
    return data if fold is None else select_fold(data, fold)
