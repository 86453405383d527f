"""Man pages for `evsel` and each command, rendered from the CLI's own help (the Click command
tree is handed in: `evsel man` passes its own root, evsel.commands.write_man_pages the app's).

    python -m evsel.commands.write_man_pages man/          # write the pages
    python -m evsel.commands.write_man_pages --check man/  # exit 1 if they drifted from --help

pyproject.toml installs man/ as data files in share/man/man1, where man(1) finds them next to the
`evsel` script (`man evsel`, `man evsel-ask`); `evsel man COMMAND` shows the same pages anywhere.
"""

from __future__ import annotations

import re

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


def _help_text(command: TyperCommand | TyperGroup, words: list[str], names: list[str]) -> str:
    # the CLI's own help option names (-h, --help): click caches a command's help option the first
    # time it is asked, so pages made with other names would depend on what ran before
    parent = None
    for i, word in enumerate(words[:-1]):
        parent = Context(TyperGroup(name=word), info_name=word, parent=parent, help_option_names=names)
    ctx = Context(command, info_name=words[-1], parent=parent, terminal_width=WIDTH, max_content_width=WIDTH,
                  help_option_names=names)
    return command.get_help(ctx)


def render(command: TyperCommand | TyperGroup, words: list[str], subcommands: list[list[str]],
           names: list[str]) -> str:
    name = "-".join(words)
    summary = (command.get_short_help_str(limit=200) or "").rstrip(".")
    out = [
        f'.TH "{name.upper()}" "1" "" "evsel {__version__}" "evsel manual"',
        ".SH NAME",
        f"{_escape(name)} \\- {_escape(summary)}",
        ".SH HELP",
        ".nf",
        _escape(_help_text(command, words, names)),
        ".fi",
    ]
    if subcommands:
        out.append(".SH SEE ALSO")
        out.append(", ".join(f"\\fB{'-'.join(s)}\\fR(1)" for s in subcommands))
    return "\n".join(out) + "\n"


def pages(cli: TyperGroup, help_option_names: list[str]) -> dict[str, str]:
    """Every page, by file name, of the command tree `cli` (Typer's Click group for evsel's app)."""
    found = list(_commands(cli, ["evsel"]))
    result = {"evsel.1": render(cli, ["evsel"], [w for w, _ in found], help_option_names)}
    for words, command in found:
        result["-".join(words) + ".1"] = render(command, words, [], help_option_names)
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
