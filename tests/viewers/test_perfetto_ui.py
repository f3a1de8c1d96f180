"""The Perfetto UI launcher's server, through real HTTP requests on a free loopback port."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from dlprof.viewers.perfetto_ui import (
    HOST,
    UI_ORIGIN,
    NotServedError,
    PortBusyError,
    ServeResult,
    TraceServer,
    serve_once,
    ui_url,
)

PAYLOAD = bytes(range(256)) * 64 + b"\x00end"


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.perfetto-trace"
    path.write_bytes(PAYLOAD)
    (tmp_path / "secret.txt").write_text("not to be served")
    return path


@pytest.fixture
def server(trace: Path) -> Iterator[TraceServer]:
    """A server on a free port, serving in a thread for the length of one test."""
    started = TraceServer(trace, port=0)
    thread = threading.Thread(target=started.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield started
    started.shutdown()
    started.server_close()
    thread.join()


def request(port: int, method: str, target: str,
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """One raw request: http.client sends the target exactly as given, unnormalised."""
    connection = http.client.HTTPConnection(HOST, port, timeout=5)
    try:
        connection.request(method, target, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def test_serves_the_file_with_the_ui_origin(server: TraceServer) -> None:
    status, headers, body = request(server.port, "GET", "/trace.perfetto-trace")
    assert status == 200
    assert body == PAYLOAD
    assert headers["Access-Control-Allow-Origin"] == UI_ORIGIN
    assert headers["Content-Type"] == "application/octet-stream"
    assert headers["Content-Length"] == str(len(PAYLOAD))
    # The server marks the fetch after its last write; the client may finish reading first.
    assert server.fetched.wait(5)


def test_bound_to_loopback_only(server: TraceServer) -> None:
    assert server.server_address[0] == "127.0.0.1"
    others = [
        address.address
        for addresses in psutil.net_if_addrs().values()
        for address in addresses
        if address.family == socket.AF_INET and not address.address.startswith("127.")
    ]
    if not others:
        pytest.skip("this machine has no IPv4 address besides loopback to try")
    with pytest.raises(OSError):
        socket.create_connection((others[0], server.port), timeout=2).close()


def test_head_sends_headers_only_and_is_no_fetch(server: TraceServer) -> None:
    status, headers, body = request(server.port, "HEAD", "/trace.perfetto-trace")
    assert (status, body) == (200, b"")
    assert headers["Content-Length"] == str(len(PAYLOAD))
    assert headers["Access-Control-Allow-Origin"] == UI_ORIGIN
    assert not server.fetched.is_set()


def test_cors_preflight(server: TraceServer) -> None:
    status, headers, _ = request(server.port, "OPTIONS", "/trace.perfetto-trace", {
        "Origin": UI_ORIGIN,
        "Access-Control-Request-Method": "GET",
        "Access-Control-Request-Headers": "range",
        "Access-Control-Request-Private-Network": "true",
    })
    assert status == 204
    assert headers["Access-Control-Allow-Origin"] == UI_ORIGIN
    assert "GET" in headers["Access-Control-Allow-Methods"]
    assert headers["Access-Control-Allow-Headers"] == "range"
    assert headers["Access-Control-Allow-Private-Network"] == "true"
    assert request(server.port, "OPTIONS", "/secret.txt")[0] == 404


@pytest.mark.parametrize("target", [
    "/",
    "/secret.txt",
    "/trace.perfetto-trace/",
    "/trace.perfetto-trace/..",
    "/../trace.perfetto-trace",
    "/./trace.perfetto-trace",
    "/x/../trace.perfetto-trace",
    "/..%2ftrace.perfetto-trace",
    "/%2e%2e/secret.txt",
    "/%2E%2E%2Fsecret.txt",
    "/..\\secret.txt",
    "//etc/passwd",
    "/etc/passwd",
    "http://127.0.0.1/trace.perfetto-trace",
    "http://evil.example/trace.perfetto-trace",
    "*",
    "trace.perfetto-trace",
    "/trace.perfetto-trace%00",
])
def test_anything_else_is_404(server: TraceServer, target: str) -> None:
    for method in ("GET", "HEAD"):
        status, _, body = request(server.port, method, target)
        assert status == 404, (method, target)
        assert b"not to be served" not in body and PAYLOAD not in body
    assert not server.fetched.is_set()


def test_a_foreign_host_name_is_refused(server: TraceServer) -> None:
    """A page on a DNS name rebound to 127.0.0.1 sends its own name as Host."""
    status, _, body = request(server.port, "GET", "/trace.perfetto-trace", {"Host": "evil.example"})
    assert status == 404 and PAYLOAD not in body
    status, _, _ = request(server.port, "GET", "/trace.perfetto-trace", {"Host": f"localhost:{server.port}"})
    assert status == 200


def test_a_second_server_on_a_busy_port_says_so(server: TraceServer, trace: Path) -> None:
    with pytest.raises(PortBusyError) as raised:
        TraceServer(trace, port=server.port)
    message = str(raised.value.strerror)
    assert f"port {server.port} on 127.0.0.1 is busy" in message
    assert "--port" in message and "\n" not in message


def test_ui_url() -> None:
    assert ui_url("trace.perfetto-trace") == (
        "https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/trace.perfetto-trace")
    assert ui_url("a b.pftrace", 1234).endswith("127.0.0.1:1234/a%20b.pftrace")


def test_serve_once_returns_after_one_full_get(trace: Path) -> None:
    """What the browser would do: HEAD, a refused path, then the GET; then the server is gone."""
    ready: list[TraceServer] = []
    opened: list[str] = []
    seen: list[tuple[int, int]] = []

    def browser(url: str) -> None:
        opened.append(url)
        port = ready[0].port
        seen.append((request(port, "HEAD", "/trace.perfetto-trace")[0], 0))
        seen.append((request(port, "GET", "/secret.txt")[0], 0))
        status, _, body = request(port, "GET", "/trace.perfetto-trace")
        seen.append((status, len(body)))

    result = serve_once(trace, port=0, open_browser=browser, timeout=10, on_ready=ready.append)
    assert result is ServeResult.FETCHED
    assert seen == [(200, 0), (404, 0), (200, len(PAYLOAD))]
    assert opened == [f"https://ui.perfetto.dev/#!/?url=http://127.0.0.1:{ready[0].port}/trace.perfetto-trace"]
    with pytest.raises(OSError):
        socket.create_connection((HOST, ready[0].port), timeout=2).close()


def test_serve_once_times_out_when_nothing_fetches(trace: Path) -> None:
    assert serve_once(trace, port=0, open_browser=None, timeout=0.3) is ServeResult.TIMED_OUT


def test_serve_once_on_ctrl_c(trace: Path) -> None:
    def interrupt(url: str) -> None:
        raise KeyboardInterrupt

    assert serve_once(trace, port=0, open_browser=interrupt, timeout=10) is ServeResult.INTERRUPTED


def test_a_client_dropping_mid_download_is_one_quiet_line(
        tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    import struct
    import time

    big = tmp_path / "big.perfetto-trace"
    big.write_bytes(b"\x01" * (64 << 20))  # far more than the socket buffers hold
    started = TraceServer(big, port=0)
    thread = threading.Thread(target=started.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        for _ in range(2):
            client = socket.create_connection((HOST, started.port), timeout=5)
            client.sendall(b"GET /big.perfetto-trace HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            client.recv(1 << 16)
            # Linger 0: close with a reset, as a browser tab closed mid-download does.
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
        deadline = time.monotonic() + 30
        while started.dropped < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        started.shutdown()
        started.server_close()
        thread.join()
    assert started.dropped == 2 and not started.fetched.is_set()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ConnectionResetError" not in err
    assert err.strip().splitlines() == [
        "dlprof: a download of big.perfetto-trace was cut short by the client; still serving"]


def test_a_link_is_never_served(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("not to be served")
    link = tmp_path / "trace.perfetto-trace"
    link.symlink_to(tmp_path / "secret.txt")
    with pytest.raises(NotServedError, match="symbolic link"):
        TraceServer(link, port=0)
    with pytest.raises(NotServedError, match="not a regular file"):
        TraceServer(tmp_path, port=0)


def test_the_file_opened_at_start_is_served_whatever_replaces_its_name(server: TraceServer, trace: Path) -> None:
    trace.unlink()
    trace.symlink_to(trace.parent / "secret.txt")  # planted once the server checked the file
    status, _, body = request(server.port, "GET", "/trace.perfetto-trace")
    assert status == 200 and body == PAYLOAD
