"""Which steps are profiled: ``skip_first, wait, warmup, active, repeat``, as torch.profiler's.

    Schedule.parse("1,1,1,3,2")   # skip 1 step, then twice: wait 1, warm up 1, record 3

A cycle's last active step is ``RECORD_AND_SAVE``: at its end collectors hand their data to the
store. With no schedule every step is recorded and the data is saved every ``flush_steps`` steps,
which bounds the memory torch.profiler holds and lets conversion start while the program runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Action(Enum):
    """What collectors do during one step."""

    NONE = "none"
    WARMUP = "warmup"
    RECORD = "record"
    RECORD_AND_SAVE = "record_and_save"

    @property
    def records(self) -> bool:
        return self in (Action.RECORD, Action.RECORD_AND_SAVE)


class ScheduleError(ValueError):
    """A schedule string that cannot be understood."""


@dataclass(frozen=True)
class Schedule:
    """The five numbers of a profiling schedule."""

    skip_first: int = 0
    wait: int = 0
    warmup: int = 0
    active: int = 100
    repeat: int = 0  # 0: cycles go on until the program ends

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """Read ``skip_first,wait,warmup,active,repeat`` (trailing numbers may be left out)."""
        names = ("skip_first", "wait", "warmup", "active", "repeat")
        parts = [p.strip() for p in text.split(",")]
        if not 1 <= len(parts) <= len(names) or not all(p.isdigit() for p in parts):
            raise ScheduleError(
                f"schedule {text!r}: expected up to five non-negative integers "
                "skip_first,wait,warmup,active,repeat (e.g. 1,1,1,3,2)"
            )
        values = dict(zip(names, (int(p) for p in parts), strict=False))
        schedule = cls(**{"active": 1, **values})
        if schedule.active < 1:
            raise ScheduleError(f"schedule {text!r}: active must be at least 1")
        return schedule

    @classmethod
    def every_step(cls, flush_steps: int = 100) -> Schedule:
        return cls(active=flush_steps)

    @property
    def cycle(self) -> int:
        return self.wait + self.warmup + self.active

    def action(self, step: int) -> Action:
        """The action for step number ``step`` (the first step is 0)."""
        if step < self.skip_first:
            return Action.NONE
        step -= self.skip_first
        if self.repeat and step // self.cycle >= self.repeat:
            return Action.NONE
        position = step % self.cycle
        if position < self.wait:
            return Action.NONE
        if position < self.wait + self.warmup:
            return Action.WARMUP
        if position < self.cycle - 1:
            return Action.RECORD
        return Action.RECORD_AND_SAVE

    def __str__(self) -> str:
        return f"{self.skip_first},{self.wait},{self.warmup},{self.active},{self.repeat}"
