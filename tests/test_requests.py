"""The request table (evsel/api.py) is the one definition of the engine's requests: the daemon's
checks, the client's path resolution and the protocol's fast requests all come from it (the
signatures are checked against `Engine`'s in test_startup_imports.py)."""

from __future__ import annotations

import inspect

from evsel.api import REQUEST, REQUESTS, Request, Requests


def test_every_request_has_a_signature_and_every_signature_a_request():
    stubs = {name for name, fn in vars(Requests).items() if inspect.isfunction(fn) and not name.startswith("_")}
    assert stubs == set(REQUESTS) and list(REQUEST) == list(REQUESTS)
    for request in REQUEST.values():
        params = request.signature.parameters
        assert set(request.paths) <= set(params), request.name
        assert set(request.types) >= set(request.paths), request.name


def test_the_protocol_derives_its_fast_requests_from_the_table():
    from evsel.daemon.protocol import FAST_METHODS

    assert FAST_METHODS - {"hello", "status", "shutdown"} == {name for name, r in REQUEST.items() if r.fast}
    assert not {name for name, r in REQUEST.items() if r.fast and r.light}  # fast ones never queue


def test_the_checks_and_the_client_follow_the_tables_paths(tmp_path):
    from evsel.daemon.checks import check_params
    from evsel.daemon.client import resolve_paths

    table = dict(REQUEST)
    try:  # a request whose `collection` were a path: the check follows the table
        REQUEST["watch_add"] = Request("watch_add", paths=("path", "collection"), fast=True)
        error = check_params("watch_add", {"path": str(tmp_path), "collection": "relative"})
        assert error is not None and "collection must be an absolute path" in error["message"]
        resolved = resolve_paths("watch_add", {"path": "here", "collection": "relative"})
        assert resolved["collection"].endswith("/relative") and resolved["collection"].startswith("/")
    finally:
        REQUEST.clear()
        REQUEST.update(table)
    assert check_params("watch_add", {"path": str(tmp_path), "collection": "relative"}) is None
