"""Linux ``perf_event_open(2)`` through ctypes: CPU software and hardware counters, no dependency.

    counters = PerfCounters(["task-clock", "page-faults"], scope="thread")
    before = counters.read()
    work()
    after = counters.read()
    counters.close()

One file descriptor per counter (per thread, in process scope); ``read()`` returns one u64 per
counter. In thread scope the counters form one group under a leader that counts nothing, read
in one syscall. Counters count from the moment they are opened, so a measurement is the
difference of two readings.

Scopes:

* ``"thread"``: ``pid=0, cpu=-1``: the thread that opened the counters, and only it. Reading
  from another thread still reads that thread's counts, so callers must read from the opening
  thread (the collector returns no reading elsewhere).
* ``"process"``: one descriptor per thread listed in ``/proc/self/task`` when the counters are
  opened, each with ``inherit=1``, summed on read. Threads (and processes, e.g. DataLoader
  workers) created *after* opening by any of those threads, or by their descendants, are counted
  through inheritance, live ones included. Missed: a thread created between the listing of
  ``/proc/self/task`` and the opening of its creator's descriptor. dlprof's own threads (the host
  sampler) are counted too.

Counts are read with the times the event was enabled and running: a hardware counter the kernel
multiplexed with others (more events than PMU counters) is scaled by enabled/running, as
``perf stat`` does, and its metrics rows say ``scaled`` instead of ``exact``.

Where ``perf_event_paranoid`` forbids counting kernel mode (EACCES/EPERM), counters are reopened
with ``exclude_kernel=1`` and :attr:`PerfCounters.user_only` says so: page faults still count
(they are charged to the faulting user instruction), context switches then read 0.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dlprof.store.counter_deltas import CounterReading

# perf_event_open's syscall number per machine (asm/unistd.h).
SYSCALL_NUMBERS = {"x86_64": 298, "aarch64": 241}
PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_ATTR_SIZE_VER5 = 112
PERF_FLAG_FD_CLOEXEC = 1 << 3
# read_format: each read also gives the ns the event was enabled and the ns it was on the PMU.
PERF_FORMAT_TOTAL_TIME_ENABLED = 1 << 0
PERF_FORMAT_TOTAL_TIME_RUNNING = 1 << 1
# ... and one read of a group's leader gives every member's count (one syscall per reading).
PERF_FORMAT_GROUP = 1 << 3
# ioctl enabling a whole group at once (linux/perf_event.h: _IO('$', 0), PERF_IOC_FLAG_GROUP).
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_IOC_FLAG_GROUP = 1
# Bits of perf_event_attr's flag word.
_DISABLED = 1 << 0
_INHERIT = 1 << 1
_EXCLUDE_KERNEL = 1 << 5
_EXCLUDE_HV = 1 << 6

BACKEND = "perf_event"
PARANOID_PATH = Path("/proc/sys/kernel/perf_event_paranoid")


@dataclass(frozen=True)
class EventSpec:
    """One countable event: perf type and config, what it means, its unit."""

    type: int
    config: int
    description: str
    unit: str


EVENTS: dict[str, EventSpec] = {
    "task-clock": EventSpec(PERF_TYPE_SOFTWARE, 1, "CPU time of the counted threads", "ns"),
    "cpu-clock": EventSpec(PERF_TYPE_SOFTWARE, 0, "CPU time by the per-CPU high-resolution timer", "ns"),
    "page-faults": EventSpec(PERF_TYPE_SOFTWARE, 2, "page faults, minor and major", "count"),
    "minor-faults": EventSpec(PERF_TYPE_SOFTWARE, 5, "page faults served without I/O", "count"),
    "major-faults": EventSpec(PERF_TYPE_SOFTWARE, 6, "page faults that needed I/O", "count"),
    "context-switches": EventSpec(PERF_TYPE_SOFTWARE, 3, "times the thread was switched out", "count"),
    "cpu-migrations": EventSpec(PERF_TYPE_SOFTWARE, 4, "moves of the thread to another CPU", "count"),
    "cycles": EventSpec(PERF_TYPE_HARDWARE, 0, "CPU cycles", "count"),
    "instructions": EventSpec(PERF_TYPE_HARDWARE, 1, "instructions retired", "count"),
    "cache-references": EventSpec(PERF_TYPE_HARDWARE, 2, "last-level cache accesses", "count"),
    "cache-misses": EventSpec(PERF_TYPE_HARDWARE, 3, "last-level cache misses", "count"),
    "branch-instructions": EventSpec(PERF_TYPE_HARDWARE, 4, "branch instructions retired", "count"),
    "branch-misses": EventSpec(PERF_TYPE_HARDWARE, 5, "mispredicted branches", "count"),
}

# A software event that counts nothing, the leader of the group thread-scope counters form: a
# clock event (task-clock) leading a group leaves its software siblings (page-faults)
# uncounted on some kernels, so no real counter leads.
GROUP_LEADER = EventSpec(PERF_TYPE_SOFTWARE, 9, "PERF_COUNT_SW_DUMMY: counts nothing", "")
SCOPES = ("thread", "process")


class PerfAttr(ctypes.Structure):
    """``struct perf_event_attr`` up to PERF_ATTR_SIZE_VER5 (112 bytes)."""

    _fields_ = [
        ("type", ctypes.c_uint32),
        ("size", ctypes.c_uint32),
        ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64),
        ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64),
        ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32),
        ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64),
        ("config2", ctypes.c_uint64),
        ("branch_sample_type", ctypes.c_uint64),
        ("sample_regs_user", ctypes.c_uint64),
        ("sample_stack_user", ctypes.c_uint32),
        ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64),
        ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16),
        ("reserved_2", ctypes.c_uint16),
    ]


class PerfEventError(OSError):
    """perf_event_open failed; the message says why in words."""


@dataclass(frozen=True)
class CounterInfo:
    """One counter as ``dlprof counters`` lists it."""

    name: str
    backend: str
    description: str
    unit: str
    available: bool
    reason: str = ""


def paranoid_level() -> str:
    """``/proc/sys/kernel/perf_event_paranoid``, or "unknown"."""
    try:
        return PARANOID_PATH.read_text().strip()
    except OSError:
        return "unknown"


def explain(code: int) -> str:
    """perf_event_open's errno in words: what it means here and what to do."""
    if code in (errno.EACCES, errno.EPERM):
        return (f"not permitted (perf_event_paranoid={paranoid_level()}; "
                "lower it or grant CAP_PERFMON)")
    if code in (errno.ENOENT, errno.EOPNOTSUPP, errno.ENODEV):
        return "not supported here (no PMU: virtual machine?)"
    if code == errno.ENOSYS:
        return "perf_event_open blocked (seccomp?)"
    return f"perf_event_open failed: {os.strerror(code)}"


_syscall: Callable[..., int] | None = None


def _libc_syscall() -> Callable[..., int]:
    global _syscall
    if _syscall is None:
        libc = ctypes.CDLL(None, use_errno=True)
        function = libc.syscall
        function.restype = ctypes.c_long
        _syscall = function
    return _syscall


def supported() -> tuple[bool, str]:
    """Whether this machine has perf_event_open at all, and if not, why."""
    if platform.system() != "Linux":
        return False, f"perf_event_open is Linux only (this is {platform.system()})"
    if platform.machine() not in SYSCALL_NUMBERS:
        return False, f"perf_event_open: syscall number unknown for {platform.machine()}"
    return True, ""


def open_event(spec: EventSpec, pid: int = 0, inherit: bool = False,
               exclude_kernel: bool = False, group_fd: int | None = None, disabled: bool = False,
               cpu: int = -1) -> int:
    """Open one counting event for thread ``pid`` (0: the caller) on any CPU; returns its fd.

    With ``pid=-1`` and a ``cpu`` the event counts everything on that CPU (a system-wide event,
    as an uncore PMU's: RAPL's energy counters).

    With ``group_fd`` the event joins a group: -1 makes it a leader, a leader's fd a member;
    the group is read at once through its leader (:func:`read_group`).

    Raises:
        PerfEventError: with the errno and :func:`explain`'s words.
    """
    attr = PerfAttr()
    attr.type = spec.type
    attr.size = PERF_ATTR_SIZE_VER5
    attr.config = spec.config
    flags = (_INHERIT if inherit else 0) | (_DISABLED if disabled else 0)
    if exclude_kernel:
        flags |= _EXCLUDE_KERNEL | _EXCLUDE_HV
    attr.flags = flags
    attr.read_format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING
    if group_fd is not None:
        attr.read_format |= PERF_FORMAT_GROUP
    number = SYSCALL_NUMBERS.get(platform.machine(), -1)
    fd = int(_libc_syscall()(ctypes.c_long(number), ctypes.byref(attr), ctypes.c_int(pid),
                             ctypes.c_int(cpu), ctypes.c_int(-1 if group_fd is None else group_fd),
                             ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC)))
    if fd < 0:
        code = ctypes.get_errno()
        raise PerfEventError(code, explain(code))
    return fd


def _open_any_mode(spec: EventSpec, pid: int, inherit: bool, user_only: bool,
                   group_fd: int | None = None, disabled: bool = False) -> tuple[int, bool]:
    """Open counting kernel mode too if allowed, else user mode only; returns (fd, user_only)."""
    if not user_only:
        try:
            return open_event(spec, pid, inherit, False, group_fd, disabled), False
        except PerfEventError as error:
            if error.errno not in (errno.EACCES, errno.EPERM):
                raise
    return open_event(spec, pid, inherit, True, group_fd, disabled), True


def read_event(fd: int) -> tuple[int, int, int]:
    """(count, ns enabled, ns running) of one event."""
    value, enabled, running = struct.unpack("=QQQ", os.read(fd, 24))
    return int(value), int(enabled), int(running)


def scale(value: int, enabled: int, running: int) -> int:
    """A multiplexed count scaled to the whole time the event was enabled, as ``perf stat`` does.

    When more hardware events are open than the PMU has counters, the kernel time-shares them:
    an event then counts only while ``running`` of the ``enabled`` ns, and its count is
    extrapolated by ``enabled / running`` (0 if it never ran). Software events always run.
    """
    if running >= enabled:
        return value
    return value * enabled // running if running else 0


class PerfCounters:
    """Counters that could be opened among those asked for, in one scope.

    ``failed`` maps each name that could not be opened to why; ``names`` are the open ones, in
    the order ``read()`` returns them.
    """

    def __init__(self, names: list[str] | tuple[str, ...], scope: str = "thread") -> None:
        if scope not in SCOPES:
            raise ValueError(f"counter scope {scope!r}: choose thread or process")
        self.scope = scope
        self.user_only = False
        self.failed: dict[str, str] = {}
        self.names: tuple[str, ...] = ()
        self._fds: list[list[int]] = []
        # Thread scope: one group, read in one syscall through its leader (GROUP_LEADER).
        # Process scope counts each thread with inheritance, which groups cannot use.
        self._leader: int | None = None
        ok, reason = supported()
        if ok and scope == "thread":
            try:
                # Opened disabled and enabled with its members below: a group whose leader
                # counts from its opening may not count its members until the thread is next
                # scheduled in.
                self._leader, self.user_only = _open_any_mode(GROUP_LEADER, 0, False, False, -1, True)
            except PerfEventError:
                self._leader = None  # no group here: each counter is read on its own
        group = self._leader
        tids = [0] if scope == "thread" else sorted(int(t) for t in os.listdir("/proc/self/task"))
        opened: list[str] = []
        for name in names:
            spec = EVENTS.get(name)
            if spec is None:
                self.failed[name] = f"unknown counter; known: {', '.join(EVENTS)}"
                continue
            if not ok:
                self.failed[name] = reason
                continue
            fds: list[int] = []
            try:
                for tid in tids:
                    fd, self.user_only = _open_any_mode(spec, tid, scope == "process", self.user_only, group)
                    fds.append(fd)
            except PerfEventError as error:
                for fd in fds:
                    os.close(fd)
                self.failed[name] = error.strerror or str(error)
                continue
            opened.append(name)
            self._fds.append(fds)
        self.names = tuple(opened)
        if self._leader is not None:
            fcntl.ioctl(self._leader, PERF_EVENT_IOC_ENABLE, PERF_IOC_FLAG_GROUP)
        # The group read's layout, built once: nr, time enabled, time running, the leader's
        # count (always 0), then the counters'.
        self._unpack = struct.Struct(f"={4 + len(opened)}Q").unpack
        self._group_bytes = 8 * (4 + len(opened))

    def read(self) -> tuple[int, ...]:
        """The current value of each open counter, scaled where it was multiplexed.

        A multiplexed reading is a :class:`CounterReading`, which also carries each counter's
        unobserved time (ns enabled but not on the PMU), from which the metrics rows of a slice
        are marked ``exact`` or ``scaled``; otherwise it is a plain tuple.
        """
        if self._leader is not None:
            words = self._unpack(os.read(self._leader, self._group_bytes))
            enabled, running, counts = words[1], words[2], words[4:]
            if running >= enabled:  # never multiplexed: the hot path, a plain tuple
                return counts
            return CounterReading([scale(c, enabled, running) for c in counts],
                                  [enabled - running] * len(counts))
        values: list[int] = []
        unobserved: list[int] = []
        for fds in self._fds:
            total = missed = 0
            for fd in fds:
                value, enabled, running = read_event(fd)
                total += scale(value, enabled, running)
                missed += enabled - running
            values.append(total)
            unobserved.append(missed)
        return CounterReading(values, unobserved)

    def close(self) -> None:
        for fds in self._fds:
            for fd in fds:
                os.close(fd)
        self._fds = []
        if self._leader is not None:
            os.close(self._leader)
            self._leader = None


def available_events() -> list[CounterInfo]:
    """Every known event, tried once in thread scope: can it be counted here, and if not, why."""
    ok, reason = supported()
    infos = []
    for name, spec in EVENTS.items():
        why = reason
        if ok:
            try:
                fd, user_only = _open_any_mode(spec, 0, False, False)
                os.close(fd)
                why = "user mode only (perf_event_paranoid)" if user_only else ""
            except PerfEventError as error:
                why = error.strerror or str(error)
                ok_event = False
            else:
                ok_event = True
        else:
            ok_event = False
        infos.append(CounterInfo(name, BACKEND, spec.description, spec.unit, ok_event,
                                 why if not ok_event or why else ""))
    return infos
