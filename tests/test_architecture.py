"""The layering, as import-linter contracts (.importlinter): models use neither the daemon, the
recipes, the engine nor the CLI; recipes do not use the daemon; commands only parse, call the
engine and print; the methods share code only through shared modules. And rules import-linter
cannot state, each with a planted violation that makes it fail: no module imports or reads an
underscore-prefixed (private) name of another module, another object or a library; the daemon and
the core name no selector; only settings.py reads evsel's environment variables; one BM25."""

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
    assert {"evsel.cli", "evsel.daemon.server", "evsel.models.qrranker.rerank", "evsel.recipes.qrranker"} <= set(modules)
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


# The core (evsel_cli/: the engine, ingest, the store, the pipeline, eval, ...) and the daemon: what
# every method runs through. They build selectors from a parsed spec and ask the registry about
# them, never naming one, so a selector is added or changed in models/selectors/ alone. Except:
CORE = ["evsel_cli", "daemon"]
NOT_CORE = {
    "evsel_cli/commands": "the CLI's options and help name methods for the user",
    "evsel_cli/corpus": "a corpus stores one index per first stage (BM25 terms, dense and UNREAL vectors)",
    "evsel_cli/defaults.py": "the defaults of --select and --methods are methods",
    "evsel_cli/requests.py": "the requests' help texts (the CLI's options) name methods for the user",
}
# functions that may name one, and why: training recipes are named for what they train; the daemon's
# status reads the notes of QRRanker's KV files a full disk kept unwritten (models/qrranker/kv.py)
NAMING_ALLOWED = {"evsel_cli/engine.py": {"train_convert", "train_unreal", "train_qrranker", "train_blocksearch",
                                          "train_hybrid", "train_defaults"},
                  "daemon/server.py": {"status"}}


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


def test_the_daemon_and_the_core_name_no_selector(tmp_path):
    from evsel.models.selectors import available

    # `default` is the name of what ask runs with no --select, and a common word: not a method to special-case
    names = set(available()) - {"default"}
    assert {"bm25", "qrranker", "blocksearch"} <= names
    files = [p for entry in CORE for p in sorted((ROOT / entry).rglob("*.py"))
             if not any(p.relative_to(ROOT).as_posix().startswith(skip) for skip in NOT_CORE)]
    assert {"evsel_cli/engine.py", "evsel_cli/pipeline.py", "daemon/server.py"} <= {
        f.relative_to(ROOT).as_posix() for f in files}
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

    tree = ast.parse((ROOT / "evsel_cli" / "store" / "store.py").read_text(encoding="utf-8"))
    modules = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in modules if m.startswith("evsel.models") or m == "models"]


def _module_roles() -> dict[str, str]:
    """docs/ARCHITECTURE.md's one-line roles: {path in backticks at the start of a bullet: the whole line}."""
    import re

    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    section = text[text.index("\n## Modules\n"):]
    end = section.find("\n## ", 1)
    section = section if end == -1 else section[:end]
    roles = {}
    for line in section.splitlines():
        for path in re.findall(r"^- (?:`([^`]+)`(?:, )?)+", line) and re.findall(r"`([^`]+)`", line.split(":", 1)[0]):
            roles[path] = line
    return roles


def _modules_to_describe() -> list[str]:
    """Every module of the four folders, from the tree: what the list must name."""
    modules = []
    for source in LAYOUT.values():
        for path in sorted((ROOT / source).rglob("*.py")):
            if path.name in ("__init__.py", "__main__.py") and not any(
                    isinstance(node, (ast.FunctionDef, ast.ClassDef)) for node in ast.parse(path.read_text(encoding="utf-8")).body):
                continue  # a package marker or a one-call entry point: no code of its own to describe
            modules.append(path.relative_to(ROOT).as_posix())
    return modules


def test_the_architecture_doc_gives_every_module_a_role():
    """A module is named with its path, or its folder's line names it (`models/selectors/`: ... `bm25` ...);
    the expectation comes from the tree, so a module moved or added fails until the list follows."""
    roles = _module_roles()
    missing = []
    for rel in _modules_to_describe():
        folder = rel.rsplit("/", 1)[0] + "/"
        stem = rel.rsplit("/", 1)[1].removesuffix(".py")
        if rel in roles or (folder in roles and f"`{stem}" in roles[folder]):
            continue
        missing.append(rel)
    assert not missing, f"docs/ARCHITECTURE.md's module list gives these no role: {missing}"


def test_the_architecture_doc_names_no_module_that_is_gone():
    stale = [path for path in _module_roles() if "<" not in path and not (ROOT / path).exists()]  # <fingerprint>: a pattern
    assert not stale, f"docs/ARCHITECTURE.md's module list names paths that are not in the tree: {stale}"



def test_the_bench_readme_names_every_script():
    """bench/README.md names every script under bench/ (by its path there, in backticks)."""
    bench = ROOT / "bench"
    text = (bench / "README.md").read_text(encoding="utf-8")
    scripts = sorted(path.relative_to(bench).as_posix() for path in bench.rglob("*")
                     if path.suffix in (".py", ".sh") and "__pycache__" not in path.parts)
    missing = [script for script in scripts if f"`{script}`" not in text]
    assert not missing, f"bench/README.md does not name: {missing}"


# Private names of other objects and of libraries: what a module reads of another object, or of a
# library, is its public API. Each use allowed here says why.
PRIVATE_ALLOWED = {
    # (file, the expression as written): why
    ("models/blocksearch/scoring.py", "view._skipped"): "a PackedKeys sets the cache of a view it makes of itself",
}


def private_uses(files: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(file, expression, line) where a module reads an underscore-prefixed attribute of anything
    but `self`/`cls` (another object, a library module), or imports a library's private module
    or name (`from typer._click import ...`, `from lance import _x`). evsel's own modules are
    `private_crossings`' (imports of another evsel module's private names)."""
    found = []
    for rel, path in sorted(files.items()):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                    found.append((rel, ast.unparse(node), node.lineno))
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] != "evsel":
                parts = (node.module or "").split(".")
                names = [alias.name for alias in node.names]
                if any(_private(p) for p in parts) or any(_private(n) for n in names):
                    found.append((rel, f"from {node.module} import {', '.join(names)}", node.lineno))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] != "evsel" and any(_private(p) for p in alias.name.split(".")):
                        found.append((rel, f"import {alias.name}", node.lineno))
    return found


def _source_files() -> dict[str, Path]:
    return {path.relative_to(ROOT).as_posix(): path for source in LAYOUT.values()
            for path in sorted((ROOT / source).rglob("*.py"))}


def test_no_private_attribute_of_another_object_or_library_is_used():
    found = private_uses(_source_files())
    unexplained = [f"{rel}:{line}: {expr}" for rel, expr, line in found if (rel, expr) not in PRIVATE_ALLOWED]
    assert not unexplained, "\n".join(unexplained)
    stale = set(PRIVATE_ALLOWED) - {(rel, expr) for rel, expr, _ in found}
    assert not stale, f"allowed uses that are gone (drop them from PRIVATE_ALLOWED): {sorted(stale)}"


def test_the_private_attribute_check_finds_other_objects_and_libraries(tmp_path):
    planted = tmp_path / "m.py"
    planted.write_text(
        "import lance\nimport typer._click\nfrom typer._coercion import build\nfrom lance import _x, public\n"
        "from . import _own\n\n\nclass A:\n"
        "    def f(self, other):\n"
        "        return self._mine, cls._too if False else other._theirs, lance.dataset(1)._take_rows, "
        "self.part._inner, other.__dict__\n", encoding="utf-8")
    found = sorted(expr for _, expr, _ in private_uses({"m.py": planted}))
    assert found == sorted(["import typer._click", "from typer._coercion import build",
                            "from lance import _x, public", "other._theirs", "lance.dataset(1)._take_rows",
                            "self.part._inner"])


# Settings: evsel's environment variables are read in evsel_cli/settings.py only (its docstring
# says why). Each other reader allowed here says why.
SETTINGS_MODULE = "evsel_cli/settings.py"
ENV_READS_ALLOWED = {
    "evsel_cli/commands/typer_cli.py": "--device, --model and --no-daemon fall back to their variables through Typer's envvar, so "
                        "a bad value is reported as the option's",
    "evsel_cli/commands/eval.py": "--data-dir falls back to EVSEL_DATA through Typer's envvar (checked as the "
                                  "option's path)",
    "evsel_cli/commands/daemon.py": "--idle-timeout falls back to EVSEL_DAEMON_IDLE through Typer's envvar, so a "
                                    "bad value is reported as the option's",
}


def env_reads(path: Path) -> list[int]:
    """Lines where a module reads an EVSEL_ variable: `os.getenv`, `os.environ.get`/`[...]`/`in`
    (or the same on a name bound to `os.environ`),
    or a walk over `os.environ` (items, keys, copy, dict(...)) or a Typer `envvar=`, in a module
    whose code (not its docstrings) holds an "EVSEL_..." string (the name read may be passed in)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    names_evsel = any(isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
                      and "EVSEL_" in n.value and not n.value.startswith(("use ", "set ")) for n in ast.walk(tree))

    # `os.environ`, a bare `environ`, or a name bound to it (`env = os.environ if env is None else env`)
    aliases = {"environ"}

    def is_environ(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
            isinstance(node, ast.Name) and node.id in aliases)

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(is_environ(n) for n in ast.walk(node.value)):
            aliases |= {t.id for t in node.targets if isinstance(t, ast.Name)}

    def evsel_key(key: ast.AST | None) -> bool:
        if isinstance(key, ast.Constant):
            return isinstance(key.value, str) and key.value.startswith("EVSEL_")
        return names_evsel  # a name passed in, or every variable

    lines = []
    for node in ast.walk(tree):
        key, read = None, False
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "getenv" or isinstance(func, ast.Name) and func.id == "getenv":
                key, read = (node.args or [None])[0], True
            elif isinstance(func, ast.Attribute) and is_environ(func.value) and func.attr in (
                    "get", "items", "keys", "values", "copy", "__getitem__"):
                key, read = (node.args[0] if func.attr in ("get", "__getitem__") and node.args else None), True
            elif isinstance(func, ast.Name) and func.id == "dict" and node.args and is_environ(node.args[0]):
                read = True
            for keyword in node.keywords:
                if keyword.arg == "envvar" and evsel_key(keyword.value):
                    lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and is_environ(node.value) and isinstance(node.ctx, ast.Load):
            key, read = node.slice, True
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators):
            key, read = node.left, True
        if read and evsel_key(key):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_settings_are_read_in_settings_py_only():
    readers = {rel: lines for rel, path in _source_files().items() if rel != SETTINGS_MODULE
               and (lines := env_reads(path))}
    unexplained = {rel: lines for rel, lines in readers.items() if rel not in ENV_READS_ALLOWED}
    assert not unexplained, f"read evsel's variables through evsel_cli/settings.py: {unexplained}"
    stale = set(ENV_READS_ALLOWED) - set(readers)
    assert not stale, f"allowed readers that read none any more (drop them from ENV_READS_ALLOWED): {stale}"
    assert env_reads(ROOT / SETTINGS_MODULE), "the check finds settings.py's own reads"


def test_the_settings_check_finds_each_way_of_reading(tmp_path):
    cases = {
        'import os\nx = os.environ.get("EVSEL_ROUTER")\n': [2],
        'import os\nx = os.getenv("EVSEL_ROUTER", "")\n': [2],
        'import os\nx = os.environ["EVSEL_ROUTER"]\n': [2],
        'import os\n\n\ndef f(env=None):\n    env = os.environ if env is None else env\n    return env.get("EVSEL_X")\n': [6],
        'import os\nx = "EVSEL_ROUTER" in os.environ\n': [2],
        'import os\nNAME = "EVSEL_MAX"\n\n\ndef f(name=NAME):\n    return os.environ.get(name)\n': [6],
        'import os\nP = ("EVSEL_",)\nenv = {k: v for k, v in os.environ.items() if k.startswith(P)}\n': [3],
        'import typer\nopt = typer.Option("--x", envvar="EVSEL_X")\n': [2],
        # not reads: another variable, a write, a docstring naming one
        'import os\nos.environ.setdefault("HF_HUB_OFFLINE", "1")\nos.environ["EVSEL_HOME"] = "/h"\n': [],
        '"""EVSEL_X is read by settings.py"""\nimport os\nx = os.environ.get("HOME")\n': [],
    }
    for number, (code, lines) in enumerate(cases.items()):
        planted = tmp_path / f"m{number}.py"
        planted.write_text(code, encoding="utf-8")
        assert env_reads(planted) == lines, code


# One BM25: its scoring is defined in evsel_cli/store/bm25_index.py only; the local index, the corpus and
# the recipes call it.
BM25_MODULE = "evsel_cli/store/bm25_index.py"


def bm25_definitions(path: Path) -> list[str]:
    """What in a module scores BM25 itself: its length normalisation (an expression of k1 and b:
    `k1 * (1 - b + b * dl / avgdl)`) or a K1 constant (K1 = 1.5). Not a function's name: a wrapper
    of the one scorer (Store.bm25_scores) is named like one."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))

    def named(node: ast.AST) -> set[str]:
        return {n.id.lower() if isinstance(n, ast.Name) else n.attr.lower()
                for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))}

    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and {"k1", "b"} <= named(node):
            found.add((node.lineno, "k1/b normalisation"))
        elif isinstance(node, ast.Assign) and "k1" in {n.lower() for t in node.targets for n in named(t)} \
                and any(isinstance(c, ast.Constant) and isinstance(c.value, float) for c in ast.walk(node.value)):
            found.add((node.lineno, "k1 constant"))
    return [f"{line}: {what}" for line, what in sorted(found)]


def test_one_bm25():
    found = {rel: hits for rel, path in _source_files().items() if rel != BM25_MODULE
             and (hits := bm25_definitions(path))}
    assert not found, f"BM25 is scored in {BM25_MODULE} only: {found}"


def test_the_bm25_check_finds_a_second_bm25(tmp_path):
    assert bm25_definitions(ROOT / BM25_MODULE), "the check finds the one BM25"
    cases = {
        "K1, B = 1.5, 0.75\n": ["1: k1 constant"],
        "def score(tf, dl, avgdl, k1, b):\n    return tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avgdl))\n":
            ["2: k1/b normalisation"],
        "class Index:\n    def norm(self, dl):\n        return self.k1 * (1 - self.b + self.b * dl)\n":
            ["3: k1/b normalisation"],
        "def bm25_scores(store, query):\n    return store.scores(query, 1.5, 0.75)\n": [],  # a wrapper
        "def rank(scores, b):\n    return sorted(scores)[:b]\n": [],
    }
    for number, (code, hits) in enumerate(cases.items()):
        planted = tmp_path / f"m{number}.py"
        planted.write_text(code, encoding="utf-8")
        assert bm25_definitions(planted) == hits, code


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """{module: the evsel modules it imports}, every import counted (lazy ones inside functions too:
    a circle closed at call time is still a circle)."""
    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {owner(a.name) for a in node.names if a.name.startswith("evsel")}
            elif isinstance(node, ast.ImportFrom):
                base = package
                for _ in range(max(node.level - 1, 0)):
                    base = base.rpartition(".")[0]
                module = (base + ("." + node.module if node.module else "")) if node.level else (node.module or "")
                if module.startswith("evsel"):
                    # `from evsel.x import y` imports the module x.y when there is one, else x
                    found |= {owner(module + "." + a.name) if module + "." + a.name in modules else owner(module)
                              for a in node.names}
        graph[name] = {m for m in found if m and m != name}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_import_circle_between_modules():
    assert import_circles(import_graph(_modules())) == []


def test_the_circle_check_finds_a_lazy_circle(tmp_path):
    (tmp_path / "a.py").write_text("from evsel import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import x\n")
    (tmp_path / "c.py").write_text("import evsel.a\n")
    modules = {"evsel.a": tmp_path / "a.py", "evsel.b": tmp_path / "b.py", "evsel.c": tmp_path / "c.py"}
    assert import_circles(import_graph(modules)) == [["evsel.a", "evsel.b"]]


def long_functions(modules: dict[str, Path], limit: int) -> list[str]:
    """Functions (methods too) longer than `limit` lines, as module:name:lines."""
    out = []
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > limit:
                out.append(f"{name}:{node.name}:{node.end_lineno - node.lineno + 1}")
    return out


def test_no_function_over_80_lines_and_the_engine_asks_in_40():
    # a function past a screen is a program inside a function: the next change costs its whole read
    assert long_functions(_modules(), 80) == []
    engine = ast.parse((ROOT / "evsel_cli" / "engine.py").read_text())
    ask = next(n for n in ast.walk(engine) if isinstance(n, ast.FunctionDef) and n.name == "ask")
    assert ask.end_lineno - ask.lineno + 1 <= 40


def test_the_length_check_counts_a_long_function(tmp_path):
    (tmp_path / "m.py").write_text("def short():\n    pass\n\n\ndef long():\n" + "    x = 1\n" * 81)
    assert long_functions({"evsel.m": tmp_path / "m.py"}, 80) == ["evsel.m:long:82"]
