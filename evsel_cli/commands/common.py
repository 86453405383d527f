"""Options shared by several commands, declared once."""

from __future__ import annotations

import click

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
collection_option = click.option(
    "--collection", metavar="NAME", default=None, help="Restrict to one collection."
)


def engine_from(ctx: click.Context):
    from evsel.engine import Engine

    obj = ctx.find_root().obj or {}
    return Engine(model=obj.get("model"), device=obj.get("device", "auto"))
