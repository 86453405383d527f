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
    pytest.importorskip("importlinter", reason="import-linter is a test dependency: pip install -e '.[test]'")
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


# The core: what every method runs through. It builds selectors from a parsed spec and never names
# one, so a selector is added or changed in models/selectors/ alone.
CORE = ["evsel_cli/pipeline.py", "evsel_cli/engine.py", "evsel_cli/store.py", "evsel_cli/evaluation"]
# engine functions that may name one, and why: training recipes are named for what they train, and
# ingest's UNREAL state encoding is engine.ingest's (being moved behind the selectors separately)
NAMING_ALLOWED = {"evsel_cli/engine.py": {"train_convert", "train_unreal", "train_qrranker", "train_blocksearch",
                                          "_encode_unreal_states"}}


def _named_in(path: Path, names: set[str], allowed: set[str]) -> list[str]:
    """Where the module's code (not its comments or docstrings) names one of `names`: an
    identifier, an attribute, an imported module or name, or a word of a string."""
    import ast
    import re

    word = re.compile(r"\b(" + "|".join(sorted(names)) + r")\b")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant) and isinstance(node.body[0].value.value, str)}
    skipped = {id(n) for node in ast.walk(tree)
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in allowed
               for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped or id(node) in docstrings:
            continue
        texts = []
        if isinstance(node, ast.Name):
            texts = [node.id]
        elif isinstance(node, ast.Attribute):
            texts = [node.attr]
        elif isinstance(node, ast.alias):
            texts = [node.name, node.asname or ""]
        elif isinstance(node, ast.ImportFrom):
            texts = [node.module or ""]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts = [node.value]
        for text in texts:
            for part in text.split("."):
                found += [f"{path}:{node.lineno}: {m.group(1)!r} in {text!r}" for m in word.finditer(part)]
    return found


def test_the_core_names_no_selector(tmp_path):
    from evsel.models.selectors import available

    names = set(available())
    assert {"bm25", "qrranker", "blocksearch"} <= names
    files = [p for entry in CORE for p in sorted((ROOT / entry).rglob("*.py") if (ROOT / entry).is_dir()
                                                 else [ROOT / entry])]
    found = [hit for f in files
             for hit in _named_in(f, names, NAMING_ALLOWED.get(str(f.relative_to(ROOT)), set()))]
    assert not found, "\n".join(found)
    # and the check can fail: the old engine special-cased BM25 by name
    planted = tmp_path / "core.py"
    planted.write_text('def ask(select):\n    """bm25 in a docstring is fine"""\n'
                       '    return select == "bm25"  # a comment may say qrranker\n', encoding="utf-8")
    assert [h.split(": ", 1)[1] for h in _named_in(planted, names, set())] == ["'bm25' in 'bm25'"]


def test_the_store_imports_no_model_code():
    """Deleting chunks runs the cleanups selectors registered (BlockSearch's key files), so the
    store needs no model module."""
    import ast

    tree = ast.parse((ROOT / "evsel_cli" / "store.py").read_text(encoding="utf-8"))
    modules = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in modules if m.startswith("evsel.models") or m == "models"]
