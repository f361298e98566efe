"""What ``fastpipe bench`` returns, with the simulated step or the model step: the machine, the
settings, and the loaders' result table (the table type ``fastpipe tune`` prints too)."""

from __future__ import annotations

import json
import os
import statistics
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

    @property
    def verdict(self) -> str:
        """The report's last line: the fastest loader, its ratio to DataLoader, and whether the
        rounds tell the two apart (see :func:`verdict`)."""
        return verdict(self.table)

    def __str__(self) -> str:
        return "\n".join([self.header(), "", self.table.text(), *self.notes, self.verdict])

    def to_dict(self) -> dict[str, Any]:
        return {"machine": self.machine, "settings": self.settings,
                "rows": self.table.to_dicts(), "notes": list(self.notes),
                "verdict": self.verdict}

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


def noise_notes(table: ResultTable, rounds: int) -> list[str]:
    """What the rounds say about the noise of ``table``'s numbers: how far each loader's rounds
    spread, a line for each loader whose rounds disagree by more than the others', and one for
    each ratio to the baseline that the rounds do not resolve (the min-max ranges overlap)."""
    ran = [r for r in table.rows if r.median]
    repeated = [r for r in ran if len(r.per_round) > 1]
    if rounds < 2 or not repeated:
        return ["note: one round per loader, so the noise was not measured; on a machine doing "
                "other work, images/s move by tens of percent between runs (--rounds 3 measures "
                "the spread)."]
    spreads = {r.key: (r.high - r.low) / r.median for r in repeated}
    typical = statistics.median(spreads.values())
    notes = [f"note: noise: each loader's rounds spread by {typical:.0%} (median) and up to "
             f"{max(spreads.values()):.0%} (min-max over median). Absolute images/s move between "
             "runs by as much or more when other work shares the cores; compare the ratios of one "
             "run, whose loaders ran interleaved."]
    for row in repeated:
        spread = spreads[row.key]
        if spread > max(2 * typical, 0.10):
            notes.append(f"note: {row.name}'s rounds disagree ({_range(row)} images/s, "
                         f"{spread:.0%} apart, against {typical:.0%} typical here): something "
                         "else likely ran during one of them; rerun before trusting its row.")
    base = table.baseline_row
    if base is not None and len(base.per_round) > 1:
        for row in repeated:
            if row is not base and row.low <= base.high and base.low <= row.high:
                notes.append(f"note: {row.name}'s rounds overlap {base.name}'s ({_range(row)} "
                             f"against {_range(base)} images/s): its {row.ratio:.2f}x is within "
                             "the noise.")
    return notes


def verdict(table: ResultTable) -> str:
    """One line: the loader with the highest median, its ratio to the baseline (DataLoader), and
    whether that is beyond the noise, by the rule of :func:`noise_notes`: its slowest round beats
    the baseline's fastest. The loaders whose rounds reach into the fastest one's are named as
    tied with it."""
    ran = [r for r in table.rows if r.median]
    if not ran:
        return "verdict: no loader ran; see the skipped rows"
    best = max(ran, key=lambda r: r.median)
    rate = f"{best.median:.1f} {table.unit}"
    base = table.baseline_row
    if base is None:
        return f"verdict: fastest: {best.name} ({rate}); no DataLoader row to compare it with"
    repeated = len(best.per_round) > 1 and len(base.per_round) > 1
    tied = [r for r in ran if r is not best and r is not base and len(r.per_round) > 1
            and repeated and r.high >= best.low]
    if best is base:
        line = f"verdict: the plain DataLoader was the fastest here ({rate})"
        if not repeated:
            return line + "; one round, so the noise was not measured (--rounds 3 measures it)"
        others = ", ".join(r.name for r in tied)
        return line + (f"; within the noise of {others}" if tied else
                       ", beyond the noise of every other loader")
    line = f"verdict: fastest: {best.name}, {best.ratio:.2f}x DataLoader ({rate})"
    if not repeated:
        line += ("; one round per loader, so whether that is beyond the noise was not measured "
                 "(--rounds 3 measures it)")
    elif best.low > base.high:
        line += (f", beyond the noise (its slowest round, {best.low:.1f}, beats DataLoader's "
                 f"fastest, {base.high:.1f})")
    else:
        line += (f", within the noise (its rounds overlap DataLoader's: {_range(best)} against "
                 f"{_range(base)}); more --rounds or --seconds may tell them apart")
    if tied:
        names = ", ".join(f"{r.name} {r.ratio:.2f}x" for r in tied)
        line += f"; tied with it within the noise: {names}"
    return line


def _range(row: Row) -> str:
    return f"{row.low:.1f}-{row.high:.1f}"


def workers(count: int) -> str:
    return f"{count} worker{'' if count == 1 else 's'}"
