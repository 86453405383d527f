"""Everything the CLI prints. Results go to stdout; progress, warnings and errors to stderr.

Document text, file names and what the daemon sends may hold terminal control sequences (ESC [2J
clears the screen, OSC 8 makes links, OSC 0 sets the window title) and, for names that are not
UTF-8, lone surrogates that no terminal encoding can write. Every human-readable line goes through
`SafeConsole`, which shows each such character as a visible escape (`\\x1b`); `print_json` keeps
the exact text, escaped as JSON.
"""

from __future__ import annotations

import json
import re
import sys

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

# C0 controls but tab and newline, DEL, C1 controls, and surrogates (a byte of a name that is not UTF-8)
_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _shown(match: re.Match) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's stand-in for the byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def visible(text: str) -> str:
    """`text` safe to write to a terminal: control characters (but tab and newline) and surrogates
    as visible escapes (ESC as `\\x1b`, the byte 0xE9 of a Latin-1 file name as `\\xe9`)."""
    return _UNPRINTABLE.sub(_shown, text)


class SafeConsole(Console):
    """A rich Console that never writes a control character it did not make itself: every string
    printed (or put in a table) is passed through `visible` before its markup is read."""

    def render_str(self, text: str, **kwargs):
        return super().render_str(visible(text), **kwargs)


def wide_console() -> SafeConsole:
    """A console for stdout that never wraps (one record per line for grep on a pipe)."""
    return SafeConsole(width=100_000, highlight=False)


stdout = SafeConsole(soft_wrap=True, highlight=False)
stderr = SafeConsole(stderr=True, highlight=False, soft_wrap=True)

# what json.dumps(ensure_ascii=False) leaves raw: DEL and C1 controls (terminals act on them) and
# lone surrogates (not encodable as UTF-8); each becomes its \\uXXXX escape, which reads back as
# the same string (os.fsencode then gives a name's exact bytes)
_JSON_RAW = re.compile(r"[\x7f-\x9f\ud800-\udfff]")


def to_json(data) -> str:
    """`data` as JSON text that is valid UTF-8 and safe on a terminal, with every string exact."""
    text = json.dumps(data, indent=2, ensure_ascii=False, default=str)
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def print_json(data) -> None:
    """Exactly one JSON document on stdout."""
    sys.stdout.write(to_json(data) + "\n")
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
            description = visible(event.get("label") or name)  # a file name; the bar's text is no str
            if name not in self.tasks:
                self.tasks[name] = self.progress.add_task(description, total=total)
            self.progress.update(self.tasks[name], description=description, completed=event.get("done", 0), total=total)

    def _print(self, fn) -> None:
        fn()  # rich keeps bars below printed lines while live


def flat(text: str) -> str:
    """Text on one line: a PDF page's line breaks and runs of spaces become single spaces."""
    return " ".join(text.split())
