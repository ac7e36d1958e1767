"""A progress line for long jobs on stderr: done/total, rate, ETA, errors. Redrawn in place on a
terminal, printed every few seconds otherwise (logs, CI)."""
from __future__ import annotations

import sys
import time


def _clock(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    def __init__(self, total: int, label: str = "records", stream=None, min_interval_s: float | None = None,
                 already_done: int = 0):
        self.total, self.label = total, label
        self.stream = stream or sys.stderr
        self.is_tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.min_interval_s = min_interval_s if min_interval_s is not None else (0.25 if self.is_tty else 5.0)
        self.done, self.errors = already_done, 0
        self.already_done = already_done  # from an earlier run: counted in done, not in the rate
        self.start = time.monotonic()
        self.last_draw = 0.0
        self.drawn_at_done = -1

    def update(self, done: int = 1, errors: int = 0) -> None:
        self.done += done
        self.errors += errors
        now = time.monotonic()
        if now - self.last_draw >= self.min_interval_s or self.done >= self.total:
            self.last_draw = now
            self._draw(now)

    def line(self, now: float | None = None) -> str:
        elapsed = (now or time.monotonic()) - self.start
        rate = (self.done - self.already_done) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - self.done) / rate if rate > 0 else float("nan")
        percent = 100 * self.done / self.total if self.total else 100.0
        eta_text = _clock(eta) if eta == eta else "--:--:--"
        return (f"{self.done}/{self.total} {self.label} {percent:3.0f}% | {rate:.1f} {self.label}/s | "
                f"ETA {eta_text} | {self.errors} errors")

    def _draw(self, now: float) -> None:
        self.drawn_at_done = self.done
        if self.is_tty:
            self.stream.write("\r\033[K" + self.line(now))
        else:
            self.stream.write(self.line(now) + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.drawn_at_done != self.done:
            self._draw(time.monotonic())
        if self.is_tty:
            self.stream.write("\n")
            self.stream.flush()
