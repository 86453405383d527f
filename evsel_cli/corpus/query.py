"""`evsel ask --corpus DIR`: the first stage read from a corpus' Lance dataset, then the local
pipeline (rerank, answer) on the candidates.

- bm25: the full-text index gives the candidates (every chunk sharing a term with the question,
  or Lance's own top `bm25_candidates` by its BM25), which are scored exactly as the local store's
  BM25 scores them (`rank_bm25.BM25Okapi`'s arithmetic: k1 1.5, b 0.75, negative idf floored at
  0.25 x the average idf), from each candidate's stored `bm25_terms` and the corpus' document
  frequencies (bm25_stats.lance) and N, avgdl (manifest). A chunk sharing no term with the
  question scores 0 locally too, so with every match as candidate the order is the local one.
- dense: Lance's nearest-neighbour search on `dense` (dot product; the IVF index when the corpus
  has one, else a flat scan) gives `candidates` chunks, rescored exactly (float32 dot, as local).
- unreal: the query vectors q (G, d) come from the local backbone and adapter, with C0 the top
  BM25 chunks of the corpus. Standardizing keys per dimension, (k - m) / s, shifts every chunk's
  MaxSim by the same constant when q is divided by s instead, so Lance's multivector search with
  q / s over the raw fp16 states finds the chunks of highest standardized MaxSim; those are then
  scored exactly as the local selector scores them.

A corpus is opened once per directory and process (the daemon keeps it between asks) and
reopened when its dataset or manifest changed (`evsel corpus add/rm` from another process).
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from evsel.store.bm25_index import B, EPSILON, K1
from evsel.errors import EvselError, InputError

from . import schema

ANN_CANDIDATES = 200  # chunks the vector search returns for the exact rescore
BUILD_HINT = "build one with: evsel corpus build SOURCE --out DIR"
EXTRA_HINT = "install the extra: pip install 'evsel[scale]'"

# the inverted index on `bm25_terms` that makes BM25's candidates exact (the build makes it too)
TERMS_INDEX = schema.TERMS_INDEX

# the columns a chunk's provenance needs (ChunkRecord), read for the ranked chunks only
RECORD_COLUMNS = ["chunk_id", "doc_sha256", "doc_path", "doc_title", "doc_kind", "seq", "text", "content_hash",
                  "n_tokens", "char_start", "char_end", "page_start", "page_end", "speakers", "session",
                  "turn_ids", "time_start", "time_end"]


def require_extra() -> None:
    try:
        import lance  # noqa: F401
    except ImportError:
        raise EvselError("a corpus needs the scale extra (lance, pyarrow), which is not installed",
                         EXTRA_HINT) from None


def check_directory(directory: str | Path) -> tuple[Path, dict]:
    """The corpus directory and its manifest; InputError for a path that is not one."""
    path = Path(directory).expanduser()
    if not path.exists():
        raise InputError(f"no corpus at {path}: the directory does not exist", BUILD_HINT)
    if not path.is_dir():
        raise InputError(f"{path} is a file, not a corpus directory", BUILD_HINT)
    try:
        manifest = schema.read_manifest(path)
    except ValueError as exc:
        raise InputError(str(exc), f"give the --out directory of evsel corpus build; {BUILD_HINT}") from None
    if not (path / schema.CHUNKS).is_dir():
        raise InputError(f"{path} has a manifest but no {schema.CHUNKS}", "rebuild it: " + BUILD_HINT.split(": ")[1])
    return path, manifest


@dataclass
class Hit:
    row_id: int
    score: float


@dataclass
class Corpus:
    """One open corpus: its manifest, its chunks dataset at one version, and the BM25 statistics."""

    path: Path
    manifest: dict
    dataset: object  # lance.LanceDataset
    manifest_mtime: float
    _df: dict | None = None
    _average_idf: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def load(cls, path: Path, manifest: dict) -> "Corpus":
        import lance

        try:
            dataset = lance.dataset(str(path / schema.CHUNKS))
        except Exception as exc:  # noqa: BLE001  lance raises several types for a damaged dataset
            raise InputError(f"cannot open {path / schema.CHUNKS}: {exc}", "rebuild it: " + BUILD_HINT.split(": ")[1]) \
                from None
        return cls(path, manifest, dataset, (path / schema.MANIFEST).stat().st_mtime)

    @contextmanager
    def reading(self):
        """Around reads of the chunks table: a data file removed or damaged under it is one line
        saying so, and that `corpus build` over the same source resumes and repairs it."""
        import pyarrow as pa

        try:
            yield
        except (pa.ArrowException, OSError) as exc:
            source = self.manifest.get("source") or "SOURCE"
            why = " ".join(str(exc).split(", /")[0].split())[:200]
            raise InputError(f"the corpus {self.path} is damaged: a data file is missing or unreadable ({why})",
                             f"repair it with: evsel corpus build {source} --out {self.path} (it resumes, reading "
                             "again the documents of the lost files)") from None

    # what the corpus holds -------------------------------------------------------------------
    @property
    def n_chunks(self) -> int:
        return int(self.manifest.get("bm25", {}).get("n_chunks") or self.manifest.get("n_chunks") or 0)

    @property
    def methods(self) -> list[str]:
        return list(self.manifest.get("methods") or ["bm25"])

    @property
    def fts_column(self) -> str | None:
        """The column of the full-text index the BM25 candidates come from: `bm25_terms` where it
        has one (its tokens are the local terms: every chunk sharing a term with the question is a
        match, so the exact top-n is the local one), else the manifest's (`text`: Lance stems
        words its own way, so a chunk whose local term equals a question's by another stem, e.g.
        "nilly" and "nils" both "nil", can be missed)."""
        indexed = self.indexed_columns()
        if "bm25_terms" in indexed:
            return "bm25_terms"
        named = (self.manifest.get("indexes") or {}).get("fts")
        return named if named in indexed or not indexed else indexed[0]

    def indexed_columns(self) -> list[str]:
        """Columns with an inverted (full-text) index."""
        out = []
        for index in self.dataset.describe_indices():
            names = list(getattr(index, "field_names", None) or [])
            if "inverted" in str(getattr(index, "type_url", "")).lower() and names and names[0] not in out:
                out.append(names[0])
        return out

    def is_current(self) -> bool:
        """Still the latest dataset version and manifest (appends and deletes make new ones)."""
        try:
            mtime = (self.path / schema.MANIFEST).stat().st_mtime
            return mtime == self.manifest_mtime and self.dataset.latest_version == self.dataset.version
        except OSError:
            return False

    # BM25 -------------------------------------------------------------------------------------
    def df(self) -> dict[str, int]:
        """term -> document frequency, read once per open corpus."""
        with self.lock:
            if self._df is None:
                import lance

                stats = self.path / schema.BM25_STATS
                if not stats.is_dir():
                    raise InputError(f"{self.path} has no {schema.BM25_STATS}", "rebuild it: "
                                     + BUILD_HINT.split(": ")[1])
                table = lance.dataset(str(stats)).to_table(columns=["term", "df"])
                self._df = dict(zip(table.column("term").to_pylist(), table.column("df").to_pylist()))
            return self._df

    def average_idf(self) -> float:
        """rank-bm25's average idf over the whole vocabulary (the floor of negative idf)."""
        if self._average_idf is None:
            from evsel.store.bm25_index import average_idf

            self._average_idf = average_idf(self.n_chunks, list(self.df().values()))
        return self._average_idf

    def idf(self, term: str) -> float:
        from evsel.store.bm25_index import okapi_idf

        df = self.df().get(term)
        if not df:
            return 0.0  # absent from the corpus: adds 0 to every score, as locally
        value = okapi_idf(self.n_chunks, df)
        return EPSILON * self.average_idf() if value < 0 else value

    def bm25(self, query: list[str], depth: int, candidates: int | None = None, words: list[str] = (),
             column: str | None = None) -> list[Hit]:
        """The top `depth` chunks by local BM25 for query terms `query` (tokenized as locally).
        `candidates`: how many full-text matches to rescore (None: all of them, exact).
        `words`: the question's own words, searched too where the index is on `text`: Lance
        stems them as it stemmed the chunks, where a local stem may be stemmed otherwise.
        `column`: the full-text index to read (default `fts_column`)."""
        import lance.query as lq

        from evsel.store.bm25_index import query_scores

        if not query:
            return []
        column = column or self.fts_column
        if column is None:
            raise InputError(f"{self.path} has no full-text index", "rebuild it: " + BUILD_HINT.split(": ")[1])
        terms = list(dict.fromkeys(query))
        searched = terms if column == "bm25_terms" else list(dict.fromkeys([*terms, *words]))
        match = lq.MatchQuery(" ".join(searched), column)
        table = self.dataset.scanner(columns=["bm25_terms"], full_text_query=match, limit=candidates,
                                     with_row_id=True, disable_scoring_autoprojection=True).to_table()
        if table.num_rows == 0:
            return []
        row_ids = table.column("_rowid").to_numpy()
        tf = self.term_frequencies(table.column("bm25_terms"), terms)  # (n, |terms|)
        lengths = tf[:, -1]
        tf = tf[:, :-1]
        avgdl = self.manifest["bm25"]["total_len"] / self.n_chunks
        frequencies = {t: tf[:, i] for i, t in enumerate(terms)}
        score = query_scores(query, frequencies, {t: self.idf(t) for t in terms}, lengths, avgdl, K1, B)
        hits = _top(row_ids, score, depth)
        if len(hits) < depth:  # as locally: chunks sharing no term follow, score 0, in corpus order
            seen = set(row_ids.tolist())
            hits += [h for h in self.first_rows(depth + len(seen)) if h.row_id not in seen][: depth - len(hits)]
        return hits

    @staticmethod
    def term_frequencies(lists, terms: list[str]):
        """(n, |terms| + 1) float64: each list's count of each term, then its length."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        lists = lists.combine_chunks() if isinstance(lists, pa.ChunkedArray) else lists
        offsets = lists.offsets.to_numpy()
        lengths = np.diff(offsets)
        values = lists.values.slice(offsets[0], offsets[-1] - offsets[0])
        owner = np.repeat(np.arange(len(lengths)), lengths)
        out = np.zeros((len(lengths), len(terms) + 1))
        out[:, -1] = lengths
        where = pc.index_in(values, value_set=pa.array(terms, pa.string())).to_numpy(zero_copy_only=False)
        found = ~np.isnan(where.astype(np.float64)) if where.dtype == object else where >= 0
        if where.dtype == object:
            where = np.where(found, where, -1).astype(np.int64)
        np.add.at(out, (owner[found], where[found].astype(np.int64)), 1)
        return out

    # vectors ----------------------------------------------------------------------------------
    def nearest(self, column: str, query, candidates: int, nprobes: int | None = None) -> tuple:
        """Lance's nearest-neighbour search (dot product) on `column`: (row ids, vectors)."""
        import numpy as np

        nearest = {"column": column, "q": np.asarray(query, dtype=np.float32), "k": candidates, "metric": "dot"}
        if nprobes is not None:
            nearest["nprobes"] = nprobes
        table = self.dataset.to_table(columns=[column], nearest=nearest, with_row_id=True,
                                      disable_scoring_autoprojection=True)
        return table.column("_rowid").to_numpy(), table.column(column)

    def dense(self, query, depth: int, candidates: int = ANN_CANDIDATES, nprobes: int | None = None) -> list[Hit]:
        """Top `depth` by the exact dot product over the ANN's `candidates`."""
        import numpy as np

        row_ids, vectors = self.nearest("dense", query, max(candidates, depth), nprobes)
        if not len(row_ids):
            return []
        dim = int(self.manifest.get("dims", {}).get("dense") or schema.DENSE_DIM)
        matrix = _flat(vectors, np.float32).reshape(len(row_ids), dim)
        return _top(row_ids, matrix @ np.asarray(query, dtype=np.float32), depth)

    def unreal_states(self, row_ids) -> "object":
        """(n, pool, hidden) float16 stored states of these rows, in their order."""
        import numpy as np

        pool, hidden = self.manifest["dims"]["unreal"]
        table = self.rows(row_ids, ["unreal"])
        return _flat(table.column("unreal"), np.float16).reshape(len(row_ids), pool, hidden).copy()  # writable

    def unreal_candidates(self, query, candidates: int) -> list[int]:
        row_ids, _ = self.nearest("unreal", query, candidates)
        return list(map(int, row_ids))

    # rows as chunk records ----------------------------------------------------------------------
    def records(self, hits: list[Hit]):
        """Scored chunk records of `hits`, with the provenance the local store keeps."""
        from evsel.models.selectors import Scored

        if not hits:
            return []
        table = self.rows([h.row_id for h in hits], RECORD_COLUMNS)
        rows = table.to_pylist()
        return [Scored(chunk_record(row), float(h.score), rank) for rank, (h, row) in enumerate(zip(hits, rows), 1)]

    def rows(self, row_ids, columns: list[str]):
        """The rows of these row ids (what the searches return; stable across deletes), in their
        order: a filter on `_rowid`, which Lance reads as a take of those rows."""
        import pyarrow as pa

        wanted = list(map(int, row_ids))
        if not wanted:
            return self.dataset.schema.empty_table().select(columns)
        table = self.dataset.to_table(columns=columns, with_row_id=True,
                                      filter=f"_rowid IN ({', '.join(map(str, sorted(set(wanted))))})")
        where = {row_id: i for i, row_id in enumerate(table.column("_rowid").to_pylist())}
        return table.select(columns).take(pa.array([where[row_id] for row_id in wanted], type=pa.int64()))

    def first_rows(self, n: int) -> list[Hit]:
        """The first `n` chunks with score 0 (what a question sharing no word with the corpus gets)."""
        table = self.dataset.to_table(columns=["seq"], limit=n, with_row_id=True)
        return [Hit(int(r), 0.0) for r in table.column("_rowid").to_numpy()]


def index_terms(directory: str | Path) -> None:
    """Add the full-text index on `bm25_terms` (TERMS_INDEX) to a corpus that lacks it."""
    import lance

    path, _ = check_directory(directory)
    dataset = lance.dataset(str(path / schema.CHUNKS))
    if dataset.count_rows() and "bm25_terms" not in Corpus(path, {}, dataset, 0.0).indexed_columns():
        dataset.create_scalar_index("bm25_terms", "INVERTED", **TERMS_INDEX)


def question_words(question: str) -> list[str]:
    """The question's words as BM25 reads them before stemming (stop words left out)."""
    from evsel.store.bm25_index import words

    return words(question)


def chunk_record(row: dict):
    """A corpus row as the pipeline's ChunkRecord: the chunk id and the document's sha256 (its
    first 12 hex digits) stand where the local store has integer ids."""
    from evsel.store.store import ChunkRecord

    return ChunkRecord(
        id=row["chunk_id"], doc_id=row["doc_sha256"][:12], seq=int(row["seq"]), text=row["text"],
        content_hash=row["content_hash"], n_tokens=int(row["n_tokens"] or 0), char_start=int(row["char_start"]),
        char_end=int(row["char_end"]), page_start=row["page_start"], page_end=row["page_end"],
        speakers=list(row["speakers"] or []), session=row["session"], turn_ids=list(row["turn_ids"] or []),
        time_start=row["time_start"], time_end=row["time_end"], title=row["doc_title"] or "",
        kind=row["doc_kind"] or "", path=row["doc_path"])


def _flat(array, dtype):
    """The values of a list / fixed-size-list arrow array (chunked or not) as one numpy array."""
    import numpy as np
    import pyarrow as pa

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    while isinstance(array.type, (pa.ListType, pa.FixedSizeListType, pa.LargeListType)):
        array = array.flatten()
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=dtype)


def _top(row_ids, scores, depth: int) -> list[Hit]:
    """Best first; ties in row order (a build writes documents in source order)."""
    import numpy as np

    order = np.lexsort((row_ids, -scores))[:depth]
    return [Hit(int(row_ids[i]), float(scores[i])) for i in order]


_OPEN: dict[str, Corpus] = {}
_OPEN_LOCK = threading.Lock()
MAX_OPEN = 8


def open_corpus(directory: str | Path) -> Corpus:
    """The corpus at `directory`, opened once per process and kept while it is current."""
    require_extra()
    path, manifest = check_directory(directory)
    key = str(path.resolve())
    with _OPEN_LOCK:
        corpus = _OPEN.get(key)
        if corpus is not None and corpus.is_current():
            return corpus
    corpus = Corpus.load(path, manifest)
    with _OPEN_LOCK:
        _OPEN.pop(key, None)
        _OPEN[key] = corpus
        while len(_OPEN) > MAX_OPEN:
            _OPEN.pop(next(iter(_OPEN)))
    return corpus


def check_backbone(corpus: Corpus, fingerprint: str) -> None:
    """A corpus is chunked by its backbone's tokenizer and holds its UNREAL states: another
    backbone cannot query it."""
    built = corpus.manifest.get("backbone")
    if built and built != fingerprint:
        raise InputError(f"the corpus {corpus.path} was built with backbone {built[:16]}, not this model's "
                         f"{fingerprint[:16]}", "ask with the --model it was built with, or rebuild it with this one")


class CorpusStage:
    """The first stage of an ask over a corpus, in the place of a selector over a chunk list:
    `ranking(question, _, depth)` returns the corpus' top chunks as Scored records."""

    def __init__(self, corpus: Corpus, select: str, context, bm25_candidates: int | None = None,
                 candidates: int = ANN_CANDIDATES):
        """`select`: a concrete method (`default` resolved over a corpus: models/selectors/default.py)."""
        from evsel.models.selectors import corpus_first_stages

        stages = sorted(corpus_first_stages())
        if select not in stages:
            raise EvselError(f"--select {select} cannot read a corpus",
                             f"use --select {', '.join(stages[:-1])} or {stages[-1]} with --corpus "
                             "(any --rerank works on their candidates)")
        if select not in corpus.methods:
            raise InputError(f"the corpus {corpus.path} holds no {select} states (it has: "
                             f"{', '.join(corpus.methods)})", f"use --select {corpus.methods[0]}, or rebuild it "
                             f"with {select} states")
        self.corpus = corpus
        self.name = select
        self.context = context
        self.bm25_candidates = bm25_candidates
        self.candidates = candidates
        self.needs_model = select == "unreal"
        self._unreal = None

    def load(self) -> None:
        if self.name == "dense":
            from evsel.models.selectors.dense import MiniLM

            MiniLM.of(self.context)
        elif self.name == "unreal":
            from evsel.models.selectors.unreal import UnrealSelector

            if self._unreal is None:
                self._unreal = UnrealSelector(self.context)
            self._unreal.load()
            configs = self.corpus.manifest.get("configs") or {}
            wanted = self._unreal.adapter.config.cache_key()
            if configs.get("unreal") and wanted not in str(configs["unreal"]):
                raise InputError(f"the corpus' UNREAL states are {configs['unreal']}, the adapter in use reads "
                                 f"{wanted}", "ask with the adapter it was built with (EVSEL_UNREAL_ADAPTER), or "
                                 "rebuild it")

    def prepare(self, _chunks) -> None:
        pass

    def ranking(self, question: str, _chunks, top_n: int | None = None):
        with self.corpus.reading():
            return self._ranking(question, top_n or 10)

    def _ranking(self, question: str, depth: int):
        from evsel.store.bm25_index import tokenize
        from evsel.models.selectors import Ranking

        if self.name == "bm25":
            hits = self.corpus.bm25(tokenize(question), depth, self.bm25_candidates, question_words(question))
            if not hits:  # no chunk shares a word with the question
                from evsel.models.selectors.bm25 import NO_MATCH

                return Ranking(self.corpus.records(self.corpus.first_rows(depth)), {"no_match": True}, [NO_MATCH])
            return Ranking(self.corpus.records(hits))
        if self.name == "dense":
            from evsel.models.selectors.dense import MiniLM

            query = MiniLM.of(self.context).encode([question])[0]
            return Ranking(self.corpus.records(self.corpus.dense(query, depth, self.candidates)))
        return Ranking(self.corpus.records(self.unreal(question, depth)))

    def unreal(self, question: str, depth: int) -> list[Hit]:
        """Exact MaxSim (the local selector's score) over the multivector search's candidates."""
        import numpy as np
        from evsel.store.bm25_index import tokenize

        self.load()
        selector = self._unreal
        config = selector.adapter.config
        c0 = [s.chunk.text for s in self.corpus.records(self.corpus.bm25(
            tokenize(question), config.c0, self.bm25_candidates, question_words(question)))]
        queries = selector.query.encode_question(question, c0)  # (G, d)
        search = queries
        if config.standardize:
            _, std = (t.detach().float().cpu().numpy() for t in selector.adapter.layer_stats(config.layer))
            search = queries / std  # same order as MaxSim over standardized keys (module doc)
        rows = self.corpus.unreal_candidates(search, max(self.candidates, depth))
        if not rows:
            return []
        keys = selector.query.chunk_keys(self.corpus.unreal_states(rows))
        return _top(np.asarray(rows), np.asarray(selector.query.score_keys(queries, keys), dtype=np.float64), depth)
