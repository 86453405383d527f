"""A damaged trained part (the UNREAL adapter, the BlockSearch router, the hybrid weights): `evsel
ask` says in one line which file is damaged and how to get a good one back, through the real CLI
with the real model, and the store is left as it was."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest

from evsel.cli import main
from evsel.models.shared.trained_files import SHIPPED

FINGERPRINT = "b179c9523d0e6a0f"  # the bundled SmolLM2's


def _truncated(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _random(path: Path) -> None:
    import random

    path.write_bytes(random.Random(0).randbytes(path.stat().st_size))


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _header(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def _write_header(path: Path, header: dict, body: bytes) -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + body)


def _header_past_the_end(path: Path) -> None:
    """A header whose first tensor claims more bytes than the file holds."""
    header, body = _header(path)
    name = next(k for k in header if k != "__metadata__")
    start, end = header[name]["data_offsets"]
    header[name]["data_offsets"] = [start, end + len(body) + 64]
    header[name]["shape"] = [(end + len(body) + 64 - start) // 4]
    _write_header(path, header, body)


def _header_of_another_shape(path: Path) -> None:
    """A header that reads the same bytes as a tensor of another shape (its size kept)."""
    header, body = _header(path)
    for name, info in header.items():
        if name != "__metadata__":
            count = 1
            for n in info["shape"]:
                count *= n
            info["shape"] = [count]
    _write_header(path, header, body)


def _malformed(path: Path) -> None:
    path.write_text(path.read_text()[:40])


def _a_list(path: Path) -> None:
    path.write_text("[1, 2, 3]\n")


def _wrong_field(field: str, value):
    def damage(path: Path) -> None:
        data = json.loads(path.read_text())
        data[field] = value
        path.write_text(json.dumps(data))
    damage.__name__ = f"_{field}_is_{type(value).__name__}"
    return damage


TENSORS = [_truncated, _random, _empty, _header_past_the_end, _header_of_another_shape]
JSON = [_malformed, _a_list, _empty]

# part -> (shipped folder, the setting naming a folder, the damaged file, --select)
PARTS = {
    "unreal": ("unreal", "EVSEL_UNREAL_ADAPTER", "unreal"),
    "router": ("blocksearch-router", "EVSEL_BLOCKSEARCH_ROUTER", "blocksearch:router"),
    "hybrid": ("hybrid", "EVSEL_HYBRID_WEIGHTS", "hybrid"),
}
CASES = (
    [("unreal", "adapter.safetensors", d) for d in TENSORS]
    + [("router", "adapter.safetensors", d) for d in TENSORS]
    + [("unreal", "config.json", d) for d in [*JSON, _wrong_field("config", 5), _wrong_field("hidden", "wide")]]
    + [("router", "adapter.json", d) for d in [*JSON, _wrong_field("layers", "all"), _wrong_field("rank", [8])]]
    + [("hybrid", "hybrid.json", d) for d in [*JSON, _wrong_field("weight_sets", [{"groups": 5, "weights": 1}]),
                                              _wrong_field("weight_sets", {"a": 1})]]
)


@pytest.fixture(scope="module")
def story(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("story") / "harbour.txt"
    path.write_text("The harbour master kept a log. It recorded every ship that came in. " * 20)
    return path


@pytest.mark.parametrize("part,name,damage", CASES,
                         ids=[f"{p}-{n}-{d.__name__.strip('_')}" for p, n, d in CASES])
def test_a_damaged_trained_part_is_one_line_naming_the_file(part, name, damage, story, tmp_path, monkeypatch, capsys):
    folder_name, setting, select = PARTS[part]
    folder = tmp_path / folder_name
    shutil.copytree(SHIPPED / FINGERPRINT / folder_name, folder)
    damage(folder / name)
    assert main(["ingest", str(story)]) == 0
    capsys.readouterr()
    monkeypatch.setenv(setting, str(folder))
    code = main(["ask", "Who kept the log?", "--select", select, "--evidence-only"])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("evsel: error:")]
    assert code == 1 and "Traceback" not in err and "unexpected" not in err, err
    assert len(lines) == 1 and str(folder / name) in lines[0], err
    assert "train it again with: evsel train" in lines[0], err
    assert main(["docs", "list", "--json"]) == 0 and len(json.loads(capsys.readouterr().out)) == 1


def test_a_damaged_shipped_file_says_to_reinstall(tmp_path):
    from evsel.models.shared.trained_files import remedy

    assert "reinstall evsel" in remedy(SHIPPED / FINGERPRINT / "unreal" / "config.json", "evsel train unreal")
    assert "train it again" in remedy(tmp_path / "config.json", "evsel train unreal")
