"""The result table every measuring command prints: ``fastpipe bench`` (both steps) and
``fastpipe tune``, and the scripts under ``benchmarks/``.

A :class:`Row` is one named measurement: its rate in each round, their median and spread, and
what the loader showed while it ran. A :class:`ResultTable` puts rows side by side and renders
them as text or Markdown; its ratio column divides each row's median by the baseline row's, the
two numbers the table prints, so that a reader can check any ratio from the table itself.
The module uses the standard library only.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Column", "ResultTable", "Row"]


@dataclass
class Row:
    """One named measurement. ``per_round`` holds its rate (samples/s) in each round it ran;
    a row that did not run has none and says why in ``skipped``.

    ``wait_share``, ``batches``, ``seconds``, ``first_batch_seconds`` and ``output`` describe a
    loader's run (``batches`` and ``seconds`` summed over rounds, the others their median or
    first value); ``settings`` and ``stage`` name the point of the tuner's grid a row measured;
    ``extra`` holds the values of columns particular to one table (GPU utilisation, CPU time).
    """

    name: str
    per_round: list[float] = field(default_factory=list)
    key: str = ""
    description: str = ""
    skipped: str | None = None
    ratio: float | None = None  # set by the table that holds the row
    wait_share: float | None = None
    batches: int = 0
    seconds: float = 0.0
    first_batch_seconds: float | None = None
    output: str | None = None
    settings: Any = None
    stage: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.key = self.key or self.name

    @property
    def median(self) -> float | None:
        """The rate the table prints: the median over the rounds; None when it did not run."""
        if self.skipped is not None or not self.per_round:
            return None
        return statistics.median(self.per_round)

    # A loader's rate by the name its unit gives it: samples of any dataset, images of an
    # image loader. Both are the median.
    samples_per_second = median
    images_per_second = median

    @property
    def low(self) -> float | None:
        return min(self.per_round) if self.median is not None else None

    @property
    def high(self) -> float | None:
        return max(self.per_round) if self.median is not None else None

    @classmethod
    def merged(cls, rounds: Sequence[Row]) -> Row:
        """The rounds of one measurement as one row; skipped if any round was."""
        skipped = next((r for r in rounds if r.median is None), None)
        if skipped is not None:
            return dataclasses.replace(skipped)
        first = rounds[0]

        def median_of(name: str) -> float | None:
            values = [getattr(r, name) for r in rounds if getattr(r, name) is not None]
            return statistics.median(values) if values else None

        return dataclasses.replace(
            first, per_round=[v for r in rounds for v in r.per_round],
            wait_share=median_of("wait_share"), batches=sum(r.batches for r in rounds),
            seconds=sum(r.seconds for r in rounds),
            first_batch_seconds=median_of("first_batch_seconds"), extra=dict(first.extra),
        )

    def to_dict(self, rate_field: str = "samples_per_second") -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "name": self.name,
                               "description": self.description, rate_field: self.median,
                               "min": self.low, "max": self.high, "per_round": self.per_round,
                               "ratio": self.ratio, "wait_share": self.wait_share,
                               "batches": self.batches, "seconds": self.seconds,
                               "first_batch_seconds": self.first_batch_seconds,
                               "output": self.output, "skipped": self.skipped}
        if self.settings is not None:
            out["settings"] = (dataclasses.asdict(self.settings)
                               if dataclasses.is_dataclass(self.settings) else self.settings)
        if self.stage is not None:
            out["stage"] = self.stage
        return {**out, **self.extra}


@dataclass(frozen=True)
class Column:
    """A column of a table: its header and the text of each row's cell (``"<"`` aligns left);
    ``in_text=False`` keeps a wide column (a description) to the Markdown table."""

    header: str
    cell: Callable[[Row], str]
    align: str = ">"
    in_text: bool = True


def _rate(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


@dataclass
class ResultTable:
    """Rows side by side: ``before`` columns, the name, the median rate in ``unit``, the ratio
    to the ``baseline`` row (by key; none without one), the spread (min-max over the rounds,
    when any row ran more than one), then the ``after`` columns."""

    rows: list[Row]
    unit: str = "samples/s"
    name_header: str = "name"
    baseline: str | None = None
    ratio_header: str = "ratio"
    before: Sequence[Column] = ()
    after: Sequence[Column] = ()

    def __post_init__(self) -> None:
        base = self.baseline_row
        for row in self.rows:
            row.ratio = (row.median / base.median
                         if base is not None and row.median is not None else None)

    @property
    def baseline_row(self) -> Row | None:
        if self.baseline is None:
            return None
        return next((r for r in self.rows if r.key == self.baseline and r.median), None)

    @property
    def rate_field(self) -> str:
        """The rate's name in JSON: ``images/s`` -> ``images_per_second``."""
        return self.unit.replace(" ", "_").replace("/s", "_per_second")

    def columns(self, digits: int, text: bool = False) -> list[Column]:
        columns = [*self.before, Column(self.name_header, lambda r: r.name, "<"),
                   Column(self.unit, lambda r: _rate(r.median, digits))]
        if self.baseline is not None:
            columns.append(Column(self.ratio_header,
                                  lambda r: "-" if r.ratio is None else f"{r.ratio:.2f}x"))
        if any(len(r.per_round) > 1 for r in self.rows):
            columns.append(Column("min-max", lambda r: "-" if r.median is None else
                                  f"{_rate(r.low, digits)}-{_rate(r.high, digits)}"))
        return [c for c in columns + list(self.after) if c.in_text or not text]

    def text(self) -> str:
        """A fixed-width table for a terminal; a skipped row ends with why."""
        columns = self.columns(digits=1, text=True)
        cells = [[c.cell(r) for c in columns] for r in self.rows]
        widths = [max([len(c.header)] + [len(line[i]) for line in cells])
                  for i, c in enumerate(columns)]

        def line(values: list[str]) -> str:
            aligned = zip(values, columns, widths, strict=True)
            return "  ".join(f"{v:{c.align}{w}}" for v, c, w in aligned)

        head = line([c.header for c in columns])
        lines = [head, "-" * len(head)]
        for row, values in zip(self.rows, cells, strict=True):
            text = line(values)
            lines.append(f"{text}  skipped: {row.skipped}" if row.skipped else text.rstrip())
        return "\n".join(lines)

    def markdown(self) -> str:
        """The same table in Markdown (no trailing newline)."""
        columns = self.columns(digits=0)
        lines = ["| " + " | ".join(c.header for c in columns) + " |",
                 "|" + "|".join("---:" if c.align == ">" else "---" for c in columns) + "|"]
        for row in self.rows:
            values = [c.cell(row) for c in columns]
            if row.skipped and self.after:
                values[-1] = f"skipped: {row.skipped}"
            lines.append("| " + " | ".join(values) + " |")
        return "\n".join(lines)

    def to_dicts(self) -> list[dict[str, Any]]:
        return [r.to_dict(self.rate_field) for r in self.rows]
