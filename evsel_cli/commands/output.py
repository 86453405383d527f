"""Everything the CLI prints. Results go to stdout; progress, warnings and errors to stderr.

Document text, file names and what the daemon sends may hold terminal control sequences (ESC [2J
clears the screen, OSC 8 makes links, OSC 0 sets the window title) and, for names that are not
UTF-8, lone surrogates that no terminal encoding can write. Every human-readable line goes through
`SafeConsole`, which shows each such character as a visible escape (`\\x1b`); `print_json` keeps
the exact text, escaped as JSON.

rich is imported on first use (about as long as the interpreter's own start-up): `stdout` and
`stderr` make their console when first printed to, so `evsel --version` or a `--json` result never
imports it. Lines built as styled parts (`show`, `show_table`) are written without rich where rich
would write exactly their text: to a stream that is no terminal (rich writes no colour there), when
no part holds what rich's markup would change (brackets, backslashes, tabs, `:name:` emoji codes,
control characters). Anything else goes through rich as before.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

# the bidirectional controls (ALM, LRM, RLM, the embeddings and overrides, the isolates): raw, they
# reorder what the terminal shows after them ("txt.exe" can read as "exe.txt")
_BIDI = r"\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
# C0 controls but tab and newline, DEL, C1 controls, bidi controls, and surrogates (a byte of a name
# that is not UTF-8)
_UNPRINTABLE = re.compile(rf"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}\ud800-\udfff]")


def _shown(match: re.Match) -> str:
    code = ord(match.group())
    if 0xDC80 <= code <= 0xDCFF:  # os.fsdecode's stand-in for the byte code - 0xDC00
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def visible(text: str) -> str:
    """`text` safe to write to a terminal: control characters (but tab and newline) and surrogates
    as visible escapes (ESC as `\\x1b`, the byte 0xE9 of a Latin-1 file name as `\\xe9`)."""
    return _UNPRINTABLE.sub(_shown, text)


def escape(text: str) -> str:
    """rich's markup escape (`[` that would open a tag gets a backslash)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


@cache
def safe_console_class() -> type:
    """`SafeConsole`, defined when first needed (it subclasses rich's Console)."""
    from rich.console import Console

    class SafeConsole(Console):
        """A rich Console that never writes a control character it did not make itself: every
        string printed (or put in a table) is passed through `visible` before its markup is read."""

        def render_str(self, text: str, **kwargs):
            return super().render_str(visible(text), **kwargs)

        def on_broken_pipe(self) -> None:
            # rich exits 1 here; evsel.cli treats a closed stdout the same on every path (exit 0)
            self.quiet = True
            raise BrokenPipeError(32, "Broken pipe")

    return SafeConsole


def __getattr__(name: str):
    if name == "SafeConsole":
        return safe_console_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_WIDE = 100_000


def wide_console() -> "Console":
    """A console for stdout that never wraps (one record per line for grep on a pipe)."""
    return safe_console_class()(width=_WIDE, highlight=False)


class DeferredConsole:
    """A `SafeConsole` made on first use, with these options; everything else is the console's."""

    def __init__(self, **options):
        self.options = options
        self.made: Console | None = None

    @property
    def stream(self):
        return sys.stderr if self.options.get("stderr") else sys.stdout

    @property
    def is_terminal(self) -> bool:
        return False if plain_stream(self.stream) else self.console().is_terminal

    def console(self) -> "Console":
        if self.made is None:
            self.made = safe_console_class()(**self.options)
        return self.made

    def __getattr__(self, name: str):
        return getattr(self.console(), name)


stdout = DeferredConsole(soft_wrap=True, highlight=False)
stderr = DeferredConsole(stderr=True, highlight=False, soft_wrap=True)

# what json.dumps(ensure_ascii=False) leaves raw: DEL, C1 and bidi controls (terminals act on them) and
# lone surrogates (not encodable as UTF-8); each becomes its \\uXXXX escape, which reads back as
# the same string (os.fsencode then gives a name's exact bytes)
_JSON_RAW = re.compile(rf"[\x7f-\x9f{_BIDI}\ud800-\udfff]")


def to_json(data) -> str:
    """`data` as JSON text that is valid UTF-8 and safe on a terminal, with every string exact."""
    text = json.dumps(data, indent=2, ensure_ascii=False, default=str)
    return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def print_json(data) -> None:
    """Exactly one JSON document on stdout; as ASCII escapes where stdout's encoding cannot hold
    the text (PYTHONIOENCODING=ascii): the same JSON value either way."""
    text = to_json(data)
    try:
        text.encode(getattr(sys.stdout, "encoding", None) or "utf-8")
    except (UnicodeEncodeError, LookupError):
        text = _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}",
                             json.dumps(data, indent=2, ensure_ascii=True, default=str))
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def plain_stream(stream) -> bool:
    """Whether rich writes to `stream` as to a file (no colour, no live rows): no terminal, and
    neither of rich's overrides (FORCE_COLOR, TTY_COMPATIBLE) set."""
    if "FORCE_COLOR" in os.environ or "TTY_COMPATIBLE" in os.environ:
        return False
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):
        return False


# what rich's markup may read as an emoji code (`:smile:`)
_EMOJI_CODE = re.compile(r":\S*?:")


def _plain(texts: list[str], stream) -> bool:
    """Whether rich prints these texts as they are: nothing in them is markup, an emoji code, a
    tab it expands or a character `visible` changes, and the stream can encode them."""
    joined = "".join(texts)
    if "[" in joined or "\\" in joined or "\t" in joined or _UNPRINTABLE.search(joined) or _EMOJI_CODE.search(joined):
        return False
    try:
        joined.encode(getattr(stream, "encoding", None) or "utf-8", getattr(stream, "errors", None) or "strict")
    except (LookupError, UnicodeError):
        return False
    return True


def markup(parts: list[tuple[str, str | None]]) -> str:
    """Styled parts (text, rich style or None) as rich markup, each text escaped."""
    return "".join(f"[{style}]{escape(text)}[/]" if style else escape(text) for text, style in parts)


def show(parts: list[tuple[str, str | None]], console: DeferredConsole | None = None, **options) -> None:
    """Print one line of styled parts (text, rich style or None) on `console` (stdout): their
    text where rich would print only that, else through rich with `options`."""
    console = console if console is not None else stdout
    stream = console.stream
    texts = [text for text, _ in parts]
    if plain_stream(stream) and _plain(texts, stream):
        stream.write("".join(texts) + "\n")
        stream.flush()
    else:
        console.print(markup(parts), **options)


def show_table(columns: tuple[str, ...], rows: list[list[str]]) -> None:
    """A table on stdout, one record per line, columns two spaces apart (no borders); on a pipe
    each record stays on one line for grep and friends."""
    cells = [*columns, *(cell for row in rows for cell in row)]
    widths = [max(len(cell) for cell in column) for column in zip(columns, *rows)]
    # rich measures wide characters, folds what is wider than its console and trims a cell's
    # outer spaces: those tables are rich's
    if (plain_stream(sys.stdout) and _plain(cells, sys.stdout) and sum(widths) + 2 * len(widths) < _WIDE // 2
            and all(cell.isascii() and cell == cell.strip() and "\n" not in cell for cell in cells)):
        for row in (columns, *rows):
            sys.stdout.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "\n")
        sys.stdout.flush()
        return
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    console = stdout if stdout.is_terminal else wide_console()
    console.print(table)


def error(message: str) -> None:
    # messages carry paths and file text: "[...]" or ":name:" in them is neither markup nor emoji
    show([("evsel: error:", "bold red"), (f" {_one_line(message)}", None)], stderr,
         markup=True, highlight=False, emoji=False)


def warning(message: str) -> None:
    show([("evsel: warning:", "yellow"), (f" {_one_line(message)}", None)], stderr,
         markup=True, highlight=False, emoji=False)


def _one_line(message: str) -> str:
    return " ".join(message.splitlines())


# stages that enclose others (a file holds its reading, chunking and storing): they stay shown until
# they finish; any other stage ends when the next one starts
_ENCLOSING = frozenset({"files", "questions", "docs", "train"})
PLAIN_INTERVAL_S = 5.0  # a non-terminal stderr gets a line this often ...
PLAIN_AFTER_S = 5.0  # ... once the work has run this long


def duration(seconds: float) -> str:
    """A short duration: `42s`, `5m 59s`, `1h 02m`."""
    seconds = max(int(round(seconds)), 0)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def _rate(per_s: float) -> str:
    return f"{per_s:.0f}" if per_s >= 10 else f"{per_s:.1f}" if per_s >= 1 else f"{per_s:.2f}"


class Stage:
    """One running stage: its label, count and total (None: no count, a spinner), and the rate and
    time remaining measured from when it was first seen."""

    def __init__(self, name: str, label: str, done: int, total: int | None, now: float):
        self.name = name
        self.label = label
        self.done = done
        self.total = total
        self.started = now
        self.first_done = done  # a resumed stage starts part done: the rate counts only this run
        self.now = now

    def update(self, label: str, done: int, total: int | None, now: float) -> None:
        self.label, self.total, self.now = label, total, now
        if done < self.first_done:  # the count went back (a new pass): measure from here
            self.first_done, self.started = done, now
        self.done = done

    @property
    def finished(self) -> bool:
        return self.total is not None and self.done >= self.total

    def per_second(self) -> float | None:
        elapsed = self.now - self.started
        gained = self.done - self.first_done
        return gained / elapsed if elapsed > 0 and gained > 0 else None

    def count_text(self) -> str:
        return f"{self.done}/{self.total}" if self.total is not None else ""

    def rate_text(self) -> str:
        per_s = self.per_second()
        return f"{_rate(per_s)}/s" if self.total is not None and per_s else ""

    def eta_text(self) -> str:
        per_s = self.per_second()
        if self.total is None or not per_s:
            return ""
        return f"ETA {duration((self.total - self.done) / per_s)}"

    def line(self, now: float) -> str:
        """The stage as one plain line for a log: `<label> <done>/<total> (<rate>/s, ETA <t>)`."""
        if self.total is None:
            return f"{self.label} ({duration(now - self.started)})"
        rate, eta = self.rate_text(), self.eta_text()
        detail = f"{rate}, {eta}" if rate else f"{duration(now - self.started)}, no rate yet"
        return f"{self.label} {self.count_text()} ({detail})"


def _live_progress(console: "Console", clock) -> "Progress":
    """The live rows of a terminal: a bar for a stage with a total, a spinner for one without,
    then the label, count, rate, ETA and elapsed time."""
    from rich.progress import BarColumn, Progress, ProgressColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.text import Text

    class StageColumn(ProgressColumn):
        def __init__(self):
            super().__init__()
            self.bar = BarColumn()
            self.spinner = SpinnerColumn()

        def render(self, task):
            return self.bar.render(task) if task.total is not None else self.spinner.render(task)

    class FieldColumn(ProgressColumn):
        def __init__(self, field: str):
            super().__init__()
            self.field = field

        def render(self, task):
            return Text(task.fields.get(self.field, ""))

    return Progress(StageColumn(), TextColumn("{task.description}", markup=False), FieldColumn("count"),
                    FieldColumn("rate"), FieldColumn("eta"), TimeElapsedColumn(), console=console,
                    transient=True, get_time=clock)


class ProgressView:
    """Renders engine progress events on stderr: on a terminal, one live row per running stage (a
    bar with count, rate and ETA when the stage has a total, a spinner when not); elsewhere, once
    the work has run `PLAIN_AFTER_S`, one plain line every `PLAIN_INTERVAL_S`. A stage that is no
    longer running (finished, or followed by another) is removed."""

    def __init__(self, enabled: bool = True, *, console: Console | None = None, clock=time.monotonic,
                 interval_s: float = PLAIN_INTERVAL_S, after_s: float = PLAIN_AFTER_S,
                 heartbeat_s: float | None = 1.0):
        self.console = console if console is not None else stderr  # rich's, made when first printed to
        self.enabled = enabled
        self.live = enabled and self.console.is_terminal
        self.plain = enabled and not self.console.is_terminal
        self.clock = clock
        self.interval_s = interval_s
        self.after_s = after_s
        self.heartbeat_s = heartbeat_s  # a plain line also comes while no event does (a model load)
        # rows are drawn only on a terminal (rich.progress is imported for them alone)
        self.progress = _live_progress(self.console.console() if isinstance(self.console, DeferredConsole)
                                       else self.console, clock) if self.live else None
        self.stages: dict[str, Stage] = {}  # running stages, oldest first
        self.tasks: dict[str, TaskID] = {}
        self.work_started: float | None = None
        self.last_line: float | None = None
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def __enter__(self) -> "ProgressView":
        if self.live:
            self.progress.start()
        elif self.plain and self.heartbeat_s:
            self._ticker = threading.Thread(target=self._beat, name="evsel-progress", daemon=True)
            self._ticker.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self.live:
            self.progress.stop()

    def __call__(self, event: dict) -> None:
        kind = event.get("type")
        if kind == "warning":
            self._print(lambda: warning(event["message"]))
        elif kind == "log":  # a line of a long job's log (training), shown as it comes
            self._print(lambda: self.console.print(event["message"], markup=False, highlight=False))
        elif kind == "file" and event.get("status") == "failed" and event.get("error"):
            from evsel.errors import from_dict

            self._print(lambda: error(from_dict(event["error"]).line()))
        elif kind == "progress" and self.enabled and event.get("task"):
            with self._lock:
                self._progress(event)
                self.tick()

    def _progress(self, event: dict) -> None:
        now = self.clock()
        name = str(event["task"])
        raw_total = event.get("total")
        # a 0/1 or 1/1 count says only "started" or "done": a spinner, not a bar
        total = int(raw_total) if raw_total is not None and int(raw_total) > 1 else None
        done = int(event.get("done") or 0)
        label = visible(str(event.get("label") or name))  # a file name; the row's text is no str
        if self.work_started is None:
            self.work_started = now
        stage = self.stages.get(name)
        if stage is None:
            self._end_inner()
            stage = self.stages[name] = Stage(name, label, done, total, now)
        else:
            if name in _ENCLOSING:  # the next file (question, step): its inner stages are over
                self._end_inner()
            stage.update(label, done, total, now)
        for other in self.stages.values():
            other.now = now
        finished = stage.finished or (total is None and raw_total is not None and done >= int(raw_total) > 0)
        if finished:
            self._remove(name)
        self._show()

    def _end_inner(self) -> None:
        """A new stage starts (or an enclosing one moves on): the inner stages before it are over."""
        for other in list(self.stages):
            if other not in _ENCLOSING:
                self._remove(other)

    def _remove(self, name: str) -> None:
        self.stages.pop(name, None)
        task = self.tasks.pop(name, None)
        if task is not None:
            self.progress.remove_task(task)

    def _show(self) -> None:
        if not self.live:
            return
        for name, stage in self.stages.items():
            fields = {"count": stage.count_text(), "rate": stage.rate_text(), "eta": stage.eta_text()}
            if name not in self.tasks:
                self.tasks[name] = self.progress.add_task(stage.label, total=stage.total, completed=stage.done,
                                                          **fields)
            else:
                self.progress.update(self.tasks[name], description=stage.label, total=stage.total,
                                     completed=stage.done, **fields)

    def tick(self) -> None:
        """On a non-terminal stderr: a line for the running stages when one is due."""
        if not self.plain:
            return
        with self._lock:
            now = self.clock()
            if not self.stages or self.work_started is None or now - self.work_started < self.after_s:
                return
            if self.last_line is not None and now - self.last_line < self.interval_s:
                return
            self.last_line = now
            text = "; ".join(stage.line(now) for stage in self.stages.values())
            self.console.print(f"evsel: progress: {text}", markup=False, highlight=False, emoji=False, soft_wrap=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            self.tick()

    def _print(self, fn) -> None:
        with self._lock:
            fn()  # rich keeps bars below printed lines while live


def flat(text: str) -> str:
    """Text on one line: a PDF page's line breaks and runs of spaces become single spaces."""
    return " ".join(text.split())
