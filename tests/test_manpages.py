"""man/ is generated from the CLI's --help; this fails when they drift."""

from __future__ import annotations

from pathlib import Path

import pytest

from evsel.commands import manpages
from evsel.commands.typer_cli import CONTEXT_SETTINGS, cli

MAN = Path(__file__).resolve().parent.parent / "man"


def test_man_pages_match_help():
    wanted = manpages.pages(cli, CONTEXT_SETTINGS["help_option_names"])
    present = {p.name: p.read_text() for p in MAN.glob("*.1")}
    drifted = sorted(n for n in set(wanted) | set(present) if wanted.get(n) != present.get(n))
    assert not drifted, f"run: python -m evsel.commands.write_man_pages man/  (drifted: {drifted})"


def test_every_command_has_a_page():
    names = set(manpages.pages(cli, CONTEXT_SETTINGS["help_option_names"]))
    for expected in ("evsel.1", "evsel-ingest.1", "evsel-ask.1", "evsel-docs-list.1", "evsel-models-info.1"):
        assert expected in names


def test_pages_document_completion_and_rerank():
    """Made from the Typer app's command tree: the root page has shell completion, ask's the reranker."""
    wanted = manpages.pages(cli, CONTEXT_SETTINGS["help_option_names"])
    assert "\\-\\-install\\-completion" in wanted["evsel.1"]
    assert "\\-\\-rerank METHOD" in wanted["evsel-ask.1"] and "\\-\\-rerank\\-top N" in wanted["evsel-ask.1"]


# installed for man(1) and shown by `evsel man`

ROOT = MAN.parent


def run(capsys, *args: str) -> tuple[int, str, str]:
    from evsel.cli import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_pyproject_installs_every_page_into_share_man():
    import tomllib

    data_files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    listed = {p.name for pattern in data_files["share/man/man1"] for p in ROOT.glob(pattern)}
    assert listed == set(manpages.pages(cli, CONTEXT_SETTINGS["help_option_names"]))


def test_the_wheel_installs_the_pages_where_man_finds_them(tmp_path):
    """Build the wheel from a copy of the project, install it into a prefix (--ignore-installed: pip
    would otherwise uninstall the evsel under test first), and ask man(1) where
    `evsel` and `evsel-ask` are with only that prefix's bin on PATH (as a venv is)."""
    import shutil
    import subprocess
    import sys
    import zipfile

    pytest.importorskip("setuptools", reason="building the wheel offline needs setuptools in this environment")
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for name in ("evsel_cli", "daemon", "models", "recipes", "man"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path / "dist"),
                          str(source)], check=True, capture_output=True)
    [wheel] = (tmp_path / "dist").glob("evsel-*.whl")
    pages = {n.rsplit("/", 1)[-1] for n in zipfile.ZipFile(wheel).namelist() if "/data/share/man/man1/" in n}
    assert pages == set(manpages.pages(cli, CONTEXT_SETTINGS["help_option_names"]))

    man = shutil.which("man")
    if man is None:
        pytest.skip("no man(1) here to look the pages up with")
    prefix = tmp_path / "prefix"
    subprocess.run(pip + ["install", "--ignore-installed", "--no-deps", "--no-index", "--prefix", str(prefix),
                          str(wheel)], check=True, capture_output=True)
    env = {"PATH": f"{prefix / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path)}
    found = subprocess.run([man, "-w", "evsel", "evsel-ask"], env=env, capture_output=True, text=True, check=True)
    assert found.stdout.split() == [str(prefix / "share/man/man1/evsel.1"), str(prefix / "share/man/man1/evsel-ask.1")]


def test_evsel_man_prints_the_page_of_a_command(capsys):
    code, out, err = run(capsys, "man", "ask")
    assert code == 0 and err == ""
    assert out.startswith("NAME\n  evsel-ask - Answer QUESTION")
    assert "Usage: evsel ask [OPTIONS] QUESTION" in out and "--select METHOD" in out and "\\-" not in out
    # the same page man(1) reads, as roff
    assert run(capsys, "man", "ask", "--roff")[1] == (MAN / "evsel-ask.1").read_text()
    for words in (["docs", "show"], ["docs-show"], ["evsel-docs-show"]):
        code, out, _ = run(capsys, "man", *words)
        assert code == 0 and "Usage: evsel docs show [OPTIONS] ID" in out
    code, out, _ = run(capsys, "man")
    assert code == 0 and out.startswith("NAME\n  evsel - ") and "SEE ALSO" in out


def test_evsel_man_of_an_unknown_command_fails_in_one_line(capsys):
    code, out, err = run(capsys, "man", "frobnicate")
    assert code == 1 and out == ""
    assert err.strip().splitlines() == ["evsel: error: no manual page for 'evsel frobnicate'; see evsel --help for "
                                        "the commands"]
