"""Issue 12's probe, kept: who the client talks to, who can read the home, planted symlinks, names
that are not UTF-8, and malformed protocol lines. Real daemons, real sockets."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import stat
import subprocess
import sys
import threading

import pytest

from daemon_helpers import alive, daemon_home, evsel, evsel_json, run_cli, status  # noqa: F401  (fixture)


def _modes(home):
    """{relative path: mode} of everything in the home (not following symlinks)."""
    out = {}
    for root, dirs, files in os.walk(home):
        for name in dirs + files:
            path = os.path.join(root, name)
            out[os.path.relpath(path, home)] = stat.S_IMODE(os.lstat(path).st_mode)
    return out


@pytest.fixture
def umask_022():
    """The usual umask, whatever the test runner had: what evsel must tighten itself."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


# 1. the client talks only to a daemon of its own user, in a home only it can write
def test_client_refuses_a_socket_served_by_another_user(daemon_home):
    if os.getuid() != 0:
        pytest.skip("needs root: the stand-in server must run as another user (os.setuid in a forked child)")
    daemon_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    sock_path = daemon_home / "daemon.sock"
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the stand-in: binds as root, then listens as nobody (the peer uid a client sees)
        try:
            os.close(ready_r)
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(str(sock_path))
            os.setgid(65534)
            os.setuid(65534)
            server.listen(4)
            os.write(ready_w, b"r")
            server.settimeout(60)
            received = 0
            conn, _ = server.accept()
            conn.settimeout(60)
            while True:
                chunk = conn.recv(65536)
                if not chunk:
                    break
                received += len(chunk)
            os.write(ready_w, str(received).encode())
        except BaseException as exc:  # noqa: BLE001
            os.write(ready_w, f"child failed: {exc!r}".encode())
        finally:
            os._exit(0)
    os.close(ready_w)
    try:
        assert os.read(ready_r, 1) == b"r"
        result = evsel("docs", "list", check=False)
        assert result.returncode == 1, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith(f"evsel: error: the socket {sock_path} is served by another user (uid 65534")
        assert f"rm {sock_path}" in lines[0]
        received = b""
        while True:  # the child reports how many bytes it got once the client closed
            chunk = os.read(ready_r, 100)
            if not chunk:
                break
            received += chunk
        assert received == b"0", received  # nothing was sent: not hello, not the question
    finally:
        os.close(ready_r)
        os.waitpid(pid, 0)


def test_client_refuses_a_home_others_can_write_even_with_a_daemon_in_it(daemon_home):
    evsel("daemon", "start", "--no-preload")
    before = status(daemon_home)["requests"]["requests"]
    os.chmod(daemon_home, 0o777)
    try:
        result = evsel("docs", "list", check=False)
        assert result.returncode == 1
        assert result.stderr.startswith(f"evsel: error: EVSEL_HOME {daemon_home} is writable by other users")
        assert f"chmod 700 {daemon_home}" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    finally:
        os.chmod(daemon_home, 0o700)
    after = status(daemon_home)["requests"]["requests"]
    assert after == before + 1  # only this status call: the refused client sent nothing


# 2. the home is 0700 and every file in it 0600, whatever the umask; a looser one is reported
def test_home_and_store_files_are_private_in_process(evsel_home, tmp_path, umask_022):
    doc = tmp_path / "secret.txt"
    doc.write_text("The combination of the safe is 31-17-4. Nobody else knows it.\n")
    evsel("ingest", str(doc))
    modes = _modes(evsel_home)
    assert stat.S_IMODE(evsel_home.stat().st_mode) == 0o700
    assert modes["evsel.db"] == 0o600
    for name, mode in modes.items():
        kind = os.lstat(evsel_home / name).st_mode
        assert mode == (0o700 if stat.S_ISDIR(kind) else 0o600), (name, oct(mode))


def test_store_files_are_private_even_with_umask_0(tmp_path):
    from evsel.store import store

    old = os.umask(0)
    try:
        db = store.connect(tmp_path / "x.db")
        db.execute("create table t (a)")
        db.execute("insert into t values (1)")
        for name in ("x.db", "x.db-wal", "x.db-shm"):
            assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name
        db.conn.close()
    finally:
        os.umask(old)


def test_daemon_files_are_private(daemon_home, tmp_path, umask_022):
    doc = tmp_path / "secret.txt"
    doc.write_text("The combination of the safe is 31-17-4.\n")
    evsel("ingest", str(doc))
    info = evsel_json("daemon", "status")
    assert info["home_mode_warning"] is None
    for name, mode in _modes(daemon_home).items():
        kind = os.lstat(daemon_home / name).st_mode
        assert mode == (0o700 if stat.S_ISDIR(kind) else 0o600), (name, oct(mode))


def test_a_looser_home_or_store_is_reported(daemon_home, capsys, monkeypatch):
    evsel("daemon", "start", "--no-preload")
    os.chmod(daemon_home, 0o755)
    os.chmod(daemon_home / "evsel.db", 0o644)
    try:
        result = evsel("daemon", "status", "--json")
        warning = json.loads(result.stdout)["home_mode_warning"]
        assert f"EVSEL_HOME {daemon_home} is 0755" in warning and "evsel.db is 0644" in warning
        assert f"chmod 700 {daemon_home}" in warning and f"chmod 600 {daemon_home / 'evsel.db'}" in warning
        assert "evsel: warning: EVSEL_HOME" in result.stderr
        assert "evsel: warning: EVSEL_HOME" in evsel("daemon", "status").stderr

        # models info says it too (its engine stubbed: loading the backbone is not what this is about)
        from evsel.commands import models

        class Stub:
            def models_info(self):
                return {"name": "stub"}

        monkeypatch.setattr(models, "engine_from", lambda ctx: Stub())
        umask = os.umask(0o022)
        try:
            code, out, err = run_cli(capsys, "models", "info")
        finally:
            os.umask(umask)
        assert code == 0 and "stub" in out
        assert "evsel: warning: EVSEL_HOME" in err and "evsel.db is 0644" in err
    finally:
        os.chmod(daemon_home, 0o700)
        os.chmod(daemon_home / "evsel.db", 0o600)
    assert evsel_json("daemon", "status")["home_mode_warning"] is None


# 3. symlinks planted in the home are refused, their targets untouched
def test_planted_symlinks_for_daemon_err_and_log_are_refused(daemon_home, tmp_path):
    daemon_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    target = tmp_path / "victim.txt"
    target.write_text("precious\n")
    os.chmod(target, 0o644)

    def untouched():
        assert target.read_text() == "precious\n"
        assert stat.S_IMODE(target.stat().st_mode) == 0o644

    os.symlink(target, daemon_home / "daemon.err")
    result = evsel("docs", "list", check=False)  # auto-start opens daemon.err for the daemon's stderr
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"evsel: error: {daemon_home / 'daemon.err'} is a symbolic link, so evsel will not use it; "
        f"remove it (rm {daemon_home / 'daemon.err'}), then run the command again"]
    untouched()
    assert not alive(daemon_home)
    (daemon_home / "daemon.err").unlink()

    os.symlink(target, daemon_home / "daemon.log")
    result = evsel("daemon", "start", "--no-preload", check=False)
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1
    assert f"{daemon_home / 'daemon.log'} is a symbolic link, so evsel will not use it" in result.stderr
    untouched()
    assert not alive(daemon_home)
    (daemon_home / "daemon.log").unlink()
    evsel("daemon", "start", "--no-preload")  # and with the links gone it starts
    assert stat.S_IMODE((daemon_home / "daemon.log").stat().st_mode) == 0o600


# 4 and 10. names and questions that are not UTF-8 go through the protocol losslessly
def test_protocol_keeps_surrogate_escaped_names():
    from evsel.daemon.protocol import LineReader, encode

    name = os.fsdecode(b"/tmp/caf\xe9 \xff.txt")
    a, b = socket.socketpair()
    try:
        line = encode({"v": 2, "params": {"targets": [name], "text": "caf\u00e9 \u2014"}})
        assert line.isascii()
        a.sendall(line)
        got = LineReader(b).read()
        assert got["params"]["targets"] == [name] and os.fsencode(got["params"]["targets"][0]) == b"/tmp/caf\xe9 \xff.txt"
        assert got["params"]["text"] == "caf\u00e9 \u2014"
    finally:
        a.close()
        b.close()


def test_a_name_that_is_not_utf8_does_not_fail_the_ingest(daemon_home, tmp_path):
    folder = os.fsencode(tmp_path / "docs")
    os.mkdir(folder)
    with open(os.path.join(folder, b"caf\xe9.txt"), "w") as f:
        f.write("The lighthouse keeper was called Ambrose and he liked strong tea.\n")
    with open(os.path.join(folder, b"plain.txt"), "w") as f:
        f.write("Another file about boats, gulls and the grey sea.\n")
    odd = os.fsdecode(os.path.join(folder, b"caf\xe9.txt"))

    result = evsel("ingest", os.fsdecode(folder), check=False)
    assert "Traceback" not in result.stderr
    assert "ingested" in result.stdout + result.stderr and "plain.txt" in result.stdout + result.stderr
    names = {d["path"] for d in evsel_json("docs", "list")}
    assert os.fsdecode(os.path.join(folder, b"plain.txt")) in names
    if odd not in names:  # or it fails alone, with one line naming it
        failed = [line for line in result.stderr.splitlines() if "caf" in line and not line.startswith("evsel: progress:")]
        assert len(failed) == 1 and failed[0].startswith("evsel: error: ") and result.returncode == 1
        assert "not valid UTF-8" in failed[0] and "rename the file" in failed[0]
    # the same file as the only target: one line, nothing left to "resume"
    alone = evsel("ingest", odd, check=False)
    said = [line for line in alone.stderr.strip().splitlines() if not line.startswith("evsel: progress:")]
    assert alone.returncode in (0, 1) and len(said) <= 1
    with sqlite3.connect(daemon_home / "evsel.db") as db:
        assert db.execute("select count(*) from pending_ingests").fetchone()[0] == 0
    info = evsel_json("daemon", "status")
    assert [r["method"] for r in info["recent"]].count("ingest") == 2 and info["resumed"] == []


def test_a_question_that_is_not_utf8_is_asked_in_the_daemon(daemon_home, tmp_path):
    doc = tmp_path / "story.txt"
    doc.write_text("The keeper of the lighthouse was Ambrose. He drank tea at noon.\n")
    evsel("ingest", str(doc))
    question = os.fsdecode(b"who drank tea caf\xe9?")
    result = subprocess.run([sys.executable, "-m", "evsel", "ask", question, "--evidence-only", "--json"],
                            capture_output=True, timeout=300)  # bytes: the question is echoed as given
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout.decode(errors="surrogateescape"))
    assert answer["evidence"] and answer["question"] == question
    recent = evsel_json("daemon", "status")["recent"]
    asks = [r for r in recent if r["method"] == "ask"]
    assert len(asks) == 1 and asks[0]["status"] == "ok"  # answered by the daemon, not in-process


# 7 (framing): bad lines get an error reply, and the size limit holds while reading
def test_line_reader_stops_reading_past_the_limit():
    from evsel.daemon.protocol import LineReader, ProtocolError

    a, b = socket.socketpair()
    sent = []

    def flood():
        try:
            for _ in range(400):  # 400 x 64 KiB = 25 MiB, no newline; the reader stops long before
                a.sendall(b"x" * 65536)
                sent.append(1)
        except OSError:
            pass

    sender = threading.Thread(target=flood, daemon=True)
    sender.start()
    b.settimeout(60)  # a reader that read on would block once the flood ends: fail, do not hang
    reader = LineReader(b, max_line=1 << 20)
    with pytest.raises(ProtocolError, match="too large"):
        reader.read()
    assert len(reader.buffer) <= (1 << 20) + 65536  # nothing read past the limit's next chunk
    b.close()
    sender.join(10)
    a.close()
    assert len(sent) < 400


class _SearchCountingBuffer(bytearray):
    """A read buffer that counts the bytes its newline searches cover."""

    searched = 0

    def find(self, sub, start=0, *rest):
        self.searched += len(self) - start
        return super().find(sub, start, *rest)


def test_line_reader_is_linear_on_a_long_line():
    """Each arrived byte is searched for the newline once (searching the whole buffer again after
    every 64 KiB read was quadratic: ~13 s for 50 MB)."""
    from evsel.daemon.protocol import LineReader

    a, b = socket.socketpair()
    b.settimeout(60)
    payload = json.dumps({"v": 2, "text": "y" * (8 << 20)}).encode() + b"\n"
    sender = threading.Thread(target=lambda: a.sendall(payload), daemon=True)
    sender.start()
    reader = LineReader(b)
    reader.buffer = _SearchCountingBuffer()
    message = reader.read()
    assert len(message["text"]) == 8 << 20
    assert isinstance(reader.buffer, _SearchCountingBuffer)  # still the counting one after the appends
    assert reader.buffer.searched <= len(payload)
    sender.join(10)
    a.close()
    b.close()


def _raw(home):
    from evsel.daemon import runtime

    sock = runtime.connect_unix(home / "daemon.sock", timeout=60)
    return sock


def _reply(sock) -> dict:
    from evsel.daemon.protocol import LineReader

    message = LineReader(sock).read()
    assert message is not None, "the daemon closed the connection without a reply"
    return message


def test_daemon_answers_bad_json_and_oversized_lines_with_an_error(daemon_home):
    from evsel.daemon.protocol import MAX_LINE

    evsel("daemon", "start", "--no-preload")
    sock = _raw(daemon_home)
    try:
        sock.sendall(b"not json\n")
        reply = _reply(sock)
        assert reply["type"] == "error" and reply["error"]["type"] == "ProtocolError"
        assert "not JSON" in reply["error"]["message"]
        assert sock.recv(10) == b""  # then it closes
    finally:
        sock.close()

    sock = _raw(daemon_home)
    try:
        def flood():
            try:
                sock.sendall(b"z" * (MAX_LINE + (1 << 20)))  # just over the real limit, no newline
            except OSError:
                pass  # the daemon closed its end once it had read past the limit

        sender = threading.Thread(target=flood, daemon=True)
        sender.start()
        reply = _reply(sock)  # the socket's 60 s timeout fails a daemon that reads on, not a hang
        assert reply["type"] == "error" and "too large" in reply["error"]["message"]
        sender.join(30)
    finally:
        sock.close()
    assert status(daemon_home)["running"]  # the daemon carries on


# 1 (hardening). Every way into the store checks the home and the store's files, --no-daemon too:
# a home others can write (even 1777, as /tmp) lets them plant evsel.db, a symlink to a file they read
def _plant_victim(tmp_path):
    """A file "another user" owns and reads (owned by nobody when we are root)."""
    victim = tmp_path / "theirs.db"
    victim.write_bytes(b"")
    os.chmod(victim, 0o666)
    if os.getuid() == 0:
        os.chown(victim, 65534, 65534)
    return victim


@pytest.mark.parametrize("mode", [0o777, 0o1777])
def test_no_daemon_refuses_a_home_others_can_write(mode, evsel_home, tmp_path, capsys):
    from evsel.cli import main

    secret = tmp_path / "secret.txt"
    secret.write_text("The combination of the safe is 31-17-4. Nobody else knows it.\n")
    evsel_home.mkdir()
    os.chmod(evsel_home, mode)
    victim = _plant_victim(tmp_path)
    os.symlink(victim, evsel_home / "evsel.db")
    for args in (["--no-daemon", "ingest", "--no-encode", str(secret)], ["--no-daemon", "docs", "list"]):
        code = main(args)
        out, err = capsys.readouterr()
        assert code == 1 and out == ""
        assert err.strip().splitlines() == [
            f"evsel: error: EVSEL_HOME {evsel_home} is writable by other users ({mode:04o}), so evsel will not keep "
            f"your documents there; run: chmod 700 {evsel_home}   (or point EVSEL_HOME at a private folder)"]
        assert victim.read_bytes() == b""  # nothing written through the planted link
    assert sorted(os.listdir(evsel_home)) == ["evsel.db"]  # nothing created beside it either


def test_daemon_refusal_no_longer_suggests_no_daemon(evsel_home, monkeypatch, capsys):
    from evsel.cli import main

    monkeypatch.delenv("EVSEL_NO_DAEMON")
    evsel_home.mkdir()
    os.chmod(evsel_home, 0o1777)
    assert main(["docs", "list"]) == 1
    out, err = capsys.readouterr()
    [line] = err.strip().splitlines()
    assert line.startswith(f"evsel: error: EVSEL_HOME {evsel_home} is writable by other users (1777)")
    assert "--no-daemon" not in line and "chmod 700" in line
    assert os.listdir(evsel_home) == []  # no daemon started, nothing written


@pytest.mark.parametrize("name", ["evsel.db", "evsel.db-wal", "evsel.db-shm"])
def test_store_refuses_a_planted_symlink_in_a_private_home(name, evsel_home, tmp_path, capsys):
    from evsel.cli import main

    evsel_home.mkdir(mode=0o700)
    victim = _plant_victim(tmp_path)
    os.symlink(victim, evsel_home / name)
    secret = tmp_path / "secret.txt"
    secret.write_text("The combination of the safe is 31-17-4.\n")
    assert main(["ingest", str(secret)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.strip().splitlines() == [
        f"evsel: error: {evsel_home / name} is a symbolic link, so evsel will not write your documents to it; "
        f"remove it (rm {evsel_home / name}), then run the command again"]
    assert victim.read_bytes() == b""
    assert os.path.islink(evsel_home / name)


def test_store_refuses_a_file_another_user_planted(evsel_home, tmp_path, capsys):
    if os.getuid() != 0:
        pytest.skip("needs root: only root can make a file in our home belong to another user (os.chown)")
    from evsel.cli import main

    evsel_home.mkdir(mode=0o700)
    planted = evsel_home / "evsel.db"
    planted.write_bytes(b"")
    os.chmod(planted, 0o666)
    os.chown(planted, 65534, 65534)
    secret = tmp_path / "secret.txt"
    secret.write_text("The combination of the safe is 31-17-4.\n")
    assert main(["--no-daemon", "ingest", str(secret)]) == 1
    out, err = capsys.readouterr()
    [line] = err.strip().splitlines()
    assert line.startswith(f"evsel: error: {planted} belongs to another user (uid 65534), so evsel will not write")
    assert planted.read_bytes() == b""


def test_a_private_home_still_works(evsel_home, tmp_path, capsys):
    """The checks refuse only what they should: a fresh home, then the store it made, are used."""
    from evsel.cli import main

    doc = tmp_path / "harbour.txt"
    doc.write_text("The harbour master kept a log of every ship.\n")
    assert main(["ingest", str(doc)]) == 0
    capsys.readouterr()  # the ingest's summary (stdout)
    assert main(["docs", "list", "--json"]) == 0
    assert [d["path"] for d in json.loads(capsys.readouterr().out)] == [str(doc.resolve())]


# 2 (hardening). Control characters from documents, file names and the daemon never reach the
# terminal raw: ESC [2J clears the screen, OSC 8 makes a link, OSC 0 sets the window title
HOSTILE = ("The keeper logged the storm.\x1b[2J\x1b[H\x1b[31mFAKE: all tests passed\x1b[0m "
           "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\ \x1b]0;owned\x07 bell\x07 del\x7f csi\x9b2J.\n")
HOSTILE_NAME = "log\x1b[2Jbook\x1b]0;title\x07.txt"
# enough plain prose that the file is text, not binary (evsel refuses a file dense with control bytes)
CALM = "".join(f"On day {n} the sea was calm and the gulls sat on the rocks by the light. " for n in range(40))


def _raw_controls(text: str) -> list[str]:
    return sorted({c for c in text if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F})


def test_control_characters_are_shown_escaped_on_the_terminal(evsel_home, tmp_path, capsys):
    from evsel.cli import main

    doc = tmp_path / HOSTILE_NAME
    doc.write_text("# The Keeper\x1b[5m Log\n\n" + HOSTILE + "\n" + CALM + "\n")
    bad = tmp_path / "empty\x1b[2J.txt"
    bad.write_bytes(b"")
    runs = {}
    for args in (["ingest", str(doc), str(bad)], ["docs", "list"], ["docs", "show", "--chunks", "1"],
                 ["ask", "--evidence-only", "what did the keeper log?"]):
        main(args)
        runs[" ".join(args[:2])] = capsys.readouterr()
    for name, (out, err) in runs.items():
        assert _raw_controls(out + err) == [], name
        assert "unexpected" not in err, name
    shown = runs["docs show"].out + runs["ask --evidence-only"].out
    assert "\\x1b[2J\\x1b[H\\x1b[31mFAKE: all tests passed\\x1b[0m" in runs["docs show"].out
    assert "\\x1b]8;;https://evil.example/\\x1b\\click" in shown and "\\x1b]0;owned\\x07" in shown
    assert "\\x7f" in shown and "\\x9b2J" in shown
    assert "\\x1b[2J" in runs["ask --evidence-only"].out
    assert "log\\x1b[2Jbook\\x1b]0;title\\x07.txt" in runs["docs list"].out  # the path column
    assert "The Keeper\\x1b[5m Log" in runs["docs list"].out  # the title column
    ingest_err = runs["ingest " + str(doc)].err
    assert f"ingested {tmp_path}/log\\x1b[2Jbook\\x1b]0;title\\x07.txt" in runs["ingest " + str(doc)].out
    [error] = [line for line in ingest_err.splitlines() if line.startswith("evsel: error:")]
    assert "empty\\x1b[2J.txt: the file is empty" in error

    # --json keeps the exact text, escaped as JSON
    assert main(["docs", "show", "--chunks", "--json", "1"]) == 0
    out = capsys.readouterr().out
    assert _raw_controls(out) == []
    shown = json.loads(out)
    assert shown["path"] == str(doc.resolve()) and shown["title"] == "The Keeper\x1b[5m Log"
    assert "\x1b[2J\x1b[H\x1b[31mFAKE: all tests passed\x1b[0m" in "".join(c["text"] for c in shown["chunks"])


def test_control_characters_are_escaped_on_a_colour_terminal(evsel_home, tmp_path):
    """A terminal gets rich's own colour codes, and still none from the document."""
    doc = tmp_path / "story.txt"
    doc.write_text(HOSTILE + CALM)
    env = {**os.environ, "FORCE_COLOR": "1", "TERM": "xterm-256color"}
    evsel("ingest", str(doc), env=env)
    result = evsel("docs", "show", "--chunks", "1", env=env)
    assert "\x1b[1m" in result.stdout  # rich styled it: this is what a terminal sees
    for raw in ("\x1b[2J", "\x1b[31mFAKE", "\x1b]8;", "\x1b]0;", "\x07", "\x9b"):
        assert raw not in result.stdout, repr(raw)
    assert "\\x1b[2J\\x1b[H\\x1b[31mFAKE: all tests passed\\x1b[0m" in result.stdout
