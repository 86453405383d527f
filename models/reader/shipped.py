"""Which reader answers for a backbone: the one trained for it and shipped in the package, or one in
a given folder, of either kind (the span head, models/reader/span_head.py, or the LoRA reader,
models/reader/lora.py; the folder's reader.json says which); and what `evsel models info` says of it."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from evsel.models.reader.span_head import CONFIG_FILE, Reader
from evsel.errors import EvselError
from evsel.models.shared.trained_files import read_json


READERS_FILE = "readers.json"  # which shipped reader reads prose and which dialogues
READERS_FORMAT = "evsel-readers/1"


def shipped_reader_dir(fingerprint: str, dialogue: bool = False) -> Path:
    """Where the package keeps the trained reader of a backbone (by fingerprint prefix) for prose
    or for dialogues: the folder the backbone's readers.json names for that kind, else `reader`."""
    root = Path(__file__).parent.parent / "adapters" / fingerprint[:16]
    name = "reader"
    if (root / READERS_FILE).is_file():
        record = read_json(root / READERS_FILE, "the readers record", "reinstall evsel")
        if record.get("format") != READERS_FORMAT:
            raise EvselError(f"{root / READERS_FILE} is not a {READERS_FORMAT} record", "reinstall evsel")
        name = record["dialogue" if dialogue else "prose"]["reader"]
    return root / name


def shipped_readers(fingerprint: str) -> dict:
    """The readers record of a backbone (the reader per kind and why), or {} without one."""
    path = Path(__file__).parent.parent / "adapters" / fingerprint[:16] / READERS_FILE
    return read_json(path, "the readers record", "reinstall evsel") if path.is_file() else {}


_LOADED: dict = {}


def reader_for(backbone, folder: str | Path | None = None, dialogue: bool = False) -> "Reader | None":
    """The reader in `folder`, else the one shipped for the backbone to read prose or dialogues
    (None when there is none); loaded once per process."""
    path = Path(folder) if folder else shipped_reader_dir(backbone.fingerprint, dialogue)
    if folder is None and not (path / CONFIG_FILE).is_file():
        return None
    key = (str(path.resolve()), backbone.fingerprint)
    if key not in _LOADED:
        from evsel.models.reader.lora import LORA_READER_FORMAT, LoraReader
        from evsel.models.reader.span_decoder import SPAN_DECODER_FORMAT, SpanDecoder

        fmt = read_json(path / CONFIG_FILE, "the reader's config", "evsel train reader").get("format")
        if fmt == SPAN_DECODER_FORMAT:
            _LOADED[key] = SpanDecoder.load(path)
        elif fmt == LORA_READER_FORMAT:
            _LOADED[key] = LoraReader.load(path, backbone.model)
        else:
            _LOADED[key] = Reader.load(path, backbone.model.config.hidden_size)
    return _LOADED[key]


def describe(reader: "Reader | None") -> dict | None:
    """What `evsel models info` says of a reader: what it was trained on and its held-out numbers."""
    if reader is None:
        return None
    from evsel.models.reader.span_decoder import SpanDecoder

    if isinstance(reader, SpanDecoder):
        return {"kind": "span decoder", "settings": asdict(reader.config)}
    if not isinstance(reader, Reader):  # the LoRA reader
        trained = reader.meta.get("trained_on", {})
        sources = {k: len(v.get("question_ids", [])) for k, v in trained.items() if isinstance(v, dict)}
        return {"kind": "lora", "layers": f"{reader.config.cut + 1}-{reader.config.deepest}",
                "rank": reader.config.rank, "trained_on": {"fold": trained.get("fold"), "questions": sources,
                                                           "no_answer": trained.get("no_answer_examples")},
                "dev": reader.meta.get("dev"), "abstention_dev": reader.meta.get("abstention"),
                "prose_abstention": reader.meta.get("prose_abstention")}
    trained = reader.meta.get("trained_on", {})
    sources = {k: len(v.get("question_ids", [])) for k, v in trained.items() if isinstance(v, dict)}
    rescore = reader.meta.get("rescore", {})
    return {"trained_on": {"fold": trained.get("fold"), "questions": sources},
            "dev": reader.meta.get("dev"), "abstain_below": round(reader.threshold, 4),
            "abstention_dev": {k: v for k, v in reader.meta.get("abstention", {}).items() if k != "abstain_below"},
            "answer_step_dev": rescore.get("dev")}
