"""One module per command group; evsel.cli assembles them.

These modules do not use `from __future__ import annotations`: Typer reads the annotations of every
command when the CLI starts, and string annotations would be compiled one by one (about 50 ms of
each `evsel` run). They import the engine, the store, numpy and rich's heavier parts only inside
the code paths that need them (tests/test_startup_imports.py).
"""
