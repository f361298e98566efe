"""Progress bars for long work (pack, tune, bench): tqdm on stderr, without tqdm's monitor
thread."""

from __future__ import annotations

import sys
from typing import Any


def progress_bar(enabled: bool, *, only_on_terminal: bool = False, **kwargs: Any) -> Any:
    """A tqdm bar on stderr; ``kwargs`` go to tqdm (total, desc, unit, ...).

    ``only_on_terminal`` hides the bar when stderr is not a terminal (tqdm's ``disable=None``).
    tqdm's monitor thread (which only corrects bars that update rarely, and ``miniters=1`` leaves
    it nothing to do) is turned off: it would outlive the command as a thread nobody stops.
    """
    from tqdm.auto import tqdm

    class _Bar(tqdm):  # type: ignore[misc, valid-type]
        monitor_interval = 0

    kwargs.setdefault("miniters", 1)
    disable = (None if only_on_terminal else False) if enabled else True
    return _Bar(disable=disable, file=sys.stderr, **kwargs)
