"""The layering, as import-linter contracts (.importlinter): models use neither the daemon, the
recipes, the engine nor the CLI; recipes do not use the daemon; commands only parse, call the
engine and print."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the folders pyproject.toml maps into the one `evsel` namespace
LAYOUT = {"evsel": "evsel_cli", "evsel/daemon": "daemon", "evsel/models": "models", "evsel/recipes": "recipes"}


def test_import_contracts_hold(tmp_path):
    try:  # a missing checker must fail, not pass unseen as a skip
        import importlinter  # noqa: F401
    except ImportError:
        pytest.fail("import-linter is not installed: it is a test dependency, pip install -e '.[test]'")
    # import-linter walks a package's folder; evsel's subpackages live in sibling folders, so lay
    # the namespace out as it is installed
    for target, source in LAYOUT.items():
        shutil.copytree(ROOT / source, tmp_path / target, ignore=shutil.ignore_patterns("__pycache__", "adapters"))
    result = subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command as c; "
                               "sys.exit(c.main(standalone_mode=False, args=sys.argv[1:]))",
         "--config", str(ROOT / ".importlinter"), "--no-cache"],
        cwd=tmp_path, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "BROKEN" not in result.stdout
