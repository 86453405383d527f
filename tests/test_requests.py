"""The request declarations (evsel/requests.py) are the one definition of the engine's requests:
the daemon's checks, the client's path resolution, the protocol's fast requests and the Typer
options all come from them (the engine's side: test_startup_imports.py)."""

from __future__ import annotations

import dataclasses

import pytest

from evsel.requests import (REQUEST, REQUESTS, AskRequest, CorpusAddRequest, CorpusRmRequest, DocsListRequest,
                            DocsRmRequest, DocsShowRequest, EvalRequest, FieldSpec, IngestRequest, Request,
                            WatchAddRequest, WatchRemoveRequest, spec)


def test_every_request_is_a_frozen_declaration_with_its_paths_among_its_fields():
    assert list(REQUEST) == list(REQUESTS)
    for request in REQUEST.values():
        assert dataclasses.is_dataclass(request.declaration), request.name
        assert request.declaration.__dataclass_params__.frozen, request.name
        names = [f.name for f in request.fields]
        assert set(request.paths) <= set(names) and set(request.types) == set(names), request.name
        for name in names:
            assert isinstance(spec(request.declaration, name), FieldSpec), (request.name, name)


def test_a_declaration_becomes_its_dataclass_on_first_use_in_any_thread():
    """Declarations are made dataclasses when first built or read by `dataclasses.fields`, once,
    whichever of a daemon's threads gets there first; until then they read as the dataclass would."""
    from concurrent.futures import ThreadPoolExecutor

    from evsel.requests import Declaration

    def declare():
        class Probe(Declaration):
            name: str = dataclasses.field(metadata={"evsel": FieldSpec(argument=True)})
            top_n: int = dataclasses.field(default=5, metadata={"evsel": FieldSpec(help="How many.")})

        return Probe

    built, read = declare(), declare()
    assert built.top_n == 5 and spec(built, "top_n").help == "How many."
    assert "__dataclass_fields__" not in vars(built)  # read so far without making it
    with ThreadPoolExecutor(8) as pool:
        made = list(pool.map(lambda i: built(str(i)), range(64)))
    assert [p.name for p in made] == [str(i) for i in range(64)] and made[3] == built("3", top_n=5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made[0].top_n = 1  # type: ignore[misc]
    assert dataclasses.is_dataclass(read) and [f.name for f in dataclasses.fields(read)] == ["name", "top_n"]
    assert dataclasses.fields(read)[1].metadata["evsel"].help == "How many."


def test_the_ask_request_holds_the_engines_fields_and_defaults():
    from evsel.defaults import DEFAULT_SELECT, RERANK_TOP

    assert AskRequest("q") == AskRequest(
        question="q", doc_ids=None, collection=None, top_n=5, select=DEFAULT_SELECT, evidence_only=False,
        max_new_tokens=96, rerank=None, rerank_top=RERANK_TOP, style="short", memory=False, corpus=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        AskRequest("q").top_n = 3  # type: ignore[misc]


def test_the_protocol_derives_its_fast_requests_from_the_declarations():
    from evsel.daemon.protocol import DAEMON_METHODS, FAST_METHODS

    assert FAST_METHODS - DAEMON_METHODS == {name for name, r in REQUEST.items() if r.fast}
    assert not {name for name, r in REQUEST.items() if r.fast and r.light}  # fast ones never queue


def test_the_checks_and_the_client_follow_the_declared_paths(tmp_path):
    from evsel.daemon.checks import check_params
    from evsel.daemon.client import resolve_paths

    @dataclasses.dataclass(frozen=True)
    class CollectionAsPath:  # a request whose `collection` were a path: the check follows the declaration
        path: str = dataclasses.field(metadata={"evsel": FieldSpec(path=True)})
        collection: str = dataclasses.field(default="default", metadata={"evsel": FieldSpec(path=True)})

    declared = REQUEST["watch_add"]
    try:
        REQUEST["watch_add"] = Request("watch_add", CollectionAsPath, fast=True)
        error = check_params("watch_add", {"path": str(tmp_path), "collection": "relative"})
        assert error is not None and "collection must be an absolute path" in error["message"]
        resolved = resolve_paths("watch_add", {"path": "here", "collection": "relative"})
        assert resolved["collection"].endswith("/relative") and resolved["collection"].startswith("/")
    finally:
        REQUEST["watch_add"] = declared
    assert REQUEST["watch_add"].declaration is WatchAddRequest
    assert check_params("watch_add", {"path": str(tmp_path), "collection": "relative"}) is None


def test_the_checks_name_unknown_missing_and_mistyped_fields():
    from evsel.daemon.checks import check_params

    assert "unexpected field 'bogus'" in check_params("ask", {"question": "q", "bogus": 1})["message"]
    assert "missing a required field 'question'" in check_params("ask", {})["message"]
    assert "top_n must be an integer" in check_params("ask", {"question": "q", "top_n": 2.5})["message"]
    assert "on_event cannot be sent" in check_params("ask", {"question": "q", "on_event": 1})["message"]
    assert "no request named" in check_params("nosuch", {})["message"]
    assert check_params("ask", dataclasses.asdict(AskRequest("q"))) is None


def test_the_typer_options_come_from_the_declarations():
    """Each option and argument of a command that is a request field has the field's spelling,
    help and default (eval's --methods and --k are the request's lists typed as text; `evsel
    watch` is three requests: its FOLDER is watch_add's path, its --remove watch_remove's; a train
    command's other options go into its request's `options`)."""
    from evsel.cli import cli

    docs, corpus, watch = cli.commands["docs"].commands, cli.commands["corpus"].commands, cli.commands["watch"]
    cases = [(cli.commands["ask"], AskRequest, {}, ()), (cli.commands["eval"], EvalRequest, {}, ("methods", "ks")),
             (cli.commands["ingest"], IngestRequest, {}, ()), (docs["list"], DocsListRequest, {}, ()),
             (docs["show"], DocsShowRequest, {}, ()), (docs["rm"], DocsRmRequest, {}, ()),
             (corpus["add"], CorpusAddRequest, {}, ()), (corpus["rm"], CorpusRmRequest, {}, ()),
             (watch, WatchAddRequest, {"path": "folder"}, ()), (watch, WatchRemoveRequest, {"path": "remove"}, ())]
    train = cli.commands["train"].commands
    cases += [(train[name.removeprefix("train_")], REQUEST[name].declaration, {"recipe_name": "recipe"}, ())
              for name in REQUEST if name.startswith("train_")]
    for command, declaration, named, as_text in cases:
        params = {p.name: p for p in command.params}
        for f in dataclasses.fields(declaration):
            field_spec = spec(declaration, f.name)
            if not field_spec.cli:
                continue
            param = params[named.get(f.name, f.name)]
            assert param.help == field_spec.help_text, (command.name, f.name)
            if field_spec.argument:
                continue
            spelled = "/".join(param.opts + param.secondary_opts)  # a flag's "--on/--off"
            assert spelled == (field_spec.flag or "--" + f.name.replace("_", "-")), (command.name, f.name)
            if f.name not in as_text and f.default is not dataclasses.MISSING:
                assert param.default == f.default, (command.name, f.name)
