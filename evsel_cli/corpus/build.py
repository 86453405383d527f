"""`evsel corpus build`: SOURCE's documents into DIR/chunks.lance on a Ray cluster.

Ray Data runs one stage: the source's items (files, or documents of a JSONL), a few a batch, go
through `map_batches` to an actor pool (`CorpusWorker`: it holds the tokenizer, MiniLM and, with
UNREAL, the backbone). A worker parses, chunks and encodes its batch (`rows`: ingest's code) and
writes the rows as Lance fragments with `lance_ray`'s fragment writer, then returns only their
metadata. The driver commits the fragments it has received to chunks.lance every few seconds
(a Lance Append: atomic) and prints progress (chunks, chunks/s, ETA).

Resume: a file's chunks are written by one worker call and committed in one Append, so a
document is in the table whole or not at all; a build that finds chunks.lance from an unfinished
build (manifest "complete": false, same settings) skips the doc_paths committed already and does
the rest. A SIGINT lands between commits (the handler defers it during one), and fragments
written but not committed are left unreferenced, never read. A worker that dies is restarted by
Ray and its batch retried (`max_restarts`, `max_task_retries`); a retried batch is the same
documents, and a batch whose documents are committed already is dropped.

At the end: documents of identical bytes under two paths are kept once (under the first path),
the BM25 statistics are counted, the full-text and vector indexes built, and the manifest marked
complete. SOURCE and DIR must be paths every node of the cluster can read and write (a shared
file system); the workers import evsel, so it must be installed on every node. Give each node at
least 4 CPUs in Ray (`ray start --num-cpus=4`): a 2-core loopback cluster with its real CPU
count deadlocked (Ray Data's actor pool and its other operators waiting on each other).

A rerun on a finished corpus adds SOURCE's new files (a file whose doc_path is in the table is
not read again, even if it changed: delete its document first) and recounts the statistics.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

from evsel.ingest import chunker
from evsel.errors import EvselError, InputError, known_error

from . import rows as corpus_rows
from . import schema

STATES = ("dense", "unreal")
COMMIT_EVERY_S = 5.0  # the most finished work an interrupt can lose
PROGRESS_EVERY_S = 2.0
ENV_PREFIXES = ("EVSEL_", "HF_", "TRANSFORMERS_", "OMP_NUM_THREADS")
# A local Ray instance of our own (no --address) runs on this machine alone, and an open Ray port
# runs anyone's code: its node address is the loopback one, so every port it opens listens there
# only (without this Ray advertises the machine's address and its servers listen on all
# interfaces; read when ray is first imported), and Ray's token authentication stays on.
LOCAL_RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token"}


def prepare_local_ray() -> None:
    """Set `LOCAL_RAY_ENV`; before ray is first imported (the command does it first thing)."""
    os.environ.update(LOCAL_RAY_ENV)


class CorpusWorker:
    """A Ray Data actor: turns a batch of items into Lance fragments of DIR/chunks.lance. Its
    settings are class attributes of a subclass (`worker_class`), shipped with the class."""

    config: dict = {}

    def __init__(self):
        self._setup(**self.config)

    def _setup(self, uri: str, chunk_tokens: int, states: list[str], dense_dim: int, unreal_hidden: int,
               pid_dir: str | None = None):
        from evsel.models.runtime.backbone import Backbone
        from evsel.settings import Settings

        settings = Settings()
        if settings.threads:
            import torch

            torch.set_num_threads(settings.threads)
        self.backbone = Backbone(settings.model, settings.device, threads=settings.threads,
                                 model_as_given=settings.model_as_given)
        self.encoder = corpus_rows.StateEncoder(self.backbone, dense="dense" in states, unreal="unreal" in states,
                                                adapter=settings.unreal_adapter)
        self.uri = uri
        self.chunk_tokens = chunk_tokens
        self.schema = schema.arrow_schema(dense_dim, unreal_hidden)
        self.dims = (dense_dim, unreal_hidden)
        if pid_dir:  # the build's worker processes, for an operator (and the tests) to find
            Path(pid_dir).mkdir(parents=True, exist_ok=True)
            Path(pid_dir, str(os.getpid())).write_text(os.uname().nodename)

    def __call__(self, batch):
        import pyarrow as pa
        from lance_ray.fragment import write_fragment

        results, made = [], []
        for item in batch.to_pylist():
            warnings: list[str] = []
            try:
                if item["doc"]:
                    found = corpus_rows.rows_of_jsonl_document(json.loads(item["doc"]), self.backbone,
                                                               self.chunk_tokens, warnings)
                else:
                    found = corpus_rows.rows_of_file(item["path"], item["root"], self.backbone, self.chunk_tokens,
                                                     warnings=warnings)
            except EvselError as exc:
                results.append({"key": item["key"], "error": _one_line(exc)})
                continue
            except OSError as exc:
                results.append({"key": item["key"], "error": f"cannot read the file: {exc.strerror or exc}"})
                continue
            except Exception as exc:  # a library or parser failure on one file must not stop the others
                error = known_error(exc)
                results.append({"key": item["key"], "error": _one_line(error) if error else
                                f"unexpected {type(exc).__name__} while reading it: {exc}"})
                continue
            docs = {}
            for r in found:
                docs.setdefault(f"{r['doc_sha256']}:{r['doc_part']}", 0)
                docs[f"{r['doc_sha256']}:{r['doc_part']}"] += 1
            results.append({"key": item["key"], "chunks": len(found), "docs": docs, "warnings": warnings})
            made.extend(found)
        fragments = []
        for at in range(0, len(made), 64):  # the local state cache's batch
            self.encoder.add_states(made[at:at + 64])
        if made:
            table = corpus_rows.rows_to_table(made, *self.dims)
            fragments = [pickle.dumps(f) for f, _ in write_fragment([table], self.uri, schema=self.schema)]
        return pa.table({"results": [json.dumps(results)], "fragments": [pickle.dumps(fragments)]})


def _one_line(error: EvselError) -> str:
    return f"{error.message}; {error.hint}" if error.hint else error.message


def worker_class(**config) -> type:
    return type("CorpusWorker", (CorpusWorker,), {"config": config})


class Progress:
    """One line on stderr every few seconds: chunks done, chunks/s, items done of all, ETA."""

    def __init__(self, total_items: int, out=sys.stderr):
        self.total = total_items
        self.items = 0
        self.chunks = 0
        self.started = time.perf_counter()
        self.shown = 0.0
        self.out = out

    def add(self, items: int, chunks: int) -> None:
        self.items += items
        self.chunks += chunks
        now = time.perf_counter()
        if now - self.shown >= PROGRESS_EVERY_S or self.items >= self.total:
            self.shown = now
            self.show()

    def show(self) -> None:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        rate = self.chunks / elapsed
        left = self.total - self.items
        eta = "?" if not self.items else _clock(elapsed / self.items * left)
        print(f"corpus build: {self.chunks} chunks, {rate:.1f} chunks/s, {self.items}/{self.total} documents, "
              f"ETA {eta}", file=self.out, flush=True)


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class _DeferredInterrupt:
    """SIGINT raises KeyboardInterrupt, except inside `critical()` (a commit), where it is held
    until the commit is done: a commit is then either made and known, or not made."""

    def __init__(self):
        self.inside = False
        self.pending = False
        self.previous = None

    def __enter__(self):
        self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc):
        signal.signal(signal.SIGINT, self.previous)

    def _handle(self, signum, frame):
        if self.inside:
            self.pending = True
        else:
            raise KeyboardInterrupt

    @contextmanager
    def critical(self):
        self.inside = True
        try:
            yield
        finally:
            self.inside = False
            if self.pending:
                self.pending = False
                raise KeyboardInterrupt


def _expected_configs(settings, states: list[str]) -> tuple[str, dict, dict]:
    """(backbone fingerprint, configs, dims) the workers will produce, known without loading a model."""
    from evsel.models.unreal import selection as unreal
    from evsel.models.runtime.backbone import Backbone, fingerprint
    from evsel.models.selectors import dense

    backbone = Backbone(settings.model, settings.device, model_as_given=settings.model_as_given)
    configs, dims = {}, {}
    if "dense" in states:
        configs["dense"] = {"model": fingerprint(dense.model_dir() / "model.safetensors"), "config": dense.CONFIG}
        dims["dense"] = schema.DENSE_DIM
    if "unreal" in states:
        directory = Path(settings.unreal_adapter) if settings.unreal_adapter else unreal.shipped_adapter_dir(
            backbone.fingerprint)
        config_file = directory / unreal.CONFIG_FILE
        if config_file.is_file():
            saved = json.loads(config_file.read_text())
            config = unreal.UnrealConfig.from_dict(saved["config"])
            configs["unreal"] = {"model": backbone.fingerprint, "config": unreal.state_key(config.layer, config.pool)}
            dims["unreal"] = [config.pool, int(saved.get("hidden", schema.UNREAL_HIDDEN))]
    return backbone.fingerprint, configs, dims


def _committed(uri: str) -> tuple[set[str], dict[str, set[str]], int]:
    """(doc_paths in the table, doc key -> its doc_paths, rows) of DIR/chunks.lance."""
    import lance

    paths: set[str] = set()
    keys: dict[str, set[str]] = {}
    dataset = lance.dataset(uri)
    for batch in dataset.to_batches(columns=["doc_path", "doc_sha256", "doc_part"]):
        for p, sha, part in zip(*(c.to_pylist() for c in batch.columns)):
            paths.add(p)
            keys.setdefault(f"{sha}:{part}", set()).add(p)
    return paths, keys, dataset.count_rows()


def drop_lost_fragments(uri: str) -> int:
    """Commit the removal of the fragments of DIR/chunks.lance whose data file is gone, so a
    resumed build reads their documents again (each is in one fragment, whole: module doc).
    Returns how many were dropped."""
    import lance

    dataset = lance.dataset(uri)
    data = Path(uri) / "data"
    lost = [f.fragment_id for f in dataset.get_fragments()
            if not all((data / file.path).is_file() for file in f.metadata.files)]
    if lost:
        lance.LanceDataset.commit(uri, lance.LanceOperation.Delete(updated_fragments=[], deleted_fragment_ids=lost,
                                                                   predicate="true"),
                                  read_version=dataset.version)
    return len(lost)


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def build(source: str, out: str, address: str | None = None, chunk_tokens: int = chunker.DEFAULT_CHUNK_TOKENS,
          states: list[str] | None = None, workers: int | None = None, batch_docs: int = 4,
          commit_every_s: float = COMMIT_EVERY_S, settings=None, on_line: Callable[[str], None] | None = None) -> dict:
    """Build (or resume building) the corpus of SOURCE in OUT. Returns the manifest, with
    "failed": [{"path", "error"}] for items that could not be read (the rest is built).
    `settings`: the request's (`--model`, `--device`, EVSEL_*), handed to the workers."""
    import lance

    from evsel.settings import Settings

    say = on_line or (lambda line: print(line, file=sys.stderr, flush=True))
    states = list(STATES if states is None else states)
    source_path = Path(source).expanduser().resolve()
    out_dir = Path(out).expanduser().resolve()
    _check_build(states, chunk_tokens, batch_docs, source_path, out_dir)
    kind, items = corpus_rows.source_items(source_path)
    settings = settings or Settings()
    backbone_fp, configs, dims = _expected_configs(settings, states)
    uri = str(out_dir / schema.CHUNKS)
    methods = ["bm25", *[s for s in STATES if s in configs]]
    manifest = schema.new_manifest(backbone=backbone_fp, chunk_tokens=chunk_tokens, source=str(source_path),
                                   methods=methods, dims=dims, configs=configs)
    manifest, done_paths, doc_paths = _resumed(out_dir, uri, manifest, say)
    manifest["complete"] = False
    schema.write_manifest(out_dir, manifest)
    dense_dim = dims.get("dense", schema.DENSE_DIM)
    unreal_hidden = dims.get("unreal", [0, schema.UNREAL_HIDDEN])[1]
    if not Path(uri).exists():
        import pyarrow as pa

        target = schema.arrow_schema(dense_dim, unreal_hidden)
        lance.write_dataset(pa.Table.from_pylist([], schema=target), uri, schema=target, mode="create")

    work = [entry for entry in _work_entries(kind, items, source_path) if entry["key"] not in done_paths]
    failed: list[dict] = []
    if work:
        try:
            failed = _run(work, uri, out_dir, address, settings, chunk_tokens, states, dense_dim, unreal_hidden,
                          workers, batch_docs, commit_every_s, doc_paths, say)
        except KeyboardInterrupt:
            done = len(_committed(uri)[0])
            say(f"corpus build: interrupted with {done} of {len(items)} documents committed; "
                "the same command resumes")
            raise
    for failure in failed:
        say(f"evsel: {failure['path']}: {failure['error']}")
    manifest = _finish(out_dir, uri, say)
    manifest["failed"] = failed
    return manifest


def _check_build(states: list[str], chunk_tokens: int, batch_docs: int, source_path: Path, out_dir: Path) -> None:
    unknown = [s for s in states if s not in STATES]
    if unknown:
        raise InputError(f"unknown state {unknown[0]!r}", f"choose from {', '.join(STATES)}")
    if chunk_tokens < 16:
        raise InputError(f"--chunk-tokens {chunk_tokens} is too small", "use 16 or more (default 140)")
    if batch_docs < 1:
        raise InputError("--batch-docs must be 1 or more", "give a positive number")
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError("--out is not a directory", "give a new or existing corpus directory", path=str(out_dir))
    if out_dir == source_path or source_path in out_dir.parents:
        raise InputError("--out is inside SOURCE", "put the corpus outside the folder it indexes", path=str(out_dir))


def _resumed(out_dir: Path, uri: str, manifest: dict,
             say: Callable[[str], None]) -> tuple[dict, set[str], dict[str, set[str]]]:
    """(the manifest, the documents already committed, each one's paths): a corpus already in OUT
    resumes when it was built with the same settings; a new OUT starts empty."""
    if not (out_dir / schema.MANIFEST).is_file():
        if out_dir.exists() and any(out_dir.iterdir()):
            raise InputError("--out is a directory that is not an evsel corpus", "give a new or empty directory",
                             path=str(out_dir))
        return manifest, set(), {}
    try:
        old = schema.read_manifest(out_dir)
    except ValueError as exc:
        raise InputError(str(exc), "give --out a new directory or an evsel corpus") from None
    same = {k: old.get(k) for k in ("backbone", "chunk_tokens", "methods", "configs")} == {
        k: manifest[k] for k in ("backbone", "chunk_tokens", "methods", "configs")}
    if not same:
        raise InputError("this corpus was built with other settings (model, --chunk-tokens or states)",
                         "build into a new --out, or rerun with the settings it was built with", path=str(out_dir))
    manifest = dict(old, complete=False)
    if not Path(uri).exists():
        return manifest, set(), {}
    lost = drop_lost_fragments(uri)
    if lost:
        say(f"corpus build: {lost} data file(s) of {out_dir} were missing; their documents are read again")
    done_paths, doc_paths, rows_before = _committed(uri)
    if done_paths:
        say(f"corpus build: resuming; {len(done_paths)} documents ({rows_before} chunks) already in {out_dir}")
    return manifest, done_paths, doc_paths


def _work_entries(kind: str, items: list, source_path: Path) -> list[dict]:
    """What a worker is handed for each source item: its key, and its file or its JSONL line."""
    entries = []
    for item in items:
        if kind == "jsonl":
            entries.append({"key": item["id"], "path": None, "root": None, "doc": json.dumps(item)})
        else:
            key = item.relative_to(source_path).as_posix() if item != source_path else item.name
            entries.append({"key": key, "path": str(item),
                            "root": str(source_path if source_path.is_dir() else item.parent), "doc": None})
    return entries


def _ray_env(settings) -> dict:
    """The variables the workers' Settings resolve from: this process' EVSEL_* and the request's
    model and device."""
    from evsel.settings import variables_prefixed

    env = variables_prefixed(ENV_PREFIXES)
    if settings.model:
        env["EVSEL_MODEL"] = settings.model
    env["EVSEL_DEVICE"] = settings.device
    if settings.unreal_adapter:
        env["EVSEL_UNREAL_ADAPTER"] = settings.unreal_adapter
    return env


def _run(work: list[dict], uri: str, out_dir: Path, address: str | None, settings, chunk_tokens: int, states: list[str],
         dense_dim: int, unreal_hidden: int, workers: int | None, batch_docs: int,
         commit_every_s: float, doc_paths: dict[str, set[str]], say) -> list[dict]:
    import logging
    import warnings

    os.environ.setdefault("RAY_DATA_LOG_LEVEL", "ERROR")  # read when ray.data is first imported
    import ray

    # Ray's own notices (deprecations, "execution finished") are not this command's output
    warnings.filterwarnings("ignore", category=ray.util.annotations.RayDeprecationWarning)
    warnings.filterwarnings("ignore", message="lance is not fork-safe")
    logging.getLogger("ray").setLevel(logging.ERROR)
    env = {"env_vars": _ray_env(settings)}
    temp = None
    if address:
        try:
            ray.init(address=address, runtime_env=env, logging_level="ERROR", log_to_driver=False)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            raise EvselError(f"cannot connect to the Ray cluster at {address}: {str(exc).splitlines()[0]}",
                             "check the address (HOST:PORT of the head node) and that the cluster is up") from None
    else:  # a local instance of our own, in its own temp dir (short: Ray's socket paths must fit)
        import ipaddress

        prepare_local_ray()
        node = ray.util.get_node_ip_address()  # what its servers would bind to
        if not ipaddress.ip_address(node).is_loopback:
            raise EvselError(f"a local Ray instance here would listen on {node}, not on loopback only",
                             "run evsel corpus build in a process of its own (ray was imported before it), "
                             "or give the cluster with --address")
        temp = tempfile.mkdtemp(prefix="evsel-ray-", dir="/tmp")
        ray.init(num_cpus=max(4, os.cpu_count() or 1), include_dashboard=False, runtime_env=env, _temp_dir=temp,
                 logging_level="ERROR", log_to_driver=False)
    try:
        return _pipeline(work, uri, out_dir, chunk_tokens, states, dense_dim, unreal_hidden, workers, batch_docs,
                         commit_every_s, doc_paths, say)
    finally:
        ray.shutdown()
        if temp:
            import shutil

            shutil.rmtree(temp, ignore_errors=True)


def _pipeline(work, uri, out_dir, chunk_tokens, states, dense_dim, unreal_hidden, workers, batch_docs, commit_every_s,
              doc_paths, say) -> list[dict]:
    import lance
    import ray

    ray.data.DataContext.get_current().enable_progress_bars = False
    ray.data.DataContext.get_current().print_on_execution_start = False
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    pool = workers or max(1, len(nodes))
    by_key = {w["key"]: w for w in work}
    ds = ray.data.from_items(work, override_num_blocks=max(1, min(200_000, len(work) // batch_docs or 1)))
    worker = worker_class(uri=uri, chunk_tokens=chunk_tokens, states=states, dense_dim=dense_dim,
                          unreal_hidden=unreal_hidden, pid_dir=str(out_dir / ".build" / "workers"))
    ds = ds.map_batches(
        worker, batch_size=batch_docs, batch_format="pyarrow", compute=ray.data.ActorPoolStrategy(size=pool),
        num_cpus=1,
        scheduling_strategy="SPREAD", max_restarts=4, max_task_retries=4)
    progress = Progress(len(work))
    progress.show()
    failed: list[dict] = []
    pending: list = []
    pending_items: list[dict] = []
    committed_keys: set[str] = set()
    last_commit = time.perf_counter()

    def commit() -> None:
        nonlocal pending, pending_items, last_commit
        last_commit = time.perf_counter()
        if not pending and not pending_items:
            return
        if pending:
            dataset = lance.dataset(uri)
            lance.LanceDataset.commit(uri, lance.LanceOperation.Append(pending), read_version=dataset.version)
        for r in pending_items:
            committed_keys.add(r["key"])
            for doc in r["docs"]:
                doc_paths.setdefault(doc, set()).add(r["key"])
        progress.add(len(pending_items), sum(r["chunks"] for r in pending_items))
        pending, pending_items = [], []

    with _DeferredInterrupt() as interrupts:
        try:
            for batch in ds.iter_batches(batch_size=1, batch_format="pyarrow"):
                columns = batch.column("results").to_pylist(), batch.column("fragments").to_pylist()
                for results, fragments in zip(*columns):
                    results = json.loads(results)
                    fresh = [r for r in results if r["key"] not in committed_keys
                             and r["key"] not in {p["key"] for p in pending_items}]
                    if len(fresh) < len(results):  # a retried batch delivered twice: its rows are in already
                        continue
                    for r in results:
                        for warning in r.get("warnings", []):
                            say(f"evsel: warning: {warning}")  # parsers name the file
                        if "error" in r:
                            failed.append({"path": by_key[r["key"]]["path"] or r["key"], "error": r["error"]})
                            progress.add(1, 0)
                            committed_keys.add(r["key"])
                    pending.extend(pickle.loads(f) for f in pickle.loads(fragments))
                    pending_items.extend(r for r in results if "error" not in r)
                if time.perf_counter() - last_commit >= commit_every_s:
                    with interrupts.critical():
                        commit()
            with interrupts.critical():
                commit()
        except KeyboardInterrupt:
            with interrupts.critical():  # what arrived whole is kept: the resume starts after it
                commit()
            raise
    return failed


def _finish(out_dir: Path, uri: str, say) -> dict:
    """Drop documents stored twice (identical bytes under two paths), count the statistics,
    build the indexes, mark the manifest complete."""
    import lance

    _, keys, _ = _committed(uri)
    extra = sorted({p for paths in keys.values() if len(paths) > 1 for p in sorted(paths)[1:]})
    dataset = lance.dataset(uri)
    for at in range(0, len(extra), 500):
        dataset.delete("doc_path IN (" + ", ".join(_sql_string(p) for p in extra[at:at + 500]) + ")")
    if extra:
        say(f"corpus build: {len(extra)} files repeat an earlier file's bytes; kept once")
    manifest = corpus_rows.refresh_stats(out_dir)
    manifest["indexes"] = corpus_rows.build_indexes(out_dir, manifest)
    manifest["complete"] = True
    schema.write_manifest(out_dir, manifest)
    return manifest
