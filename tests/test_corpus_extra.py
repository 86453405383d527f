"""Without the `scale` extra evsel still imports and runs; `evsel corpus build` says what to install."""

from __future__ import annotations

import subprocess
import sys

# the extra's modules made unimportable in a child process, as in a default install
HIDE = "import sys; [sys.modules.__setitem__(m, None) for m in ('ray', 'lance', 'lance_ray', 'pyarrow', 'lancedb')]; "


def run(*args: str) -> subprocess.CompletedProcess:
    code = HIDE + "from evsel.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


def test_corpus_build_without_the_extra_says_how_to_install_it(tmp_path):
    (tmp_path / "a.txt").write_text("One sentence.")
    result = run("corpus", "build", str(tmp_path), "--out", str(tmp_path / "out"))
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert "pip install 'evsel[scale]'" in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_corpus_layout_loads_without_the_extra():
    code = HIDE + "from evsel.corpus import schema, rows; print(schema.FORMAT, schema.chunk_id('ab', 3))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["evsel-corpus", "ab:3"]
