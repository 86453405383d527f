"""Progress display: one row per running stage (a bar with count, rate and ETA when the stage has a
total, a spinner when not), nothing for a stage that is over, and plain periodic lines on a stderr
that is not a terminal. Events are fed by hand with a fake clock: no sleeps, no timing."""

from __future__ import annotations

import io
import re

from evsel.commands.output import ProgressView, SafeConsole, duration


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def progress(task, done, total, label=None):
    event = {"type": "progress", "task": task, "done": done, "total": total}
    if label is not None:
        event["label"] = label
    return event


def view_on(terminal: bool, clock: FakeClock, **kwargs) -> tuple[ProgressView, io.StringIO]:
    stream = io.StringIO()
    console = SafeConsole(file=stream, force_terminal=terminal, width=200, highlight=False)
    # not entered: no live refresh thread and no heartbeat thread; the test drives everything
    return ProgressView(console=console, clock=clock, heartbeat_s=None, **kwargs), stream


def shown(view: ProgressView) -> list[str]:
    # off a terminal a view has no live rows at all (it never imports rich.progress)
    return [task.description for task in view.progress.tasks] if view.progress is not None else []


def rendered(view: ProgressView) -> str:
    record = SafeConsole(file=io.StringIO(), width=200, record=True)
    record.print(view.progress.make_tasks_table(view.progress.tasks))
    return record.export_text()


UNREAL = "UNREAL chunk states (layer 24)"
ASK_UNREAL = [  # what `evsel ask --select unreal` receives, in order
    progress("queue", 0, 1, "waiting for the daemon (5 requests ahead)"),
    progress("load", 0, 1, "loading the model"),
    progress("select", 0, 1, "selecting evidence (unreal)"),
    progress("encode", 0, 495, UNREAL),
    progress("encode", 64, 495, UNREAL),
]


def test_a_stage_is_gone_once_the_next_one_starts():
    clock = FakeClock()
    view, _ = view_on(True, clock)
    view(ASK_UNREAL[0])
    assert shown(view) == ["waiting for the daemon (5 requests ahead)"]
    view(ASK_UNREAL[1])
    assert shown(view) == ["loading the model"]  # the job runs: no longer waiting
    for event in ASK_UNREAL[2:]:
        clock.now += 1
        view(event)
    assert shown(view) == [UNREAL]  # the model was already loaded: its row is gone
    view(progress("generate", 0, 1, "writing the answer"))
    assert shown(view) == ["writing the answer"]


def test_a_finished_stage_is_gone_and_an_enclosing_stage_stays_until_it_finishes():
    clock = FakeClock()
    view, _ = view_on(True, clock)
    view(progress("daemon", 0, 1, "starting the evsel daemon"))
    view(progress("daemon", 1, 1, "daemon ready"))
    assert shown(view) == []
    for index, name in enumerate(["a.txt", "b.txt"]):
        view(progress("files", index, 2, name))
        assert shown(view) == [name]  # the previous file's stages are over
        view(progress("parse", 0, 1, f"reading {name}"))
        view(progress("parse", 1, 1, f"read {name}"))
        assert shown(view) == [name]
        view(progress("chunk", 10, 40, f"chunking {name}"))
        view(progress("store", 1, 4, f"storing {name}"))
        assert shown(view) == [name, f"storing {name}"]
    view(progress("files", 2, 2, ""))
    assert shown(view) == []


def test_a_stage_with_a_total_shows_count_rate_and_eta_and_one_without_a_spinner_only():
    clock = FakeClock()
    view, _ = view_on(True, clock)
    view(progress("load", 0, 1, "loading the model"))
    table = rendered(view)
    assert "loading the model" in table and "/s" not in table and "ETA" not in table and "/1" not in table
    view(progress("encode", 0, 495, UNREAL))
    clock.now += 60
    view(progress("encode", 64, 495, UNREAL))
    table = rendered(view)
    # 64 in 60 s: 1.07/s; 431 left: 404 s
    assert "64/495" in table and "1.1/s" in table and "ETA 6m 44s" in table, table
    assert "loading the model" not in table


def test_a_resumed_stage_rates_only_what_this_run_did():
    clock = FakeClock()
    view, _ = view_on(True, clock)
    view(progress("encode", 400, 495, UNREAL))  # 400 were encoded before
    clock.now += 10
    view(progress("encode", 420, 495, UNREAL))
    table = rendered(view)
    assert "420/495" in table and "2.0/s" in table and "ETA 38s" in table, table


def test_a_non_terminal_stream_gets_one_line_per_interval():
    clock = FakeClock()
    view, stream = view_on(False, clock)
    for second in range(23):  # an event a second for 22 s: lines at 5, 10, 15 and 20 s
        view(progress("encode", second * 10, 495, UNREAL))
        clock.now += 1
    lines = stream.getvalue().splitlines()
    assert len(lines) == 4, lines
    for line in lines:
        assert re.fullmatch(rf"evsel: progress: {re.escape(UNREAL)} \d+/495 \(10/s, ETA \d+m? ?\d+s\)", line), line
    assert lines[0] == f"evsel: progress: {UNREAL} 50/495 (10/s, ETA 44s)"


def test_a_non_terminal_stream_gets_nothing_for_work_under_the_threshold():
    clock = FakeClock()
    view, stream = view_on(False, clock)
    for event in ASK_UNREAL:
        view(event)
        clock.now += 0.9
    view(progress("encode", 495, 495, UNREAL))
    clock.now += 10
    view.tick()  # nothing is running any more
    assert stream.getvalue() == ""


def test_a_long_stage_without_events_still_gets_its_line():
    clock = FakeClock()
    view, stream = view_on(False, clock)
    view(progress("load", 0, 1, "loading the model"))
    clock.now += 4
    view.tick()
    assert stream.getvalue() == ""
    clock.now += 2
    view.tick()
    view.tick()  # within the interval: no second line
    assert stream.getvalue().splitlines() == ["evsel: progress: loading the model (6s)"]


def test_labels_are_shown_with_control_characters_escaped():
    clock = FakeClock()
    view, stream = view_on(False, clock)
    view(progress("files", 0, 3, "evil\x1b[2J.txt"))
    clock.now += 5
    view.tick()
    text = stream.getvalue()
    assert "\x1b" not in text and "evil\\x1b[2J.txt 0/3" in text
    live, _ = view_on(True, clock)
    live(progress("files", 0, 3, "evil\x1b]0;title\x07.txt"))
    assert shown(live) == ["evil\\x1b]0;title\\x07.txt"]


def test_a_disabled_view_shows_no_progress():
    clock = FakeClock()
    view, stream = view_on(False, clock, enabled=False)
    view(progress("encode", 0, 495, UNREAL))
    clock.now += 30
    view(progress("encode", 300, 495, UNREAL))
    assert stream.getvalue() == "" and shown(view) == []


def test_durations_read_short():
    assert [duration(s) for s in (0, 42, 359, 3725)] == ["0s", "42s", "5m 59s", "1h 02m"]
