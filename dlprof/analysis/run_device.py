"""Which row of the device table a run ran on: from its recorded device properties, its host,
or a name the user gives.

    device = run_device(run)             # A100 SXM4 40GB for HTA's A100-PG509-200 traces
    device = run_device(run, "h100")     # the user's choice wins

The table is the shipped one with the rows ``dlprof calibrate`` measured
(:mod:`dlprof.hardware.calibration`) in their place: a measured GPU row replaces its datasheet
row, and a CPU run made on a calibrated host is measured against that host's measured row.
"""

from __future__ import annotations

from dlprof.analysis.sql import DEVICE_KINDS_SQL, rank_condition
from dlprof.hardware.calibration import calibration_path, host_cpu, read_calibrations, table_with
from dlprof.hardware.devices import Device, DeviceTable, device_table
from dlprof.store.reader import Run


class UnknownDevice(ValueError):
    """No row of the device table fits: the message names what was recorded and ``--device``."""


def known_devices() -> DeviceTable:
    """The shipped device table with the stored calibrations' measured rows.

    Raises:
        ValueError: the calibration file exists but cannot be read as one.
    """
    return table_with(device_table(), read_calibrations(calibration_path()))


def named_device(name: str) -> Device:
    """The table's row called ``name``, or :class:`UnknownDevice` listing the rows."""
    table = known_devices()
    found = table.by_name(name)
    if found is None:
        raise UnknownDevice(f"unknown device {name!r}; known: {', '.join(table.names())}")
    return found


def run_device(run: Run, name: str | None = None, rank: int | None = None) -> Device:
    """The device a run's work ran on.

    Args:
        run: the loaded run.
        name: a device the user named (``--device``), which wins over what was recorded.
        rank: the rank whose device is wanted (None: the first with device work).

    Returns:
        The named row; else the row resolved from the properties of the GPU the run's kernels
        ran on; else, for a run with no device work, the measured CPU row of its host where
        ``dlprof calibrate`` ran there, else the nominal CPU row for its host's cores.

    Raises:
        UnknownDevice: the name is not in the table, or the recorded GPU resolves to no row.
    """
    if name:
        return named_device(name)
    used = run.query(f"SELECT device FROM slices WHERE kind IN {DEVICE_KINDS_SQL}{rank_condition(rank)} "
                     "AND device IS NOT NULL LIMIT 1").rows
    stored = read_calibrations(calibration_path())
    table = table_with(device_table(), stored)
    if not used:
        here = host_cpu(stored, run.manifest.host.hostname)
        return here.device(table) if here is not None else table.cpu(run.manifest.host.cpu_cores)
    index = str(used[0][0]).rpartition(":")[2]
    devices = run.manifest.devices
    recorded = next((d for d in devices if str(d.get("id")) == index), devices[0] if devices else None)
    if recorded is None:
        raise UnknownDevice(f"{run.path}: the run records no device properties; name the GPU with --device")
    found = table.resolve(recorded)
    if found is None:
        raise UnknownDevice(
            f"{run.path}: the recorded GPU {recorded.get('name', '?')!r} (compute capability "
            f"{recorded.get('computeMajor')}.{recorded.get('computeMinor')}, {recorded.get('numSms')} SMs) is not "
            f"in the device table; name it with --device (known: {', '.join(table.names())})")
    return found
