"""Conversion progress: a one-line bar on a terminal, periodic absl log lines otherwise."""
from __future__ import annotations

import sys
import time

from absl import logging

MB = 1 << 20


def _duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
    """Counts examples and bytes; shows examples/s, MB/s and an ETA from an estimated total.

    `total` is an estimate of the number of rows (None when unknown: no ETA). On a terminal
    (`stream.isatty()`), the bar is redrawn at most every `redraw_s`; otherwise an INFO line is
    logged every `log_every_s`.
    """

    def __init__(self, total: int | None, *, label: str = "convert", stream=None,
                 redraw_s: float = 0.25, log_every_s: float = 30.0):
        self.total = total
        self.label = label
        self.stream = stream or sys.stderr
        self.bar = bool(getattr(self.stream, "isatty", lambda: False)())
        self.interval = redraw_s if self.bar else log_every_s
        self.started = time.monotonic()
        self.last_shown = self.started
        self.examples = 0
        self.bad = 0
        self.bytes = 0

    def update(self, examples: int = 0, nbytes: int = 0, bad: int = 0) -> None:
        """Adds to the counts and redraws or logs when it is time."""
        self.examples += examples
        self.bytes += nbytes
        self.bad += bad
        now = time.monotonic()
        if now - self.last_shown >= self.interval:
            self.last_shown = now
            self._show(now)

    def rates(self) -> tuple[float, float]:
        """(examples/s, MB/s) since the start."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return self.examples / elapsed, self.bytes / MB / elapsed

    def line(self, now: float | None = None) -> str:
        """The progress text without the bar."""
        now = now or time.monotonic()
        per_s, mb_s = self.rates()
        done = self.examples + self.bad
        text = f"{self.examples:,} examples"
        if self.bad:
            text += f" ({self.bad:,} bad)"
        text += f", {per_s:,.0f} ex/s, {mb_s:,.1f} MB/s"
        if self.total and per_s > 0:
            left = max(self.total - done, 0) / max(done / max(now - self.started, 1e-9), 1e-9)
            text += f", ETA {_duration(left)}"
        return text

    def _show(self, now: float) -> None:
        if not self.bar:
            logging.info("%s: %s", self.label, self.line(now))
            return
        done = self.examples + self.bad
        if self.total:
            fraction = min(done / self.total, 1.0)
            filled = int(fraction * 24)
            bar = f"[{'#' * filled}{'.' * (24 - filled)}] {fraction:4.0%} "
        else:
            bar = ""
        self.stream.write(f"\r{self.label}: {bar}{self.line(now)}\x1b[K")
        self.stream.flush()

    def close(self) -> None:
        """Ends the bar line (terminal) so later output starts on a new line."""
        if self.bar:
            self._show(time.monotonic())
            self.stream.write("\n")
            self.stream.flush()
