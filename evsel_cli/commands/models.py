# annotations are evaluated at import: Typer reads them all at start-up (commands/__init__.py)

import typer

from evsel.commands.output import escape, print_json, stdout

from .base import App
from .common import JsonOption, engine_from

app = App(help="Information about the backbone model.")


@app.command("info")
def models_info(ctx: typer.Context, as_json: JsonOption = False):
    """Show the backbone, its file fingerprint, the device and dtype, and which backend generates
    answers (llama.cpp or transformers), each with why it was chosen."""
    info = engine_from(ctx).models_info()
    from evsel.commands.output import warning
    from evsel.paths import permission_warning

    loose = permission_warning()  # a home or store file others can read: say so (stderr)
    if loose:
        warning(loose)
    if as_json:
        print_json(info)
        return
    for key, value in info.items():
        if key == "default_by_kind":  # one line a kind: chats, books and PDFs may differ
            stdout.print(f"[bold]{key}:[/]")
            for kind, chosen in value.items():
                stdout.print(f"  [bold]{kind}:[/] {escape(chosen['method'])} ({escape(chosen['why'])})")
            continue
        if key == "reader_by_kind":  # prose and dialogues may be read by different readers
            stdout.print(f"[bold]{key}:[/]")
            for kind, chosen in value.items():
                stdout.print(f"  [bold]{kind}:[/] {escape(str(chosen['reader']))} ({escape(chosen['why'])})")
            continue
        stdout.print(f"[bold]{key}:[/] {escape(str(value))}")


def sample():
    """Print the path of the bundled sample story (an original detective story, public domain).

    Try: evsel ingest "$(evsel sample)" && evsel ask "Who killed Ambrose Tenterden?"
    """
    from evsel.paths import sample_story_path

    typer.echo(str(sample_story_path()))
