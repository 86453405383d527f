"""One settings object per request: CLI options, then EVSEL_* variables, then defaults.

This is the only module that reads evsel's environment variables. The CLI resolves a `Settings`
once (in the client's working directory, so relative paths are made absolute here) and passes it
down; the daemon receives it as plain data with the request and hands it to the engine, so nothing
deeper in the stack looks at `os.environ` and the daemon never swaps its environment or directory.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Mapping

from .errors import EvselError

TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
DEVICES = ("auto", "cpu", "cuda")


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in TRUE:
        return True
    if raw in FALSE:
        return False
    raise EvselError(f"{name}={env[name]!r} is not a yes/no value", f"set {name}=1 or {name}=0, or unset it")


def _absolute(value: str | None, cwd: Path) -> str | None:
    if not value:
        return None
    path = Path(value).expanduser()
    return str(path if path.is_absolute() else cwd / path)


def _heads_or_path(value: str | None, cwd: Path) -> str | None:
    """A head list like 14-3,17-0 as given, else a path made absolute."""
    import re

    if value and re.fullmatch(r"\s*\d+-\d+\s*(,\s*\d+-\d+\s*)*", value):
        return value.strip()
    return _absolute(value, cwd)


def _threads(env: Mapping[str, str]) -> int | None:
    raw = env.get("EVSEL_THREADS", "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise EvselError(f"EVSEL_THREADS={raw!r} is not a positive whole number",
                         "unset it or set e.g. EVSEL_THREADS=1")
    return int(raw)


def _count(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise EvselError(f"{name}={raw!r} is not a positive whole number", f"unset it or set e.g. {name}=1000")
    return int(raw)


PDF_READERS = ("tables", "finder", "plain")


def _pdf_reader(env: Mapping[str, str]) -> str:
    raw = env.get("EVSEL_PDF_READER", "").strip().lower() or "tables"
    if raw not in PDF_READERS:
        raise EvselError(f"EVSEL_PDF_READER={raw!r} is not one of {', '.join(PDF_READERS)}",
                         "set EVSEL_PDF_READER=tables (the default), finder or plain, or unset it")
    return raw


# the variables that choose what a run computes with (threads, model, adapters, weights, PDF
# reader): a run's record names those set beside its command (evaluation/report.py)
RUN_VARIABLES = ("EVSEL_THREADS", "EVSEL_MODEL", "EVSEL_QRRANKER_HEADS", "EVSEL_UNREAL_ADAPTER", "EVSEL_HYBRID_WEIGHTS",
                 "EVSEL_BLOCKSEARCH_DECODER", "EVSEL_BLOCKSEARCH_ROUTER", "EVSEL_PDF_READER")


@dataclass(frozen=True)
class Settings:
    """What one request runs with. Paths are absolute (resolved where the user typed them)."""

    model: str | None = None  # --model / EVSEL_MODEL; None: the bundled SmolLM2
    model_as_given: str | None = None  # for error messages: the path exactly as typed
    device: str = "auto"  # --device / EVSEL_DEVICE
    no_daemon: bool = False  # --no-daemon / EVSEL_NO_DAEMON
    encode: bool = True  # EVSEL_ENCODE: per-chunk model states at ingest (in the daemon: in the background)
    threads: int | None = None  # EVSEL_THREADS: torch CPU threads where the model runs
    unreal_adapter: str | None = None  # EVSEL_UNREAL_ADAPTER: an adapter folder instead of the shipped one
    # EVSEL_QRRANKER_HEADS: a head list (14-3,17-0) or a heads.json / its folder; a trained adapter
    # (adapter.safetensors from `evsel train qrranker`) beside that heads.json is used with it
    qrranker_heads: str | None = None
    # EVSEL_QRRANKER_KV: QRRanker's per-chunk block KV kept in files beside the store, computed in
    # the background after an ingest (with EVSEL_ENCODE), so a document's first rerank encodes
    # nothing; on by default (about 5.3 KiB a token), EVSEL_QRRANKER_KV=0 turns it off
    qrranker_kv: bool = True
    # EVSEL_QRRANKER_KV_MAX_MB: the cap of those files in all (least recently read deleted first)
    qrranker_kv_max_mb: int = 4096
    hybrid_weights: str | None = None  # EVSEL_HYBRID_WEIGHTS: a hybrid.json (or its folder) instead of the shipped one
    # EVSEL_BLOCKSEARCH_DECODER: a folder from `evsel train blocksearch` instead of the shipped decoder
    blocksearch_decoder: str | None = None
    # EVSEL_BLOCKSEARCH_ROUTER: a folder from `evsel train blocksearch --router` instead of the shipped router
    blocksearch_router: str | None = None
    data_dir: str | None = None  # EVSEL_DATA: benchmark data for eval and train
    # EVSEL_CORPUS_BM25_CANDIDATES: ask --corpus rescores only the full-text index's top N matches
    # for BM25 (None: every match, the local store's exact top-n)
    corpus_bm25_candidates: int | None = None
    debug: bool = False  # EVSEL_DEBUG: tracebacks instead of one-line errors
    # EVSEL_PDF_READER: "tables" (reading order, running lines dropped, tables as rows with their
    # headers), "finder" (the same, tables located by pymupdf's table finder: slower) or "plain"
    # (each page's text as extracted: the reader before tables, kept to compare)
    pdf_reader: str = "tables"

    @classmethod
    def resolve(cls, *, model: str | None = None, device: str | None = None, no_daemon: bool | None = None,
                env: Mapping[str, str] | None = None, cwd: str | Path | None = None) -> "Settings":
        """CLI options (None: not given) over the environment over defaults."""
        env = os.environ if env is None else env
        if cwd is None:
            try:
                cwd = os.getcwd()
            except OSError:  # the directory was deleted under us
                cwd = "/"
        cwd = Path(cwd)
        model = model or env.get("EVSEL_MODEL") or None
        device = (device or env.get("EVSEL_DEVICE") or "auto").strip().lower()
        if device not in DEVICES:
            raise EvselError(f"device {device!r} is not one of {', '.join(DEVICES)}",
                             "use --device auto|cpu|cuda (or EVSEL_DEVICE)")
        return cls(
            model=_absolute(model, cwd),
            model_as_given=model,
            device=device,
            no_daemon=_flag(env, "EVSEL_NO_DAEMON", False) if no_daemon is None else bool(no_daemon),
            encode=_flag(env, "EVSEL_ENCODE", True),
            threads=_threads(env),
            unreal_adapter=_absolute(env.get("EVSEL_UNREAL_ADAPTER"), cwd),
            qrranker_heads=_heads_or_path(env.get("EVSEL_QRRANKER_HEADS"), cwd),
            qrranker_kv=_flag(env, "EVSEL_QRRANKER_KV", True),
            qrranker_kv_max_mb=_count(env, "EVSEL_QRRANKER_KV_MAX_MB") or 4096,
            hybrid_weights=_absolute(env.get("EVSEL_HYBRID_WEIGHTS"), cwd),
            blocksearch_decoder=_absolute(env.get("EVSEL_BLOCKSEARCH_DECODER"), cwd),
            blocksearch_router=_absolute(env.get("EVSEL_BLOCKSEARCH_ROUTER"), cwd),
            data_dir=_absolute(env.get("EVSEL_DATA"), cwd),
            corpus_bm25_candidates=_count(env, "EVSEL_CORPUS_BM25_CANDIDATES"),
            debug=_flag(env, "EVSEL_DEBUG", False),
            pdf_reader=_pdf_reader(env),
        )

    def encode_at_ingest(self, requested: bool | None = None) -> bool:
        """Whether an ingest computes its chunks' states: --encode/--no-encode when given (not
        None), else EVSEL_ENCODE. The one place that default is decided."""
        return self.encode if requested is None else bool(requested)

    def with_(self, **changes) -> "Settings":
        return replace(self, **changes)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping | None) -> "Settings":
        """From a request's plain data; unknown keys (a newer client) are an error, not ignored."""
        data = dict(data or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise EvselError(f"unknown settings {', '.join(unknown)}",
                             "a client of another evsel version? run: evsel daemon stop")
        return cls(**data)


def evsel_home(env: Mapping[str, str] | None = None) -> Path | None:
    """$EVSEL_HOME as given (None: unset). The home is the process's, not a request's: one daemon
    serves one home."""
    env = os.environ if env is None else env
    raw = env.get("EVSEL_HOME")
    return Path(raw).expanduser() if raw else None


def model_cache(env: Mapping[str, str] | None = None) -> Path | None:
    """$EVSEL_MODEL_CACHE as given (None: unset)."""
    env = os.environ if env is None else env
    raw = env.get("EVSEL_MODEL_CACHE")
    return Path(raw).expanduser() if raw else None


def debug(env: Mapping[str, str] | None = None) -> bool:
    """$EVSEL_DEBUG, for the top-level error handler (before any Settings exists)."""
    env = os.environ if env is None else env
    return env.get("EVSEL_DEBUG", "").strip().lower() not in ("", *FALSE)


def variables_named(names: tuple[str, ...], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables among `names` that are set (and not empty), in that order: what a run
    records of the settings that chose its model and adapters (eval's report)."""
    env = os.environ if env is None else env
    return {name: env[name] for name in names if env.get(name)}


def variables_prefixed(prefixes: tuple[str, ...], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every variable starting with one of `prefixes`: what worker processes (corpus build's Ray
    workers) resolve their own Settings from."""
    env = os.environ if env is None else env
    return {k: v for k, v in env.items() if k.startswith(prefixes)}


GENERATORS = ("auto", "transformers", "llama-cpp")


def generator_backend(value: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """`value`, else $EVSEL_GENERATOR, else auto: which backend generates answers. About the
    process, like the model it belongs to (the daemon's: set it before the daemon starts)."""
    env = os.environ if env is None else env
    raw = (value or env.get("EVSEL_GENERATOR") or "auto").strip().lower().replace("_", "-")
    if raw == "llama.cpp" or raw == "llamacpp":
        raw = "llama-cpp"
    if raw not in GENERATORS:
        raise EvselError(f"EVSEL_GENERATOR={raw!r} is not one of {', '.join(GENERATORS)}",
                         "set EVSEL_GENERATOR=auto (llama.cpp where it is faster), transformers or llama-cpp")
    return raw


# The daemon's own variables: about the process, not a request.
def daemon_idle_timeout(default: float, env: Mapping[str, str] | None = None) -> float:
    """$EVSEL_DAEMON_IDLE: seconds without work before the daemon exits (0: never)."""
    return _seconds(env, "EVSEL_DAEMON_IDLE", default)


def daemon_start_timeout(env: Mapping[str, str] | None = None) -> float:
    """$EVSEL_DAEMON_START_TIMEOUT: how long a client waits for a daemon it started."""
    return _seconds(env, "EVSEL_DAEMON_START_TIMEOUT", 120.0)


def watch_debounce(env: Mapping[str, str] | None = None) -> float:
    """$EVSEL_WATCH_DEBOUNCE: quiet seconds before a changed watched file is ingested."""
    return _seconds(env, "EVSEL_WATCH_DEBOUNCE", 1.0)


def daemon_max_clients(env: Mapping[str, str] | None = None) -> tuple[int, str | None]:
    """$EVSEL_DAEMON_MAX_CLIENTS: connections the daemon serves at once (1024; the tests set fewer).
    Returns it and, when the variable is not a number, the warning the daemon logs."""
    value, warning = _lenient_number(env, "EVSEL_DAEMON_MAX_CLIENTS", 1024)
    return int(value), warning


def daemon_client_idle(env: Mapping[str, str] | None = None) -> tuple[float, str | None]:
    """$EVSEL_DAEMON_CLIENT_IDLE: seconds a connection may stay silent between requests before the
    daemon closes it (600; 0: never). Returns it and, when not a number, the warning to log."""
    return _lenient_number(env, "EVSEL_DAEMON_CLIENT_IDLE", 600.0)


def _lenient_number(env: Mapping[str, str] | None, name: str, default: float) -> tuple[float, str | None]:
    """A running daemon does not stop for a bad limit: it keeps the default and says so."""
    env = os.environ if env is None else env
    try:
        return float(env.get(name) or default), None
    except ValueError:
        return default, f"{name}={env.get(name)!r} is not a number; using {default:g}"


def daemon_build_tag(env: Mapping[str, str] | None = None) -> str | None:
    """$EVSEL_DAEMON_BUILD: replaces the source digest in the build id (tests pin it)."""
    env = os.environ if env is None else env
    return env.get("EVSEL_DAEMON_BUILD") or None


def _seconds(env: Mapping[str, str] | None, name: str, default: float) -> float:
    env = os.environ if env is None else env
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise EvselError(f"{name}={raw!r} is not a number of seconds", f"set e.g. {name}=30, or unset it") from None
    if value < 0:
        raise EvselError(f"{name}={raw!r} is negative", f"set e.g. {name}=30, or unset it")
    return value
