"""A bounded fault and soak run of the daemon, on loopback only (its own EVSEL_HOME in a temp folder).

    python bench/faults.py [--clients 4] [--kills 2] [--seconds 20]

- load: N concurrent clients ask (BM25, --evidence-only: the daemon's queue, not generation)
  while a large ingest runs; the daemon is killed with SIGKILL K times mid-ingest, and the next
  command restarts it;
- bad inputs: a corpus of broken files (empty, binary, truncated JSON, fake PDF/EPUB, bad UTF-8,
  a FIFO) ingested together with one good file: each must fail alone, with one line;
- malformed protocol messages over a raw socket (not JSON, a JSON array, a wrong version, unknown
  methods, params of the wrong type, relative paths): each must get an error reply (or a close)
  and leave the daemon up;
- rows lost: `PRAGMA integrity_check`, and every stored document's n_chunks equals its chunk rows,
  and every document stored before a kill is still there after it.

Prints load held (requests, p50/p95 latency, errors), faults survived, bad inputs tried, rows
lost; writes bench/results/faults.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from common import write_result  # noqa: E402

QUESTIONS = ["Who killed Ambrose Tenterden?", "Who kept the Gull Point light?", "What did Mabel Frost write?",
             "zebra xylophone quantum"]


def cli(args: list[str], env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evsel", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def documents(home: Path) -> list[tuple]:
    with sqlite3.connect(home / "evsel.db") as db:
        return db.execute("select id, path, n_chunks, (select count(*) from chunks c where c.doc_id = d.id) "
                          "from documents d order by id").fetchall()


def integrity(home: Path) -> str:
    with sqlite3.connect(home / "evsel.db") as db:
        return db.execute("pragma integrity_check").fetchone()[0]


def daemon_pid(home: Path) -> int | None:
    try:
        return json.loads((home / "daemon.pid").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


def bad_corpus(folder: Path) -> list[Path]:
    folder.mkdir(parents=True)
    files = {
        "empty.txt": b"",
        "binary.txt": bytes(range(256)) * 64,
        "truncated.json": b'{"conversation": {"speaker_a": "A", "session_1": [{"text": "unterminated',
        "array.json": b"[1, 2, 3]",
        "fake.pdf": b"%PDF-1.7 not really",
        "fake.epub": b"not a zip",
        "latin1.md": "caf\u00e9 cr\u00e8me".encode("latin-1"),
        "lines.jsonl": b'{"speaker": "A", "text": "hi"}\nnot json\n',
        "good.txt": b"Silas Quint kept the light at Gull Point.\n",
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    os.mkfifo(folder / "pipe.txt")
    return sorted(folder.iterdir())


MALFORMED: list[bytes] = [
    b"this is not json\n",
    b"[1, 2]\n",
    b'{"v": 1, "id": "a", "type": "request", "method": "hello"}\n',
    b'{"v": 2, "id": "b", "type": "request", "method": "_private", "params": {}}\n',
    b'{"v": 2, "id": "c", "type": "request", "method": "ingest", "params": {"targets": "ab"}}\n',
    b'{"v": 2, "id": "d", "type": "request", "method": "watch_add", "params": {"path": "tmp"}}\n',
    b'{"v": 2, "id": "e", "type": "request", "method": "ask", "params": {"question": "q", "top_n": "5"}}\n',
    b'{"v": 2, "id": "f", "type": "request", "method": "docs_rm", "params": {"doc_ids": "all"}}\n',
    b'{"v": 2, "id": "g", "type": "request", "method": "ask", "params": []}\n',
    b'{"v": 2, "id": "h", "type": "request", "method": "ask", "params": {"question": "q", "on_event": 1}}\n',
]


def send_raw(home: Path, data: bytes) -> str:
    """'error' (an error reply), 'closed' (the daemon closed the connection) or what came back."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(20)
    try:
        sock.connect(str(home / "daemon.sock"))
        sock.sendall(data)
        reply = b""
        while b"\n" not in reply:
            chunk = sock.recv(1 << 16)
            if not chunk:
                return "closed"
            reply += chunk
        return "error" if json.loads(reply.split(b"\n")[0]).get("type") == "error" else reply.decode()[:200]
    except (OSError, ValueError) as exc:
        return f"failed: {exc}"
    finally:
        sock.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0, help="load phase length after the last kill")
    parser.add_argument("--copies", type=int, default=30, help="copies of the sample story in the big ingest")
    args = parser.parse_args()

    from evsel.evaluation.report import run_info
    from evsel.paths import sample_story_path

    tmp = Path(tempfile.mkdtemp(prefix="evsel-faults-"))
    home = tmp / "home"
    env = {**os.environ, "EVSEL_HOME": str(home), "EVSEL_ENCODE": "0", "OMP_NUM_THREADS": "1",
           "EVSEL_DAEMON_BUILD": "faults"}
    env.pop("EVSEL_NO_DAEMON", None)
    story = sample_story_path().read_text(encoding="utf-8")
    books = tmp / "books"
    books.mkdir()
    for i in range(3):
        (books / f"big{i}.md").write_text("\n\n".join(story.replace("Tenterden", f"Tenterden{i}{j}")
                                                      for j in range(args.copies)), encoding="utf-8")
    record: dict = {"run": run_info(["python", "bench/faults.py", *sys.argv[1:]]), "clients": args.clients,
                    "kills": args.kills}
    cli(["ingest", str(sample_story_path())], env).check_returncode()

    latencies: list[float] = []
    errors: list[str] = []
    requests = 0
    stop = threading.Event()
    lock = threading.Lock()

    def asker(n: int) -> None:
        nonlocal requests
        i = n
        while not stop.is_set():
            started = time.perf_counter()
            result = cli(["ask", QUESTIONS[i % len(QUESTIONS)], "--evidence-only", "--json"], env)
            took = time.perf_counter() - started
            i += 1
            with lock:
                requests += 1
                if result.returncode == 0:
                    latencies.append(took)
                elif "daemon stopped" in result.stderr or "lost the connection" in result.stderr:
                    pass  # a kill we made: expected, counted as a fault below
                else:
                    errors.append(result.stderr.strip()[-300:])

    threads = [threading.Thread(target=asker, args=(n,), daemon=True) for n in range(args.clients)]
    for t in threads:
        t.start()
    faults = []
    for k in range(args.kills):
        before = documents(home)
        ingest = subprocess.Popen([sys.executable, "-m", "evsel", "ingest", str(books)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3 + k)
        pid = daemon_pid(home)
        if pid:
            os.kill(pid, signal.SIGKILL)
        ingest.communicate(timeout=120)
        after = documents(home)
        lost = [d for d in before if d not in after and d[1] not in {a[1] for a in after}]
        half = [d for d in after if d[2] != d[3]]
        faults.append({"kill": k + 1, "integrity": integrity(home), "documents_lost": len(lost),
                       "half_stored": len(half)})
        cli(["daemon", "status"], env)  # restarts it; it resumes what was interrupted
    time.sleep(args.seconds)
    stop.set()
    for t in threads:
        t.join(timeout=120)
    # bad inputs and malformed messages, on the restarted daemon
    corpus = bad_corpus(tmp / "bad")
    bad = cli(["ingest", str(tmp / "bad"), "--json"], env)
    results = json.loads(bad.stdout).get("files", []) if bad.stdout.strip() else []
    failed = [r for r in results if r["status"] == "failed"]
    good = [r for r in results if r["status"] == "ingested"]
    unexpected_bad = [r for r in failed if "unexpected" in json.dumps(r.get("error"))]
    protocol = [send_raw(home, data) for data in MALFORMED]
    protocol_ok = sum(p in ("error", "closed") for p in protocol)
    alive = cli(["daemon", "status", "--json"], env)
    status = json.loads(alive.stdout) if alive.returncode == 0 else {}
    # wait for the resumed ingests, then count rows
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        with sqlite3.connect(home / "evsel.db") as db:
            if not db.execute("select count(*) from pending_ingests").fetchone()[0]:
                break
        time.sleep(1)
    final = documents(home)
    rows_lost = sum(f["documents_lost"] + f["half_stored"] for f in faults) + sum(d[2] != d[3] for d in final)
    cli(["daemon", "stop"], env)

    lat = sorted(latencies)
    record.update({
        "load": {"requests": requests, "ok": len(lat), "errors": len(errors), "error_samples": errors[:5],
                 "p50_s": round(statistics.median(lat), 3) if lat else None,
                 "p95_s": round(lat[int(0.95 * (len(lat) - 1))], 3) if lat else None},
        "faults": faults, "faults_survived": sum(f["integrity"] == "ok" for f in faults),
        "bad_inputs": {"tried": len(corpus), "failed_alone": len(failed), "good_ingested": len(good),
                       "unexpected": len(unexpected_bad)},
        "protocol": {"tried": len(MALFORMED), "answered_or_closed": protocol_ok, "replies": protocol,
                     "daemon_up_after": bool(status.get("running"))},
        "integrity": integrity(home), "documents": len(final), "rows_lost": rows_lost,
    })
    write_result(ROOT / "bench" / "results" / "faults.json", record)
    load = record["load"]
    print(f"load held: {load['requests']} requests from {args.clients} clients, p50 {load['p50_s']} s, "
          f"p95 {load['p95_s']} s, {load['errors']} unexpected errors")
    print(f"faults survived: {record['faults_survived']} of {len(faults)} kill -9 mid-ingest")
    print(f"bad inputs tried: {len(corpus)} ({len(failed)} failed alone, {len(good)} good file ingested, "
          f"{len(unexpected_bad)} unexpected); malformed messages: {protocol_ok} of {len(MALFORMED)} refused, "
          f"daemon up after: {record['protocol']['daemon_up_after']}")
    print(f"rows lost: {rows_lost} (integrity_check: {record['integrity']}, {len(final)} documents)")
    return 0 if rows_lost == 0 and not errors and not unexpected_bad else 1


if __name__ == "__main__":
    sys.exit(main())
