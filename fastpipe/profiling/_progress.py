"""Progress bars for the long commands (tune, bench), on stderr."""

from __future__ import annotations

import sys
from typing import Any


def progress_bar(enabled: bool, **kwargs: Any) -> Any:
    """A tqdm bar, shown when ``enabled`` and stderr is a terminal.

    tqdm's monitor thread (which only corrects bars that update rarely) is turned off: it would
    outlive the command as a thread nobody stops.
    """
    from tqdm.auto import tqdm

    class _Bar(tqdm):  # type: ignore[misc, valid-type]
        monitor_interval = 0

    return _Bar(disable=None if enabled else True, file=sys.stderr, **kwargs)
