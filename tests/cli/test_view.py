"""``dlprof view``: as a real program serving a real run, fetched over HTTP as the UI would."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from dlprof.cli.main import main
from dlprof.cli.view import TRACE_NAME, ensure_trace
from dlprof.store.manifest import Manifest
from dlprof.store.reader import load
from dlprof.store.writer import RankWriter
from dlprof.viewers.perfetto_ui import UI_ORIGIN, TraceServer


@pytest.fixture
def run(cnn_run: Path, tmp_path: Path) -> Path:
    """A private copy: view writes the trace into the run directory."""
    return Path(shutil.copytree(cnn_run, tmp_path / "cnn"))


def trace_address(ui_url: str) -> str:
    """The local address inside ``https://ui.perfetto.dev/#!/?url=<address>``."""
    prefix = f"{UI_ORIGIN}/#!/?url="
    assert ui_url.startswith(prefix), ui_url
    return ui_url[len(prefix):]


def test_view_serves_the_trace_until_fetched(run: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "dlprof", "view", str(run), "--no-browser", "--port", "0", "--timeout", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert process.stdout is not None
        address = trace_address(process.stdout.readline().strip())
        parts = urlsplit(address)
        assert parts.hostname == "127.0.0.1" and parts.path == f"/{TRACE_NAME}"
        with urllib.request.urlopen(address, timeout=30) as response:
            body = response.read()
            assert response.headers["Access-Control-Allow-Origin"] == UI_ORIGIN
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0, err
    assert body == (run / TRACE_NAME).read_bytes()
    assert len(pb.Trace.FromString(body).packet) > 1000
    assert "Traceback" not in err


def test_view_times_out_when_nothing_fetches(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["view", str(run), "--no-browser", "--port", "0", "--timeout", "0.3"]) == 124
    captured = capsys.readouterr()
    assert captured.out.startswith(f"{UI_ORIGIN}/#!/?url=http://127.0.0.1:")
    assert "nothing fetched" in captured.err


def test_busy_port_is_one_line(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = ensure_trace(load(run))
    holder = TraceServer(trace, port=0)
    try:
        assert main(["view", str(run), "--no-browser", "--port", str(holder.port)]) == 2
    finally:
        holder.server_close()
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"port {holder.port} on 127.0.0.1 is busy" in err and "--port" in err


def test_trace_is_written_once_and_again_when_the_run_changes(run: Path) -> None:
    trace = ensure_trace(load(run))
    first = trace.stat().st_mtime_ns
    assert ensure_trace(load(run)) == trace and trace.stat().st_mtime_ns == first
    manifest = run / "run.json"
    later = first + 2_000_000_000
    os.utime(manifest, ns=(later, later))
    ensure_trace(load(run))
    assert trace.stat().st_mtime_ns > first


def test_a_run_without_slices_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Manifest(name="empty", command=["x"]).write(tmp_path)
    RankWriter(tmp_path, 0).compact()
    assert main(["view", str(tmp_path), "--no-browser", "--port", "0", "--timeout", "1"]) == 2
    assert "holds no slices" in capsys.readouterr().err
    assert not (tmp_path / TRACE_NAME).exists()


def test_a_trace_that_is_a_link_is_never_served(run: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("outside the run")
    (run / TRACE_NAME).symlink_to(secret)
    os.utime(run / TRACE_NAME, follow_symlinks=True)  # newer than the run: once served as it was
    assert main(["view", str(run), "--no-browser", "--port", "0", "--timeout", "0.3"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert f"{run / TRACE_NAME}: a symbolic link" in captured.err
    assert (run / TRACE_NAME).is_symlink() and secret.read_text() == "outside the run"


def test_a_trace_that_is_a_directory_or_a_fifo_is_one_line(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (run / TRACE_NAME).mkdir()
    assert main(["view", str(run), "--no-browser", "--port", "0", "--timeout", "0.3"]) == 2
    assert "a directory; dlprof view serves the run's own trace file only" in capsys.readouterr().err
    (run / TRACE_NAME).rmdir()
    os.mkfifo(run / TRACE_NAME)
    assert main(["view", str(run), "--no-browser", "--port", "0", "--timeout", "0.3"]) == 2
    assert "a FIFO (named pipe)" in capsys.readouterr().err


def test_ctrl_c_stops_it_cleanly(run: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "dlprof", "view", str(run), "--no-browser", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith(UI_ORIGIN)  # listening by now
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 130
    assert "Traceback" not in err
