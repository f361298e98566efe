"""PNG plots for profile, tune and bench. matplotlib is imported here only, on first use."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastpipe._optional import require

if TYPE_CHECKING:
    from fastpipe.profiling.profiler import ProfileSummary

_WAIT = "#d62728"
_WORK = "#1f77b4"


def _pyplot(feature: str) -> Any:
    matplotlib = require("matplotlib", extra="plot", feature=feature)
    # A file backend: plotting must work on servers without a display.
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: str | os.PathLike) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def plot_profile(summary: ProfileSummary, path: str | os.PathLike) -> Path:
    """Top: data wait and compute of every step, stacked. Bottom: the distribution of waits."""
    plt = _pyplot("fastpipe.profile plots")
    steps = summary.steps
    use_device = summary.clock == "cuda events"
    waits = [1e3 * ((s.device_wait if use_device else s.wait) or 0.0) for s in steps]
    totals = [1e3 * ((s.device_step if use_device else s.step) or 0.0) for s in steps]
    work = [max(t - w, 0.0) for t, w in zip(totals, waits, strict=True)]
    index = [s.index for s in steps]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), height_ratios=(3, 2))
    # Warm-up steps (worker start-up, not in the statistics) are drawn faded.
    alpha = [0.35 if s.warmup else 1.0 for s in steps]
    wait_bars = top.bar(index, waits, width=1.0, color=_WAIT)
    work_bars = top.bar(index, work, width=1.0, bottom=waits, color=_WORK)
    for bars in (wait_bars, work_bars):
        for bar, a in zip(bars, alpha, strict=True):
            bar.set_alpha(a)
    if any(s.warmup for s in steps):
        top.text(0.01, 0.97, "faded: warm-up, not counted", transform=top.transAxes,
                 fontsize=8, va="top")
    top.set_xlabel("step")
    top.set_ylabel("ms")
    top.set_title(f"{summary.verdict}  ({summary.clock})", fontsize=10)
    from matplotlib.patches import Patch

    # Own legend entries: the default ones copy the first bar, which is a faded warm-up step.
    top.legend(handles=[Patch(color=_WAIT, label="waiting for data"),
                        Patch(color=_WORK, label="step work")], loc="upper right", fontsize=8)
    counted = [w for w, s in zip(waits, steps, strict=True) if not s.warmup]
    bottom.hist(counted, bins=min(40, max(5, len(counted) // 3)), color=_WAIT)
    for value, name in ((summary.wait_p50, "p50"), (summary.wait_p95, "p95")):
        bottom.axvline(value * 1e3, color="k", linestyle="--", linewidth=1)
        bottom.annotate(name, (value * 1e3, 1), textcoords="offset points", xytext=(3, 3),
                        fontsize=8)
    bottom.set_xlabel("data wait per step (ms)")
    bottom.set_ylabel("steps")
    fig.tight_layout()
    return _save(fig, path)


def plot_tune(trials: list[Any], best: Any, path: str | os.PathLike) -> Path:
    """Samples/s against num_workers, one line per batch size and wrapper; ``best`` is circled."""
    plt = _pyplot("fastpipe tune plots")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups: dict[str, list[tuple[int, float]]] = {}
    measured = [t for t in trials if t.samples_per_second is not None]
    for t in measured:
        s = t.settings
        label = f"batch {s.batch_size}, {s.wrapper_name}"
        groups.setdefault(label, []).append((s.num_workers, t.samples_per_second))
    for label, points in sorted(groups.items()):
        # Several trials can share a worker count (other prefetch settings): plot the best.
        fastest: dict[int, float] = {}
        for workers, rate in points:
            fastest[workers] = max(rate, fastest.get(workers, 0.0))
        xs = sorted(fastest)
        ax.plot(xs, [fastest[x] for x in xs], marker="o", label=label)
    if best is not None and best.samples_per_second is not None:
        ax.scatter([best.settings.num_workers], [best.samples_per_second], s=220,
                   facecolors="none", edgecolors="k", zorder=5, label="recommended")
    ax.set_xticks(sorted({t.settings.num_workers for t in measured}))
    ax.set_xlabel("num_workers")
    ax.set_ylabel("samples/s")
    ax.set_ylim(bottom=0)
    ax.set_title("fastpipe tune: throughput against num_workers", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return _save(fig, path)


def plot_bench(rows: list[Any], title: str, path: str | os.PathLike) -> Path:
    """Horizontal bars of images/s per loader variant, with the ratio to the baseline."""
    plt = _pyplot("fastpipe bench plots")
    measured = [r for r in rows if r.images_per_second is not None]
    fig, ax = plt.subplots(figsize=(8, 0.55 * max(len(measured), 1) + 1.5))
    names = [r.name for r in measured][::-1]
    rates = [r.images_per_second for r in measured][::-1]
    bars = ax.barh(names, rates, color=_WORK)
    for bar, row in zip(bars, measured[::-1], strict=True):
        text = f" {row.images_per_second:.0f}"
        if row.ratio is not None:
            text += f" ({row.ratio:.2f}x)"
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, text, va="center", fontsize=8)
    ax.set_xlabel("images/s")
    ax.set_xlim(right=max(rates, default=1) * 1.3)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return _save(fig, path)
