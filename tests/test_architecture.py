"""The layering, as import-linter contracts (.importlinter): models use neither the daemon, the
recipes, the engine nor the CLI; recipes do not use the daemon; commands only parse, call the
engine and print; the methods share code only through shared modules. And one rule import-linter
cannot state: no module imports or reads an underscore-prefixed (private) name of another."""

from __future__ import annotations

import ast
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


def _modules() -> dict[str, Path]:
    """{dotted name: file} of every module of the installed `evsel` namespace."""
    out = {}
    for target, source in LAYOUT.items():
        for path in (ROOT / source).rglob("*.py"):
            parts = list(path.relative_to(ROOT / source).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(target.split("/") + parts)] = path
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_crossings(modules: dict[str, Path], root: Path = ROOT) -> list[str]:
    """Where a module imports (`from evsel.x import _name`, relative imports too) or reads
    (`x._name`, `evsel.x._name`, x bound to an evsel module by an import anywhere in the file) an
    underscore-prefixed name of another evsel module. Dunder names are public."""
    found = []
    for name, path in sorted(modules.items()):
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        bound: dict[str, str] = {}  # local name -> the evsel module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "evsel":
                        bound[alias.asname or "evsel"] = alias.name if alias.asname else "evsel"
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                if source.split(".")[0] != "evsel":
                    continue
                for alias in node.names:
                    if _private(alias.name) and source != name:
                        found.append(f"{path.relative_to(root)}:{node.lineno}: imports {source}.{alias.name}")
                    if f"{source}.{alias.name}" in modules:
                        bound[alias.asname or alias.name] = f"{source}.{alias.name}"
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _private(node.attr)):
                continue
            chain, at = [], node.value
            while isinstance(at, ast.Attribute):
                chain.append(at.attr)
                at = at.value
            if isinstance(at, ast.Name) and at.id in bound:
                owner = ".".join([bound[at.id], *reversed(chain)])
                if owner in modules and owner != name:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: reads {owner}.{node.attr}")
    return found


def test_no_private_name_crosses_modules():
    modules = _modules()
    assert {"evsel.cli", "evsel.daemon.server", "evsel.models.qrranker", "evsel.recipes.qrranker"} <= set(modules)
    assert private_crossings(modules) == []


def test_the_private_name_check_finds_imports_and_reads(tmp_path):
    """The check itself: each way of reaching a private name of another module is found; a
    module's own private names, dunders and public names are not."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("_secret = 1\n__version__ = 2\n\n\ndef _own():\n    return _own\n")
    (tmp_path / "pkg" / "b.py").write_text(
        "import evsel.pkg.a\n"
        "from evsel.pkg import a as alias\n"
        "from evsel.pkg.a import _secret, __version__\n"
        "from . import a\n"
        "from .a import _own\n"
        "\n\ndef f():\n"
        "    from evsel.pkg import a as inner\n"
        "    return alias._secret, a._own(), evsel.pkg.a._secret, inner._secret, a.__version__, f._cache\n")
    modules = {"evsel.pkg": tmp_path / "pkg" / "__init__.py", "evsel.pkg.a": tmp_path / "pkg" / "a.py",
               "evsel.pkg.b": tmp_path / "pkg" / "b.py"}
    found = [line.split(": ", 1)[1] for line in private_crossings(modules, tmp_path)]
    assert sorted(found) == sorted([
        "imports evsel.pkg.a._secret", "imports evsel.pkg.a._own", "reads evsel.pkg.a._secret",
        "reads evsel.pkg.a._own", "reads evsel.pkg.a._secret", "reads evsel.pkg.a._secret"])


# The core: what every method runs through. It builds selectors from a parsed spec and never names
# one, so a selector is added or changed in models/selectors/ alone.
CORE = ["evsel_cli/pipeline.py", "evsel_cli/engine.py", "evsel_cli/ingest.py", "evsel_cli/store.py",
        "evsel_cli/evaluation"]
# engine functions that may name one, and why: training recipes are named for what they train
NAMING_ALLOWED = {"evsel_cli/engine.py": {"train_convert", "train_unreal", "train_qrranker", "train_blocksearch",
                                          "train_hybrid"},
                  # the first stages that read no model, until the selector registry says so itself
                  "evsel_cli/pipeline.py": {"needs_model"}}


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

    # `default` is the name of what ask runs with no --select, and a common word: not a method to special-case
    names = set(available()) - {"default"}
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


def _readme_roles() -> dict[str, str]:
    """The README's one-line roles: {path in backticks at the start of a bullet: the whole line}."""
    import re

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Layout"):]
    section = section[: section.index("\n## ", 1)]
    roles = {}
    for line in section.splitlines():
        for path in re.findall(r"^- (?:`([^`]+)`(?:, )?)+", line) and re.findall(r"`([^`]+)`", line.split(":", 1)[0]):
            roles[path] = line
    return roles


def test_the_readme_gives_every_module_a_role():
    """A module is named with its path, or its folder's line names it (`models/selectors/`: ... `bm25` ...)."""
    roles = _readme_roles()
    missing = []
    for source in LAYOUT.values():
        for path in sorted((ROOT / source).rglob("*.py")):
            if path.name in ("__init__.py", "__main__.py") and path.parent.name != "parsers":
                continue
            rel = path.relative_to(ROOT).as_posix()
            folder = path.parent.relative_to(ROOT).as_posix() + "/"
            stem = path.stem if path.name != "__init__.py" else "__init__.py"
            if rel in roles or (folder in roles and f"`{stem}" in roles[folder]):
                continue
            missing.append(rel)
    assert not missing, f"README's Layout section gives these no role: {missing}"
