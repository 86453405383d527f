"""The checks a request passes before anything is queued, all read from its declaration
(evsel.requests): the client runs them before it contacts (or starts) a daemon, so a bad option
fails at once, and the daemon runs them again on every request it gets (a client of another
version, or anything else that writes to the socket)."""

from __future__ import annotations

import json
import os

from evsel.defaults import DEFAULT_SELECT
from evsel.errors import EvselError, InputError
from evsel.requests import REQUEST


def _conforms(value, tp) -> bool:
    """Does a JSON value fit a field's type (the request's declaration)?"""
    import types
    import typing

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is typing.Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if tp is type(None):
        return value is None
    if origin is list or tp is list:
        return isinstance(value, list) and (not args or all(_conforms(v, args[0]) for v in value))
    if origin is dict or tp is dict:
        return isinstance(value, dict)
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp is str:
        return isinstance(value, str)
    return True  # nothing a client can send (callbacks are refused by name)


def _describe(tp) -> str:
    import types
    import typing

    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if tp is type(None):
        return "null"
    if origin is list:
        return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s" if args else "a list"
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", dict: "an object"}
    return names.get(origin or tp, getattr(tp, "__name__", str(tp)))


def json_type(value) -> str:
    for kind, name in ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
                       (list, "a list"), (dict, "an object"), (type(None), "null")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


_OTHER_VERSION = "a client of another evsel version? run: evsel daemon stop"


def check_params(method: str, params: dict) -> dict | None:
    """The error reply for params a request's declaration does not take (unknown or missing
    names, a value of the wrong type, a relative path), or None. Checked before anything runs or
    is queued."""
    request = REQUEST.get(method)
    if request is None:
        return {"type": "EvselError", "message": f"the daemon has no request named {method!r}", "hint": _OTHER_VERSION}
    try:
        check_names(method, params)
    except EvselError as exc:
        return exc.to_dict()
    hints = request.types
    for name, value in params.items():
        if not _conforms(value, hints[name]):
            shown = json.dumps(value, ensure_ascii=False, default=str)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            return EvselError(f"bad request for {method}: {name} must be {_describe(hints[name])}, "
                              f"not {json_type(value)} ({shown})", _OTHER_VERSION).to_dict()
    try:
        check_methods(method, params)
        if isinstance(params.get("collection"), str):  # before the journal or a store binds it
            from evsel.store.store import check_collection_name

            check_collection_name(params["collection"])
    except EvselError as exc:
        return exc.to_dict()
    names = request.paths  # the client made them absolute where the user typed them; the daemon runs in /
    dataset = params.get("dataset") if method == "eval" else None
    if isinstance(dataset, str) and (dataset.endswith(".jsonl") or os.sep in dataset):
        names = (*names, "dataset")
    for name in names:
        value = params.get(name)
        for item in value if isinstance(value, list) else [value]:
            if item is None:
                continue
            if not isinstance(item, str) or not os.path.isabs(item):
                what = "must hold absolute paths only" if isinstance(value, list) else "must be an absolute path"
                return InputError(f"bad request for {method}: {name} {what}, not {item!r}",
                                  "the client resolves paths where they were typed; a client of another evsel "
                                  "version? run: evsel daemon stop").to_dict()
    return None


def check_names(method: str, params: dict) -> None:
    """Raise unless `params` names only the request's fields and every field it requires."""
    if "on_event" in params:
        raise EvselError("on_event cannot be sent; the daemon streams events itself")
    request = REQUEST[method]
    known = {f.name for f in request.fields}
    unknown = [name for name in params if name not in known]
    missing = [name for name in request.required if name not in params]
    if unknown:
        raise EvselError(f"bad request for {method}: got an unexpected field {unknown[0]!r}", _OTHER_VERSION)
    if missing:
        raise EvselError(f"bad request for {method}: missing a required field {missing[0]!r}", _OTHER_VERSION)


# eval's own rows, which build no selector (evaluation/runner.py's EVAL_ROWS)
EVAL_ONLY_ROWS = ("full", "oracle")


def check_methods(method: str, params: dict) -> None:
    """Raise for an ask whose --select/--rerank/--memory, or an eval whose --methods, no selector
    takes (the checks the engine runs when it builds the selectors, without building anything)."""
    if method not in ("ask", "eval"):
        return
    if method == "ask" and params.get("select") in (None, DEFAULT_SELECT) and not params.get("rerank") \
            and not params.get("memory"):
        return  # the default needs no selector's check: a plain ask starts without the registry
    from evsel.models.selectors import MethodSpec, check_stage  # the registry: not for other requests

    if method == "ask":
        select, rerank = params.get("select") or DEFAULT_SELECT, params.get("rerank")
        if not isinstance(select, str) or not isinstance(rerank, (str, type(None))):
            return  # the type checks report it
        specs = [MethodSpec.of(select, rerank)]
    else:
        methods = params.get("methods")
        if not isinstance(methods, list) or not all(isinstance(m, str) for m in methods):
            return
        specs = [MethodSpec.parse(m) for m in methods if m not in EVAL_ONLY_ROWS]
    for spec in specs:
        for stage in (spec.first, spec.rerank):
            if stage is not None:
                check_stage(stage)
    if method == "ask" and params.get("memory"):
        specs[0].with_memory()
