"""`evsel corpus build DIR --out OUT` without --address starts a Ray instance of its own: every
port of it listens on loopback only (an open Ray port runs anyone's code), and Ray's token
authentication is on. Watched with psutil while a real build runs (the `scale` extra)."""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("ray", "lance", "lance_ray", "pyarrow", "psutil")),
    reason="the scale extra is not installed (pip install '.[scale]')")

BIN = Path(sys.executable).parent


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, a dual-stack socket's loopback
    return (mapped or address).is_loopback


def _listening(proc) -> set[tuple[str, str, int]]:
    """(process name, address, port) of every listening TCP/UDP socket of `proc` and its descendants."""
    import psutil

    found = set()
    try:
        family = [proc] + proc.children(recursive=True)
    except psutil.Error:
        return found
    for p in family:
        try:
            for conn in p.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN or (conn.type == 2 and not conn.raddr):  # 2: SOCK_DGRAM
                    found.add((p.name(), conn.laddr.ip, conn.laddr.port))
        except psutil.Error:
            continue
    return found


def _auth_modes(proc) -> set[str]:
    """RAY_AUTH_MODE as the build's Ray processes (gcs_server, raylet) have it."""
    import psutil

    modes = set()
    try:
        family = proc.children(recursive=True)
    except psutil.Error:
        return modes
    for p in family:
        try:
            if p.name() in ("gcs_server", "raylet"):
                modes.add(p.environ().get("RAY_AUTH_MODE", "unset"))
        except psutil.Error:
            continue
    return modes


def test_a_local_build_listens_on_loopback_only_with_authentication(tmp_path, model_cache):
    import psutil

    source = tmp_path / "src"
    source.mkdir()
    for i in range(6):
        (source / f"log{i}.txt").write_text(
            "".join(f"Day {n} of log {i}: the keeper trimmed the lamp and wrote down the ships. " for n in range(60)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # nothing inherited decides it
    env.update(EVSEL_HOME=str(tmp_path / "home"), EVSEL_MODEL_CACHE=str(model_cache), EVSEL_NO_DAEMON="1",
               EVSEL_THREADS="1", RAY_USAGE_STATS_ENABLED="0")
    build = subprocess.Popen([str(BIN / "evsel"), "corpus", "build", str(source), "--out", str(tmp_path / "out"),
                              "--states", "none", "--batch-docs", "2"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc = psutil.Process(build.pid)
    seen: set[tuple[str, str, int]] = set()
    modes: set[str] = set()
    deadline = time.monotonic() + 600
    try:
        while build.poll() is None and time.monotonic() < deadline:
            seen |= _listening(proc)
            modes |= _auth_modes(proc)
            time.sleep(0.2)
        _, err = build.communicate(timeout=60)
    finally:
        if build.poll() is None:
            build.kill()
    assert build.returncode == 0, err[-3000:]
    assert "unexpected" not in err
    assert any(name == "gcs_server" for name, _, _ in seen), seen  # the watch saw Ray's servers listening
    outside = sorted(s for s in seen if not _loopback(s[1]))
    assert outside == [], outside
    assert modes == {"token"}, modes
