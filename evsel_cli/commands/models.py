from __future__ import annotations

import click
from rich.markup import escape

from evsel.output import print_json, stdout

from .common import engine_from, json_option


@click.group()
def models():
    """Information about the backbone model."""


@models.command("info")
@json_option
@click.pass_context
def models_info(ctx, as_json):
    """Show the backbone, its file fingerprint, and the device and dtype with why they were chosen."""
    info = engine_from(ctx).models_info()
    if as_json:
        print_json(info)
        return
    for key, value in info.items():
        stdout.print(f"[bold]{key}:[/] {escape(str(value))}")


@click.command()
def sample():
    """Print the path of the bundled sample story (an original detective story, public domain).

    Try: evsel ingest "$(evsel sample)" && evsel ask "Who killed Ambrose Tenterden?"
    """
    from evsel.paths import sample_story_path

    click.echo(str(sample_story_path()))
