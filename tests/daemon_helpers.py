"""Helpers for the daemon tests: run the real CLI, wait for conditions, and always stop daemons."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

# Pinned so that a source file edited while the tests run does not make a client restart the
# daemon under a test (the build id otherwise includes the sources' mtimes).
TEST_BUILD = "tests"


def use_daemon(monkeypatch, home: Path | None = None, debounce: float = 0.5) -> None:
    """Turn on the daemon for this test (conftest turns it off for every test)."""
    monkeypatch.delenv("EVSEL_NO_DAEMON", raising=False)
    monkeypatch.setenv("EVSEL_DAEMON_BUILD", TEST_BUILD)
    monkeypatch.setenv("EVSEL_WATCH_DEBOUNCE", str(debounce))
    monkeypatch.setenv("EVSEL_ENCODE", "0")  # selector states at ingest are not what these tests are about
    # one thread, in-process and in the daemon alike: spinning OpenMP threads on shared cores make
    # generation erratic and up to 10x slower (see bench/run_all.sh)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    if home is not None:
        monkeypatch.setenv("EVSEL_HOME", str(home))


def evsel(*args: str, check: bool = True, timeout: float = 300, cwd: str | None = None,
          env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "evsel", *args], capture_output=True, text=True,
                            env=env or os.environ.copy(), timeout=timeout, cwd=cwd)
    if check and result.returncode != 0:
        raise AssertionError(f"evsel {' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result


def evsel_json(*args: str, **kwargs):
    return json.loads(evsel(*args, "--json", **kwargs).stdout)


def pid_of(home: Path) -> int | None:
    try:
        return json.loads((home / "daemon.pid").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def alive(home: Path) -> bool:
    from evsel.daemon import runtime

    return runtime.daemon_alive(runtime.DaemonFiles(home))


def wait_for(predicate, timeout: float = 120, what: str = "a condition", interval: float = 0.05):
    """Poll until predicate() is truthy and return it. The timeout only keeps a broken run from hanging."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def status(home: Path) -> dict | None:
    from evsel.daemon import client, runtime

    return client.status(runtime.DaemonFiles(home))


def kill_daemon(home: Path) -> None:
    """Stop the home's daemon whatever state it is in: SIGTERM, then SIGKILL. Never raises."""
    if not home.exists():
        return
    pid = pid_of(home)
    if pid is None or not alive(home):
        return
    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while alive(home) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not alive(home):
            return


def kill_process(process: subprocess.Popen | None) -> None:
    if process is not None and process.poll() is None:
        process.kill()
        process.wait(timeout=10)


@pytest.fixture
def daemon_home(evsel_home, monkeypatch):
    """This test's EVSEL_HOME with the daemon on; its daemon is killed afterwards, pass or fail."""
    use_daemon(monkeypatch)
    try:
        yield evsel_home
    finally:
        kill_daemon(evsel_home)


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """The CLI's main() in this process (no interpreter start-up): exit code, stdout, stderr."""
    from evsel.cli import main

    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def outcome(code: int, stdout: str, stderr: str) -> tuple:
    """What a command run stated, to compare two ways of running it: its exit code, its stdout
    (the JSON document where it is one, without the timings that differ run to run), and what it
    told the user on stderr: its error and warning lines, or Typer's usage block. Progress rows are
    left out by what is kept: how many are written depends on the machine's load."""
    try:
        result = json.loads(stdout)
    except ValueError:
        result = stdout
    if isinstance(result, dict):
        result.pop("timings", None)
    lines = [_ANSI.sub("", line).rstrip() for line in stderr.splitlines()]
    usage = next((i for i, line in enumerate(lines) if line.lstrip().startswith("Usage:")), None)
    told = lines[usage:] if usage is not None else [
        line for line in lines if line.startswith(("evsel: error:", "evsel: warning:"))]
    return code, result, told


def docs_by_name(collection: str | None = None) -> dict[str, dict]:
    """Documents by file name, read through the daemon's fast path (the real client, no new process)."""
    from evsel.daemon.client import DaemonClient

    client = DaemonClient()
    try:
        return {d["path"].rsplit("/", 1)[-1]: d for d in client.docs_list(collection)}
    except Exception as exc:  # noqa: BLE001
        if "no collection named" in str(exc):
            return {}
        raise
    finally:
        client.close()


@contextlib.contextmanager
def daemon_in_process(home: Path, monkeypatch):
    """A daemon run in this test's process (on a thread), so a test can hold it at a chosen point
    with an event instead of racing it; stopped on exit. Yields the `Daemon`."""
    import logging
    import threading

    from evsel.daemon.server import Daemon

    daemon_log = logging.getLogger("evsel.daemon")
    monkeypatch.setattr(daemon_log, "handlers", list(daemon_log.handlers))  # the daemon replaces them
    monkeypatch.setattr(daemon_log, "propagate", daemon_log.propagate)
    monkeypatch.chdir(os.getcwd())  # restored afterwards: the daemon moves to /
    daemon = Daemon(idle_timeout=0, preload=False)
    thread = threading.Thread(target=daemon.run, name="test-daemon", daemon=True)
    thread.start()
    try:
        wait_for(lambda: status(home), 60, "the daemon to answer")
        yield daemon
    finally:
        daemon.stop_event.set()
        thread.join(60)
        assert not thread.is_alive(), "the daemon did not stop"
