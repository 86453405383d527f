"""`evsel train ... --out` where nothing can be written (a read-only disk, a file on the way): one
line before any work, for every trainer."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from evsel.cli import main

TRAINERS = [["convert"], ["unreal"], ["qrranker"], ["qrranker", "--detect-heads"], ["hybrid"], ["blocksearch"],
            ["reader"]]


def _read_only_folder(tmp_path: Path) -> tuple[Path, str | None]:
    """A folder nothing can be written in: a read-only tmpfs as root, else one without write permission."""
    folder = tmp_path / "ro"
    folder.mkdir()
    if os.getuid() != 0:
        folder.chmod(0o555)
        return folder, None
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)],
                          capture_output=True, text=True)
    return folder, None if made.returncode == 0 else f"mount -o ro failed: {made.stderr.strip()}"


@pytest.mark.parametrize("trainer", TRAINERS, ids=["-".join(t) for t in TRAINERS])
def test_train_out_under_a_file_is_one_line(trainer, tmp_path, capsys):
    (tmp_path / "a-file").write_text("not a folder\n")
    out = tmp_path / "a-file" / "run"
    assert main(["train", *trainer, "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "unexpected" not in err and "Traceback" not in err, err
    assert f"cannot write to --out {out}: a part of it is a file, not a folder" in err, err


@pytest.mark.parametrize("trainer", TRAINERS, ids=["-".join(t) for t in TRAINERS])
def test_train_out_on_a_read_only_folder_is_one_line(trainer, tmp_path, capsys):
    folder, why = _read_only_folder(tmp_path)
    if why:
        pytest.skip(why)
    try:
        assert main(["train", *trainer, "--out", str(folder / "run")]) == 1
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True)
    err = capsys.readouterr().err
    assert "unexpected" not in err and "Traceback" not in err, err
    assert f"cannot write to --out {folder / 'run'}: " in err and "choose a folder you can write to" in err, err
    assert not (folder / "run").exists()
