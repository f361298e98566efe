"""Progress of long work (pack, verify, merge, tune, bench, profile) on stderr, one rule for
every command: a tqdm bar when stderr is a terminal, a plain line every few seconds when it is
not (a log file or a pipe gets no ``\\r`` redraws, and is never silent for long), nothing when
progress is off (``--no-progress``)."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

# Seconds between the plain lines written where stderr is not a terminal.
LINE_INTERVAL = 5.0


def progress_bar(enabled: bool, *, interval: float = LINE_INTERVAL, **kwargs: Any) -> Any:
    """A progress display on stderr; ``kwargs`` go to tqdm (total, desc, unit, initial, ...).

    On a terminal: a tqdm bar, with tqdm's monitor thread turned off (it only corrects bars
    that update rarely, ``miniters=1`` leaves it nothing to do, and it would outlive the command
    as a thread nobody stops). Elsewhere: :class:`ProgressLines`, a line every ``interval``
    seconds and one at the end. Both have ``update``, ``set_postfix_str``, ``write`` and
    ``close`` and work as context managers.
    """
    stream = sys.stderr
    if not enabled:
        return ProgressLines(stream, enabled=False, **_line_kwargs(kwargs))
    if not _is_terminal(stream):
        return ProgressLines(stream, interval=interval, **_line_kwargs(kwargs))
    from tqdm.auto import tqdm

    class _Bar(tqdm):  # type: ignore[misc, valid-type]
        monitor_interval = 0

    kwargs.setdefault("miniters", 1)
    return _Bar(disable=False, file=stream, **kwargs)


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if callable(isatty) else False
    except ValueError:  # a closed stream
        return False


def _line_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {name: kwargs[name] for name in ("total", "desc", "unit", "initial") if name in kwargs}


class ProgressLines:
    """Progress as plain lines (``desc: n/total unit (p%), rate, elapsed``): at most one every
    ``interval`` seconds while work goes on, and one when it ends (if any was written, or the
    work took longer than ``interval``). Written from the thread that calls ``update``; it
    starts no thread of its own."""

    def __init__(self, stream: TextIO, *, enabled: bool = True, interval: float = LINE_INTERVAL,
                 total: int | None = None, desc: str = "", unit: str = "it",
                 initial: int = 0) -> None:
        self.stream = stream
        self.enabled = enabled
        self.interval = interval
        self.total = total
        self.desc = desc
        self.unit = unit
        self.n = initial
        self._initial = initial
        self.postfix = ""
        self._started = self._last = time.monotonic()
        self._written = 0
        self._closed = False

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.enabled and not self._closed and time.monotonic() - self._last >= self.interval:
            self._line()

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.postfix = text

    def write(self, text: str) -> None:
        """A message of its own (always shown, as tqdm's ``write`` does)."""
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self.enabled and (self._written
                             or time.monotonic() - self._started >= self.interval):
            self._line(done=True)

    def line(self, done: bool = False) -> str:
        """The text of one progress line."""
        elapsed = time.monotonic() - self._started
        count = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        share = f" ({self.n / self.total:.0%})" if self.total else ""
        rate = (self.n - self._initial) / elapsed if elapsed > 0 else 0.0
        words = [f"{self.desc}: " if self.desc else "", f"{count} {self.unit}{share}",
                 f", {rate:.2f} {self.unit}/s, {elapsed:.0f} s", " done" if done else "",
                 f" [{self.postfix}]" if self.postfix and not done else ""]
        return "".join(words)

    def _line(self, done: bool = False) -> None:
        print(self.line(done), file=self.stream, flush=True)
        self._last = time.monotonic()
        self._written += 1

    def __enter__(self) -> ProgressLines:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
