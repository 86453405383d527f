"""The resident daemon (`evsel daemon ...`): keeps the backbone loaded and serves the CLI over a Unix
socket in EVSEL_HOME. `server` is the daemon, `client` what the CLI uses to reach it (and start it),
`protocol` the JSON-lines wire format (PROTOCOL.md), `runtime` its files and checks, `cache` what it
keeps in memory, `watcher` the watch folders.
"""
