"""QRRanker's head lists (heads.json): the (layer, head) pairs whose attention scores chunks, as
`evsel train qrranker --detect-heads` writes them and the package ships them per backbone. Shared:
QRRanker scores with them, BlockSearch sums the QR heads of its routing layer."""

from __future__ import annotations

import re
from pathlib import Path

from evsel.errors import ModelError
from evsel.models.shared.trained_files import read_json, reading

HEADS_FILE = "heads.json"
HEADS_FORMAT = "evsel-qrranker-heads/1"


def parse_heads(text: str) -> list[tuple[int, int]]:
    """'14-3,17-0' -> [(14, 3), (17, 0)]: (layer, head), layer 0-based as in model.layers and
    the seed's 'l-h' notation."""
    out = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d+)-(\d+)\s*", part)
        if not match:
            raise ModelError(f"{text!r} is not a head list like 14-3,17-0", "give LAYER-HEAD pairs, 0-based")
        out.append((int(match.group(1)), int(match.group(2))))
    return out


def format_heads(heads: list[tuple[int, int]]) -> str:
    return ",".join(f"{layer}-{head}" for layer, head in heads)


def shipped_heads_dir(fingerprint: str) -> Path:
    """Where the package keeps the detected heads for a backbone (by fingerprint prefix)."""
    return Path(__file__).parent.parent / "adapters" / fingerprint[:16] / "qrranker"


def load_head_file(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / HEADS_FILE
    data = read_json(path, "the QR head list", "evsel train qrranker --detect-heads")
    if data.get("format") != HEADS_FORMAT or not data.get("heads"):
        raise ModelError(f"{path} is not a QR head list ({HEADS_FORMAT})",
                         "give a heads.json written by: evsel train qrranker --detect-heads")
    with reading(path, "the QR head list", "evsel train qrranker --detect-heads"):
        for encoding in [None, *(data.get("by_encoding") or {})]:
            heads_of(data, encoding)  # each list it holds reads as (layer, head) pairs
    return data


def heads_of(data: dict, encoding: str | None = None) -> list[tuple[int, int]]:
    """The head list of a heads.json for an encoding (its own list when detected under it)."""
    chosen = (data.get("by_encoding") or {}).get(encoding) if encoding else None
    return [(int(h["layer"]), int(h["head"])) for h in (chosen or data["heads"])]


def shipped_heads(fingerprint: str, encoding: str | None = None) -> tuple[list[tuple[int, int]], str | None]:
    """The head list the package ships for a backbone (for `encoding`) and its file; ([], None)
    when none ships or it cannot be read."""
    path = shipped_heads_dir(fingerprint) / HEADS_FILE
    try:
        return heads_of(load_head_file(path), encoding), str(path)
    except ModelError:
        return [], None
