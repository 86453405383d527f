"""Write (or check) the man pages in man/ from the CLI's own help.

    python -m evsel.commands.write_man_pages man/          # write the pages
    python -m evsel.commands.write_man_pages --check man/  # exit 1 if they drifted from --help
"""

from __future__ import annotations

import sys
from pathlib import Path

from .manpages import pages
from .typer_cli import CONTEXT_SETTINGS, cli


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    target = Path(args[0] if args else "man")
    wanted = pages(cli, CONTEXT_SETTINGS["help_option_names"])
    if check:
        present = {p.name: p.read_text() for p in target.glob("*.1")} if target.is_dir() else {}
        drift = sorted(n for n in set(wanted) | set(present) if wanted.get(n) != present.get(n))
        if drift:
            print(f"man pages drifted from --help: {', '.join(drift)}; run: python -m evsel.commands.write_man_pages {target}",
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
