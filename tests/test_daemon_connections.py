"""The daemon's connections under hostile load (hardening issue, items 4, 7 and 11): descriptors
over 1024, a cap on connections, idle connections closed, messages that used to get no reply, and
an EPUB ingest that can be cancelled while it is read. Real daemons over real Unix sockets."""

from __future__ import annotations

import json
import resource
import signal
import socket
import subprocess
import sys
import zipfile

import pytest

from daemon_helpers import daemon_home, evsel, kill_process, pid_of, status, wait_for  # noqa: F401  (fixture)


def _connect(home) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(home / "daemon.sock"))  # blocking: waits while the daemon's backlog is full
    sock.settimeout(30)
    return sock


def _replies(sock: socket.socket, data: bytes) -> list[dict]:
    """Send `data`, then read every reply line until the daemon closes the connection."""
    if data:
        sock.sendall(data)
    received = b""
    while True:
        chunk = sock.recv(1 << 16)
        if not chunk:
            break
        received += chunk
    return [json.loads(line) for line in received.splitlines() if line.strip()]


def _closed_by_daemon(sock: socket.socket) -> bool:
    sock.settimeout(0)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


# 11. messages that got no reply
def test_a_deeply_nested_line_and_settings_that_are_not_an_object_get_one_error_reply(daemon_home):
    evsel("daemon", "start", "--no-preload")
    pid = pid_of(daemon_home)
    deep = b"[" * 200_000 + b"]" * 200_000 + b"\n"
    replies = _replies(_connect(daemon_home), deep)
    assert [r["type"] for r in replies] == ["error"] and replies[0]["error"]["type"] == "ProtocolError"
    assert "nested too deeply" in replies[0]["error"]["message"]
    for name, value in (("settings", "str"), ("settings", [1]), ("client", "me")):
        message = {"v": 2, "id": "s1", "type": "request", "method": "ask", "params": {"question": "q"}, name: value}
        sock = _connect(daemon_home)
        try:
            sock.sendall(json.dumps(message).encode() + b"\n")
            reply = json.loads(sock.makefile("rb").readline())
        finally:
            sock.close()
        assert reply["type"] == "error" and reply["id"] == "s1", reply
        assert f"{name} must be an object" in reply["error"]["message"]
    info = status(daemon_home)
    assert info["pid"] == pid and info["queue"]["running"] is None  # nothing ran, the daemon is up
    assert "Traceback" not in (daemon_home / "daemon.log").read_text()


# 7. connections: the cap, idle ones, descriptors over 1024
def test_a_connection_over_the_cap_gets_an_error_reply_and_idle_ones_are_closed(daemon_home, monkeypatch):
    monkeypatch.setenv("EVSEL_DAEMON_MAX_CLIENTS", "4")
    monkeypatch.setenv("EVSEL_DAEMON_CLIENT_IDLE", "0")  # off: the held connections stay open
    evsel("daemon", "start", "--no-preload")
    held = [_connect(daemon_home) for _ in range(4)]
    wait_for(lambda: _over_cap(daemon_home), 60, "the cap to be reached")
    refused = evsel("docs", "list", check=False)
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 1 and len(lines) == 1 and "too many connections open (4)" in lines[0], lines
    for sock in held:
        sock.close()
    wait_for(lambda: evsel("docs", "list", check=False).returncode == 0, 60, "a connection to be served again")
    evsel("daemon", "stop")

    monkeypatch.setenv("EVSEL_DAEMON_CLIENT_IDLE", "1")
    evsel("daemon", "start", "--no-preload")
    idle = _connect(daemon_home)
    wait_for(lambda: _closed_by_daemon(idle), 60, "the idle connection to be closed")
    idle.close()
    assert "idle for 1s" in (daemon_home / "daemon.log").read_text()


def _over_cap(home) -> bool:
    """A fresh connection is refused with one error reply (and then closed)."""
    sock = _connect(home)
    sock.settimeout(5)
    try:
        sock.sendall(json.dumps({"v": 2, "id": "h", "type": "request", "method": "hello"}).encode() + b"\n")
    except OSError:
        pass  # closed before the request was sent: the reply is still there to read
    try:
        replies = _replies(sock, b"")
    except OSError:
        return False
    finally:
        sock.close()
    return [r["type"] for r in replies] == ["error"] and "too many connections" in replies[0]["error"]["message"]


def test_an_ask_is_served_with_1100_connections_open(daemon_home, monkeypatch, tmp_path):
    """select() refused descriptors >= 1024: the ask's connection failed ("lost the connection")
    while its job ran on with nobody listening."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1400:
        if hard != resource.RLIM_INFINITY and hard < 1400:
            pytest.skip(f"RLIMIT_NOFILE's hard limit is {hard}: 1,100 connections do not fit")
        resource.setrlimit(resource.RLIMIT_NOFILE, (1400, hard))  # the daemon inherits it
    monkeypatch.setenv("EVSEL_DAEMON_MAX_CLIENTS", "1200")
    book = tmp_path / "keeper.txt"
    book.write_text("The keeper of Gull Point was Silas Quint.\n")
    evsel("daemon", "start", "--no-preload")
    evsel("ingest", str(book))
    held = [_connect(daemon_home) for _ in range(1100)]
    try:
        wait_for(lambda: status(daemon_home)["clients"] >= 1100, 120, "the daemon to accept 1,100 connections")
        asked = evsel("ask", "Who kept Gull Point?", "--evidence-only", "--json", check=False)
        assert asked.returncode == 0, asked.stderr
        assert "Silas Quint" in json.loads(asked.stdout)["evidence"][0]["text"]
    finally:
        for sock in held:
            sock.close()
        if soft < 1400:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


# 4. an EPUB with a long chapter can be cancelled while it is read
def test_ctrl_c_stops_an_epub_ingest_while_its_long_chapter_is_read(daemon_home, tmp_path):
    """A 20 MB chapter (in a 70 KB EPUB) was read in one call of several minutes with no progress
    event, so neither Ctrl-C nor a client's timeout could stop it."""
    paragraph = "<p>The keeper of Gull Point was Silas Quint, and he kept the light burning every night.</p>"
    path = tmp_path / "long.epub"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(zipfile.ZipInfo("mimetype"), "application/epub+zip")
        z.writestr("META-INF/container.xml", '<container xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
                   '<rootfiles><rootfile full-path="content.opf"/></rootfiles></container>')
        z.writestr("content.opf", '<package xmlns="http://www.idpf.org/2007/opf"><metadata/><manifest>'
                   '<item id="c" href="c.xhtml" media-type="application/xhtml+xml"/></manifest>'
                   '<spine><itemref idref="c"/></spine></package>')
        z.writestr("c.xhtml", f"<html><body>{paragraph * 200_000}</body></html>")  # 18 MB
    evsel("daemon", "start", "--no-preload")
    pid = pid_of(daemon_home)
    client = subprocess.Popen([sys.executable, "-m", "evsel", "ingest", str(path)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        def reading():
            running = (status(daemon_home) or {}).get("queue", {}).get("running")
            progress = running and running["progress"] or {}
            return progress.get("task") == "parse" and progress.get("done", 0) > 0

        wait_for(reading, 120, "the chapter to be read, with progress", interval=0.01)
        client.send_signal(signal.SIGINT)
        client.communicate(timeout=60)
    finally:
        kill_process(client)
    wait_for(lambda: status(daemon_home)["queue"]["running"] is None, 60, "the cancelled ingest to stop")
    info = status(daemon_home)
    assert info["pid"] == pid and info["recent"][-1]["status"] == "cancelled"
    assert info["documents"] == 0
