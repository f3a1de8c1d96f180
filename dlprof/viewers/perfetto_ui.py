"""Open one trace file in ui.perfetto.dev, as perfetto's own ``tools/open_trace_in_ui`` does.

The UI runs in the browser and fetches the trace from a tiny HTTP server on this machine::

    serve_once(Path("run/trace.perfetto-trace"))   # opens the browser, returns once fetched

The server binds 127.0.0.1 only (never 0.0.0.0: the trace would be readable from the network)
on port 9001, the one port the UI's content security policy lets it fetch from. It serves
exactly one file name; every other request target gets 404, so no path from a URL ever reaches
the file system. The file is opened once, when the server starts, never through a link and only
if it is a regular file, and every request is answered from that open file: a link planted (or
the file swapped) after the check serves nothing else. ``Access-Control-Allow-Origin`` names the UI's origin, so that no other web page
open in the browser may read the trace, and a ``Host`` other than the loopback address is
refused, so that a page cannot reach the server through a DNS name rebound to 127.0.0.1.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import threading
import time
import webbrowser
from collections.abc import Callable
from enum import IntEnum
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, unquote, urlsplit

HOST = "127.0.0.1"
PERFETTO_PORT = 9001
UI_ORIGIN = "https://ui.perfetto.dev"

# How often the waiting thread wakes: bounds how late Ctrl-C and a timeout are noticed.
_POLL_S = 0.1
_COPY_BUFFER = 1 << 20


class PortBusyError(OSError):
    """The port is taken; the message is one line a person can act on."""


class NotServedError(OSError):
    """The file to serve is a link or not a regular file; ``strerror`` says which."""


class ServeResult(IntEnum):
    """How :func:`serve_once` ended; the values are the command's exit status."""

    FETCHED = 0
    TIMED_OUT = 124  # as timeout(1) exits
    INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C


def ui_url(name: str, port: int = PERFETTO_PORT) -> str:
    """The Perfetto UI address that makes it fetch ``name`` from the local server.

    Args:
        name: the served file's name.
        port: the port the server listens on.

    Returns:
        ``https://ui.perfetto.dev/#!/?url=http://127.0.0.1:<port>/<name>``.
    """
    return f"{UI_ORIGIN}/#!/?url=http://{HOST}:{port}/{quote(name)}"


class TraceServer(ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 that serves one file, and notes when it was fetched whole."""

    daemon_threads = True  # a browser holding a connection open never delays the exit

    def __init__(self, path: Path, port: int = PERFETTO_PORT) -> None:
        """Bind the server (port 0: any free port, for tests).

        Args:
            path: the file to serve; only its name is reachable, at ``/<name>``.
            port: the port on 127.0.0.1.

        Raises:
            NotServedError: ``path`` is a symbolic link, or not a regular file.
            PortBusyError: something already listens on the port.
            OSError: the address cannot be bound for another reason.
        """
        self.trace_path = Path(path)
        self.trace_file = _open_regular(self.trace_path)
        self.fetched = threading.Event()
        # Downloads the client cut short (a tab closed, a reload): said once, then only counted.
        self.dropped = 0
        try:
            super().__init__((HOST, port), _Handler)
        except OSError as error:
            self.trace_file.close()
            if error.errno == errno.EADDRINUSE:
                raise PortBusyError(errno.EADDRINUSE, _busy_message(port)) from None
            raise

    def server_close(self) -> None:
        super().server_close()
        self.trace_file.close()

    @property
    def port(self) -> int:
        """The port actually bound (the free one picked when asked for port 0)."""
        return int(self.server_address[1])

    @property
    def url_path(self) -> str:
        """The one request path that is answered."""
        return "/" + self.trace_path.name

    @property
    def url(self) -> str:
        """The Perfetto UI address that loads the served file."""
        return ui_url(self.trace_path.name, self.port)

    def handle_error(self, request: object, client_address: object) -> None:
        """One line on stderr instead of socketserver's traceback; a dropped client is said once.

        A browser that closes the tab or reloads mid-download resets the connection: nothing is
        wrong with the server, which goes on waiting for a complete fetch.
        """
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError):
            self.dropped += 1
            if self.dropped == 1:
                print(f"dlprof: a download of {self.trace_path.name} was cut short by the client; "
                      "still serving", file=sys.stderr)
            return
        print(f"dlprof: serving {self.trace_path.name}: {error}", file=sys.stderr)

    def allows_host(self, host: str | None) -> bool:
        """Whether a request's ``Host`` header names this loopback server."""
        if host is None:
            return True  # HTTP/1.0 clients send none; the socket is loopback-only anyway
        return host in {HOST, f"{HOST}:{self.port}", "localhost", f"localhost:{self.port}"}


def _busy_message(port: int) -> str:
    hint = ("close it (another dlprof view?), or pass --port N and load the URL into a self-hosted "
            "Perfetto UI: ui.perfetto.dev only fetches from port 9001")
    return f"port {port} on {HOST} is busy; {hint}"


class _Handler(BaseHTTPRequestHandler):
    """GET, HEAD and CORS preflight of the one file; 404 for everything else."""

    server: TraceServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # the name http.server dispatches to
        if self._send_headers():
            descriptor, at = self.server.trace_file.fileno(), 0
            while block := os.pread(descriptor, _COPY_BUFFER, at):  # the file opened at start
                self.wfile.write(block)
                at += len(block)
            self.wfile.flush()
            # Only now: a download cut short (BrokenPipe) raises above and never counts.
            self.server.fetched.set()

    def do_HEAD(self) -> None:
        self._send_headers()

    def do_OPTIONS(self) -> None:
        """A CORS preflight; Chrome also asks here before a public page may reach loopback."""
        if not self._is_the_file():
            self._not_found()
            return
        self.send_response(HTTPStatus.NO_CONTENT)
        self.send_header("Access-Control-Allow-Origin", UI_ORIGIN)
        self.send_header("Access-Control-Allow-Methods", "GET, HEAD, OPTIONS")
        requested = self.headers.get("Access-Control-Request-Headers")
        if requested:
            self.send_header("Access-Control-Allow-Headers", requested)
        self.send_header("Access-Control-Allow-Private-Network", "true")
        self.send_header("Access-Control-Max-Age", "600")
        self.send_header("Vary", "Origin")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _send_headers(self) -> bool:
        """Send the file's headers, or a 404; True when the body should follow."""
        if not self._is_the_file():
            self._not_found()
            return False
        try:
            size = os.fstat(self.server.trace_file.fileno()).st_size
        except (OSError, ValueError):
            self._not_found()
            return False
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.send_header("Access-Control-Allow-Origin", UI_ORIGIN)
        self.send_header("Vary", "Origin")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        return True

    def _is_the_file(self) -> bool:
        """Whether the request target is exactly ``/<name>``.

        Only the origin form (``/name``) is accepted: an absolute URL, ``*`` or ``//host/...``
        is not a request for this file. ``..`` is refused by itself even though the equality test
        below could never let it through, so that the rule holds should the test ever change.
        """
        if not self.server.allows_host(self.headers.get("Host")):
            return False
        target = self.path
        if not target.startswith("/") or target.startswith("//"):
            return False
        path = urlsplit(target).path
        decoded = unquote(path)
        if ".." in decoded.split("/") or "\\" in decoded or "\x00" in decoded:
            return False
        return decoded == self.server.url_path

    def _not_found(self) -> None:
        body = b"not found\n"
        self.send_response(HTTPStatus.NOT_FOUND)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the command prints what matters, not an access log."""


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading, never through a link, and only if it is a regular file."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise NotServedError(errno.ELOOP, "a symbolic link; only the run's own file is served",
                                 str(path)) from None
        raise
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise NotServedError(errno.EINVAL, "not a regular file; only the run's own file is served", str(path))
    return os.fdopen(descriptor, "rb")


def serve_once(
    path: Path,
    port: int = PERFETTO_PORT,
    open_browser: Callable[[str], object] | None = webbrowser.open,
    timeout: float | None = None,
    on_ready: Callable[[TraceServer], object] | None = None,
) -> ServeResult:
    """Serve ``path`` on 127.0.0.1 until it has been fetched once, whole.

    Args:
        path: the trace file.
        port: the port (9001 for ui.perfetto.dev; 0 picks a free one, for tests).
        open_browser: called with the UI's URL once the server listens (``webbrowser.open`` by
            default); None opens nothing.
        timeout: seconds to wait for the fetch; None waits until Ctrl-C.
        on_ready: called with the server once it listens, before ``open_browser`` (tests read
            its port from it).

    Returns:
        FETCHED after the first complete GET of the file, TIMED_OUT, or INTERRUPTED on Ctrl-C.

    Raises:
        NotServedError: ``path`` is a link or not a regular file.
        PortBusyError: something already listens on the port.
        OSError: the address cannot be bound for another reason.
    """
    server = TraceServer(path, port)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": _POLL_S},
                              name="dlprof-perfetto-ui", daemon=True)
    thread.start()
    try:
        if on_ready is not None:
            on_ready(server)
        if open_browser is not None:
            open_browser(server.url)
        return _wait(server.fetched, timeout)
    except KeyboardInterrupt:
        return ServeResult.INTERRUPTED
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _wait(fetched: threading.Event, timeout: float | None) -> ServeResult:
    # Short waits in a loop, so that Ctrl-C is taken promptly wherever a long wait would block it.
    deadline = None if timeout is None else time.monotonic() + timeout
    while not fetched.wait(_POLL_S):
        if deadline is not None and time.monotonic() >= deadline:
            return ServeResult.TIMED_OUT
    return ServeResult.FETCHED
