"""The CLI's side of the daemon: find it, start it when needed, and call the engine through it.

`DaemonClient` exposes the protocol and nothing else: the engine's requests (evsel.requests), each
called with its declaration (`client.ask(AskRequest(question, top_n=3), on_event=view)`) or with
the declaration's fields (`client.docs_list(collection)`). It sends `{"method": "ask", "params":
{...}, "settings": {...}}` once the request passes its declaration's checks, relays the daemon's
progress events to `on_event` and returns the same plain dict the engine returns (errors come back
as the same `EvselError`s). Paths in params are made absolute here, where the user typed them. A
request carries this client's build, so a connection costs one round trip: a daemon of another
build refuses it and the client restarts the daemon. Only pure Python is imported here: a warm
`evsel ask` never loads the engine, the store, numpy or torch in the client.
"""

from __future__ import annotations

import os
import socket
import sys
import time

from evsel import __version__, settings
from evsel.errors import EvselError, from_dict
from evsel.requests import REQUEST, REQUESTS, fields_of

from . import runtime
from .protocol import CANCEL_WAIT_S, PROTOCOL_VERSION, LineReader, ProtocolError, encode
from .runtime import DaemonError, DaemonFiles

START_TIMEOUT = settings.daemon_start_timeout()


def _ignore(_event: dict) -> None:
    pass


class OtherBuild(DaemonError):
    """The daemon runs another build or protocol than this client, and refused the request."""


# the error types a daemon of another build or protocol answers with, before it runs anything
OTHER_BUILD_ERRORS = ("BuildMismatch", "ProtocolMismatch")


class Connection:
    """One socket to the daemon; requests on it run one after another."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.reader = LineReader(sock)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def send(self, message: dict) -> None:
        self.sock.sendall(encode(message))

    def request(self, method: str, params: dict | None = None, on_event=_ignore, settings: dict | None = None,
                meta: dict | None = None, build: str | None = None):
        """Send one request and wait for its result, relaying events. Ctrl-C cancels it. With
        `build`, a daemon of another build refuses it (`OtherBuild`) before running anything."""
        request_id = os.urandom(6).hex()  # 12 hex digits, as uuid4().hex[:12] gave (uuid costs the import)
        client = {"pid": os.getpid(), "version": __version__, **({"build": build} if build else {})}
        message = {"v": PROTOCOL_VERSION, "id": request_id, "type": "request", "method": method,
                   "params": params or {}, "client": client}
        if settings is not None:
            message["settings"] = settings
        done = None  # the result's reply, once read: a Ctrl-C after it has nothing left to cancel
        try:
            try:
                self.send(message)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the daemon closed first; it may have said why (too many connections): read that
            while True:
                reply = self.reader.read()
                if reply is None:
                    raise DaemonError(
                        "lost the connection to the evsel daemon before the request finished",
                        f"it may have crashed; see {runtime.files().log}, then run the command again",
                    )
                kind = reply.get("type")
                if kind == "event":
                    on_event(reply["event"])
                elif kind == "accepted":
                    if reply.get("queue_position"):
                        ahead = reply["queue_position"]
                        on_event({"type": "progress", "task": "queue", "done": 0, "total": 1,
                                  "label": f"waiting for the daemon ({ahead} request{'s' if ahead > 1 else ''} ahead)"})
                elif kind == "result":
                    done = reply
                    if meta is not None:
                        meta.update(reply.get("meta") or {})
                    return reply.get("result")
                elif kind == "error":
                    if meta is not None:
                        meta.update(reply.get("meta") or {})
                    error = reply.get("error") or {}
                    if error.get("type") in OTHER_BUILD_ERRORS:
                        raise OtherBuild(error.get("message", "another build"), error.get("hint", ""))
                    raise from_dict(error)
                else:
                    raise DaemonError(f"the daemon sent an unknown message type {kind!r}",
                                      "restart it: evsel daemon stop")
        except KeyboardInterrupt as exc:
            if done is not None:  # the daemon finished (an ingest committed): its result is printed
                return done.get("result")
            try:  # the daemon drops or stops the job; the daemon itself carries on
                self.send({"v": PROTOCOL_VERSION, "id": request_id, "type": "cancel"})
                exc.stored_files = self._stored_after_cancel()
            except (OSError, ProtocolError, ValueError):
                pass
            self.close()
            raise
        except (ConnectionError, ProtocolError, socket.timeout) as exc:
            self.close()
            raise DaemonError(f"lost the connection to the evsel daemon ({exc})",
                              f"see {runtime.files().log}; run the command again") from None

    def _stored_after_cancel(self) -> list[str] | None:
        """What the cancelled request stored, as the daemon says once it has stopped it (None: not
        an ingest, or no answer within CANCEL_WAIT_S)."""
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            reply = self.reader.read()
            kind = None if reply is None else reply.get("type")
            if kind == "cancelled":
                return reply.get("stored")
            if kind == "result":  # it finished before the cancel arrived
                result = reply.get("result")
                files = result.get("files", []) if isinstance(result, dict) else []
                return [f["path"] for f in files if f.get("status") == "ingested"] if files else None
            if kind in (None, "error"):
                return None
        return None


def _absolute(value, cwd: str):
    if isinstance(value, str) and value:
        return os.path.join(cwd, os.path.expanduser(value))
    if isinstance(value, list):
        return [_absolute(v, cwd) for v in value]
    return value


def resolve_paths(method: str, params: dict, typed: dict[str, str] | None = None) -> dict:
    """Params with their paths made absolute (the daemon runs in /, not in the user's directory).
    `typed`, when given, collects {absolute: as typed}, to name paths in messages as the user did."""
    names = REQUEST[method].paths if method in REQUEST else ()
    if method == "eval" and isinstance(params.get("dataset"), str):
        dataset = params["dataset"]
        if dataset.endswith(".jsonl") or os.path.isfile(dataset):
            names = (*names, "dataset")
    if not names:
        return params
    try:
        cwd = os.getcwd()
    except OSError:  # the directory was deleted under us
        cwd = "/"
    out = dict(params)
    for name in names:
        if name in out:
            out[name] = _absolute(out[name], cwd)
            if typed is not None:
                given = params[name] if isinstance(params[name], list) else [params[name]]
                made = out[name] if isinstance(out[name], list) else [out[name]]
                typed.update({a: g for a, g in zip(made, given) if isinstance(a, str) and a != g})
    return out


def _as_typed(value, typed: dict[str, str]):
    """A result with the absolute paths the client made named as typed again, where in-process
    they are too: a target that is not a regular file (missing, a directory that failed). A file
    is named by its resolved path in both modes."""
    if not typed:
        return value
    if isinstance(value, str):
        return typed[value] if value in typed and not os.path.isfile(value) else value
    if isinstance(value, list):
        return [_as_typed(v, typed) for v in value]
    if isinstance(value, dict):
        return {k: _as_typed(v, typed) if k in ("path", "error") else v for k, v in value.items()}
    return value


# finding, starting and stopping the daemon
def try_connect(daemon_files: DaemonFiles) -> Connection | None:
    """A connection to a listening daemon, or None (cleaning a dead daemon's socket and pid file)."""
    if not os.path.lexists(daemon_files.socket):
        return None
    # before connecting: in a home others can write, the socket may be anyone's (the daemon makes
    # the same check); connect_unix then checks that the peer runs as our user
    runtime.check_home_private(daemon_files.home)
    runtime.check_socket_path(daemon_files.socket)
    try:
        sock = runtime.connect_unix(daemon_files.socket, timeout=None)
    except (FileNotFoundError, ConnectionRefusedError):
        runtime.clean_stale(daemon_files)
        return None
    except OSError as exc:
        raise DaemonError(f"cannot reach the evsel daemon at {daemon_files.socket}: {exc}",
                          "check EVSEL_HOME's permissions, or use --no-daemon") from None
    return Connection(sock)


def hello(connection: Connection) -> dict:
    return connection.request("hello")


def spawn(daemon_files: DaemonFiles, model: str | None = None, device: str = "auto",
          idle_timeout: float | None = None, preload: bool = True) -> None:
    """Launch a detached daemon (python -m evsel.daemon --detach); returns once the launcher exits."""
    import subprocess  # only here: a client of a running daemon never starts one

    runtime.check_home_private(daemon_files.home)
    runtime.clean_stale(daemon_files)
    command = [sys.executable, "-m", "evsel.daemon", "--detach", "--device", device or "auto"]
    if model:
        command += ["--model", os.path.abspath(os.path.expanduser(model))]
    if idle_timeout is not None:
        command += ["--idle-timeout", str(idle_timeout)]
    if not preload:
        command.append("--no-preload")
    fd = runtime.open_private(daemon_files.err, os.O_WRONLY)  # never through a planted symlink
    os.ftruncate(fd, 0)
    with os.fdopen(fd, "w") as err:
        subprocess.run(command, stdin=subprocess.DEVNULL, stdout=err, stderr=err, cwd="/", check=False,
                       start_new_session=True)


def wait_ready(daemon_files: DaemonFiles, timeout: float = START_TIMEOUT, on_event=_ignore) -> Connection:
    deadline = time.monotonic() + timeout
    on_event({"type": "progress", "task": "daemon", "label": "starting the evsel daemon", "done": 0, "total": 1})
    while True:
        connection = try_connect(daemon_files)
        if connection is not None:
            on_event({"type": "progress", "task": "daemon", "label": "daemon ready", "done": 1, "total": 1})
            return connection
        failure = _start_failure(daemon_files)
        if failure:
            raise DaemonError(f"the evsel daemon did not start: {failure}",
                              f"see {daemon_files.err}; or run without it: --no-daemon")
        if time.monotonic() > deadline:
            raise DaemonError(f"the evsel daemon did not answer within {timeout:.0f}s",
                              f"see {daemon_files.log}; or run without it: --no-daemon")
        time.sleep(0.03)


def _start_failure(daemon_files: DaemonFiles) -> str | None:
    """The daemon's own error line when it exited without listening, else None."""
    try:
        text = daemon_files.err.read_text(errors="replace")
    except OSError:
        return None
    if "evsel: error:" not in text and "Traceback" not in text:
        return None
    if runtime.daemon_alive(daemon_files):
        return None
    lines = [line for line in text.splitlines() if line.strip()]
    for line in lines:
        if line.startswith("evsel: error:"):
            return line.removeprefix("evsel: error:").strip()
    return lines[-1] if lines else "unknown error"


def ensure_daemon(model: str | None = None, device: str = "auto", idle_timeout: float | None = None,
                  preload: bool = True, on_event=_ignore, build: str | None = None) -> tuple[Connection, dict]:
    """A connection to a daemon of this very build, starting (or restarting) one when needed."""
    daemon_files = runtime.files()
    build = build or runtime.build_id()
    for _attempt in range(3):
        connection = try_connect(daemon_files)
        if connection is None:
            if not runtime.daemon_alive(daemon_files):
                spawn(daemon_files, model, device, idle_timeout, preload)
            connection = wait_ready(daemon_files, on_event=on_event)
        try:
            connection.sock.settimeout(30)  # a daemon that accepts but never answers is not usable
            info = hello(connection)
            connection.sock.settimeout(None)  # requests may run for minutes
        except OtherBuild:
            info = {"build": None, "evsel_version": "unknown"}
        if info.get("build") == build and info.get("protocol") == PROTOCOL_VERSION:
            return connection, info
        on_event({"type": "warning", "message": f"restarting the evsel daemon: it runs evsel "
                  f"{info.get('build') or info.get('evsel_version')}, this is {build}"})
        stop(daemon_files, connection)
    raise DaemonError("could not start an evsel daemon of this version", f"see {daemon_files.log}")


def stop(daemon_files: DaemonFiles | None = None, connection: Connection | None = None,
         timeout: float = 60) -> dict | None:
    """Ask the daemon to stop and wait until it has; None when none was running."""
    daemon_files = daemon_files or runtime.files()
    connection = connection or try_connect(daemon_files)
    if connection is None:
        return None
    try:
        reply = connection.request("shutdown")
    except EvselError:
        reply = {"pid": None}
    finally:
        connection.close()
    deadline = time.monotonic() + timeout
    while runtime.daemon_alive(daemon_files):
        if time.monotonic() > deadline:
            raise DaemonError(f"the evsel daemon (pid {reply.get('pid')}) did not stop within {timeout:.0f}s",
                              f"see {daemon_files.log}; kill {reply.get('pid')} ends it safely")
        time.sleep(0.05)
    runtime.clean_stale(daemon_files)
    return reply


def status(daemon_files: DaemonFiles | None = None) -> dict | None:
    """The daemon's status, or None when it is not running (never starts it)."""
    daemon_files = daemon_files or runtime.files()
    connection = try_connect(daemon_files)
    if connection is None:
        return None
    try:
        return connection.request("status")
    finally:
        connection.close()


class DaemonClient:
    """Stands in for `Engine` in the CLI: the engine's requests, run by the daemon with the
    request's settings. Nothing else of the engine (its backbone, store) is reachable from here:
    whatever needs the model runs where the model is resident."""

    def __init__(self, settings=None, idle_timeout: float | None = None):
        from evsel.settings import Settings

        self.settings = settings or Settings.resolve()
        self.idle_timeout = idle_timeout
        self._connection: Connection | None = None
        self.info: dict | None = None
        self.last_meta: dict = {}
        self._build: str | None = None

    def connect(self, on_event=_ignore, restart: bool = False) -> Connection:
        """The connection to the daemon: a running one as it is (each request carries this build,
        which the daemon checks), else, or with `restart`, one started and greeted (`ensure_daemon`)."""
        if self._connection is None and not restart:
            self._connection = try_connect(runtime.files())
        if self._connection is None or restart:
            def relay(event: dict) -> None:
                if event.get("type") == "warning" and on_event is _ignore:
                    from evsel.commands.output import warning

                    warning(event["message"])  # a restart is worth a line even without a progress view
                else:
                    on_event(event)

            self.close()
            self._connection, self.info = ensure_daemon(self.settings.model, self.settings.device,
                                                        self.idle_timeout, on_event=relay, build=self.build)
        return self._connection

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def call(self, method: str, params: dict, on_event=_ignore):
        self.last_meta = {}
        typed: dict[str, str] = {}
        params = resolve_paths(method, params, typed)
        if method in REQUESTS:  # checked here, once: a bad option fails before any daemon is involved
            from .checks import check_params

            error = check_params(method, params)
            if error is not None:
                raise from_dict(error)

        def relay(event: dict) -> None:
            on_event(_as_typed(event, typed) if event.get("type") == "file" else event)

        try:
            try:
                result = self._send(method, params, relay, self.connect(on_event))
            except OtherBuild:  # a daemon of another build: replaced by one of this build, asked again
                result = self._send(method, params, relay, self.connect(on_event, restart=True))
        except EvselError as exc:
            self._connection = None
            exc.path = _as_typed(exc.path, typed)
            raise
        except BaseException:
            self._connection = None  # a cancelled or broken connection is not reused
            raise
        return _as_typed(result, typed)

    def _send(self, method: str, params: dict, on_event, connection: Connection):
        return connection.request(method, params, on_event, settings=self.settings.to_dict(), meta=self.last_meta,
                                  build=self.build)

    @property
    def build(self) -> str:
        if self._build is None:
            self._build = runtime.build_id()
        return self._build

    def request(self, method: str, **params):
        """A daemon request that is not an engine method (status, watch_add, ...)."""
        return self.call(method, params)

    def __getattr__(self, name: str):
        if name not in REQUESTS:
            raise AttributeError(name)
        declaration = REQUEST[name].declaration

        def remote(*args, on_event=_ignore, **kwargs):
            """The request as its declaration, or as the declaration's fields (checked by it)."""
            request = args[0] if len(args) == 1 and not kwargs and isinstance(args[0], declaration) else \
                declaration(*args, **kwargs)
            return self.call(name, fields_of(request), on_event or _ignore)

        remote.__name__ = name
        return remote
