"""The HTML report: its data, its escaping, and the page itself in a real headless Chromium.

The browser tests drive Debian's ``chromium`` over the DevTools protocol (a websocket client of a
few lines below, on the standard library): they load the report from disk, fail on any console
error, uncaught exception, dialog or network request, read the tables back from the DOM and
compare them with ``dlprof top --format json``, and save a screenshot.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import dlprof
from dlprof.analysis.energy import NO_POWER, energy_summary, step_energy
from dlprof.analysis.report_data import ReportLimits, downsample, report_data
from dlprof.analysis.steps import step_report
from dlprof.cli.main import main
from dlprof.importers.kineto import KinetoOptions, convert_trace, read_trace
from dlprof.keys import RunStatus, StoreTable
from dlprof.store.ids import SLOT_IMPORT, id_base
from dlprof.store.manifest import Manifest
from dlprof.store.writer import RankWriter
from dlprof.viewers.html_report import render_report, script_json
from dlprof.viewers.terminal import format_column
from tests.builders import add_power, profile_steps, simple_add_trace, write_imported_run
from tests.conftest import KINETO_TRACES

EVIL = ("<script>alert(1)</script>", "</script><img src=x onerror=alert(1)>")
# A copy a person can open after the run (git-ignored).
SCREENSHOT_COPY = Path(__file__).resolve().parents[1] / "artifacts" / "report-screenshot.png"


def write_slices_run(run_dir: Path, slices: dict[str, Any], command: list[str] | None = None) -> Path:
    """A complete one-rank run holding ``slices`` (columns of the slices table)."""
    writer = RankWriter(run_dir, 0)
    writer.write_chunk(StoreTable.SLICES, pa.table(slices), "x")
    counts, _ = writer.compact()
    Manifest(name=run_dir.name, command=command or ["python", "train.py"], status=RunStatus.COMPLETE,
             start_ns=int(np.min(slices["start_ns"])), end_ns=int(np.max(slices["start_ns"]) + 10**6),
             counts=counts).write(run_dir)
    return run_dir


def synthetic_slices(events: int, threads: int = 2, ops: int = 10, children: int = 4) -> dict[str, Any]:
    """Steps of ``ops`` ops of ``children`` child ops each, on ``threads`` threads; about
    ``events`` slices in all. Starts at 1.7e18 ns, one step per millisecond."""
    per_step = 1 + ops + ops * children
    steps = max(1, events // per_step // threads)
    columns: dict[str, list[np.ndarray]] = {k: [] for k in ("tid", "kind", "name", "start_ns", "dur_ns")}
    base = 1_700_000_000_000_000_000
    for thread in range(threads):
        step_start = base + np.arange(steps, dtype=np.int64) * 1_000_000 + thread * 300
        op_start = (step_start[:, None] + 1_000 + np.arange(ops) * 95_000).ravel()
        child_start = (op_start[:, None] + 500 + np.arange(children) * 20_000).ravel()
        op_names = np.array([f"aten::op{i}" for i in range(20)])
        child_names = np.array([f"aten::child{i}" for i in range(8)])
        columns["start_ns"] += [step_start, op_start, child_start]
        columns["dur_ns"] += [np.full(steps, 990_000), 85_000 + np.arange(len(op_start)) % 7 * 1_000,
                              np.full(len(child_start), 18_000)]
        columns["name"] += [np.array([f"ProfilerStep#{i}" for i in range(steps)]),
                            op_names[np.arange(len(op_start)) % 20], child_names[np.arange(len(child_start)) % 8]]
        columns["kind"] += [np.full(steps, "step"), np.full(len(op_start), "op"), np.full(len(child_start), "op")]
        columns["tid"] += [np.full(steps + len(op_start) + len(child_start), 100 + thread)]
    table = {k: np.concatenate(v) for k, v in columns.items()}
    count = len(table["start_ns"])
    table.update(id=np.arange(count, dtype=np.int64) + 1, pid=np.full(count, 7), device=np.full(count, "cpu"))
    return table


@pytest.fixture(scope="module")
def evil_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three steps whose ops are named to break out of a script element or an attribute."""
    names = ["ProfilerStep#0", EVIL[0], EVIL[1], "aten::mm & <b>bold</b>", "ProfilerStep#1", EVIL[0]]
    kinds = ["step", "op", "op", "op", "step", "op"]
    start = 1_700_000_000_000_000_000 + np.array([0, 10, 500, 900, 2_000, 2_010])
    slices = {"id": np.arange(1, 7), "pid": np.full(6, 1), "tid": np.full(6, 1), "device": ["cpu"] * 6,
              "kind": kinds, "name": names, "start_ns": start,
              "dur_ns": np.array([1_500, 400, 300, 200, 1_000, 700])}
    return write_slices_run(tmp_path_factory.mktemp("runs") / "evil", slices, ["python", EVIL[1]])


@pytest.fixture(scope="module")
def kernel_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real A100 work (HTA's simple_add trace): kernels on two streams, memcpy, memset."""
    return write_imported_run(tmp_path_factory.mktemp("runs") / "gpu", simple_add_trace(), (0,))


@pytest.fixture(scope="module")
def counted_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real A100 trace with CUPTI range-profiler counters per kernel in the metrics table."""
    (trace_path,) = (KINETO_TRACES / "cupti_profiler").glob("*.json.gz")
    run_dir = write_imported_run(tmp_path_factory.mktemp("runs") / "cupti", trace_path, (0,))
    tables = convert_trace(read_trace(trace_path), KinetoOptions(id_base=id_base(0, SLOT_IMPORT)))
    writer = RankWriter(run_dir, 0)
    writer.write_chunk(StoreTable.METRICS, tables.metrics, "import")
    writer.compact()
    return run_dir


# ---- the data ----


def test_data_of_a_real_run(cnn_run: Path) -> None:
    run = dlprof.load(cnn_run)
    data = report_data(run)
    json.loads(script_json(data))  # plain values only
    assert data["summary"]["status"] == "complete"
    assert {c["name"] for c in data["summary"]["collectors"]} >= {"torch", "layers", "host"}
    assert set(data["tables"]) == {"op", "module", "region"}
    assert len(data["steps"]["rows"]) == int((run.slices["kind"] == "step").sum()) >= 6
    timeline = data["timeline"]
    assert timeline["shown"] == timeline["total"] == len(run.slices)  # small: nothing cut
    assert all(len(timeline[k]) == timeline["shown"] for k in ("track", "start", "dur", "depth", "name"))
    assert data["memory"]["series"] and data["counters"]["series"]
    assert data["metrics"]["reason"] and data["tuning"]["reason"] == "the run holds no kernels to rank"


def test_timeline_keeps_steps_and_the_longest(tmp_path: Path) -> None:
    run = dlprof.load(write_slices_run(tmp_path / "syn", synthetic_slices(5_000)))
    timeline = report_data(run, ReportLimits(timeline_slices=200))["timeline"]
    kinds = np.array(timeline["kinds"])[timeline["kind"]]
    steps = int((run.slices["kind"] == "step").sum())
    assert timeline["shown"] == steps + 200 and timeline["total"] == len(run.slices)
    assert (kinds == "step").sum() == steps
    # The thread that ran the steps is the main one; the other has no role to name.
    assert [t["label"] for t in timeline["tracks"]] == ["main", "pid 7 thread 101"]
    kept = np.array(timeline["dur"])[kinds != "step"]
    assert kept.min() >= run.slices[run.slices["kind"] == "op"]["dur_ns"].nlargest(200).min()


def test_downsample_keeps_peaks() -> None:
    ts = np.arange(10_000)
    values = np.zeros(10_000)
    values[4_321] = 99.0
    times, kept = downsample(ts, values, 100)
    assert len(times) == 100 and max(kept) == 99.0 and times[0] == 0


def test_gpu_and_counter_runs(kernel_run: Path, counted_run: Path) -> None:
    data = report_data(dlprof.load(kernel_run))
    assert "kernel" in data["tables"] and data["tuning"]["rows"]
    assert any(" stream " in t["label"] for t in data["timeline"]["tracks"])
    counted = report_data(dlprof.load(counted_run))
    assert counted["metrics"]["rows"] and not counted["metrics"]["reason"]


# ---- the page ----


def test_page_is_self_contained(cnn_run: Path) -> None:
    page = render_report(report_data(dlprof.load(cnn_run)))
    assert page.startswith("<!DOCTYPE html>")
    assert "default-src 'none'" in page and "script-src 'sha256-" in page
    for reference in ("http://", "https://", "src=", "<link"):
        assert reference not in page.replace('xmlns="http://www.w3.org/2000/svg"', "").replace(
            '"http://www.w3.org/2000/svg"', "")
    assert page.count("<script") == 2 and page.count("</script>") == 2


def test_names_cannot_close_the_script(evil_run: Path) -> None:
    page = render_report(report_data(dlprof.load(evil_run)))
    data_start = page.index('<script type="application/json"')
    data_end = page.index("</script>", data_start)
    data = page[data_start:data_end]
    assert "<" not in data[1:] and "alert(1)" in data
    assert page.count("</script>") == 2 and "<img" not in page
    parsed = json.loads(data[data.index(">") + 1:])
    assert EVIL[0] in parsed["timeline"]["names"] and EVIL[1] in parsed["summary"]["command"]


# ---- in a browser ----


class DevTools:
    """A DevTools protocol session over a minimal websocket client (RFC 6455, text frames)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        response = b""
        while b"\r\n\r\n" not in response:
            response += self.sock.recv(1)
        assert response.startswith(b"HTTP/1.1 101"), response
        self.events: list[dict[str, Any]] = []
        self._next = 0

    def _send(self, message: dict[str, Any]) -> None:
        payload = json.dumps(message).encode()
        size = len(payload)
        head = struct.pack("!BB", 0x81, 0x80 | size) if size < 126 else (
            struct.pack("!BBH", 0x81, 0xFE, size) if size < 65536 else struct.pack("!BBQ", 0x81, 0xFF, size))
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + masked)

    def _exactly(self, size: int) -> bytes:
        buffer = bytearray()
        while len(buffer) < size:
            chunk = self.sock.recv(size - len(buffer))
            if not chunk:
                raise ConnectionError("DevTools closed the connection")
            buffer += chunk
        return bytes(buffer)

    def _receive(self) -> dict[str, Any]:
        message = b""
        while True:
            first, second = self._exactly(2)
            size = second & 0x7F
            if size == 126:
                (size,) = struct.unpack("!H", self._exactly(2))
            elif size == 127:
                (size,) = struct.unpack("!Q", self._exactly(8))
            payload = self._exactly(size)
            message += payload
            if first & 0x80 and first & 0x0F in (0x0, 0x1):
                parsed: dict[str, Any] = json.loads(message)
                return parsed

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._next += 1
        self._send({"id": self._next, "method": method, "params": params})
        while True:
            message = self._receive()
            if message.get("id") == self._next:
                assert "error" not in message, (method, message["error"])
                result: dict[str, Any] = message["result"]
                return result
            self._event(message)

    def _event(self, message: dict[str, Any]) -> None:
        if "method" not in message:
            return
        self.events.append(message)
        if message["method"] == "Page.javascriptDialogOpening":  # never let a dialog hang the page
            self._next += 1
            self._send({"id": self._next, "method": "Page.handleJavaScriptDialog", "params": {"accept": True}})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def open(self, path: Path) -> None:
        """Load a file and wait until the report has drawn itself."""
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", width=1400, height=900, deviceScaleFactor=1, mobile=False)
        self.call("Page.navigate", url=path.as_uri())
        deadline = time.monotonic() + 30
        while not self.evaluate("document.body && document.body.getAttribute('data-rendered') === 'true'"):
            assert time.monotonic() < deadline, "the report never finished drawing"
            time.sleep(0.05)

    def problems(self, allowed_url: str) -> list[str]:
        """Console errors, exceptions, dialogs and requests for anything but the page itself."""
        found = []
        for event in self.events:
            method, params = event["method"], event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "warning", "assert"):
                found.append(f"console {params['type']}: {params['args']}")
            elif method == "Runtime.exceptionThrown":
                found.append(f"exception: {params['exceptionDetails']}")
            elif method == "Log.entryAdded" and params["entry"]["level"] in ("error", "warning"):
                found.append(f"log: {params['entry']['text']}")
            elif method == "Page.javascriptDialogOpening":
                found.append(f"dialog: {params['message']}")
            elif method == "Network.requestWillBeSent" and params["request"]["url"] != allowed_url:
                found.append(f"request: {params['request']['url']}")
        return found

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def chromium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A headless Chromium with its DevTools port; yields the port's http address."""
    binary = shutil.which("chromium")
    if binary is None:
        pytest.skip("browser tests need Debian's headless chromium on PATH (apt-get install -y chromium)")
    profile = tmp_path_factory.mktemp("chromium-profile")
    process = subprocess.Popen(
        [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions", f"--user-data-dir={profile}",
         "--remote-debugging-port=0", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port_file = profile / "DevToolsActivePort"
    deadline = time.monotonic() + 30
    while not (port_file.exists() and port_file.read_text().strip()):
        assert process.poll() is None and time.monotonic() < deadline, "chromium did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port_file.read_text().split()[0]}"
    process.terminate()
    process.wait(timeout=10)


@pytest.fixture
def page(chromium: str) -> Iterator[DevTools]:
    """A fresh tab, closed afterwards."""
    request = urllib.request.Request(f"{chromium}/json/new?about:blank", method="PUT")
    with urllib.request.urlopen(request, timeout=10) as response:
        target = json.load(response)
    tab = DevTools(target["webSocketDebuggerUrl"])
    yield tab
    tab.close()
    urllib.request.urlopen(f"{chromium}/json/close/{target['id']}", timeout=10).close()


_CELLS = """Array.from(document.querySelectorAll('[data-testid="table-{kind}"] tbody tr')).map(
  tr => Object.fromEntries(Array.from(tr.children).map(td => [td.dataset.key, td.textContent])))"""


def _write_report(run: Path, out: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    assert main(["report", str(run), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out)
    return out


def _top_json(run: Path, kind: str, capsys: pytest.CaptureFixture[str]) -> pd.DataFrame:
    assert main(["top", str(run), "--kind", kind, "-n", "50", "--format", "json"]) == 0
    return pd.DataFrame(json.loads(capsys.readouterr().out))


@pytest.mark.parametrize("fixture", ["cnn_run", "kernel_run"])
def test_tables_in_the_browser_match_top(fixture: str, request: pytest.FixtureRequest, page: DevTools,
                                         tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run: Path = request.getfixturevalue(fixture)
    report = _write_report(run, tmp_path / "report.html", capsys)
    page.open(report)
    kinds = page.evaluate("Array.from(document.querySelectorAll('table[data-testid^=\"table-\"]')).map("
                          "t => t.dataset.testid)")
    data_kinds = list(report_data(dlprof.load(run))["tables"])
    assert {f"table-{k}" for k in data_kinds} <= set(kinds)
    for kind in data_kinds:
        cells = page.evaluate(_CELLS.replace("{kind}", kind))
        want = _top_json(run, kind, capsys)
        assert [c["name"] for c in cells] == list(want["name"])
        assert [c["calls"] for c in cells] == [str(v) for v in want["calls"]]
        for column in ("total_ns", "self_ns", "avg_ns", "max_ns"):
            assert [c[column] for c in cells] == format_column(column, want[column])[1], column
    assert page.evaluate("document.querySelector('[data-testid=\"timeline-canvas\"]').width") > 0
    shot = base64.b64decode(page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"])
    screenshot = tmp_path / f"report-{fixture}.png"
    screenshot.write_bytes(shot)
    if fixture == "cnn_run":
        SCREENSHOT_COPY.parent.mkdir(exist_ok=True)
        shutil.copyfile(screenshot, SCREENSHOT_COPY)
    print(f"screenshot: {screenshot}")
    assert shot.startswith(b"\x89PNG") and len(shot) > 20_000
    assert page.problems(report.as_uri()) == []


def test_sorting_by_a_header(cnn_run: Path, page: DevTools, tmp_path: Path,
                             capsys: pytest.CaptureFixture[str]) -> None:
    page.open(_write_report(cnn_run, tmp_path / "report.html", capsys))
    header = "document.querySelector('[data-testid=\"table-op\"] th[data-key=\"calls\"]')"
    sort_values = "Array.from(document.querySelectorAll('[data-testid=\"table-op\"] tbody tr')).map(r => r.dlprofSort[1])"
    page.evaluate(f"{header}.click()")
    calls = page.evaluate(sort_values)
    assert calls == sorted(calls, reverse=True) and page.evaluate(f"{header}.getAttribute('aria-sort')") == "descending"
    page.evaluate(f"{header}.click()")
    assert page.evaluate(sort_values) == sorted(calls)
    page.evaluate("document.querySelector('[data-testid=\"table-op\"] th[data-key=\"name\"]').click()")
    # Names sort as the browser collates them (localeCompare), descending on the first click.
    assert page.evaluate(_CELLS.replace("{kind}", "op") + ".map(c => c.name).every("
                         "(n, i, all) => i === 0 || all[i - 1].localeCompare(n) >= 0)")
    before = page.evaluate("document.querySelector('[data-testid=\"timeline-range\"]').textContent")
    page.evaluate("document.querySelector('[data-testid=\"timeline-zoom-in\"]').click()")
    assert page.evaluate("document.querySelector('[data-testid=\"timeline-range\"]').textContent") != before


def test_hostile_names_are_text(evil_run: Path, page: DevTools, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    report = _write_report(evil_run, tmp_path / "report.html", capsys)
    page.open(report)
    names = page.evaluate(_CELLS.replace("{kind}", "op") + ".map(c => c.name)")
    assert set(EVIL) <= set(names)
    assert page.evaluate("document.querySelectorAll('img').length") == 0
    assert page.evaluate("document.querySelectorAll('script').length") == 2
    assert EVIL[1] in page.evaluate("document.querySelector('[data-testid=\"summary-command\"]').textContent")
    assert page.problems(report.as_uri()) == []


def test_memory_peak_marked_and_tabled_in_the_browser(cnn_run: Path, page: DevTools, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from dlprof.analysis.memory import memory_peaks
    from dlprof.viewers.terminal import format_sizes, size_unit

    run = dlprof.load(cnn_run)
    everything = report_data(run)
    data = everything["memory"]
    peak = memory_peaks(run).iloc[0]
    [series] = data["series"]
    assert series["peak"] == peak["peak_bytes"]
    assert series["peak_ts"] == peak["peak_ns"] - everything["summary"]["t0_ns"]
    page.open(_write_report(cnn_run, tmp_path / "report.html", capsys))
    title = page.evaluate("document.querySelector('[data-testid=\"memory-chart-0-peak\"] title').textContent")
    assert title.startswith("peak ")
    cells = page.evaluate(_CELLS.replace("table-{kind}", "table-memory-peaks"))
    scale, _ = size_unit([peak["peak_bytes"]])
    assert cells[0]["peak_bytes"] == format_sizes([peak["peak_bytes"]], scale)[0]
    assert cells[0]["op"] == peak["op"] and cells[0]["step"] == peak["step"]
    live = page.evaluate(_CELLS.replace("table-{kind}", "table-memory-live"))
    assert [row["name"] for row in live] == [row[2] for row in data["live"]["rows"]]


def test_roofline_plot_data_and_drawing(cnn_run: Path, kernel_run: Path, page: DevTools, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from dlprof.analysis.roofline import RooflineKey, roofline

    # HTA's simple_add trace recorded no input shapes: no op has FLOPs, so no plot, and why.
    assert "no op with both FLOPs and bytes" in report_data(dlprof.load(kernel_run))["roofline"]["reason"]
    run = dlprof.load(cnn_run)
    chart = report_data(run)["roofline"]
    table = roofline(run, RooflineKey.OP).table.dropna(subset=["intensity", "flop_rate"])
    assert chart["device"].startswith("CPU (nominal)") and not chart["reason"]
    assert [p["flop_rate"] for p in chart["points"]] == pytest.approx(table["flop_rate"].tolist())
    page.open(_write_report(cnn_run, tmp_path / "report.html", capsys))
    drawn = page.evaluate("document.querySelectorAll('[data-testid=\"roofline-point\"]').length")
    roofs = page.evaluate("document.querySelectorAll('[data-testid=\"roof\"]').length")
    assert drawn == len(chart["points"]) and roofs == len(chart["peaks"]) >= 1
    assert page.problems((tmp_path / "report.html").as_uri()) == []


def _constant_power(t_s: float) -> tuple[float, float]:
    """Two GPUs drawing a constant 120 W and 80 W."""
    return 120.0, 80.0


@pytest.fixture(scope="module")
def powered_steps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six host steps with NVML power samples of two GPUs written into the run."""
    run_dir = profile_steps(tmp_path_factory.mktemp("powered") / "run")
    add_power(run_dir, _constant_power)
    return run_dir


def test_energy_in_the_data_where_power_was_recorded(powered_steps: Path, tmp_path: Path) -> None:
    run = dlprof.load(powered_steps)
    energy = report_data(run)["steps"]["energy"]
    assert energy["recorded"] and energy["reason"] == ""
    summary = energy_summary(step_energy(run))
    table = pd.DataFrame(energy["rows"], columns=energy["columns"])
    assert list(table["device"]) == list(summary["device"]) == ["cuda:0", "cuda:1"]
    assert list(table["joules_per_step"]) == pytest.approx(list(summary["mean_joules"]))
    assert list(table["watts"]) == pytest.approx([120.0, 80.0])
    assert list(table["steps"]) == list(summary["steps"])
    assert energy["total_joules"] == pytest.approx(step_energy(run)["joules"].sum())
    assert energy["steps"] == len(step_report(run).steps)
    unpowered = report_data(dlprof.load(profile_steps(tmp_path / "cpu")))["steps"]["energy"]
    assert not unpowered["recorded"] and unpowered["rows"] == []
    assert unpowered["reason"] == f"Energy: {NO_POWER}"


def test_energy_shown_in_the_browser(powered_steps: Path, page: DevTools, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    report = _write_report(powered_steps, tmp_path / "report.html", capsys)
    page.open(report)
    cells = page.evaluate(_CELLS.replace("table-{kind}", "table-step-energy"))
    run = dlprof.load(powered_steps)
    summary = energy_summary(step_energy(run))
    assert [row["device"] for row in cells] == ["cuda:0", "cuda:1"]
    assert [row["watts"] for row in cells] == ["120", "80"]
    assert [float(row["joules_per_step"]) for row in cells] == pytest.approx(list(summary["mean_joules"]), rel=1e-3)
    assert f"Total over the run's {len(step_report(run).steps)} steps: " in page.evaluate(
        "document.querySelector('[data-testid=\"steps-energy\"]').textContent")
    assert page.problems(report.as_uri()) == []
    unpowered = _write_report(profile_steps(tmp_path / "cpu"), tmp_path / "cpu.html", capsys)
    page.open(unpowered)
    assert page.evaluate("document.querySelectorAll('[data-testid=\"table-step-energy\"]').length") == 0
    assert page.evaluate("document.querySelector('[data-testid=\"steps-energy\"]').textContent") == (
        f"Energy: {NO_POWER}")


def test_the_h200_report_opens_with_the_gpu_and_the_advice(h200_run: Path, page: DevTools, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from dlprof.advice.ranking import advise
    from dlprof.analysis.gpu import ALL, gpu_breakdown

    report = _write_report(h200_run, tmp_path / "report.html", capsys)
    page.open(report)
    sections = page.evaluate("Array.from(document.querySelectorAll('main > section')).map(s => s.id)")
    assert sections[:3] == ["gpu", "advice", "summary"]
    run = dlprof.load(h200_run)
    # Busy over the counted steps, as dlprof gpu measures them.
    breakdown = gpu_breakdown(run)
    counted = breakdown[(breakdown["step"] != ALL) & ~breakdown["step"].isin(["ProfilerStep#0", "ProfilerStep#20"])]
    busy = 100 * counted["busy_ns"].sum() / counted["span_ns"].sum()
    assert f"busy {busy:.1f}% over 19 counted steps" in page.evaluate(
        "document.querySelector('[data-testid=\"gpu-busy\"]').textContent")
    assert page.evaluate("document.querySelectorAll('[data-testid=\"gpu-kernel\"]').length") == len(
        breakdown[breakdown["step"] != ALL])
    # The kernels by GPU time, named as a person reads them: tile, layout and alignment kept.
    kernels = page.evaluate(_CELLS.replace("table-{kind}", "table-gpu-kernels"))
    assert [k["name"] for k in kernels[:3]] == [
        f"Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_{tile}_align1>"
        for tile in ("128x128_tn", "256x128_nn", "128x256_nt")]
    assert kernels[0]["gpu_ns"] == "67.271" and kernels[0]["calls"] == "20"
    # The advice as dlprof advise ranks it, the vocabulary's GEMMs among it.
    rules = page.evaluate("Array.from(document.querySelectorAll('[data-testid=\"advice-findings\"] > li'))"
                          ".map(li => li.dataset.rule)")
    assert rules == [f.rule for f in advise(run).findings[:5]] and "fp16-dimensions" in rules
    # The 22 s warm-up step does not flatten the step chart: it is cut, its time written.
    assert float(page.evaluate("document.querySelector('[data-testid=\"step-chart\"]').dataset.axisMax")) < 1e9
    assert "22.29 s" in page.evaluate("document.querySelector('[data-testid=\"step-cut\"]').textContent")
    labels = page.evaluate("JSON.parse(document.getElementById('report-data').textContent).timeline.tracks"
                           ".map(t => t.label)")
    assert {"main", "autograd", "cuda:0 stream 7"} <= set(labels) and not any("thread" in t for t in labels)
    shot = base64.b64decode(page.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"])
    (tmp_path / "report-h200.png").write_bytes(shot)
    assert page.problems(report.as_uri()) == []
