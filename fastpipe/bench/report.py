"""What ``fastpipe bench`` returns, with the simulated step or the model step: the machine, the
settings, and the loaders' result table (the table type ``fastpipe tune`` prints too)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastpipe.bench.machine import machine_line
from fastpipe.profiling._table import Column, ResultTable, Row

BASELINE = "dataloader"


def loader_table(rows: list[Row], *more: Column) -> ResultTable:
    """The loaders' table: images/s, the ratio to the DataLoader row, the data-wait share, the
    ``more`` columns, and (in Markdown) what runs."""
    return ResultTable(
        rows, unit="images/s", name_header="loader", baseline=BASELINE,
        ratio_header="vs DataLoader",
        after=[Column("data wait", lambda r: "-" if r.wait_share is None
                      else f"{r.wait_share:.0%}"),
               *more,
               Column("what runs", lambda r: r.description, "<", in_text=False)],
    )


@dataclass
class BenchReport:
    """``setup`` says what ran, under the machine line; ``conditions`` the same without paths,
    beside the command under the Markdown table; ``notes`` follow the text table."""

    machine: dict[str, Any]
    settings: dict[str, Any]
    table: ResultTable
    setup: str = ""
    conditions: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def rows(self) -> list[Row]:
        return self.table.rows

    @property
    def baseline(self) -> Row | None:
        return self.table.baseline_row

    def header(self) -> str:
        return f"machine: {machine_line(self.machine)}\n{self.setup}"

    def __str__(self) -> str:
        return "\n".join([self.header(), "", self.table.text(), *self.notes])

    def to_dict(self) -> dict[str, Any]:
        return {"machine": self.machine, "settings": self.settings,
                "rows": self.table.to_dicts()}

    def to_json(self, path: str | os.PathLike | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    def to_markdown(self, path: str | os.PathLike | None = None) -> str:
        """The table for docs/benchmarks.md, with the machine and the command under it."""
        text = "\n".join([self.table.markdown(), "", f"Machine: {machine_line(self.machine)}.",
                          f"Command: `{self.settings['command']}` ({self.conditions})."]) + "\n"
        if path is not None:
            Path(path).write_text(text)
        return text

    def plot(self, path: str | os.PathLike) -> Path:
        """Images/s per loader as a PNG (needs matplotlib: ``fastpipe[plot]``)."""
        from fastpipe.profiling.plots import plot_bench

        title = f"fastpipe bench: {machine_line(self.machine)}"
        return plot_bench(self.rows, title, path)


def workers(count: int) -> str:
    return f"{count} worker{'' if count == 1 else 's'}"
