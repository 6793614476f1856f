"""Six-field NCRONTAB schedules of Azure Functions timers: ``sec min hour day month dow``.

Enough of the format for ``outbox serve`` to fire the app's timers when they would fire on Azure:
``*``, ``*/n``, numbers, ``a-b`` ranges and ``a,b`` lists, all in UTC.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

_BOUNDS = ((0, 59), (0, 59), (0, 23), (1, 31), (1, 12), (0, 6))


@dataclass(frozen=True, slots=True)
class Schedule:
    seconds: frozenset[int]
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday, as in NCRONTAB

    @classmethod
    def parse(cls, expression: str) -> Schedule:
        fields = expression.split()
        if len(fields) != 6:
            raise ValueError(f"expected six fields (sec min hour day month dow): {expression!r}")
        return cls(
            *(_parse_field(f, low, high) for f, (low, high) in zip(fields, _BOUNDS, strict=True))
        )

    def next_after(self, moment: datetime) -> datetime:
        """The first firing time strictly after ``moment`` (an aware datetime)."""
        t = moment.replace(microsecond=0) + timedelta(seconds=1)
        for _ in range(366 * 24 * 60 * 2):
            if t.month not in self.months:
                t = (t.replace(day=1) + timedelta(days=32)).replace(
                    day=1, hour=0, minute=0, second=0
                )
            elif t.day not in self.days or (t.isoweekday() % 7) not in self.weekdays:
                t = (t + timedelta(days=1)).replace(hour=0, minute=0, second=0)
            elif t.hour not in self.hours:
                t = (t + timedelta(hours=1)).replace(minute=0, second=0)
            elif t.minute not in self.minutes:
                t = (t + timedelta(minutes=1)).replace(second=0)
            elif t.second not in self.seconds:
                t += timedelta(seconds=1)
            else:
                return t
        raise ValueError("schedule never fires")


def _parse_field(field: str, low: int, high: int) -> frozenset[int]:
    values: set[int] = set()
    for part in field.split(","):
        base, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if base == "*":
            start, end = low, high
        elif "-" in base:
            start, end = (int(x) for x in base.split("-", 1))
        else:
            start = end = int(base)
        if step < 1 or not low <= start <= end <= high:
            raise ValueError(f"field {field!r} is outside {low}-{high}")
        values.update(range(start, end + 1, step))
    return frozenset(values)
