"""A bounded fault and soak run of the daemon, on loopback only (its own EVSEL_HOME in a temp folder).

    python bench/faults.py [--clients 4] [--kills 2] [--seconds 20] [--bomb-mb 20] [--connections 1100]

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

- hostile inputs and loads, on the restarted daemon: terminal escapes in a file's name and text,
  a file rewritten during its ingest, an EPUB bomb (one 20 MB chapter), 2 MB of unpunctuated
  text, 1,100 idle connections, and a store on a 2 MB tmpfs that fills up (skipped, saying why,
  where `mount` is not allowed);
- the surfaces built after the store (`--surfaces-only` runs just these): damaged trained parts
  (the UNREAL adapter, the BlockSearch router, the hybrid weights: cut short, random, empty, a
  lying header, JSON malformed or of the wrong types), malformed `evsel eval` JSONL, `evsel train
  --out` under a file or on a read-only tmpfs, and a corpus with a Lance data file removed (then
  repaired as a resumed build does): each must be one line naming the file, never "unexpected";
- issue 48's (`--round-four` runs just these): stored-KV files replaced by a symlink or a FIFO
  (one warning, the same evidence, written again), hostile PDFs with a time bound (value-only rows
  within 5x the plain reader's ingest, a 300-page PDF of one-line pages stored, a statement's
  totals kept), fusion weights that are not finite, damaged thread records, a collection name that
  is not UTF-8, and stdout faults (a closed pipe, a full stdout, an ASCII-only one) through the
  daemon's fast path and the Typer app alike.

The temp folder, its mounts and the daemon are gone at the end, however the run ends.

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
import shutil
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


def _flip(path: Path, versions: list[bytes], stop: threading.Event) -> None:
    """Rewrite `path` with each version in turn, each written whole (an atomic rename), until stopped."""
    i = 0
    while not stop.is_set():
        i += 1
        copy = path.with_name(path.name + f".next{i % 2}")
        copy.write_bytes(versions[i % 2])
        os.replace(copy, path)
        time.sleep(0.001)


def _queue_idle(env: dict) -> bool:
    result = cli(["daemon", "status", "--json"], env, timeout=60)
    return result.returncode == 0 and json.loads(result.stdout)["queue"]["running"] is None


def hostile_inputs(tmp: Path, home: Path, env: dict, bomb_mb: float, connections: int) -> list[dict]:
    """Inputs and loads meant to hurt, on the running daemon: each case says what happened and
    whether that is what a user should see (`ok`)."""
    import hashlib

    from evsel.ingest.chunker import DEFAULT_CHUNK_TOKENS
    from parse_limits import make_epub

    folder = tmp / "hostile"
    folder.mkdir()
    cases = []

    # terminal escape sequences in a file's name and text: never printed raw
    esc = folder / "esc\x1b[2Jname.txt"
    esc.write_text("Title \x1b]0;pwned\x07 and \x1b[31mred\x1b[0m. The keeper of Gull Point was Ann.\n")
    outputs = [cli(["ingest", str(esc)], env), cli(["docs", "list"], env)]
    raw = sum("\x1b" in r.stdout + r.stderr for r in outputs)
    cases.append({"input": "escape sequences in a file's name and text", "ok": outputs[0].returncode == 0 and not raw,
                  "detail": f"ingest exit {outputs[0].returncode}, outputs with a raw ESC: {raw}"})

    # a file rewritten while it is ingested: the hash stored is always the text stored's
    versions = [f"Version {name}. The keeper of Gull Point was {name}.\n".encode() * 200 for name in ("Ann", "Bo")]
    texts = {hashlib.sha256(v).hexdigest(): v.decode() for v in versions}
    flipping = folder / "flip.txt"
    flipping.write_bytes(versions[0])
    stop = threading.Event()
    flipper = threading.Thread(target=_flip, args=(flipping, versions, stop), daemon=True)
    flipper.start()
    mismatched = runs = 0
    try:
        for _ in range(8):
            runs += cli(["ingest", str(flipping)], env).returncode == 0
            with sqlite3.connect(home / "evsel.db") as db:
                doc_id, sha = db.execute("select id, sha256 from documents where path = ?",
                                         [str(flipping)]).fetchone()
                text = "".join(t for (t,) in db.execute("select text from chunks where doc_id = ? order by seq",
                                                        [doc_id]))
            mismatched += texts.get(sha) != text
    finally:
        stop.set()
        flipper.join()
    cases.append({"input": "a file rewritten during its ingest (8 ingests)", "ok": runs == 8 and mismatched == 0,
                  "detail": f"{runs} ingests ran, {mismatched} stored one version's hash with another's text"})

    # an EPUB bomb: one huge chapter in a small file. Read, chunked and stored, or cancelled at once
    bomb = make_epub(folder / "bomb.epub", bomb_mb)
    started = time.perf_counter()
    client = subprocess.Popen([sys.executable, "-m", "evsel", "ingest", str(bomb)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        _out, err = client.communicate(timeout=150)
        detail = f"{bomb.stat().st_size / 1e3:.0f} KB file, exit {client.returncode} in " \
                 f"{time.perf_counter() - started:.1f} s"
        ok = client.returncode == 0 or len(err.strip().splitlines()) == 1
    except subprocess.TimeoutExpired:  # too slow here: Ctrl-C, and the daemon must drop it at once
        client.send_signal(signal.SIGINT)
        client.communicate(timeout=30)
        cancelled_at = time.perf_counter()
        while not _queue_idle(env) and time.perf_counter() - cancelled_at < 60:
            time.sleep(0.2)
        stopped_in = time.perf_counter() - cancelled_at
        detail = f"{bomb.stat().st_size / 1e3:.0f} KB file, still running after 150 s: Ctrl-C, job gone in " \
                 f"{stopped_in:.1f} s"
        ok = stopped_in < 5
    cases.append({"input": f"EPUB bomb: one {bomb_mb:g} MB chapter", "ok": ok, "detail": detail})

    # 2 MB of words without punctuation or line breaks: chunks stay within the token budget
    flat = folder / "unpunctuated.txt"
    words = ("keeper light point gull ferry lamp dusk noon harbour tide " * 40).split()
    flat.write_text(" ".join(words[i % len(words)] for i in range(2_000_000 // 6)), encoding="utf-8")
    result = cli(["ingest", str(flat)], env)
    with sqlite3.connect(home / "evsel.db") as db:
        longest = db.execute("select max(c.n_tokens), count(*) from chunks c join documents d on d.id = c.doc_id "
                             "where d.path = ?", [str(flat)]).fetchone()
    cases.append({"input": "2 MB of text without punctuation or line breaks",
                  "ok": result.returncode == 0 and (longest[0] or 0) <= 2 * DEFAULT_CHUNK_TOKENS,
                  "detail": f"exit {result.returncode}, {longest[1]} chunks, longest {longest[0]} tokens"})

    # idle connections past the cap: the extra ones are refused with an error, the daemon stays up
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, connections + 256)), hard))
    held: list[socket.socket] = []
    failed_to_connect = 0
    for _ in range(connections):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(home / "daemon.sock"))
            held.append(sock)
        except OSError:
            failed_to_connect += 1
            sock.close()
    time.sleep(2)
    refused = 0
    for sock in held:
        sock.setblocking(False)
        try:
            data = sock.recv(1 << 16)
            refused += bool(data) and b'"error"' in data
        except BlockingIOError:
            pass
        except OSError:
            refused += 1
    while_held = cli(["daemon", "status", "--json"], env, timeout=60)
    for sock in held:
        sock.close()
    time.sleep(1)
    after = cli(["daemon", "status", "--json"], env, timeout=60)
    cases.append({"input": f"{connections} idle connections",
                  "ok": after.returncode == 0 and (while_held.returncode == 0
                                                   or len(while_held.stderr.strip().splitlines()) == 1),
                  "detail": f"{len(held) - refused} held open, {refused} refused with an error, "
                            f"{failed_to_connect} not accepted; status while held: exit {while_held.returncode}"
                            f"{' (' + while_held.stderr.strip()[:120] + ')' if while_held.returncode else ''}; "
                            f"after: exit {after.returncode}"})
    return cases


def disk_full(tmp: Path, env: dict) -> dict:
    """A store on a 2 MB tmpfs: an ingest that does not fit fails with one line, and what was
    stored before stays. Skipped (and says why) where mounting is not allowed."""
    mount = tmp / "full"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if made.returncode != 0:
        return {"input": "disk full (2 MB tmpfs)", "skipped": (made.stderr.strip() or "mount failed")[:200]}
    try:
        from evsel.paths import sample_story_path

        home = mount / "home"
        # the model's files stay off the small disk: it is the store that fills it
        local = {**env, "EVSEL_HOME": str(home), "EVSEL_NO_DAEMON": "1",
                 "EVSEL_MODEL_CACHE": env.get("EVSEL_MODEL_CACHE") or str(tmp / "models")}
        first = cli(["ingest", str(sample_story_path())], local)
        big = tmp / "too-big.md"
        big.write_text(sample_story_path().read_text(encoding="utf-8") * 20, encoding="utf-8")
        full = cli(["ingest", str(big)], local)
        # progress lines come every 5 s of a slow ingest: the error is what must be one line
        lines = [line for line in full.stderr.strip().splitlines() if not line.startswith("evsel: progress:")]
        docs = documents(home)
        check = integrity(home)
        lost = int(first.returncode == 0 and len(docs) < 1) + sum(d[2] != d[3] for d in docs)
        return {"input": "disk full (2 MB tmpfs)", "rows_lost": lost,
                "ok": first.returncode == 0 and full.returncode != 0 and len(lines) == 1 and check == "ok",
                "detail": f"first ingest exit {first.returncode}; the one that does not fit: exit {full.returncode}, "
                          f"{len(lines)} line(s) ({(lines or [''])[-1][:120]}); integrity_check {check}, "
                          f"{len(docs)} document(s) kept"}
    finally:
        unmount(mount)


# the surfaces built after the store: trained parts, eval and train inputs, the corpus -----------------

# runs CLI commands in one process (the model loads once), each with its own variables; prints one
# JSON list of {"code", "err"}
IN_ONE_PROCESS = """
import contextlib, io, json, os, sys
from evsel.cli import main
results = []
for case in json.load(open(sys.argv[1])):
    saved = {k: os.environ.get(k) for k in case["env"]}
    os.environ.update(case["env"])
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(case["argv"])
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    results.append({"code": code, "err": err.getvalue()})
print(json.dumps(results))
"""


def one_line_cases(tmp: Path, env: dict, cases: list[dict]) -> list[dict]:
    """Each case ({"input", "argv", "env", "names"}) run by the CLI in one process: ok when it exits
    1 with one error line naming `names` and nothing "unexpected"."""
    spec = tmp / f"cases-{len(list(tmp.glob('cases-*')))}.json"
    spec.write_text(json.dumps([{"argv": c["argv"], "env": c.get("env", {})} for c in cases]))
    ran = subprocess.run([sys.executable, "-c", IN_ONE_PROCESS, str(spec)], capture_output=True, text=True, env=env,
                         timeout=1800)
    results = json.loads(ran.stdout.strip().splitlines()[-1]) if ran.returncode == 0 else \
        [{"code": None, "err": ran.stderr[-300:]}] * len(cases)
    out = []
    for case, result in zip(cases, results):
        lines = [line for line in result["err"].splitlines() if line.startswith("evsel: error:")]
        ok = (result["code"] == 1 and len(lines) == 1 and "unexpected" not in result["err"]
              and all(name in lines[0] for name in case["names"]))
        out.append({"input": case["input"], "ok": ok, "unexpected": "unexpected" in result["err"],
                    "detail": f"exit {result['code']}, {len(lines)} line(s): {(lines or [''])[0][14:200]}"})
    return out


def _damage_tensors(path: Path, how: str) -> None:
    import random
    import struct

    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "random bytes":
        path.write_bytes(random.Random(0).randbytes(len(data)))
    elif how == "0 bytes":
        path.write_bytes(b"")
    else:  # a header whose tensors end past the file
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + n])
        for info in header.values():
            if isinstance(info, dict) and "data_offsets" in info:
                info["data_offsets"][1] += 1 << 20
        text = json.dumps(header).encode()
        path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + n:])


def _damage_json(path: Path, how: str) -> None:
    if how == "malformed":
        path.write_text(path.read_text()[:30])
    elif how == "a list":
        path.write_text("[1, 2]\n")
    elif how == "0 bytes":
        path.write_text("")
    else:  # every field of the object a number
        path.write_text(json.dumps({k: 5 for k in json.loads(path.read_text())}))


def trained_part_faults(tmp: Path, env: dict) -> list[dict]:
    """Damaged copies of the shipped UNREAL adapter, BlockSearch router and hybrid weights, each
    named by its setting to `evsel ask`: one line naming the file, never "unexpected"."""
    from evsel.models.shared.trained_files import SHIPPED
    from evsel.paths import sample_story_path

    shipped = next(SHIPPED.iterdir())  # the bundled backbone's folder
    parts = {"unreal": ("EVSEL_UNREAL_ADAPTER", "unreal", ["adapter.safetensors", "config.json"]),
             "blocksearch-router": ("EVSEL_BLOCKSEARCH_ROUTER", "blocksearch:router",
                                    ["adapter.safetensors", "adapter.json"]),
             "hybrid": ("EVSEL_HYBRID_WEIGHTS", "hybrid", ["hybrid.json"])}
    home = tmp / "parts-home"
    local = {**env, "EVSEL_HOME": str(home), "EVSEL_NO_DAEMON": "1"}
    cli(["ingest", str(sample_story_path())], local).check_returncode()
    cases = []
    for part, (setting, select, files) in parts.items():
        for name in files:
            kinds = ["truncated", "random bytes", "0 bytes", "lying header"] if name.endswith(".safetensors") \
                else ["malformed", "a list", "0 bytes", "wrong types"]
            for how in kinds:
                folder = tmp / "parts" / f"{part}-{name}-{how.replace(' ', '-')}"
                shutil.copytree(shipped / part, folder)
                (_damage_tensors if name.endswith(".safetensors") else _damage_json)(folder / name, how)
                cases.append({"input": f"{part}/{name}: {how}", "names": [str(folder / name)],
                              "argv": ["ask", "Who killed Ambrose Tenterden?", "--select", select, "--evidence-only"],
                              "env": {setting: str(folder)}})
    return one_line_cases(tmp, local, cases)


def eval_input_faults(tmp: Path, env: dict) -> list[dict]:
    """`evsel eval` on malformed JSONL lines, a file that is not UTF-8, a missing file and a --plot
    into a missing folder: one line naming the file (and line)."""
    folder = tmp / "eval"
    folder.mkdir()
    (folder / "doc.txt").write_text("The keeper of Gull Point lit the lamp at dusk.\n")
    good = {"question": "Who lit the lamp?", "document": "doc.txt"}
    lines = {"documents is a number": {"documents": 5}, "documents lists a number": {"documents": [5]},
             "a document that is an object": {"document": {"path": "doc.txt"}}, "a document named by a number":
             {"document": 7}, "evidence is a number": {"evidence": 5}, "an evidence span that is a string":
             {"evidence_spans": ["0-10"]}, "an evidence span without start": {"evidence_spans": [{"end": 9}]},
             "an evidence span with a text start": {"evidence_spans": [{"start": "zero", "end": 9}]},
             "an evidence span past the document's end": {"evidence_spans": [{"start": 5, "end": 10 ** 6}]},
             "an answer that is an object": {"answer": {"text": "the keeper"}},
             "a question with a lone surrogate": {"question": "who \ud800 lit it?"}}
    cases = []
    for i, (what, change) in enumerate(lines.items()):
        path = folder / f"bad{i}.jsonl"
        path.write_text(json.dumps(good) + "\n" + json.dumps({**good, **change}) + "\n")
        cases.append({"input": f"eval: {what}", "names": [f"{path}: line 2"], "argv": ["eval", str(path)]})
    latin = folder / "latin1.jsonl"
    latin.write_bytes(json.dumps(good).encode() + b"\n" + '{"question": "caf\u00e9?"}\n'.encode("latin-1"))
    cases.append({"input": "eval: a file that is not UTF-8", "names": [f"{latin}: line 2"], "argv": ["eval", str(latin)]})
    cases.append({"input": "eval: a .jsonl that is not there", "names": [str(folder / "none.jsonl")],
                  "argv": ["eval", str(folder / "none.jsonl")]})
    plot = folder / "no" / "such" / "x.png"
    cases.append({"input": "eval --plot into a missing folder", "names": [str(plot.parent)],
                  "argv": ["eval", str(folder / "bad0.jsonl"), "--plot", str(plot)]})
    results = one_line_cases(tmp, {**env, "EVSEL_HOME": str(tmp / "eval-home"), "EVSEL_NO_DAEMON": "1"}, cases)
    results[-1]["ok"] = results[-1]["ok"] and not (folder / "no").exists()
    return results


def train_input_faults(tmp: Path, env: dict) -> list[dict]:
    """`evsel train ... --out` under a file, and on a read-only tmpfs (where mounting is allowed)."""
    (tmp / "a-file").write_text("not a folder\n")
    cases = [{"input": f"train {t} --out under a file", "names": [str(tmp / "a-file" / "run")],
              "argv": ["train", t, "--out", str(tmp / "a-file" / "run")]} for t in ("unreal", "hybrid", "reader")]
    read_only = tmp / "read-only"
    read_only.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(read_only)], capture_output=True,
                          text=True)
    try:
        if made.returncode == 0:
            cases += [{"input": f"train {t} --out on a read-only disk", "names": [str(read_only / "run")],
                       "argv": ["train", t, "--out", str(read_only / "run")]} for t in ("unreal", "blocksearch")]
        results = one_line_cases(tmp, {**env, "EVSEL_HOME": str(tmp / "train-home"), "EVSEL_NO_DAEMON": "1"}, cases)
    finally:
        if made.returncode == 0:
            unmount(read_only)
    if made.returncode != 0:
        results.append({"input": "train --out on a read-only disk",
                        "skipped": (made.stderr.strip() or "mount failed")[:200]})
    return results


CORPUS_DAMAGE = """
import json, sys
from pathlib import Path
import lance
from evsel.corpus import rows, schema
from evsel.corpus.build import drop_lost_fragments
from evsel.models.runtime.backbone import Backbone
source, out = Path(sys.argv[1]), Path(sys.argv[2])
backbone = Backbone()
manifest = schema.new_manifest(backbone=backbone.fingerprint, chunk_tokens=140, source=str(source), methods=["bm25"],
                               dims={}, configs={})
written = {path.name: rows.rows_of_file(path, source, backbone) for path in sorted(source.iterdir())}
if sys.argv[3] != "repair":  # one fragment a document
    for name in written:
        rows.write_local(written[name], out, manifest, index=True)
if sys.argv[3] == "damage":
    uri = out / schema.CHUNKS
    lost = next(f for f in lance.dataset(str(uri)).get_fragments()
                if "second" in f.to_table(columns=["doc_path"]).column(0)[0].as_py())
    (uri / "data" / lost.metadata.files[0].path).unlink()
else:  # what a resumed build does: drop the lost fragment, write its documents again
    dropped = drop_lost_fragments(str(out / schema.CHUNKS))
    rows.write_local(written["second.txt"], out, index=True)
    print(json.dumps({"dropped": dropped}))
"""


def corpus_faults(tmp: Path, env: dict) -> list[dict]:
    """A corpus (Ray-free writer) with one Lance data file removed: `ask --corpus` says it is damaged
    and how to repair it; after the repair a resumed build does, the same question finds the same
    evidence as before the damage."""
    source, out = tmp / "corpus-docs", tmp / "corpus"
    source.mkdir()
    for name, text in (("first", "The keeper of Gull Point lit the lamp at dusk."),
                       ("second", "Mabel Frost wrote the letter that named the killer."),
                       ("third", "The ferry left the harbour at noon with the mail.")):
        (source / f"{name}.txt").write_text(text + "\n")
    local = {**env, "EVSEL_HOME": str(tmp / "corpus-home"), "EVSEL_NO_DAEMON": "1"}
    ask = ["ask", "Who wrote the letter?", "--corpus", str(out), "--evidence-only", "--json"]
    subprocess.run([sys.executable, "-c", CORPUS_DAMAGE, str(source), str(out), "write"], env=local, check=True,
                   capture_output=True, timeout=600)
    before = cli(ask, local)
    shutil.rmtree(out)
    subprocess.run([sys.executable, "-c", CORPUS_DAMAGE, str(source), str(out), "damage"], env=local, check=True,
                   capture_output=True, timeout=600)
    damaged = cli(ask, local)
    lines = damaged.stderr.strip().splitlines()
    repaired = subprocess.run([sys.executable, "-c", CORPUS_DAMAGE, str(source), str(out), "repair"], env=local,
                              capture_output=True, text=True, timeout=600)
    after = cli(ask, local)

    def evidence(result):
        return [(e["path"], e["seq"]) for e in json.loads(result.stdout)["evidence"]] if result.returncode == 0 else None

    return [{"input": "ask --corpus with a Lance data file removed",
             "ok": damaged.returncode == 1 and len(lines) == 1 and "is damaged" in lines[0]
             and f"corpus build {source} --out {out}" in lines[0] and "unexpected" not in damaged.stderr,
             "unexpected": "unexpected" in damaged.stderr,
             "detail": f"exit {damaged.returncode}, {len(lines)} line(s): {(lines or [''])[-1][14:200]}"},
            {"input": "the same corpus after a resumed build's repair",
             "ok": repaired.returncode == 0 and evidence(before) is not None and evidence(after) == evidence(before),
             "unexpected": False,
             "detail": f"repair exit {repaired.returncode}; the same evidence as before the damage: "
                       f"{evidence(after) == evidence(before)}"}]


def new_surfaces(tmp: Path, env: dict) -> dict:
    """The four groups of cases above, each a list of cases."""
    return {"trained parts": trained_part_faults(tmp, env), "eval inputs": eval_input_faults(tmp, env),
            "train inputs": train_input_faults(tmp, env), "corpus": corpus_faults(tmp, env),
            "round four (weights, names, stdout, thread records)": round_four_faults(tmp, env)}


def unmount(folder: Path) -> None:
    """Unmount, lazily when a process still holds a file there, so no mount outlives the run."""
    if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def print_surfaces(surfaces: dict) -> None:
    for group, cases in surfaces.items():
        tried = [c for c in cases if "skipped" not in c]
        print(f"{group}: {sum(c['ok'] for c in tried)} of {len(tried)} one clear line, "
              f"{sum(c['unexpected'] for c in tried)} unexpected")
        for case in cases:
            if "skipped" in case or not case["ok"]:
                print(f"  - {case['input']}: {'skipped: ' + case['skipped'] if 'skipped' in case else 'NOT OK; '}"
                      f"{case.get('detail', '')}")


def stored_kv_faults(tmp: Path, env: dict) -> list[dict]:
    """QRRanker's stored block KV (EVSEL_QRRANKER_KV, on by default), damaged on disk: a file whose
    data is zeroed with its size kept, one of random bytes, a symlink to a file outside the store
    and a FIFO in a file's place. Each next `--rerank qrranker` ask must succeed with one warning
    line and leave the file written again whole (the link's target untouched), and the ask after it
    give the evidence from before the damage; never "unexpected". Its own home, without the daemon."""
    import random

    from evsel.paths import sample_story_path

    home = tmp / "kv-home"
    local = {**env, "EVSEL_HOME": str(home), "EVSEL_NO_DAEMON": "1", "EVSEL_ENCODE": "1", "EVSEL_QRRANKER_KV": "1"}
    ingest = cli(["ingest", str(sample_story_path())], local)
    if ingest.returncode != 0:
        return [{"input": "stored KV: ingest", "ok": False, "detail": ingest.stderr.strip()[-200:]}]
    ask = ["ask", QUESTIONS[0], "--rerank", "qrranker", "--evidence-only", "--json"]

    def evidence(result: subprocess.CompletedProcess) -> list:
        return [e["chunk_id"] for e in json.loads(result.stdout)["evidence"]] if result.returncode == 0 else []

    asked_at = time.time()
    before = cli(ask, local)
    want = evidence(before)
    # the files this ask read (a read touches its file): only those are read again by the next one
    files = sorted(p for p in (home / "qrranker").rglob("*.npy") if p.stat().st_mtime >= asked_at - 1)
    cases = []
    rng = random.Random(0)
    planted = tmp / "kv-planted.npy"  # a file outside the store (another user's): never read through a link
    for how in ("zeroed data, size kept", "random bytes", "a symlink to a file outside", "a FIFO"):
        path = rng.choice(files)
        whole = path.read_bytes()
        damaged = whole[:128] + bytes(len(whole) - 128) if how.startswith("zeroed") else rng.randbytes(len(whole))
        path.unlink()
        if how.startswith("a symlink"):
            planted.write_bytes(whole)
            path.symlink_to(planted)
        elif how == "a FIFO":  # a reader that opened it blocking would hang every rerank
            os.mkfifo(path)
        else:
            path.write_bytes(damaged)
        try:
            result = cli(ask, local, timeout=300)
        except subprocess.TimeoutExpired:
            cases.append({"input": f"stored KV: {how}", "ok": False, "detail": "the ask hung (300 s)"})
            continue
        # progress rows (work over 5 s on a pipe) aside
        lines = [line for line in result.stderr.strip().splitlines() if line and not line.startswith("evsel: progress:")]
        rewritten = not path.is_symlink() and path.is_file() and path.stat().st_size == len(whole) \
            and path.read_bytes() != damaged
        if how.startswith("a symlink"):  # the link's target is left as it was
            rewritten = rewritten and planted.read_bytes() == whole
        # the ask that met the damage scores that block fresh (a near tie can swap); the next one
        # reads every block from its file again: the evidence from before the damage
        again = evidence(cli(ask, local)) == want
        ok = (result.returncode == 0 and again and len(lines) == 1 and "damaged" in lines[0]
              and "unexpected" not in result.stderr and rewritten)
        cases.append({"input": f"stored KV: {how}", "ok": ok,
                      "detail": f"exit {result.returncode}, {len(lines)} line(s) ({(lines or [''])[-1][:100]}), "
                                f"written again whole {rewritten}, the next ask's evidence as before {again}"})
    return cases


def _value_rows_pdf(path: Path, pages: int, rows: int) -> None:
    """Pages of rows that hold only values: the table reader once grew every such row again for
    each later one (quadratic: one page of 8,000 rows took over 400 s)."""
    import pymupdf

    doc = pymupdf.open()
    font = pymupdf.Font("helv")
    for p in range(pages):
        page = doc.new_page(width=612, height=max(792, 40 + rows * 6))
        writer = pymupdf.TextWriter(page.rect)
        for r in range(rows):
            for c in range(4):
                writer.append((72 + c * 100, 20 + r * 6), f"{(r * 7 + c * 13 + p) % 9973}", font=font, fontsize=5)
        writer.write_text(page)
    doc.save(path)


def _one_line_pages_pdf(path: Path, pages: int) -> None:
    """A header, one line of prose and a page number a page (once refused as "looks scanned")."""
    import pymupdf

    doc = pymupdf.open()
    for n in range(1, pages + 1):
        page = doc.new_page(width=612, height=792)
        page.insert_text((72, 40), "The Long Story", fontsize=9)
        page.insert_text((72, 300), f"This is line {n} of the story.", fontsize=10)
        page.insert_text((300, 760), str(n), fontsize=9)
    doc.save(path)


def _statement_pdf(path: Path) -> list[str]:
    import pymupdf

    doc = pymupdf.open()
    totals = [f"Total due for month {n}: ${(n * 7919) % 5000 + 100:,}.{n * 3 % 100:02d}" for n in range(1, 13)]
    for n in range(1, 13):
        page = doc.new_page(width=612, height=792)
        page.insert_text((72, 40), "First Harbour Bank - Account statement 2024", fontsize=9)
        page.insert_textbox(pymupdf.Rect(72, 80, 540, 300), f"Purchases and payments of month {n}. " * 5, fontsize=10)
        page.insert_text((72, 700), totals[n - 1], fontsize=10)
        page.insert_text((300, 760), f"Page {n} of 12", fontsize=9)
    doc.save(path)
    return totals


def hostile_pdfs(tmp: Path, env: dict, value_pages: int = 10, value_rows: int = 800,
                 text_pages: int = 300) -> list[dict]:
    """PDFs that held the queue or lost text: value-only rows (the table reader within 5x the plain
    reader's ingest), a 300-page PDF of one-line pages (stored), a statement's totals (kept)."""
    folder = tmp / "pdfs"
    folder.mkdir(exist_ok=True)
    values, pages, statement = folder / "values.pdf", folder / "one-line-pages.pdf", folder / "statement.pdf"
    _value_rows_pdf(values, value_pages, value_rows)
    _one_line_pages_pdf(pages, text_pages)
    totals = _statement_pdf(statement)
    cases = []
    seconds = {}
    for reader in ("plain", "tables"):
        home = tmp / f"pdf-home-{reader}"
        local = {**env, "EVSEL_HOME": str(home), "EVSEL_NO_DAEMON": "1", "EVSEL_PDF_READER": reader,
                 "EVSEL_THREADS": "1"}
        started = time.perf_counter()
        done = cli(["ingest", "--no-encode", str(values)], local)
        seconds[reader] = time.perf_counter() - started
        if done.returncode != 0:
            cases.append({"input": f"value rows ({reader} reader)", "ok": False, "detail": done.stderr.strip()[-200:]})
    if len(seconds) == 2 and not cases:
        ratio = seconds["tables"] / seconds["plain"]
        cases.append({"input": f"{value_pages} pages x {value_rows} value-only rows: ingest within 5x the plain reader's",
                      "ok": ratio <= 5.0, "detail": f"tables {seconds['tables']:.1f} s, plain {seconds['plain']:.1f} s, "
                                                     f"{ratio:.2f}x"})
    local = {**env, "EVSEL_HOME": str(tmp / "pdf-home-text"), "EVSEL_NO_DAEMON": "1", "EVSEL_THREADS": "1"}
    started = time.perf_counter()
    done = cli(["ingest", "--no-encode", "--json", str(pages)], local)
    took = time.perf_counter() - started
    stored = json.loads(done.stdout)["files"][0] if done.returncode == 0 else {}
    cases.append({"input": f"a {text_pages}-page PDF of one-line pages: stored", "ok": stored.get("status") == "ingested",
                  "detail": f"exit {done.returncode}, {stored.get('chunks')} chunks in {took:.1f} s"
                            f"{'' if done.returncode == 0 else '; ' + done.stderr.strip()[-150:]}"})
    done = cli(["ingest", "--no-encode", str(statement)], local)
    doc = json.loads(cli(["docs", "show", str(max(d["id"] for d in json.loads(cli(["docs", "list", "--json"],
                                                                                    local).stdout))),
                          "--chunks", "--json"], local).stdout) if done.returncode == 0 else {"chunks": []}
    text = " ".join(c["text"] for c in doc["chunks"])
    kept = sum(t in text for t in totals)
    cases.append({"input": "a statement's totals (lines differing in their figures): kept", "ok": kept == len(totals),
                  "detail": f"{kept} of {len(totals)} kept, header dropped {'First Harbour' not in text}"})
    return cases


def round_four_faults(tmp: Path, env: dict) -> list[dict]:
    """Issue 48's surfaces: fusion weights that are not finite, damaged thread records, a
    collection name that is not UTF-8, and stdout faults (closed pipe, full, ASCII-only) through
    the daemon's fast path and the Typer app alike. Its own home and daemon."""
    from evsel.models.shared.trained_files import SHIPPED
    from evsel.paths import sample_story_path

    home = tmp / "r4-home"
    local = {**env, "EVSEL_HOME": str(home), "EVSEL_ENCODE": "0"}
    local.pop("EVSEL_NO_DAEMON", None)
    cli(["ingest", str(sample_story_path())], local).check_returncode()
    cases = []
    ask = ["ask", QUESTIONS[1], "--select", "bm25", "--evidence-only"]
    paths = {"fast path": [], "Typer": ["--no-daemon"]}

    # fusion weights that are not finite
    shipped = next(SHIPPED.iterdir()) / "hybrid"
    weights = []
    for bad in ("NaN", "Infinity"):
        folder = tmp / "r4-weights" / bad
        shutil.copytree(shipped, folder)
        data = (folder / "hybrid.json").read_text()
        at = data.index('"weights"')
        first = data.index("[", at) + 1
        end = min(data.index(",", first), data.index("]", first))
        (folder / "hybrid.json").write_text(data[:first] + bad + data[end:])
        weights.append({"input": f"fusion weights: {bad}", "names": [str(folder / "hybrid.json"), "not a finite number"],
                        "argv": ["ask", QUESTIONS[1], "--select", "hybrid", "--evidence-only"],
                        "env": {"EVSEL_HYBRID_WEIGHTS": str(folder)}})
    # a collection name that is not UTF-8 (a byte 0xff on the command line)
    bad_name = os.fsdecode(b"r\xffx")
    names = []
    for first in paths.values():
        for args in (["docs", "list"], ["ingest", str(sample_story_path())], ask):
            names.append({"input": f"--collection not UTF-8: {' '.join(first + args[:2])[:40]}",
                          "names": ["is not UTF-8 text"], "argv": [*first, *args, "--collection", bad_name]})
    for case, result in zip(weights, one_line_cases(tmp, {**local, "EVSEL_NO_DAEMON": "1"}, weights)):
        cases.append(result)
    for case in names:  # through the daemon too: a process each
        done = cli(case["argv"], local)
        lines = [line for line in done.stderr.splitlines() if line.startswith("evsel: error:")]
        cases.append({"input": case["input"], "unexpected": "unexpected" in done.stderr,
                      "ok": done.returncode == 1 and len(lines) == 1 and case["names"][0] in lines[0],
                      "detail": f"exit {done.returncode}: {(lines or [''])[0][14:160]}"})

    # stdout faults, the same through both paths
    def run_to(args: list[str], stdout, extra: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "evsel", *args], stdout=stdout, stderr=subprocess.PIPE,
                              text=True, env={**local, **(extra or {})}, timeout=600)

    closed = {}
    for name, first in paths.items():
        read, write = os.pipe()
        os.close(read)
        with os.fdopen(write, "w") as pipe:
            done = run_to([*first, *ask], pipe)
        closed[name] = (done.returncode, done.stderr.strip()[-100:])
    cases.append({"input": "a closed pipe: the fast path and Typer alike", "unexpected": False,
                  "ok": closed["fast path"] == closed["Typer"] == (0, ""), "detail": str(closed)})
    if Path("/dev/full").exists():
        for name, first in paths.items():
            with open("/dev/full", "w") as full:
                done = run_to([*first, *ask], full)
            lines = done.stderr.strip().splitlines()
            cases.append({"input": f"stdout full (/dev/full), {name}", "unexpected": "unexpected" in done.stderr,
                          "ok": done.returncode == 1 and len(lines) == 1
                          and "standard output is full" in lines[0] and "EVSEL_HOME" not in lines[0],
                          "detail": f"exit {done.returncode}: {(lines or [''])[0][:120]}"})
    for name, first in paths.items():
        done = run_to([*first, *ask, "--json"], subprocess.PIPE, {"PYTHONIOENCODING": "ascii"})
        try:
            parsed = json.loads(done.stdout)["question"] == QUESTIONS[1]
        except ValueError:
            parsed = False
        cases.append({"input": f"--json on an ASCII stdout, {name}", "unexpected": "unexpected" in done.stderr,
                      "ok": done.returncode == 0 and done.stdout.isascii() and parsed,
                      "detail": f"exit {done.returncode}, ASCII {done.stdout.isascii()}, JSON {parsed}"})

    # a damaged thread record: measured again, never "unexpected" (the model's own cache, put back after)
    from evsel.models.runtime import cpu_threads
    from evsel.models.runtime.backbone import Backbone

    record = Backbone(None, "cpu").cache_dir / cpu_threads.RECORD
    saved = record.read_bytes() if record.exists() else None
    try:
        for how, value in (("tokens_per_s a list", [1, 2]), ("tokens_per_s null", None),
                           ("tokens_per_s strings", {"1": "fast"})):
            data = json.loads(saved) if saved else {"threads": 1, "machine": "", "measured_at": "", "load_1m": None}
            record.parent.mkdir(parents=True, exist_ok=True)
            record.write_text(json.dumps({**data, "tokens_per_s": value}))
            # the record is read only with no count set: neither EVSEL_THREADS nor OMP_NUM_THREADS
            extra = {k: v for k, v in local.items() if k not in ("EVSEL_THREADS", "OMP_NUM_THREADS")}
            done = subprocess.run([sys.executable, "-m", "evsel", "--no-daemon", "ask", QUESTIONS[1],
                                   "--rerank", "qrranker", "--evidence-only"], capture_output=True, text=True,
                                  env=extra, timeout=900)
            cases.append({"input": f"thread record damaged: {how}", "unexpected": "unexpected" in done.stderr,
                          "ok": done.returncode == 0 and "unexpected" not in done.stderr,
                          "detail": f"exit {done.returncode}{'; ' + done.stderr.strip()[-120:] if done.returncode else ''}"})
    finally:
        if saved is None:
            record.unlink(missing_ok=True)
        else:
            record.write_bytes(saved)
    cli(["daemon", "stop"], local, timeout=120)
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--kills", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0, help="load phase length after the last kill")
    parser.add_argument("--copies", type=int, default=30, help="copies of the sample story in the big ingest")
    parser.add_argument("--bomb-mb", type=float, default=20.0, help="the EPUB bomb's one chapter, in MB")
    parser.add_argument("--connections", type=int, default=1100, help="idle connections opened at once")
    parser.add_argument("--surfaces-only", action="store_true",
                        help="only trained parts, eval and train inputs and the corpus; writes no result file")
    parser.add_argument("--round-four", action="store_true",
                        help="only issue 48's surfaces: stored-KV entries, hostile PDFs, fusion weights, thread "
                             "records, collection names, stdout faults; writes no result file")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="evsel-faults-"))
    env = {**os.environ, "EVSEL_HOME": str(tmp / "home"), "EVSEL_ENCODE": "0", "OMP_NUM_THREADS": "1",
           "EVSEL_DAEMON_BUILD": "faults"}
    env.pop("EVSEL_NO_DAEMON", None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still runs the cleanup below
    try:
        if args.round_four:
            hostile = stored_kv_faults(tmp, env) + hostile_pdfs(tmp, env)
            for case in hostile:
                print(f"  - {case['input']}: {'ok' if case['ok'] else 'NOT OK'}; {case.get('detail', '')}")
            surfaces = {"round four": round_four_faults(tmp, env)}
            print_surfaces(surfaces)
            for case in surfaces["round four"]:
                print(f"  - {case['input']}: {'ok' if case['ok'] else 'NOT OK'}; {case.get('detail', '')}")
            return 0 if all(c["ok"] for c in hostile + surfaces["round four"]) else 1
        if args.surfaces_only:
            surfaces = new_surfaces(tmp, env)
            print_surfaces(surfaces)
            return 0 if all(c.get("ok", True) for cases in surfaces.values() for c in cases) else 1
        return run(args, tmp, env)
    finally:
        if (tmp / "home" / "daemon.sock").exists():
            cli(["daemon", "stop"], env, timeout=120)
        for mount in (tmp / "full", tmp / "read-only"):
            if os.path.ismount(mount):
                unmount(mount)
        shutil.rmtree(tmp, ignore_errors=True)


def run(args, tmp: Path, env: dict) -> int:
    from evsel.evaluation.report import run_info
    from evsel.paths import sample_story_path

    home = tmp / "home"
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
    hostile = hostile_inputs(tmp, home, env, args.bomb_mb, args.connections)
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
    full = disk_full(tmp, env)
    hostile.append(full)
    hostile += stored_kv_faults(tmp, env)
    hostile += hostile_pdfs(tmp, env)
    rows_lost += full.get("rows_lost", 0)
    surfaces = new_surfaces(tmp, env)

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
        "hostile": hostile, "hostile_ok": sum(bool(c.get("ok")) for c in hostile),
        "hostile_tried": sum("skipped" not in c for c in hostile),
        "integrity": integrity(home), "documents": len(final), "rows_lost": rows_lost, "surfaces": surfaces,
    })
    write_result(ROOT / "bench" / "results" / "faults.json", record)
    load = record["load"]
    print(f"load held: {load['requests']} requests from {args.clients} clients, p50 {load['p50_s']} s, "
          f"p95 {load['p95_s']} s, {load['errors']} unexpected errors")
    print(f"faults survived: {record['faults_survived']} of {len(faults)} kill -9 mid-ingest")
    more = [c for cases in surfaces.values() for c in cases if "skipped" not in c]
    print(f"bad inputs tried: {len(corpus) + len(more)}: {len(corpus)} files ({len(failed)} failed alone, "
          f"{len(good)} good file ingested, {len(unexpected_bad)} unexpected), {len(more)} damaged trained parts, "
          f"eval and train inputs and corpus files ({sum(c['ok'] for c in more)} one clear line, "
          f"{sum(c['unexpected'] for c in more)} unexpected); malformed messages: {protocol_ok} of {len(MALFORMED)} refused, "
          f"daemon up after: {record['protocol']['daemon_up_after']}")
    print(f"hostile inputs and loads: {record['hostile_ok']} of {record['hostile_tried']} handled")
    for case in hostile:
        verdict = "skipped: " + case["skipped"] if "skipped" in case else ("ok" if case["ok"] else "NOT OK")
        print(f"  - {case['input']}: {verdict}{'; ' + case['detail'] if 'detail' in case else ''}")
    print_surfaces(surfaces)
    print(f"rows lost: {rows_lost} (integrity_check: {record['integrity']}, {len(final)} documents)")
    hostile_failed = record["hostile_tried"] - record["hostile_ok"]
    surfaces_failed = sum(not c.get("ok", True) for cases in surfaces.values() for c in cases)
    return 0 if rows_lost == 0 and not errors and not unexpected_bad and not hostile_failed and not surfaces_failed \
        else 1


if __name__ == "__main__":
    sys.exit(main())
