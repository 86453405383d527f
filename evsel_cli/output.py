"""Everything the CLI prints. Results go to stdout; progress, warnings and errors to stderr."""

from __future__ import annotations

import json
import sys

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

stdout = Console(soft_wrap=True, highlight=False)
stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(data) -> None:
    """Exactly one JSON document on stdout."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def error(message: str) -> None:
    # messages carry paths and file text: "[...]" or ":name:" in them is neither markup nor emoji
    stderr.print(f"[bold red]evsel: error:[/] {escape(_one_line(message))}", markup=True, highlight=False, emoji=False)


def warning(message: str) -> None:
    stderr.print(f"[yellow]evsel: warning:[/] {escape(_one_line(message))}", markup=True, highlight=False, emoji=False)


def _one_line(message: str) -> str:
    return " ".join(message.splitlines())


class ProgressView:
    """Renders engine progress events as rich bars on stderr (a live display only on a terminal)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and stderr.is_terminal
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=stderr,
            transient=True,
        )
        self.tasks: dict[str, int] = {}

    def __enter__(self) -> "ProgressView":
        if self.enabled:
            self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self.progress.stop()

    def __call__(self, event: dict) -> None:
        kind = event.get("type")
        if kind == "warning":
            self._print(lambda: warning(event["message"]))
        elif kind == "log":  # a line of a long job's log (training), shown as it comes
            self._print(lambda: stderr.print(event["message"], markup=False, highlight=False))
        elif kind == "file" and event.get("status") == "failed" and event.get("error"):
            from .errors import from_dict

            self._print(lambda: error(from_dict(event["error"]).line()))
        elif kind == "progress" and self.enabled:
            name = event["task"]
            total = max(int(event.get("total") or 1), 1)
            description = event.get("label") or name
            if name not in self.tasks:
                self.tasks[name] = self.progress.add_task(description, total=total)
            self.progress.update(self.tasks[name], description=description, completed=event.get("done", 0), total=total)

    def _print(self, fn) -> None:
        fn()  # rich keeps bars below printed lines while live


def flat(text: str) -> str:
    """Text on one line: a PDF page's line breaks and runs of spaces become single spaces."""
    return " ".join(text.split())
