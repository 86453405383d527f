"""Every engine request declared once: one frozen dataclass per request, its fields with their
types, defaults, help and which of them are paths (field metadata, read with `spec`).

The Typer commands build their options from these fields (commands/options.py), the daemon's
client checks a request against its declaration before it contacts a daemon and the daemon
checks it again from the same declaration (daemon/checks.py), and the engine takes the request
(`Engine.ask(AskRequest)`). `REQUEST` names them: the `Engine` method each one calls and how the
daemon treats it. This module imports no engine, store or model code, so the client can check a
request at start-up.
"""

import threading
import typing
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Callable, NamedTuple

from .defaults import DEFAULT_CHUNK_TOKENS, DEFAULT_COLLECTION, DEFAULT_SELECT, KINDS, RERANK_TOP, STYLES

__all__ = [
    "RECIPES", "REQUEST", "REQUESTS", "TRAINING_SOURCE_HELP", "AskRequest", "CorpusAddRequest", "CorpusRmRequest",
    "Declaration", "DocsListRequest", "DocsRmRequest", "DocsShowRequest", "EncodeStatesRequest", "EvalRequest",
    "FieldSpec", "IngestRequest", "ModelsInfoRequest", "Output", "Request", "TrainBlocksearchRequest",
    "TrainConvertRequest", "TrainHybridRequest", "TrainQrrankerRequest", "TrainReaderRequest", "TrainUnrealRequest",
    "WatchAddRequest", "WatchListRequest", "WatchRemoveRequest", "fields_of", "methods", "option", "select_help",
    "spec",
]


class FieldSpec(NamedTuple):
    """What a request field means beyond its type and default.

    `help`: its --help text (a callable gives it on first use: the selector registry's);
    `flag`: its option's spelling when not `--` + the field's name with dashes (`--doc` for
    doc_ids, `--encode/--no-encode`); `metavar`: the value's name in help; `choices`: the values
    it takes; `path`: the client makes it absolute where the user typed it (the daemon runs in /);
    `argument`: a positional argument, not an option; `cli`: False for what no option sets (the
    command fills it in). (A named tuple, not a dataclass: one is built per field at import.)"""

    help: str | Callable[[], str] | None = None
    flag: str | None = None
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    path: bool = False
    argument: bool = False
    cli: bool = True

    @property
    def help_text(self) -> str | None:
        return self.help() if callable(self.help) else self.help


def _field(default: Any = MISSING, **meta: Any) -> Any:
    """A request field with its `FieldSpec`."""
    return field(default=default, metadata={"evsel": FieldSpec(**meta)})


# the declarations not yet made dataclasses: {class: its fields as declared}
_UNMADE: dict[type, dict[str, Field]] = {}
# the one being made now, by the thread holding _MAKING: dataclass() reads it while making it
_BEING_MADE: set[type] = set()
_MAKING = threading.RLock()


def _make(declaration: type) -> None:
    """Make a declaration the frozen dataclass it declares, once: a daemon's threads may reach it
    together, and the others wait until it is made. It leaves `_UNMADE` only once made, so a
    thread that finds it gone may build it at once."""
    with _MAKING:
        if declaration not in _UNMADE or declaration in _BEING_MADE:
            return
        _BEING_MADE.add(declaration)
        try:
            for name, declared_field in _UNMADE[declaration].items():
                setattr(declaration, name, declared_field)
            dataclass(frozen=True)(declaration)
            del _UNMADE[declaration]
        finally:
            _BEING_MADE.discard(declaration)


class _Declared(type):
    """The declarations' type: `dataclasses.fields`, `is_dataclass` and the like make one first."""

    def __getattr__(cls, name: str):
        if name.startswith("__dataclass_") and cls in _UNMADE:
            _make(cls)
            if cls not in _UNMADE:
                return getattr(cls, name)
        raise AttributeError(f"type object {cls.__name__!r} has no attribute {name!r}")


class Declaration(metaclass=_Declared):
    """A request declaration: a frozen dataclass, made one on first use (built, or read by
    `dataclasses.fields`). dataclass() writes and compiles each class's methods: for every request
    at import that took longer than all other evsel modules a forwarded `ask` imports, and it uses
    two of the requests. Until it is made a field's class attribute is its default, as a dataclass's."""

    __slots__ = ()

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        annotated = vars(cls).get("__annotations__", {})
        declared = {name: value for name, value in vars(cls).items()
                    if name in annotated and isinstance(value, Field)}
        for name, declared_field in declared.items():
            if declared_field.default is MISSING:
                delattr(cls, name)
            else:
                setattr(cls, name, declared_field.default)
        _UNMADE[cls] = declared

    def __new__(cls, *args: Any, **kwargs: Any):
        if cls in _UNMADE:
            _make(cls)
        return super().__new__(cls)


def spec(request: type, name: str) -> FieldSpec:
    """The `FieldSpec` of a request class's field (read from a declaration without making it)."""
    declared = _UNMADE.get(request) or {}
    if name not in declared:
        declared = {f.name: f for f in fields(request)}
    if name not in declared:
        raise KeyError(f"{request.__name__} has no field {name!r}")
    return declared[name].metadata.get("evsel", FieldSpec())


def option(request: type, name: str) -> str:
    """The command-line spelling of a request field: its declared flag, or `--` and the field's
    name with dashes (`--top-n` for top_n)."""
    return spec(request, name).flag or "--" + name.replace("_", "-")


def fields_of(request) -> dict:
    """{field: value} of a request (the params sent for it; lists stay the request's own)."""
    return {f.name: getattr(request, f.name) for f in fields(request)}


def select_help() -> str:
    """`--select`'s help text, from the selector registry."""
    from evsel.models.selectors import select_help as help_text

    return help_text()


def methods() -> list[tuple[str, str]]:
    """What `select`/`rerank` accept: every method with what it does (the selector registry's)."""
    from evsel.models.selectors import listing

    return listing()


_CHUNK_TOKENS_HELP = "Target chunk size in backbone tokens."


class IngestRequest(Declaration):
    targets: list[str] = _field(path=True, argument=True, metavar="PATHS...")
    collection: str = _field(DEFAULT_COLLECTION, metavar="NAME", help="Collection to add the documents to.")
    kind: str = _field("auto", choices=KINDS, help="How to read the files: auto picks by extension and content.")
    chunk_tokens: int = _field(DEFAULT_CHUNK_TOKENS, help=_CHUNK_TOKENS_HELP)
    encode: bool | None = _field(
        None, flag="--encode/--no-encode",
        help="Compute the chunks' UNREAL states now, so the first ask needs no encoding "
             "(default: on; env EVSEL_ENCODE=0 turns it off).")
    resolve_links: bool = _field(True, cli=False)
    summaries: bool = _field(
        False, help="Also write the summaries QRRanker's --memory reads (one per 20 chunks, or per dialogue "
                    "session; by the backbone; in the daemon, in the background).")


class EncodeStatesRequest(Declaration):
    doc_ids: list[int] | None = _field(None, cli=False)
    batch: int = _field(64, cli=False)
    states: bool = _field(True, cli=False)
    summaries: bool = _field(False, cli=False)
    slice_s: float | None = _field(None, cli=False)


class AskRequest(Declaration):
    question: str = _field(argument=True)
    doc_ids: list[int] | None = _field(None, flag="--doc", metavar="ID",
                                       help="Ask about this document only (repeatable). See: evsel docs list.")
    collection: str | None = _field(None, metavar="NAME", help="Restrict to one collection.")
    top_n: int = _field(5, help="How many evidence passages to use.")
    select: str = _field(DEFAULT_SELECT, metavar="METHOD", help=select_help)
    evidence_only: bool = _field(False, help="Print the evidence without generating an answer.")
    max_new_tokens: int = _field(96, help="Longest answer, in tokens.")
    rerank: str | None = _field(
        None, metavar="METHOD",
        help="Rerank the first stage's top candidates with this selector (any --select method).")
    rerank_top: int = _field(RERANK_TOP, metavar="N", help="How many first-stage candidates the reranker re-scores.")
    style: str = _field(
        "short", choices=STYLES,
        help="short: a short answer grounded in one evidence sentence, or none when the evidence does not "
             "support one; span: always the exact evidence text; sentence: free-form from all passages.")
    memory: bool = _field(
        False, help="With --rerank qrranker: give the reranker the summaries of the blocks (or dialogue "
                    "sessions) holding its candidates, up to 512 tokens; missing ones are written first "
                    "(see ingest --summaries).")
    corpus: str | None = _field(
        None, path=True, metavar="DIR",
        help="Ask a corpus built by evsel corpus build instead of the local store: its full-text and "
             "vector indexes give the first stage (--select bm25, dense or unreal); reranking and the "
             "answer run here.")


class EvalRequest(Declaration):
    dataset: str = _field(argument=True)
    methods: list[str] = _field(
        metavar="LIST",
        help="Comma-separated methods: any selector (bm25, dense, random, ...), rrf:OTHER (BM25 fused "
             "with OTHER), FIRST>RERANKER (e.g. bm25>qrranker, bm25>qrranker:untrained, bm25>qrranker:memory), "
             "full (whole document to the generator; needs --generate), or oracle (the gold evidence itself: "
             "what the answer step makes of perfect selection; needs --generate).")
    ks: list[int] | None = _field(None, flag="--k", metavar="LIST", help="Cut-offs for recall@k.")
    generate: bool = _field(False, help="Also answer each question with the backbone and score the answers.")
    limit: int | None = _field(None, metavar="N", help="Evaluate N questions, evenly spaced over the dataset.")
    split: str | None = _field(None, metavar="NAME", help="FairytaleQA split: val (default) or train.")
    concat: int = _field(
        0, metavar="N", help="FairytaleQA: join every N stories into one long document (0: each story alone).")
    fold: int | None = _field(
        None, metavar="N",
        help="LoCoMo, MuSiQue, HotpotQA: only fold 1 or 2 of the fixed cross-fold split (train on one, "
             "evaluate on the other).")
    data_dir: str | None = _field(
        None, path=True,
        help="Folder with the benchmark data (env EVSEL_DATA; default ../shared/data beside the checkout).")
    top_n: int = _field(5, help="Passages given to the generator.")
    chunk_tokens: int = _field(DEFAULT_CHUNK_TOKENS, help=_CHUNK_TOKENS_HELP)
    max_new_tokens: int = _field(32, help="Longest answer, in tokens.")
    per_question: bool = _field(False, help="Include every question's record in the --json output.")
    rerank_top: int = _field(RERANK_TOP, metavar="N",
                             help="How many first-stage candidates a FIRST>RERANKER method re-scores.")
    answer_style: str = _field(
        "short",
        help="With --generate: the answer step, as evsel ask --style (short, rules, span, sentence); several, "
             "comma-separated, answer each method's evidence with each (rows 'METHOD [STYLE]').")
    memory: bool = _field(
        False, help="Every FIRST>qrranker method reads its candidates' summaries (as qrranker:memory); "
                    "missing summaries are written into eval's own cache first.")
    reader: str | None = _field(
        None, path=True, metavar="DIR",
        help="The reader of --answer-style short: a folder written by evsel train reader (default: the "
             "model's shipped one).")


# the train requests: the commands gather their many recipe options into `options` (a dict the
# recipe's config reads) and record the command line in `command`
RECIPES = ("smoke", "full")
TRAINING_SOURCE_HELP = ("Training source (repeatable): fairytaleqa-train (default); locomo, musique or hotpotqa with "
                        "--fold (their questions are evaluation questions). FairytaleQA val is refused.")


class TrainConvertRequest(Declaration):
    out: str = _field(path=True, help="Folder to write.")
    options: dict = _field(cli=False)
    data_dir: str | None = _field(None, path=True,
                                  help="Folder with the benchmark data (default: ../shared/data or $EVSEL_DATA).")


class TrainUnrealRequest(Declaration):
    out: str = _field(path=True, help="Run folder: checkpoint/ (resumable), best/ (adapter), log.jsonl, config.json.")
    recipe_name: str = _field(
        "full", flag="--recipe", choices=RECIPES,
        help="smoke: minutes on a CPU, proves the path; full: the shipped adapter's settings.")
    data: str | None = _field(
        None, path=True, help="Training folder from `evsel train convert` (default: OUT/data, converted first).")
    sources: list[str] | None = _field(None, flag="--source",
                                       help=TRAINING_SOURCE_HELP + " Used when OUT/data is converted.")
    options: dict | None = _field(None, cli=False)
    command: str | None = _field(None, cli=False)


class TrainQrrankerRequest(Declaration):
    out: str = _field(
        path=True,
        help="Folder to write: heads.json (with --detect-heads); else the trained adapter "
             "(adapter.safetensors beside heads.json, metrics.json), checkpoint/ (resumable), log.jsonl.")
    detect_heads: bool = _field(
        False, help="Detect QR heads: every head's QR score on a seed set, the top ones kept.")
    options: dict | None = _field(None, cli=False)
    command: str | None = _field(None, cli=False)
    recipe_name: str = _field(
        "full", flag="--recipe", choices=RECIPES,
        help="Training: smoke (minutes on a CPU, proves the path) or full (docs/QRRANKER.md's run).")


class TrainBlocksearchRequest(Declaration):
    out: str = _field(
        path=True,
        help="Folder to write: the decoder adapter (adapter.safetensors, the best by dev recall@1), "
             "metrics.json, checkpoint/ (resumable), log.jsonl.")
    options: dict | None = _field(None, cli=False)
    command: str | None = _field(None, cli=False)
    recipe_name: str = _field(
        "full", flag="--recipe", choices=RECIPES,
        help="smoke (a minute on a CPU, proves the path) or full (docs/BLOCKSEARCH.md's run).")


class TrainHybridRequest(Declaration):
    out: str = _field(
        path=True,
        help="Folder to write: hybrid.json (the weight sets, dev metrics, ablation, the default they "
             "imply, this command), features/ (the signals per question, reused by a rerun).")
    options: dict | None = _field(None, cli=False)
    command: str | None = _field(None, cli=False)
    recipe_name: str = _field(
        "full", flag="--recipe", choices=RECIPES,
        help="smoke (a few questions, proves the path) or full (docs/FUSION.md's run).")


class TrainReaderRequest(Declaration):
    out: str = _field(
        path=True,
        help="Folder to write: the span head (adapter.safetensors, the best by dev F1, and reader.json: "
             "what it was trained on, its dev F1, its abstention threshold), states/ (the backbone's "
             "states of every example, reused by a rerun), checkpoint/ (resumable), log.jsonl.")
    options: dict | None = _field(None, cli=False)
    command: str | None = _field(None, cli=False)
    recipe_name: str = _field(
        "full", flag="--recipe", choices=RECIPES,
        help="smoke (a minute on a CPU, proves the path) or full (docs/ANSWERS.md's run).")


class DocsListRequest(Declaration):
    collection: str | None = _field(None, metavar="NAME", help="Restrict to one collection.")


class DocsShowRequest(Declaration):
    doc_id: int = _field(argument=True, metavar="ID")
    with_chunks: bool = _field(False, flag="--chunks", help="Include every chunk with its provenance.")


class DocsRmRequest(Declaration):
    doc_ids: list[int] = _field(argument=True, metavar="ID...")


class WatchAddRequest(Declaration):
    path: str = _field(path=True, argument=True)
    collection: str = _field(DEFAULT_COLLECTION, metavar="NAME", help="Collection the folder's documents go to.")


class WatchRemoveRequest(Declaration):
    path: str = _field(path=True, flag="--remove", metavar="DIR",
                       help="Stop watching DIR (its documents stay; remove them with evsel docs rm).")


class WatchListRequest(Declaration):
    pass


class ModelsInfoRequest(Declaration):
    load: bool = _field(True, cli=False)


class CorpusAddRequest(Declaration):
    corpus: str = _field(path=True, argument=True, metavar="DIR", help="A corpus directory (evsel corpus build --out).")
    targets: list[str] = _field(path=True, argument=True, metavar="FILES...", help="Files or folders to add.")


class CorpusRmRequest(Declaration):
    corpus: str = _field(path=True, argument=True, metavar="DIR", help="A corpus directory (evsel corpus build --out).")
    docs: list[str] = _field(
        argument=True, metavar="DOC...",
        help="Documents by doc_path or sha256 (the first 12 digits ask --corpus shows will do).")


class Output(Declaration):
    """How a command prints its reply: an option of the commands, not of any request."""

    as_json: bool = _field(False, flag="--json", help="Print one JSON document on stdout.")


class Request(NamedTuple):
    """One engine request: its name (the `Engine` method it calls), its declaration, whether the
    daemon answers it at once on the connection's own thread (`fast`: it never waits behind model
    work), and whether it may run beside model work when its method needs no model (`light`: an
    evidence-only ask with a light selector). (A named tuple: one is built per request at import.)"""

    name: str
    declaration: type
    fast: bool = False
    light: bool = False

    @property
    def fields(self) -> tuple:
        return fields(self.declaration)

    @property
    def paths(self) -> tuple[str, ...]:
        """The fields that hold paths (absolute on the wire)."""
        return tuple(f.name for f in self.fields if f.metadata.get("evsel", FieldSpec()).path)

    @property
    def required(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.default is MISSING and f.default_factory is MISSING)

    def defaults(self) -> dict:
        """{field: default} for every field that has one."""
        return {f.name: f.default for f in self.fields if f.default is not MISSING}

    @property
    def types(self) -> dict:
        """{field: type}, the annotations resolved."""
        return typing.get_type_hints(self.declaration)


# The engine methods a client may call (the daemon's requests; `DaemonClient` proxies these).
REQUEST: dict[str, Request] = {r.name: r for r in (
    Request("ingest", IngestRequest),
    Request("encode_states", EncodeStatesRequest),
    Request("ask", AskRequest, light=True),
    Request("docs_list", DocsListRequest, fast=True),
    Request("docs_show", DocsShowRequest, fast=True),
    Request("docs_rm", DocsRmRequest, fast=True),
    Request("models_info", ModelsInfoRequest),
    Request("eval", EvalRequest),
    Request("train_convert", TrainConvertRequest),
    Request("train_unreal", TrainUnrealRequest),
    Request("train_qrranker", TrainQrrankerRequest),
    Request("train_blocksearch", TrainBlocksearchRequest),
    Request("train_hybrid", TrainHybridRequest),
    Request("train_reader", TrainReaderRequest),
    Request("watch_add", WatchAddRequest, fast=True),
    Request("watch_remove", WatchRemoveRequest, fast=True),
    Request("watch_list", WatchListRequest, fast=True),
    Request("corpus_add", CorpusAddRequest),
    Request("corpus_rm", CorpusRmRequest),
)}
REQUESTS = tuple(REQUEST)
