"""`evsel corpus build` on a 2-node Ray cluster on loopback (the `scale` extra).

One cluster for the module, started and stopped by PID: a head on 127.0.0.2 and a worker node on
127.0.0.3, 4 CPUs each (fewer deadlocks Ray Data's actor pool on loopback), free ports, a temp dir.
50 FairytaleQA stories (the smallest, written as .txt files) are built twice over: a first build
is interrupted with SIGINT after its first commit, the rerun resumes it while one of its worker
processes is killed (SIGKILL) mid-build. The result must hold every chunk once, with the content
hashes of a local `evsel ingest` of the same files and dense states within tolerance of the local
ones. UNREAL's states are compared on a few documents with the real backbone, without Ray.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

from helpers import DATA

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("ray", "lance", "lance_ray", "pyarrow")),
    reason="the scale extra is not installed (pip install '.[scale]')")

N_DOCS = 50
# dense: MiniLM in another process and batch than the local one; both store float16. Measured on
# 44 chunks: max |diff| 9.5e-7 (one float16 step of a small component: batching moves float32
# sums in the last bits). The bound allows one float16 step of any component (<= 2.4e-4 below 0.5)
DENSE_ATOL = 5e-4
# UNREAL: the same ChunkEncoder on the same texts. Measured, a local-Ray build of 3 stories (20
# chunks) against a local ingest's cached states: max |diff| 3.8e-6, states up to ~240 in size
UNREAL_RTOL, UNREAL_ATOL = 1e-3, 1e-3
# bf16 compute (a CPU with AMX, or CUDA): batches of other shapes round differently; measured
# 0.006 relative error per pooled state, so a row may be off by 2% of its norm
UNREAL_BF16_RELATIVE = 0.02
BIN = Path(sys.executable).parent


def _stories() -> Path:
    folder = DATA / "fairytaleqa" / "section-stories"
    if not folder.is_dir():
        pytest.skip(f"{folder} is absent: the shared benchmark data is not checked out beside the project")
    return folder


def write_stories(target: Path, n: int = N_DOCS) -> list[Path]:
    """The n smallest FairytaleQA stories as .txt files: a title line, then the sections."""
    files = sorted(_stories().glob("*/*.csv"), key=lambda p: (p.stat().st_size, p.name))[:n]
    target.mkdir(parents=True, exist_ok=True)
    out = []
    for f in files:
        with open(f, newline="", encoding="utf-8") as handle:
            sections = [row["text"] for row in csv.DictReader(handle)]
        name = f.stem
        path = target / f"{name}.txt"
        path.write_text(name.replace("-", " ").title() + "\n\n" + "\n\n".join(sections) + "\n", encoding="utf-8")
        out.append(path)
    return out


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _node_args(ports: list[int]) -> list[str]:
    """Every port a node listens on, chosen free (other Ray instances may run on this machine)."""
    names = ("--node-manager-port", "--object-manager-port", "--min-worker-port", "--max-worker-port",
             "--dashboard-agent-listen-port", "--dashboard-agent-grpc-port", "--runtime-env-agent-port",
             "--metrics-export-port")
    base = ports[2]
    values = [ports[0], ports[1], base, base + 40, ports[3], ports[4], ports[5], ports[6]]
    return [f"{k}={v}" for k, v in zip(names, values)]


def _worker_range_free(start: int, count: int = 41) -> bool:
    for port in range(start, start + count):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def _ports() -> list[int]:
    while True:
        ports = _free_ports(7)
        if ports[2] + 41 < 65535 and _worker_range_free(ports[2]):
            return ports


def ray_env() -> dict:
    """This process' environment for Ray processes of the test cluster: no inherited RAY_*
    settings, no usage stats, and no token authentication (its token file is per user, shared
    by every Ray instance of that user on this machine; the cluster listens on loopback only)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    return env


class Cluster:
    def __init__(self, root: Path):
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.address = ""

    def _start(self, args: list[str], log: str) -> subprocess.Popen:
        env = ray_env()
        handle = open(self.root / log, "w")
        proc = subprocess.Popen([str(BIN / "ray"), "start", "--block", "--disable-usage-stats",
                                 "--object-store-memory=200000000", *args],
                                stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(proc)
        return proc

    def start(self) -> None:
        gcs, dashboard = _free_ports(2)
        self.address = f"127.0.0.2:{gcs}"
        self._start(["--head", "--include-dashboard=false", "--node-ip-address=127.0.0.2", f"--port={gcs}",
                     "--num-cpus=4",
                     f"--dashboard-port={dashboard}",
                     f"--temp-dir={self.root / 'r'}", *_node_args(_ports())], "head.log")
        self._wait_started("head.log")
        self._start([f"--address={self.address}", "--node-ip-address=127.0.0.3", "--num-cpus=4",
                     *_node_args(_ports())], "worker.log")
        self._wait_started("worker.log")
        code = ("import ray,sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
                "print(sum(n['Alive'] for n in ray.nodes()))")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # the worker node registers with the head
            got = subprocess.run([sys.executable, "-c", code, self.address], capture_output=True, text=True,
                                 timeout=90, env=ray_env())
            if got.stdout.strip() == "2":
                return
            time.sleep(2)
        raise RuntimeError(f"the Ray cluster did not reach 2 nodes: {got.stdout} {got.stderr[-2000:]}")

    def _wait_started(self, log: str, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = (self.root / log).read_text()
            if "Ray runtime started" in text:
                return
            if any(proc.poll() is not None for proc in self.procs):
                raise RuntimeError(f"ray start exited: {text[-2000:]}")
            time.sleep(1)
        raise RuntimeError(f"ray start did not come up: {(self.root / log).read_text()[-2000:]}")

    def stop(self) -> None:
        """SIGTERM to each `ray start --block` (it stops its node's processes), worker node first;
        SIGKILL to its whole process group if it lingers."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its session: stray raylet/worker children
            except (ProcessLookupError, PermissionError):
                pass


@pytest.fixture(scope="module")
def cluster():
    _stories()
    root = Path(tempfile.mkdtemp(prefix="evsel-rt-", dir="/tmp"))  # short: Ray's socket paths must fit
    c = Cluster(root)
    try:
        c.start()
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


def _cli_env(home: Path, model_cache: Path) -> dict:
    env = ray_env()
    env.update(EVSEL_HOME=str(home), EVSEL_MODEL_CACHE=str(model_cache), EVSEL_THREADS="1", EVSEL_NO_DAEMON="1",
               PYTHONUNBUFFERED="1")
    return env


class Lines:
    """A process' stderr lines, read by a thread, so every wait on them has a deadline (a hung
    build fails the test instead of hanging the suite)."""

    def __init__(self, proc: subprocess.Popen):
        import queue
        import threading

        self.proc = proc
        self.log: list[str] = []
        self.queue: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.queue.put(line)
        self.queue.put(None)

    def until(self, test, timeout: float) -> str | None:
        """Lines until `test(line)`: that line; None at the end of the output or the deadline."""
        import queue

        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.queue.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                return None
            self.log.append(line)
            if test(line):
                return line
        return None

    def finish(self, timeout: float) -> int | None:
        """Read to the end; the exit code, or None (the process killed) past the deadline."""
        self.until(lambda _line: False, timeout)
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return None

    def text(self) -> str:
        return "".join(self.log)


def _progress(line: str) -> bool:
    return line.startswith("corpus build: ") and " chunks," in line and _chunks_in(line) > 0


def _chunks_in(line: str) -> int:
    return int(line.split("corpus build: ", 1)[1].split(" chunks", 1)[0])


@pytest.fixture(scope="module")
def scenario(cluster, tmp_path_factory, model_cache):
    """Build 1 is SIGINTed after its first commit; build 2 resumes it and loses a worker process."""
    import lance

    root = tmp_path_factory.mktemp("corpus")
    files = write_stories(root / "src")
    # the same bytes under a later path: one document in the corpus, under the first path
    shutil.copyfile(files[0], root / "src" / "zz-copy.txt")
    out = root / "out"
    env = _cli_env(root / "home", model_cache)
    cmd = [str(BIN / "evsel"), "corpus", "build", str(root / "src"), "--out", str(out), "--address", cluster.address,
           "--states", "dense", "--batch-docs", "2", "--commit-every", "0", "--workers", "2"]
    facts: dict = {"files": files, "out": out, "root": root}

    first = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines = Lines(first)
    try:
        seen = lines.until(_progress, 300)
        assert seen, lines.text()[-3000:]
        first.send_signal(signal.SIGINT)
        facts["first_rc"] = lines.finish(120)
    finally:
        if first.poll() is None:
            first.kill()
    facts["first_log"] = lines.text()
    table = lance.dataset(str(out / "chunks.lance")).to_table(columns=["chunk_id", "doc_path"])
    facts["after_interrupt"] = table.column("chunk_id").to_pylist()
    facts["docs_after_interrupt"] = set(table.column("doc_path").to_pylist())

    pid_dir = out / ".build" / "workers"
    before = set(os.listdir(pid_dir)) if pid_dir.is_dir() else set()
    second = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines = Lines(second)
    killed = None
    try:
        # a worker of this build, once it has delivered work (so it is mid-build), is killed
        seen = lines.until(_progress, 300)
        assert seen, lines.text()[-3000:]
        fresh = sorted(set(os.listdir(pid_dir)) - before)
        assert fresh, "no worker of the second build recorded its pid"
        killed = int(fresh[0])
        os.kill(killed, signal.SIGKILL)
        facts["killed_at"] = seen
        facts["second_rc"] = lines.finish(400)
    finally:
        if second.poll() is None:
            second.kill()
    facts["killed"] = killed
    facts["second_log"] = lines.text()
    facts["workers_after"] = sorted(set(os.listdir(pid_dir)) - before)
    return facts


def _table(out: Path):
    import lance

    return lance.dataset(str(out / "chunks.lance")).to_table()


def test_an_interrupted_build_resumes_without_duplicates(scenario):
    assert scenario["first_rc"] == 130, scenario["first_log"][-3000:]
    done = scenario["after_interrupt"]
    assert done and len(done) == len(set(done))  # some committed, each once
    assert 0 < len(scenario["docs_after_interrupt"]) < N_DOCS, "the interrupt came after the whole build"
    assert "interrupted with " in scenario["first_log"] and "the same command resumes" in scenario["first_log"]
    assert scenario["second_rc"] == 0, scenario["second_log"][-3000:]
    assert "resuming; " in scenario["second_log"]
    assert "1 files repeat an earlier file's bytes; kept once" in scenario["second_log"]
    ids = _table(scenario["out"]).column("chunk_id").to_pylist()
    assert len(ids) == len(set(ids))
    assert set(done) <= set(ids)
    assert len({i.rsplit(":", 1)[0] for i in ids}) == N_DOCS


def test_a_killed_worker_is_retried_and_the_build_completes(scenario):
    assert scenario["killed"] is not None
    assert scenario["second_rc"] == 0, scenario["second_log"][-3000:]
    assert _chunks_in(scenario["killed_at"]) < len(_table(scenario["out"])), "killed after the build's last commit"
    # Ray started a new worker process in place of the killed one
    assert len(scenario["workers_after"]) >= 3, scenario["workers_after"]
    table = _table(scenario["out"])
    counts = Counter(table.column("doc_path").to_pylist())
    assert len(counts) == N_DOCS
    seqs: dict[str, list[int]] = {}
    for path, seq in zip(table.column("doc_path").to_pylist(), table.column("seq").to_pylist()):
        seqs.setdefault(path, []).append(seq)
    assert all(sorted(s) == list(range(len(s))) for s in seqs.values())  # every document whole, once


def test_the_corpus_equals_a_local_ingest(scenario, evsel_home):
    """Same chunks (content hash, text, provenance) as `evsel ingest` of the same files, the BM25
    terms the local index counts, and dense states within DENSE_ATOL of the local ones."""
    import numpy as np

    from evsel.store.bm25_index import chunk_tokens
    from evsel.corpus import schema
    from evsel.engine import Engine
    from evsel.models.selectors import get_selector

    engine = Engine()
    results = engine.ingest([str(scenario["root"] / "src")], encode=False)
    assert all(r["status"] == "ingested" for r in results)
    local = engine.store.chunks()
    docs = {d["id"]: d for d in engine.store.documents()}
    table = _table(scenario["out"]).to_pylist()
    by_id = {r["chunk_id"]: r for r in table}
    src = scenario["root"] / "src"
    expected = {}
    for c in local:
        doc = docs[c.doc_id]
        rel = Path(doc["path"]).relative_to(src.resolve()).as_posix()
        key = schema.chunk_id(doc["sha256"], c.seq)
        if key not in expected or rel < expected[key][1]:
            expected[key] = (c, rel)
    assert set(by_id) == set(expected)
    assert "zz-copy.txt" not in {r["doc_path"] for r in table}
    for key, (c, rel) in expected.items():
        row = by_id[key]
        assert row["content_hash"] == c.content_hash and row["text"] == c.text
        assert row["doc_path"] == rel
        assert row["bm25_terms"] == chunk_tokens(c.text)
    manifest = schema.read_manifest(scenario["out"])
    assert manifest["complete"] and manifest["n_chunks"] == len(expected) and manifest["n_docs"] == N_DOCS
    assert manifest["bm25"]["total_len"] == sum(len(chunk_tokens(c.text)) for c, _ in expected.values())
    assert manifest["indexes"]["fts"] == "text" and manifest["indexes"]["terms"] == "bm25_terms"
    # dense: the first 40 chunks, against what the local dense method stores and scores with
    some = local[:40]
    selector = get_selector("dense", engine.selector_context())
    mine = selector.vectors(some)
    theirs = np.array([by_id[schema.chunk_id(docs[c.doc_id]["sha256"], c.seq)]["dense"] for c in some], np.float32)
    assert np.abs(mine - theirs).max() <= DENSE_ATOL
    assert manifest["configs"]["dense"]["config"] == "minilm;pool=mean;max_tokens=256;norm=l2;dtype=float16"


def test_bm25_statistics_are_the_corpus_document_frequencies(scenario):
    import lance

    from evsel.corpus import schema

    table = _table(scenario["out"])
    df: Counter = Counter()
    for terms in table.column("bm25_terms").to_pylist():
        df.update(set(terms))
    stats = lance.dataset(str(scenario["out"] / schema.BM25_STATS)).to_table().to_pylist()
    assert {r["term"]: r["df"] for r in stats} == dict(df)


def test_progress_says_rows_rate_and_eta(scenario):
    lines = [l for l in scenario["second_log"].splitlines() if l.startswith("corpus build: ") and " chunks/s," in l]
    assert lines and all(" documents, ETA " in l for l in lines)
    assert lines[-1].endswith("ETA 0:00:00")


def test_full_text_search_finds_a_chunk(scenario):
    import lance

    dataset = lance.dataset(str(scenario["out"] / "chunks.lance"))
    row = dataset.to_table(columns=["chunk_id", "text"], limit=1).to_pylist()[0]
    word = max((w.strip(".,;:!?\"'") for w in row["text"].split()), key=len)
    hits = dataset.to_table(full_text_query=word, columns=["chunk_id"]).column("chunk_id").to_pylist()
    assert row["chunk_id"] in hits


def test_bad_source_is_one_line_and_nonzero(tmp_path):
    result = subprocess.run([str(BIN / "evsel"), "corpus", "build", str(tmp_path / "nope"), "--out",
                             str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and "no such file or directory" in result.stderr
    bad = tmp_path / "docs.jsonl"
    bad.write_text('{"id": "a", "text": "One."}\n{"id": "a", "text": "Two."}\n')
    result = subprocess.run([str(BIN / "evsel"), "corpus", "build", str(bad), "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "repeats the id 'a'" in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert not (tmp_path / "out").exists()


def test_write_local_and_jsonl_rows(tmp_path, backbone_tokenizer):
    """The Ray-free writer: a JSONL document's rows hash as the file ID.txt holding its text would,
    and writing the same rows twice stores them once."""
    import hashlib

    from evsel.corpus import rows, schema

    text = "The lamp was lit at dusk. The keeper walked the stairs.\n\nA ship passed the point at night."
    (tmp_path / "doc-1.txt").write_text(text, encoding="utf-8")
    from_file = rows.rows_of_file(tmp_path / "doc-1.txt", tmp_path, backbone_tokenizer)
    (tmp_path / "docs.jsonl").write_text('{"id": "doc-1", "text": ' + __import__("json").dumps(text) + "}\n")
    kind, docs = rows.source_items(tmp_path / "docs.jsonl")
    from_jsonl = rows.rows_of_jsonl_document(docs[0], backbone_tokenizer)
    assert kind == "jsonl"
    assert [r["content_hash"] for r in from_jsonl] == [r["content_hash"] for r in from_file]
    assert from_jsonl[0]["doc_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    manifest = schema.new_manifest(backbone=backbone_tokenizer.fingerprint, chunk_tokens=140, source="test",
                                   methods=["bm25"], dims={}, configs={})
    out = tmp_path / "corpus"
    rows.write_local(from_file, out, manifest)
    again = rows.write_local(from_file, out)
    assert again["n_chunks"] == len(from_file) and again["n_docs"] == 1
    assert again["bm25"]["total_len"] == sum(len(r["bm25_terms"]) for r in from_file)


def test_indexes_ivf_at_enough_rows(tmp_path, monkeypatch):
    """build_indexes: a full-text index always, IVF_PQ (dot) on `dense` from IVF_MIN_ROWS rows."""
    import lance
    import numpy as np

    from evsel.store.bm25_index import chunk_tokens
    from evsel.corpus import rows, schema

    rng = np.random.default_rng(0)
    words = ["lamp", "keeper", "ship", "storm", "gull", "point", "light", "night", "rock", "tide"]
    made = []
    for i in range(600):
        text = " ".join(rng.choice(words, 12)) + f" item{i}."
        vector = rng.standard_normal(schema.DENSE_DIM).astype(np.float32)
        made.append({"chunk_id": f"{i:064x}:0", "doc_sha256": f"{i:064x}", "doc_path": f"d{i}.txt", "doc_part": "",
                     "doc_title": f"d{i}", "doc_kind": "book", "seq": 0, "text": text, "content_hash": "h",
                     "n_tokens": 20, "char_start": 0, "char_end": len(text), "page_start": None, "page_end": None,
                     "speakers": [], "session": None, "turn_ids": [], "time_start": None, "time_end": None,
                     "bm25_terms": chunk_tokens(text), "dense": vector / np.linalg.norm(vector), "unreal": None})
    manifest = schema.new_manifest(backbone="x", chunk_tokens=140, source="synthetic", methods=["bm25", "dense"],
                                   dims={"dense": schema.DENSE_DIM}, configs={})
    flat = rows.write_local(made[:100], tmp_path / "small", manifest, index=True)
    assert flat["indexes"] == {"fts": "text", "terms": "bm25_terms", "dense": "none"}
    monkeypatch.setattr(schema, "IVF_MIN_ROWS", 500)
    ivf = rows.write_local(made, tmp_path / "big", manifest, index=True)
    assert ivf["indexes"] == {"fts": "text", "terms": "bm25_terms", "dense": "IVF_PQ"} and ivf["complete"]
    dataset = lance.dataset(str(tmp_path / "big" / schema.CHUNKS))
    query = made[7]["dense"]
    hits = dataset.to_table(nearest={"column": "dense", "q": query, "k": 5, "refine_factor": 20},
                            columns=["chunk_id"]).column("chunk_id").to_pylist()
    assert hits[0] == made[7]["chunk_id"]
    assert made[42]["chunk_id"] in dataset.to_table(full_text_query="item42", columns=["chunk_id"]).column(
        "chunk_id").to_pylist()
    # the terms index finds a local term exactly (stemmed "keeper" -> "keep" is not re-stemmed or cut)
    from lance.query import MatchQuery

    term = made[3]["bm25_terms"][0]
    found = dataset.to_table(full_text_query=MatchQuery(term, "bm25_terms"), columns=["chunk_id"])
    assert set(found.column("chunk_id").to_pylist()) == {r["chunk_id"] for r in made if term in r["bm25_terms"]}


@pytest.mark.model
def test_unreal_states_equal_the_local_ones(tmp_path, evsel_home):
    """The states a build worker computes (`StateEncoder`, batch of 64) for 2 stories equal the
    UNREAL states a local ingest caches for them, within float16 rounding (fp32 compute) or bf16 rounding."""
    import numpy as np

    from evsel.corpus import rows
    from evsel.engine import Engine
    from evsel.models.unreal import selection as unreal

    files = write_stories(tmp_path / "src", 2)
    engine = Engine()
    engine.ingest([str(f) for f in files], encode=True)
    key = unreal.ingest_state_key(engine.backbone)
    if key is None:
        pytest.skip("no UNREAL adapter for this backbone")
    local = engine.store.chunks()
    cached = engine.store.get_states(engine.backbone.fingerprint, key[0], key[1], [c.content_hash for c in local])
    encoder = rows.StateEncoder(engine.backbone, dense=False, unreal=True)
    made = []
    for f in files:
        made.extend(rows.rows_of_file(f, tmp_path / "src", engine.backbone))
    encoder.add_states(made)
    assert [r["content_hash"] for r in made] == [c.content_hash for c in local]
    bf16 = engine.backbone.plan.dtype == "bfloat16"
    for r in made:
        assert r["unreal"].dtype == np.float16
        got, want = r["unreal"].astype(np.float32), cached[r["content_hash"]].astype(np.float32)
        if bf16:
            relative = np.linalg.norm(got - want, axis=-1) / np.linalg.norm(want, axis=-1)
            assert relative.max() <= UNREAL_BF16_RELATIVE, relative.max()
        else:
            np.testing.assert_allclose(got, want, rtol=UNREAL_RTOL, atol=UNREAL_ATOL)
    table = rows.rows_to_table(made[:2], unreal_hidden=made[0]["unreal"].shape[1])
    back = np.array(table.column("unreal").to_pylist()[0], dtype=np.float16)
    assert np.array_equal(back, made[0]["unreal"])
