"""Generate man pages for `evsel` and each command from the CLI's own help.

    python -m evsel.commands.manpages man/          # write the pages
    python -m evsel.commands.manpages --check man/  # exit 1 if they drifted from --help

pyproject.toml installs man/ as data files in share/man/man1, where man(1) finds them next to the
`evsel` script (`man evsel`, `man evsel-ask`); `evsel man COMMAND` shows the same pages anywhere.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from typer import Context
from typer.core import TyperCommand, TyperGroup

from evsel import __version__

WIDTH = 80


def _escape(text: str) -> str:
    lines = []
    for line in text.replace("\\", "\\\\").replace("-", "\\-").splitlines():
        if line.startswith((".", "'")):
            line = "\\&" + line
        lines.append(line)
    return "\n".join(lines)


def _commands(group: TyperGroup, prefix: list[str]):
    ctx = Context(group, info_name=" ".join(prefix))
    for name in sorted(group.list_commands(ctx)):
        command = group.get_command(ctx, name)
        yield prefix + [name], command
        if isinstance(command, TyperGroup):
            yield from _commands(command, prefix + [name])


def _help_text(command: TyperCommand | TyperGroup, words: list[str]) -> str:
    from .typer_cli import CONTEXT_SETTINGS

    # the CLI's own help option names (-h, --help): click caches a command's help option the first
    # time it is asked, so pages made with other names would depend on what ran before
    names = CONTEXT_SETTINGS["help_option_names"]
    parent = None
    for i, word in enumerate(words[:-1]):
        parent = Context(TyperGroup(name=word), info_name=word, parent=parent, help_option_names=names)
    ctx = Context(command, info_name=words[-1], parent=parent, terminal_width=WIDTH, max_content_width=WIDTH,
                  help_option_names=names)
    return command.get_help(ctx)


def render(command: TyperCommand | TyperGroup, words: list[str], subcommands: list[list[str]]) -> str:
    name = "-".join(words)
    summary = (command.get_short_help_str(limit=200) or "").rstrip(".")
    out = [
        f'.TH "{name.upper()}" "1" "" "evsel {__version__}" "evsel manual"',
        ".SH NAME",
        f"{_escape(name)} \\- {_escape(summary)}",
        ".SH HELP",
        ".nf",
        _escape(_help_text(command, words)),
        ".fi",
    ]
    if subcommands:
        out.append(".SH SEE ALSO")
        out.append(", ".join(f"\\fB{'-'.join(s)}\\fR(1)" for s in subcommands))
    return "\n".join(out) + "\n"


def pages() -> dict[str, str]:
    from .typer_cli import cli  # the Click command tree Typer builds from evsel's app

    found = list(_commands(cli, ["evsel"]))
    result = {"evsel.1": render(cli, ["evsel"], [w for w, _ in found])}
    for words, command in found:
        result["-".join(words) + ".1"] = render(command, words, [])
    return result


def page_name(words: list[str]) -> str:
    """The page of a command as typed: [], ["docs", "show"], ["docs-show"] or ["evsel-ask"]."""
    name = "-".join(w for word in words for w in word.split() if w)
    if name == "evsel" or name.startswith("evsel-"):
        name = name[len("evsel"):].lstrip("-")
    return f"evsel-{name}.1" if name else "evsel.1"


_ROFF_ESCAPE = re.compile(r"\\(?:\\|-|&|f[BR])")


def plain_text(page: str) -> str:
    """A generated page as plain text, for a terminal without man(1) or a pipe."""
    out = []
    for line in page.splitlines():
        if line.startswith(".SH "):
            out.append(("\n" if out else "") + line[4:])
        elif line.startswith("."):
            continue
        else:
            text = _ROFF_ESCAPE.sub(lambda m: {"\\\\": "\\", "\\-": "-"}.get(m.group(0), ""), line)
            out.append("  " + text if text else text)
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    target = Path(args[0] if args else "man")
    wanted = pages()
    if check:
        present = {p.name: p.read_text() for p in target.glob("*.1")} if target.is_dir() else {}
        drift = sorted(n for n in set(wanted) | set(present) if wanted.get(n) != present.get(n))
        if drift:
            print(f"man pages drifted from --help: {', '.join(drift)}; run: python -m evsel.commands.manpages {target}",
                  file=sys.stderr)
            return 1
        return 0
    target.mkdir(parents=True, exist_ok=True)
    for old in target.glob("*.1"):
        if old.name not in wanted:
            old.unlink()
    for name, text in wanted.items():
        (target / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
